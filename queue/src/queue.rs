//! The queue: every transition decided by the task's `Delivery` machine, inside the store's
//! transaction (Q1).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use persevere::{DeliveryAction, DeliveryStatus, Failure, FreeReturn, Instant, Interruption, SplitMix64};

use crate::store::{Candidates, GuardedWrite, Insert, Row, Store, Visit, Write, declined_marker, instant_of, nanos_of};
use crate::{
    CorruptTask, Enqueued, Handled, Job, NewTask, QueueError, Status, TaskId, TaskInfo, TaskPolicy, TaskState,
};

/// How many due tasks past the ones it wants a claim looks at when some could not go to its
/// worker.
const CLAIM_WINDOW: u32 = 16;

/// How many transactions one claim takes at most to get past rows it cannot hand out: up to
/// about a hundred such rows before a job (Q10); past that, the next claim goes on.
const CLAIM_PASSES: u32 = 8;

/// A durable work queue on a [`Store`]: enqueue tasks, claim due attempts, report their ends,
/// sweep expired leases, query and re-drive. One `Queue` is one database connection; each
/// method is atomic on the store (see [`Store`] for how each database makes it so).
///
/// A row whose state or policy no longer loads (edited by hand, written by an incompatible
/// version) is set aside by the first claim or sweep that meets it, as [`Status::Corrupt`], so
/// it cannot block the tasks behind it; [`corrupt_tasks`](Self::corrupt_tasks) lists them.
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy};
/// use persevere_queue::{NewTask, Queue, Sqlite, Status};
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(2).build()?;
/// let policy = DeliveryPolicy::builder(retry).build()?;
/// let mut queue = Queue::new(Sqlite::in_memory()?);
/// let id = queue.enqueue(NewTask::new("email", "hello", policy))?.id;
///
/// let job = queue.claim("worker-1", &["email"])?.expect("a due task");
/// assert_eq!(job.attempt, 1);
/// assert_eq!(queue.fail(&job, Failure::retryable("smtp down".into()))?, Status::Pending);
///
/// let job = queue.claim("worker-1", &["email"])?.expect("the retry");
/// assert_eq!(job.attempt, 2);
/// assert_eq!(queue.complete(&job)?, Status::Completed);
/// assert_eq!(queue.task(id)?.status, Status::Completed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Queue<S> {
    store: S,
    policies: Policies,
    /// Task types each worker declined through this queue (D3): not claimed for it again.
    declined: BTreeMap<String, BTreeSet<String>>,
    /// The jobs this queue handed out (or heartbeated) and has not seen reported: the row as
    /// this queue last wrote it, so that a completion needs no read (see
    /// [`complete`](Self::complete)).
    held: HashMap<i64, Held>,
    /// Whether a task's row stays once it is completed, proceeded or diverted (until
    /// [`prune`](Self::prune)), or goes with the write that finishes it.
    keep_finished: bool,
}

/// Reports decided on the clock estimate ([`Queue::decide_reports`]): the guarded writes to
/// make, and for each, the report's index, where its task goes and what finished.
#[derive(Debug, Default)]
pub(crate) struct HeldReports {
    pub(crate) writes: Vec<GuardedWrite>,
    decided: Vec<(usize, Status, Finished)>,
}

/// A job's row as the queue last wrote it: the version the write left and the state it wrote.
#[derive(Debug)]
struct Held {
    version: i64,
    policy: TaskPolicy,
    state: TaskState,
}

/// How many held jobs a queue keeps at most: jobs dropped without a report would otherwise
/// accumulate. Past it they are forgotten, and their reports read their rows. (A runner holds
/// at most its handlers and its buffer.)
const MAX_HELD: usize = 4096;

/// The last policy decoded: tasks of one producer mostly share one, so most rows skip
/// decoding (and re-validating) it.
#[derive(Debug, Default)]
struct Policies {
    last: Option<(String, TaskPolicy)>,
}

impl Policies {
    /// The row's policy and state, or why they do not load.
    fn load(&mut self, row: &Row) -> Result<(TaskPolicy, TaskState), QueueError> {
        let task = TaskId(row.id);
        let policy =
            match &self.last {
                Some((json, policy)) if *json == row.policy => policy.clone(),
                _ => {
                    let policy: TaskPolicy = serde_json::from_str(&row.policy)
                        .map_err(|source| QueueError::Corrupt { task, what: "policy", source })?;
                    self.last = Some((row.policy.clone(), policy.clone()));
                    policy
                }
            };
        let state = state_of(row, &policy)?;
        Ok((policy, state))
    }
}

