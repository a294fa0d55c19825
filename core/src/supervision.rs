//! Restart policies for long-running tasks: the supervision machine (rules S1–S6).
//!
//! A [`SupervisionPolicy`] says when a task restarts (after a failure, after a success, never),
//! how long it waits in between, and for how long an attempt may run. It is resolved once from
//! a per-task [`SupervisionPolicyBuilder`] and the supervisor-wide [`TaskDefaults`]; each
//! inheritable setting is a [`Setting`]: inherit the default, switch it [`Off`](Setting::Off),
//! or [`Set`](Setting::Set) it. A [`Supervision`] is one task's state, driven like every machine
//! of the crate: `handle_*` in, [`SupervisionAction`]s out. Its attempts run on the attempt
//! engine it shares with [`Retry`](crate::Retry); what is its own is the restart mode, the
//! spacing of starts and the abandoning of a timed-out attempt.

use core::time::Duration;

use rand_core::Rng;

use crate::attempt::{Attempts, Due, Ends, Misuse, Output, Phase};
use crate::backoff::{Backoff, Jitter};
use crate::decision::{DEFAULT_MAX_HINT, Decision, FailureRules};
use crate::error::Refused;
use crate::failure::{Failure, FailureClass, FailureKind, LastFailure};
use crate::time::saturating_nanos;
use crate::{Instant, PolicyError};

/// One inheritable setting of a task (S1): take the default, switch it off, or set it.
///
/// An explicit [`Off`](Setting::Off) wins over a default just as [`Set`](Setting::Set) does:
/// a task can switch off an attempt timeout or a retry limit that its supervisor's
/// [`TaskDefaults`] set for every task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Setting<T> {
    /// Use the value of [`TaskDefaults`].
    #[default]
    Inherit,
    /// None at all, whatever the default says (no timeout, no limit, no delay, no restart).
    Off,
    /// This value, whatever the default says.
    Set(T),
}

impl<T> Setting<T> {
    /// The effective value given the default (`None` for "off").
    pub fn resolve(self, default: Option<T>) -> Option<T> {
        match self {
            Setting::Inherit => default,
            Setting::Off => None,
            Setting::Set(value) => Some(value),
        }
    }
}

/// When a task runs again (S1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Restart {
    /// Run once: stop after a success and after a failure.
    Once,
    /// Stop after a success; retry a retryable failure with backoff.
    Restartable,
    /// Repeat `interval` after each success ends (fixed delay, S5); retry a retryable failure
    /// with backoff. Only a failure that is not retried, or a cancel, ends it.
    Periodic {
        /// The pause from a successful attempt's end to the next attempt's start; zero is
        /// allowed (`min_spacing` still separates the starts).
        interval: Duration,
    },
}

/// The supervisor-wide defaults every task inherits (S1, S2).
///
/// [`TaskDefaults::new`] (also `Default`) is S2: restart on failure, exponential backoff from
/// 200 ms, ×2, capped at 30 s, equal jitter, no attempt timeout, unlimited retries, and attempt
/// starts at least 1 ms apart; hints honoured up to [`DEFAULT_MAX_HINT`] (B6).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TaskDefaults {
    /// When tasks restart.
    pub restart: Restart,
    /// The delays after consecutive failures.
    pub backoff: Backoff,
    /// Each attempt's deadline is its start plus this; `None` for none.
    pub attempt_timeout: Option<Duration>,
    /// Retries after the first failure of a streak; `None` for unlimited. Zero is refused when
    /// a policy inherits it ([`PolicyError::Zero`]).
    pub max_retries: Option<u32>,
    /// The least time between two attempt starts of one task.
    pub min_spacing: Duration,
    /// The longest delay a hint may ask for; a longer one finishes the task
    /// [`Deferred`](TaskOutcome::Deferred) (B6). [`Duration::MAX`] honours any hint.
    #[cfg_attr(feature = "serde", serde(default = "crate::decision::default_max_hint"))]
    pub max_hint: Duration,
    /// Whether the backoff starts over from its first delay after a hinted delay (B6).
    #[cfg_attr(feature = "serde", serde(default))]
    pub restart_after_hint: bool,
}

impl TaskDefaults {
    /// The defaults of S2.
    pub fn new() -> Self {
        TaskDefaults {
            restart: Restart::Restartable,
            backoff: Backoff::exponential_unchecked(200_000_000, 2.0, 30_000_000_000, Jitter::Equal),
            attempt_timeout: None,
            max_retries: None,
            min_spacing: Duration::from_millis(1),
            max_hint: DEFAULT_MAX_HINT,
            restart_after_hint: false,
        }
    }
}

impl Default for TaskDefaults {
    fn default() -> Self {
        TaskDefaults::new()
    }
}

