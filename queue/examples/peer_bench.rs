//! persevere's side of the side-by-side benchmark with graphile-worker (`queue/peer-bench/`):
//! the same modes and the same one line of JSON as `queue/peer-bench/graphile.mjs`.
//!
//! ```text
//! cargo run --release -p persevere-queue --example peer_bench --features postgres -- \
//!     MODE --store postgres:<libpq params>|sqlite:<path> [options]
//! ```
//!
//! - `migrate`: opens the store, which creates the queue's table.
//! - `enqueue-single`: `--tasks` no-op tasks, one `enqueue` each.
//! - `enqueue-batch`: the same tasks in one `enqueue_batch` call.
//! - `execute`: runs the `--tasks` tasks already in the store (run `enqueue-batch` first) on a
//!   [`Runner`] with `--concurrency` handlers (threads) and, with `--buffer`, that many claimed
//!   jobs buffered, and with `--retention-s`, finished rows kept that long (0: deleted with
//!   their completion, as graphile-worker does), and with `--handlers async` the handlers as
//!   async functions on one tokio thread (`Runner::run`) rather than a thread each; tasks/s
//!   from the first handler start until the store shows every task done.
//! - `latency`: an idle runner (concurrency 1); `--samples` tasks enqueued `--interval-ms`
//!   apart; pick-up latency from the call to `enqueue` to the start of the handler (the
//!   producer writes its clock's reading into the payload, the handler subtracts it from its
//!   own).
//!
//! `queue/peer-bench/run.sh` runs it beside graphile-worker and prints the table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
use persevere_queue::{Handled, NewTask, Postgres, Queue, QueueError, Runner, Sqlite, Status, Store};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The command line.
struct Args {
    mode: String,
    store: String,
    tasks: u64,
    concurrency: usize,
    samples: usize,
    warmup: usize,
    interval: Duration,
    /// The runner's buffer of claimed jobs (`None`: its default, as many as `concurrency`).
    buffer: Option<usize>,
    /// How long the runner keeps finished tasks (`None`: its default, a day); zero deletes
    /// each row with its completion, as graphile-worker does.
    retention: Option<Duration>,
    /// The handlers as async functions on one tokio thread (`--handlers async`, as
    /// graphile-worker's on node's event loop) rather than one thread each (`threads`).
    async_handlers: bool,
}

