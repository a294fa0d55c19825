//! The runner's engine: the one thread that owns the queue and makes every store call.
//!
//! Each turn of its loop takes in the results handlers sent back and a shutdown asked for,
//! then (unless a store error's backoff runs) writes the results, gives back the jobs to give
//! back, heartbeats the jobs whose lease is half gone, claims if there is room and tasks may be
//! due, and sweeps now and then; then it sleeps on the doorbell until it rings or its next
//! timer is due.

use core::time::Duration;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use persevere::{Backoff, BackoffState, DeliveryError, SplitMix64};

use super::flusher::Flusher;
use super::{RunReport, Settings, StopRequest};
use crate::queue::HeldReports;
use crate::wake::{jitter_seed, reconnect_backoff};
use crate::{Doorbell, Handled, Job, Queue, QueueError, Status, Store, TaskId};

/// How many expired leases one sweep looks at.
const SWEEP_LIMIT: u32 = 100;

/// How many finished tasks one sweep deletes at most.
const PRUNE_LIMIT: u32 = 10_000;

/// Past a shutdown's deadline, how many store failures in a row end the run, leaving what is
/// unwritten to the leases (D2).
const TRIES_PAST_DEADLINE: u32 = 3;

/// The longest the feeder sleeps with no timer due (rings wake it before).
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// The shortest time between two heartbeats of a job.
const MIN_BEAT: Duration = Duration::from_millis(10);

/// What [`Feeder::new`] is made of.
pub(super) struct Parts<S> {
    pub(super) queue: Queue<S>,
    pub(super) worker: String,
    pub(super) types: Vec<String>,
    pub(super) settings: Settings,
    pub(super) doorbell: Doorbell,
    pub(super) stop: Arc<Mutex<Option<StopRequest>>>,
    /// Where claimed jobs go to the handlers.
    pub(super) jobs: async_channel::Sender<Job>,
    /// The same channel's other end: the buffered jobs taken back at a shutdown.
    pub(super) buffered: async_channel::Receiver<Job>,
    pub(super) results: mpsc::Receiver<(Job, Handled)>,
}

/// The runner's engine (see the module's docs).
pub(super) struct Feeder<S> {
    parts: Parts<S>,
    /// The jobs handlers have (buffered or running), by task, with when to heartbeat each.
    out: HashMap<TaskId, Out>,
    /// Results to write, and since when the oldest of them waits.
    pending: Vec<(Job, Handled)>,
    pending_since: Option<Instant>,
    /// The second connection that writes results, if the store offers one.
    flusher: Option<Flusher>,
    /// The results the flusher is writing.
    in_flight: Option<InFlight>,
    /// Jobs to give back to the queue.
    give_back: Vec<(Job, GiveBack)>,
    wake: Wake,
    retry: StoreRetry,
    stopping: Option<Stopping>,
    last_sweep: Instant,
    report: RunReport,
}

/// A batch of results the flusher is writing: the results, their decided writes, since when
/// the oldest waits and when the flush started.
struct InFlight {
    batch: Vec<(Job, Handled)>,
    held: HeldReports,
    since: Instant,
    started: Instant,
}

/// A job a handler has or will have.
struct Out {
    job: Job,
    beat_at: Instant,
}

/// How a job goes back to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GiveBack {
    /// Never started: a free return (D3).
    HandBack,
    /// Started and abandoned: an interruption (D2).
    Interrupt,
}

/// Whether a claim is worth its transaction.
struct Wake {
    /// Tasks may be due that no claim has looked for: the last claim filled all it asked for,
    /// or the doorbell rang for something else than a result since.
    maybe_due: bool,
    last_claim: Option<Instant>,
    /// Results taken in so far: each rang the doorbell once, after it was sent.
    received: u64,
    /// Rings known not to be results, so far (a lower bound: see [`Wake::rung`]).
    others: u64,
}

impl Wake {
    /// The doorbell has rung `rings` times, and `received` results were taken in after that
    /// count was read. Each result rang after it was sent, so at most `received` of the rings
    /// are results and `rings - received` is a lower bound on the others (new tasks, a
    /// shutdown); a result's ring still to come only raises it later, when it lands.
    fn rung(&mut self, rings: u64) {
        let others = rings.saturating_sub(self.received);
        if others > self.others {
            self.others = others;
            self.maybe_due = true;
        }
    }
}

/// The backoff after a store error: no store call before `at`.
struct StoreRetry {
    backoff: Backoff,
    failures: BackoffState,
    rng: SplitMix64,
    at: Option<Instant>,
}