/// A task's state as the row holds it, or the fresh one of a row no claim has visited.
fn state_of(row: &Row, policy: &TaskPolicy) -> Result<TaskState, QueueError> {
    let bad = |reason: String| QueueError::BadRow { task: TaskId(row.id), reason };
    if row.state.is_empty() {
        // Only a row no claim has written (version 0) has no state: an emptied state of a
        // claimed row must not read as a fresh task, or attempt 1 would run again (D2).
        if row.version != 0 {
            return Err(bad(format!("its state is empty, but the row was written {} times", row.version)));
        }
        let created = instant_of(row.created_at)
            .map_err(|_| bad(format!("its created_at is {} ns since 1970, before 1970", row.created_at)))?;
        return Ok(fresh_state(policy, created));
    }
    serde_json::from_str(&row.state).map_err(|source| QueueError::Corrupt {
        task: TaskId(row.id),
        what: "state",
        source,
    })
}

/// A task created at `now`, drained: attempt 1 is pending.
fn fresh_state(policy: &TaskPolicy, now: Instant) -> TaskState {
    let mut state = TaskState::new(policy, now, (), 1);
    // A fresh task makes no `Finish`.
    drain(&mut state, 0, &mut Finished::default());
    state
}

fn write_of(state: &TaskState, now: Instant) -> Result<Write, QueueError> {
    let due = match state.status() {
        DeliveryStatus::Pending { not_before, .. } => Some(not_before.unwrap_or(now)),
        DeliveryStatus::HandedOut { deadline, .. } => Some(*deadline),
        DeliveryStatus::Running { heartbeat_deadline, .. } => Some(*heartbeat_deadline),
        DeliveryStatus::Done(_) => None,
    };
    Ok(Write {
        state: serde_json::to_string(state).map_err(QueueError::Encode)?,
        status: Status::of(state.status()),
        due_at: due.map(nanos_of),
        attempt: i64::try_from(state.attempt()).unwrap_or(i64::MAX),
        declined_by: state.declined_workers().map(|w| declined_marker(w)).collect(),
    })
}

/// How far ahead of the database's clock a loaded state's instants may be, beyond what its
/// policy allows: further, and the row was edited (or written under a clock that jumped), so
/// it is set aside rather than parked until then (Q10).
const MAX_AHEAD: Duration = Duration::from_nanos(crate::store::FAR_AHEAD_NS as u64);

/// Why a loaded row cannot be driven at `now` although it decoded (Q10): an instant further
/// ahead of the database's clock than its policy allows, or an attempt number past what the
/// queue stores.
fn implausible(policy: &TaskPolicy, state: &TaskState, now: Instant) -> Option<String> {
    let ahead = |limit: Duration| now.checked_add(limit.saturating_add(MAX_AHEAD)).unwrap_or(Instant::MAX);
    let (what, at, limit) = match state.status() {
        DeliveryStatus::HandedOut { deadline, .. } => ("start lease", *deadline, ahead(policy.start_timeout())),
        DeliveryStatus::Running { heartbeat_deadline, .. } => {
            ("heartbeat deadline", *heartbeat_deadline, ahead(policy.heartbeat_timeout()))
        }
        _ => ("last input", state.now(), ahead(Duration::ZERO)),
    };
    if at > limit {
        return Some(format!(
            "its {what} is at {} ns, past {} ns (the database clock reads {} ns): the row was edited or written \
             under another clock",
            at.as_nanos(),
            limit.as_nanos(),
            now.as_nanos()
        ));
    }
    if i64::try_from(state.attempt()).is_err() {
        return Some(format!("its attempt number {} is past the largest the queue stores", state.attempt()));
    }
    None
}

/// Where a row's columns disagree with its state (edited by hand: a due row that can never be
/// handed out, or a row with no due instant): the write that repairs them (Q10).
fn repair(row: &Row, state: &TaskState, now: Instant) -> Result<Option<Write>, QueueError> {
    let write = write_of(state, now)?;
    Ok((write.due_at != row.due_at).then_some(write))
}

/// The jitter source of one decision: seeded by the task, attempt and clock, so a decision
/// replays exactly from the row it was made on.
fn rng_for(id: i64, attempt: u64, now: Instant) -> SplitMix64 {
    SplitMix64::new((id as u64).rotate_left(32) ^ attempt ^ now.as_nanos())
}

/// Drains the machine's actions; returns how many there were and the hand-out, if any. The
/// others (`Revoke`, `Ready`, `Finish`) are all visible in the state that is written; a
/// `Finish` is also noted in `finished`, to be told once the write has committed.
fn drain(
    state: &mut TaskState,
    id: i64,
    finished: &mut Finished,
) -> (usize, Option<persevere::HandOut<(), String, String>>) {
    let mut count = 0;
    let mut hand_out = None;
    while let Some(action) = state.poll_action() {
        count += 1;
        match action {
            DeliveryAction::HandOut(out) => hand_out = Some(out),
            DeliveryAction::Finish(_) => finished.note(id, state),
            _ => {}
        }
    }
    (count, hand_out)
}

