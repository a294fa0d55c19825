//! Q8, the runner: N handlers at once on a local buffer, heartbeats while they run, wake-ups
//! without polling, and a graceful shutdown with a deadline, on SQLite and PostgreSQL alike
//! (see `common/mod.rs` for the latter).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Db, policy};
use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
use persevere_queue::{Handled, Job, NewTask, RunReport, Runner, RunnerBuilder, ShutdownHandle, Status, TaskId};

/// Starts `runner` with `handler` on a thread of its own.
fn start<D: Db>(
    runner: RunnerBuilder<D::S>,
    handler: impl Fn(&Job) -> Handled + Send + Sync + 'static,
) -> (ShutdownHandle, JoinHandle<RunReport>) {
    let runner = runner.build();
    let stop = runner.shutdown_handle();
    (stop, std::thread::spawn(move || runner.run_blocking(handler)))
}

/// The run's report, checked to account for every job it claimed exactly once.
fn joined(run: JoinHandle<RunReport>) -> RunReport {
    let report = run.join().unwrap();
    let RunReport { claimed, completed, failed, declined, handed_back, interrupted, leases_lost, unreported, .. } =
        report.clone();
    let accounted = completed + failed + declined + handed_back + interrupted + leases_lost + unreported;
    assert_eq!(claimed, accounted, "every job claimed is counted once: {report:?}");
    report
}

/// Waits up to `limit` for `done`.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Who ran what, and how many handlers ran at once at most.
#[derive(Default)]
struct Log {
    ran: Mutex<Vec<(TaskId, u64)>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

impl Log {
    fn enter(&self, job: &Job) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        self.ran.lock().unwrap().push((job.id, job.attempt));
    }