/// A task's own settings before they are resolved against [`TaskDefaults`].
///
/// Start from [`SupervisionPolicy::once`], [`restartable`](SupervisionPolicy::restartable),
/// [`periodic`](SupervisionPolicy::periodic) or [`from_defaults`](SupervisionPolicy::from_defaults)
/// (or the same constructors on this builder); every other setting inherits until set. The
/// drivers' `TaskSpec` is this type.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct SupervisionPolicyBuilder {
    /// When the task restarts; [`Setting::Off`] means [`Restart::Once`].
    pub restart: Setting<Restart>,
    /// The delays after consecutive failures; [`Setting::Off`] restarts without delay (the
    /// starts are still `min_spacing` apart).
    pub backoff: Setting<Backoff>,
    /// The per-attempt timeout; [`Setting::Off`] for none.
    pub attempt_timeout: Setting<Duration>,
    /// Retries after the first failure of a streak (S3); [`Setting::Off`] for unlimited.
    pub max_retries: Setting<u32>,
    /// The least time between two attempt starts; [`Setting::Off`] for zero.
    pub min_spacing: Setting<Duration>,
    /// The longest delay a hint may ask for (B6); [`Setting::Off`] honours any hint.
    #[cfg_attr(feature = "serde", serde(default))]
    pub max_hint: Setting<Duration>,
    /// Whether the backoff starts over after a hinted delay (B6); [`Setting::Off`] for no.
    #[cfg_attr(feature = "serde", serde(default))]
    pub restart_after_hint: Setting<bool>,
}

impl SupervisionPolicyBuilder {
    const fn with_restart(restart: Setting<Restart>) -> Self {
        SupervisionPolicyBuilder {
            restart,
            backoff: Setting::Inherit,
            attempt_timeout: Setting::Inherit,
            max_retries: Setting::Inherit,
            min_spacing: Setting::Inherit,
            max_hint: Setting::Inherit,
            restart_after_hint: Setting::Inherit,
        }
    }

    /// Run once: stop after a success and after a failure (as [`SupervisionPolicy::once`]).
    pub const fn once() -> Self {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Once))
    }

    /// Stop after a success; retry a retryable failure (as [`SupervisionPolicy::restartable`]).
    pub const fn restartable() -> Self {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Restartable))
    }

    /// Repeat `interval` after each successful attempt ends (as [`SupervisionPolicy::periodic`]).
    pub const fn periodic(interval: Duration) -> Self {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Periodic { interval }))
    }

    /// Inherit everything from [`TaskDefaults`] (as [`SupervisionPolicy::from_defaults`]).
    pub const fn from_defaults() -> Self {
        SupervisionPolicyBuilder::with_restart(Setting::Inherit)
    }

    /// Sets the restart mode.
    pub const fn restart(mut self, restart: Restart) -> Self {
        self.restart = Setting::Set(restart);
        self
    }

    /// Sets the backoff.
    pub const fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Setting::Set(backoff);
        self
    }

    /// Restarts after a failure without delay (only `min_spacing` apart).
    pub const fn no_backoff(mut self) -> Self {
        self.backoff = Setting::Off;
        self
    }

    /// Sets a per-attempt timeout.
    pub const fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Setting::Set(timeout);
        self
    }

    /// Switches off any inherited attempt timeout.
    pub const fn no_attempt_timeout(mut self) -> Self {
        self.attempt_timeout = Setting::Off;
        self
    }

    /// At most `n` retries after the first failure of a streak: 3 allows 4 failed attempts in a
    /// row (S3). Zero is refused by [`build`](Self::build); use [`SupervisionPolicy::once`].
    pub const fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Setting::Set(n);
        self
    }

    /// Switches off any inherited retry limit.
    pub const fn unlimited_retries(mut self) -> Self {
        self.max_retries = Setting::Off;
        self
    }

    /// Sets the least time between two attempt starts (zero allowed).
    pub const fn min_spacing(mut self, spacing: Duration) -> Self {
        self.min_spacing = Setting::Set(spacing);
        self
    }

    /// Sets the longest delay a hint may ask for; a longer one finishes the task
    /// [`Deferred`](TaskOutcome::Deferred) (B6). [`Duration::MAX`] honours any hint.
    pub const fn max_hint(mut self, max_hint: Duration) -> Self {
        self.max_hint = Setting::Set(max_hint);
        self
    }

    /// Whether the backoff starts over from its first delay after a hinted delay (B6).
    pub const fn restart_after_hint(mut self, restart: bool) -> Self {
        self.restart_after_hint = Setting::Set(restart);
        self
    }

    /// Resolves the settings against `defaults` (explicit settings win) and validates them.
    ///
    /// # Errors
    /// [`PolicyError::Zero`] when the effective `max_retries`, `attempt_timeout` or `max_hint`
    /// is zero. Durations beyond `u64::MAX` nanoseconds saturate (an interval of
    /// [`Duration::MAX`] never comes round).
    pub fn build(self, defaults: &TaskDefaults) -> Result<SupervisionPolicy, PolicyError> {
        let restart = self.restart.resolve(Some(defaults.restart)).unwrap_or(Restart::Once);
        let backoff = match self.backoff.resolve(Some(defaults.backoff)) {
            Some(backoff) => backoff,
            None => Backoff::constant(Duration::ZERO).build()?,
        };
        let max_retries = self.max_retries.resolve(defaults.max_retries);
        if max_retries == Some(0) {
            return Err(PolicyError::Zero {
                setting: "max_retries",
                why: "it counts retries after the first failure; use SupervisionPolicy::once() for no retries",
            });
        }
        let attempt_timeout_ns = match self.attempt_timeout.resolve(defaults.attempt_timeout) {
            Some(d) if d.is_zero() => {
                return Err(PolicyError::Zero {
                    setting: "attempt_timeout",
                    why: "every attempt would time out at once; switch it off with no_attempt_timeout()",
                });
            }
            Some(d) => saturating_nanos(d),
            None => u64::MAX,
        };
        let min_spacing_ns = self.min_spacing.resolve(Some(defaults.min_spacing)).map_or(0, saturating_nanos);
        let retries_allowed = match restart {
            Restart::Once => 0,
            _ => max_retries.map_or(u64::MAX, u64::from),
        };
        let max_hint = self.max_hint.resolve(Some(defaults.max_hint)).unwrap_or(Duration::MAX);
        let restart_after_hint = self.restart_after_hint.resolve(Some(defaults.restart_after_hint)).unwrap_or(false);
        Ok(SupervisionPolicy {
            restart,
            rules: FailureRules::build(backoff, retries_allowed, max_hint, restart_after_hint)?,
            attempt_timeout_ns,
            max_retries,
            min_spacing_ns,
        })
    }
}