/// The tasks that reached a terminal state (D9) in one store call, told to the log and the
/// metrics (O2) only once the call has committed: a call that fails tells nothing, and a visit
/// the store runs again (a row whose version moved) decides again, replacing its note.
#[derive(Debug, Default)]
struct Finished(BTreeMap<i64, (Status, u64)>);

impl Finished {
    /// A visit of row `id` starts: what an earlier run of it noted is void.
    fn forget(&mut self, id: i64) {
        self.0.remove(&id);
    }

    /// Without `tracing` or `metrics` nobody is told: nothing is kept.
    fn note(&mut self, id: i64, state: &TaskState) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        self.0.insert(id, (Status::of(state.status()), state.attempt()));
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        let _ = (id, state);
    }

    /// Logs each (target `persevere::queue`, `task finished`) and counts it
    /// (`persevere_tasks_finished_total{status}`, and `persevere_dead_letters_total`).
    fn tell(self) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        for (id, (status, attempt)) in self.0 {
            #[cfg(feature = "tracing")]
            tracing::info!(target: "persevere::queue", task = id, status = status.as_str(), attempt, "task finished");
            #[cfg(feature = "metrics")]
            {
                metrics::counter!("persevere_tasks_finished_total", "status" => status.as_str()).increment(1);
                if status == Status::DeadLettered {
                    metrics::counter!("persevere_dead_letters_total").increment(1);
                }
            }
            let _ = (id, attempt);
        }
    }
}

fn idempotency_key(id: i64, state: &TaskState) -> String {
    format!("{id}:{}", state.idempotency_key().step_execution)
}

/// Decides `report` on `job` over its task's `state`, loaded at `now` (the database's clock, or
/// the store's estimate of it): returns where the task now is (with its heartbeat deadline
/// while it runs) or why the report is refused, and whether the state changed (a refused
/// report changes nothing, but a lease found run out on the way is kept).
fn decide(
    policy: &TaskPolicy,
    state: &mut TaskState,
    now: Instant,
    job: &Job,
    report: &Report,
    finished: &mut Finished,
) -> (Result<(Status, Option<Instant>), QueueError>, bool) {
    let (id, attempt) = (job.id.0, job.attempt);
    // The deadline is checked first: a lease that has run out is interrupted before the report
    // is looked at, and the report is refused.
    state.handle_timeout(policy, now, &mut rng_for(id, state.attempt(), now));
    let (timed_out, _) = drain(state, id, finished);
    let refused = |error| QueueError::Refused { task: job.id, error };
    // In `Async` durability the claim's commit is the start's persistence.
    let result = state.handle_persisted(now, attempt).map_err(refused).and_then(|()| match report {
        Report::Heartbeat(checkpoint) => {
            state.handle_heartbeat(policy, now, attempt, &job.worker, checkpoint.clone()).map_err(|r| refused(r.error))
        }
        Report::Complete => state.handle_success(now, attempt, &job.worker).map_err(refused),
        Report::Fail(failure) => {
            let mut rng = rng_for(id, attempt, now);
            state
                .handle_failure(policy, now, attempt, &job.worker, failure.clone(), &mut rng)
                .map_err(|r| refused(r.error))
        }
        Report::Decline => {
            state.handle_returned(policy, now, attempt, &job.worker, FreeReturn::Declined).map_err(refused)
        }
        Report::HandBack => {
            state.handle_returned(policy, now, attempt, &job.worker, FreeReturn::ClosedBeforeStart).map_err(refused)
        }
        Report::Interrupt => {
            let mut rng = rng_for(id, attempt, now);
            state
                .handle_interrupted(policy, now, attempt, &job.worker, Interruption::Disconnected, &mut rng)
                .map_err(refused)
        }
    });
    drain(state, id, finished);
    let deadline = match state.status() {
        DeliveryStatus::Running { heartbeat_deadline, .. } => Some(*heartbeat_deadline),
        _ => None,
    };
    let changed = result.is_ok() || timed_out > 0;
    (result.map(|()| (Status::of(state.status()), deadline)), changed)
}

/// One report on a job.
enum Report {
    Heartbeat(Option<String>),
    Complete,
    Fail(Failure<String>),
    Decline,
    HandBack,
    Interrupt,
}

impl Report {
    fn of(handled: &Handled) -> Report {
        match handled {
            Handled::Completed => Report::Complete,
            Handled::Failed(failure) => Report::Fail(failure.clone()),
            Handled::Declined => Report::Decline,
        }
    }
}

