//! One operation, several attempts: the retry machine (rules R1–R6, hints B6).
//!
//! A [`RetryPolicy`] is the shared, immutable configuration; a [`Retry`] is one operation's
//! state: 64 bytes of plain data for `Retry<()>`, with no policy, RNG or clock inside, so a
//! durable engine can persist it alone and a million operations share one policy.

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState};
use crate::failure::{Failure, FailureKind, Hint, LastFailure};
use crate::time::saturating_nanos;
use crate::{Instant, PolicyError};

/// The configuration of a retried operation: its backoff, its limits, and how hints apply.
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
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "RetryPolicyBuilder", into = "RetryPolicyBuilder")
)]
pub struct RetryPolicy {
    backoff: Backoff,
    /// `u32::MAX` when no limit was set (an operation cannot count further).
    max_attempts: u32,
    limited: bool,
    /// `u64::MAX` for none.
    total_ns: u64,
    /// `u64::MAX` for none.
    attempt_timeout_ns: u64,
    /// `u64::MAX` for none.
    max_hint_ns: u64,
    restart_after_hint: bool,
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
    /// The longest delay a hint may ask for; longer hints are shortened to it (B6).
    pub max_hint: Option<Duration>,
    /// Whether the schedule starts over from its first delay after a hinted delay (B6).
    /// `false` by default: a hinted failure counts as one more step of the schedule.
    pub restart_after_hint: bool,
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

    /// The longest delay a hint may ask for.
    pub const fn max_hint(mut self, max_hint: Duration) -> Self {
        self.max_hint = Some(max_hint);
        self
    }

    /// Whether the schedule restarts from its first delay after a hinted delay.
    pub const fn restart_after_hint(mut self, restart: bool) -> Self {
        self.restart_after_hint = restart;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when `max_attempts` is zero, `max_retries` is `u32::MAX`, both are set,
    /// or `total`, `attempt_timeout` or `max_hint` is zero. Durations longer than `u64::MAX`
    /// nanoseconds (such as [`Duration::MAX`]) are accepted and mean "no limit".
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        let (max_attempts, limited) = match (self.max_attempts, self.max_retries) {
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
            (Some(n), None) => (n, true),
            (None, Some(n)) => match n.checked_add(1) {
                Some(attempts) => (attempts, true),
                None => {
                    return Err(PolicyError::LimitTooLarge { setting: "max_retries", max: u64::from(u32::MAX - 1) });
                }
            },
            (None, None) => (u32::MAX, false),
        };
        Ok(RetryPolicy {
            backoff: self.backoff,
            max_attempts,
            limited,
            total_ns: positive(self.total, "total", "a zero budget allows no retry; use max_attempts(1)")?,
            attempt_timeout_ns: positive(
                self.attempt_timeout,
                "attempt_timeout",
                "every attempt would time out at once",
            )?,
            max_hint_ns: positive(
                self.max_hint,
                "max_hint",
                "every hint would mean 'retry now'; leave it unset to honour hints",
            )?,
            restart_after_hint: self.restart_after_hint,
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
            backoff: policy.backoff,
            max_attempts: policy.max_attempts(),
            max_retries: None,
            total: policy.total(),
            attempt_timeout: policy.attempt_timeout(),
            max_hint: policy.max_hint(),
            restart_after_hint: policy.restart_after_hint,
        }
    }
}

impl RetryPolicy {
    /// A builder with `backoff`, no limits and hints honoured in full.
    pub const fn builder(backoff: Backoff) -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            backoff,
            max_attempts: None,
            max_retries: None,
            total: None,
            attempt_timeout: None,
            max_hint: None,
            restart_after_hint: false,
        }
    }

    /// A policy from settings the crate knows to be valid (the presets), without the `Result`
    /// of [`RetryPolicyBuilder::build`]: `max_attempts` is `None` or at least 1; no budget, no
    /// timeout, hints honoured in full. Every caller has a test comparing it with `build()`'s.
    pub(crate) const fn preset(backoff: Backoff, max_attempts: Option<u32>) -> RetryPolicy {
        let (max_attempts, limited) = match max_attempts {
            Some(n) => (n, true),
            None => (u32::MAX, false),
        };
        RetryPolicy {
            backoff,
            max_attempts,
            limited,
            total_ns: u64::MAX,
            attempt_timeout_ns: u64::MAX,
            max_hint_ns: u64::MAX,
            restart_after_hint: false,
        }
    }

    /// The backoff schedule.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The attempt limit, the first attempt included; `None` for no limit (an operation then
    /// still stops after `u32::MAX` attempts, where its counter ends).
    pub const fn max_attempts(&self) -> Option<u32> {
        if self.limited { Some(self.max_attempts) } else { None }
    }

    /// The total budget.
    pub fn total(&self) -> Option<Duration> {
        optional(self.total_ns)
    }

    /// The per-attempt timeout.
    pub fn attempt_timeout(&self) -> Option<Duration> {
        optional(self.attempt_timeout_ns)
    }

    /// The longest hinted delay honoured.
    pub fn max_hint(&self) -> Option<Duration> {
        optional(self.max_hint_ns)
    }

    /// Whether the schedule restarts after a hinted delay.
    pub const fn restarts_after_hint(&self) -> bool {
        self.restart_after_hint
    }

    /// Whether the driver must read the clock on the success path (a deadline or a budget).
    pub const fn needs_clock(&self) -> bool {
        self.total_ns != u64::MAX || self.attempt_timeout_ns != u64::MAX
    }
}