/// A task's resolved restart policy (S1–S3, S5). Immutable; share one among any number of tasks.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Restart, SupervisionPolicy, TaskDefaults};
///
/// let defaults = TaskDefaults { attempt_timeout: Some(Duration::from_secs(5)), ..TaskDefaults::new() };
/// let policy = SupervisionPolicy::periodic(Duration::from_secs(60))
///     .no_attempt_timeout() // explicit "none" wins over the inherited 5 s
///     .max_retries(3)
///     .build(&defaults)?;
/// assert_eq!(policy.restart(), Restart::Periodic { interval: Duration::from_secs(60) });
/// assert_eq!(policy.attempt_timeout(), None);
/// assert_eq!(policy.max_retries(), Some(3));
/// assert_eq!(policy.min_spacing(), Duration::from_millis(1));
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "SupervisionPolicyBuilder", into = "SupervisionPolicyBuilder")
)]
pub struct SupervisionPolicy {
    restart: Restart,
    /// The backoff, the hint rule, and how many failures of a streak are retried (0 for
    /// `once`, `max_retries`, or all), so the decision is one compare.
    rules: FailureRules,
    /// `u64::MAX` for none.
    attempt_timeout_ns: u64,
    max_retries: Option<u32>,
    min_spacing_ns: u64,
}

impl SupervisionPolicy {
    /// Run once: stop after a success and after a failure.
    pub const fn once() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::once()
    }

    /// Stop after a success; retry a retryable failure.
    pub const fn restartable() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::restartable()
    }

    /// Repeat `interval` after each successful attempt ends; retry a retryable failure.
    pub const fn periodic(interval: Duration) -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::periodic(interval)
    }

    /// Inherit everything, the restart mode included, from [`TaskDefaults`].
    pub const fn from_defaults() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::from_defaults()
    }

    /// When the task restarts.
    pub const fn restart(&self) -> Restart {
        self.restart
    }

    /// The backoff after consecutive failures.
    pub const fn backoff(&self) -> &Backoff {
        &self.rules.backoff
    }

    /// The per-attempt timeout.
    pub const fn attempt_timeout(&self) -> Option<Duration> {
        if self.attempt_timeout_ns == u64::MAX { None } else { Some(Duration::from_nanos(self.attempt_timeout_ns)) }
    }

    /// The retry limit after the first failure of a streak; `None` for unlimited.
    pub const fn max_retries(&self) -> Option<u32> {
        self.max_retries
    }

    /// The least time between two attempt starts.
    pub const fn min_spacing(&self) -> Duration {
        Duration::from_nanos(self.min_spacing_ns)
    }

    /// The longest hinted delay honoured ([`Duration::MAX`]: any).
    pub fn max_hint(&self) -> Duration {
        self.rules.max_hint()
    }

    /// Whether the backoff starts over after a hinted delay.
    pub const fn restarts_after_hint(&self) -> bool {
        self.rules.restart_after_hint
    }
}

/// A policy deserializes through its builder; settings left as [`Setting::Inherit`] resolve
/// against [`TaskDefaults::new`] (S2). A serialized policy has no `Inherit` left.
impl TryFrom<SupervisionPolicyBuilder> for SupervisionPolicy {
    type Error = PolicyError;

    fn try_from(builder: SupervisionPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build(&TaskDefaults::new())
    }
}

impl From<SupervisionPolicy> for SupervisionPolicyBuilder {
    fn from(policy: SupervisionPolicy) -> Self {
        let explicit = |value: Option<Duration>| value.map_or(Setting::Off, Setting::Set);
        SupervisionPolicyBuilder {
            restart: Setting::Set(policy.restart),
            backoff: Setting::Set(policy.rules.backoff),
            attempt_timeout: explicit(policy.attempt_timeout()),
            max_retries: policy.max_retries.map_or(Setting::Off, Setting::Set),
            min_spacing: Setting::Set(policy.min_spacing()),
            max_hint: Setting::Set(policy.max_hint()),
            restart_after_hint: Setting::Set(policy.rules.restart_after_hint),
        }
    }
}

