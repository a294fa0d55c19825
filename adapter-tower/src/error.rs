//! How a call through the retry layer gives up (T2, T3).

use std::fmt;
use std::time::Duration;

use persevere::{FailureClass, FailureKind, HedgeStats, OutcomeKind, Stats};
use persevere_driver::{Gate, GaveUp, Refusal};

use crate::classify::SentOnce;

/// What the last attempt of a call that gave up produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Last<Res, E> {
    /// A response the classifier called a failure (a 503), returned here rather than lost.
    Response(Res),
    /// The inner service's error.
    Error(E),
}

/// An attempt's failure as the driving loop sees it: the result and the kind it was classified.
pub(crate) struct Failed<Res, E> {
    pub(crate) kind: FailureKind,
    pub(crate) last: Last<Res, E>,
}

/// Why a call through the [`RetryLayer`](crate::RetryLayer) (or the
/// [`HedgeLayer`](crate::HedgeLayer)) did not return a response it could call a success: how the
/// retry ended, the last attempt's response or error, and what the call took (for a hedged
/// call, `attempts` counts the attempts started and nothing is slept).
///
/// Match on [`outcome`](Self::outcome): `Rejected` when a gate refused the call or a retry
/// ([`refused_by`](Self::refused_by) says which: the breaker or the budget), `Deferred` when
/// the other side asked to be retried later than the policy waits, `Exhausted`, `OutOfTime`,
/// `Fatal`. [`retry_after`](Self::retry_after) says when to come back, when anyone said;
/// [`sent_once`](Self::sent_once) says why a request was not retried at all: such a request
/// has one attempt, so its failure ends the call `Exhausted` with the failure's own
/// [`class`](Self::class) (a 503 is `Throttled`), and `Fatal` only if the failure itself must
/// not be retried.
///
/// A call that a gate refused before its first attempt (an open breaker) sent nothing: its
/// [`stats`](Self::stats) count no attempt.
///
/// An [`Error`](std::error::Error) whenever `E` is `Debug + Display + 'static`, tower's
/// `BoxError` included, so `?` turns it into a `BoxError` when `Res` and `E` are `Send + Sync`
/// (T4). Its [`source`](std::error::Error::source) is the last error when that is a boxed error
/// (a `TimeoutLayer`'s, say); any other last error is in the message and in
/// [`error`](Self::error).
#[must_use]
pub struct RetryError<Res, E> {
    outcome: OutcomeKind,
    class: Option<FailureClass>,
    refused_by: Option<Gate>,
    last: Option<Last<Res, E>>,
    retry_after: Option<Duration>,
    stats: Stats,
    sent_once: Option<SentOnce>,
}

impl<Res, E> RetryError<Res, E> {
    /// The call gave up as `gave_up` says, after `stats`.
    pub(crate) fn gave_up(gave_up: GaveUp<Failed<Res, E>>, stats: Stats, sent_once: Option<SentOnce>) -> Self {
        let (retry_after, refused_by) = (gave_up.retry_after(), gave_up.refused_by());
        RetryError {
            outcome: gave_up.outcome,
            class: gave_up.class,
            refused_by,
            last: gave_up.error.map(|failed| failed.last),
            retry_after,
            stats,
            sent_once,
        }
    }

    /// The hedged call gave up as `gave_up` says, after `stats`: its attempts are those started,
    /// and its elapsed time is the hedging loop's.
    pub(crate) fn hedged(gave_up: GaveUp<Failed<Res, E>>, stats: HedgeStats, sent_once: Option<SentOnce>) -> Self {
        let stats = Stats { attempts: stats.started, slept: Duration::ZERO, elapsed: Some(stats.elapsed) };
        RetryError::gave_up(gave_up, stats, sent_once)
    }

    /// A gate refused the call before its first attempt (T4): nothing was sent.
    pub(crate) fn refused(refusal: Refusal) -> Self {
        RetryError {
            outcome: OutcomeKind::Rejected,
            class: None,
            refused_by: Some(refusal.gate()),
            last: None,
            retry_after: refusal.retry_after(),
            stats: Stats { attempts: 0, slept: Duration::ZERO, elapsed: None },
            sent_once: None,
        }
    }

