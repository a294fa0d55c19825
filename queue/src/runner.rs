//! A runner (Q8): handlers run N at once on jobs claimed in batches ahead of them, their leases
//! heartbeated while they run, woken without polling, and stopped with a deadline.

mod feeder;
mod flusher;

use core::time::Duration;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use persevere::Failure;

use crate::wake::WeakDoorbell;
use crate::worker::panic_message;
use crate::{Doorbell, Handled, Job, Queue, Store};

/// The most claimed jobs a runner keeps waiting beyond the ones its handlers run.
pub const MAX_BUFFER: usize = 500;

/// How long a runner keeps finished tasks by default ([`RunnerBuilder::retention`]).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Runs handlers on the jobs of a [`Queue`] (Q8): `concurrency` at once, on a local buffer of
/// jobs claimed in batches ([`Queue::claim_batch`]), with their results written in batches
/// ([`Queue::report_batch`]).
///
/// One feeder thread owns the queue (its connection) and does every store call: it writes the
/// results handlers sent back (one flush at a time, the next as soon as the previous returns,
/// or after [`flush_delay`](RunnerBuilder::flush_delay); while handlers work through a backlog,
/// once the results make a batch of at least one per handler and an eighth of concurrency +
/// buffer), heartbeats each job, buffered or running, once half its lease is gone, claims when
/// half of concurrency + buffer is free (or fewer jobs are out than handlers), sweeps expired
/// leases of every type now and then
/// ([`sweep_interval`](RunnerBuilder::sweep_interval)), deleting finished tasks past their
/// [`retention`](RunnerBuilder::retention) at the same time, and then sleeps until its
/// [`Doorbell`] rings: a handler's result, a shutdown, or new tasks (the store's
/// [`listen`](Store::listen): an insert into the same SQLite file from this process, a
/// PostgreSQL `NOTIFY`). A slow poll ([`poll_interval`](RunnerBuilder::poll_interval), 100 ms
/// by default) only finds tasks that became due with time (retries, delays) and notifications
/// lost.
///
/// Where the store offers a second connection ([`Store::connect_again`]: PostgreSQL), the
/// results are written on it by a thread of their own while the feeder claims, so that a claim
/// never waits for a flush: a runner on PostgreSQL holds three connections (claims, results,
/// `LISTEN`).
///
/// - A handler that panics fails its attempt with the `Panicked` class.
/// - A report refused because the lease was lost (the handler outlived its lease and another
///   attempt owns the task) is counted in [`RunReport::leases_lost`] and logged; the runner
///   goes on. A handler whose lease is lost while it runs is not stopped: its result is dropped.
/// - A store error (the database went away) is logged, and the store call tried again after a
///   backoff (50 ms doubling to 5 s); nothing ends the runner but a shutdown.
/// - A handler that declines after the runner's first heartbeat (half its start lease) has
///   started its attempt, which can then not be declined (D3): the attempt is interrupted
///   instead (a retry is used, D2).
///
/// **Shutdown** ([`ShutdownHandle::shutdown`]) with a deadline: the runner stops claiming,
/// hands the buffered jobs no handler took back ([`Queue::hand_back`]: free, D3), and waits
/// for the running handlers until the deadline; the ones still running then are interrupted
/// ([`Queue::interrupt`]: a retry is used, D2) and their results, whenever they come, are
/// dropped. Once every result is written it returns a [`RunReport`].
///
/// **Observability** (O2), target `persevere::queue`, each event with the `worker` field:
/// - debug `claimed` (`jobs`): a claim that leased jobs;
/// - debug `flushed` (`reports`, `elapsed_ms`): a batch of results written;
/// - debug `pruned` (`pruned`): finished tasks past their retention deleted by a sweep;
/// - warn `lease lost` (`task`, `attempt`, `error`): a report or heartbeat refused;
/// - info `job handed back` and warn `job interrupted` (`task`, `attempt`) at a shutdown;
/// - warn `store error` (`error`, `retry_in_ms`): a store call failed, tried again after the
///   delay;
/// - warn `result dropped` (`task`, `attempt`, `error`): a result that cannot be written (its
///   task is gone or does not load) or was not written before the runner stopped;
/// - info `runner stopping` (`deadline_ms`, `handed_back`) and `runner stopped` (the report's
///   counts);
/// - on PostgreSQL, debug `listening` and warn `listening connection lost` (`error`,
///   `retry_in_ms`) from the listening connection.
///
/// and the metrics `persevere_queue_claimed_total`, `persevere_queue_leases_lost_total`,
/// `persevere_queue_handed_back_total`, `persevere_queue_interrupted_total`,
/// `persevere_queue_store_errors_total`, `persevere_queue_listener_lost_total` (counters) and
/// `persevere_queue_flush_reports` (a histogram of reports per flush), besides the queue's own
/// `task finished` events and counters.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
/// use persevere_queue::{Handled, NewTask, Queue, Runner, Sqlite};
///
/// let policy = DeliveryPolicy::builder(RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?).build()?;
/// let mut queue = Queue::new(Sqlite::in_memory()?);
/// for i in 0..10 {
///     queue.enqueue(NewTask::new("resize", format!("cat-{i}.png"), policy))?;
/// }
/// let runner = Runner::builder(queue, "worker-1", &["resize"]).concurrency(4).build();
/// let stop = runner.shutdown_handle();
/// let done = AtomicUsize::new(0);
/// let report = runner.run_blocking(move |job| {
///     assert!(job.payload.starts_with(b"cat-"));
///     if done.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
///         stop.shutdown(Duration::from_secs(5)); // the others are running or done: they finish
///     }
///     Handled::Completed
/// });
/// assert_eq!(report.completed, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Runner<S> {
    queue: Queue<S>,
    worker: String,
    types: Vec<String>,
    settings: Settings,
    doorbell: Doorbell,
    stop: Arc<Mutex<Option<StopRequest>>>,
}