/// What the driver must do next; drained with [`Retry::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Action<E> {
    /// Start attempt `attempt` now; report its result by `deadline` if there is one.
    Start {
        /// The attempt number, from 1.
        attempt: u32,
        /// When the machine will time the attempt out (on [`Retry::handle_timeout`]).
        deadline: Option<Instant>,
    },
    /// Drop attempt `attempt`: it passed its deadline, or the operation was canceled while it
    /// ran. A result for it is now refused as stale.
    Abandon {
        /// The attempt number.
        attempt: u32,
    },
    /// A retry is scheduled: wait until `until`, then call [`Retry::handle_timeout`]. A zero
    /// delay has `until` equal to the failure's `now`; a driver should not touch a timer for it.
    Sleep {
        /// The attempt that will start after the sleep.
        next_attempt: u32,
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
    /// A failure that must not be retried ([`FailureKind::Fatal`] or [`Hint::DoNotRetry`]).
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
            | Outcome::Fatal { failure: last_failure } => Some(last_failure),
        }
    }
}

/// [`Outcome`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
}

/// What an operation took (R5). Times are measured from the `now` values the driver passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    /// Attempts started.
    pub attempts: u32,
    /// Time spent between a failure and the next attempt's start.
    pub slept: Duration,
    /// Time from the first attempt's start to the outcome.
    pub elapsed: Duration,
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
        attempt: u32,
        /// Its deadline.
        deadline: Option<Instant>,
    },
    /// Waiting before the next attempt.
    Sleeping {
        /// The attempt that starts next.
        next_attempt: u32,
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
    #[error("no attempt is running (the operation is waiting to retry); results belong to `Action::Start`ed attempts")]
    NoAttemptRunning,
    /// A result for an attempt other than the running one (an abandoned or future attempt).
    #[error("result for attempt {got}, but attempt {running} is the one running")]
    StaleAttempt {
        /// The attempt that runs.
        running: u32,
        /// The attempt named by the input.
        got: u32,
    },
    /// `handle_rejected` while no retry is scheduled.
    #[error("no retry is scheduled, so there is nothing to reject; reject on `Action::Sleep`")]
    NothingToReject,
    /// Any input after the outcome.
    #[error("the operation has finished ({0:?}); its outcome was final")]
    Finished(OutcomeKind),
}

/// A refused [`Retry::handle_failure`]: the reason, and the failure handed back unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct FailureRefused<E> {
    /// Why it was refused.
    pub error: RetryError,
    /// The failure, as given.
    pub failure: Failure<E>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Phase {
    Idle,
    /// `deadline == Instant::MAX` means none.
    Running {
        deadline: Instant,
    },
    Sleeping {
        until: Instant,
    },
    Finished(OutcomeKind),
}

const ABANDON: u8 = 1;
const SLEEP: u8 = 2;
const START: u8 = 4;
const FINISH: u8 = 8;