/// A shutdown under way.
struct Stopping {
    deadline: Option<Instant>,
    /// The deadline passed: the jobs still out were given back as interrupted.
    overdue: bool,
}

impl<S: Store> Feeder<S> {
    pub(super) fn new(parts: Parts<S>) -> Self {
        Feeder {
            parts,
            out: HashMap::new(),
            pending: Vec::new(),
            pending_since: None,
            flusher: None,
            in_flight: None,
            give_back: Vec::new(),
            wake: Wake { maybe_due: true, last_claim: None, received: 0, others: 0 },
            retry: StoreRetry {
                backoff: reconnect_backoff(),
                failures: BackoffState::new(),
                rng: SplitMix64::new(jitter_seed()),
                at: None,
            },
            stopping: None,
            last_sweep: Instant::now(),
            report: RunReport::default(),
        }
    }

    /// Runs until a shutdown is done; returns what it did.
    pub(super) fn run(mut self) -> RunReport {
        if let Err(error) = self.parts.queue.store().listen(&self.parts.doorbell) {
            // Without wake-ups the poll finds the tasks.
            events::store_error(&self.parts.worker, &error, None);
        }
        self.flusher = match self.parts.queue.store().connect_again() {
            Some(Ok(store)) => Flusher::start(store, self.parts.doorbell.downgrade()),
            // Without it, results are written on the one connection.
            Some(Err(error)) => {
                events::store_error(&self.parts.worker, &error, None);
                None
            }
            None => None,
        };
        let mut rings = self.parts.doorbell.rings();
        loop {
            self.take_results(rings);
            self.take_stop();
            if self.retry.at.is_none_or(|at| Instant::now() >= at) {
                let result = self.store_work();
                self.retry.record(&self.parts.worker, result);
            }
            if self.finished() {
                break;
            }
            rings = self.parts.doorbell.wait(rings, self.sleep());
        }
        events::stopped(&self.parts.worker, &self.report);
        self.report
    }

    /// Every store call of one turn, in order; the first error ends the turn.
    fn store_work(&mut self) -> Result<(), QueueError> {
        self.flush()?;
        self.give_back()?;
        self.heartbeat()?;
        self.claim()?;
        self.sweep()
    }

    /// How many jobs may be out at once.
    fn capacity(&self) -> usize {
        self.parts.settings.concurrency + self.parts.settings.buffer
    }

    /// Takes in the results sent back after the doorbell's count read `rings`: a result of a
    /// job still out waits to be written; one of a job given back or lost is dropped.
    fn take_results(&mut self, rings: u64) {
        while let Ok((job, handled)) = self.parts.results.try_recv() {
            self.wake.received += 1;
            if self.out.get(&job.id).is_some_and(|out| out.job.attempt == job.attempt) {
                self.out.remove(&job.id);
                self.pending.push((job, handled));
                self.pending_since.get_or_insert_with(Instant::now);
            }
        }
        self.wake.rung(rings);
    }

    /// Starts a shutdown asked for (the buffered jobs are taken back), and interrupts the jobs
    /// still out once its deadline has passed.
    fn take_stop(&mut self) {
        let Some(request) = *self.parts.stop.lock().unwrap_or_else(PoisonError::into_inner) else { return };
        if self.stopping.is_none() {
            self.start_stopping(request.deadline);
        }
        let Some(stopping) = &mut self.stopping else { return };
        stopping.deadline = request.deadline;
        if stopping.overdue || stopping.deadline.is_none_or(|deadline| Instant::now() < deadline) {
            return;
        }
        stopping.overdue = true;
        for (_, out) in self.out.drain() {
            self.give_back.push((out.job, GiveBack::Interrupt));
        }
    }

    /// Takes back the jobs no handler took and closes their channel (idle handlers end).
    fn start_stopping(&mut self, deadline: Option<Instant>) {
        let mut taken = 0;
        while let Ok(job) = self.parts.buffered.try_recv() {
            self.out.remove(&job.id);
            self.give_back.push((job, GiveBack::HandBack));
            taken += 1;
        }
        self.parts.buffered.close();
        events::stopping(&self.parts.worker, deadline, taken);
        self.stopping = Some(Stopping { deadline, overdue: false });
    }