/// How a supervised task ended (S4): exactly one of these, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TaskOutcome<E> {
    /// An attempt succeeded and the policy does not repeat it (`once`, `restartable`), or a
    /// periodic task has no attempt number left for a repeat (after `u64::MAX` attempts).
    Completed,
    /// A retryable failure reported by the task was not retried (`once`, or the retry limit).
    Failed {
        /// That failure.
        last_failure: LastFailure<E>,
    },
    /// A [`Fatal`](FailureKind::Fatal) or [`DoNotRetry`](crate::Hint::DoNotRetry) failure.
    Fatal {
        /// That failure.
        failure: LastFailure<E>,
    },
    /// The task reported [`Canceled`](FailureKind::Canceled), or the driver canceled it.
    Canceled {
        /// The failure that canceled it, or the last failure before the driver canceled it.
        last_failure: Option<LastFailure<E>>,
    },
    /// Dropping a timed-out attempt panicked; never retried.
    Panicked {
        /// The caller's description of the panic.
        error: E,
    },
    /// An attempt ran past the configured attempt timeout and was not retried (`once`, or the
    /// retry limit).
    TimedOut,
    /// The last failure's hint asked for a retry at `retry_at`, later than `max_hint` allows
    /// (B6): the hint is never shortened, so the task ends now and may be started again then.
    Deferred {
        /// When the other side asked to be tried again.
        retry_at: Instant,
        /// The failure that carried the hint.
        last_failure: LastFailure<E>,
    },
}

impl<E> TaskOutcome<E> {
    /// The outcome without its payload.
    pub const fn kind(&self) -> TaskOutcomeKind {
        match self {
            TaskOutcome::Completed => TaskOutcomeKind::Completed,
            TaskOutcome::Failed { .. } => TaskOutcomeKind::Failed,
            TaskOutcome::Fatal { .. } => TaskOutcomeKind::Fatal,
            TaskOutcome::Canceled { .. } => TaskOutcomeKind::Canceled,
            TaskOutcome::Panicked { .. } => TaskOutcomeKind::Panicked,
            TaskOutcome::TimedOut => TaskOutcomeKind::TimedOut,
            TaskOutcome::Deferred { .. } => TaskOutcomeKind::Deferred,
        }
    }
}

/// [`TaskOutcome`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum TaskOutcomeKind {
    /// See [`TaskOutcome::Completed`].
    Completed,
    /// See [`TaskOutcome::Failed`].
    Failed,
    /// See [`TaskOutcome::Fatal`].
    Fatal,
    /// See [`TaskOutcome::Canceled`].
    Canceled,
    /// See [`TaskOutcome::Panicked`].
    Panicked,
    /// See [`TaskOutcome::TimedOut`].
    TimedOut,
    /// See [`TaskOutcome::Deferred`].
    Deferred,
}

impl TaskOutcomeKind {
    /// Whether an outcome of this kind reports its failure.
    const fn has_failure(self) -> bool {
        matches!(
            self,
            TaskOutcomeKind::Failed | TaskOutcomeKind::Fatal | TaskOutcomeKind::Panicked | TaskOutcomeKind::Deferred
        )
    }
}

/// What the driver of a supervised task must do, and what happened (S6); drained with
/// [`Supervision::poll_action`].
///
/// Per attempt, in order: [`AttemptStarting`](Self::AttemptStarting), then exactly one of
/// [`AttemptSucceeded`](Self::AttemptSucceeded), [`AttemptFailed`](Self::AttemptFailed),
/// [`AttemptTimedOut`](Self::AttemptTimedOut), [`AttemptCanceled`](Self::AttemptCanceled), then
/// [`BackoffScheduled`](Self::BackoffScheduled) if another attempt follows. One
/// [`TaskFinished`](Self::TaskFinished) ends the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SupervisionAction<E> {
    /// Start attempt `attempt` now.
    AttemptStarting {
        /// The attempt number, from 1.
        attempt: u64,
        /// When the machine will time it out (on [`Supervision::handle_timeout`]).
        deadline: Option<Instant>,
    },
    /// The attempt succeeded.
    AttemptSucceeded {
        /// Its number.
        attempt: u64,
    },
    /// The task reported a failure (a timeout it returned itself included, S4).
    AttemptFailed {
        /// Its number.
        attempt: u64,
        /// The failure's class.
        class: FailureClass,
    },
    /// The attempt passed its configured timeout: drop it, then call
    /// [`Supervision::handle_abandoned`].
    AttemptTimedOut {
        /// Its number.
        attempt: u64,
    },
    /// The attempt was canceled (by the task, or by the driver while it ran).
    AttemptCanceled {
        /// Its number.
        attempt: u64,
    },
    /// Another attempt follows after `delay` (a backoff after a failure, or the interval of a
    /// periodic task after a success, each at least `min_spacing` after the last start): wait
    /// until `until`, then call [`Supervision::handle_timeout`].
    BackoffScheduled {
        /// The attempt that starts next.
        next_attempt: u64,
        /// The wait.
        delay: Duration,
        /// When it ends.
        until: Instant,
    },
    /// The task is over. Emitted exactly once.
    TaskFinished {
        /// How it ended.
        outcome: TaskOutcome<E>,
        /// Attempts started.
        attempts: u64,
    },
}