/// One operation's retry state (rules R1–R6, B6).
///
/// # Driving it
///
/// Input comes in through `handle_*`; output goes out through [`poll_action`](Self::poll_action)
/// and [`poll_timeout`](Self::poll_timeout). After every `handle_*` call, drain
/// `poll_action` until it returns `None`, then wait until `poll_timeout` (without a timer if it
/// is not later than `now`) and call [`handle_timeout`](Self::handle_timeout).
///
/// **Drain order.** At most one of each, in this order: [`Action::Abandon`] (the running attempt
/// timed out or was canceled), [`Action::Sleep`] (a retry is scheduled), [`Action::Start`],
/// [`Action::Finish`] (exactly once per operation). A `handle_*` call replaces actions that were
/// not drained before it.
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. [`handle_timeout`](Self::handle_timeout) before the instant that
/// `poll_timeout` named, or twice, changes nothing.
///
/// **Misuse** (a result while sleeping, a stale attempt number, anything after the outcome)
/// returns an error and leaves the machine exactly as it was (G12).
///
/// ```
/// use core::time::Duration;
/// use persevere::{Action, Backoff, Failure, Instant, Outcome, Retry, RetryPolicy};
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
/// assert_eq!(retry.poll_action(), Some(Action::Start { attempt: 1, deadline: None }));
/// retry.handle_failure(&policy, now, 1, Failure::retryable("503"), &mut rng).unwrap();
/// let Some(Action::Sleep { until, .. }) = retry.poll_action() else { unreachable!() };
/// now = until; // the driver sleeps
/// retry.handle_timeout(&policy, now, &mut rng);
/// assert_eq!(retry.poll_action(), Some(Action::Start { attempt: 2, deadline: None }));
/// retry.handle_success(now, 2)?;
/// let Some(Action::Finish { outcome, stats }) = retry.poll_action() else { unreachable!() };
/// assert_eq!(outcome, Outcome::Succeeded);
/// assert_eq!((stats.attempts, stats.slept), (2, Duration::from_millis(10)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Retry<E> {
    phase: Phase,
    attempt: u32,
    pending: u8,
    backoff: BackoffState,
    first_start: Instant,
    last_now: Instant,
    slept_ns: u64,
    last_failure: Option<LastFailure<E>>,
}

impl<E> Default for Retry<E> {
    fn default() -> Self {
        Retry::new()
    }
}

impl<E> Retry<E> {
    /// An operation that has not started.
    pub const fn new() -> Self {
        Retry {
            phase: Phase::Idle,
            attempt: 0,
            pending: 0,
            backoff: BackoffState::new(),
            first_start: Instant::ZERO,
            last_now: Instant::ZERO,
            slept_ns: 0,
            last_failure: None,
        }
    }

