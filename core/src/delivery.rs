//! Redelivery: one task's attempts handed to workers that can crash, disconnect, stop
//! heartbeating or decline, while the server itself can fail over (rules D1–D10).
//!
//! A [`DeliveryPolicy`] is the shared, immutable configuration (a [`RetryPolicy`] plus the
//! leases, the free-return cap, the durability mode and the failure policy); a [`Delivery`] is
//! one task's state: plain data, no policy, RNG or clock inside, so a durable engine can
//! persist it alone. With the `alloc` feature, [`Deliveries`](crate::Deliveries) keeps a table
//! of them keyed by task id for a dispatcher.
//!
//! # What consumes a retry
//!
//! | the attempt ended by                                         | retry used | attempt number   | progress            |
//! |--------------------------------------------------------------|------------|------------------|---------------------|
//! | a result: success ([`Delivery::handle_success`])           | —          | —                | (terminal)          |
//! | a result: failure ([`Delivery::handle_failure`])              | yes (R-rules) | next          | `NotCompleted`      |
//! | an [`Interruption`]: crash, disconnect, missed lease or heartbeat, server failover | yes | next (never reused, D2) | `NotCompleted` |
//! | a [`FreeReturn`]: declined, send failed, closed before start | no (D3), capped by `max_redeliveries` (D4) | same | unchanged for a failed send, else `NotCompleted` |
//! | an `Async` rollback: the server failed over before the start was durable | no (D6) | same | `NotCompleted` |
//!
//! Retries are counted by an embedded [`Retry`] machine, so limits, fatal classes, hints and
//! the total budget follow the R-rules exactly (`max_attempts` counts every attempt number,
//! `max_retries(n)` allows `n + 1`). When retries end, the [`FailurePolicy`] decides (D8).

use core::time::Duration;

use rand_core::Rng;

use crate::error::Refused;
use crate::failure::{Failure, FailureClass, FailureKind, LastFailure};
use crate::retry::{Outcome, OutcomeKind, Retry, RetryAction, RetryPolicy, Stats};
use crate::time::nanos_of;
use crate::{Instant, PolicyError};

/// How many declining workers one task remembers (D3).
///
/// The set is a fixed array, so a [`Delivery`] never allocates. Every decline is a free return,
/// and free returns are capped by `max_redeliveries` (default 3), so with the default cap a task
/// is dead-lettered before the set can overflow. With a larger cap the set keeps the latest
/// `DECLINED_CAPACITY` decliners (oldest first out): a forgotten decliner may be offered the task
/// again, which costs one more free return and can never cost a retry. The `Deliveries` table
/// additionally remembers every (worker, task type) decline without a bound.
pub const DECLINED_CAPACITY: usize = 4;

/// When the start of an attempt becomes durable (D6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Durability {
    /// The start is durable before the worker gets the task: the driver persists the
    /// [`Delivery`] after [`Delivery::handle_hand_out`] and before it sends the
    /// [`HandOut`]. A server failover interrupts every attempt that is out (it consumes a retry).
    #[default]
    Sync,
    /// The task is sent while its start is persisted; the driver confirms the write with
    /// [`Delivery::handle_persisted`]. A server failover before that rolls the attempt back: the
    /// same attempt number runs again, using no retry, possibly overlapping with the first
    /// worker. Because a rolled-back hand-out leaves no trace in the durable record, the
    /// task's [`AttemptProgress`] is [`NotCompleted`](AttemptProgress::NotCompleted) from the start.
    Async,
}

/// What happens when retries end without a success (D8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum FailurePolicy<R> {
    /// The task fails: [`Terminal::Failed`]. The default.
    #[default]
    Fail,
    /// The workflow continues with the task's input unchanged: [`Terminal::Proceeded`], with the
    /// recovery error set.
    Proceed,
    /// The task goes to a recovery step: [`Terminal::Diverted`] with this route.
    Divert(R),
}

/// The configuration of redelivery, shared by every task it governs.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, Durability, FailurePolicy, RetryPolicy};
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?)
///     .max_attempts(3)
///     .build()?;
/// let policy = DeliveryPolicy::builder(retry)
///     .heartbeat_timeout(Duration::from_secs(10))
///     .on_failure(FailurePolicy::Divert("compensate"))
///     .build()?;
/// assert_eq!(policy.max_redeliveries(), 3);
/// assert_eq!(policy.durability(), Durability::Sync);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(
        try_from = "DeliveryPolicyBuilder<R>",
        into = "DeliveryPolicyBuilder<R>",
        bound(serialize = "R: Clone + serde::Serialize", deserialize = "R: serde::Deserialize<'de>")
    )
)]
pub struct DeliveryPolicy<R = ()> {
    retry: RetryPolicy,
    max_redeliveries: u32,
    durability: Durability,
    start_timeout_ns: u64,
    heartbeat_timeout_ns: u64,
    on_failure: FailurePolicy<R>,
}

/// The settings of a [`DeliveryPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct DeliveryPolicyBuilder<R = ()> {
    /// How failed and interrupted attempts are retried. It must not set `attempt_timeout`:
    /// the leases below bound an attempt instead.
    pub retry: RetryPolicy,
    /// Free returns allowed per task before it is dead-lettered (D4); 3 by default. Zero
    /// dead-letters a task on its first free return.
    pub max_redeliveries: u32,
    /// When a start is durable (D6); [`Durability::Sync`] by default.
    pub durability: Durability,
    /// How long a handed-out attempt may wait for its worker's start (or first heartbeat)
    /// before it counts as interrupted ([`Interruption::LeaseExpired`]); 10 s by default.
    pub start_timeout: Duration,
    /// How long a running attempt may go without a heartbeat before it counts as interrupted
    /// ([`Interruption::HeartbeatMissed`]); 30 s by default.
    pub heartbeat_timeout: Duration,
    /// What happens when retries end (D8); [`FailurePolicy::Fail`] by default.
    pub on_failure: FailurePolicy<R>,
}

impl<R> DeliveryPolicyBuilder<R> {
    /// At most `n` free returns per task (D4).
    pub const fn max_redeliveries(mut self, n: u32) -> Self {
        self.max_redeliveries = n;
        self
    }