/// Where a task is; see [`Supervision::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SupervisionStatus {
    /// Not started.
    Idle,
    /// An attempt runs.
    Running {
        /// Its number.
        attempt: u64,
        /// Its deadline.
        deadline: Option<Instant>,
    },
    /// The running attempt timed out; the machine waits for [`Supervision::handle_abandoned`].
    Abandoning {
        /// Its number.
        attempt: u64,
    },
    /// Waiting before the next attempt.
    Waiting {
        /// The attempt that starts next.
        next_attempt: u64,
        /// When it starts.
        until: Instant,
    },
    /// Over.
    Finished(TaskOutcomeKind),
}

/// A caller mistake; the task's state is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisionError {
    /// `handle_start` on a task that already started.
    #[error("the task has already started; create a new `Supervision` for a new task")]
    AlreadyStarted,
    /// An input that needs a started task, before `handle_start`.
    #[error("the task has not started; call `handle_start` first")]
    NotStarted,
    /// A result while no attempt runs (the task waits, or its attempt timed out).
    #[error(
        "no attempt is running; results belong to `SupervisionAction::AttemptStarting` attempts that have not timed out"
    )]
    NoAttemptRunning,
    /// A result for an attempt other than the current one.
    #[error("input for attempt {got}, but attempt {current} is the current one")]
    StaleAttempt {
        /// The current attempt.
        current: u64,
        /// The attempt named by the input.
        got: u64,
    },
    /// `handle_abandoned` while no timed-out attempt waits to be dropped.
    #[error(
        "no timed-out attempt is waiting to be dropped; call `handle_abandoned` after `SupervisionAction::AttemptTimedOut`"
    )]
    NothingAbandoned,
    /// Any input after the outcome.
    #[error("the task has finished ({0:?}); its outcome was final")]
    Finished(TaskOutcomeKind),
    /// An input while actions of an earlier one wait to be drained (the drain rule).
    #[error("actions of an earlier input wait to be drained; call `poll_action` until it returns `None` first")]
    Undrained,
}

impl From<Misuse<TaskOutcomeKind>> for SupervisionError {
    fn from(misuse: Misuse<TaskOutcomeKind>) -> Self {
        match misuse {
            Misuse::AlreadyStarted => SupervisionError::AlreadyStarted,
            Misuse::NotStarted => SupervisionError::NotStarted,
            Misuse::NoAttemptRunning => SupervisionError::NoAttemptRunning,
            Misuse::Stale { current, got } => SupervisionError::StaleAttempt { current, got },
            Misuse::Finished(kind) => SupervisionError::Finished(kind),
            Misuse::Undrained => SupervisionError::Undrained,
        }
    }
}

/// How the current attempt ended, for its [`SupervisionAction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Ended {
    Succeeded,
    Failed(FailureClass),
    TimedOut,
    Canceled,
}

/// One supervised task's state (rules S1–S6).
///
/// # Driving it
///
/// Call [`handle_start`](Self::handle_start); then, after every `handle_*` call, drain
/// [`poll_action`](Self::poll_action) until it returns `None` and act on each
/// [`SupervisionAction`]: run the attempt of
/// [`AttemptStarting`](SupervisionAction::AttemptStarting) and report it with
/// [`handle_success`](Self::handle_success) or [`handle_failure`](Self::handle_failure); drop
/// the attempt of [`AttemptTimedOut`](SupervisionAction::AttemptTimedOut) and report the drop
/// with [`handle_abandoned`](Self::handle_abandoned); wait until
/// [`poll_timeout`](Self::poll_timeout) and call [`handle_timeout`](Self::handle_timeout).
///
/// **Drain order.** At most one of each, in this order: the attempt's end
/// (`AttemptSucceeded`, `AttemptFailed`, `AttemptTimedOut` or `AttemptCanceled`),
/// `BackoffScheduled`, `AttemptStarting`, `TaskFinished` (exactly once per task). Every action
/// of an input is reported; an input that arrives before they are drained is refused with
/// [`SupervisionError::Undrained`] (and `handle_timeout` does nothing), so none is ever dropped
/// unseen.
///
/// **Counting (S3).** `max_retries(n)` allows `n` retries after the first failure of a streak
/// of consecutive failures, so `n + 1` failed attempts in a row; a success ends the streak.
/// Successful repeats of a periodic task are never limited.
///
/// **Timing (S5).** The first attempt starts at `handle_start`. Every later start is at least
/// `min_spacing` after the previous start, whatever the backoff or interval says; a periodic
/// task's interval runs from the end of its successful attempt.
///
/// **Hints (B6).** A hinted delay is never shortened (spacing can only lengthen it); one past
/// `max_hint` finishes the task [`Deferred`](TaskOutcome::Deferred) with the hinted instant.
///
/// **Time.** A `now` earlier than the latest accepted one is read as that latest one.
/// `handle_timeout` early, or twice, changes nothing. **Misuse** returns an error and leaves the
/// state exactly as it was.
///
/// **Another policy.** A task is plain data and may be driven under another policy than the
/// one it started under (persisted, then loaded): a running attempt's deadline and a wait
/// already scheduled are kept; the new restart mode and limit apply when the wait ends (a task
/// waiting to repeat under a policy that does not repeat finishes `Completed`, one waiting to
/// retry past the new limit finishes `Failed`), and the new backoff, spacing and hint rule
/// from the next attempt's end.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Failure, Instant, Supervision, SupervisionAction, SupervisionPolicy, TaskDefaults, TaskOutcome};
/// use rand_core::SeedableRng;
///
/// let policy = SupervisionPolicy::restartable().max_retries(1).build(&TaskDefaults::new())?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut task = Supervision::<&str>::new();
/// task.handle_start(&policy, Instant::ZERO)?;
/// assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptStarting { attempt: 1, deadline: None }));
/// task.handle_failure(&policy, Instant::from_millis(5), 1, Failure::retryable("io"), &mut rng).unwrap();
/// assert!(matches!(task.poll_action(), Some(SupervisionAction::AttemptFailed { attempt: 1, .. })));
/// let Some(SupervisionAction::BackoffScheduled { until, .. }) = task.poll_action() else { unreachable!() };
/// task.handle_timeout(&policy, until); // 100..=200 ms later (equal jitter)
/// assert!(matches!(task.poll_action(), Some(SupervisionAction::AttemptStarting { attempt: 2, .. })));
/// task.handle_success(&policy, until, 2)?;
/// assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptSucceeded { attempt: 2 }));
/// assert_eq!(
///     task.poll_action(),
///     Some(SupervisionAction::TaskFinished { outcome: TaskOutcome::Completed, attempts: 2 })
/// );
/// assert_eq!(task.poll_action(), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Supervision<E> {
    engine: Attempts<E, TaskOutcomeKind>,
    last_start: Instant,
    ended: Ended,
}

