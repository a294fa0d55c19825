//! One operation, several attempts: the retry machine (rules R1–R6, hints B6).
//!
//! A [`RetryPolicy`] is the shared, immutable configuration; a [`Retry`] is one operation's
//! state: 64 bytes of plain data for `Retry<()>`, with no policy, RNG or clock inside, so a
//! durable engine can persist it alone and a million operations share one policy. The attempts
//! themselves (numbering, phases, the failure decision, the drain) are the attempt engine's,
//! shared with [`Supervision`](crate::Supervision); what is a retry's own is the total budget
//! and the statistics.

use core::time::Duration;

use rand_core::Rng;

use crate::attempt::{Attempts, Due, Ends, Misuse, Output, Phase};
use crate::backoff::Backoff;
use crate::decision::{DEFAULT_MAX_HINT, Decision, FailureRules};
use crate::error::Refused;
use crate::failure::{Failure, FailureKind, LastFailure};
use crate::time::saturating_nanos;
use crate::{Instant, PolicyError};

/// The configuration of a retried operation: its backoff, its limits, and how hints apply.
///
/// Every policy has a limit (R3): an attempt limit, a total budget, or an explicit
/// [`unbounded`](RetryPolicyBuilder::unbounded).
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, RetryPolicy};
///
/// let policy = RetryPolicy::builder(
///     Backoff::exponential(Duration::from_millis(100), 2.0).max_delay(Duration::from_secs(5)).build()?,
/// )
/// .max_retries(3) // at most 4 attempts in all
/// .total(Duration::from_secs(30))
/// .attempt_timeout(Duration::from_secs(2))
/// .build()?;
/// assert_eq!(policy.max_attempts(), Some(4));
/// assert_eq!(policy.max_hint(), Duration::from_secs(300)); // hints up to 5 min are honoured
///
/// // A forgotten limit is a configuration error, not a retry loop that never ends.
/// assert!(RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?).build().is_err());
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "RetryPolicyBuilder", into = "RetryPolicyBuilder")
)]
pub struct RetryPolicy {
    rules: FailureRules,
    /// `u64::MAX` for none.
    total_ns: u64,
    /// `u64::MAX` for none.
    attempt_timeout_ns: u64,
    max_attempts: Option<u32>,
}

/// The settings of a [`RetryPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct RetryPolicyBuilder {
    /// The delays between attempts.
    pub backoff: Backoff,
    /// Total attempts, the first included (R3). Exclusive with `max_retries`.
    pub max_attempts: Option<u32>,
    /// Retries after the first failure (R3): 3 allows at most 4 attempts. Exclusive with
    /// `max_attempts`.
    pub max_retries: Option<u32>,
    /// The budget from the first attempt's start: no sleep ends and no attempt starts past it;
    /// a running attempt is never cut short by it (R3).
    pub total: Option<Duration>,
    /// Each attempt's deadline is its start plus this (R3).
    pub attempt_timeout: Option<Duration>,
    /// The longest delay a hint may ask for (B6); a longer one ends the operation with
    /// [`Outcome::Deferred`]. [`DEFAULT_MAX_HINT`] (5 min) by default; [`Duration::MAX`]
    /// honours any hint.
    #[cfg_attr(
        feature = "serde",
        serde(default = "crate::decision::default_max_hint", deserialize_with = "crate::decision::max_hint_or_any")
    )]
    pub max_hint: Duration,
    /// Whether the schedule starts over from its first delay after a hinted delay (B6).
    /// `false` by default: a hinted failure counts as one more step of the schedule.
    #[cfg_attr(feature = "serde", serde(default))]
    pub restart_after_hint: bool,
    /// Retry with no attempt limit and no total budget, on purpose (R3). `false` by default:
    /// such a policy is refused.
    #[cfg_attr(feature = "serde", serde(default))]
    pub unbounded: bool,
    /// The delays after a [`Throttled`](crate::FailureKind::Throttled) failure, when they
    /// differ from `backoff`'s (the AWS SDKs back off throttling from 500 ms instead of
    /// 100 ms). Both schedules are counted along the same streak: the n-th failure waits the
    /// n-th delay of the schedule of its class. (A decorrelated schedule draws from the last
    /// delay waited, whichever schedule it came from.) `None` by default: `backoff` for every
    /// class.
    #[cfg_attr(feature = "serde", serde(default))]
    pub throttling_backoff: Option<Backoff>,
}