/// What a [`RunnerBuilder`] sets.
#[derive(Clone, Copy, Debug)]
struct Settings {
    concurrency: usize,
    buffer: usize,
    poll_interval: Duration,
    flush_delay: Duration,
    sweep_interval: Duration,
    /// How long finished tasks are kept before a sweep prunes them; `None`: for ever.
    retention: Option<Duration>,
}

/// A shutdown asked for: by when the running handlers must be done (`None`: no limit).
#[derive(Clone, Copy, Debug)]
struct StopRequest {
    deadline: Option<std::time::Instant>,
}

/// Settings of a [`Runner`]: [`Runner::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct RunnerBuilder<S> {
    runner: Runner<S>,
    buffer: Option<usize>,
}

impl<S: Store> Runner<S> {
    /// A runner for `worker` (unique among the workers on one database) running `types` on
    /// `queue`'s connection.
    pub fn builder(queue: Queue<S>, worker: impl Into<String>, types: &[&str]) -> RunnerBuilder<S> {
        let settings = Settings {
            concurrency: 1,
            buffer: 1,
            poll_interval: Duration::from_millis(100),
            flush_delay: Duration::ZERO,
            sweep_interval: Duration::from_secs(10),
            retention: Some(DEFAULT_RETENTION),
        };
        let runner = Runner {
            queue,
            worker: worker.into(),
            types: types.iter().map(|t| (*t).to_owned()).collect(),
            settings,
            doorbell: Doorbell::new(),
            stop: Arc::default(),
        };
        RunnerBuilder { runner, buffer: None }
    }