    /// The durability mode (D6).
    pub const fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The lease of a handed-out attempt that has not started.
    pub const fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// The longest silence allowed between heartbeats of a running attempt.
    pub const fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// The failure policy (D8); its route type becomes the policy's.
    pub fn on_failure<R2>(self, on_failure: FailurePolicy<R2>) -> DeliveryPolicyBuilder<R2> {
        DeliveryPolicyBuilder {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout: self.start_timeout,
            heartbeat_timeout: self.heartbeat_timeout,
            on_failure,
        }
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError::Zero`] for a zero `start_timeout` or `heartbeat_timeout`,
    /// [`PolicyError::DurationOverflow`] for one longer than `u64::MAX` nanoseconds, and
    /// [`PolicyError::Conflict`] when the retry policy sets an `attempt_timeout`.
    pub fn build(self) -> Result<DeliveryPolicy<R>, PolicyError> {
        if self.retry.attempt_timeout().is_some() {
            return Err(PolicyError::Conflict {
                setting: "attempt_timeout",
                other: "a delivery policy",
                why: "a delivered attempt is bounded by its leases; use start_timeout and heartbeat_timeout",
            });
        }
        Ok(DeliveryPolicy {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout_ns: lease(
                self.start_timeout,
                "start_timeout",
                "every hand-out would expire at once; a lost hand-out must expire, so pick a finite lease",
            )?,
            heartbeat_timeout_ns: lease(
                self.heartbeat_timeout,
                "heartbeat_timeout",
                "every running attempt would miss its heartbeat at once",
            )?,
            on_failure: self.on_failure,
        })
    }
}

fn lease(span: Duration, setting: &'static str, why: &'static str) -> Result<u64, PolicyError> {
    match nanos_of(span) {
        Some(0) => Err(PolicyError::Zero { setting, why }),
        Some(ns) => Ok(ns),
        None => Err(PolicyError::DurationOverflow { setting }),
    }
}

impl<R> TryFrom<DeliveryPolicyBuilder<R>> for DeliveryPolicy<R> {
    type Error = PolicyError;

    fn try_from(builder: DeliveryPolicyBuilder<R>) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl<R> From<DeliveryPolicy<R>> for DeliveryPolicyBuilder<R> {
    fn from(policy: DeliveryPolicy<R>) -> Self {
        DeliveryPolicyBuilder {
            retry: policy.retry,
            max_redeliveries: policy.max_redeliveries,
            durability: policy.durability,
            start_timeout: Duration::from_nanos(policy.start_timeout_ns),
            heartbeat_timeout: Duration::from_nanos(policy.heartbeat_timeout_ns),
            on_failure: policy.on_failure,
        }
    }
}

impl DeliveryPolicy<()> {
    /// A builder with `retry` and the defaults: 3 free returns, [`Durability::Sync`], a 10 s
    /// start lease, a 30 s heartbeat timeout, [`FailurePolicy::Fail`].
    pub const fn builder(retry: RetryPolicy) -> DeliveryPolicyBuilder<()> {
        DeliveryPolicyBuilder {
            retry,
            max_redeliveries: 3,
            durability: Durability::Sync,
            start_timeout: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(30),
            on_failure: FailurePolicy::Fail,
        }
    }
}

impl<R> DeliveryPolicy<R> {
    /// The retry policy.
    pub const fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Free returns allowed per task (D4).
    pub const fn max_redeliveries(&self) -> u32 {
        self.max_redeliveries
    }

    /// The durability mode (D6).
    pub const fn durability(&self) -> Durability {
        self.durability
    }

    /// The lease of a handed-out attempt that has not started.
    pub const fn start_timeout(&self) -> Duration {
        Duration::from_nanos(self.start_timeout_ns)
    }

    /// The heartbeat timeout of a running attempt.
    pub const fn heartbeat_timeout(&self) -> Duration {
        Duration::from_nanos(self.heartbeat_timeout_ns)
    }

    /// The failure policy (D8).
    pub const fn on_failure(&self) -> &FailurePolicy<R> {
        &self.on_failure
    }

    /// The same policy with its recovery route mapped by `f` (only a
    /// [`FailurePolicy::Divert`] has one): for a store that keeps routes as strings, say.
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Backoff, DeliveryPolicy, FailurePolicy, RetryPolicy};
    ///
    /// let retry = RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?).max_attempts(3).build()?;
    /// let policy = DeliveryPolicy::builder(retry).on_failure(FailurePolicy::Divert("refund")).build()?;
    /// let owned = policy.map_route(String::from);
    /// assert_eq!(owned.on_failure(), &FailurePolicy::Divert("refund".to_string()));
    /// assert_eq!(owned.max_redeliveries(), policy.max_redeliveries());
    /// # Ok::<(), persevere::PolicyError>(())
    /// ```
    pub fn map_route<R2>(self, f: impl FnOnce(R) -> R2) -> DeliveryPolicy<R2> {
        DeliveryPolicy {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout_ns: self.start_timeout_ns,
            heartbeat_timeout_ns: self.heartbeat_timeout_ns,
            on_failure: match self.on_failure {
                FailurePolicy::Fail => FailurePolicy::Fail,
                FailurePolicy::Proceed => FailurePolicy::Proceed,
                FailurePolicy::Divert(route) => FailurePolicy::Divert(f(route)),
            },
        }
    }
}

/// Why a handed-out attempt ended without a result (D2). Every interruption consumes a retry:
/// the attempt may have run, so its number is never handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum Interruption {
    /// The worker process died.
    WorkerCrashed,
    /// The connection to the worker broke (also a close after the attempt started).
    Disconnected,
    /// The worker neither started the attempt nor heartbeated within `start_timeout`.
    LeaseExpired,
    /// A running attempt missed its heartbeat deadline.
    HeartbeatMissed,
    /// The server failed over while the attempt was out and its start was durable.
    ServerFailover,
}

impl Interruption {
    /// The failure class an interruption is counted as by the retry rules: a missed deadline
    /// is a [`Timeout`](FailureClass::Timeout), anything else [`Retryable`](FailureClass::Retryable).
    pub const fn class(self) -> FailureClass {
        match self {
            Interruption::LeaseExpired | Interruption::HeartbeatMissed => FailureClass::Timeout,
            _ => FailureClass::Retryable,
        }
    }

    const fn kind(self) -> FailureKind {
        match self.class() {
            FailureClass::Timeout => FailureKind::Timeout,
            _ => FailureKind::Retryable,
        }
    }
}

/// Why a handed-out attempt came back although it certainly never ran (D3). A free return
/// keeps the attempt number and its input snapshot and consumes no retry; free returns are
/// capped by `max_redeliveries` (D4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FreeReturn {
    /// The worker does not handle this task type; it is not offered this task again (and the
    /// `Deliveries` table offers it no task of this type again).
    Declined,
    /// The hand-out never reached the worker. The only free return that leaves the task's
    /// progress at [`NotStarted`](AttemptProgress::NotStarted).
    SendFailed,
    /// The worker closed cleanly before it started the attempt.
    ClosedBeforeStart,
}

/// How an attempt failed: the worker's own failure, or an interruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AttemptFailure<E> {
    /// The worker reported this failure ([`Delivery::handle_failure`]).
    Failed(E),
    /// The attempt was interrupted (D2).
    Interrupted(Interruption),
}

