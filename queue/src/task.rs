//! What a task is, as enqueued, as handed to a worker and as queried.

use core::fmt;
use core::time::Duration;
use std::time::SystemTime;

use persevere::{
    AttemptFailure, AttemptProgress, Delivery, DeliveryPolicy, DeliveryStatus, Instant, LastFailure, Terminal,
    TerminalKind,
};

/// The redelivery machine of one stored task: no task id inside (the row's id is the id),
/// worker ids, checkpoints, error messages and recovery routes are strings.
pub type TaskState = Delivery<(), String, String, String, String>;

/// The policy a task is enqueued with; recovery routes ([`FailurePolicy::Divert`]) are strings.
///
/// [`FailurePolicy::Divert`]: persevere::FailurePolicy::Divert
pub type TaskPolicy = DeliveryPolicy<String>;

/// A [`DeliveryPolicy`] whose recovery route can be stored as a string: `DeliveryPolicy<()>`
/// (the builder's default, with no route), `DeliveryPolicy<&str>` and `DeliveryPolicy<String>`.
pub trait IntoTaskPolicy {
    /// The policy with its route as a string.
    fn into_task_policy(self) -> TaskPolicy;
}

impl IntoTaskPolicy for DeliveryPolicy<String> {
    fn into_task_policy(self) -> TaskPolicy {
        self
    }
}

impl IntoTaskPolicy for DeliveryPolicy<&str> {
    fn into_task_policy(self) -> TaskPolicy {
        self.map_route(String::from)
    }
}

impl IntoTaskPolicy for DeliveryPolicy<()> {
    /// `FailurePolicy::Divert(())` becomes a divert to the empty route.
    fn into_task_policy(self) -> TaskPolicy {
        self.map_route(|()| String::new())
    }
}

/// A task's id: the row's primary key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where a task is: the `status` column, derived from its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Status {
    /// Waiting for a worker (maybe for a retry delay first).
    Pending,
    /// Claimed by a worker that has not heartbeated yet.
    HandedOut,
    /// A worker heartbeated: it runs the attempt.
    Running,
    /// An attempt completed.
    Completed,
    /// Retries ended; the failure policy is `Fail`.
    Failed,
    /// Retries ended; the failure policy is `Proceed`.
    Proceeded,
    /// Retries ended; the failure policy is `Divert`.
    Diverted,
    /// Free returns exceeded `max_redeliveries` (D4).
    DeadLettered,
    /// Set aside: its stored state or policy does not load (see `Queue::corrupt_tasks`). Not a
    /// terminal state of the task: a person repairs or removes the row.
    Corrupt,
}