/// The row of a new task. Its state is built from the row's `created_at` when a claim first
/// loads it, so the insert is one statement that reads the clock itself (no round trip before it).
fn insert_of(task: NewTask) -> Result<Insert, QueueError> {
    let policy_json = serde_json::to_string(&task.policy).map_err(QueueError::Encode)?;
    let NewTask { task_type, payload, policy, delay, run_at, key } = task;
    let fresh = fresh_state(&policy, Instant::ZERO);
    Ok(Insert {
        task_type,
        payload,
        policy: policy_json,
        key,
        status: Status::of(fresh.status()),
        attempt: i64::try_from(fresh.attempt()).unwrap_or(i64::MAX),
        delay_ns: i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX),
        // Before 1970: no bound; past 2262: the end of the clock.
        not_before: run_at.map_or(0, |at| {
            at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        }),
    })
}

impl<S: Store> Queue<S> {
    /// A queue on `store`.
    pub fn new(store: S) -> Self {
        Queue {
            store,
            policies: Policies::default(),
            declined: BTreeMap::new(),
            held: HashMap::new(),
            keep_finished: true,
        }
    }

    /// Whether a completed, proceeded or diverted task's row stays in the store (the default:
    /// [`task`](Self::task) shows it, and its idempotency key keeps deduplicating, until
    /// [`prune`](Self::prune) deletes it), or goes at once, as graphile-worker's completed jobs
    /// do. With `false`, a completion of a job this queue holds deletes the row in the
    /// statement that would have written it (the same guards: version and lease), so a task
    /// costs one write less; the row of a task finished otherwise (on a fresh read, after a
    /// lost lease) stays until `prune`. Failed and dead-lettered tasks always stay (Q6).
    /// A [`Runner`](crate::Runner) with a retention of zero sets `false`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use persevere_queue::{Queue, Sqlite};
    /// let mut queue = Queue::new(Sqlite::in_memory()?);
    /// queue.keep_finished(false);
    /// # }
    /// # Ok::<(), persevere_queue::QueueError>(())
    /// ```
    pub fn keep_finished(&mut self, keep: bool) -> &mut Self {
        self.keep_finished = keep;
        self
    }

    /// The store, for queries of your own.
    pub fn store(&mut self) -> &mut S {
        &mut self.store
    }

    /// Adds a task, due at once or after its delay; with an idempotency key that exists,
    /// returns the existing task instead (Q5).
    ///
    /// # Errors
    /// When the store fails.
    pub fn enqueue(&mut self, task: NewTask) -> Result<Enqueued, QueueError> {
        let (id, created) = self.store.insert(&insert_of(task)?)?;
        Ok(Enqueued { id: TaskId(id), created })
    }

    /// Adds many tasks in one transaction (Q7): all of them or, on an error, none. Returns
    /// what [`enqueue`](Self::enqueue) would for each, in order; a key given twice in one batch
    /// names one task.
    ///
    /// # Errors
    /// When the store fails; then nothing was added.
    pub fn enqueue_batch(&mut self, tasks: Vec<NewTask>) -> Result<Vec<Enqueued>, QueueError> {
        let inserts = tasks.into_iter().map(insert_of).collect::<Result<Vec<_>, _>>()?;
        let ids = self.store.insert_batch(&inserts)?;
        Ok(ids.into_iter().map(|(id, created)| Enqueued { id: TaskId(id), created }).collect())
    }

    /// Leases one due attempt of one of `types` to `worker`: a pending task past its retry
    /// delay, or a task whose lease expired (which is interrupted first, consuming a retry:
    /// D2). `None` when nothing is due for this worker: tasks it declined are not claimed for
    /// it (Q10). Expired leases met on the way are interrupted, and rows that cannot be driven
    /// are set aside (see [`corrupt_tasks`](Self::corrupt_tasks)), even if no job is claimed;
    /// a claim looks past up to about a hundred such rows.
    ///
    /// # Errors
    /// When the store fails.
    pub fn claim(&mut self, worker: &str, types: &[&str]) -> Result<Option<Job>, QueueError> {
        Ok(self.claim_batch(worker, types, 1)?.pop())
    }

    /// Leases up to `max` due attempts of `types` to `worker` in one transaction (Q7), oldest
    /// first: each task is decided exactly as [`claim`](Self::claim) decides one, and every row
    /// is written back before the commit. Empty when nothing is due for this worker. Each job's
    /// start lease runs from the claim: run it, heartbeat it or hand it back before
    /// [`Job::deadline`].
    ///
    /// # Errors
    /// When the store fails; then no job was handed out.
    pub fn claim_batch(&mut self, worker: &str, types: &[&str], max: u32) -> Result<Vec<Job>, QueueError> {
        let declined = self.declined.get(worker);
        let wanted: Vec<&str> = types.iter().copied().filter(|t| declined.is_none_or(|d| !d.contains(*t))).collect();
        if wanted.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        // The oldest due tasks first (on PostgreSQL every candidate is locked). While rows are
        // passed over (set aside, repaired, or not for this worker), look again with a window
        // wide enough to reach past them, a bounded number of times.
        let mut jobs = Vec::new();
        let mut window = max;
        for _ in 0..CLAIM_PASSES {
            let rest = max - jobs.len() as u32;
            let (claimed, passed_over) = self.claim_within(worker, &wanted, rest, window)?;
            jobs.extend(claimed);
            if jobs.len() >= max as usize || !passed_over {
                break;
            }
            window = (max - jobs.len() as u32).saturating_add(CLAIM_WINDOW);
        }
        Ok(jobs)
    }