    fn leave(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    fn count(&self) -> usize {
        self.ran.lock().unwrap().len()
    }

    /// Checks that each of `ids` ran once, at attempt 1, and nothing else ran.
    fn each_once(&self, ids: &[TaskId]) {
        let mut runs: BTreeMap<TaskId, Vec<u64>> = BTreeMap::new();
        for (id, attempt) in self.ran.lock().unwrap().iter() {
            runs.entry(*id).or_default().push(*attempt);
        }
        assert_eq!(runs.len(), ids.len(), "every task ran");
        for id in ids {
            assert_eq!(runs.get(id).map(Vec::as_slice), Some(&[1][..]), "task {id} ran once");
        }
    }
}

const TASKS: usize = 120;

/// Half the tasks are there before the runner starts, half come while it runs.
fn enqueue_in_two_halves<D: Db>(db: &D, during: impl FnOnce()) -> Vec<TaskId> {
    let mut producer = db.queue();
    let batch = |from: usize| (from..from + TASKS / 2).map(|i| NewTask::new("t", format!("{i}"), policy(3))).collect();
    let mut ids: Vec<TaskId> = producer.enqueue_batch(batch(0)).unwrap().into_iter().map(|e| e.id).collect();
    during();
    ids.extend(producer.enqueue_batch(batch(TASKS / 2)).unwrap().into_iter().map(|e| e.id));
    ids
}

fn q8_a_runner_runs_every_task_once_four_at_a_time<D: Db>(db: &D) {
    let log = Arc::new(Log::default());
    let mut ids = Vec::new();
    let mut run = None;
    let handler_log = log.clone();
    ids.extend(enqueue_in_two_halves(db, || {
        run = Some(start::<D>(Runner::builder(db.queue(), "w", &["t"]).concurrency(4), move |job| {
            handler_log.enter(job);
            std::thread::sleep(Duration::from_millis(2));
            handler_log.leave();
            Handled::Completed
        }));
    }));
    let (stop, run) = run.unwrap();
    assert!(wait_until(Duration::from_secs(30), || log.count() >= TASKS), "ran {} of {TASKS}", log.count());
    stop.shutdown(Duration::from_secs(10));
    let report = joined(run);
    assert_eq!((report.claimed, report.completed), (TASKS as u64, TASKS as u64), "{report:?}");
    assert_eq!((report.handed_back, report.interrupted, report.leases_lost, report.unreported), (0, 0, 0, 0));
    log.each_once(&ids);
    let most = log.most_at_once.load(Ordering::SeqCst);
    assert!((2..=4).contains(&most), "{most} handlers at once");
    assert_eq!(db.queue().tasks(Status::Completed, 1000).unwrap().len(), TASKS);
}

fn q8_a_task_added_to_an_idle_runner_starts_without_waiting_for_the_poll<D: Db>(db: &D) {
    let (started, starts) = mpsc::channel();
    let started = Mutex::new(started);
    // Only a wake-up can start a task within the poll interval.
    let runner = Runner::builder(db.queue(), "w", &["t"]).poll_interval(Duration::from_secs(5));
    let (stop, run) = start::<D>(runner, move |_| {
        started.lock().unwrap().send(Instant::now()).unwrap();
        Handled::Completed
    });
    // Another connection, as another part of the program (or another machine) would add it.
    let mut producer = db.queue();
    std::thread::sleep(Duration::from_millis(300)); // idle: its first claim found nothing
    for round in 0..3 {
        let added = Instant::now();
        producer.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
        let start = starts.recv_timeout(Duration::from_secs(10)).expect("the task ran");
        let waited = start.duration_since(added);
        assert!(waited < Duration::from_secs(1), "round {round}: started {waited:?} after it was added");
        std::thread::sleep(Duration::from_millis(200)); // idle again
    }
    stop.shutdown(Duration::from_secs(5));
    assert_eq!(joined(run).completed, 3);
}

/// One attempt per task, a 300 ms start lease.
fn short_lease() -> persevere_queue::TaskPolicy {
    let retry =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(2).build().unwrap();
    let policy = DeliveryPolicy::builder(retry).start_timeout(Duration::from_millis(300)).build().unwrap();
    policy.map_route(|()| String::new())
}

fn q8_heartbeats_keep_a_handler_that_outlives_its_start_lease<D: Db>(db: &D) {
    let id = db.queue().enqueue(NewTask::new("t", "slow", short_lease())).unwrap().id;
    let log = Arc::new(Log::default());
    let handler_log = log.clone();
    let (stop, run) = start::<D>(Runner::builder(db.queue(), "w", &["t"]), move |job| {
        handler_log.enter(job);
        std::thread::sleep(Duration::from_secs(1));
        Handled::Completed
    });
    let mut queue = db.queue();
    assert!(wait_until(Duration::from_secs(10), || queue.task(id).unwrap().status.is_terminal()));
    stop.shutdown(Duration::from_secs(5));
    let report = joined(run);
    assert_eq!((report.completed, report.leases_lost), (1, 0), "{report:?}");
    let task = queue.task(id).unwrap();
    assert_eq!((task.status, task.attempt(), task.retries_used()), (Status::Completed, 1, 0));
    log.each_once(&[id]);
}

fn q8_a_shutdown_hands_back_buffered_jobs_and_interrupts_a_handler_past_its_deadline<D: Db>(db: &D) {
    let mut producer = db.queue();
    let ids: Vec<TaskId> =
        (0..4).map(|i| producer.enqueue(NewTask::new("t", format!("{i}"), policy(3))).unwrap().id).collect();
    let (started, starts) = mpsc::channel();
    let started = Mutex::new(started);
    // One handler, three jobs buffered behind it; the handler outlives the deadline.
    let runner = Runner::builder(db.queue(), "w", &["t"]).concurrency(1).buffer(3);
    let (stop, run) = start::<D>(runner, move |job| {
        started.lock().unwrap().send(job.id).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        Handled::Completed
    });
    let running = starts.recv_timeout(Duration::from_secs(10)).expect("a handler started");
    let asked = Instant::now();
    stop.shutdown(Duration::from_millis(300));
    let report = joined(run);
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "returned after {took:?}");
    assert_eq!((report.claimed, report.handed_back, report.interrupted, report.completed), (4, 3, 1, 0), "{report:?}");
    assert!(starts.try_recv().is_err(), "no buffered job started");
    for id in ids {
        let task = producer.task(id).unwrap();
        let counts = (task.status, task.attempt(), task.retries_used(), task.redeliveries());
        if id == running {
            assert_eq!(counts, (Status::Pending, 2, 1, 0), "interrupted: a retry used (D2)");
        } else {
            assert_eq!(counts, (Status::Pending, 1, 0, 1), "handed back: free (D3)");
        }
    }
}

