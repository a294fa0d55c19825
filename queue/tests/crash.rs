//! Q4 with real processes: worker processes on one database, killed with SIGKILL at random
//! moments and aborted at every statement of a claim and of a report (the `crash-points`
//! feature), then restarted; at the end the database and the workers' append-only log must
//! show every task in exactly one terminal state, no attempt number started by two workers
//! (`Sync` durability), retries consumed exactly as D2 says, and nothing lost. A last run with
//! the claim deliberately broken (its state written outside its transaction) shows the checks
//! catch it.
//!
//! This is its own harness: the test binary is also the worker (it re-runs itself with
//! `PERSEVERE_CRASH_WORKER` set). Run it with
//! `cargo test -p persevere-queue --features crash-points --test crash`, and with
//! `--features crash-points,postgres` and `PERSEVERE_PG_URL` for PostgreSQL (`common/mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy, SplitMix64};
use persevere_queue::{Handled, Job, NewTask, Queue, QueueError, Status, Store, TaskPolicy, Worker};
use rand_core::Rng;

mod common;

const TASKS: u64 = 120;
const MAX_ATTEMPTS: u32 = 40;
const LEASE: Duration = Duration::from_millis(300);

/// Where the workers' database is: `sqlite:<path>` or `postgres:<params>`.
#[derive(Clone, Debug)]
struct Spec(String);

fn policy() -> TaskPolicy {
    let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap())
        .max_attempts(MAX_ATTEMPTS)
        .build()
        .unwrap();
    DeliveryPolicy::builder(retry)
        .max_redeliveries(1000)
        .start_timeout(LEASE)
        .heartbeat_timeout(LEASE)
        .build()
        .unwrap()
        .map_route(|()| String::new())
}

// ---- the worker process -------------------------------------------------------------------

fn worker_main(spec: &str) {
    let name = std::env::var("PERSEVERE_CRASH_WORKER_NAME").unwrap();
    let log = PathBuf::from(std::env::var("PERSEVERE_CRASH_LOG").unwrap());
    let batches = std::env::var_os("PERSEVERE_CRASH_BATCH").is_some();
    match spec.split_once(':') {
        Some(("sqlite", path)) => {
            let queue = Queue::new(persevere_queue::Sqlite::open(path).unwrap());
            if batches { work_batches(queue, &name, &log) } else { work(queue, &name, &log) }
        }
        #[cfg(feature = "postgres")]
        Some(("postgres", params)) => {
            let queue = Queue::new(persevere_queue::Postgres::connect(params).unwrap());
            if batches { work_batches(queue, &name, &log) } else { work(queue, &name, &log) }
        }
        _ => panic!("unknown store {spec}"),
    }
}

/// How many jobs a worker in batch mode claims at once.
const BATCH: u32 = 4;

/// A worker in batch mode (Q7): claims up to four jobs in one transaction, runs them one after
/// the other, and reports their ends together; a crash before that report leaves every result
/// of the batch unflushed, and each such attempt is interrupted (D2).
fn work_batches<S: Store>(mut queue: Queue<S>, name: &str, log: &Path) {
    let picky = name.trim_start_matches('w').parse::<u32>().unwrap() % 2 == 1;
    let mut idle_since = Instant::now();
    while idle_since.elapsed() < Duration::from_millis(1500) {
        let jobs = queue.claim_batch(name, &["job", "picky"], BATCH).unwrap_or_else(|e| panic!("{name}: {e}"));
        if jobs.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        idle_since = Instant::now();
        let reports: Vec<(Job, Handled)> = jobs
            .into_iter()
            .map(|job| {
                let handled = run(&mut queue, &job, name, log, picky);
                (job, handled)
            })
            .collect();
        let results = queue.report_batch(&reports).unwrap_or_else(|e| panic!("{name}: {e}"));
        for ((job, handled), result) in reports.iter().zip(results) {
            let (task, attempt) = (job.id.0, job.attempt);
            let line = match (result, handled) {
                (Err(QueueError::Refused { error, .. }), _) => format!("lost {task} {name} {error}"),
                (Err(error), _) => panic!("{name}: {error}"),
                (Ok(_), Handled::Completed) => format!("end {task} {attempt} {name} completed"),
                (Ok(_), Handled::Failed(_)) => format!("end {task} {attempt} {name} failed"),
                (Ok(_), Handled::Declined) => format!("declined {task} {attempt} {name}"),
            };
            append(log, &line);
        }
    }
}