impl RetryPolicyBuilder {
    /// At most `n` attempts in all, the first included.
    pub const fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// At most `n` retries after the first failure (`n + 1` attempts).
    pub const fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// A total budget measured from the first attempt's start.
    pub const fn total(mut self, budget: Duration) -> Self {
        self.total = Some(budget);
        self
    }

    /// A deadline for each attempt, measured from its start.
    pub const fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The longest delay a hint may ask for; a longer one ends the operation with
    /// [`Outcome::Deferred`] (B6). [`Duration::MAX`] honours any hint.
    pub const fn max_hint(mut self, max_hint: Duration) -> Self {
        self.max_hint = max_hint;
        self
    }

    /// Whether the schedule restarts from its first delay after a hinted delay.
    pub const fn restart_after_hint(mut self, restart: bool) -> Self {
        self.restart_after_hint = restart;
        self
    }

    /// Backs off [`Throttled`](crate::FailureKind::Throttled) failures on `backoff` instead of
    /// the policy's schedule (see the field).
    pub const fn throttling_backoff(mut self, backoff: Backoff) -> Self {
        self.throttling_backoff = Some(backoff);
        self
    }

    /// Retries for ever: no attempt limit and no total budget, on purpose (R3). Each
    /// failure still waits its backoff, and `Fatal`, `Canceled` and `DoNotRetry` still end
    /// the operation.
    pub const fn unbounded(mut self) -> Self {
        self.unbounded = true;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when no limit is set and [`unbounded`](Self::unbounded) was not asked
    /// for (or was asked for beside a limit), `max_attempts` is zero, `max_retries` is
    /// `u32::MAX`, both are set, or `total`, `attempt_timeout` or `max_hint` is zero.
    /// Durations longer than `u64::MAX` nanoseconds (such as [`Duration::MAX`]) are accepted
    /// and mean "no limit".
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        let max_attempts = match (self.max_attempts, self.max_retries) {
            (Some(_), Some(_)) => {
                return Err(PolicyError::Conflict {
                    setting: "max_attempts",
                    other: "max_retries",
                    why: "both limit the same count; max_attempts(n + 1) equals max_retries(n)",
                });
            }
            (Some(0), None) => {
                return Err(PolicyError::Zero {
                    setting: "max_attempts",
                    why: "it counts the first attempt too, so at least 1; use max_attempts(1) for no retries",
                });
            }
            (Some(n), None) => Some(n),
            (None, Some(n)) => match n.checked_add(1) {
                Some(attempts) => Some(attempts),
                None => {
                    return Err(PolicyError::LimitTooLarge { setting: "max_retries", max: u64::from(u32::MAX - 1) });
                }
            },
            (None, None) => None,
        };
        let total_ns = positive(self.total, "total", "a zero budget allows no retry; use max_attempts(1)")?;
        // `Duration::MAX` means "no budget", so it is no limit either.
        let limited = max_attempts.is_some() || total_ns != u64::MAX;
        if self.unbounded && limited {
            return Err(PolicyError::Conflict {
                setting: "unbounded()",
                other: "a limit",
                why: "unbounded() says the operation has no attempt limit and no total budget; drop one or the other",
            });
        }
        if !self.unbounded && !limited {
            return Err(PolicyError::Unbounded);
        }
        let retries_allowed = max_attempts.map_or(u64::MAX, |n| u64::from(n) - 1);
        let mut rules = FailureRules::build(self.backoff, retries_allowed, self.max_hint, self.restart_after_hint)?;
        rules.throttling_backoff = self.throttling_backoff;
        Ok(RetryPolicy {
            rules,
            total_ns,
            attempt_timeout_ns: positive(
                self.attempt_timeout,
                "attempt_timeout",
                "every attempt would time out at once",
            )?,
            max_attempts,
        })
    }
}

fn positive(span: Option<Duration>, setting: &'static str, why: &'static str) -> Result<u64, PolicyError> {
    match span {
        None => Ok(u64::MAX),
        Some(d) if d.is_zero() => Err(PolicyError::Zero { setting, why }),
        Some(d) => Ok(saturating_nanos(d)),
    }
}

fn optional(ns: u64) -> Option<Duration> {
    (ns != u64::MAX).then(|| Duration::from_nanos(ns))
}

impl TryFrom<RetryPolicyBuilder> for RetryPolicy {
    type Error = PolicyError;

