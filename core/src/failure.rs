//! What the caller reports about a failed attempt: its class, an optional hint, and its error.

use core::time::Duration;

use crate::Instant;

/// A hint from the failed call about when to try again (rule B6).
///
/// A hint overrides the backoff schedule for one delay, and is never shortened: not by the
/// schedule's `max_delay` (it is the other side's word, not the schedule's), and not by the
/// policy's limits. A hint that asks for longer than the policy's `max_hint`, or past the
/// remaining total budget, ends the operation at once with a `Deferred` outcome that carries
/// the hinted instant, so the caller can come back then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Hint {
    /// Try again after this span (an HTTP `Retry-After: 120`, a gRPC pushback of 120 s).
    After(Duration),
    /// Try again at this instant (an HTTP `Retry-After` date, converted by the driver).
    /// An instant in the past means "now".
    At(Instant),
    /// Do not try again (a negative gRPC pushback). Ends the operation as [`Fatal`](crate::Outcome::Fatal).
    DoNotRetry,
}

/// How a failed attempt is classified (rule R2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FailureKind {
    /// A transient failure: retried by the schedule.
    Retryable,
    /// The attempt timed out: retried by the schedule.
    Timeout,
    /// The attempt panicked while running and the driver caught it: retried by the schedule.
    Panicked,
    /// A permanent failure: never retried.
    Fatal,
    /// The attempt was canceled: never retried.
    Canceled,
    /// The call said when (or whether) to try again: [`Hint::After`] and [`Hint::At`] are
    /// retried after the hinted delay, [`Hint::DoNotRetry`] is never retried.
    Hinted(Hint),
    /// The other side is overloaded and said so without saying when to come back (an HTTP 429
    /// or 503 without `Retry-After`, gRPC's `RESOURCE_EXHAUSTED`, an AWS `ThrottlingException`):
    /// retried by the schedule like [`Retryable`](Self::Retryable), and charged by retry
    /// budgets at their throttling cost ([`RetryClass::Throttling`](crate::RetryClass::Throttling)).
    Throttled,
}

impl FailureKind {
    /// The kind without its hint's payload.
    pub const fn class(self) -> FailureClass {
        match self {
            FailureKind::Retryable => FailureClass::Retryable,
            FailureKind::Timeout => FailureClass::Timeout,
            FailureKind::Panicked => FailureClass::Panicked,
            FailureKind::Fatal => FailureClass::Fatal,
            FailureKind::Canceled => FailureClass::Canceled,
            FailureKind::Hinted(Hint::DoNotRetry) => FailureClass::DoNotRetry,
            FailureKind::Hinted(_) => FailureClass::RetryAfter,
            FailureKind::Throttled => FailureClass::Throttled,
        }
    }
}

/// The class of a failure, as remembered by a machine and reported in its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FailureClass {
    /// See [`FailureKind::Retryable`].
    Retryable,
    /// See [`FailureKind::Timeout`]; also an attempt that the machine itself timed out.
    Timeout,
    /// See [`FailureKind::Panicked`].
    Panicked,
    /// See [`FailureKind::Fatal`].
    Fatal,
    /// See [`FailureKind::Canceled`].
    Canceled,
    /// A failure with [`Hint::After`] or [`Hint::At`].
    RetryAfter,
    /// A failure with [`Hint::DoNotRetry`].
    DoNotRetry,
    /// See [`FailureKind::Throttled`].
    Throttled,
}

impl FailureClass {
    /// Whether a failure of this class may be retried (limits permitting).
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            FailureClass::Retryable
                | FailureClass::Timeout
                | FailureClass::Panicked
                | FailureClass::RetryAfter
                | FailureClass::Throttled
        )
    }
}

/// A failed attempt as reported to a machine: its kind and the caller's own error value.
///
/// `E` is whatever the caller wants handed back in the outcome (`()`, an error code, an
/// `Arc<str>`); the core stores and returns it, never inspects or formats it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Failure<E> {
    /// How the failure is classified.
    pub kind: FailureKind,
    /// The caller's error value.
    pub error: E,
}

impl<E> Failure<E> {
    /// A failure of the given kind.
    pub const fn new(kind: FailureKind, error: E) -> Self {
        Failure { kind, error }
    }

    /// A transient failure ([`FailureKind::Retryable`]).
    pub const fn retryable(error: E) -> Self {
        Failure::new(FailureKind::Retryable, error)
    }

    /// A timeout reported by the attempt itself ([`FailureKind::Timeout`]).
    pub const fn timeout(error: E) -> Self {
        Failure::new(FailureKind::Timeout, error)
    }

    /// A permanent failure ([`FailureKind::Fatal`]).
    pub const fn fatal(error: E) -> Self {
        Failure::new(FailureKind::Fatal, error)
    }

    /// A canceled attempt ([`FailureKind::Canceled`]).
    pub const fn canceled(error: E) -> Self {
        Failure::new(FailureKind::Canceled, error)
    }

    /// A caught panic ([`FailureKind::Panicked`]).
    pub const fn panicked(error: E) -> Self {
        Failure::new(FailureKind::Panicked, error)
    }

    /// An overloaded dependency that gave no hint ([`FailureKind::Throttled`]).
    pub const fn throttled(error: E) -> Self {
        Failure::new(FailureKind::Throttled, error)
    }

    /// A failure that asks to be retried after `delay` ([`Hint::After`]).
    pub const fn retry_after(delay: Duration, error: E) -> Self {
        Failure::new(FailureKind::Hinted(Hint::After(delay)), error)
    }

    /// A failure that asks never to be retried ([`Hint::DoNotRetry`]).
    pub const fn do_not_retry(error: E) -> Self {
        Failure::new(FailureKind::Hinted(Hint::DoNotRetry), error)
    }
}

/// The last failure of an operation, as carried by its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LastFailure<E> {
    /// Its class.
    pub class: FailureClass,
    /// The caller's error value; `None` when the machine itself timed the attempt out.
    pub error: Option<E>,
}
