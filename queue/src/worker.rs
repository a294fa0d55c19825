//! A worker: claim, run a handler, report what it returned.

use std::panic::{AssertUnwindSafe, catch_unwind};

use persevere::{DeliveryError, Failure};

use crate::{Job, Queue, QueueError, Status, Store, TaskId};

/// What a handler made of its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled {
    /// It succeeded.
    Completed,
    /// It failed, with a class: retryable, fatal, a `Retry-After` hint, ... (the R-rules).
    Failed(Failure<String>),
    /// It does not run this task type and did nothing (D3): a free return, and this worker is
    /// not given that type again. Only before the first heartbeat: after one, the attempt has
    /// started and can only complete or fail.
    Declined,
}

/// The job's lease, for a handler that runs longer than the policy's `start_timeout` (10 s by
/// default; after the first heartbeat, `heartbeat_timeout` per beat) or saves checkpoints.
#[derive(Debug)]
pub struct Heartbeat<'a, S> {
    queue: &'a mut Queue<S>,
    job: &'a Job,
}

impl<S: Store> Heartbeat<'_, S> {
    /// Extends the lease and returns its new deadline (on the database's clock); with a
    /// checkpoint, stores it for the next attempt (D7).
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost: the handler should stop, since another
    /// attempt owns the task and its own result will be refused.
    pub fn beat(&mut self, checkpoint: Option<String>) -> Result<persevere::Instant, QueueError> {
        self.queue.heartbeat(self.job, checkpoint)
    }
}

/// What [`Worker::work_one`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worked {
    /// The task.
    pub id: TaskId,
    /// The attempt that ran.
    pub attempt: u64,
    /// What the handler returned (a panic is `Failed` with the `Panicked` class).
    pub handled: Handled,
    /// Where the task is after the report.
    pub status: Status,
    /// Why the report was refused, when it was: most often the lease was lost while the
    /// handler ran (its deadline passed, another attempt owns the task, and this result was
    /// dropped). Not an error: the worker goes on, and the loss is counted (Q10; the metric
    /// `persevere_queue_leases_lost_total` and a `lease lost` warning with the `metrics` and
    /// `tracing` features). `status` is then where the task is now.
    pub refused: Option<DeliveryError>,
}

/// A worker: an id, the task types it runs, and a queue connection of its own.
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
/// use persevere_queue::{Handled, NewTask, Queue, Sqlite, Status, Worker};
///
/// let policy = DeliveryPolicy::builder(RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?).build()?;
/// let mut queue = Queue::new(Sqlite::in_memory()?);
/// queue.enqueue(NewTask::new("resize", "cat.png", policy))?;
///
/// let mut worker = Worker::new(queue, "worker-1", &["resize"]);
/// let worked = worker.work_one(|job, _lease| {
///     assert_eq!(job.payload, b"cat.png");
///     Handled::Completed
/// })?;
/// assert_eq!(worked.map(|w| w.status), Some(Status::Completed));
/// assert_eq!(worker.work_one(|_, _| Handled::Completed)?, None); // nothing left
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Worker<S> {
    queue: Queue<S>,
    id: String,
    types: Vec<String>,
}

impl<S: Store> Worker<S> {
    /// A worker called `id` (unique among the workers on one database) running `types`.
    pub fn new(queue: Queue<S>, id: impl Into<String>, types: &[&str]) -> Self {
        Worker { queue, id: id.into(), types: types.iter().map(|t| (*t).to_owned()).collect() }
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its queue, for enqueueing and queries.
    pub fn queue(&mut self) -> &mut Queue<S> {
        &mut self.queue
    }

    /// Claims one due job, runs `handler` on it and reports what it returned; `None` when
    /// nothing is due. A handler that panics fails the attempt with the `Panicked` class. The
    /// handler must finish, or call [`Heartbeat::beat`], within the lease: `work_one` does not
    /// heartbeat by itself.
    ///
    /// # Errors
    /// When the store fails. A refused report (the lease was lost while the handler ran) is
    /// not an error: see [`Worked::refused`].
    pub fn work_one<F>(&mut self, handler: F) -> Result<Option<Worked>, QueueError>
    where
        F: FnOnce(&Job, &mut Heartbeat<'_, S>) -> Handled,
    {
        let types: Vec<&str> = self.types.iter().map(String::as_str).collect();
        let Some(job) = self.queue.claim(&self.id, &types)? else { return Ok(None) };
        let handled = {
            let mut lease = Heartbeat { queue: &mut self.queue, job: &job };
            catch_unwind(AssertUnwindSafe(|| handler(&job, &mut lease)))
                .unwrap_or_else(|panic| Handled::Failed(Failure::panicked(panic_message(panic))))
        };
        let reported = match &handled {
            Handled::Completed => self.queue.complete(&job),
            Handled::Failed(failure) => self.queue.fail(&job, failure.clone()),
            Handled::Declined => self.queue.decline(&job),
        };
        let (status, refused) = match reported {
            Ok(status) => (status, None),
            Err(QueueError::Refused { error, .. }) => {
                lease_lost(&job, &error);
                (self.queue.task(job.id)?.status, Some(error))
            }
            Err(error) => return Err(error),
        };
        Ok(Some(Worked { id: job.id, attempt: job.attempt, handled, status, refused }))
    }
}

/// Tells that `job`'s report was refused (its lease lost, most often): a warning (target
/// `persevere::queue`, `lease lost`) and the counter `persevere_queue_leases_lost_total`.
pub(crate) fn lease_lost(job: &Job, error: &DeliveryError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "persevere::queue", task = job.id.0, attempt = job.attempt, worker = job.worker.as_str(), %error, "lease lost");
    #[cfg(feature = "metrics")]
    metrics::counter!("persevere_queue_leases_lost_total").increment(1);
    let _ = (job, error);
}

/// A caught panic's message, when it has one.
pub(crate) fn panic_message(panic: Box<dyn core::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the handler panicked".to_owned())
}