    /// Starts the operation: attempt 1 starts at `now`.
    ///
    /// # Errors
    /// [`RetryError::AlreadyStarted`] or [`RetryError::Finished`]; nothing changes.
    pub fn handle_start(&mut self, policy: &RetryPolicy, now: Instant) -> Result<(), RetryError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Running { .. } | Phase::Sleeping { .. } => return Err(RetryError::AlreadyStarted),
        }
        self.first_start = now;
        self.last_now = now;
        self.begin_attempt(policy, now);
        Ok(())
    }

    /// Attempt `attempt` succeeded: the operation finishes with [`Outcome::Succeeded`] and the
    /// failure streak returns to zero (R4).
    ///
    /// # Errors
    /// When `attempt` is not the running attempt; nothing changes.
    #[inline]
    pub fn handle_success(&mut self, now: Instant, attempt: u32) -> Result<(), RetryError> {
        self.check_running(attempt)?;
        self.last_now = self.last_now.later(now);
        self.backoff.reset();
        self.last_failure = None;
        self.finish(OutcomeKind::Succeeded);
        Ok(())
    }

    /// Attempt `attempt` failed with `failure`: the machine schedules a retry
    /// ([`Action::Sleep`]) or finishes, by the failure's class, the limits, the hint and the
    /// total budget. Draws jitter from `rng` when the schedule needs it.
    ///
    /// # Errors
    /// When `attempt` is not the running attempt; nothing changes and the failure is handed back.
    #[inline]
    pub fn handle_failure<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        attempt: u32,
        failure: Failure<E>,
        rng: &mut R,
    ) -> Result<(), FailureRefused<E>> {
        if let Err(error) = self.check_running(attempt) {
            return Err(FailureRefused { error, failure });
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.pending = 0;
        self.decide(policy, now, failure.kind, Some(failure.error), rng);
        Ok(())
    }

    /// Wakes the machine: a sleep that has ended starts the next attempt; an attempt past its
    /// deadline is abandoned and counts as a [`Timeout`](crate::FailureClass::Timeout) failure. Early, repeated
    /// or spurious calls, and calls after the outcome, change nothing.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, policy: &RetryPolicy, now: Instant, rng: &mut R) {
        let now = self.last_now.later(now);
        match self.phase {
            Phase::Running { deadline } if deadline != Instant::MAX && deadline <= now => {
                self.last_now = now;
                self.pending = ABANDON;
                self.decide(policy, now, FailureKind::Timeout, None, rng);
            }
            Phase::Sleeping { until } if until <= now => {
                self.slept_ns =
                    self.slept_ns.saturating_add(saturating_nanos(now.saturating_duration_since(self.last_now)));
                self.last_now = now;
                self.attempt = self.attempt.saturating_add(1);
                self.begin_attempt(policy, now);
            }
            _ => {}
        }
    }

    /// The driver cancels the operation: it finishes with [`Outcome::Canceled`]; a running
    /// attempt is abandoned.
    ///
    /// # Errors
    /// [`RetryError::Finished`] after the outcome; nothing changes.
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), RetryError> {
        let abandon = match self.phase {
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Running { .. } => ABANDON,
            Phase::Idle | Phase::Sleeping { .. } => 0,
        };
        self.last_now = self.last_now.later(now);
        self.finish(OutcomeKind::Canceled);
        self.pending |= abandon;
        Ok(())
    }

    /// The driver refuses the scheduled retry (a retry budget or breaker said no, U4): the
    /// operation finishes with [`Outcome::Rejected`]. Call it on [`Action::Sleep`].
    ///
    /// # Errors
    /// [`RetryError::NothingToReject`] unless a retry is scheduled; nothing changes.
    pub fn handle_rejected(&mut self, now: Instant) -> Result<(), RetryError> {
        match self.phase {
            Phase::Sleeping { .. } => {}
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Idle => return Err(RetryError::NotStarted),
            Phase::Running { .. } => return Err(RetryError::NothingToReject),
        }
        self.last_now = self.last_now.later(now);
        self.finish(OutcomeKind::Rejected);
        Ok(())
    }

    /// The next action, in the documented drain order; `None` when there is nothing to do.
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action<E>> {
        let next = self.pending & self.pending.wrapping_neg();
        self.pending &= !next;
        match next {
            0 => None,
            ABANDON => Some(Action::Abandon { attempt: self.attempt }),
            SLEEP => match self.phase {
                Phase::Sleeping { until } => Some(Action::Sleep {
                    next_attempt: self.attempt.saturating_add(1),
                    delay: until.saturating_duration_since(self.last_now),
                    until,
                }),
                _ => None,
            },
            START => match self.phase {
                Phase::Running { deadline } => Some(Action::Start { attempt: self.attempt, deadline: some(deadline) }),
                _ => None,
            },
            _ => match self.phase {
                Phase::Finished(kind) => Some(Action::Finish { outcome: self.take_outcome(kind), stats: self.stats() }),
                _ => None,
            },
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the running attempt's
    /// deadline, or the end of the current sleep; `None` when nothing is timed. A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running { deadline } => some(deadline),
            Phase::Sleeping { until } => Some(until),
            Phase::Idle | Phase::Finished(_) => None,
        }
    }

    /// Where the operation is.
    pub fn status(&self) -> RetryStatus {
        match self.phase {
            Phase::Idle => RetryStatus::Idle,
            Phase::Running { deadline } => RetryStatus::Running { attempt: self.attempt, deadline: some(deadline) },
            Phase::Sleeping { until } => RetryStatus::Sleeping { next_attempt: self.attempt.saturating_add(1), until },
            Phase::Finished(kind) => RetryStatus::Finished(kind),
        }
    }

    /// The number of the latest attempt started (0 before the start).
    pub const fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Consecutive failures counted by the schedule; zero after a success (R4) and after a
    /// hinted delay with `restart_after_hint`.
    pub const fn streak(&self) -> u32 {
        self.backoff.failures()
    }

    /// The last failure, while the operation runs (taken by the [`Action::Finish`] it ends with).
    pub const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.last_failure.as_ref()
    }

    /// What the operation has taken so far.
    pub fn stats(&self) -> Stats {
        Stats {
            attempts: self.attempt,
            slept: Duration::from_nanos(self.slept_ns),
            elapsed: self.last_now.saturating_duration_since(self.first_start),
        }
    }

    fn check_running(&self, attempt: u32) -> Result<(), RetryError> {
        match self.phase {
            Phase::Running { .. } if attempt == self.attempt => Ok(()),
            Phase::Running { .. } => Err(RetryError::StaleAttempt { running: self.attempt, got: attempt }),
            Phase::Sleeping { .. } => Err(RetryError::NoAttemptRunning),
            Phase::Idle => Err(RetryError::NotStarted),
            Phase::Finished(kind) => Err(RetryError::Finished(kind)),
        }
    }

    fn begin_attempt(&mut self, policy: &RetryPolicy, now: Instant) {
        if self.attempt == 0 {
            self.attempt = 1;
        }
        let deadline = now.saturating_add_nanos(policy.attempt_timeout_ns);
        self.phase = Phase::Running { deadline };
        self.pending = START;
    }

    fn finish(&mut self, kind: OutcomeKind) {
        self.phase = Phase::Finished(kind);
        self.pending = FINISH;
    }

    /// Decides after a failure; `self.pending` may already hold `ABANDON`.
    #[inline]
    fn decide<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        rng: &mut R,
    ) {
        let class = kind.class();
        self.last_failure = Some(LastFailure { class, error });
        let abandon = self.pending & ABANDON;
        let verdict = match kind {
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => Err(OutcomeKind::Fatal),
            FailureKind::Canceled => Err(OutcomeKind::Canceled),
            _ if self.attempt >= policy.max_attempts => Err(OutcomeKind::Exhausted),
            _ => self.schedule(policy, now, kind, rng),
        };
        match verdict {
            Ok(until) => {
                self.phase = Phase::Sleeping { until };
                self.pending = abandon | SLEEP;
            }
            Err(outcome) => {
                self.finish(outcome);
                self.pending |= abandon;
            }
        }
    }

    /// When the next attempt starts, or why there is none.
    #[inline]
    fn schedule<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        rng: &mut R,
    ) -> Result<Instant, OutcomeKind> {
        let budget_end = self.first_start.saturating_add_nanos(policy.total_ns);
        if now > budget_end {
            return Err(OutcomeKind::OutOfTime);
        }
        let hinted_ns = match kind {
            FailureKind::Hinted(Hint::After(delay)) => Some(saturating_nanos(delay)),
            FailureKind::Hinted(Hint::At(at)) => Some(saturating_nanos(at.saturating_duration_since(now))),
            _ => None,
        };
        match hinted_ns {
            Some(hinted) => {
                let delay = hinted.min(policy.max_hint_ns);
                if policy.restart_after_hint {
                    self.backoff.reset();
                } else {
                    self.backoff.record_external(delay);
                }
                Ok(now.saturating_add_nanos(delay).earlier(budget_end))
            }
            None => {
                let delay = self.backoff.next_delay_ns(&policy.backoff, rng);
                let until = now.saturating_add_nanos(delay);
                if until > budget_end { Err(OutcomeKind::OutOfTime) } else { Ok(until) }
            }
        }
    }

    fn take_outcome(&mut self, kind: OutcomeKind) -> Outcome<E> {
        let last = self.last_failure.take();
        match (kind, last) {
            (OutcomeKind::Succeeded, _) => Outcome::Succeeded,
            (OutcomeKind::Canceled, last_failure) => Outcome::Canceled { last_failure },
            (kind, Some(last_failure)) => match kind {
                OutcomeKind::Exhausted => Outcome::Exhausted { last_failure },
                OutcomeKind::Fatal => Outcome::Fatal { failure: last_failure },
                OutcomeKind::OutOfTime => Outcome::OutOfTime { last_failure },
                _ => Outcome::Rejected { last_failure },
            },
            // Every other outcome is decided right after a failure was stored.
            (_, None) => Outcome::Canceled { last_failure: None },
        }
    }
}

const fn some(deadline: Instant) -> Option<Instant> {
    if deadline.as_nanos() == u64::MAX { None } else { Some(deadline) }
}