/// Runs one job as both kinds of worker do: declines a picky task on an odd worker, logs the
/// start, heartbeats with a checkpoint, sleeps, and fails the scripted first attempts.
fn run<S: Store>(queue: &mut Queue<S>, job: &Job, name: &str, log: &Path, picky: bool) -> Handled {
    if picky && job.task_type == "picky" {
        return Handled::Declined;
    }
    append(log, &format!("start {} {} {name}", job.id.0, job.attempt));
    let fail_first: u64 = std::str::from_utf8(&job.payload).unwrap().parse().unwrap();
    if queue.heartbeat(job, Some(format!("{name}@{}", job.attempt))).is_err() {
        return Handled::Failed(Failure::retryable("lease lost".into()));
    }
    std::thread::sleep(Duration::from_millis(20 + job.id.0 as u64 % 20));
    if job.attempt <= fail_first {
        Handled::Failed(Failure::retryable(format!("scripted failure {}", job.attempt)))
    } else {
        Handled::Completed
    }
}

fn append(log: &Path, line: &str) {
    // One `write` of one line to a file opened for appending: a killed process leaves whole
    // lines (or none).
    let mut file = OpenOptions::new().create(true).append(true).open(log).unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

fn work<S: Store>(queue: Queue<S>, name: &str, log: &Path) {
    let mut worker = Worker::new(queue, name, &["job", "picky"]);
    // Odd-numbered workers do not run "picky" tasks: they decline them (a free return, D3).
    let picky = name.trim_start_matches('w').parse::<u32>().unwrap() % 2 == 1;
    let mut idle_since = Instant::now();
    while idle_since.elapsed() < Duration::from_millis(1500) {
        let worked = worker.work_one(|job, lease| {
            if picky && job.task_type == "picky" {
                return Handled::Declined;
            }
            append(log, &format!("start {} {} {name}", job.id.0, job.attempt));
            let fail_first: u64 = std::str::from_utf8(&job.payload).unwrap().parse().unwrap();
            if lease.beat(Some(format!("{name}@{}", job.attempt))).is_err() {
                return Handled::Failed(Failure::retryable("lease lost".into()));
            }
            std::thread::sleep(Duration::from_millis(20 + job.id.0 as u64 % 20));
            if job.attempt <= fail_first {
                Handled::Failed(Failure::retryable(format!("scripted failure {}", job.attempt)))
            } else {
                Handled::Completed
            }
        });
        match worked {
            Ok(Some(worked)) if worked.refused.is_some() => {
                append(log, &format!("lost {} {name} {:?}", worked.id.0, worked.refused));
                idle_since = Instant::now();
            }
            Ok(Some(worked)) => {
                let line = match worked.handled {
                    Handled::Completed => format!("end {} {} {name} completed", worked.id.0, worked.attempt),
                    Handled::Failed(_) => format!("end {} {} {name} failed", worked.id.0, worked.attempt),
                    Handled::Declined => format!("declined {} {} {name}", worked.id.0, worked.attempt),
                };
                append(log, &line);
                idle_since = Instant::now();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(QueueError::Refused { task, error }) => {
                append(log, &format!("lost {} {name} {error}", task.0));
                idle_since = Instant::now();
            }
            Err(error) => panic!("{name}: {error}"),
        }
    }
}

// ---- the test process ---------------------------------------------------------------------

struct Run {
    spec: Spec,
    log: PathBuf,
    next_worker: u32,
    broken: bool,
}

impl Run {
    fn spawn(&mut self, crash_at: Option<String>) -> Child {
        // Every third worker claims and reports in batches.
        let batches = self.next_worker % 3 == 2;
        self.spawn_mode(crash_at, batches)
    }

    fn spawn_mode(&mut self, crash_at: Option<String>, batches: bool) -> Child {
        self.next_worker += 1;
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .env("PERSEVERE_CRASH_WORKER", &self.spec.0)
            .env("PERSEVERE_CRASH_WORKER_NAME", format!("w{}", self.next_worker))
            .env("PERSEVERE_CRASH_LOG", &self.log)
            .env_remove("PERSEVERE_QUEUE_CRASH_AT")
            .env_remove("PERSEVERE_QUEUE_BREAK")
            .env_remove("PERSEVERE_CRASH_BATCH");
        if batches {
            command.env("PERSEVERE_CRASH_BATCH", "1");
        }
        if let Some(point) = crash_at {
            command.env("PERSEVERE_QUEUE_CRASH_AT", point);
        }
        if self.broken {
            command.env("PERSEVERE_QUEUE_BREAK", "split-claim");
        }
        command.stderr(std::process::Stdio::null()).spawn().unwrap()
    }
}

fn open_queue(spec: &Spec) -> Queue<Box<dyn Store + Send>> {
    Queue::new(match spec.0.split_once(':') {
        Some(("sqlite", path)) => Box::new(persevere_queue::Sqlite::open(path).unwrap()) as Box<dyn Store + Send>,
        #[cfg(feature = "postgres")]
        Some(("postgres", params)) => Box::new(persevere_queue::Postgres::connect(params).unwrap()),
        _ => unreachable!(),
    })
}

/// Runs one scenario and returns what the checks found wrong.
fn scenario(spec: Spec, log: PathBuf, statements: &[CrashPoint], kills: u32, broken: bool, seed: u64) -> Vec<String> {
    let _ = std::fs::remove_file(&log);
    let mut queue = open_queue(&spec);
    let mut fail_first = BTreeMap::new();
    for i in 0..TASKS {
        let task_type = if i % 4 == 3 { "picky" } else { "job" };
        let id = queue.enqueue(NewTask::new(task_type, format!("{}", i % 3), policy())).unwrap().id;
        fail_first.insert(id.0, i % 3);
    }
    let mut run = Run { spec, log: log.clone(), next_worker: 0, broken };

    // Deterministic crash points: one worker per statement of its first two claims and its
    // first two reports (a heartbeat, then a completion or failure), each aborted right after
    // that statement. After every other one the lease is left to expire, so the next claim
    // meets an expired lease and interrupts it.
    for &(op, count, batches) in statements {
        for k in 1..=2 * count {
            let status = run.spawn_mode(Some(format!("{op}:{k}")), batches).wait().unwrap();
            assert_eq!(status.signal(), Some(6), "the worker crashing at {op}:{k} should have aborted: {status:?}");
            if k % 2 == 0 {
                std::thread::sleep(LEASE + Duration::from_millis(50));
            }
        }
    }

    // Random SIGKILLs among three workers.
    let mut rng = SplitMix64::new(seed);
    let mut workers: Vec<Child> = (0..3).map(|_| run.spawn(None)).collect();
    for _ in 0..kills {
        let open = [Status::Pending, Status::HandedOut, Status::Running]
            .into_iter()
            .map(|s| queue.tasks(s, 1).unwrap().len())
            .sum::<usize>();
        if open == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10 + rng.next_u64() % 70));
        let victim = (rng.next_u64() % 3) as usize;
        workers[victim].kill().unwrap();
        workers[victim].wait().unwrap();
        workers[victim] = run.spawn(None);
    }

    // No more kills: workers run until nothing is left (they exit after 1.5 s idle; a killed
    // worker's lease expires after 0.3 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for worker in &mut workers {
            worker.wait().unwrap();
        }
        let open = [Status::Pending, Status::HandedOut, Status::Running]
            .into_iter()
            .map(|s| queue.tasks(s, 1000).unwrap().len())
            .sum::<usize>();
        if open == 0 || Instant::now() > deadline {
            break;
        }
        workers = (0..2).map(|_| run.spawn(None)).collect();
    }
    let mut wrong = check(&mut queue, &log, &fail_first);
    let (starts, interrupted) = disturbance(&mut queue, &log, &fail_first);
    println!("  {starts} attempts started, {interrupted} interrupted by crashes and kills");
    if !broken && interrupted == 0 {
        wrong.push("no attempt was interrupted: the kills tested nothing".to_owned());
    }
    wrong
}