    fn try_from(builder: RetryPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<RetryPolicy> for RetryPolicyBuilder {
    fn from(policy: RetryPolicy) -> Self {
        RetryPolicyBuilder {
            backoff: policy.rules.backoff,
            max_attempts: policy.max_attempts,
            max_retries: None,
            total: policy.total(),
            attempt_timeout: policy.attempt_timeout(),
            max_hint: policy.max_hint(),
            restart_after_hint: policy.rules.restart_after_hint,
            unbounded: policy.is_unbounded(),
            throttling_backoff: policy.rules.throttling_backoff,
        }
    }
}

impl RetryPolicy {
    /// A builder with `backoff`, no limit yet (one must be set, or
    /// [`unbounded`](RetryPolicyBuilder::unbounded) asked for), hints honoured up to
    /// [`DEFAULT_MAX_HINT`].
    pub const fn builder(backoff: Backoff) -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            backoff,
            max_attempts: None,
            max_retries: None,
            total: None,
            attempt_timeout: None,
            max_hint: DEFAULT_MAX_HINT,
            restart_after_hint: false,
            unbounded: false,
            throttling_backoff: None,
        }
    }

    /// A policy from settings the crate knows to be valid (the presets), without the `Result`
    /// of [`RetryPolicyBuilder::build`]: `max_attempts` is `None` (unbounded) or at least 1;
    /// no budget, no timeout. Every caller has a test comparing it with `build()`'s.
    pub(crate) const fn preset(backoff: Backoff, max_attempts: Option<u32>, max_hint_ns: u64) -> RetryPolicy {
        let retries_allowed = match max_attempts {
            Some(n) => n as u64 - 1,
            None => u64::MAX,
        };
        RetryPolicy {
            rules: FailureRules {
                backoff,
                throttling_backoff: None,
                retries_allowed,
                max_hint_ns,
                restart_after_hint: false,
            },
            total_ns: u64::MAX,
            attempt_timeout_ns: u64::MAX,
            max_attempts,
        }
    }

    /// The backoff schedule.
    pub const fn backoff(&self) -> &Backoff {
        &self.rules.backoff
    }

    /// The schedule of [`Throttled`](crate::FailureKind::Throttled) failures, if it differs from
    /// [`backoff`](Self::backoff).
    pub const fn throttling_backoff(&self) -> Option<&Backoff> {
        self.rules.throttling_backoff.as_ref()
    }

    /// The attempt limit, the first attempt included; `None` for no limit.
    pub const fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The total budget.
    pub fn total(&self) -> Option<Duration> {
        optional(self.total_ns)
    }

    /// The per-attempt timeout.
    pub fn attempt_timeout(&self) -> Option<Duration> {
        optional(self.attempt_timeout_ns)
    }

    /// The longest hinted delay honoured ([`Duration::MAX`]: any).
    pub fn max_hint(&self) -> Duration {
        self.rules.max_hint()
    }

    /// Whether the schedule restarts after a hinted delay.
    pub const fn restarts_after_hint(&self) -> bool {
        self.rules.restart_after_hint
    }

    /// Whether the policy has neither an attempt limit nor a total budget (built with
    /// [`unbounded`](RetryPolicyBuilder::unbounded)).
    pub const fn is_unbounded(&self) -> bool {
        self.max_attempts.is_none() && self.total_ns == u64::MAX
    }

    /// Whether the driver must read the clock on the success path (a deadline or a budget).
    #[inline]
    pub const fn needs_clock(&self) -> bool {
        // Both are `u64::MAX` for none: one test for the two (a driver's fast path asks it).
        (self.total_ns & self.attempt_timeout_ns) != u64::MAX
    }
}

/// What the driver must do next; drained with [`Retry::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RetryAction<E> {
    /// Start attempt `attempt` now; report its result by `deadline` if there is one.
    Start {
        /// The attempt number, from 1.
        attempt: u64,
        /// When the machine will time the attempt out (on [`Retry::handle_timeout`]).
        deadline: Option<Instant>,
    },
    /// Drop attempt `attempt`: it passed its deadline, or the operation was canceled while it
    /// ran. A result for it is now refused as stale.
    Abandon {
        /// The attempt number.
        attempt: u64,
    },
    /// A retry is scheduled: wait until `until`, then call [`Retry::handle_timeout`]. A zero
    /// delay has `until` equal to the failure's `now`; a driver should not touch a timer for it.
    Sleep {
        /// The attempt that will start after the sleep.
        next_attempt: u64,
        /// The chosen delay.
        delay: Duration,
        /// When it ends.
        until: Instant,
    },
    /// The operation is over. Emitted exactly once.
    Finish {
        /// How it ended.
        outcome: Outcome<E>,
        /// What it took.
        stats: Stats,
    },
}

