//! Tasks per second through the queue (enqueue, claim, complete) with 1, 2, 4 and 8 workers on
//! each store, against a hand-written claim/complete loop on the same schema, measured in the
//! same run.
//!
//! `cargo bench -p persevere-queue --bench throughput` (SQLite); with `--features postgres` and
//! `PERSEVERE_PG_URL` set (see `tests/common/mod.rs`), PostgreSQL too.
//!
//! One iteration: each of `w` worker threads, on its own connection, enqueues `BATCH / w` tasks
//! and then claims and completes tasks until none is due. The hand-written loop is what a
//! careful programmer writes without a state machine: an `INSERT`; a claim that selects the
//! oldest due row (`FOR UPDATE SKIP LOCKED` on PostgreSQL, in `BEGIN IMMEDIATE` on SQLite) and
//! marks it leased with a deadline from the database's clock; a completion that is one guarded
//! `UPDATE` (still leased, to this worker, for this attempt). It keeps no retry state: what
//! persevere adds is the redelivery machine's state, decoded, decided and written back in the
//! same transactions.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
use persevere_queue::{NewTask, Queue, Store};

const BATCH: u64 = 400;

fn policy() -> DeliveryPolicy {
    let retry = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap();
    DeliveryPolicy::builder(retry).build().unwrap()
}

/// One database for one implementation: how to open a connection of each kind.
trait Db: Sync {
    type S: Store + Send;
    type Raw: Send;
    fn store(&self) -> Self::S;
    fn raw(&self) -> Self::Raw;
    fn raw_enqueue(raw: &mut Self::Raw);
    fn raw_claim(raw: &mut Self::Raw, worker: &str) -> Option<(i64, i64)>;
    fn raw_complete(raw: &mut Self::Raw, id: i64, worker: &str, attempt: i64) -> bool;
}

struct SqliteDb(std::path::PathBuf);

const SQLITE_NOW: &str = "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000000";

impl Db for SqliteDb {
    type S = persevere_queue::Sqlite;
    type Raw = persevere_queue::Sqlite;
    fn store(&self) -> Self::S {
        persevere_queue::Sqlite::open(&self.0).unwrap()
    }
    fn raw(&self) -> Self::Raw {
        persevere_queue::Sqlite::open(&self.0).unwrap()
    }
    fn raw_enqueue(raw: &mut Self::Raw) {
        raw.connection()
            .prepare_cached(&format!(
                "INSERT INTO persevere_tasks (task_type, payload, policy, state, version, status, due_at, attempt,
                 created_at, updated_at) VALUES ('job', x'00', '', '', 0, 'pending', {SQLITE_NOW}, 0, 0, 0)"
            ))
            .unwrap()
            .execute([])
            .unwrap();
    }
    fn raw_claim(raw: &mut Self::Raw, worker: &str) -> Option<(i64, i64)> {
        let tx = raw.connection().transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).unwrap();
        let claimed = tx
            .prepare_cached(&format!(
                "UPDATE persevere_tasks SET status = 'handed_out', state = ?1, due_at = {SQLITE_NOW} + 10000000000,
                 attempt = attempt + 1, version = version + 1
                 WHERE id = (SELECT id FROM persevere_tasks WHERE task_type = 'job' AND due_at <= {SQLITE_NOW}
                             ORDER BY due_at LIMIT 1)
                 RETURNING id, attempt"
            ))
            .unwrap()
            .query_row([worker], |row| Ok((row.get(0)?, row.get(1)?)))
            .ok();
        tx.commit().unwrap();
        claimed
    }
    fn raw_complete(raw: &mut Self::Raw, id: i64, worker: &str, attempt: i64) -> bool {
        raw.connection()
            .prepare_cached(
                "UPDATE persevere_tasks SET status = 'completed', due_at = NULL, version = version + 1
                 WHERE id = ?1 AND status = 'handed_out' AND state = ?2 AND attempt = ?3",
            )
            .unwrap()
            .execute(rusqlite::params![id, worker, attempt])
            .unwrap()
            == 1
    }
}