    /// The inner service was not ready: `error` is its `poll_ready` error, and nothing was sent.
    pub(crate) fn not_ready(error: E) -> Self {
        RetryError {
            outcome: OutcomeKind::Fatal,
            class: None,
            refused_by: None,
            last: Some(Last::Error(error)),
            retry_after: None,
            stats: Stats { attempts: 0, slept: Duration::ZERO, elapsed: None },
            sent_once: None,
        }
    }

    /// How the retry ended.
    pub fn outcome(&self) -> OutcomeKind {
        self.outcome
    }

    /// The class of the last failure, if an attempt failed.
    pub fn class(&self) -> Option<FailureClass> {
        self.class
    }

    /// For a `Rejected` outcome, the gate that refused: [`Gate::Breaker`] or [`Gate::Budget`]
    /// (a tuple of gates names the one of them that refused), before the first attempt or
    /// before a retry.
    pub fn refused_by(&self) -> Option<Gate> {
        self.refused_by
    }

    /// The last attempt's response, if it was one the classifier called a failure.
    pub fn response(&self) -> Option<&Res> {
        match &self.last {
            Some(Last::Response(response)) => Some(response),
            _ => None,
        }
    }

    /// The last attempt's error (or the inner service's `poll_ready` error), if there was one.
    pub fn error(&self) -> Option<&E> {
        match &self.last {
            Some(Last::Error(error)) => Some(error),
            _ => None,
        }
    }

    /// What the last attempt produced: `None` if it timed out or panicked.
    pub fn into_last(self) -> Option<Last<Res, E>> {
        self.last
    }

    /// The last attempt's response, if it was one: for a proxy that passes the 503 on.
    pub fn into_response(self) -> Option<Res> {
        match self.last {
            Some(Last::Response(response)) => Some(response),
            _ => None,
        }
    }

    /// When to come back: for a `Deferred` outcome, how long after giving up the other side
    /// asked to be tried again (its `Retry-After`, B6); for a `Rejected` one, how long until
    /// the gate that refused may let a call through (a breaker's remaining open time; a budget
    /// cannot tell).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// What the call took: attempts, time slept between them, and the time from the first
    /// attempt's start when it was measured.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Why the request was sent only once, if it was not allowed to be retried.
    pub fn sent_once(&self) -> Option<SentOnce> {
        self.sent_once
    }
}

impl<Res, E: fmt::Debug> fmt::Debug for RetryError<Res, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryError")
            .field("outcome", &self.outcome)
            .field("class", &self.class)
            .field("refused_by", &self.refused_by)
            .field("response", &self.response().map(|_| ".."))
            .field("error", &self.error())
            .field("retry_after", &self.retry_after)
            .field("stats", &self.stats)
            .field("sent_once", &self.sent_once)
            .finish()
    }
}

impl<Res, E: fmt::Display> fmt::Display for RetryError<Res, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.stats.attempts;
        let plural = if attempts == 1 { "" } else { "s" };
        match (attempts, self.sent_once, self.refused_by) {
            (0, _, Some(gate)) => write!(f, "not sent: {gate} refused the call")?,
            (0, _, None) => f.write_str("the service was not ready")?,
            (_, Some(why), _) => write!(f, "not retried: {why}")?,
            (_, None, Some(gate)) => write!(f, "gave up after {attempts} attempt{plural}: {gate} refused the retry")?,
            (_, None, None) => write!(f, "gave up after {attempts} attempt{plural}: {}", self.outcome)?,
        }
        if let Some(after) = self.retry_after {
            write!(f, " (retry after {after:?})")?;
        }
        match (&self.last, self.class) {
            (Some(Last::Error(error)), _) => write!(f, "; last error: {error}"),
            (Some(Last::Response(_)), _) => f.write_str("; the last response was a failure"),
            (None, Some(FailureClass::Timeout)) => f.write_str("; the last attempt timed out"),
            (None, Some(FailureClass::Panicked)) => f.write_str("; the last attempt panicked"),
            _ => Ok(()),
        }
    }
}

impl<Res, E: fmt::Debug + fmt::Display + 'static> std::error::Error for RetryError<Res, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error().and_then(persevere_driver::boxed_error)
    }
}