/// How an operation ended (rule R5): exactly one of these, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Outcome<E> {
    /// An attempt succeeded.
    Succeeded,
    /// The attempt limit was reached by retryable failures.
    Exhausted {
        /// The failure of the last attempt.
        last_failure: LastFailure<E>,
    },
    /// A failure that must not be retried ([`FailureKind::Fatal`] or
    /// [`Hint::DoNotRetry`](crate::Hint::DoNotRetry)).
    Fatal {
        /// That failure.
        failure: LastFailure<E>,
    },
    /// Canceled: by [`FailureKind::Canceled`], or by the driver ([`Retry::handle_cancel`]).
    Canceled {
        /// The failure that canceled it, or the last failure before the driver canceled it.
        last_failure: Option<LastFailure<E>>,
    },
    /// The next retry would have slept or started past the total budget.
    OutOfTime {
        /// The failure of the last attempt.
        last_failure: LastFailure<E>,
    },
    /// The driver refused the scheduled retry ([`Retry::handle_rejected`]): a retry budget or a
    /// breaker denied it.
    Rejected {
        /// The failure of the last attempt.
        last_failure: LastFailure<E>,
    },
    /// The last failure's hint asked for a retry at `retry_at`, later than the policy may
    /// wait: past its `max_hint`, or past the total budget (B6). The hint is never shortened;
    /// the operation ends now, and the caller may come back at `retry_at`.
    Deferred {
        /// When the other side asked to be tried again.
        retry_at: Instant,
        /// The failure that carried the hint.
        last_failure: LastFailure<E>,
    },
}

impl<E> Outcome<E> {
    /// The outcome without its payload.
    pub const fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Succeeded => OutcomeKind::Succeeded,
            Outcome::Exhausted { .. } => OutcomeKind::Exhausted,
            Outcome::Fatal { .. } => OutcomeKind::Fatal,
            Outcome::Canceled { .. } => OutcomeKind::Canceled,
            Outcome::OutOfTime { .. } => OutcomeKind::OutOfTime,
            Outcome::Rejected { .. } => OutcomeKind::Rejected,
            Outcome::Deferred { .. } => OutcomeKind::Deferred,
        }
    }

    /// The last failure, if the operation did not succeed after one.
    pub fn last_failure(&self) -> Option<&LastFailure<E>> {
        match self {
            Outcome::Succeeded => None,
            Outcome::Canceled { last_failure } => last_failure.as_ref(),
            Outcome::Exhausted { last_failure }
            | Outcome::OutOfTime { last_failure }
            | Outcome::Rejected { last_failure }
            | Outcome::Deferred { last_failure, .. }
            | Outcome::Fatal { failure: last_failure } => Some(last_failure),
        }
    }

    /// The last failure, by value (see [`last_failure`](Self::last_failure)).
    pub fn into_last_failure(self) -> Option<LastFailure<E>> {
        match self {
            Outcome::Succeeded => None,
            Outcome::Canceled { last_failure } => last_failure,
            Outcome::Exhausted { last_failure }
            | Outcome::OutOfTime { last_failure }
            | Outcome::Rejected { last_failure }
            | Outcome::Deferred { last_failure, .. }
            | Outcome::Fatal { failure: last_failure } => Some(last_failure),
        }
    }

    /// When the other side asked to be tried again, for a [`Deferred`](Outcome::Deferred)
    /// outcome.
    pub const fn retry_at(&self) -> Option<Instant> {
        match self {
            Outcome::Deferred { retry_at, .. } => Some(*retry_at),
            _ => None,
        }
    }
}

/// [`Outcome`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum OutcomeKind {
    /// See [`Outcome::Succeeded`].
    Succeeded,
    /// See [`Outcome::Exhausted`].
    Exhausted,
    /// See [`Outcome::Fatal`].
    Fatal,
    /// See [`Outcome::Canceled`].
    Canceled,
    /// See [`Outcome::OutOfTime`].
    OutOfTime,
    /// See [`Outcome::Rejected`].
    Rejected,
    /// See [`Outcome::Deferred`].
    Deferred,
}

