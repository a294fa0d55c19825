//! Restart policies for long-running tasks: the supervision machine (rules S1–S6).
//!
//! A [`SupervisionPolicy`] says when a task restarts (after a failure, after a success, never),
//! how long it waits in between, and for how long an attempt may run. It is resolved once from
//! a per-task [`SupervisionPolicyBuilder`] and the supervisor-wide [`TaskDefaults`]; each
//! inheritable setting is a [`Setting`]: inherit the default, switch it [`Off`](Setting::Off),
//! or [`Set`](Setting::Set) it. A [`Supervision`] is one task's state, driven like every machine
//! of the crate: `handle_*` in, [`TaskEvent`]s out.

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState, Jitter};
use crate::failure::{Failure, FailureClass, FailureKind, Hint, LastFailure};
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
/// starts at least 1 ms apart.
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
/// [`periodic`](SupervisionPolicy::periodic) or [`from_defaults`](SupervisionPolicy::from_defaults);
/// every other setting inherits until set.
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
}

impl SupervisionPolicyBuilder {
    const fn with_restart(restart: Setting<Restart>) -> Self {
        SupervisionPolicyBuilder {
            restart,
            backoff: Setting::Inherit,
            attempt_timeout: Setting::Inherit,
            max_retries: Setting::Inherit,
            min_spacing: Setting::Inherit,
        }
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

    /// Resolves the settings against `defaults` (explicit settings win) and validates them.
    ///
    /// # Errors
    /// [`PolicyError::Zero`] when the effective `max_retries` or `attempt_timeout` is zero.
    /// Durations beyond `u64::MAX` nanoseconds saturate (an interval of [`Duration::MAX`] never
    /// comes round).
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
            _ => max_retries.unwrap_or(u32::MAX),
        };
        Ok(SupervisionPolicy { restart, backoff, attempt_timeout_ns, max_retries, min_spacing_ns, retries_allowed })
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
    backoff: Backoff,
    /// `u64::MAX` for none.
    attempt_timeout_ns: u64,
    max_retries: Option<u32>,
    min_spacing_ns: u64,
    /// Derived: how many failures of a streak are retried (0 for `once`, `max_retries`, or
    /// `u32::MAX` for unlimited), so the decision is one compare.
    retries_allowed: u32,
}

impl SupervisionPolicy {
    /// Run once: stop after a success and after a failure.
    pub const fn once() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Once))
    }

    /// Stop after a success; retry a retryable failure.
    pub const fn restartable() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Restartable))
    }

    /// Repeat `interval` after each successful attempt ends; retry a retryable failure.
    pub const fn periodic(interval: Duration) -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::with_restart(Setting::Set(Restart::Periodic { interval }))
    }

    /// Inherit everything, the restart mode included, from [`TaskDefaults`].
    pub const fn from_defaults() -> SupervisionPolicyBuilder {
        SupervisionPolicyBuilder::with_restart(Setting::Inherit)
    }

    /// When the task restarts.
    pub const fn restart(&self) -> Restart {
        self.restart
    }

    /// The backoff after consecutive failures.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
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
            backoff: Setting::Set(policy.backoff),
            attempt_timeout: explicit(policy.attempt_timeout()),
            max_retries: policy.max_retries.map_or(Setting::Off, Setting::Set),
            min_spacing: Setting::Set(policy.min_spacing()),
        }
    }
}

/// How a supervised task ended (S4): exactly one of these, once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TaskOutcome<E> {
    /// An attempt succeeded and the policy does not repeat it (`once`, `restartable`).
    Completed,
    /// A retryable failure reported by the task was not retried (`once`, or the retry limit).
    Failed {
        /// That failure.
        last_failure: LastFailure<E>,
    },
    /// A [`Fatal`](FailureKind::Fatal) or [`DoNotRetry`](Hint::DoNotRetry) failure.
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
        }
    }
}

/// [`TaskOutcome`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
}