fn check<S: Store>(queue: &mut Queue<S>, log: &Path, fail_first: &BTreeMap<i64, u64>) -> Vec<String> {
    let mut wrong = Vec::new();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut starts: BTreeMap<(i64, u64), BTreeSet<String>> = BTreeMap::new();
    let mut completions: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    let mut declines: BTreeMap<i64, u32> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["declined", task, _, _] => *declines.entry(task.parse().unwrap()).or_default() += 1,
            ["start", task, attempt, worker] => {
                starts
                    .entry((task.parse().unwrap(), attempt.parse().unwrap()))
                    .or_default()
                    .insert((*worker).to_owned());
            }
            ["end", task, attempt, _, "completed"] => {
                completions.entry(task.parse().unwrap()).or_default().push(attempt.parse().unwrap());
            }
            _ => {}
        }
    }
    // Sync durability: no attempt number reaches two workers (D2, Q4).
    for ((task, attempt), workers) in &starts {
        if workers.len() > 1 {
            wrong.push(format!("task {task} attempt {attempt} was started by {workers:?}"));
        }
    }
    // Nothing lost, one terminal state each, retries consumed exactly.
    let mut rows = 0;
    for status in [Status::Pending, Status::HandedOut, Status::Running, Status::Failed, Status::DeadLettered] {
        for task in queue.tasks(status, 1000).unwrap() {
            rows += 1;
            wrong.push(format!("task {} ended {status}: {:?}", task.id, task.terminal()));
        }
    }
    for task in queue.tasks(Status::Completed, 1000).unwrap() {
        rows += 1;
        let id = task.id.0;
        let Some(&persevere::Terminal::Completed { attempt }) = task.terminal() else {
            wrong.push(format!("task {id}: status column says completed, state says {:?}", task.state.status()));
            continue;
        };
        // Every attempt before the last ended by a failure or an interruption, and each used
        // exactly one retry; declines (free returns) kept their attempt number and used none.
        let declined = declines.get(&id).copied().unwrap_or(0);
        if task.redeliveries() < declined {
            wrong.push(format!("task {id}: {declined} declines logged, {} free returns counted", task.redeliveries()));
        }
        if task.retries_used() != attempt - 1 {
            wrong.push(format!("task {id}: completed on attempt {attempt} with {} retries used", task.retries_used()));
        }
        if attempt <= fail_first[&id] {
            wrong.push(format!("task {id}: attempt {attempt} completed, but attempts up to {} fail", fail_first[&id]));
        }
        let logged = completions.get(&id).cloned().unwrap_or_default();
        if logged.len() > 1 || logged.iter().any(|a| *a != attempt) {
            wrong.push(format!("task {id}: completed on attempt {attempt}, workers logged completions {logged:?}"));
        }
        if starts.keys().any(|(t, a)| *t == id && *a > attempt) {
            wrong.push(format!("task {id}: an attempt after the completing one {attempt} was started"));
        }
    }
    if rows != fail_first.len() {
        wrong.push(format!("{} tasks enqueued, {rows} found", fail_first.len()));
    }
    wrong
}