/// Why an operation ended, in words a log line can use: "attempt limit reached", "the total
/// time budget would be overrun", …
impl core::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            OutcomeKind::Succeeded => "succeeded",
            OutcomeKind::Exhausted => "attempt limit reached",
            OutcomeKind::Fatal => "the failure must not be retried",
            OutcomeKind::Canceled => "canceled",
            OutcomeKind::OutOfTime => "the total time budget would be overrun",
            OutcomeKind::Rejected => "a retry budget or breaker refused the retry",
            OutcomeKind::Deferred => "the other side asked to be retried later than the policy waits",
        })
    }
}

impl OutcomeKind {
    /// Whether an outcome of this kind reports a last failure (every kind but `Succeeded` and
    /// `Canceled`, which may have none).
    const fn has_failure(self) -> bool {
        !matches!(self, OutcomeKind::Succeeded | OutcomeKind::Canceled)
    }
}

/// What an operation took (R5): the one statistics type of the core and of every driver.
///
/// Times are measured from the `now` values the machine was given. In the core `elapsed` is
/// always known; a driver that did not read the clock when the first attempt started (the
/// allocation- and clock-free success path, §8) reports `None` rather than a guess.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    /// Attempts started.
    pub attempts: u64,
    /// Time spent between a failure and the next attempt's start.
    pub slept: Duration,
    /// Time from the first attempt's start to the outcome, when it was measured.
    pub elapsed: Option<Duration>,
}

/// Where an operation is; see [`Retry::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RetryStatus {
    /// Not started.
    Idle,
    /// An attempt is running.
    Running {
        /// Its number.
        attempt: u64,
        /// Its deadline.
        deadline: Option<Instant>,
    },
    /// Waiting before the next attempt.
    Sleeping {
        /// The attempt that starts next.
        next_attempt: u64,
        /// When it starts.
        until: Instant,
    },
    /// Over.
    Finished(OutcomeKind),
}

/// A caller mistake; the machine is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// `handle_start` on an operation that already started.
    #[error("the operation has already started; create a new `Retry` for a new operation")]
    AlreadyStarted,
    /// An input that needs a started operation, before `handle_start`.
    #[error("the operation has not started; call `handle_start` first")]
    NotStarted,
    /// A result while no attempt runs (the machine is sleeping).
    #[error(
        "no attempt is running (the operation is waiting to retry); results belong to `RetryAction::Start`ed attempts"
    )]
    NoAttemptRunning,
    /// A result for an attempt other than the running one (an abandoned or future attempt).
    #[error("result for attempt {got}, but attempt {running} is the one running")]
    StaleAttempt {
        /// The attempt that runs.
        running: u64,
        /// The attempt named by the input.
        got: u64,
    },
    /// `handle_rejected` while no retry is scheduled.
    #[error("no retry is scheduled, so there is nothing to reject; reject on `RetryAction::Sleep`")]
    NothingToReject,
    /// Any input after the outcome.
    #[error("the operation has finished ({0:?}); its outcome was final")]
    Finished(OutcomeKind),
    /// An input while outputs of an earlier one wait to be drained (the drain rule).
    #[error("actions of an earlier input wait to be drained; call `poll_action` until it returns `None` first")]
    Undrained,
}

impl From<Misuse<OutcomeKind>> for RetryError {
    fn from(misuse: Misuse<OutcomeKind>) -> Self {
        match misuse {
            Misuse::AlreadyStarted => RetryError::AlreadyStarted,
            Misuse::NotStarted => RetryError::NotStarted,
            Misuse::NoAttemptRunning => RetryError::NoAttemptRunning,
            Misuse::Stale { current, got } => RetryError::StaleAttempt { running: current, got },
            Misuse::Finished(kind) => RetryError::Finished(kind),
            Misuse::Undrained => RetryError::Undrained,
        }
    }
}

/// How the failure decision's stops end a retried operation.
const ENDS: Ends<OutcomeKind> = Ends {
    fatal: OutcomeKind::Fatal,
    canceled: OutcomeKind::Canceled,
    limit: OutcomeKind::Exhausted,
    deferred: OutcomeKind::Deferred,
};