/// A lifecycle event of a supervised task (S6), drained with [`Supervision::poll_action`].
///
/// Per attempt, in order: [`AttemptStarting`](Self::AttemptStarting), then exactly one of
/// [`AttemptSucceeded`](Self::AttemptSucceeded), [`AttemptFailed`](Self::AttemptFailed),
/// [`AttemptTimedOut`](Self::AttemptTimedOut), [`AttemptCanceled`](Self::AttemptCanceled), then
/// [`BackoffScheduled`](Self::BackoffScheduled) if another attempt follows. One
/// [`TaskFinished`](Self::TaskFinished) ends the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TaskEvent<E> {
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
pub enum TaskStatus {
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
    #[error("no attempt is running; results belong to `TaskEvent::AttemptStarting` attempts that have not timed out")]
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
        "no timed-out attempt is waiting to be dropped; call `handle_abandoned` after `TaskEvent::AttemptTimedOut`"
    )]
    NothingAbandoned,
    /// Any input after the outcome.
    #[error("the task has finished ({0:?}); its outcome was final")]
    Finished(TaskOutcomeKind),
}

/// A refused input: the reason, and the input's payload handed back unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct SupervisionRefused<T> {
    /// Why it was refused.
    pub error: SupervisionError,
    /// The payload, as given (a [`Failure`], or the panic of [`Supervision::handle_abandoned`]).
    pub input: T,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Phase {
    Idle,
    /// `deadline == Instant::MAX` means none.
    Running {
        deadline: Instant,
    },
    Abandoning,
    Waiting {
        until: Instant,
    },
    Finished(TaskOutcomeKind),
}

/// How the current attempt ended, for its [`TaskEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Ended {
    Succeeded,
    Failed(FailureClass),
    TimedOut,
    Canceled,
}

const ENDED: u8 = 1;
const BACKOFF: u8 = 2;
const STARTING: u8 = 4;
const FINISH: u8 = 8;

/// One supervised task's state (rules S1–S6).
///
/// # Driving it
///
/// Call [`handle_start`](Self::handle_start); then, after every `handle_*` call, drain
/// [`poll_action`](Self::poll_action) until it returns `None` and act on each [`TaskEvent`]:
/// run the attempt of [`AttemptStarting`](TaskEvent::AttemptStarting) and report it with
/// [`handle_success`](Self::handle_success) or [`handle_failure`](Self::handle_failure); drop the
/// attempt of [`AttemptTimedOut`](TaskEvent::AttemptTimedOut) and report the drop with
/// [`handle_abandoned`](Self::handle_abandoned); wait until [`poll_timeout`](Self::poll_timeout)
/// and call [`handle_timeout`](Self::handle_timeout).
///
/// **Drain order.** At most one of each, in this order: the attempt's end
/// (`AttemptSucceeded`, `AttemptFailed`, `AttemptTimedOut` or `AttemptCanceled`),
/// `BackoffScheduled`, `AttemptStarting`, `TaskFinished` (exactly once per task). A `handle_*`
/// call replaces events that were not drained before it.
///
/// **Counting (S3).** `max_retries(n)` allows `n` retries after the first failure of a streak
/// of consecutive failures, so `n + 1` failed attempts in a row; a success ends the streak.
/// Successful repeats of a periodic task are never limited.
///
/// **Timing (S5).** The first attempt starts at `handle_start`. Every later start is at least
/// `min_spacing` after the previous start, whatever the backoff or interval says; a periodic
/// task's interval runs from the end of its successful attempt.
///
/// **Time.** A `now` earlier than the latest accepted one is read as that latest one.
/// `handle_timeout` early, or twice, changes nothing. **Misuse** returns an error and leaves the
/// state exactly as it was.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Failure, Instant, SupervisionPolicy, Supervision, TaskDefaults, TaskEvent, TaskOutcome};
/// use rand_core::SeedableRng;
///
/// let policy = SupervisionPolicy::restartable().max_retries(1).build(&TaskDefaults::new())?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut task = Supervision::<&str>::new();
/// task.handle_start(&policy, Instant::ZERO)?;
/// assert_eq!(task.poll_action(), Some(TaskEvent::AttemptStarting { attempt: 1, deadline: None }));
/// task.handle_failure(&policy, Instant::from_millis(5), 1, Failure::retryable("io"), &mut rng).unwrap();
/// assert!(matches!(task.poll_action(), Some(TaskEvent::AttemptFailed { attempt: 1, .. })));
/// let Some(TaskEvent::BackoffScheduled { until, .. }) = task.poll_action() else { unreachable!() };
/// task.handle_timeout(&policy, until); // 100..=200 ms later (equal jitter)
/// assert!(matches!(task.poll_action(), Some(TaskEvent::AttemptStarting { attempt: 2, .. })));
/// task.handle_success(&policy, until, 2)?;
/// assert_eq!(task.poll_action(), Some(TaskEvent::AttemptSucceeded { attempt: 2 }));
/// assert_eq!(task.poll_action(), Some(TaskEvent::TaskFinished { outcome: TaskOutcome::Completed, attempts: 2 }));
/// assert_eq!(task.poll_action(), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Supervision<E> {
    phase: Phase,
    attempt: u64,
    failures: u32,
    pending: u8,
    ended: Ended,
    backoff: BackoffState,
    last_start: Instant,
    last_now: Instant,
    last_failure: Option<LastFailure<E>>,
}