fn q8_a_lost_lease_is_counted_and_the_runner_goes_on<D: Db>(db: &D) {
    let mut producer = db.queue();
    let first = producer.enqueue(NewTask::new("t", "first", policy(3))).unwrap().id;
    let (started, starts) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (started, released) = (Mutex::new(started), Mutex::new(released));
    let (stop, run) = start::<D>(Runner::builder(db.queue(), "w", &["t"]), move |job| {
        started.lock().unwrap().send(job.id).unwrap();
        if job.payload == b"first" {
            released.lock().unwrap().recv().unwrap();
        }
        Handled::Completed
    });
    assert_eq!(starts.recv_timeout(Duration::from_secs(10)).unwrap(), first);
    // Meanwhile another worker, whose clock reads 11 s later, finds the lease run out, takes
    // attempt 2 and completes it.
    let mut thief = db.queue();
    thief.advance_clock(Duration::from_secs(11));
    let stolen = thief.claim("thief", &["t"]).unwrap().expect("the lease ran out");
    assert_eq!((stolen.id, stolen.attempt), (first, 2));
    thief.complete(&stolen).unwrap();
    release.send(()).unwrap();
    // The refused report ends nothing: the next task runs.
    let second = producer.enqueue(NewTask::new("t", "second", policy(3))).unwrap().id;
    assert_eq!(starts.recv_timeout(Duration::from_secs(10)).unwrap(), second);
    assert!(wait_until(Duration::from_secs(10), || producer.task(second).unwrap().status == Status::Completed));
    stop.shutdown(Duration::from_secs(5));
    let report = joined(run);
    assert_eq!((report.leases_lost, report.completed, report.unreported), (1, 1, 0), "{report:?}");
    let first = producer.task(first).unwrap();
    assert_eq!((first.status, first.attempt()), (Status::Completed, 2), "the thief's attempt");
}

fn q8_a_handler_that_panics_fails_its_attempt<D: Db>(db: &D) {
    let id = db.queue().enqueue(NewTask::new("t", "p", policy(1))).unwrap().id;
    let (stop, run) =
        start::<D>(Runner::builder(db.queue(), "w", &["t"]), |_| -> Handled { panic!("the handler broke") });
    let mut queue = db.queue();
    assert!(wait_until(Duration::from_secs(10), || queue.task(id).unwrap().status.is_terminal()));
    stop.shutdown(Duration::from_secs(5));
    assert_eq!(joined(run).failed, 1);
    assert_panicked(&queue.task(id).unwrap());
}

fn q8_a_store_error_is_tried_again_and_the_runner_goes_on<D: Db>(db: &D) {
    let id = db.queue().enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let (started, starts) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (started, released) = (Mutex::new(started), Mutex::new(released));
    let (stop, run) = start::<D>(Runner::builder(db.queue(), "w", &["t"]), move |job| {
        started.lock().unwrap().send(job.id).unwrap();
        released.lock().unwrap().recv().unwrap();
        Handled::Completed
    });
    assert_eq!(starts.recv_timeout(Duration::from_secs(10)).unwrap(), id);
    // The database refuses every write of the table while the result comes back, as a
    // database that went away would.
    let sqlite = std::any::type_name::<D>().contains("Sqlite");
    if sqlite {
        db.execute("CREATE TRIGGER away BEFORE UPDATE ON persevere_tasks BEGIN SELECT RAISE(ABORT, 'away'); END;");
    } else {
        db.execute(
            "CREATE FUNCTION away() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'away'; END $$;
             CREATE TRIGGER away BEFORE UPDATE ON persevere_tasks FOR EACH ROW EXECUTE FUNCTION away();",
        );
    }
    release.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut queue = db.queue();
    assert_eq!(queue.task(id).unwrap().status, Status::HandedOut, "the result is not written yet");
    db.execute(if sqlite { "DROP TRIGGER away" } else { "DROP TRIGGER away ON persevere_tasks" });
    assert!(wait_until(Duration::from_secs(10), || queue.task(id).unwrap().status == Status::Completed));
    stop.shutdown(Duration::from_secs(5));
    let report = joined(run);
    assert_eq!((report.completed, report.leases_lost, report.unreported), (1, 0, 0), "{report:?}");
}