/// The furthest any attempt of a task reached (D5), ordered `NotStarted < NotCompleted`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AttemptProgress {
    /// No attempt reached a worker: every hand-out so far failed to send, so the handler
    /// certainly did not run.
    #[default]
    NotStarted,
    /// Some attempt reached a worker: the handler may have run (and may have had effects).
    NotCompleted,
}

/// What a recovery step (or the caller of a failed task) is told (D8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RecoveryError<E> {
    /// Why retries ended: [`Exhausted`](OutcomeKind::Exhausted), [`Fatal`](OutcomeKind::Fatal),
    /// [`Canceled`](OutcomeKind::Canceled), [`OutOfTime`](OutcomeKind::OutOfTime) or
    /// [`Deferred`](OutcomeKind::Deferred) (a hint past `max_hint` or the total budget; the
    /// hinted instant is in [`retry_at`](Self::retry_at)).
    pub ended: OutcomeKind,
    /// The failure of the last attempt.
    pub last_failure: LastFailure<AttemptFailure<E>>,
    /// When a [`Deferred`](OutcomeKind::Deferred) task's last failure asked to be tried again.
    pub retry_at: Option<Instant>,
    /// The furthest any attempt reached.
    pub progress: AttemptProgress,
    /// As counted by the embedded retry: attempt numbers used, the retry delays scheduled
    /// between them (time spent waiting for a worker is not included), and the time from the
    /// task's creation to the end of retries.
    pub stats: Stats,
}

/// Why a task was dead-lettered (D4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeadLetter<E> {
    /// The free return that exceeded the cap.
    pub reason: FreeReturn,
    /// The attempt number that kept coming back.
    pub attempt: u64,
    /// Free returns before this one (equal to `max_redeliveries`).
    pub redeliveries: u32,
    /// The furthest any attempt reached.
    pub progress: AttemptProgress,
    /// The failure of an earlier attempt, if one failed.
    pub last_failure: Option<LastFailure<AttemptFailure<E>>>,
}

/// The one terminal state a task reaches (D9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Terminal<E, R> {
    /// An attempt completed.
    Completed {
        /// The attempt that completed.
        attempt: u64,
    },
    /// Retries ended and the failure policy is [`FailurePolicy::Fail`].
    Failed(RecoveryError<E>),
    /// Retries ended and the failure policy is [`FailurePolicy::Proceed`]: continue with the
    /// input unchanged; this is the `recovery_error`.
    Proceeded(RecoveryError<E>),
    /// Retries ended and the failure policy is [`FailurePolicy::Divert`].
    Diverted {
        /// The recovery step to run.
        route: R,
        /// What it is told.
        error: RecoveryError<E>,
    },
    /// Free returns exceeded `max_redeliveries` (D4).
    DeadLettered(DeadLetter<E>),
}

impl<E, R> Terminal<E, R> {
    /// The terminal state without its payload.
    pub const fn kind(&self) -> TerminalKind {
        match self {
            Terminal::Completed { .. } => TerminalKind::Completed,
            Terminal::Failed(_) => TerminalKind::Failed,
            Terminal::Proceeded(_) => TerminalKind::Proceeded,
            Terminal::Diverted { .. } => TerminalKind::Diverted,
            Terminal::DeadLettered(_) => TerminalKind::DeadLettered,
        }
    }

    /// The recovery error of a failed, proceeded or diverted task.
    pub const fn recovery_error(&self) -> Option<&RecoveryError<E>> {
        match self {
            Terminal::Failed(error) | Terminal::Proceeded(error) | Terminal::Diverted { error, .. } => Some(error),
            Terminal::Completed { .. } | Terminal::DeadLettered(_) => None,
        }
    }
}

/// [`Terminal`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TerminalKind {
    /// See [`Terminal::Completed`].
    Completed,
    /// See [`Terminal::Failed`].
    Failed,
    /// See [`Terminal::Proceeded`].
    Proceeded,
    /// See [`Terminal::Diverted`].
    Diverted,
    /// See [`Terminal::DeadLettered`].
    DeadLettered,
}

/// Where a task is (D1). Exactly one of these at every moment (D9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DeliveryStatus<W, E, R> {
    /// Attempt `attempt` waits for a worker.
    Pending {
        /// The attempt number the next hand-out carries.
        attempt: u64,
        /// `Some(t)` while the retry delay runs: no hand-out before `t`.
        not_before: Option<Instant>,
    },
    /// Attempt `attempt` was handed to `worker`, which has not started it yet.
    HandedOut {
        /// The attempt number.
        attempt: u64,
        /// The worker it was handed to.
        worker: W,
        /// When the hand-out's lease expires.
        deadline: Instant,
        /// Whether its start is durable (always in [`Durability::Sync`]).
        durable: bool,
    },
    /// `worker` runs attempt `attempt`.
    Running {
        /// The attempt number.
        attempt: u64,
        /// The worker running it.
        worker: W,
        /// The next heartbeat is due by then.
        heartbeat_deadline: Instant,
        /// Whether its start is durable (always in [`Durability::Sync`]).
        durable: bool,
    },
    /// The task is over.
    Done(Terminal<E, R>),
}

/// The key a worker uses to make its effects idempotent (D10): the same for every attempt of
/// one step execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IdempotencyKey<K> {
    /// The task id.
    pub task: K,
    /// The engine's id for this execution of the step (one step may execute more than once in
    /// a workflow's history; each execution gets its own id, shared by all its attempts).
    pub step_execution: u64,
}

/// What the driver sends to a worker ([`DeliveryAction::HandOut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HandOut<K, W, C> {
    /// The idempotency key, stable across attempts (D10).
    pub key: IdempotencyKey<K>,
    /// The attempt number; the worker quotes it in every report.
    pub attempt: u64,
    /// The worker to send it to.
    pub worker: W,
    /// The start lease: the worker must start (or heartbeat) by then.
    pub deadline: Instant,
    /// The last stored checkpoint, to resume from (D7).
    pub checkpoint: Option<C>,
}

/// What the driver must do next; drained with [`Delivery::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DeliveryAction<K, W, C, E, R> {
    /// Tell `worker` to drop `attempt`: its lease or heartbeat deadline passed. Reports for it
    /// are now refused.
    Revoke {
        /// The worker that held the attempt.
        worker: W,
        /// The attempt.
        attempt: u64,
        /// Which deadline it missed.
        reason: Interruption,
    },
    /// Attempt `attempt` may be handed out now.
    Ready {
        /// The attempt number.
        attempt: u64,
    },
    /// Send this to its worker.
    HandOut(HandOut<K, W, C>),
    /// The task is over. Emitted exactly once (D9).
    Finish(Terminal<E, R>),
}