/// One operation's retry state (rules R1–R6, B6).
///
/// # Driving it
///
/// Input comes in through `handle_*`; output goes out through [`poll_action`](Self::poll_action)
/// and [`poll_timeout`](Self::poll_timeout). After every `handle_*` call, drain
/// `poll_action` until it returns `None`, then wait until `poll_timeout` (without a timer if it
/// is not later than `now`) and call [`handle_timeout`](Self::handle_timeout).
///
/// **Drain order.** At most one of each, in this order: [`RetryAction::Abandon`] (the running
/// attempt timed out or was canceled), [`RetryAction::Sleep`] (a retry is scheduled),
/// [`RetryAction::Start`], [`RetryAction::Finish`] (exactly once per operation). Every action
/// of an input is reported; an input that arrives before they are drained is refused with
/// [`RetryError::Undrained`] (and `handle_timeout` does nothing), so none is ever dropped
/// unseen (the crate's drain rule).
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. [`handle_timeout`](Self::handle_timeout) before the instant that
/// `poll_timeout` named, or twice, changes nothing.
///
/// **Hints (B6).** A hinted delay is never shortened: a hint within `max_hint` and the total
/// budget is waited in full; one past either ends the operation at once with
/// [`Outcome::Deferred`], which carries the hinted instant.
///
/// **Misuse** (a result while sleeping, a stale attempt number, anything after the outcome)
/// returns an error and leaves the machine exactly as it was (G12).
///
/// **Another policy.** A `Retry` is plain data and may be driven under another policy than
/// the one it started under (persisted, then loaded): a running attempt's deadline and a sleep
/// already scheduled are kept; the new limits apply at once (a sleep that ends past the new
/// attempt limit or total budget finishes `Exhausted` or `OutOfTime` instead of starting an
/// attempt), and the new backoff and hint rule from the next failure.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, Failure, Instant, Outcome, Retry, RetryAction, RetryPolicy};
/// use rand_core::SeedableRng;
///
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build()?)
///     .max_attempts(3)
///     .build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut retry = Retry::<&str>::new();
/// let mut now = Instant::ZERO;
///
/// retry.handle_start(&policy, now)?;
/// assert_eq!(retry.poll_action(), Some(RetryAction::Start { attempt: 1, deadline: None }));
/// retry.handle_failure(&policy, now, 1, Failure::retryable("503"), &mut rng).unwrap();
/// let Some(RetryAction::Sleep { until, .. }) = retry.poll_action() else { unreachable!() };
/// now = until; // the driver sleeps
/// retry.handle_timeout(&policy, now, &mut rng);
/// assert_eq!(retry.poll_action(), Some(RetryAction::Start { attempt: 2, deadline: None }));
/// retry.handle_success(now, 2)?;
/// let Some(RetryAction::Finish { outcome, stats }) = retry.poll_action() else { unreachable!() };
/// assert_eq!(outcome, Outcome::Succeeded);
/// assert_eq!((stats.attempts, stats.slept), (2, Duration::from_millis(10)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Retry<E> {
    engine: Attempts<E, OutcomeKind>,
    first_start: Instant,
    slept_ns: u64,
}

impl<E> Default for Retry<E> {
    fn default() -> Self {
        Retry::new()
    }
}

impl<E> Retry<E> {
    /// An operation that has not started.
    pub const fn new() -> Self {
        Retry { engine: Attempts::new(), first_start: Instant::ZERO, slept_ns: 0 }
    }

    /// Starts the operation: attempt 1 starts at `now`.
    ///
    /// # Errors
    /// [`RetryError::AlreadyStarted`] or [`RetryError::Finished`]; nothing changes.
    #[inline]
    pub fn handle_start(&mut self, policy: &RetryPolicy, now: Instant) -> Result<(), RetryError> {
        self.engine.check_idle()?;
        let now = self.engine.accept(now);
        self.first_start = now;
        self.engine.begin(now, policy.attempt_timeout_ns);
        Ok(())
    }

    /// Attempt `attempt` succeeded: the operation finishes with [`Outcome::Succeeded`] and the
    /// failure streak returns to zero (R4).
    ///
    /// # Errors
    /// When `attempt` is not the running attempt, or actions wait to be drained; nothing
    /// changes.
    #[inline(always)]
    pub fn handle_success(&mut self, now: Instant, attempt: u64) -> Result<(), RetryError> {
        self.engine.check_running(attempt)?;
        self.engine.accept(now);
        self.engine.succeed();
        self.engine.finish(OutcomeKind::Succeeded);
        Ok(())
    }