    /// A handle that stops this runner, from any thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { stop: self.stop.clone(), bell: self.doorbell.downgrade() }
    }

    /// Runs `handler` on `concurrency` threads of its own until a
    /// [`shutdown`](ShutdownHandle::shutdown), the store calls on this thread; returns what it
    /// did. A handler still running an interrupted job when it returns is left to finish on
    /// its thread (its result is dropped).
    ///
    /// # Panics
    /// When a thread cannot be started.
    pub fn run_blocking<F>(self, handler: F) -> RunReport
    where
        F: Fn(&Job) -> Handled + Send + Sync + 'static,
    {
        let (feeder, slots) = self.start();
        let handler = Arc::new(handler);
        let threads: Vec<_> = (0..slots.concurrency)
            .map(|i| {
                let (jobs, returns, handler) = (slots.jobs.clone(), slots.returns.clone(), handler.clone());
                std::thread::Builder::new()
                    .name(format!("persevere-handler-{i}"))
                    .spawn(move || run_handlers(&jobs, &returns, &*handler))
                    .unwrap_or_else(|error| panic!("could not start a handler thread: {error}"))
            })
            .collect();
        drop(slots);
        let report = feeder.run();
        for thread in threads {
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        report
    }

    /// Runs `handler` until a [`shutdown`](ShutdownHandle::shutdown), up to `concurrency`
    /// calls at once, each spawned on the current tokio runtime (a panic is caught through its
    /// `JoinHandle`); the store calls run on a thread of their own (a store's API is blocking).
    /// Returns what it did; the handlers of interrupted jobs are aborted. Dropping the future
    /// shuts the runner down with no deadline left (running jobs are interrupted).
    ///
    /// # Panics
    /// Outside a tokio runtime, or when the store's thread cannot be started.
    #[cfg(feature = "tokio")]
    pub async fn run<F, Fut>(self, handler: F) -> RunReport
    where
        S: Send + 'static,
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Handled> + Send + 'static,
    {
        let mut stop_on_drop = StopOnDrop(Some(self.shutdown_handle()));
        let (feeder, slots) = self.start();
        let (report_tx, report_rx) = async_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("persevere-feeder".to_owned())
            .spawn(move || {
                let _ = report_tx.send_blocking(feeder.run());
            })
            .unwrap_or_else(|error| panic!("could not start the runner's store thread: {error}"));
        let handler = Arc::new(handler);
        let mut handlers = tokio::task::JoinSet::new();
        for _ in 0..slots.concurrency {
            handlers.spawn(run_async_handlers(slots.jobs.clone(), slots.returns.clone(), handler.clone()));
        }
        drop(slots);
        let report = report_rx.recv().await;
        stop_on_drop.0 = None;
        handlers.abort_all();
        match report {
            Ok(report) => report,
            // The store's thread panicked: so does the run.
            Err(_) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("the store's thread sends its report before it ends"),
            },
        }
    }

    /// The feeder, and what the handlers need: the jobs' channel and the way back.
    fn start(self) -> (feeder::Feeder<S>, Slots) {
        let Settings { concurrency, buffer, .. } = self.settings;
        let (jobs_tx, jobs_rx) = async_channel::bounded(concurrency + buffer);
        let (results_tx, results_rx) = mpsc::channel();
        let returns = Returns { results: results_tx, bell: self.doorbell.downgrade() };
        let slots = Slots { jobs: jobs_rx.clone(), returns, concurrency };
        let feeder = feeder::Feeder::new(feeder::Parts {
            queue: self.queue,
            worker: self.worker,
            types: self.types,
            settings: self.settings,
            doorbell: self.doorbell,
            stop: self.stop,
            jobs: jobs_tx,
            buffered: jobs_rx,
            results: results_rx,
        });
        (feeder, slots)
    }
}

impl<S: Store> RunnerBuilder<S> {
    /// How many handlers run at once (1 by default, at least 1).
    pub fn concurrency(mut self, handlers: usize) -> Self {
        self.runner.settings.concurrency = handlers.max(1);
        self
    }

    /// How many claimed jobs are kept waiting for a handler beyond the running ones (by
    /// default as many as [`concurrency`](Self::concurrency); at most [`MAX_BUFFER`]). A
    /// buffered job's start lease runs from its claim: one waiting past half of it is
    /// heartbeated, and has then started (D3: at a shutdown it is interrupted, not handed back).
    pub fn buffer(mut self, jobs: usize) -> Self {
        self.buffer = Some(jobs);
        self
    }

    /// How long an idle runner waits before it claims again with nothing rung (100 ms by
    /// default): the safety net for tasks that become due with time (retry delays, delayed
    /// tasks, expired leases) and for wake-ups lost.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.runner.settings.poll_interval = interval;
        self
    }

    /// How long results wait to be written together (zero by default: a flush starts as
    /// soon as the previous one returns, with whatever came meanwhile). A flush also starts
    /// once concurrency + buffer results wait, and at a shutdown.
    pub fn flush_delay(mut self, delay: Duration) -> Self {
        self.runner.settings.flush_delay = delay;
        self
    }

    /// How often the runner sweeps expired leases of every task type ([`Queue::sweep`]; 10 s
    /// by default). Its own claims already interrupt those of its types.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.runner.settings.sweep_interval = interval;
        self
    }

    /// How long tasks that completed, proceeded or were diverted are kept before the runner's
    /// sweep deletes them ([`Queue::prune`], as River's job cleaner does; a day by default), so
    /// the table and its vacuum work stay bounded; `None` keeps them for ever. Zero deletes a
    /// task's row with the write that finishes it, as graphile-worker does
    /// ([`Queue::keep_finished`]`(false)`): one write less per task. Failed and dead-lettered
    /// tasks are always kept for a person (Q6).
    pub fn retention(mut self, retention: Option<Duration>) -> Self {
        self.runner.settings.retention = retention;
        self
    }

    /// The runner.
    pub fn build(mut self) -> Runner<S> {
        let settings = &mut self.runner.settings;
        settings.buffer = self.buffer.unwrap_or(settings.concurrency).min(MAX_BUFFER);
        if settings.retention == Some(Duration::ZERO) {
            self.runner.queue.keep_finished(false);
        }
        self.runner
    }
}