/// A caller mistake; the task is left exactly as it was (G12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// Any input after the terminal state.
    #[error("the task has finished ({0:?}); its terminal state is final")]
    Finished(TerminalKind),
    /// A report for a task whose attempt is pending, not handed out.
    #[error("attempt {attempt} is pending, not handed out; reports belong to a handed-out attempt")]
    NotHandedOut {
        /// The pending attempt.
        attempt: u64,
    },
    /// A report for an attempt other than the one handed out (an interrupted or future one).
    #[error("report for attempt {got}, but attempt {current} is the one handed out")]
    StaleAttempt {
        /// The attempt handed out.
        current: u64,
        /// The attempt named by the input.
        got: u64,
    },
    /// A report from a worker other than the one holding the attempt.
    #[error("attempt {attempt} is held by another worker")]
    WrongWorker {
        /// The attempt.
        attempt: u64,
    },
    /// A hand-out while an attempt is already out.
    #[error("attempt {attempt} is already handed out; wait for its result, a return, or its deadline")]
    AlreadyHandedOut {
        /// The attempt that is out.
        attempt: u64,
    },
    /// A hand-out before the retry delay ended.
    #[error("attempt {attempt} may not be handed out before {not_before:?} (its retry delay)")]
    NotYetEligible {
        /// The pending attempt.
        attempt: u64,
        /// When it may be handed out.
        not_before: Instant,
    },
    /// A hand-out to a worker that declined this task.
    #[error("this worker declined the task's type; hand the task to another worker")]
    WorkerDeclined,
    /// A start, or a free return, for an attempt that has started.
    #[error("attempt {attempt} has already started; a started attempt can only complete, fail or be interrupted")]
    AlreadyStarted {
        /// The attempt.
        attempt: u64,
    },
    /// A table operation named a task it does not hold.
    #[error("no task with this id; insert it first (or it was removed)")]
    UnknownTask,
    /// A table insert named a task it already holds.
    #[error("a task with this id already exists; task ids must be unique")]
    DuplicateTask,
    /// An input while actions of an earlier one wait to be drained (the drain rule).
    #[error("actions of an earlier input wait to be drained; call `poll_action` until it returns `None` first")]
    Undrained,
}

const REVOKE: u8 = 1;
const READY: u8 = 2;
const HAND_OUT: u8 = 4;
const FINISH: u8 = 8;

/// One task's delivery state (rules D1–D10).
///
/// `K` is the task id, `W` a worker id, `C` a checkpoint, `E` the worker's error, `R` a
/// recovery route ([`FailurePolicy::Divert`]). All are plain data the machine stores and hands
/// back; it compares worker ids (`PartialEq`) and clones ids and checkpoints into actions, and
/// never formats anything.
///
/// # Driving it
///
/// Input comes in through `handle_*`; output goes out through [`poll_action`](Self::poll_action)
/// and [`poll_timeout`](Self::poll_timeout). After every `handle_*` call, drain `poll_action`
/// until it returns `None`; call [`handle_timeout`](Self::handle_timeout) when `poll_timeout`
/// is due. Hand a ready attempt out with [`handle_hand_out`](Self::handle_hand_out), send the
/// [`HandOut`], and report what the worker says with the attempt number it quotes.
///
/// **Drain order.** At most one of each, in this order: [`DeliveryAction::Revoke`] (a lease or
/// heartbeat deadline passed), [`DeliveryAction::Ready`] (an attempt may be handed out),
/// [`DeliveryAction::HandOut`], [`DeliveryAction::Finish`] (exactly once per task). Every
/// action of an input is reported; an input that arrives before they are drained is refused
/// with [`DeliveryError::Undrained`] (and `handle_timeout` does nothing), so none is ever
/// dropped unseen. The [`Deliveries`](crate::Deliveries) table drains each task into its own
/// queue, so there actions of many inputs accumulate in order.
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. `handle_timeout` early, or twice, changes nothing.
///
/// **Misuse** (a report for an attempt that is not out, from the wrong worker, a second result,
/// anything after the terminal state) returns a [`DeliveryError`] and leaves the machine exactly
/// as it was (G12); user data in the input is handed back in a [`Refused`].
///
/// **Another policy.** A task is plain data and may be driven under another policy than the
/// one it was created under (persisted, then loaded): leases and heartbeat deadlines already
/// set, a retry delay already scheduled and an attempt already pending stay as they are; the
/// new leases, limits, durability and failure policy apply from the next hand-out, start or
/// failure.
///
/// ```
/// use core::time::Duration;
/// use persevere::{
///     AttemptProgress, Backoff, Delivery, DeliveryAction, DeliveryPolicy, Failure, Instant, Interruption,
///     RetryPolicy, Terminal,
/// };
/// use rand_core::SeedableRng;
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?;
/// let policy = DeliveryPolicy::builder(retry).build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let now = Instant::ZERO;
/// // Task 7, step execution 1; workers are `&str`, checkpoints `u32`, errors `&str`.
/// let mut task = Delivery::<u32, &str, u32, &str>::new(&policy, now, 7, 1);
/// assert_eq!(task.poll_action(), Some(DeliveryAction::Ready { attempt: 1 }));
///
/// task.handle_hand_out(&policy, now, "w1")?;
/// let Some(DeliveryAction::HandOut(out)) = task.poll_action() else { unreachable!() };
/// assert_eq!((out.attempt, out.key.task, out.key.step_execution), (1, 7, 1));
/// task.handle_started(&policy, now, 1, &"w1")?;
/// task.handle_interrupted(&policy, now, 1, &"w1", Interruption::WorkerCrashed, &mut rng)?;
/// assert_eq!(task.poll_action(), Some(DeliveryAction::Ready { attempt: 2 })); // a retry was used
///
/// task.handle_hand_out(&policy, now, "w2")?;
/// assert!(matches!(task.poll_action(), Some(DeliveryAction::HandOut(_))));
/// task.handle_success(&policy, now, 2, &"w2")?;
/// assert_eq!(task.terminal(), Some(&Terminal::Completed { attempt: 2 }));
/// assert_eq!(task.attempt_progress(), AttemptProgress::NotCompleted);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Delivery<K, W, C, E, R = ()> {
    task: K,
    step_execution: u64,
    state: DeliveryStatus<W, E, R>,
    retry: Retry<AttemptFailure<E>>,
    progress: AttemptProgress,
    redeliveries: u32,
    checkpoint: Option<C>,
    /// The checkpoint the outstanding attempt was handed out with (its input snapshot).
    snapshot: Option<C>,
    declined: [Option<W>; DECLINED_CAPACITY],
    declined_next: u8,
    revoked: Option<(W, u64, Interruption)>,
    last_now: Instant,
    pending: u8,
}