#[cfg(feature = "postgres")]
struct PgDb(String);

/// The database's clock as the queue reads it: `statement_timestamp()` is stable within a
/// statement, so a bound on it is an index condition. (`clock_timestamp()`, which an earlier
/// version used, is volatile: the claim became a filter over every row of the type, sorted, and
/// the hand-written loop slowed down as the table grew.)
#[cfg(feature = "postgres")]
const PG_NOW: &str = "((extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000)";

#[cfg(feature = "postgres")]
struct PgRaw {
    client: postgres::Client,
    enqueue: postgres::Statement,
    claim: postgres::Statement,
    complete: postgres::Statement,
}

#[cfg(feature = "postgres")]
impl Db for PgDb {
    type S = persevere_queue::Postgres;
    type Raw = PgRaw;
    fn store(&self) -> Self::S {
        persevere_queue::Postgres::connect(&self.0).unwrap()
    }
    fn raw(&self) -> Self::Raw {
        // The queue's connect creates the schema; the loop then runs on a plain client.
        drop(persevere_queue::Postgres::connect(&self.0).unwrap());
        let mut client = postgres::Client::connect(&self.0, postgres::NoTls).unwrap();
        let enqueue = client
            .prepare(&format!(
                "INSERT INTO persevere_tasks (task_type, payload, policy, state, version, status, due_at, attempt,
                 created_at, updated_at) VALUES ('job', '\\x00', '', '', 0, 'pending', {PG_NOW}, 0, 0, 0)"
            ))
            .unwrap();
        let claim = client
            .prepare(&format!(
                "UPDATE persevere_tasks SET status = 'handed_out', state = $1, due_at = {PG_NOW} + 10000000000,
                 attempt = attempt + 1, version = version + 1
                 WHERE id = (SELECT id FROM persevere_tasks WHERE task_type = 'job' AND due_at <= {PG_NOW}
                             ORDER BY due_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, attempt"
            ))
            .unwrap();
        let complete = client
            .prepare(
                "UPDATE persevere_tasks SET status = 'completed', due_at = NULL, version = version + 1
                 WHERE id = $1 AND status = 'handed_out' AND state = $2 AND attempt = $3",
            )
            .unwrap();
        PgRaw { client, enqueue, claim, complete }
    }
    fn raw_enqueue(raw: &mut Self::Raw) {
        raw.client.execute(&raw.enqueue, &[]).unwrap();
    }
    fn raw_claim(raw: &mut Self::Raw, worker: &str) -> Option<(i64, i64)> {
        raw.client.query_opt(&raw.claim, &[&worker]).unwrap().map(|row| (row.get(0), row.get(1)))
    }
    fn raw_complete(raw: &mut Self::Raw, id: i64, worker: &str, attempt: i64) -> bool {
        raw.client.execute(&raw.complete, &[&id, &worker, &attempt]).unwrap() == 1
    }
}

/// `iters` rounds of `BATCH` tasks through `workers` threads of persevere's queue.
fn persevere_rounds<D: Db>(db: &D, workers: u64, iters: u64) -> Duration {
    let mut queues: Vec<Queue<D::S>> = (0..workers).map(|_| Queue::new(db.store())).collect();
    let policy = policy();
    let started = Instant::now();
    for _ in 0..iters {
        std::thread::scope(|scope| {
            for (w, queue) in queues.iter_mut().enumerate() {
                scope.spawn(move || {
                    for _ in 0..BATCH / workers {
                        queue.enqueue(NewTask::new("job", [0u8], policy)).unwrap();
                    }
                    let name = format!("w{w}");
                    while let Some(job) = queue.claim(&name, &["job"]).unwrap() {
                        queue.complete(&job).unwrap();
                    }
                });
            }
        });
    }
    started.elapsed()
}