    /// Attempt `attempt` failed with `failure`: the machine schedules a retry
    /// ([`RetryAction::Sleep`]) or finishes, by the failure's class, the limits, the hint and
    /// the total budget. Draws jitter from `rng` when the schedule needs it.
    ///
    /// # Errors
    /// When `attempt` is not the running attempt, or actions wait to be drained; nothing
    /// changes and the failure is handed back.
    #[inline(always)]
    pub fn handle_failure<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
        rng: &mut R,
    ) -> Result<(), Refused<RetryError, Failure<E>>> {
        if let Err(misuse) = self.engine.check_running(attempt) {
            return Err(Refused::new(misuse.into(), failure));
        }
        let now = self.engine.accept(now);
        self.decide(policy, now, failure.kind, Some(failure.error), rng);
        Ok(())
    }

    /// Wakes the machine: a sleep that has ended starts the next attempt; an attempt past its
    /// deadline is abandoned and counts as a [`Timeout`](crate::FailureClass::Timeout) failure.
    /// Early, repeated or spurious calls, calls after the outcome, and calls while actions wait
    /// to be drained change nothing.
    #[inline(always)]
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, policy: &RetryPolicy, now: Instant, rng: &mut R) {
        let now = self.engine.last_now().later(now);
        match self.engine.due(now) {
            Due::Deadline => {
                self.engine.accept(now);
                self.engine.mark_ended();
                self.decide(policy, now, FailureKind::Timeout, None, rng);
            }
            Due::WaitOver => {
                let slept = now.as_nanos().saturating_sub(self.engine.last_now().as_nanos());
                self.slept_ns = self.slept_ns.saturating_add(slept);
                self.engine.accept(now);
                if now > self.first_start.saturating_add_nanos(policy.total_ns) {
                    // Woken after the budget ran out (the sleep itself ended within it): no
                    // attempt starts past the budget (R3).
                    self.engine.finish(OutcomeKind::OutOfTime);
                } else if self.engine.limit_reached(&policy.rules) {
                    // Slept under a policy that allowed this retry, woken under one that does
                    // not (a state made under another policy): its limit holds (R3).
                    self.engine.finish(OutcomeKind::Exhausted);
                } else {
                    self.engine.begin(now, policy.attempt_timeout_ns);
                }
            }
            Due::Nothing => {}
        }
    }

    /// The driver cancels the operation (also one that has not started): it finishes with
    /// [`Outcome::Canceled`]; a running attempt is abandoned.
    ///
    /// # Errors
    /// [`RetryError::Finished`] after the outcome, [`RetryError::Undrained`] while actions
    /// wait to be drained; nothing changes.
    #[inline]
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), RetryError> {
        if self.engine.cancel(now, OutcomeKind::Canceled)? == Phase::Idle {
            // Canceled before it started: it took no time.
            self.first_start = self.engine.last_now();
        }
        Ok(())
    }

    /// The driver refuses the scheduled retry (a retry budget or breaker said no, U4): the
    /// operation finishes with [`Outcome::Rejected`]. Call it on [`RetryAction::Sleep`], after
    /// draining.
    ///
    /// # Errors
    /// [`RetryError::NothingToReject`] while an attempt runs, [`RetryError::NotStarted`]
    /// before the start, [`RetryError::Finished`] after the outcome, and
    /// [`RetryError::Undrained`] while actions wait to be drained; nothing changes.
    #[inline]
    pub fn handle_rejected(&mut self, now: Instant) -> Result<(), RetryError> {
        match self.engine.phase() {
            Phase::Running | Phase::Abandoning => return Err(RetryError::NothingToReject),
            _ => self.engine.check_started()?,
        }
        self.engine.accept(now);
        self.engine.finish(OutcomeKind::Rejected);
        Ok(())
    }

    /// The next action, in the documented drain order; `None` when there is nothing to do.
    #[inline(always)]
    pub fn poll_action(&mut self) -> Option<RetryAction<E>> {
        Some(match self.engine.poll()? {
            Output::Ended { attempt } => RetryAction::Abandon { attempt },
            Output::Wait { next_attempt, delay, until } => RetryAction::Sleep { next_attempt, delay, until },
            Output::Start { attempt, deadline } => RetryAction::Start { attempt, deadline },
            Output::Finish(kind) => RetryAction::Finish { outcome: self.take_outcome(kind), stats: self.stats() },
        })
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the running attempt's
    /// deadline, or the end of the current sleep; `None` when nothing is timed. A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    /// Where the operation is.
    pub fn status(&self) -> RetryStatus {
        let attempt = self.engine.attempt();
        match self.engine.phase() {
            Phase::Idle => RetryStatus::Idle,
            // A retry never abandons an attempt without deciding at once.
            Phase::Running | Phase::Abandoning => RetryStatus::Running { attempt, deadline: self.engine.deadline() },
            Phase::Waiting => {
                RetryStatus::Sleeping { next_attempt: attempt.saturating_add(1), until: self.engine.timer() }
            }
            Phase::Finished(kind) => RetryStatus::Finished(kind),
        }
    }

    /// The number of the latest attempt started (0 before the start).
    pub const fn attempt(&self) -> u64 {
        self.engine.attempt()
    }

    /// Consecutive failures so far (every attempt that failed: a success ends the operation,
    /// R4).
    pub const fn streak(&self) -> u32 {
        self.engine.streak()
    }

    /// The latest `now` the machine accepted.
    pub const fn now(&self) -> Instant {
        self.engine.last_now()
    }

    /// The last failure, while the operation runs (taken by the [`RetryAction::Finish`] it
    /// ends with).
    pub const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.engine.last_failure()
    }

    /// Whether actions wait to be drained.
    pub const fn has_actions(&self) -> bool {
        self.engine.has_actions()
    }

    /// What the operation has taken so far.
    #[inline]
    pub fn stats(&self) -> Stats {
        Stats {
            attempts: self.engine.attempt(),
            slept: Duration::from_nanos(self.slept_ns),
            elapsed: Some(self.engine.last_now().saturating_duration_since(self.first_start)),
        }
    }

    /// Decides after a failure (the running attempt's, or its timeout's).
    #[inline(always)]
    fn decide<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        rng: &mut R,
    ) {
        match self.engine.fail(&policy.rules, now, kind, error, rng) {
            Decision::Wait { delay_ns, hinted } => {
                let until = now.saturating_add_nanos(delay_ns);
                let budget_end = self.first_start.saturating_add_nanos(policy.total_ns);
                if until <= budget_end {
                    self.engine.wait(until);
                } else if hinted {
                    self.engine.defer(OutcomeKind::Deferred, until);
                } else {
                    self.engine.finish(OutcomeKind::OutOfTime);
                }
            }
            Decision::Stop(stop) => self.engine.stop(stop, ENDS),
        }
    }

    #[inline]
    fn take_outcome(&mut self, kind: OutcomeKind) -> Outcome<E> {
        let last = self.engine.take_last_failure();
        match (kind, last) {
            (OutcomeKind::Succeeded, _) => Outcome::Succeeded,
            (OutcomeKind::Canceled, last_failure) => Outcome::Canceled { last_failure },
            (OutcomeKind::Deferred, Some(last_failure)) => {
                Outcome::Deferred { retry_at: self.engine.timer(), last_failure }
            }
            (OutcomeKind::Exhausted, Some(last_failure)) => Outcome::Exhausted { last_failure },
            (OutcomeKind::Fatal, Some(failure)) => Outcome::Fatal { failure },
            (OutcomeKind::OutOfTime, Some(last_failure)) => Outcome::OutOfTime { last_failure },
            (OutcomeKind::Rejected, Some(last_failure)) => Outcome::Rejected { last_failure },
            // Every other outcome is decided right after a failure was stored (and a loaded
            // state is validated to have it), so this arm is never taken.
            (_, last_failure) => Outcome::Canceled { last_failure },
        }
    }

    /// Whether a loaded state is one the transitions could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        self.engine.validate(OutcomeKind::has_failure, OutcomeKind::Canceled)?;
        if self.engine.phase() == Phase::Abandoning {
            return Err("a retry never waits for an abandoned attempt to be dropped (only supervision does)");
        }
        if self.engine.phase() == Phase::Waiting && self.engine.last_failure().is_none() {
            return Err("a retry waits without a failure to retry");
        }
        if self.first_start > self.engine.last_now() {
            return Err("the first attempt started after the latest accepted instant");
        }
        if self.slept_ns > self.engine.last_now().as_nanos() - self.first_start.as_nanos() {
            return Err("more time slept than has passed since the first attempt");
        }
        Ok(())
    }
}

crate::serde_validated!(Retry<E>, "a Retry");
