//! What a gate says when it refuses a call or a retry: which gate, and when to come back (T4).

use std::fmt;
use std::time::Duration;

/// Which gate refused a call or a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Gate {
    /// A circuit breaker ([`Breaker`](crate::Breaker)): open, or isolated by hand.
    Breaker,
    /// A retry budget ([`Budget`](crate::Budget)): spent.
    Budget,
    /// A concurrency limit ([`Limiter`](crate::Limiter)): full.
    Limiter,
    /// A gate of another kind (one of your own), which did not say which it is.
    Other,
}

/// The gate in words: "the circuit breaker", "the retry budget", "a gate".
impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Gate::Breaker => "the circuit breaker",
            Gate::Budget => "the retry budget",
            Gate::Limiter => "the concurrency limit",
            Gate::Other => "a gate",
        })
    }
}

/// A gate's refusal ([`RetryGate::try_retry`](crate::RetryGate::try_retry),
/// [`RetryGate::admit`](crate::RetryGate::admit)): which gate refused, and how long until it may
/// let a call through again, if it knows.
///
/// ```
/// use std::time::Duration;
/// use persevere_driver::{Gate, Refusal};
///
/// let refusal = Refusal::new(Gate::Breaker, Some(Duration::from_secs(5)));
/// assert_eq!((refusal.gate(), refusal.retry_after()), (Gate::Breaker, Some(Duration::from_secs(5))));
/// assert_eq!(refusal.to_string(), "the circuit breaker is open (retry after 5s)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refusal {
    gate: Gate,
    retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal by `gate`, which may let a call through again after `retry_after`.
    pub const fn new(gate: Gate, retry_after: Option<Duration>) -> Self {
        Refusal { gate, retry_after }
    }

    /// Which gate refused.
    pub const fn gate(&self) -> Gate {
        self.gate
    }

    /// How long until the gate may let a call through again: a breaker's remaining open time,
    /// a limiter's minimum RTT;
    /// `None` when the gate cannot tell (a budget grants again as the calls to come earn it; a
    /// breaker isolated by hand stays so until reset).
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.gate, self.retry_after) {
            (Gate::Breaker, None) => f.write_str("the circuit breaker is isolated")?,
            (Gate::Breaker, Some(_)) => f.write_str("the circuit breaker is open")?,
            (Gate::Budget, _) => f.write_str("the retry budget is spent")?,
            (Gate::Limiter, _) => f.write_str("the concurrency limit is full")?,
            (Gate::Other, _) => f.write_str("a gate refused")?,
        }
        match self.retry_after {
            Some(after) => write!(f, " (retry after {after:?})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Refusal {}