    /// Writes the results waiting, as one batch, if they have waited the flush delay (or fill
    /// the buffer, or the runner is stopping), and none is being written: on the flusher's
    /// connection if there is one (its answer is taken in a later turn), else on this one.
    fn flush(&mut self) -> Result<(), QueueError> {
        self.land()?;
        let Some(since) = self.pending_since else { return Ok(()) };
        if self.in_flight.is_some() || !self.flush_due(since) {
            return Ok(());
        }
        let batch = core::mem::take(&mut self.pending);
        self.pending_since = None;
        let started = Instant::now();
        let mut held = match self.parts.queue.decide_reports(&batch) {
            Ok(held) => held,
            Err(error) => return Err(self.unwritten(batch, since, error)),
        };
        if !held.writes.is_empty()
            && let Some(flusher) = &self.flusher
        {
            let writes = core::mem::take(&mut held.writes);
            if let Err(writes) = flusher.send(writes) {
                // The thread is gone: write on this connection from now on.
                held.writes = writes;
                self.flusher = None;
            } else {
                self.in_flight = Some(InFlight { batch, held, since, started });
                return Ok(());
            }
        }
        let applied = if held.writes.is_empty() {
            Vec::new()
        } else {
            match self.parts.queue.store().write_batch_if_leased(&held.writes) {
                Ok(applied) => applied,
                Err(error) => return Err(self.unwritten(batch, since, error)),
            }
        };
        self.settle(batch, held, &applied, started)
    }

    /// Whether the results waiting since `since` are to be written now: the runner is stopping,
    /// they fill the buffer, or they have waited the flush delay and either no backlog of jobs
    /// is out (at most one per handler) or they make a batch worth a statement (one per
    /// handler, and an eighth of the capacity): while handlers work through a backlog, results
    /// come faster than statements commit, and each commit waits for the disk.
    fn flush_due(&self, since: Instant) -> bool {
        let settings = &self.parts.settings;
        let batch = settings.concurrency.max(self.capacity() / 8);
        let worth = self.out.len() <= settings.concurrency || self.pending.len() >= batch;
        self.stopping.is_some()
            || self.pending.len() >= self.capacity()
            || (worth && since.elapsed() >= settings.flush_delay)
    }

    /// Takes in the flusher's answer, if it has come, and settles its batch.
    fn land(&mut self) -> Result<(), QueueError> {
        let Some(flusher) = &self.flusher else { return Ok(()) };
        if self.in_flight.is_none() {
            return Ok(());
        }
        let Some(answer) = flusher.answer() else { return Ok(()) };
        let Some(InFlight { batch, held, since, started }) = self.in_flight.take() else { return Ok(()) };
        match answer {
            Ok(applied) => self.settle(batch, held, &applied, started),
            Err(error) => {
                if matches!(error, QueueError::FlusherEnded) {
                    // The thread is gone: write on this connection from now on.
                    self.flusher = None;
                }
                Err(self.unwritten(batch, since, error))
            }
        }
    }

    /// A batch whose guarded writes failed waits to be written again, whole, before the results
    /// that came since (its writes' decisions are spent: each of its reports is then written one
    /// by one, on a fresh read; one that did commit before its connection broke is refused the
    /// second time, and counted as a lost lease). Returns `error`.
    fn unwritten(&mut self, mut batch: Vec<(Job, Handled)>, since: Instant, error: QueueError) -> QueueError {
        batch.append(&mut self.pending);
        self.pending = batch;
        self.pending_since = Some(since);
        error
    }

    /// Counts and tells the results of a batch whose guarded writes `applied` as told, once the
    /// others are written one by one.
    fn settle(
        &mut self,
        batch: Vec<(Job, Handled)>,
        held: HeldReports,
        applied: &[bool],
        started: Instant,
    ) -> Result<(), QueueError> {
        let results = self.parts.queue.settle_reports(&batch, held, applied);
        events::flushed(&self.parts.worker, batch.len(), started.elapsed());
        let mut failed = Ok(());
        for ((job, handled), result) in batch.into_iter().zip(results) {
            if let Err(error) = self.reported(job, handled, result) {
                failed = failed.and(Err(error));
            }
        }
        failed
    }