impl<E> Default for Supervision<E> {
    fn default() -> Self {
        Supervision::new()
    }
}

impl<E> Supervision<E> {
    /// A task that has not started.
    pub const fn new() -> Self {
        Supervision {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            pending: 0,
            ended: Ended::Succeeded,
            backoff: BackoffState::new(),
            last_start: Instant::ZERO,
            last_now: Instant::ZERO,
            last_failure: None,
        }
    }

    /// Starts the task: attempt 1 starts at `now` (S5: the first attempt is immediate).
    ///
    /// # Errors
    /// [`SupervisionError::AlreadyStarted`] or [`SupervisionError::Finished`]; nothing changes.
    pub fn handle_start(&mut self, policy: &SupervisionPolicy, now: Instant) -> Result<(), SupervisionError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            _ => return Err(SupervisionError::AlreadyStarted),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.begin_attempt(policy, now);
        Ok(())
    }

    /// Attempt `attempt` succeeded: the failure streak ends (S3); a periodic task waits its
    /// interval, any other finishes [`Completed`](TaskOutcome::Completed).
    ///
    /// # Errors
    /// When `attempt` is not the running attempt; nothing changes.
    #[inline]
    pub fn handle_success(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
    ) -> Result<(), SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        self.failures = 0;
        self.backoff.reset();
        self.last_failure = None;
        self.ended = Ended::Succeeded;
        self.pending = ENDED;
        match policy.restart {
            Restart::Periodic { interval } => self.wait(policy, now, saturating_nanos(interval)),
            Restart::Once | Restart::Restartable => self.finish(TaskOutcomeKind::Completed),
        }
        Ok(())
    }

    /// Attempt `attempt` failed (S4): [`Fatal`](FailureKind::Fatal) and
    /// [`DoNotRetry`](Hint::DoNotRetry) finish `Fatal`, [`Canceled`](FailureKind::Canceled)
    /// finishes `Canceled`, and any other failure (a timeout the task returned itself included)
    /// is retried after the backoff (or the hinted delay) unless the policy is `once` or the
    /// retry limit is reached, which finishes `Failed`. Draws jitter from `rng`.
    ///
    /// # Errors
    /// When `attempt` is not the running attempt; nothing changes and the failure is handed back.
    #[inline(always)]
    pub fn handle_failure<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
        rng: &mut R,
    ) -> Result<(), SupervisionRefused<Failure<E>>> {
        if let Err(error) = self.check_running(attempt) {
            return Err(SupervisionRefused { error, input: failure });
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        let class = failure.kind.class();
        self.last_failure = Some(LastFailure { class, error: Some(failure.error) });
        self.pending = ENDED;
        match failure.kind {
            FailureKind::Canceled => {
                self.ended = Ended::Canceled;
                self.finish(TaskOutcomeKind::Canceled);
            }
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => {
                self.ended = Ended::Failed(class);
                self.finish(TaskOutcomeKind::Fatal);
            }
            kind => {
                self.ended = Ended::Failed(class);
                let hinted_ns = match kind {
                    FailureKind::Hinted(Hint::After(delay)) => Some(saturating_nanos(delay)),
                    FailureKind::Hinted(Hint::At(at)) => Some(saturating_nanos(at.saturating_duration_since(now))),
                    _ => None,
                };
                self.retry_or_finish(policy, now, hinted_ns, TaskOutcomeKind::Failed, rng);
            }
        }
        Ok(())
    }

    /// The driver dropped attempt `attempt` after [`TaskEvent::AttemptTimedOut`]. A clean drop
    /// (`panic == None`) makes the timeout a retryable failure (S4): retried like any other, or
    /// the task finishes [`TimedOut`](TaskOutcome::TimedOut). A panic while dropping
    /// (`Some(error)`) finishes the task [`Panicked`](TaskOutcome::Panicked), never retried.
    ///
    /// # Errors
    /// When no timed-out attempt waits to be dropped, or `attempt` is another one; nothing
    /// changes and the panic is handed back.
    pub fn handle_abandoned<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        panic: Option<E>,
        rng: &mut R,
    ) -> Result<(), SupervisionRefused<Option<E>>> {
        let refusal = match self.phase {
            Phase::Abandoning if attempt == self.attempt => None,
            Phase::Abandoning => Some(SupervisionError::StaleAttempt { current: self.attempt, got: attempt }),
            Phase::Idle => Some(SupervisionError::NotStarted),
            Phase::Finished(kind) => Some(SupervisionError::Finished(kind)),
            Phase::Running { .. } | Phase::Waiting { .. } => Some(SupervisionError::NothingAbandoned),
        };
        if let Some(error) = refusal {
            return Err(SupervisionRefused { error, input: panic });
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.pending = 0;
        match panic {
            Some(error) => {
                self.last_failure = Some(LastFailure { class: FailureClass::Panicked, error: Some(error) });
                self.finish(TaskOutcomeKind::Panicked);
            }
            None => self.retry_or_finish(policy, now, None, TaskOutcomeKind::TimedOut, rng),
        }
        Ok(())
    }

    /// Wakes the machine: an attempt past its deadline times out
    /// ([`TaskEvent::AttemptTimedOut`]); a wait that has ended starts the next attempt. Early,
    /// repeated or spurious calls change nothing.
    pub fn handle_timeout(&mut self, policy: &SupervisionPolicy, now: Instant) {
        let now = self.last_now.later(now);
        match self.phase {
            Phase::Running { deadline } if deadline != Instant::MAX && deadline <= now => {
                self.last_now = now;
                self.phase = Phase::Abandoning;
                self.last_failure = Some(LastFailure { class: FailureClass::Timeout, error: None });
                self.ended = Ended::TimedOut;
                self.pending = ENDED;
            }
            Phase::Waiting { until } if until <= now => {
                self.last_now = now;
                self.attempt = self.attempt.saturating_add(1);
                self.begin_attempt(policy, now);
            }
            _ => {}
        }
    }

    /// The driver cancels the task: a running attempt ends with
    /// [`AttemptCanceled`](TaskEvent::AttemptCanceled), and the task finishes
    /// [`Canceled`](TaskOutcome::Canceled).
    ///
    /// # Errors
    /// [`SupervisionError::Finished`] after the outcome; nothing changes.
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), SupervisionError> {
        let running = match self.phase {
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            Phase::Running { .. } => true,
            Phase::Idle | Phase::Abandoning | Phase::Waiting { .. } => false,
        };
        self.last_now = self.last_now.later(now);
        self.pending = 0;
        if running {
            self.ended = Ended::Canceled;
            self.pending = ENDED;
        }
        self.finish(TaskOutcomeKind::Canceled);
        Ok(())
    }

    /// The next event, in the documented drain order; `None` when there is nothing to do.
    #[inline]
    pub fn poll_action(&mut self) -> Option<TaskEvent<E>> {
        let next = self.pending & self.pending.wrapping_neg();
        self.pending &= !next;
        let attempt = self.attempt;
        match next {
            0 => None,
            ENDED => Some(match self.ended {
                Ended::Succeeded => TaskEvent::AttemptSucceeded { attempt },
                Ended::Failed(class) => TaskEvent::AttemptFailed { attempt, class },
                Ended::TimedOut => TaskEvent::AttemptTimedOut { attempt },
                Ended::Canceled => TaskEvent::AttemptCanceled { attempt },
            }),
            BACKOFF => match self.phase {
                Phase::Waiting { until } => Some(TaskEvent::BackoffScheduled {
                    next_attempt: attempt.saturating_add(1),
                    delay: until.saturating_duration_since(self.last_now),
                    until,
                }),
                _ => None,
            },
            STARTING => match self.phase {
                Phase::Running { deadline } => Some(TaskEvent::AttemptStarting { attempt, deadline: some(deadline) }),
                _ => None,
            },
            _ => match self.phase {
                Phase::Finished(kind) => {
                    Some(TaskEvent::TaskFinished { outcome: self.take_outcome(kind), attempts: self.attempt })
                }
                _ => None,
            },
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the running attempt's
    /// deadline, or the end of the current wait; `None` when nothing is timed. A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running { deadline } => some(deadline),
            Phase::Waiting { until } => Some(until),
            Phase::Idle | Phase::Abandoning | Phase::Finished(_) => None,
        }
    }

    /// Where the task is.
    pub fn status(&self) -> TaskStatus {
        match self.phase {
            Phase::Idle => TaskStatus::Idle,
            Phase::Running { deadline } => TaskStatus::Running { attempt: self.attempt, deadline: some(deadline) },
            Phase::Abandoning => TaskStatus::Abandoning { attempt: self.attempt },
            Phase::Waiting { until } => TaskStatus::Waiting { next_attempt: self.attempt.saturating_add(1), until },
            Phase::Finished(kind) => TaskStatus::Finished(kind),
        }
    }

    /// The number of the latest attempt started (0 before the start).
    pub const fn attempt(&self) -> u64 {
        self.attempt
    }

    /// Consecutive failed attempts since the last success (S3).
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// The last failure since the last success (taken by the `TaskFinished` it ends with).
    pub const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.last_failure.as_ref()
    }

    fn check_running(&self, attempt: u64) -> Result<(), SupervisionError> {
        match self.phase {
            Phase::Running { .. } if attempt == self.attempt => Ok(()),
            Phase::Running { .. } => Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt }),
            Phase::Abandoning | Phase::Waiting { .. } => Err(SupervisionError::NoAttemptRunning),
            Phase::Idle => Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => Err(SupervisionError::Finished(kind)),
        }
    }

    fn begin_attempt(&mut self, policy: &SupervisionPolicy, now: Instant) {
        if self.attempt == 0 {
            self.attempt = 1;
        }
        self.last_start = now;
        let deadline = now.saturating_add_nanos(policy.attempt_timeout_ns);
        self.phase = Phase::Running { deadline };
        self.pending = STARTING;
    }

    /// After a retryable failure: counts it, then waits for the next attempt or finishes with
    /// `not_retried`. `self.pending` may already hold `ENDED`.
    #[inline(always)]
    fn retry_or_finish<R: Rng + ?Sized>(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        hinted_ns: Option<u64>,
        not_retried: TaskOutcomeKind,
        rng: &mut R,
    ) {
        // Saturates at `u32::MAX`, which an unlimited policy allows.
        self.failures = self.failures.saturating_add(1);
        if self.failures > policy.retries_allowed {
            self.finish(not_retried);
            return;
        }
        let delay_ns = match hinted_ns {
            Some(hinted) => {
                self.backoff.record_external(hinted);
                hinted
            }
            None => self.backoff.next_delay_ns(&policy.backoff, rng),
        };
        self.wait(policy, now, delay_ns);
    }

    /// Waits `delay_ns` from `now`, and at least `min_spacing` from the last start (S5).
    #[inline]
    fn wait(&mut self, policy: &SupervisionPolicy, now: Instant, delay_ns: u64) {
        let until =
            now.saturating_add_nanos(delay_ns).later(self.last_start.saturating_add_nanos(policy.min_spacing_ns));
        self.phase = Phase::Waiting { until };
        self.pending |= BACKOFF;
    }

    fn finish(&mut self, kind: TaskOutcomeKind) {
        self.phase = Phase::Finished(kind);
        self.pending |= FINISH;
    }

    fn take_outcome(&mut self, kind: TaskOutcomeKind) -> TaskOutcome<E> {
        let last = self.last_failure.take();
        match (kind, last) {
            (TaskOutcomeKind::Completed, _) => TaskOutcome::Completed,
            (TaskOutcomeKind::TimedOut, _) => TaskOutcome::TimedOut,
            (TaskOutcomeKind::Canceled, last_failure) => TaskOutcome::Canceled { last_failure },
            (TaskOutcomeKind::Panicked, Some(LastFailure { error: Some(error), .. })) => {
                TaskOutcome::Panicked { error }
            }
            (TaskOutcomeKind::Fatal, Some(failure)) => TaskOutcome::Fatal { failure },
            (TaskOutcomeKind::Failed, Some(last_failure)) => TaskOutcome::Failed { last_failure },
            // Every other outcome is decided right after its failure was stored; this arm
            // only serves a second drain of the same outcome, which the pending bit prevents.
            (_, last_failure) => TaskOutcome::Canceled { last_failure },
        }
    }
}

const fn some(deadline: Instant) -> Option<Instant> {
    if deadline.as_nanos() == u64::MAX { None } else { Some(deadline) }
}