impl<K, W, C, E, R> Delivery<K, W, C, E, R> {
    /// A new task, created at `now`: attempt 1 is ready for a worker.
    pub fn new(policy: &DeliveryPolicy<R>, now: Instant, task: K, step_execution: u64) -> Self {
        let mut retry = Retry::new();
        // A fresh `Retry` always accepts its start; its only action is `Start { attempt: 1 }`.
        let _ = retry.handle_start(&policy.retry, now);
        drain_retry(&mut retry);
        Delivery {
            task,
            step_execution,
            state: DeliveryStatus::Pending { attempt: 1, not_before: None },
            retry,
            progress: match policy.durability {
                Durability::Sync => AttemptProgress::NotStarted,
                Durability::Async => AttemptProgress::NotCompleted,
            },
            redeliveries: 0,
            checkpoint: None,
            snapshot: None,
            declined: [const { None }; DECLINED_CAPACITY],
            declined_next: 0,
            revoked: None,
            last_now: now,
            pending: READY,
        }
    }

    /// Hands the pending attempt to `worker`; drain the [`DeliveryAction::HandOut`] and send it.
    /// In [`Durability::Sync`], persist the task before sending.
    ///
    /// # Errors
    /// When an attempt is already out, the retry delay has not ended, `worker` declined this
    /// task, the task is finished, or actions wait to be drained; nothing changes and `worker`
    /// is handed back.
    #[inline]
    pub fn handle_hand_out(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        worker: W,
    ) -> Result<(), Refused<DeliveryError, W>>
    where
        W: PartialEq,
        C: Clone,
    {
        let now = self.last_now.later(now);
        if let Err(error) = self.check_hand_out(now, &worker) {
            return Err(Refused::new(error, worker));
        }
        let attempt = self.retry.attempt();
        self.last_now = now;
        self.snapshot.clone_from(&self.checkpoint);
        self.state = DeliveryStatus::HandedOut {
            attempt,
            worker,
            deadline: now.saturating_add_nanos(policy.start_timeout_ns),
            durable: policy.durability == Durability::Sync,
        };
        self.pending |= HAND_OUT;
        Ok(())
    }

    /// Whether [`handle_hand_out`](Self::handle_hand_out) would accept `worker` at `now`.
    pub fn can_hand_out(&self, now: Instant, worker: &W) -> bool
    where
        W: PartialEq,
    {
        self.check_hand_out(self.last_now.later(now), worker).is_ok()
    }

    /// The worker started attempt `attempt`: the handler may run from now on, and its first
    /// heartbeat is due within `heartbeat_timeout`.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, it has already started, the task
    /// is finished, or actions wait to be drained; nothing changes.
    #[inline]
    pub fn handle_started(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.start(policy, now);
        Ok(())
    }