/// Stops a [`Runner`] from any thread: [`Runner::shutdown_handle`].
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    stop: Arc<Mutex<Option<StopRequest>>>,
    bell: WeakDoorbell,
}

impl ShutdownHandle {
    /// Asks the runner to stop: it claims no more, hands back the buffered jobs no handler
    /// took, and waits up to `deadline` from now for the running handlers before it interrupts
    /// their jobs. Returns at once; the run returns its [`RunReport`] once done. A second call
    /// can only bring the deadline closer. `Duration::MAX` waits for the handlers however long
    /// they take.
    pub fn shutdown(&self, deadline: Duration) {
        let deadline = std::time::Instant::now().checked_add(deadline);
        let mut stop = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = match (*stop, deadline) {
            (Some(StopRequest { deadline: Some(earlier) }), Some(later)) => Some(earlier.min(later)),
            (Some(StopRequest { deadline: Some(earlier) }), None) => Some(earlier),
            (_, deadline) => deadline,
        };
        *stop = Some(StopRequest { deadline });
        drop(stop);
        self.bell.ring();
    }
}

/// What a run did, counted by the reports written. Every job it claimed is in one count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Jobs claimed.
    pub claimed: u64,
    /// Attempts completed.
    pub completed: u64,
    /// Attempts failed (panics included): each task's policy then scheduled a retry or ended
    /// it.
    pub failed: u64,
    /// Jobs declined by their handler (D3: free returns).
    pub declined: u64,
    /// Buffered jobs given back at the shutdown, never started (D3: free returns).
    pub handed_back: u64,
    /// Jobs interrupted: still running at the shutdown's deadline, or declined after they
    /// started (D2: each uses a retry).
    pub interrupted: u64,
    /// Reports and heartbeats refused because the job's lease was lost: another attempt owns
    /// the task, whose result was dropped.
    pub leases_lost: u64,
    /// Results not written: their task is gone or does not load, or the store failed past
    /// the shutdown's deadline. Their attempts end when their leases run out (D2).
    pub unreported: u64,
}

/// What handlers share: the jobs to run and the way back.
struct Slots {
    jobs: async_channel::Receiver<Job>,
    returns: Returns,
    concurrency: usize,
}

/// The way results go back to the feeder: a channel, and a ring of its doorbell.
#[derive(Clone)]
struct Returns {
    results: mpsc::Sender<(Job, Handled)>,
    bell: WeakDoorbell,
}

impl Returns {
    fn send(&self, job: Job, handled: Handled) {
        if self.results.send((job, handled)).is_ok() {
            self.bell.ring();
        }
    }
}

/// One handler thread: runs jobs until the channel closes (a shutdown).
fn run_handlers<F: Fn(&Job) -> Handled>(jobs: &async_channel::Receiver<Job>, returns: &Returns, handler: &F) {
    while let Ok(job) = jobs.recv_blocking() {
        let handled = catch_unwind(AssertUnwindSafe(|| handler(&job)))
            .unwrap_or_else(|panic| Handled::Failed(Failure::panicked(panic_message(panic))));
        returns.send(job, handled);
    }
}

/// One handler slot on tokio: spawns each job's handler and waits for it, until the channel
/// closes (a shutdown) or the slot is aborted (which aborts the handler too).
#[cfg(feature = "tokio")]
async fn run_async_handlers<F, Fut>(jobs: async_channel::Receiver<Job>, returns: Returns, handler: Arc<F>)
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Handled> + Send + 'static,
{
    while let Ok(job) = jobs.recv().await {
        let mut task = AbortOnDrop(tokio::spawn(handler(job.clone())));
        let handled = match (&mut task.0).await {
            Ok(handled) => handled,
            Err(error) if error.is_panic() => Handled::Failed(Failure::panicked(panic_message(error.into_panic()))),
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        returns.send(job, handled);
    }
}

/// A tokio task aborted when its handle is dropped.
#[cfg(any(feature = "tokio", feature = "postgres"))]
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

#[cfg(any(feature = "tokio", feature = "postgres"))]
impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Shuts the runner down at once if the run's future is dropped before it returns.
#[cfg(feature = "tokio")]
struct StopOnDrop(Option<ShutdownHandle>);

#[cfg(feature = "tokio")]
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = &self.0 {
            stop.shutdown(Duration::ZERO);
        }
    }
}