fn retention_a_runner_prunes_finished_tasks_and_keeps_failed_ones<D: Db>(db: &D) {
    let mut producer = db.queue();
    let mut queue = db.queue();
    let gone = |queue: &mut persevere_queue::Queue<D::S>, id| queue.task(id).is_err();
    // Zero: each row goes with the completion that writes it, with no sweep (an hour away).
    let done: Vec<TaskId> =
        (0..3).map(|i| producer.enqueue(NewTask::new("t", format!("{i}"), policy(1))).unwrap().id).collect();
    let failed = producer.enqueue(NewTask::new("t", "fails", policy(1))).unwrap().id;
    let runner = Runner::builder(db.queue(), "w", &["t"])
        .sweep_interval(Duration::from_secs(3600))
        .retention(Some(Duration::ZERO));
    let (stop, run) = start::<D>(runner, move |job| {
        if job.id == failed { Handled::Failed(persevere::Failure::fatal("no".into())) } else { Handled::Completed }
    });
    assert!(wait_until(Duration::from_secs(10), || done.iter().all(|id| gone(&mut queue, *id))), "deleted");
    stop.shutdown(Duration::from_secs(5));
    assert_eq!(joined(run).completed, 3);
    assert_eq!(queue.task(failed).unwrap().status, Status::Failed, "kept for a person");
    // A millisecond: the rows stay until a sweep prunes them.
    let done = producer.enqueue(NewTask::new("t", "pruned", policy(1))).unwrap().id;
    let runner = Runner::builder(db.queue(), "w", &["t"])
        .sweep_interval(Duration::from_millis(20))
        .retention(Some(Duration::from_millis(1)));
    let (stop, run) = start::<D>(runner, |_| Handled::Completed);
    assert!(wait_until(Duration::from_secs(10), || gone(&mut queue, done)), "pruned");
    stop.shutdown(Duration::from_secs(5));
    joined(run);
    assert_eq!(queue.task(failed).unwrap().status, Status::Failed, "kept for a person");
    // With no retention, nothing is pruned.
    let kept = producer.enqueue(NewTask::new("t", "kept", policy(1))).unwrap().id;
    let runner = Runner::builder(db.queue(), "w", &["t"]).sweep_interval(Duration::from_millis(20)).retention(None);
    let (stop, run) = start::<D>(runner, |_| Handled::Completed);
    assert!(wait_until(Duration::from_secs(10), || queue.task(kept).unwrap().status == Status::Completed));
    std::thread::sleep(Duration::from_millis(100));
    stop.shutdown(Duration::from_secs(5));
    joined(run);
    assert_eq!(queue.task(kept).unwrap().status, Status::Completed, "kept");
}

/// The task failed on its one attempt, which panicked with the handler's message.
fn assert_panicked(task: &persevere_queue::TaskInfo) {
    assert_eq!(task.status, Status::Failed);
    let failure = &task.terminal().and_then(|t| t.recovery_error()).expect("a recovery error").last_failure;
    let failure = format!("{failure:?}");
    assert!(failure.contains("Panicked") && failure.contains("the handler broke"), "{failure}");
}

on_both_stores!(
    q8_a_runner_runs_every_task_once_four_at_a_time,
    q8_a_task_added_to_an_idle_runner_starts_without_waiting_for_the_poll,
    q8_heartbeats_keep_a_handler_that_outlives_its_start_lease,
    q8_a_shutdown_hands_back_buffered_jobs_and_interrupts_a_handler_past_its_deadline,
    q8_a_lost_lease_is_counted_and_the_runner_goes_on,
    q8_a_handler_that_panics_fails_its_attempt,
    q8_a_store_error_is_tried_again_and_the_runner_goes_on,
    retention_a_runner_prunes_finished_tasks_and_keeps_failed_ones,
);