    /// Counts one written result. One the store failed to write waits to be written again,
    /// and its error is returned.
    fn reported(&mut self, job: Job, handled: Handled, result: Result<Status, QueueError>) -> Result<(), QueueError> {
        match (result, &handled) {
            (Ok(_), Handled::Completed) => self.report.completed += 1,
            (Ok(_), Handled::Failed(_)) => self.report.failed += 1,
            (Ok(_), Handled::Declined) => self.report.declined += 1,
            // The runner's heartbeat started the attempt (D3): it can no longer be declined.
            (Err(QueueError::Refused { error: DeliveryError::AlreadyStarted { .. }, .. }), Handled::Declined) => {
                self.give_back.push((job, GiveBack::Interrupt));
            }
            (Err(QueueError::Refused { error, .. }), _) => self.lease_lost(&job, &error),
            (Err(error), _) if retryable(&error) => {
                self.pending.push((job, handled));
                self.pending_since.get_or_insert_with(Instant::now);
                return Err(error);
            }
            (Err(error), _) => self.unreported(&job, &error),
        }
        Ok(())
    }

    /// Gives back the jobs to give back: hand-backs (a job heartbeated while buffered has
    /// started, and is interrupted instead) and interruptions.
    fn give_back(&mut self) -> Result<(), QueueError> {
        while let Some((job, how)) = self.give_back.pop() {
            let result = match how {
                GiveBack::HandBack => self.parts.queue.hand_back(&job),
                GiveBack::Interrupt => self.parts.queue.interrupt(&job),
            };
            match result {
                Ok(_) => self.given_back(&job, how),
                Err(QueueError::Refused { error: DeliveryError::AlreadyStarted { .. }, .. })
                    if how == GiveBack::HandBack =>
                {
                    self.give_back.push((job, GiveBack::Interrupt));
                }
                Err(QueueError::Refused { error, .. }) => self.lease_lost(&job, &error),
                Err(error) if retryable(&error) => {
                    self.give_back.push((job, how));
                    return Err(error);
                }
                Err(error) => self.unreported(&job, &error),
            }
        }
        Ok(())
    }