fn usage(message: &str) -> ! {
    eprintln!(
        "{message}\nusage: peer_bench migrate|enqueue-single|enqueue-batch|execute|latency --store postgres:PARAMS|sqlite:PATH \
         [--tasks N] [--concurrency N] [--buffer N] [--retention-s S] [--handlers async|threads] [--samples N] [--interval-ms MS]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().unwrap_or_else(|| usage("no mode"));
    let mut args = Args {
        mode,
        store: String::new(),
        tasks: 20_000,
        concurrency: 1,
        samples: 200,
        warmup: 5,
        interval: Duration::from_millis(20),
        buffer: None,
        retention: None,
        async_handlers: false,
    };
    while let Some(key) = argv.next() {
        let value = argv.next().unwrap_or_else(|| usage(&format!("{key} needs a value")));
        let number = || value.parse::<u64>().unwrap_or_else(|_| usage(&format!("{key}: not a number: {value}")));
        match key.as_str() {
            "--store" => args.store = value.clone(),
            "--tasks" => args.tasks = number(),
            "--concurrency" => args.concurrency = usize::try_from(number()).unwrap_or(usize::MAX),
            "--samples" => args.samples = usize::try_from(number()).unwrap_or(usize::MAX),
            "--warmup" => args.warmup = usize::try_from(number()).unwrap_or(usize::MAX),
            "--interval-ms" => args.interval = Duration::from_millis(number()),
            "--buffer" => args.buffer = Some(usize::try_from(number()).unwrap_or(usize::MAX)),
            "--retention-s" => args.retention = Some(Duration::from_secs(number())),
            "--handlers" => match value.as_str() {
                "async" => args.async_handlers = true,
                "threads" => args.async_handlers = false,
                _ => usage(&format!("--handlers: async or threads, not {value}")),
            },
            _ => usage(&format!("unknown option {key}")),
        }
    }
    args
}

/// Where the queue is: each call opens a connection of its own.
trait Db: Sync {
    type S: Store + Send + 'static;
    /// `postgres` or `sqlite`, for the output.
    const NAME: &'static str;
    fn open(&self) -> Result<Queue<Self::S>, QueueError>;
}

struct Pg(String);

impl Db for Pg {
    type S = Postgres;
    const NAME: &'static str = "postgres";
    fn open(&self) -> Result<Queue<Postgres>, QueueError> {
        Ok(Queue::new(Postgres::connect(&self.0)?))
    }
}

struct Lite(String);

impl Db for Lite {
    type S = Sqlite;
    const NAME: &'static str = "sqlite";
    fn open(&self) -> Result<Queue<Sqlite>, QueueError> {
        Ok(Queue::new(Sqlite::open(&self.0)?))
    }
}

/// A no-op task's policy: five attempts, exponential backoff from 100 ms (the crate's
/// throughput bench uses the same).
fn policy() -> DeliveryPolicy {
    let backoff = Backoff::exponential(Duration::from_millis(100), 2.0).build().expect("a valid backoff");
    let retry = RetryPolicy::builder(backoff).max_attempts(5).build().expect("a valid retry policy");
    DeliveryPolicy::builder(retry).build().expect("a valid delivery policy")
}

fn noop_tasks(n: u64) -> Vec<NewTask> {
    let policy = policy();
    (0..n).map(|_| NewTask::new("noop", "{}", policy)).collect()
}

fn emit<D: Db>(mode: &str, mut fields: serde_json::Value) {
    let object = fields.as_object_mut().expect("an object");
    object.insert("system".into(), format!("persevere-{}", D::NAME).into());
    object.insert("mode".into(), mode.into());
    println!("{fields}");
}

fn enqueue<D: Db>(db: &D, args: &Args, batch: bool) -> Result<(), BoxError> {
    let mut queue = db.open()?;
    let tasks = noop_tasks(args.tasks);
    let started = Instant::now();
    if batch {
        enqueue_batch(&mut queue, tasks)?;
    } else {
        for task in tasks {
            queue.enqueue(task)?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    emit::<D>(
        &args.mode,
        serde_json::json!({ "tasks": args.tasks, "seconds": seconds, "tasks_per_s": args.tasks as f64 / seconds }),
    );
    Ok(())
}

/// All of `tasks` in one transaction.
fn enqueue_batch<S: Store>(queue: &mut Queue<S>, tasks: Vec<NewTask>) -> Result<(), QueueError> {
    let n = tasks.len();
    let enqueued = queue.enqueue_batch(tasks)?;
    assert_eq!(enqueued.len(), n, "enqueue_batch returned {} tasks, not {n}", enqueued.len());
    Ok(())
}

/// What the handlers of one run share.
#[derive(Default)]
struct Shared {
    /// When the first handler started.
    first_start: OnceLock<Instant>,
    /// Handlers that have returned.
    handled: AtomicU64,
    /// When the store first showed every task complete.
    end: OnceLock<Instant>,
    /// Reports refused (a lease lost while waiting), interrupted or not written.
    errors: AtomicU64,
}

/// Runs `handler` on a [`Runner`] with `concurrency` handlers (threads) until it has run
/// `total` times and the store shows no task left to run, then shuts the runner down.
fn work<D: Db>(
    db: &D,
    args: &Args,
    concurrency: usize,
    shared: &Arc<Shared>,
    handler: impl Fn(&[u8]) + Send + Sync + 'static,
    total: u64,
) -> Result<(), BoxError> {
    let mut builder = Runner::builder(db.open()?, "worker-1", &["noop"]).concurrency(concurrency);
    if let Some(buffer) = args.buffer {
        builder = builder.buffer(buffer);
    }
    if let Some(retention) = args.retention {
        builder = builder.retention(Some(retention));
    }
    let runner = builder.build();
    let stop = runner.shutdown_handle();
    let counts = Arc::clone(shared);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let done = watch(db, shared, total);
            stop.shutdown(Duration::from_secs(10));
            done
        });
        let handler = Arc::new(move |job: &persevere_queue::Job| {
            counts.first_start.get_or_init(Instant::now);
            handler(&job.payload);
            counts.handled.fetch_add(1, Ordering::AcqRel);
            Handled::Completed
        });
        let report = if args.async_handlers {
            // The handlers as async functions on one thread, as graphile-worker's on node's loop.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(runner.run(move |job| {
                let handler = Arc::clone(&handler);
                async move { handler(&job) }
            }))
        } else {
            runner.run_blocking(move |job| handler(job))
        };
        shared.errors.fetch_add(report.leases_lost + report.interrupted + report.unreported, Ordering::Relaxed);
        watcher.join().expect("the watcher panicked")
    })
}