/// The same with the hand-written loop.
fn hand_written_rounds<D: Db>(db: &D, workers: u64, iters: u64) -> Duration {
    let mut raws: Vec<D::Raw> = (0..workers).map(|_| db.raw()).collect();
    let started = Instant::now();
    for _ in 0..iters {
        std::thread::scope(|scope| {
            for (w, raw) in raws.iter_mut().enumerate() {
                scope.spawn(move || {
                    for _ in 0..BATCH / workers {
                        D::raw_enqueue(raw);
                    }
                    let name = format!("w{w}");
                    while let Some((id, attempt)) = D::raw_claim(raw, &name) {
                        assert!(D::raw_complete(raw, id, &name, attempt));
                    }
                });
            }
        });
    }
    started.elapsed()
}

/// The median of `times`.
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    let mid = times.len() / 2;
    if times.len() % 2 == 1 { times[mid] } else { (times[mid - 1] + times[mid]) / 2 }
}

/// Rounds of the two loops in alternation (which goes first alternates too), so that what
/// drifts on the machine while the bench runs (checkpoints, the page cache, other load) falls
/// on both alike; prints a table of medians and their ratio. Criterion's groups below measure
/// each loop in its own stretch of time, a minute apart.
fn interleaved<D: Db>(name: &str, persevere_db: &D, hand_db: &D) {
    const PAIRS: usize = 21;
    println!("\n{name}: {PAIRS} alternating pairs of rounds of {BATCH} tasks, after one pair of warm-up");
    println!("| workers | persevere-queue | hand-written loop | ratio of medians | ratio per pair, min–max |");
    println!("|---|---|---|---|---|");
    for workers in [1, 2, 4, 8] {
        let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..=PAIRS {
            let (p, h) = if pair % 2 == 0 {
                let h = hand_written_rounds(hand_db, workers, 1);
                (persevere_rounds(persevere_db, workers, 1), h)
            } else {
                let p = persevere_rounds(persevere_db, workers, 1);
                (p, hand_written_rounds(hand_db, workers, 1))
            };
            if pair > 0 {
                ours.push(p);
                theirs.push(h);
                ratios.push(p.as_secs_f64() / h.as_secs_f64());
            }
        }
        ratios.sort_by(f64::total_cmp);
        let (p, h) = (median(&mut ours), median(&mut theirs));
        println!(
            "| {workers} | {:.0} ms | {:.0} ms | {:.2} | {:.2}–{:.2} |",
            p.as_secs_f64() * 1e3,
            h.as_secs_f64() * 1e3,
            p.as_secs_f64() / h.as_secs_f64(),
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
}

fn store_benches<D: Db>(c: &mut Criterion, name: &str, persevere_db: &D, hand_db: &D) {
    interleaved(name, persevere_db, hand_db);
    let mut group = c.benchmark_group(format!("throughput/{name}"));
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(BATCH));
    for workers in [1, 2, 4, 8] {
        group.bench_with_input(BenchmarkId::new("hand_written", workers), &workers, |b, &w| {
            b.iter_custom(|iters| hand_written_rounds(hand_db, w, iters));
        });
        group.bench_with_input(BenchmarkId::new("persevere", workers), &workers, |b, &w| {
            b.iter_custom(|iters| persevere_rounds(persevere_db, w, iters));
        });
    }
    group.finish();
}

fn sqlite(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("persevere-queue-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (SqliteDb(dir.join("persevere.sqlite3")), SqliteDb(dir.join("hand.sqlite3")));
    store_benches(c, "sqlite", &a, &b);
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion) {
    let Ok(url) = std::env::var("PERSEVERE_PG_URL") else {
        eprintln!("PERSEVERE_PG_URL is not set: the PostgreSQL benches are skipped");
        return;
    };
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut db = |schema: &str| {
        admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).unwrap();
        PgDb(format!("{url} options='-c search_path={schema}'"))
    };
    let (a, b) = (db("bench_persevere"), db("bench_hand"));
    store_benches(c, "postgres", &a, &b);
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion) {}

criterion_group!(benches, sqlite, postgres);
criterion_main!(benches);