    /// Claims up to `max` jobs among the `window` oldest due tasks; also says whether one was
    /// passed over.
    fn claim_within(
        &mut self,
        worker: &str,
        types: &[&str],
        max: u32,
        window: u32,
    ) -> Result<(Vec<Job>, bool), QueueError> {
        let mut jobs = Vec::new();
        let mut held = Vec::new();
        let mut passed_over = false;
        let mut finished = Finished::default();
        let policies = &mut self.policies;
        let written = self.store.claim(Candidates::Due { types, worker }, window, &mut |now, row| {
            finished.forget(row.id);
            let (policy, mut state) = match load_plausible(policies, row, now) {
                Ok(loaded) => loaded,
                Err(error) => {
                    passed_over = true;
                    return Ok(Visit::SetAside(error.to_string()));
                }
            };
            state.handle_timeout(&policy, now, &mut rng_for(row.id, state.attempt(), now));
            let (changed, _) = drain(&mut state, row.id, &mut finished);
            let worker = worker.to_owned();
            if !state.can_hand_out(now, &worker) {
                passed_over = true;
                if changed > 0 {
                    return Ok(Visit::Write(write_of(&state, now)?));
                }
                return Ok(repair(row, &state, now)?.map_or(Visit::Skip, Visit::Write));
            }
            if let Err(refused) = state.handle_hand_out(&policy, now, worker) {
                return Err(QueueError::Refused { task: TaskId(row.id), error: refused.error });
            }
            let (_, Some(out)) = drain(&mut state, row.id, &mut finished) else {
                return Ok(Visit::Skip);
            };
            jobs.push(Job {
                id: TaskId(row.id),
                task_type: row.task_type.clone(),
                payload: row.payload.clone(),
                attempt: out.attempt,
                idempotency_key: idempotency_key(row.id, &state),
                checkpoint: out.checkpoint,
                deadline: out.deadline,
                worker: out.worker,
            });
            let write = write_of(&state, now)?;
            held.push(Held { version: row.version.saturating_add(1), policy, state });
            Ok(if jobs.len() >= max as usize { Visit::WriteAndStop(write) } else { Visit::Write(write) })
        })?;
        finished.tell();
        for (job, held) in jobs.iter().zip(held) {
            self.hold(job.id, held);
        }
        // A row the store set aside without a visit (its cells do not decode) was passed over too.
        let passed_over = passed_over || written > jobs.len();
        Ok((jobs, passed_over))
    }

    /// Extends `job`'s lease to `heartbeat_timeout` from now on the database's clock and
    /// returns the new deadline; with a checkpoint, stores it for the next attempt (D7, last
    /// write wins). The first heartbeat starts the attempt: from then on it can no longer be
    /// declined.
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost: stop working on the job.
    pub fn heartbeat(&mut self, job: &Job, checkpoint: Option<String>) -> Result<Instant, QueueError> {
        self.report(job, Report::Heartbeat(checkpoint)).map(|(_, deadline)| deadline.unwrap_or(job.deadline))
    }

    /// `job` succeeded: its task is [`Status::Completed`].
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost (another attempt owns the task).
    ///
    /// A job this queue claimed (or last heartbeated) completes in one statement: decided on
    /// the store's [`clock_estimate`](Store::clock_estimate) from the state this queue wrote,
    /// and written only if the row still has the version that write left and the lease is
    /// still ahead of the database's clock (Q1, Q2). Otherwise it reads the row and decides
    /// on the database's clock, as every other report does. [`fail`](Self::fail) does the same
    /// when the failure ends the task.
    pub fn complete(&mut self, job: &Job) -> Result<Status, QueueError> {
        self.report_one(job, Report::Complete)
    }

    /// Reports the ends of many jobs at once (Q7): the reports that end a task this queue holds
    /// (completions, last failures) are decided on the clock estimate and written in one
    /// guarded statement (see [`complete`](Self::complete)); the others (a retry to schedule,
    /// a decline), and any whose guard failed, are reported one by one on a fresh read. Returns each job's result in order: where its task now is, or why
    /// its report was refused (most often a lost lease).
    ///
    /// # Errors
    /// When the store fails. Reports written before the failure stay written; the others were
    /// not, and their attempts are interrupted when their leases run out (D2).
    pub fn report_batch(&mut self, reports: &[(Job, Handled)]) -> Result<Vec<Result<Status, QueueError>>, QueueError> {
        let held = self.decide_reports(reports)?;
        let applied =
            if held.writes.is_empty() { Vec::new() } else { self.store.write_batch_if_leased(&held.writes)? };
        Ok(self.settle_reports(reports, held, &applied))
    }