/// Waits until `total` handlers have returned, then until the store (on a connection of its
/// own) shows no task pending or leased: every completion is written. Notes when in `shared`.
fn watch<D: Db>(db: &D, shared: &Shared, total: u64) -> Result<(), BoxError> {
    let mut queue = db.open()?;
    while shared.handled.load(Ordering::Acquire) < total {
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        let mut left = false;
        for status in [Status::Pending, Status::HandedOut, Status::Running] {
            left |= !queue.tasks(status, 1)?.is_empty();
        }
        if !left {
            let _ = shared.end.set(Instant::now());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn execute<D: Db>(db: &D, args: &Args) -> Result<(), BoxError> {
    let shared = Arc::new(Shared::default());
    work(db, args, args.concurrency, &shared, |_: &[u8]| {}, args.tasks)?;
    let first = *shared.first_start.get().ok_or("no task ran")?;
    let end = *shared.end.get().ok_or("the run ended before every task completed")?;
    let seconds = (end - first).as_secs_f64();
    emit::<D>(
        &args.mode,
        serde_json::json!({
            "concurrency": args.concurrency,
            "buffer": args.buffer,
            "retention_s": args.retention.map(|r| r.as_secs()),
            "tasks": args.tasks,
            "seconds": seconds,
            "tasks_per_s": args.tasks as f64 / seconds,
            "errors": shared.errors.load(Ordering::Relaxed),
        }),
    );
    Ok(())
}

/// Microseconds since the Unix epoch on this machine's wall clock.
fn wall_micros() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_micros()).unwrap_or(u64::MAX)
}

/// Nearest rank.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

fn latency<D: Db>(db: &D, args: &Args) -> Result<(), BoxError> {
    let total = args.warmup + args.samples;
    let delays = Arc::new(Mutex::new(vec![None::<f64>; total]));
    let shared = Arc::new(Shared::default());
    // The payload is "<index> <wall-clock microseconds at the call to enqueue>".
    let recorded = Arc::clone(&delays);
    let handler = move |payload: &[u8]| {
        let received = wall_micros();
        let text = std::str::from_utf8(payload).expect("a text payload");
        let (index, sent) = text.split_once(' ').expect("an index and a time");
        let (index, sent): (usize, u64) = (index.parse().expect("an index"), sent.parse().expect("a time"));
        recorded.lock().expect("not poisoned")[index] = Some(received.saturating_sub(sent) as f64 / 1000.0);
    };
    let mut producer = db.open()?;
    let policy = policy();
    std::thread::scope(|scope| -> Result<(), BoxError> {
        let worker = scope.spawn(|| work(db, args, 1, &shared, handler, total as u64));
        // Let the runner connect, listen and find nothing: it is idle when the first task comes.
        std::thread::sleep(Duration::from_millis(500));
        let origin = Instant::now();
        for i in 0..total {
            let at = origin + args.interval * u32::try_from(i).unwrap_or(u32::MAX);
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            producer.enqueue(NewTask::new("noop", format!("{i} {}", wall_micros()), policy))?;
        }
        worker.join().expect("the worker panicked")
    })?;
    let mut samples: Vec<f64> =
        delays.lock().expect("not poisoned")[args.warmup..].iter().map(|d| d.expect("every task ran")).collect();
    samples.sort_by(f64::total_cmp);
    emit::<D>(
        &args.mode,
        serde_json::json!({
            "tasks": total,
            "samples": samples.len(),
            "interval_ms": args.interval.as_secs_f64() * 1000.0,
            "p50_ms": percentile(&samples, 50.0),
            "p99_ms": percentile(&samples, 99.0),
            "max_ms": samples[samples.len() - 1],
            "errors": shared.errors.load(Ordering::Relaxed),
        }),
    );
    Ok(())
}

fn run<D: Db>(db: &D, args: &Args) -> Result<(), BoxError> {
    match args.mode.as_str() {
        "migrate" => {
            db.open()?;
            emit::<D>(&args.mode, serde_json::json!({}));
            Ok(())
        }
        "enqueue-single" => enqueue(db, args, false),
        "enqueue-batch" => enqueue(db, args, true),
        "execute" => execute(db, args),
        "latency" => latency(db, args),
        other => usage(&format!("unknown mode {other}")),
    }
}

fn main() -> Result<(), BoxError> {
    let args = parse_args();
    if let Some(params) = args.store.strip_prefix("postgres:") {
        run(&Pg(params.to_owned()), &args)
    } else if let Some(path) = args.store.strip_prefix("sqlite:") {
        run(&Lite(path.to_owned()), &args)
    } else {
        usage("--store is postgres:<libpq params> or sqlite:<path>")
    }
}