    /// A heartbeat from the worker running `attempt`, with an optional checkpoint. It extends
    /// the heartbeat deadline and, with a checkpoint, replaces the stored one (last write wins,
    /// D7). A heartbeat for a handed-out attempt also starts it.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished, or actions
    /// wait to be drained; nothing changes (an interrupted attempt's checkpoint is not stored)
    /// and the checkpoint is handed back.
    #[inline]
    pub fn handle_heartbeat(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        checkpoint: Option<C>,
    ) -> Result<(), Refused<DeliveryError, Option<C>>>
    where
        W: PartialEq,
    {
        if let Err(error) = self.check_out(attempt, worker) {
            return Err(Refused::new(error, checkpoint));
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.start(policy, now);
        if checkpoint.is_some() {
            self.checkpoint = checkpoint;
        }
        Ok(())
    }

    /// The start of `attempt` is durable ([`Durability::Async`]); from now on a server failover
    /// interrupts it instead of rolling it back. In [`Durability::Sync`] every start is durable
    /// already and this changes nothing.
    ///
    /// # Errors
    /// When `attempt` is not out, the task is finished, or actions wait to be drained;
    /// nothing changes.
    pub fn handle_persisted(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
    ) -> Result<(), DeliveryError> {
        let _ = policy;
        self.check_attempt(attempt)?;
        self.check_drained()?;
        match &mut self.state {
            DeliveryStatus::HandedOut { durable, .. } | DeliveryStatus::Running { durable, .. } if !*durable => {
                *durable = true;
                self.last_now = self.last_now.later(now);
            }
            _ => {}
        }
        Ok(())
    }

    /// Attempt `attempt` completed: the task is [`Terminal::Completed`].
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished (a second
    /// result), or actions wait to be drained; nothing changes.
    #[inline]
    pub fn handle_success(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        self.check_out(attempt, worker)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        // The embedded retry runs `attempt`, so it accepts the success; its `Finish` is
        // drained here, since the task's own `Finish` reports the outcome.
        let _ = self.retry.handle_success(&policy.retry, now, attempt);
        drain_retry(&mut self.retry);
        self.progress = AttemptProgress::NotCompleted;
        self.state = DeliveryStatus::Done(Terminal::Completed { attempt });
        self.pending |= FINISH;
        Ok(())
    }

    /// The former name of [`handle_success`](Self::handle_success).
    ///
    /// # Errors
    /// As [`handle_success`](Self::handle_success).
    #[deprecated(since = "0.1.0", note = "renamed `handle_success`, as every machine names it")]
    pub fn handle_completed(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        self.handle_success(policy, now, attempt, worker)
    }

    /// The former name of [`handle_failure`](Self::handle_failure).
    ///
    /// # Errors
    /// As [`handle_failure`](Self::handle_failure).
    #[deprecated(since = "0.1.0", note = "renamed `handle_failure`, as every machine names it")]
    pub fn handle_failed<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>>
    where
        W: PartialEq,
        R: Clone,
    {
        self.handle_failure(policy, now, attempt, worker, failure, rng)
    }

    /// Attempt `attempt` failed with `failure`: it consumes a retry by the R-rules, or retries
    /// end and the failure policy decides (D8).
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished (a second
    /// result), or actions wait to be drained; nothing changes and the failure is handed back.
    pub fn handle_failure<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>>
    where
        W: PartialEq,
        R: Clone,
    {
        if let Err(error) = self.check_out(attempt, worker) {
            return Err(Refused::new(error, failure));
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.fail_attempt(policy, now, Failure::new(failure.kind, AttemptFailure::Failed(failure.error)), rng);
        Ok(())
    }

    /// Attempt `attempt` was interrupted (D2): it consumes a retry and its number is never
    /// handed out again. [`Interruption::ServerFailover`] is handled as by
    /// [`handle_failover`](Self::handle_failover): an `Async` start that is not durable rolls back.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished, or actions
    /// wait to be drained; nothing changes.
    pub fn handle_interrupted<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        interruption: Interruption,
        rng: &mut G,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
        R: Clone,
    {
        self.check_out(attempt, worker)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if interruption == Interruption::ServerFailover && !self.is_durable() {
            self.roll_back();
        } else {
            self.interrupt(policy, now, interruption, rng);
        }
        Ok(())
    }

    /// Attempt `attempt` came back although it certainly never ran (D3): it keeps its number and
    /// input snapshot and consumes no retry. A [`FreeReturn::Declined`] remembers `worker` so the
    /// task is not offered to it again. Past `max_redeliveries` free returns, the task is
    /// [`Terminal::DeadLettered`] instead (D4).
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, it has started
    /// ([`DeliveryError::AlreadyStarted`]: report an interruption instead), the task is
    /// finished, or actions wait to be drained; nothing changes.
    pub fn handle_returned(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        reason: FreeReturn,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq + Clone,
        E: Clone,
    {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        self.last_now = self.last_now.later(now);
        if reason != FreeReturn::SendFailed {
            self.progress = AttemptProgress::NotCompleted;
        }
        if reason == FreeReturn::Declined && !self.has_declined(worker) {
            let slot = usize::from(self.declined_next) % DECLINED_CAPACITY;
            if let Some(entry) = self.declined.get_mut(slot) {
                *entry = Some(worker.clone());
            }
            self.declined_next = ((slot + 1) % DECLINED_CAPACITY) as u8;
        }
        if self.redeliveries >= policy.max_redeliveries {
            self.state = DeliveryStatus::Done(Terminal::DeadLettered(DeadLetter {
                reason,
                attempt,
                redeliveries: self.redeliveries,
                progress: self.progress,
                last_failure: self.retry.last_failure().cloned(),
            }));
            self.pending |= FINISH;
        } else {
            self.redeliveries = self.redeliveries.saturating_add(1);
            self.state = DeliveryStatus::Pending { attempt, not_before: None };
            self.pending |= READY;
        }
        Ok(())
    }

    /// The server failed over (D6). An attempt that is out is interrupted
    /// ([`Interruption::ServerFailover`], a retry is used) if its start is durable; otherwise
    /// (only in [`Durability::Async`]) it rolls back: the same attempt number is pending again
    /// with its input snapshot, no retry used, and the first worker may still be running it.
    /// A pending or finished task is not affected.
    ///
    /// # Errors
    /// [`DeliveryError::Undrained`] while actions wait to be drained (a failover is a fact the
    /// task must not miss, so it is refused rather than ignored); nothing changes.
    pub fn handle_failover<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        rng: &mut G,
    ) -> Result<(), DeliveryError>
    where
        R: Clone,
    {
        if !matches!(self.state, DeliveryStatus::HandedOut { .. } | DeliveryStatus::Running { .. }) {
            return Ok(());
        }
        self.check_drained()?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if self.is_durable() {
            self.interrupt(policy, now, Interruption::ServerFailover, rng);
        } else {
            self.roll_back();
        }
        Ok(())
    }

    /// Wakes the machine: a retry delay that has ended makes its attempt ready; a hand-out past
    /// its lease, or a running attempt past its heartbeat deadline, is revoked and interrupted
    /// (D2). Early, repeated or spurious calls, and calls while actions wait to be drained,
    /// change nothing.
    pub fn handle_timeout<G: Rng + ?Sized>(&mut self, policy: &DeliveryPolicy<R>, now: Instant, rng: &mut G)
    where
        R: Clone,
    {
        if self.pending != 0 {
            return;
        }
        let now = self.last_now.later(now);
        let reason = match self.state {
            DeliveryStatus::Pending { attempt, not_before: Some(t) } if t <= now => {
                self.last_now = now;
                self.state = DeliveryStatus::Pending { attempt, not_before: None };
                self.pending |= READY;
                return;
            }
            DeliveryStatus::HandedOut { deadline, .. } if deadline <= now => Interruption::LeaseExpired,
            DeliveryStatus::Running { heartbeat_deadline, .. } if heartbeat_deadline <= now => {
                Interruption::HeartbeatMissed
            }
            _ => return,
        };
        self.last_now = now;
        self.interrupt(policy, now, reason, rng);
    }

    /// The next action, in the documented drain order; `None` when there is nothing to do.
    #[inline]
    pub fn poll_action(&mut self) -> Option<DeliveryAction<K, W, C, E, R>>
    where
        K: Clone,
        W: Clone,
        C: Clone,
        E: Clone,
        R: Clone,
    {
        while self.pending != 0 {
            let next = self.pending & self.pending.wrapping_neg();
            self.pending &= !next;
            let action = match next {
                REVOKE => self.revoked.take().map(|(worker, attempt, reason)| DeliveryAction::Revoke {
                    worker,
                    attempt,
                    reason,
                }),
                READY => match self.state {
                    DeliveryStatus::Pending { attempt, not_before: None } => Some(DeliveryAction::Ready { attempt }),
                    _ => None,
                },
                HAND_OUT => match &self.state {
                    DeliveryStatus::HandedOut { attempt, worker, deadline, .. } => {
                        Some(DeliveryAction::HandOut(HandOut {
                            key: IdempotencyKey { task: self.task.clone(), step_execution: self.step_execution },
                            attempt: *attempt,
                            worker: worker.clone(),
                            deadline: *deadline,
                            checkpoint: self.checkpoint.clone(),
                        }))
                    }
                    _ => None,
                },
                _ => match &self.state {
                    DeliveryStatus::Done(terminal) => Some(DeliveryAction::Finish(terminal.clone())),
                    _ => None,
                },
            };
            if action.is_some() {
                return action;
            }
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the end of the retry delay, the
    /// hand-out's lease, or the heartbeat deadline; `None` when nothing is timed (a ready
    /// attempt waits for a worker, not for time). A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            DeliveryStatus::Pending { not_before, .. } => *not_before,
            DeliveryStatus::HandedOut { deadline, .. } => Some(*deadline),
            DeliveryStatus::Running { heartbeat_deadline, .. } => Some(*heartbeat_deadline),
            DeliveryStatus::Done(_) => None,
        }
    }

    /// Where the task is (D1).
    pub const fn status(&self) -> &DeliveryStatus<W, E, R> {
        &self.state
    }

    /// The current attempt number: the one pending, out, or the last one before the terminal state.
    pub const fn attempt(&self) -> u64 {
        match &self.state {
            DeliveryStatus::Pending { attempt, .. }
            | DeliveryStatus::HandedOut { attempt, .. }
            | DeliveryStatus::Running { attempt, .. } => *attempt,
            DeliveryStatus::Done(_) => self.retry.attempt(),
        }
    }

    /// The furthest any attempt reached (D5).
    pub const fn attempt_progress(&self) -> AttemptProgress {
        self.progress
    }

    /// Free returns so far (D4).
    pub const fn redeliveries(&self) -> u32 {
        self.redeliveries
    }

    /// Retries consumed so far: attempt numbers used up by failures and interruptions. Free
    /// returns and rollbacks never change it.
    pub const fn retries_used(&self) -> u64 {
        let attempt = self.retry.attempt();
        match &self.state {
            DeliveryStatus::Done(Terminal::Failed(_) | Terminal::Proceeded(_) | Terminal::Diverted { .. }) => attempt,
            _ => attempt.saturating_sub(1),
        }
    }

    /// The last stored checkpoint, which the next hand-out carries (D7).
    pub const fn checkpoint(&self) -> Option<&C> {
        self.checkpoint.as_ref()
    }

    /// The last failure while retries run (D8); after the terminal state, the recovery error
    /// or dead letter holds it.
    pub const fn last_failure(&self) -> Option<&LastFailure<AttemptFailure<E>>> {
        self.retry.last_failure()
    }

    /// The terminal state, once reached (D9).
    pub const fn terminal(&self) -> Option<&Terminal<E, R>> {
        match &self.state {
            DeliveryStatus::Done(terminal) => Some(terminal),
            _ => None,
        }
    }

    /// The recovery error of a failed, proceeded or diverted task (D8).
    pub const fn recovery_error(&self) -> Option<&RecoveryError<E>> {
        match &self.state {
            DeliveryStatus::Done(terminal) => terminal.recovery_error(),
            _ => None,
        }
    }

    /// The task id.
    pub const fn task(&self) -> &K {
        &self.task
    }

    /// The latest `now` the task accepted.
    pub const fn now(&self) -> Instant {
        self.last_now
    }

    /// The idempotency key every attempt of this task carries (D10).
    pub const fn idempotency_key(&self) -> IdempotencyKey<&K> {
        IdempotencyKey { task: &self.task, step_execution: self.step_execution }
    }

    /// Whether `worker` declined this task (among the last [`DECLINED_CAPACITY`] decliners).
    pub fn has_declined(&self, worker: &W) -> bool
    where
        W: PartialEq,
    {
        self.declined.iter().any(|d| d.as_ref() == Some(worker))
    }

    /// The workers that declined this task and are not offered it again (the last
    /// [`DECLINED_CAPACITY`]), in no particular order: what a store indexes to skip the task
    /// for them.
    pub fn declined_workers(&self) -> impl Iterator<Item = &W> {
        self.declined.iter().flatten()
    }

    /// Attempts, time between attempts, and time since creation, as counted by the embedded retry.
    pub fn stats(&self) -> Stats {
        self.retry.stats()
    }

    /// Whether actions wait to be drained.
    pub const fn has_actions(&self) -> bool {
        self.pending != 0
    }

    fn check_hand_out(&self, now: Instant, worker: &W) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        match &self.state {
            DeliveryStatus::Done(terminal) => Err(DeliveryError::Finished(terminal.kind())),
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } => {
                Err(DeliveryError::AlreadyHandedOut { attempt: *attempt })
            }
            DeliveryStatus::Pending { attempt, not_before: Some(t) } if *t > now => {
                Err(DeliveryError::NotYetEligible { attempt: *attempt, not_before: *t })
            }
            DeliveryStatus::Pending { .. } if self.has_declined(worker) => Err(DeliveryError::WorkerDeclined),
            DeliveryStatus::Pending { .. } => self.check_drained(),
        }
    }

    /// Refuses an input while actions wait to be drained (the drain rule).
    #[inline]
    fn check_drained(&self) -> Result<(), DeliveryError> {
        if self.pending == 0 { Ok(()) } else { Err(DeliveryError::Undrained) }
    }

    /// Checks that `attempt` is out; returns whether it has started. Does not check the drain.
    fn check_attempt(&self, got: u64) -> Result<bool, DeliveryError> {
        match &self.state {
            DeliveryStatus::Done(terminal) => Err(DeliveryError::Finished(terminal.kind())),
            DeliveryStatus::Pending { attempt, .. } if *attempt == got => {
                Err(DeliveryError::NotHandedOut { attempt: *attempt })
            }
            DeliveryStatus::Pending { attempt, .. } => Err(DeliveryError::StaleAttempt { current: *attempt, got }),
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } if *attempt != got => {
                Err(DeliveryError::StaleAttempt { current: *attempt, got })
            }
            DeliveryStatus::HandedOut { .. } => Ok(false),
            DeliveryStatus::Running { .. } => Ok(true),
        }
    }

    /// Checks that `attempt` is out to `worker` and every action is drained; returns whether
    /// it has started.
    fn check_out(&self, got: u64, worker: &W) -> Result<bool, DeliveryError>
    where
        W: PartialEq,
    {
        let started = self.check_attempt(got)?;
        match &self.state {
            DeliveryStatus::HandedOut { worker: holder, .. } | DeliveryStatus::Running { worker: holder, .. }
                if holder != worker =>
            {
                Err(DeliveryError::WrongWorker { attempt: got })
            }
            _ => self.check_drained().map(|()| started),
        }
    }

    fn is_durable(&self) -> bool {
        match self.state {
            DeliveryStatus::HandedOut { durable, .. } | DeliveryStatus::Running { durable, .. } => durable,
            _ => true,
        }
    }

    /// HandedOut → Running, or a heartbeat on Running: the deadline moves.
    fn start(&mut self, policy: &DeliveryPolicy<R>, now: Instant) {
        let heartbeat_deadline = now.saturating_add_nanos(policy.heartbeat_timeout_ns);
        self.progress = AttemptProgress::NotCompleted;
        let state = core::mem::replace(&mut self.state, DeliveryStatus::Pending { attempt: 0, not_before: None });
        self.state = match state {
            DeliveryStatus::HandedOut { attempt, worker, durable, .. }
            | DeliveryStatus::Running { attempt, worker, durable, .. } => {
                DeliveryStatus::Running { attempt, worker, heartbeat_deadline, durable }
            }
            other => other,
        };
    }

    /// The outstanding attempt is interrupted: revoked if a deadline passed, then failed.
    fn interrupt<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        reason: Interruption,
        rng: &mut G,
    ) where
        R: Clone,
    {
        if matches!(reason, Interruption::LeaseExpired | Interruption::HeartbeatMissed) {
            let state = core::mem::replace(&mut self.state, DeliveryStatus::Pending { attempt: 0, not_before: None });
            if let DeliveryStatus::HandedOut { attempt, worker, .. } | DeliveryStatus::Running { attempt, worker, .. } =
                state
            {
                self.revoked = Some((worker, attempt, reason));
                self.pending |= REVOKE;
            }
        }
        self.fail_attempt(policy, now, Failure::new(reason.kind(), AttemptFailure::Interrupted(reason)), rng);
    }