    /// The first half of [`report_batch`](Self::report_batch): decides the reports that end a
    /// task this queue holds on the clock estimate, into guarded writes that any connection to
    /// this queue's store can make ([`Store::write_batch_if_leased`]); the runner makes them on a
    /// second connection while this one claims.
    pub(crate) fn decide_reports(&mut self, reports: &[(Job, Handled)]) -> Result<HeldReports, QueueError> {
        let mut held = HeldReports::default();
        for (index, (job, handled)) in reports.iter().enumerate() {
            if matches!(handled, Handled::Declined) {
                continue;
            }
            if let Some((write, version, status, finished)) = self.decide_held(job, &Report::of(handled))? {
                let delete = self.deletes(status);
                held.writes.push(GuardedWrite { id: job.id.0, version, write, delete });
                held.decided.push((index, status, finished));
            }
        }
        Ok(held)
    }

    /// The second half of [`report_batch`](Self::report_batch), once `applied` tells which of
    /// `held`'s writes applied: the others, and the reports not decided on the estimate, are
    /// reported one by one on a fresh read. Each report's result, in order.
    pub(crate) fn settle_reports(
        &mut self,
        reports: &[(Job, Handled)],
        held: HeldReports,
        applied: &[bool],
    ) -> Vec<Result<Status, QueueError>> {
        let mut results: Vec<Option<Result<Status, QueueError>>> = reports.iter().map(|_| None).collect();
        for ((index, status, finished), applied) in held.decided.into_iter().zip(applied) {
            if *applied {
                finished.tell();
                results[index] = Some(Ok(status));
            }
        }
        for ((job, handled), result) in reports.iter().zip(&mut results) {
            if result.is_none() {
                *result = Some(self.report_handled(job, handled));
            }
        }
        results.into_iter().flatten().collect()
    }

    /// Reports `handled` on `job` on its own: what [`Worker::work_one`](crate::Worker::work_one)
    /// does with a handler's result. A store failure and a refusal are both `Err`.
    fn report_handled(&mut self, job: &Job, handled: &Handled) -> Result<Status, QueueError> {
        match handled {
            Handled::Declined => self.decline(job),
            handled => self.report_one(job, Report::of(handled)),
        }
    }

    /// A report decided on the clock estimate and written with one guarded statement when this
    /// queue holds the job; on a fresh read otherwise.
    fn report_one(&mut self, job: &Job, report: Report) -> Result<Status, QueueError> {
        if let Some((write, version, status, finished)) = self.decide_held(job, &report)?
            && self.store.write_if_leased(&GuardedWrite {
                id: job.id.0,
                version,
                write,
                delete: self.deletes(status),
            })?
        {
            finished.tell();
            return Ok(status);
        }
        self.report(job, report).map(|(status, _)| status)
    }

    /// Decides `report` on a job this queue holds, on the store's clock estimate: the write,
    /// the version it must find, where the task goes and what finished. `None` when the queue
    /// does not hold the job, the estimate refuses the report, or the task would not end (a
    /// heartbeat's lease, a retry's due time: those instants are read from the database's
    /// clock, Q2); the queue forgets the job either way.
    fn decide_held(
        &mut self,
        job: &Job,
        report: &Report,
    ) -> Result<Option<(Write, i64, Status, Finished)>, QueueError> {
        let Some(Held { version, policy, mut state }) = self.held.remove(&job.id.0) else { return Ok(None) };
        if matches!(report, Report::Heartbeat(_)) {
            return Ok(None);
        }
        let Some(now) = self.store.clock_estimate() else { return Ok(None) };
        let mut finished = Finished::default();
        let (Ok((status, _)), true) = decide(&policy, &mut state, now, job, report, &mut finished) else {
            return Ok(None);
        };
        // Only a report that ends the task is written on the estimate: an instant it would set
        // (a retry's due time) is read from the database's clock (Q2).
        if !status.is_terminal() {
            return Ok(None);
        }
        Ok(Some((write_of(&state, now)?, version, status, finished)))
    }

    /// Whether a guarded write that leaves the task `status` deletes its row instead
    /// ([`keep_finished`](Self::keep_finished)).
    fn deletes(&self, status: Status) -> bool {
        !self.keep_finished && matches!(status, Status::Completed | Status::Proceeded | Status::Diverted)
    }

    /// Keeps `held` as job `id`'s row while its attempt is out.
    fn hold(&mut self, id: TaskId, held: Held) {
        if !matches!(held.state.status(), DeliveryStatus::HandedOut { .. } | DeliveryStatus::Running { .. }) {
            return;
        }
        if self.held.len() >= MAX_HELD {
            self.held.clear();
        }
        self.held.insert(id.0, held);
    }