impl<E> Default for Supervision<E> {
    fn default() -> Self {
        Supervision::new()
    }
}

impl<E> Supervision<E> {
    /// A task that has not started.
    pub const fn new() -> Self {
        Supervision { engine: Attempts::new(), last_start: Instant::ZERO, ended: Ended::Succeeded }
    }

    /// Starts the task: attempt 1 starts at `now` (S5: the first attempt is immediate).
    ///
    /// # Errors
    /// [`SupervisionError::AlreadyStarted`] or [`SupervisionError::Finished`]; nothing changes.
    pub fn handle_start(&mut self, policy: &SupervisionPolicy, now: Instant) -> Result<(), SupervisionError> {
        self.engine.check_idle()?;
        let now = self.engine.accept(now);
        self.begin(policy, now);
        Ok(())
    }

    /// Attempt `attempt` succeeded: the failure streak ends (S3); a periodic task waits its
    /// interval, any other finishes [`Completed`](TaskOutcome::Completed).
    ///
    /// # Errors
    /// When `attempt` is not the running attempt, or actions wait to be drained; nothing
    /// changes.
    #[inline]
    pub fn handle_success(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
    ) -> Result<(), SupervisionError> {
        self.engine.check_running(attempt)?;
        let now = self.engine.accept(now);
        self.engine.succeed();
        self.end(Ended::Succeeded);
        match policy.restart {
            Restart::Periodic { interval } => self.wait(policy, now, saturating_nanos(interval)),
            Restart::Once | Restart::Restartable => self.engine.finish(TaskOutcomeKind::Completed),
        }
        Ok(())
    }