/// The same engine with async handlers on tokio.
#[cfg(feature = "tokio")]
mod on_tokio {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// Runs `runner` with `handler` on a runtime of its own, on a thread of its own.
    fn start_async<D: Db, F, Fut>(runner: RunnerBuilder<D::S>, handler: F) -> (ShutdownHandle, JoinHandle<RunReport>)
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Handled> + Send + 'static,
    {
        let runner = runner.build();
        let stop = runner.shutdown_handle();
        let run = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(runner.run(handler))
        });
        (stop, run)
    }

    fn q8_an_async_runner_runs_every_task_once_four_at_a_time<D: Db>(db: &D) {
        let log = Arc::new(Log::default());
        let mut ids = Vec::new();
        let mut run = None;
        let handler_log = log.clone();
        ids.extend(enqueue_in_two_halves(db, || {
            let runner = Runner::builder(db.queue(), "w", &["t"]).concurrency(4);
            run = Some(start_async::<D, _, _>(runner, move |job| {
                let log = handler_log.clone();
                async move {
                    log.enter(&job);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    log.leave();
                    Handled::Completed
                }
            }));
        }));
        let (stop, run) = run.unwrap();
        assert!(wait_until(Duration::from_secs(30), || log.count() >= TASKS), "ran {} of {TASKS}", log.count());
        stop.shutdown(Duration::from_secs(10));
        let report = joined(run);
        assert_eq!((report.claimed, report.completed), (TASKS as u64, TASKS as u64), "{report:?}");
        log.each_once(&ids);
        let most = log.most_at_once.load(Ordering::SeqCst);
        assert!((2..=4).contains(&most), "{most} handlers at once");
        assert_eq!(db.queue().tasks(Status::Completed, 1000).unwrap().len(), TASKS);
    }

    fn q8_an_async_handler_past_the_deadline_is_interrupted_and_aborted<D: Db>(db: &D) {
        let id = db.queue().enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
        let (started, aborted) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (handler_started, handler_aborted) = (started.clone(), aborted.clone());
        let (stop, run) = start_async::<D, _, _>(Runner::builder(db.queue(), "w", &["t"]), move |_| {
            let (started, aborted) = (handler_started.clone(), handler_aborted.clone());
            async move {
                let _dropped = SetOnDrop(aborted);
                started.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(30)).await;
                Handled::Completed
            }
        });
        assert!(wait_until(Duration::from_secs(10), || started.load(Ordering::SeqCst)));
        stop.shutdown(Duration::from_millis(200));
        let report = joined(run);
        assert_eq!((report.interrupted, report.completed), (1, 0), "{report:?}");
        assert!(aborted.load(Ordering::SeqCst), "the handler's future was dropped");
        let task = db.queue().task(id).unwrap();
        assert_eq!((task.status, task.attempt(), task.retries_used()), (Status::Pending, 2, 1));
    }

    fn q8_an_async_handler_that_panics_fails_its_attempt<D: Db>(db: &D) {
        let id = db.queue().enqueue(NewTask::new("t", "p", policy(1))).unwrap().id;
        let runner = Runner::builder(db.queue(), "w", &["t"]);
        let (stop, run) = start_async::<D, _, _>(runner, |_| async { panic!("the handler broke") });
        let mut queue = db.queue();
        assert!(wait_until(Duration::from_secs(10), || queue.task(id).unwrap().status.is_terminal()));
        stop.shutdown(Duration::from_secs(5));
        assert_eq!(joined(run).failed, 1);
        assert_panicked(&queue.task(id).unwrap());
    }

    struct SetOnDrop(Arc<AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    on_both_stores!(
        q8_an_async_runner_runs_every_task_once_four_at_a_time,
        q8_an_async_handler_past_the_deadline_is_interrupted_and_aborted,
        q8_an_async_handler_that_panics_fails_its_attempt,
    );
}