    /// `job` failed: a retry is scheduled by the task's retry policy, or retries end and its
    /// failure policy decides (D8). Returns where the task now is.
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost.
    pub fn fail(&mut self, job: &Job, failure: Failure<String>) -> Result<Status, QueueError> {
        self.report_one(job, Report::Fail(failure))
    }

    /// Gives back a job this worker claimed but never started (it is shutting down, or kept the
    /// job in a local buffer too long): a free return that uses no retry and keeps the attempt
    /// number (D3, `FreeReturn::ClosedBeforeStart`); past `max_redeliveries` free returns the
    /// task is dead-lettered (D4).
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost, or
    /// [`AlreadyStarted`](persevere::DeliveryError::AlreadyStarted) once the job heartbeated:
    /// use [`interrupt`](Self::interrupt).
    pub fn hand_back(&mut self, job: &Job) -> Result<Status, QueueError> {
        self.report_one(job, Report::HandBack)
    }

    /// Gives back a job whose handler may have run but did not finish (a shutdown whose
    /// deadline passed): an interruption that uses a retry, as a lost lease would (D2), without
    /// waiting for the lease to run out.
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost.
    pub fn interrupt(&mut self, job: &Job) -> Result<Status, QueueError> {
        self.report_one(job, Report::Interrupt)
    }

    /// The worker does not run `job`'s task type and did not start it (D3): the task goes back
    /// to pending without using a retry, keeping its attempt number, and is dead-lettered past
    /// `max_redeliveries` free returns (D4). This queue claims no task of that type for that
    /// worker again.
    ///
    /// # Errors
    /// [`QueueError::Refused`] when the lease was lost, or
    /// [`AlreadyStarted`](persevere::DeliveryError::AlreadyStarted) when the worker already
    /// heartbeated (a started attempt can only complete or fail).
    pub fn decline(&mut self, job: &Job) -> Result<Status, QueueError> {
        let (status, _) = self.report(job, Report::Decline)?;
        self.declined.entry(job.worker.clone()).or_default().insert(job.task_type.clone());
        Ok(status)
    }

    /// Applies `report`; returns where the task now is and, while it runs, its lease deadline.
    fn report(&mut self, job: &Job, report: Report) -> Result<(Status, Option<Instant>), QueueError> {
        // Whatever happens, the row is no longer the one this queue held.
        self.held.remove(&job.id.0);
        let mut outcome = Err(QueueError::UnknownTask(job.id));
        let mut written = None;
        let mut finished = Finished::default();
        let policies = &mut self.policies;
        // The closure may run more than once (a store that re-reads a row whose version moved
        // decides again), so it clones what it hands the machine.
        let found = self.store.update(job.id.0, &mut |now, row| {
            finished.forget(row.id);
            let (policy, mut state) = policies.load(row)?;
            let (result, changed) = decide(&policy, &mut state, now, job, &report, &mut finished);
            outcome = result;
            if !changed {
                written = None;
                return Ok(None);
            }
            let write = write_of(&state, now)?;
            written = Some(Held { version: row.version.saturating_add(1), policy, state });
            Ok(Some(write))
        })?;
        if !found {
            // The row went away between a visit and its write (deleted by someone else): what
            // that visit noted was never written.
            return Err(QueueError::UnknownTask(job.id));
        }
        finished.tell();
        if let (Ok(_), Some(held)) = (&outcome, written) {
            self.hold(job.id, held);
        }
        outcome
    }

    /// Interrupts every attempt whose lease or heartbeat deadline has passed (D2: each uses a
    /// retry, or ends retries), and repairs unfinished rows with no due instant (edited by
    /// hand: Q10), looking at up to `limit` of them; returns how many rows it wrote (a row that
    /// does not load is set aside as [`Status::Corrupt`]). Claims do this for the types they
    /// ask for; a sweep does it for every type.
    ///
    /// # Errors
    /// When the store fails or a row does not load.
    pub fn sweep(&mut self, limit: u32) -> Result<usize, QueueError> {
        let mut finished = Finished::default();
        let policies = &mut self.policies;
        let written = self.store.claim(Candidates::Expired, limit, &mut |now, row| {
            finished.forget(row.id);
            let (policy, mut state) = match load_plausible(policies, row, now) {
                Ok(loaded) => loaded,
                Err(error) => return Ok(Visit::SetAside(error.to_string())),
            };
            state.handle_timeout(&policy, now, &mut rng_for(row.id, state.attempt(), now));
            let (changed, _) = drain(&mut state, row.id, &mut finished);
            if changed > 0 {
                return Ok(Visit::Write(write_of(&state, now)?));
            }
            Ok(repair(row, &state, now)?.map_or(Visit::Skip, Visit::Write))
        })?;
        finished.tell();
        Ok(written)
    }

