//! What redelivery reports: interruptions and free returns, a task's status and terminal
//! state, its actions, and the caller mistakes it refuses.

use crate::Instant;
use crate::failure::{FailureClass, FailureKind, LastFailure};
use crate::retry::{OutcomeKind, Stats};
#[cfg(doc)]
use crate::{Delivery, Durability, FailurePolicy};

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

    pub(super) const fn kind(self) -> FailureKind {
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