/// PostgreSQL's listening connection, broken by the server, is replaced: wake-ups go on.
#[cfg(feature = "postgres")]
#[test]
fn q8_a_broken_listening_connection_is_replaced() {
    let Some(db) = common::postgres("q8_a_broken_listening_connection_is_replaced") else { return };
    let (started, starts) = mpsc::channel();
    let started = Mutex::new(started);
    let runner = Runner::builder(db.queue(), "w", &["t"]).poll_interval(Duration::from_secs(5));
    let (stop, run) = start::<common::PgDb>(runner, move |_| {
        started.lock().unwrap().send(Instant::now()).unwrap();
        Handled::Completed
    });
    let mut admin = ::postgres::Client::connect(&db.params, ::postgres::NoTls).unwrap();
    let listening = |admin: &mut ::postgres::Client| -> Vec<i32> {
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN persevere_tasks' AND datname = current_database()",
                &[],
            )
            .unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    };
    assert!(wait_until(Duration::from_secs(10), || !listening(&mut admin).is_empty()), "a connection listens");
    // Every listening connection of this database is cut (other tests' too: theirs come back alike).
    let cut = listening(&mut admin);
    for pid in &cut {
        admin.execute("SELECT pg_terminate_backend($1)", &[pid]).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), || listening(&mut admin).iter().any(|pid| !cut.contains(pid))),
        "a new connection listens"
    );
    std::thread::sleep(Duration::from_millis(100));
    let added = Instant::now();
    db.queue().enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    let waited = starts.recv_timeout(Duration::from_secs(10)).expect("the task ran").duration_since(added);
    assert!(waited < Duration::from_secs(1), "started {waited:?} after it was added");
    stop.shutdown(Duration::from_secs(5));
    assert_eq!(joined(run).completed, 1);
}

/// On PostgreSQL a runner writes its results on a second connection while it claims on its
/// own (Q7: flushed as soon as the previous flush returns, with no claim waiting for it); that
/// connection, cut by the server, is replaced, and every task still runs once.
#[cfg(feature = "postgres")]
#[test]
fn q7_a_runner_writes_results_on_a_second_connection_that_comes_back_when_cut() {
    let name = "q7_second_connection";
    let Some(db) = common::postgres(name) else { return };
    let params = format!("{} application_name={name}", db.params);
    let connect = || persevere_queue::Queue::new(persevere_queue::Postgres::connect(&params).unwrap());
    let ids: Vec<TaskId> = connect()
        .enqueue_batch((0..400).map(|i| NewTask::new("t", format!("{i}"), policy(3))).collect())
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let log = Arc::new(Log::default());
    let handler_log = log.clone();
    let runner = Runner::builder(connect(), "w", &["t"]).concurrency(2).buffer(20);
    let (stop, run) = start::<common::PgDb>(runner, move |job| {
        handler_log.enter(job);
        std::thread::sleep(Duration::from_millis(1));
        handler_log.leave();
        Handled::Completed
    });
    let mut admin = ::postgres::Client::connect(&db.params, ::postgres::NoTls).unwrap();
    let mut backend = |like: &str| -> Option<i32> {
        let sql = "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE $2 LIMIT 1";
        admin.query_opt(sql, &[&name, &like]).unwrap().map(|row| row.get(0))
    };
    let (mut flusher, mut claimer) = (None, None);
    assert!(
        wait_until(Duration::from_secs(10), || {
            flusher = flusher.or_else(|| backend("WITH v AS%"));
            claimer = claimer.or_else(|| backend("%FOR UPDATE OF t SKIP LOCKED%"));
            flusher.is_some() && claimer.is_some()
        }),
        "results written and claims made"
    );
    assert_ne!(flusher, claimer, "on two connections");
    let mut admin = ::postgres::Client::connect(&db.params, ::postgres::NoTls).unwrap();
    admin.execute("SELECT pg_terminate_backend($1)", &[&flusher.unwrap()]).unwrap();
    assert!(wait_until(Duration::from_secs(30), || log.count() >= ids.len()), "ran {} of {}", log.count(), ids.len());
    let mut queue = connect();
    assert!(wait_until(Duration::from_secs(30), || queue.tasks(Status::Completed, 1000).unwrap().len() == ids.len()));
    stop.shutdown(Duration::from_secs(10));
    let report = joined(run);
    assert_eq!(report.completed + report.leases_lost, ids.len() as u64, "{report:?}");
    log.each_once(&ids);
}
