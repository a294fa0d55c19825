//! Q9, the database going away: PostgreSQL restarts under running workers, and the same
//! `Queue` values go on, losing nothing and running no attempt twice.
//!
//! Each test starts a cluster of its own with `.ci/postgres` (on a free port, in a directory of
//! its own) and restarts it, so that no other test's connections are cut: it runs when
//! `PERSEVERE_PG_CTL` names that script (`.ci/run` sets it), is skipped otherwise, and fails
//! when `PERSEVERE_PG_REQUIRED` is set without it.
//!
//! ```text
//! PERSEVERE_PG_CTL=$PWD/.ci/postgres cargo test -p persevere-queue --features postgres --test restart
//! ```

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy};
use persevere_queue::{Handled, Job, NewTask, Postgres, Queue, QueueError, Status, TaskId, TaskPolicy, Worked, Worker};

/// A PostgreSQL cluster of the test's own, stopped and removed when dropped.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    url: String,
}

impl Cluster {
    /// A cluster for test `test`, or `None` to skip it.
    fn start(test: &str) -> Option<Cluster> {
        let Some(script) = std::env::var_os("PERSEVERE_PG_CTL") else {
            assert!(
                std::env::var_os("PERSEVERE_PG_REQUIRED").is_none(),
                "PERSEVERE_PG_REQUIRED is set but PERSEVERE_PG_CTL is not: set it to the path of .ci/postgres"
            );
            eprintln!("PERSEVERE_PG_CTL is not set: {test} is skipped (it restarts a cluster of its own)");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        static CLUSTERS: AtomicUsize = AtomicUsize::new(0);
        let n = CLUSTERS.fetch_add(1, Ordering::SeqCst);
        // Short: the server's socket is in it.
        let dir = std::env::temp_dir().join(format!("persevere-q9-{}-{n}", std::process::id()));
        let started =
            Command::new(&script).arg("start").arg(&dir).env("PERSEVERE_PG_PORT", port.to_string()).output().unwrap();
        assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
        let url = String::from_utf8(started.stdout).unwrap().trim().to_owned();
        Some(Cluster { script: script.into(), dir, url })
    }

    /// Stops the server (`fast` ends every session; `immediate` is a crash), leaves it down for
    /// `down`, and starts it again on the same data, port and socket.
    fn restart(&self, down: Duration, mode: &str) {
        let restarted = Command::new(&self.script)
            .arg("restart")
            .arg(&self.dir)
            .arg(format!("{:.3}", down.as_secs_f64()))
            .arg(mode)
            .output()
            .unwrap();
        assert!(restarted.status.success(), "{}", String::from_utf8_lossy(&restarted.stderr));
    }

    fn queue(&self) -> Queue<Postgres> {
        Queue::new(Postgres::connect(&self.url).unwrap())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Up to 20 attempts with no delay between them, and a 2 s start lease: an attempt lost with a
/// connection (a claim whose commit was not answered) is handed out again soon.
fn policy() -> TaskPolicy {
    let retry =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(20).build().unwrap();
    DeliveryPolicy::builder(retry).start_timeout(Duration::from_secs(2)).build().unwrap().map_route(|()| String::new())
}

/// What the workers did, for the checks at the end.
#[derive(Default)]
struct Log {
    /// Every attempt a handler ran.
    started: Mutex<Vec<(TaskId, u64)>>,
    /// Every task whose completion was answered `Completed`.
    completed: Mutex<Vec<TaskId>>,
    /// The store errors and refusals met (each was treated as transient).
    errors: Mutex<Vec<String>>,
}

impl Log {
    fn start(&self, job: &Job) {
        self.started.lock().unwrap().push((job.id, job.attempt));
        std::thread::sleep(Duration::from_millis(1));
    }

    fn error(&self, who: &str, error: &QueueError) {
        self.errors.lock().unwrap().push(format!("{who}: {error}"));
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// Tasks enqueued before the workers start, and by the producer after the restarts.
const BEFORE: usize = 1000;
const AFTER: usize = 150;

/// Four workers (two calling `Worker::work_one`, two `claim_batch` and `report_batch`), each on
/// its own `Queue`, and a producer enqueueing with idempotency keys on its own, while the server
/// restarts twice: once stopped with `fast` and left down for a second, once crashed
/// (`immediate`). Every store error is treated as transient: logged, and the loop goes on with
/// the same queue.
#[test]
fn q9_workers_lose_nothing_and_run_no_attempt_twice_across_postgres_restarts() {
    let Some(cluster) = Cluster::start("q9_workers_lose_nothing_and_run_no_attempt_twice_across_postgres_restarts")
    else {
        return;
    };
    let mut observer = cluster.queue();
    for i in 0..BEFORE {
        observer.enqueue(NewTask::new("t", format!("before-{i}"), policy())).unwrap();
    }
    let log = Log::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (stop, restarted) = (AtomicBool::new(false), AtomicBool::new(false));
    let (tasks, completed_after_restarts) = std::thread::scope(|scope| {
        // The workers stop however this ends (a failed check included), or the scope waits.
        let _stop = StopOnDrop(&stop);
        let workers: Vec<_> = (0..4)
            .map(|index| {
                let (log, stop, restarted, url) = (&log, &stop, &restarted, &cluster.url);
                scope.spawn(move || {
                    let queue = Queue::new(Postgres::connect(url).unwrap());
                    let name = format!("worker-{index}");
                    if index % 2 == 0 {
                        one_at_a_time(Worker::new(queue, name, &["t"]), log, stop, restarted)
                    } else {
                        in_batches(queue, &name, log, stop, restarted)
                    }
                })
            })
            .collect();
        // One task every 5 ms while the server restarts, then one every 20 ms for three seconds:
        // longer than the longest backoff delay (2 s), so that every worker is back for some.
        let producer = scope.spawn(|| {
            let mut queue = cluster.queue();
            let mut produced = 0;
            let mut enqueue = |pause| {
                let task = || NewTask::new("t", format!("p-{produced}"), policy()).key(format!("p-{produced}"));
                while let Err(error) = queue.enqueue(task()) {
                    assert!(Instant::now() < deadline, "the producer could not enqueue: {error}");
                    log.error("producer", &error);
                }
                produced += 1;
                std::thread::sleep(pause);
            };
            while !restarted.load(Ordering::SeqCst) {
                enqueue(Duration::from_millis(5));
            }
            for _ in 0..AFTER {
                enqueue(Duration::from_millis(20));
            }
            produced
        });

        std::thread::sleep(Duration::from_millis(400));
        cluster.restart(Duration::from_secs(1), "fast");
        std::thread::sleep(Duration::from_millis(400));
        cluster.restart(Duration::ZERO, "immediate");
        restarted.store(true, Ordering::SeqCst);

        let tasks = BEFORE + producer.join().unwrap();
        while observer.tasks(Status::Completed, 10_000).unwrap().len() < tasks {
            assert!(Instant::now() < deadline, "not every task completed: {}", summary(&log));
            std::thread::sleep(Duration::from_millis(200));
        }
        stop.store(true, Ordering::SeqCst);
        (tasks, workers.into_iter().map(|worker| worker.join().unwrap()).collect::<Vec<usize>>())
    });

    let summary = summary(&log);
    eprintln!("{summary}");
    // Nothing lost, nothing left over.
    for status in [Status::Pending, Status::HandedOut, Status::Running, Status::Failed, Status::DeadLettered] {
        assert!(observer.tasks(status, 10).unwrap().is_empty(), "tasks left {status:?}: {summary}");
    }
    // No attempt reached two handlers.
    let mut started = log.started.lock().unwrap().clone();
    started.sort_unstable();
    let runs = started.len();
    started.dedup();
    assert_eq!(started.len(), runs, "an attempt started twice: {summary}");
    // Every task was completed once.
    let mut completions: BTreeMap<TaskId, usize> = BTreeMap::new();
    for id in log.completed.lock().unwrap().iter() {
        *completions.entry(*id).or_default() += 1;
    }
    assert_eq!(completions.len(), tasks, "{summary}");
    assert!(completions.values().all(|&n| n == 1), "a task completed twice: {summary}");
    // The same queues kept working after the restarts.
    assert!(completed_after_restarts.iter().all(|&n| n > 0), "{completed_after_restarts:?}: {summary}");
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn summary(log: &Log) -> String {
    let errors = log.errors.lock().unwrap();
    format!(
        "{} attempts run, {} completions, {} errors met{}",
        log.started.lock().unwrap().len(),
        log.completed.lock().unwrap().len(),
        errors.len(),
        errors.iter().take(12).map(|e| format!("\n  {e}")).collect::<String>()
    )
}

/// `work_one` in a loop; returns how many tasks it completed after the restarts.
fn one_at_a_time(mut worker: Worker<Postgres>, log: &Log, stop: &AtomicBool, restarted: &AtomicBool) -> usize {
    let mut after = 0;
    while !stop.load(Ordering::SeqCst) {
        let late = restarted.load(Ordering::SeqCst);
        let worked = worker.work_one(|job, _| {
            log.start(job);
            Handled::Completed
        });
        match worked {
            // A lease lost while the server was away: another attempt owns the task.
            Ok(Some(Worked { id, refused: Some(error), .. })) => {
                log.errors.lock().unwrap().push(format!("{}: task {} refused the report: {error}", worker.id(), id.0));
            }
            Ok(Some(worked)) => {
                assert_eq!(worked.status, Status::Completed);
                log.completed.lock().unwrap().push(worked.id);
                after += usize::from(late);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(3)),
            Err(error) => log.error(worker.id(), &error),
        }
    }
    after
}

/// `claim_batch` and `report_batch` in a loop; returns how many tasks it completed after the
/// restarts.
fn in_batches(mut queue: Queue<Postgres>, name: &str, log: &Log, stop: &AtomicBool, restarted: &AtomicBool) -> usize {
    let mut after = 0;
    while !stop.load(Ordering::SeqCst) {
        let late = restarted.load(Ordering::SeqCst);
        let jobs = match queue.claim_batch(name, &["t"], 8) {
            Ok(jobs) if jobs.is_empty() => {
                std::thread::sleep(Duration::from_millis(3));
                continue;
            }
            Ok(jobs) => jobs,
            Err(error) => {
                log.error(name, &error);
                continue;
            }
        };
        let reports: Vec<(Job, Handled)> = jobs
            .into_iter()
            .map(|job| {
                log.start(&job);
                (job, Handled::Completed)
            })
            .collect();
        match queue.report_batch(&reports) {
            Ok(results) => {
                for ((job, _), result) in reports.iter().zip(results) {
                    match result {
                        Ok(status) => {
                            assert_eq!(status, Status::Completed);
                            log.completed.lock().unwrap().push(job.id);
                            after += usize::from(late);
                        }
                        Err(error) => log.error(name, &error),
                    }
                }
            }
            Err(error) => log.error(name, &error),
        }
    }
    after
}

/// After each restart, the first call of each kind on the same queue succeeds: a completion of
/// a job claimed before it, a keyless enqueue (sent once, on a new connection), a claim, a
/// report decided on a fresh read, and reads.
#[test]
fn q9_after_a_restart_the_first_call_of_each_kind_succeeds_on_the_same_queue() {
    let Some(cluster) = Cluster::start("q9_after_a_restart_the_first_call_of_each_kind_succeeds_on_the_same_queue")
    else {
        return;
    };
    let mut queue = cluster.queue();
    let a = queue.enqueue(NewTask::new("t", "a", policy())).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();

    cluster.restart(Duration::ZERO, "fast");
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed, "a completion of a job claimed before");

    cluster.restart(Duration::ZERO, "fast");
    let b = queue.enqueue(NewTask::new("t", "b", policy())).unwrap().id;

    cluster.restart(Duration::ZERO, "immediate");
    let job = queue.claim("w", &["t"]).unwrap().expect("a claim");
    assert_eq!((job.id, job.attempt), (b, 1));

    cluster.restart(Duration::ZERO, "fast");
    assert_eq!(queue.fail(&job, Failure::retryable("boom".to_owned())).unwrap(), Status::Pending);
    assert_eq!(queue.task(a).unwrap().status, Status::Completed);
    let tasks = [queue.tasks(Status::Completed, 10).unwrap(), queue.tasks(Status::Pending, 10).unwrap()];
    assert_eq!(tasks.map(|t| t.iter().map(|t| t.id).collect::<Vec<_>>()), [vec![a], vec![b]], "each once");
}