    /// Heartbeats every job out whose lease is half gone.
    fn heartbeat(&mut self) -> Result<(), QueueError> {
        let now = Instant::now();
        let due: Vec<TaskId> = self.out.iter().filter(|(_, out)| out.beat_at <= now).map(|(id, _)| *id).collect();
        for id in due {
            let Some(out) = self.out.get_mut(&id) else { continue };
            match self.parts.queue.heartbeat(&out.job, None) {
                Ok(deadline) => out.beat_at = next_beat(&mut self.parts.queue, deadline),
                Err(QueueError::Refused { error, .. }) => {
                    if let Some(out) = self.out.remove(&id) {
                        self.lease_lost(&out.job, &error);
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// How many jobs a claim may take now, if one is worth its transaction: the runner is not
    /// stopping, and half its capacity is free or fewer jobs are out than handlers. Results not
    /// yet written hold their jobs' places (the queue holds those jobs until they are written).
    fn room(&self) -> Option<usize> {
        let in_flight = self.in_flight.as_ref().map_or(0, |flight| flight.batch.len());
        let room = self.capacity().saturating_sub(self.out.len() + self.pending.len() + in_flight);
        let worth = room * 2 >= self.capacity() || self.out.len() < self.parts.settings.concurrency;
        (self.stopping.is_none() && room > 0 && worth).then_some(room)
    }

    /// Claims as many jobs as there is room for, if tasks may be due (the doorbell rang, the
    /// last claim was full, or the poll interval has passed) and the room is worth a
    /// transaction, and sends them to the handlers.
    fn claim(&mut self) -> Result<(), QueueError> {
        let now = Instant::now();
        let polled = self
            .wake
            .last_claim
            .is_none_or(|at| at.checked_add(self.parts.settings.poll_interval).is_some_and(|t| now >= t));
        let Some(room) = self.room() else { return Ok(()) };
        if !(self.wake.maybe_due || polled) {
            return Ok(());
        }
        self.wake.last_claim = Some(now);
        // A claim that fails leaves the tasks due.
        self.wake.maybe_due = true;
        let types: Vec<&str> = self.parts.types.iter().map(String::as_str).collect();
        let max = u32::try_from(room).unwrap_or(u32::MAX);
        let jobs = self.parts.queue.claim_batch(&self.parts.worker, &types, max)?;
        self.wake.maybe_due = jobs.len() >= room;
        if jobs.is_empty() {
            return Ok(());
        }
        events::claimed(&self.parts.worker, jobs.len());
        self.report.claimed += jobs.len() as u64;
        for job in jobs {
            let beat_at = next_beat(&mut self.parts.queue, job.deadline);
            match self.parts.jobs.try_send(job.clone()) {
                Ok(()) => {
                    self.out.insert(job.id, Out { job, beat_at });
                }
                // No handler is left to take it.
                Err(_) => self.give_back.push((job, GiveBack::HandBack)),
            }
        }
        Ok(())
    }

    /// Sweeps expired leases of every type, and prunes finished tasks past their retention,
    /// once per sweep interval.
    fn sweep(&mut self) -> Result<(), QueueError> {
        let settings = self.parts.settings;
        if self.stopping.is_some() || self.last_sweep.elapsed() < settings.sweep_interval {
            return Ok(());
        }
        self.last_sweep = Instant::now();
        self.parts.queue.sweep(SWEEP_LIMIT)?;
        if let Some(retention) = settings.retention {
            let pruned = self.parts.queue.prune(retention, PRUNE_LIMIT)?;
            #[cfg(feature = "tracing")]
            if pruned > 0 {
                tracing::debug!(target: "persevere::queue", worker = self.parts.worker.as_str(), pruned, "pruned");
            }
            let _ = pruned;
        }
        Ok(())
    }

    /// Whether the shutdown is done: every job reported or given back, or, past the deadline,
    /// the store failing still (what is left is counted unreported).
    fn finished(&mut self) -> bool {
        let Some(stopping) = &self.stopping else { return false };
        if self.out.is_empty() && self.pending.is_empty() && self.give_back.is_empty() && self.in_flight.is_none() {
            return true;
        }
        if !stopping.overdue || self.retry.failures.failures() < TRIES_PAST_DEADLINE {
            return false;
        }
        let in_flight = self.in_flight.take().map(|flight| flight.batch).unwrap_or_default();
        let left: Vec<Job> = (self.pending.drain(..).chain(in_flight).map(|(job, _)| job))
            .chain(self.give_back.drain(..).map(|(job, _)| job))
            .collect();
        for job in &left {
            self.unreported(job, &"the store kept failing past the shutdown's deadline");
        }
        true
    }

    /// How long to sleep unless the doorbell rings: until the next timer (a heartbeat, a flush,
    /// a poll, a sweep, the shutdown's deadline, or the end of a store error's backoff).
    fn sleep(&self) -> Duration {
        let now = Instant::now();
        let settings = &self.parts.settings;
        let deadline = self.stopping.as_ref().filter(|s| !s.overdue).and_then(|s| s.deadline);
        let timers = if let Some(at) = self.retry.at {
            // No store call before then.
            [Some(at), deadline, None, None, None]
        } else {
            let running = self.stopping.is_none();
            let poll = self
                .room()
                .and_then(|_| self.wake.last_claim.map_or(Some(now), |at| at.checked_add(settings.poll_interval)));
            [
                self.out.values().map(|out| out.beat_at).min(),
                // While a batch is being written, its answer rings the doorbell.
                self.pending_since
                    .filter(|_| self.in_flight.is_none())
                    .and_then(|since| since.checked_add(settings.flush_delay)),
                poll,
                running.then(|| self.last_sweep.checked_add(settings.sweep_interval)).flatten(),
                deadline,
            ]
        };
        timers.into_iter().flatten().min().map_or(MAX_SLEEP, |at| at.saturating_duration_since(now).min(MAX_SLEEP))
    }

    fn given_back(&mut self, job: &Job, how: GiveBack) {
        match how {
            GiveBack::HandBack => self.report.handed_back += 1,
            GiveBack::Interrupt => self.report.interrupted += 1,
        }
        events::given_back(&self.parts.worker, job, how == GiveBack::Interrupt);
    }

    /// Counts a report or heartbeat refused, and tells it as a worker's is told (warn
    /// `lease lost`, `persevere_queue_leases_lost_total`).
    fn lease_lost(&mut self, job: &Job, error: &DeliveryError) {
        self.report.leases_lost += 1;
        crate::worker::lease_lost(job, error);
    }

    fn unreported(&mut self, job: &Job, error: &dyn core::fmt::Display) {
        self.report.unreported += 1;
        events::dropped(&self.parts.worker, job, error);
    }
}

impl StoreRetry {
    /// Ends the streak after a turn whose store calls succeeded; after an error, waits the
    /// next delay of the backoff.
    fn record(&mut self, worker: &str, result: Result<(), QueueError>) {
        match result {
            Ok(()) => {
                self.failures.reset();
                self.at = None;
            }
            Err(error) => {
                let delay = self.failures.next_delay(&self.backoff, &mut self.rng);
                self.at = Instant::now().checked_add(delay);
                events::store_error(worker, &error, Some(delay));
            }
        }
    }
}

/// When to heartbeat a job whose lease runs to `deadline` on the database's clock: once half
/// of what is left of it is gone (on this machine's monotonic clock).
fn next_beat<S: Store>(queue: &mut Queue<S>, deadline: persevere::Instant) -> Instant {
    let store = queue.store();
    let now = store.clock_estimate().or_else(|| store.now().ok());
    let left = now.map_or(Duration::ZERO, |now| deadline.saturating_duration_since(now));
    let now = Instant::now();
    now.checked_add((left / 2).max(MIN_BEAT)).unwrap_or(now)
}

/// Whether a report or return that failed with `error` may succeed if tried again: a store
/// error (the database went away), a conflict. A task that is gone or does not load will not
/// be written however often it is tried.
fn retryable(error: &QueueError) -> bool {
    !matches!(
        error,
        QueueError::Refused { .. }
            | QueueError::UnknownTask(_)
            | QueueError::Corrupt { .. }
            | QueueError::BadRow { .. }
            | QueueError::NotRedrivable { .. }
            | QueueError::QueueName(_)
            | QueueError::NotAQueue { .. }
            | QueueError::Encode(_)
    )
}

/// The runner's events and metrics (O2), each documented on [`Runner`](super::Runner).
mod events {
    use core::fmt::Display;
    use core::time::Duration;

    use crate::runner::RunReport;
    use crate::{Job, QueueError};

    pub(super) fn claimed(worker: &str, jobs: usize) {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "persevere::queue", worker, jobs, "claimed");
        #[cfg(feature = "metrics")]
        metrics::counter!("persevere_queue_claimed_total").increment(jobs as u64);
        let _ = (worker, jobs);
    }

    pub(super) fn flushed(worker: &str, reports: usize, elapsed: Duration) {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "persevere::queue", worker, reports, elapsed_ms = elapsed.as_millis() as u64, "flushed");
        #[cfg(feature = "metrics")]
        metrics::histogram!("persevere_queue_flush_reports").record(reports as f64);
        let _ = (worker, reports, elapsed);
    }

    pub(super) fn given_back(worker: &str, job: &Job, interrupted: bool) {
        #[cfg(feature = "tracing")]
        if interrupted {
            tracing::warn!(target: "persevere::queue", worker, task = job.id.0, attempt = job.attempt, "job interrupted");
        } else {
            tracing::info!(target: "persevere::queue", worker, task = job.id.0, attempt = job.attempt, "job handed back");
        }
        #[cfg(feature = "metrics")]
        if interrupted {
            metrics::counter!("persevere_queue_interrupted_total").increment(1);
        } else {
            metrics::counter!("persevere_queue_handed_back_total").increment(1);
        }
        let _ = (worker, job, interrupted);
    }

    pub(super) fn store_error(worker: &str, error: &QueueError, retry_in: Option<Duration>) {
        #[cfg(feature = "tracing")]
        tracing::warn!(
            target: "persevere::queue",
            worker,
            error = %error,
            retry_in_ms = retry_in.map(|d| d.as_millis() as u64),
            "store error"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!("persevere_queue_store_errors_total").increment(1);
        let _ = (worker, error, retry_in);
    }

    pub(super) fn dropped(worker: &str, job: &Job, error: &dyn Display) {
        #[cfg(feature = "tracing")]
        tracing::warn!(target: "persevere::queue", worker, task = job.id.0, attempt = job.attempt, error = %error, "result dropped");
        let _ = (worker, job, error);
    }

    pub(super) fn stopping(worker: &str, deadline: Option<std::time::Instant>, handed_back: usize) {
        #[cfg(feature = "tracing")]
        tracing::info!(
            target: "persevere::queue",
            worker,
            deadline_ms = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()).as_millis() as u64),
            handed_back,
            "runner stopping"
        );
        let _ = (worker, deadline, handed_back);
    }

    pub(super) fn stopped(worker: &str, report: &RunReport) {
        #[cfg(feature = "tracing")]
        tracing::info!(
            target: "persevere::queue",
            worker,
            claimed = report.claimed,
            completed = report.completed,
            failed = report.failed,
            declined = report.declined,
            handed_back = report.handed_back,
            interrupted = report.interrupted,
            leases_lost = report.leases_lost,
            unreported = report.unreported,
            "runner stopped"
        );
        let _ = (worker, report);
    }
}