    /// Task `id`.
    ///
    /// # Errors
    /// [`QueueError::UnknownTask`] if there is none.
    pub fn task(&mut self, id: TaskId) -> Result<TaskInfo, QueueError> {
        let row = self.store.get(id.0)?.ok_or(QueueError::UnknownTask(id))?;
        info_of(&mut self.policies, row)
    }

    /// Up to `limit` tasks in `status`, oldest first: [`Status::Failed`] and
    /// [`Status::DeadLettered`] are the ones a person looks at (Q6). For
    /// [`Status::Corrupt`], see [`corrupt_tasks`](Self::corrupt_tasks).
    ///
    /// # Errors
    /// When the store fails, or [`QueueError::Corrupt`] naming a listed row whose state or
    /// policy does not load.
    pub fn tasks(&mut self, status: Status, limit: u32) -> Result<Vec<TaskInfo>, QueueError> {
        let rows = self.store.list(status, limit)?;
        rows.into_iter().map(|row| info_of(&mut self.policies, row)).collect()
    }

    /// Up to `limit` rows set aside because their state or policy does not load, with why.
    /// Repair one by writing a state that loads (or delete it) by hand.
    ///
    /// # Errors
    /// When the store fails.
    pub fn corrupt_tasks(&mut self, limit: u32) -> Result<Vec<CorruptTask>, QueueError> {
        let rows = self.store.set_aside_rows(limit)?;
        Ok(rows
            .into_iter()
            .map(|row| CorruptTask {
                id: TaskId(row.id),
                task_type: row.task_type,
                state: row.state,
                error: row.reason,
            })
            .collect())
    }

    /// Deletes up to `limit` tasks that completed, proceeded or were diverted more than `age`
    /// ago on the database's clock (as River's job cleaner does), so the table and its vacuum
    /// work stay bounded; returns how many. Failed and dead-lettered tasks are kept until a
    /// person re-drives or deletes them (Q6). A pruned task's idempotency key is free again.
    ///
    /// # Errors
    /// When the store fails.
    pub fn prune(&mut self, age: Duration, limit: u32) -> Result<usize, QueueError> {
        let now = self.store.now()?;
        let before = now.as_nanos().saturating_sub(u64::try_from(age.as_nanos()).unwrap_or(u64::MAX));
        self.store.prune(i64::try_from(before).unwrap_or(i64::MAX), limit)
    }

    /// Runs a failed or dead-lettered task again (Q6): a new execution of it, pending at once,
    /// with attempt numbers, retries and free returns counted afresh under its policy and a new
    /// step execution id (so a new [`Job::idempotency_key`]), and no checkpoint.
    ///
    /// # Errors
    /// [`QueueError::NotRedrivable`] for any other status; [`QueueError::UnknownTask`].
    pub fn redrive(&mut self, id: TaskId) -> Result<(), QueueError> {
        let policies = &mut self.policies;
        let found = self.store.update(id.0, &mut |now, row| {
            let (policy, state) = policies.load(row)?;
            let status = Status::of(state.status());
            if !matches!(status, Status::Failed | Status::DeadLettered) {
                return Err(QueueError::NotRedrivable { task: id, status });
            }
            let step = state.idempotency_key().step_execution.saturating_add(1);
            let mut fresh = TaskState::new(&policy, now, (), step);
            drain(&mut fresh, row.id, &mut Finished::default());
            write_of(&fresh, now).map(Some)
        })?;
        if found { Ok(()) } else { Err(QueueError::UnknownTask(id)) }
    }

    /// Moves this connection's reading of the database clock forward, for tests and
    /// simulations that must not sleep through leases and retry delays (feature `test-clock`;
    /// see [`Store::advance_clock`]). Never in production: a connection that reads a skewed
    /// clock decides with it (Q2).
    #[cfg(feature = "test-clock")]
    pub fn advance_clock(&mut self, by: core::time::Duration) {
        self.store.advance_clock(by);
    }
}

/// The row's policy and state, refused when they do not load or are implausible at `now`.
fn load_plausible(policies: &mut Policies, row: &Row, now: Instant) -> Result<(TaskPolicy, TaskState), QueueError> {
    let (policy, state) = policies.load(row)?;
    match implausible(&policy, &state, now) {
        Some(reason) => Err(QueueError::BadRow { task: TaskId(row.id), reason }),
        None => Ok((policy, state)),
    }
}

fn info_of(policies: &mut Policies, row: Row) -> Result<TaskInfo, QueueError> {
    let (_, state) = policies.load(&row)?;
    Ok(TaskInfo {
        id: TaskId(row.id),
        task_type: row.task_type,
        payload: row.payload,
        status: Status::of(state.status()),
        key: row.key,
        due_at: row.due_at.and_then(|at| instant_of(at).ok()),
        state,
    })
}