/// How much the kills disturbed: attempts started, and attempts that were interrupted (a
/// retry used beyond the scripted failures).
fn disturbance<S: Store>(queue: &mut Queue<S>, log: &Path, fail_first: &BTreeMap<i64, u64>) -> (usize, u64) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let starts = text.lines().filter(|l| l.starts_with("start ")).count();
    let interrupted = queue
        .tasks(Status::Completed, 1000)
        .unwrap()
        .iter()
        .map(|t| t.retries_used().saturating_sub(fail_first[&t.id.0]))
        .sum();
    (starts, interrupted)
}

/// An operation, how many statements it runs (each is a crash point), and whether the worker
/// runs in batch mode.
type CrashPoint = (&'static str, u32, bool);
type CrashPoints = Vec<CrashPoint>;

fn stores() -> Vec<(&'static str, Spec, CrashPoints)> {
    let mut stores = Vec::new();
    // Statements (round trips on PostgreSQL) per operation: SQLite's claim is BEGIN IMMEDIATE,
    // clock, select, write, COMMIT; PostgreSQL's claim is BEGIN with the select (and the
    // clock), then the write with COMMIT; on both, a report is a select (with the clock) and a
    // version-guarded write, except the completion of a job the worker's queue holds (after
    // its heartbeat), which is one write guarded by version and lease. So `update:3` aborts
    // after that write when the worker's first job completes, and after the failure's select
    // when it fails; `update:4` after the failure's write, or the next job's heartbeat select.
    let sqlite = common::sqlite("crash_q4");
    // In batch mode (four jobs a claim), SQLite's claim is BEGIN IMMEDIATE, clock, select, four
    // writes, COMMIT; the reports are a heartbeat (select, write) per started job, then the
    // batch's completions in one transaction (BEGIN IMMEDIATE, a write each, COMMIT) and each
    // failure's select and write. PostgreSQL's batch claim is the same two round trips as one
    // job's, and its completions one statement.
    let batch_points = |claim, update| vec![("claim", claim, true), ("update", update, true)];
    let mut sqlite_points = vec![("claim", 5, false), ("update", 2, false)];
    sqlite_points.extend(batch_points(8, 12));
    stores.push(("sqlite", Spec(format!("sqlite:{}", sqlite.path.display())), sqlite_points));
    #[cfg(feature = "postgres")]
    if let Some(db) = postgres_spec("q4") {
        let mut points = vec![("claim", 2, false), ("update", 2, false)];
        points.extend(batch_points(2, 10));
        stores.push(("postgres", db, points));
    }
    stores
}

/// A fresh schema for the crash test (`common::postgres`), as a worker's store spec.
#[cfg(feature = "postgres")]
fn postgres_spec(name: &str) -> Option<Spec> {
    common::postgres(&format!("crash_{name}")).map(|db| Spec(format!("postgres:{}", db.params)))
}

fn main() {
    if let Ok(spec) = std::env::var("PERSEVERE_CRASH_WORKER") {
        worker_main(&spec);
        return;
    }
    // `cargo test` passes filters and flags (`--nocapture`, a test name); this harness runs
    // everything unless asked to list.
    if std::env::args().any(|a| a == "--list") {
        println!("q4_killed_workers_lose_nothing: test");
        return;
    }
    let seed = std::env::var("PERSEVERE_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_0004);
    let mut failed = false;
    for (name, spec, statements) in stores() {
        let log = std::env::temp_dir().join(format!("persevere-crash-{}-{name}.log", std::process::id()));
        let started = Instant::now();
        let wrong = q4_killed_workers_lose_nothing(spec.clone(), log.clone(), &statements, seed);
        println!(
            "{name}: q4_killed_workers_lose_nothing (seed {seed}): {} problems in {:.1?}",
            wrong.len(),
            started.elapsed()
        );
        for problem in &wrong {
            println!("  {problem}");
        }
        failed |= !wrong.is_empty();

        // The same checks catch a claim whose state is written outside its transaction.
        let broken_spec = match name {
            "sqlite" => Spec(format!("{}-broken", spec.0)),
            _ => spec.clone(),
        };
        if name == "postgres" {
            #[cfg(feature = "postgres")]
            let _ = postgres_spec("q4");
        }
        let wrong = scenario(broken_spec, log, &[], 0, true, seed);
        println!(
            "{name}: with the claim broken, the checks found {} problems, first: {:?}",
            wrong.len(),
            wrong.first()
        );
        if wrong.iter().all(|w| !w.contains("was started by")) {
            println!("  the checks missed the broken claim: {wrong:?}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

fn q4_killed_workers_lose_nothing(spec: Spec, log: PathBuf, statements: &[CrashPoint], seed: u64) -> Vec<String> {
    scenario(spec, log, statements, 40, false, seed)
}