    /// An attempt that may have run failed: the retry machine decides what comes next.
    fn fail_attempt<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        failure: Failure<AttemptFailure<E>>,
        rng: &mut G,
    ) where
        R: Clone,
    {
        self.progress = AttemptProgress::NotCompleted;
        let attempt = self.retry.attempt();
        // The embedded retry is running `attempt` whenever an attempt is out: it accepts.
        let _ = self.retry.handle_failure(&policy.retry, now, attempt, failure, rng);
        let mut finish = None;
        let mut until = None;
        for _ in 0..4 {
            match self.retry.poll_action() {
                Some(RetryAction::Sleep { until: t, .. }) => until = Some(t),
                Some(RetryAction::Finish { outcome, stats }) => finish = Some((outcome, stats)),
                Some(RetryAction::Start { .. } | RetryAction::Abandon { .. }) => {}
                None => break,
            }
        }
        if let Some((outcome, stats)) = finish {
            self.conclude(policy, outcome, stats);
            return;
        }
        let until = until.unwrap_or(now);
        // Start the next attempt in the retry at once (it cannot be handed out before `until`),
        // so that no later input needs an RNG to wake it. Its start draws nothing.
        self.retry.handle_timeout(&policy.retry, until, rng);
        drain_retry(&mut self.retry);
        let attempt = self.retry.attempt();
        if until <= now {
            self.state = DeliveryStatus::Pending { attempt, not_before: None };
            self.pending |= READY;
        } else {
            self.state = DeliveryStatus::Pending { attempt, not_before: Some(until) };
        }
    }

    /// Retries ended without a success: the failure policy decides (D8).
    fn conclude(&mut self, policy: &DeliveryPolicy<R>, outcome: Outcome<AttemptFailure<E>>, stats: Stats)
    where
        R: Clone,
    {
        let ended = outcome.kind();
        let retry_at = outcome.retry_at();
        // Retries end after a failure; only a cancel may come without one.
        let last_failure =
            outcome.into_last_failure().unwrap_or(LastFailure { class: FailureClass::Canceled, error: None });
        let error = RecoveryError { ended, last_failure, retry_at, progress: self.progress, stats };
        self.state = DeliveryStatus::Done(match &policy.on_failure {
            FailurePolicy::Fail => Terminal::Failed(error),
            FailurePolicy::Proceed => Terminal::Proceeded(error),
            FailurePolicy::Divert(route) => Terminal::Diverted { route: route.clone(), error },
        });
        self.pending |= FINISH;
    }

    /// An `Async` start that was not durable is undone: same attempt, input snapshot, no retry.
    fn roll_back(&mut self) {
        let attempt = self.retry.attempt();
        self.progress = AttemptProgress::NotCompleted;
        core::mem::swap(&mut self.checkpoint, &mut self.snapshot);
        self.snapshot = None;
        self.state = DeliveryStatus::Pending { attempt, not_before: None };
        self.pending |= READY;
    }
}