impl Status {
    /// The value of the `status` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::HandedOut => "handed_out",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Proceeded => "proceeded",
            Status::Diverted => "diverted",
            Status::DeadLettered => "dead_lettered",
            Status::Corrupt => "corrupt",
        }
    }

    /// Whether the task is over (D9): completed, failed, proceeded, diverted or dead-lettered.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Proceeded | Status::Diverted | Status::DeadLettered)
    }

    pub(crate) const fn of<W, E, R>(status: &DeliveryStatus<W, E, R>) -> Status {
        match status {
            DeliveryStatus::Pending { .. } => Status::Pending,
            DeliveryStatus::HandedOut { .. } => Status::HandedOut,
            DeliveryStatus::Running { .. } => Status::Running,
            DeliveryStatus::Done(terminal) => match terminal.kind() {
                TerminalKind::Completed => Status::Completed,
                TerminalKind::Failed => Status::Failed,
                TerminalKind::Proceeded => Status::Proceeded,
                TerminalKind::Diverted => Status::Diverted,
                TerminalKind::DeadLettered => Status::DeadLettered,
            },
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task to enqueue: its type, payload and policy, and optionally when it may start (a delay,
/// an instant, or both: the later wins) and an idempotency key.
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
/// use persevere_queue::NewTask;
///
/// let retry = RetryPolicy::builder(Backoff::exponential(Duration::from_secs(1), 2.0).build()?).max_attempts(5).build()?;
/// let task = NewTask::new("email", b"to=ada@example.com".to_vec(), DeliveryPolicy::builder(retry).build()?)
///     .key("welcome-ada")
///     .delay(Duration::from_secs(60));
/// // Or at a wall-clock instant, read on the database's clock.
/// let reminder = NewTask::new("email", b"to=ada@example.com".to_vec(), DeliveryPolicy::builder(retry).build()?)
///     .run_at(std::time::SystemTime::now() + Duration::from_secs(24 * 3600));
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NewTask {
    pub(crate) task_type: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) policy: TaskPolicy,
    pub(crate) delay: Duration,
    pub(crate) run_at: Option<SystemTime>,
    pub(crate) key: Option<String>,
}

impl NewTask {
    /// A task of `task_type` (workers claim by type) carrying `payload`, redelivered by `policy`.
    pub fn new(task_type: impl Into<String>, payload: impl Into<Vec<u8>>, policy: impl IntoTaskPolicy) -> Self {
        NewTask {
            task_type: task_type.into(),
            payload: payload.into(),
            policy: policy.into_task_policy(),
            delay: Duration::ZERO,
            run_at: None,
            key: None,
        }
    }

    /// No worker gets it before `delay` has passed on the database's clock.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// No worker gets it before `at`, compared with the database's clock (Q2): an instant in
    /// the past makes it due at once. With [`delay`](Self::delay) too, it is due at the later
    /// of the two.
    #[must_use]
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Enqueueing another task with the same key returns this one instead (Q5).
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// What [`Queue::enqueue`](crate::Queue::enqueue) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The task's id.
    pub id: TaskId,
    /// `false` when the idempotency key named an existing task, which is returned instead (Q5).
    pub created: bool,
}

/// One attempt of a task, leased to a worker by [`Queue::claim`](crate::Queue::claim).
///
/// Report its end with `complete`, `fail` or `decline`, quoting this job; heartbeat before
/// [`deadline`](Self::deadline) to keep the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The task.
    pub id: TaskId,
    /// Its type.
    pub task_type: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The attempt number (from 1); never run by two workers in `Sync` durability (D2).
    pub attempt: u64,
    /// Stable across every attempt of this execution of the task (D10): key your effects on it.
    pub idempotency_key: String,
    /// The last checkpoint stored by a heartbeat of an earlier attempt (D7).
    pub checkpoint: Option<String>,
    /// The start lease: heartbeat (or finish) before then on the database's clock (the
    /// policy's `start_timeout` after the claim), or the attempt is interrupted and another
    /// worker gets the next one. Each heartbeat returns the next deadline.
    pub deadline: Instant,
    /// The worker it was leased to.
    pub worker: String,
}

/// A row set aside because it does not load ([`Status::Corrupt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptTask {
    /// The task.
    pub id: TaskId,
    /// Its type.
    pub task_type: String,
    /// Its stored state, as the row holds it.
    pub state: String,
    /// Why it does not load.
    pub error: String,
}

/// A task as a query returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskInfo {
    /// The task.
    pub id: TaskId,
    /// Its type.
    pub task_type: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Where it is.
    pub status: Status,
    /// The idempotency key it was enqueued with (Q5), if any.
    pub key: Option<String>,
    /// When it next needs a claim or a sweep, on the database's clock: while pending, when it
    /// becomes due (after its start delay or `run_at`, or its retry delay); while out, its
    /// lease or heartbeat deadline; `None` once it is finished.
    pub due_at: Option<Instant>,
    /// Its full redelivery state: attempts, retries used, free returns, progress, last failure,
    /// checkpoint and terminal state.
    pub state: TaskState,
}

impl TaskInfo {
    /// The attempt number it is on (or ended with).
    pub fn attempt(&self) -> u64 {
        self.state.attempt()
    }

    /// Retries used so far.
    pub fn retries_used(&self) -> u64 {
        self.state.retries_used()
    }

    /// Free returns so far (D3, D4).
    pub fn redeliveries(&self) -> u32 {
        self.state.redeliveries()
    }

    /// The furthest any attempt reached (D5).
    pub fn progress(&self) -> AttemptProgress {
        self.state.attempt_progress()
    }

    /// The last failure, visible while retries run (D8).
    pub fn last_failure(&self) -> Option<&LastFailure<AttemptFailure<String>>> {
        self.state.last_failure()
    }

    /// The terminal state, once the task is over (D9).
    pub fn terminal(&self) -> Option<&Terminal<String, String>> {
        self.state.terminal()
    }
}