    /// Attempt `attempt` failed (S4): [`Fatal`](FailureKind::Fatal) and
    /// [`DoNotRetry`](crate::Hint::DoNotRetry) finish `Fatal`,
    /// [`Canceled`](FailureKind::Canceled) finishes `Canceled`, and any other failure (a
    /// timeout the task returned itself included) is retried after the backoff (or the hinted
    /// delay) unless the policy is `once` or the retry limit is reached, which finishes
    /// `Failed`. Draws jitter from `rng`.
    ///
    /// # Errors
    /// When `attempt` is not the running attempt, or actions wait to be drained; nothing
    /// changes and the failure is handed back.
    #[inline(always)]
    pub fn handle_failure<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
        rng: &mut R,
    ) -> Result<(), Refused<SupervisionError, Failure<E>>> {
        if let Err(misuse) = self.engine.check_running(attempt) {
            return Err(Refused::new(misuse.into(), failure));
        }
        let now = self.engine.accept(now);
        self.end(match failure.kind {
            FailureKind::Canceled => Ended::Canceled,
            kind => Ended::Failed(kind.class()),
        });
        self.decide(policy, now, failure.kind, Some(failure.error), TaskOutcomeKind::Failed, rng);
        Ok(())
    }

    /// The driver dropped attempt `attempt` after
    /// [`SupervisionAction::AttemptTimedOut`]. A clean drop (`panic == None`) makes the
    /// timeout a retryable failure (S4): retried like any other, or the task finishes
    /// [`TimedOut`](TaskOutcome::TimedOut). A panic while dropping (`Some(error)`) finishes the
    /// task [`Panicked`](TaskOutcome::Panicked), never retried.
    ///
    /// # Errors
    /// When no timed-out attempt waits to be dropped, `attempt` is another one, or actions
    /// wait to be drained; nothing changes and the panic is handed back.
    pub fn handle_abandoned<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        panic: Option<E>,
        rng: &mut R,
    ) -> Result<(), Refused<SupervisionError, Option<E>>> {
        let refusal = match self.engine.phase() {
            Phase::Abandoning if attempt != self.engine.attempt() => {
                Some(SupervisionError::StaleAttempt { current: self.engine.attempt(), got: attempt })
            }
            Phase::Abandoning => self.engine.check_started().err().map(SupervisionError::from),
            Phase::Running | Phase::Waiting => Some(SupervisionError::NothingAbandoned),
            Phase::Idle | Phase::Finished(_) => self.engine.check_started().err().map(SupervisionError::from),
        };
        if let Some(error) = refusal {
            return Err(Refused::new(error, panic));
        }
        let now = self.engine.accept(now);
        match panic {
            Some(error) => {
                // The timed-out attempt failed, and its drop panicked: counted, never retried (S4).
                self.engine.record_failure(LastFailure { class: FailureClass::Panicked, error: Some(error) });
                self.engine.count_failure();
                self.engine.finish(TaskOutcomeKind::Panicked);
            }
            None => self.decide(policy, now, FailureKind::Timeout, None, TaskOutcomeKind::TimedOut, rng),
        }
        Ok(())
    }

    /// Wakes the machine: an attempt past its deadline times out
    /// ([`SupervisionAction::AttemptTimedOut`]); a wait that has ended starts the next attempt.
    /// Early, repeated or spurious calls, and calls while actions wait to be drained, change
    /// nothing.
    pub fn handle_timeout(&mut self, policy: &SupervisionPolicy, now: Instant) {
        let now = self.engine.last_now().later(now);
        match self.engine.due(now) {
            Due::Deadline => {
                self.engine.accept(now);
                self.engine.abandon();
                self.engine.record_failure(LastFailure { class: FailureClass::Timeout, error: None });
                self.end(Ended::TimedOut);
            }
            Due::WaitOver => {
                self.engine.accept(now);
                let repeats = matches!(policy.restart, Restart::Periodic { .. });
                if self.engine.streak() == 0 && !(repeats && self.engine.has_next_number()) {
                    // Waiting to repeat after a success, under a policy that does not repeat
                    // (a state made under another policy), or with no attempt number left for a
                    // repeat (past `u64::MAX` attempts): nothing failed, and the task is done.
                    self.engine.finish(TaskOutcomeKind::Completed);
                } else if self.engine.limit_reached(&policy.rules) {
                    // Waiting to retry past the limit of the policy it is driven under.
                    self.engine.finish(TaskOutcomeKind::Failed);
                } else {
                    self.begin(policy, now);
                }
            }
            Due::Nothing => {}
        }
    }

    /// The driver cancels the task (also one that has not started): a running attempt ends
    /// with [`AttemptCanceled`](SupervisionAction::AttemptCanceled), and the task finishes
    /// [`Canceled`](TaskOutcome::Canceled).
    ///
    /// # Errors
    /// [`SupervisionError::Finished`] after the outcome, [`SupervisionError::Undrained`]
    /// while actions wait to be drained; nothing changes.
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), SupervisionError> {
        if self.engine.cancel(now, TaskOutcomeKind::Canceled)? == Phase::Running {
            self.ended = Ended::Canceled;
        }
        Ok(())
    }

    /// The next action, in the documented drain order; `None` when there is nothing to do.
    #[inline]
    pub fn poll_action(&mut self) -> Option<SupervisionAction<E>> {
        Some(match self.engine.poll()? {
            Output::Ended { attempt } => match self.ended {
                Ended::Succeeded => SupervisionAction::AttemptSucceeded { attempt },
                Ended::Failed(class) => SupervisionAction::AttemptFailed { attempt, class },
                Ended::TimedOut => SupervisionAction::AttemptTimedOut { attempt },
                Ended::Canceled => SupervisionAction::AttemptCanceled { attempt },
            },
            Output::Wait { next_attempt, delay, until } => {
                SupervisionAction::BackoffScheduled { next_attempt, delay, until }
            }
            Output::Start { attempt, deadline } => SupervisionAction::AttemptStarting { attempt, deadline },
            Output::Finish(kind) => {
                SupervisionAction::TaskFinished { outcome: self.take_outcome(kind), attempts: self.engine.attempt() }
            }
        })
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the running attempt's
    /// deadline, or the end of the current wait; `None` when nothing is timed. A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    /// Where the task is.
    pub fn status(&self) -> SupervisionStatus {
        let attempt = self.engine.attempt();
        match self.engine.phase() {
            Phase::Idle => SupervisionStatus::Idle,
            Phase::Running => SupervisionStatus::Running { attempt, deadline: self.engine.deadline() },
            Phase::Abandoning => SupervisionStatus::Abandoning { attempt },
            Phase::Waiting => {
                SupervisionStatus::Waiting { next_attempt: attempt.saturating_add(1), until: self.engine.timer() }
            }
            Phase::Finished(kind) => SupervisionStatus::Finished(kind),
        }
    }

    /// The number of the latest attempt started (0 before the start).
    pub const fn attempt(&self) -> u64 {
        self.engine.attempt()
    }

    /// Consecutive failed attempts since the last success (S3): the streak, as
    /// [`Retry::streak`](crate::Retry::streak) and [`Flow::streak`](crate::Flow::streak) count it.
    pub const fn streak(&self) -> u32 {
        self.engine.streak()
    }

    /// The latest `now` the machine accepted.
    pub const fn now(&self) -> Instant {
        self.engine.last_now()
    }

    /// Whether actions wait to be drained.
    pub const fn has_actions(&self) -> bool {
        self.engine.has_actions()
    }

    /// The last failure since the last success (taken by the `TaskFinished` it ends with).
    pub const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.engine.last_failure()
    }

    fn begin(&mut self, policy: &SupervisionPolicy, now: Instant) {
        self.last_start = now;
        self.engine.begin(now, policy.attempt_timeout_ns);
    }

    /// The running attempt ended: its end is reported first.
    #[inline(always)]
    fn end(&mut self, ended: Ended) {
        self.ended = ended;
        self.engine.mark_ended();
    }

    /// Decides after a failure; a retryable failure that is not retried finishes the task
    /// `not_retried` (`Failed`, or `TimedOut` after the machine's own timeout).
    #[inline(always)]
    fn decide<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        not_retried: TaskOutcomeKind,
        rng: &mut R,
    ) {
        match self.engine.fail(&policy.rules, now, kind, error, rng) {
            Decision::Wait { delay_ns, .. } => self.wait(policy, now, delay_ns),
            Decision::Stop(stop) => self.engine.stop(
                stop,
                Ends {
                    fatal: TaskOutcomeKind::Fatal,
                    canceled: TaskOutcomeKind::Canceled,
                    limit: not_retried,
                    deferred: TaskOutcomeKind::Deferred,
                },
            ),
        }
    }

    /// Waits `delay_ns` from `now`, and at least `min_spacing` from the last start (S5).
    #[inline]
    fn wait(&mut self, policy: &SupervisionPolicy, now: Instant, delay_ns: u64) {
        let spaced = self.last_start.saturating_add_nanos(policy.min_spacing_ns);
        self.engine.wait(now.saturating_add_nanos(delay_ns).later(spaced));
    }

    fn take_outcome(&mut self, kind: TaskOutcomeKind) -> TaskOutcome<E> {
        let last = self.engine.take_last_failure();
        match (kind, last) {
            (TaskOutcomeKind::Completed, _) => TaskOutcome::Completed,
            (TaskOutcomeKind::TimedOut, _) => TaskOutcome::TimedOut,
            (TaskOutcomeKind::Canceled, last_failure) => TaskOutcome::Canceled { last_failure },
            (TaskOutcomeKind::Panicked, Some(LastFailure { error: Some(error), .. })) => {
                TaskOutcome::Panicked { error }
            }
            (TaskOutcomeKind::Fatal, Some(failure)) => TaskOutcome::Fatal { failure },
            (TaskOutcomeKind::Failed, Some(last_failure)) => TaskOutcome::Failed { last_failure },
            (TaskOutcomeKind::Deferred, Some(last_failure)) => {
                TaskOutcome::Deferred { retry_at: self.engine.timer(), last_failure }
            }
            // Every other outcome is decided right after its failure was stored (and a loaded
            // state is validated to have it), so this arm is never taken.
            (_, last_failure) => TaskOutcome::Canceled { last_failure },
        }
    }

    /// Whether a loaded state is one the transitions could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        self.engine.validate(TaskOutcomeKind::has_failure, TaskOutcomeKind::Canceled)?;
        if self.last_start > self.engine.last_now() {
            return Err("the last attempt started after the latest accepted instant");
        }
        if let (Phase::Finished(TaskOutcomeKind::Panicked), Some(LastFailure { error: None, .. })) =
            (self.engine.phase(), self.engine.last_failure())
        {
            return Err("a task that panicked has no panic to report");
        }
        if self.engine.ended_pending() {
            let streak = self.engine.streak();
            let fits = match (self.engine.phase(), self.ended) {
                (Phase::Abandoning, Ended::TimedOut) => true,
                (Phase::Waiting, Ended::Succeeded) => streak == 0,
                (Phase::Waiting, Ended::Failed(class)) => streak > 0 && class.is_retryable(),
                (Phase::Finished(TaskOutcomeKind::Completed), Ended::Succeeded) => true,
                (Phase::Finished(TaskOutcomeKind::Canceled), Ended::Canceled) => true,
                (
                    Phase::Finished(TaskOutcomeKind::Fatal | TaskOutcomeKind::Failed | TaskOutcomeKind::Deferred),
                    Ended::Failed(_),
                ) => true,
                _ => false,
            };
            if !fits {
                return Err("the attempt's end to report does not fit what followed it");
            }
        }
        Ok(())
    }
}

crate::serde_validated!(Supervision<E>, "a Supervision");