impl<K, W, C, E, R> Delivery<K, W, C, E, R> {
    /// Whether a loaded state is one the transitions could have made: the task's state agrees
    /// with its embedded retry, and its pending actions with its state.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.pending & !(REVOKE | READY | HAND_OUT | FINISH) != 0 {
            return Err("an unknown action is pending");
        }
        if usize::from(self.declined_next) >= DECLINED_CAPACITY {
            return Err("the decliners' ring points past its end");
        }
        if self.declined_ring_is_broken() {
            return Err("the decliners' ring has a gap");
        }
        if (self.pending & REVOKE != 0) != self.revoked.is_some() {
            return Err("a pending revoke and its worker disagree");
        }
        if self.revoked.is_some()
            && matches!(self.state, DeliveryStatus::HandedOut { .. } | DeliveryStatus::Running { .. })
        {
            return Err("a revoked attempt's task is still out (a revoke leaves it pending or finished)");
        }
        let retry_attempt = self.retry.attempt();
        let may_have_run = retry_attempt > 1
            || matches!(
                self.state,
                DeliveryStatus::Running { .. }
                    | DeliveryStatus::Done(
                        Terminal::Completed { .. }
                            | Terminal::Failed(_)
                            | Terminal::Proceeded(_)
                            | Terminal::Diverted { .. }
                    )
            );
        if may_have_run && self.progress == AttemptProgress::NotStarted {
            return Err("an attempt may have run, yet the progress says none reached a worker");
        }
        match &self.state {
            DeliveryStatus::Pending { attempt, not_before } => {
                if *attempt != retry_attempt || !matches!(self.retry.status(), crate::RetryStatus::Running { .. }) {
                    return Err("a pending attempt is not the one its retry runs");
                }
                if self.pending & (HAND_OUT | FINISH) != 0 || (self.pending & READY != 0 && not_before.is_some()) {
                    return Err("a pending task has actions of another state");
                }
            }
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } => {
                if *attempt != retry_attempt || !matches!(self.retry.status(), crate::RetryStatus::Running { .. }) {
                    return Err("an attempt that is out is not the one its retry runs");
                }
                if self.pending & (READY | FINISH) != 0 {
                    return Err("an attempt that is out has actions of another state");
                }
                if matches!(self.state, DeliveryStatus::Running { .. }) && self.pending & HAND_OUT != 0 {
                    return Err("a running attempt still has its hand-out pending");
                }
            }
            DeliveryStatus::Done(terminal) => {
                if self.pending & (READY | HAND_OUT) != 0 {
                    return Err("a finished task has actions of a live one");
                }
                if let Terminal::Completed { attempt } = terminal
                    && *attempt != retry_attempt
                {
                    return Err("a completed attempt is not its retry's last attempt");
                }
            }
        }
        if self.retry.has_actions() {
            return Err("the embedded retry has undrained actions");
        }
        Ok(())
    }

    /// Whether the decliners' ring is not one `handle_returned` fills: slots used from the
    /// first on, `declined_next` just past them until the ring is full.
    fn declined_ring_is_broken(&self) -> bool {
        let used = self.declined.iter().filter(|d| d.is_some()).count();
        used < DECLINED_CAPACITY && used != usize::from(self.declined_next)
            || self.declined.iter().take(used).any(Option::is_none)
    }
}

crate::serde_validated!(Delivery<K, W, C, E, R>, "a Delivery");

/// Drains a retry's actions (at most four exist at once).
fn drain_retry<E>(retry: &mut Retry<E>) {
    for _ in 0..4 {
        if retry.poll_action().is_none() {
            break;
        }
    }
}
