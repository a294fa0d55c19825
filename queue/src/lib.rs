//! A durable work queue whose every decision is made by persevere's redelivery machine
//! ([`persevere::Delivery`], rules D1–D10), stored in SQLite (embedded, the default) or
//! PostgreSQL (feature `postgres`, for workers on many machines).
//!
//! Producers [`enqueue`](Queue::enqueue) tasks with a [`DeliveryPolicy`](persevere::DeliveryPolicy);
//! workers [`claim`](Queue::claim) due attempts of the task types they run, heartbeat, and
//! report `complete`, `fail` (with a [`Failure`](persevere::Failure) class) or `decline`.
//! Retries, their delays, interruptions of expired leases, free returns, dead letters and
//! failure policies are the core machine's decisions; the store only persists them, each in the
//! transaction that caused it (rules Q1–Q6; all the queue's rules are in the repository's
//! `docs/RULES.md`):
//!
//! - **Q1** a task's row holds its `Delivery` state (JSON), written by the same statement or
//!   transaction as the claim or report that changed it and guarded by a version column. (A
//!   task no claim has visited yet holds none: its state is its policy's fresh one at its
//!   `created_at`, so an enqueue is one `INSERT` that reads the clock itself.)
//! - **Q2** `now` is read from the database's clock in that transaction; no worker's clock
//!   sets or keeps a lease. (The one exception is the completion of a job its queue holds,
//!   decided at this connection's last reading of that clock moved on by the time elapsed
//!   since, and written only while the lease is ahead of the database's clock: see
//!   [`Queue::complete`].)
//! - **Q3** a claim leases one due attempt to one worker (`FOR UPDATE SKIP LOCKED` on
//!   PostgreSQL, one `BEGIN IMMEDIATE` transaction on SQLite); an expired lease is interrupted
//!   by whichever worker's claim or [`sweep`](Queue::sweep) meets it first.
//! - **Q4** a worker killed at any instant loses nothing: its lease expires and the next
//!   attempt runs elsewhere (a retry is used, D2).
//! - **Q5** idempotency keys given at enqueue are unique.
//! - **Q6** failed and dead-lettered tasks are rows to [`query`](Queue::tasks) and
//!   [`re-drive`](Queue::redrive).
//!
//! **Observability** (O2): with the `tracing` feature each task that ends is logged
//! (target `persevere::queue`, `task finished`), and with `metrics` counted
//! (`persevere_tasks_finished_total{status}`, `persevere_dead_letters_total`), once the write
//! that ended it has committed; a claim or report that fails tells nothing. A [`Runner`] adds
//! its own events (batches claimed and written, leases lost, store errors, shutdowns) and
//! counters, listed on its page.
//!
//! **Durability** (D6): every claim is committed, and flushed to disk, before its worker sees
//! the job: SQLite runs with `synchronous = FULL`, and a PostgreSQL connection whose
//! `synchronous_commit` is `off` is switched to `on`. So in
//! [`Durability::Sync`](persevere::Durability::Sync) (the default) no attempt number reaches two
//! workers, even across a power cut. (A failover to a PostgreSQL replica that had not received
//! the commit can still lose it: run synchronous replication for that.) The queue has no
//! asynchronous claim: a task with [`Durability::Async`](persevere::Durability::Async) is
//! claimed the same way and differs only in what it promises: its progress is `NotCompleted`
//! from the start (D6), so that if a committed claim is ever lost and the same attempt number
//! runs again (using no retry), nobody was told the handler certainly did not run.
//!
//! **What a task costs** on PostgreSQL: its enqueue inserts a row, its claim rewrites the row,
//! and its completion rewrites it again, or deletes it ([`Queue::keep_finished`], a runner's
//! zero [`retention`](RunnerBuilder::retention)), as graphile-worker deletes its jobs. The row
//! names its policy, stored once in `persevere_policies`, and each index holds only the rows its
//! queries look for (a table of the previous layout is brought up to date at `connect`).
//!
//! The API is blocking: one [`Queue`] is one database connection. Run a worker per thread (or
//! per process, or per machine), or a [`Runner`] (below); from async code, call it on a
//! blocking thread.
//!
//! ```
//! use std::time::Duration;
//! use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy};
//! use persevere_queue::{Handled, NewTask, Queue, Sqlite, Status, Worker};
//!
//! let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?;
//! let policy = DeliveryPolicy::builder(retry).build()?;
//! let mut queue = Queue::new(Sqlite::in_memory()?);
//! let id = queue.enqueue(NewTask::new("charge", "order-17", policy))?.id;
//!
//! let mut worker = Worker::new(queue, "worker-1", &["charge"]);
//! let first = worker.work_one(|_, _| Handled::Failed(Failure::retryable("gateway timeout".into())))?;
//! assert_eq!(first.map(|w| w.status), Some(Status::Pending)); // a retry is due
//! let second = worker.work_one(|job, _| {
//!     assert_eq!(job.attempt, 2);
//!     assert_eq!(job.idempotency_key, format!("{}:1", id.0)); // the same for every attempt
//!     Handled::Completed
//! })?;
//! assert_eq!(second.map(|w| w.status), Some(Status::Completed));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **A runner** (Q8): a [`Runner`] runs a handler on up to `concurrency` jobs at once, claims
//! them in batches ahead of its handlers (a local buffer) and writes their results in batches,
//! heartbeats each job while it waits or runs, and sleeps until tasks arrive: an insert into the
//! same SQLite file from this process, or a PostgreSQL `NOTIFY`, rings its [`Doorbell`]; a slow
//! poll (100 ms) finds the retries that come due. A [`ShutdownHandle`] stops it with a deadline:
//! buffered jobs are handed back (free, D3) and handlers still running at the deadline are
//! interrupted (a retry used, D2). [`run_blocking`](Runner::run_blocking) runs handlers on
//! threads; with the `tokio` feature, [`run`](Runner::run) runs async handlers on the current
//! runtime.
//!
//! ```
//! use std::time::Duration;
//! use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
//! use persevere_queue::{Handled, NewTask, Queue, Runner, Sqlite, Status};
//!
//! # let path = std::env::temp_dir().join(format!("persevere-queue-doc-runner-{}.sqlite3", std::process::id()));
//! let retry = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build()?).max_attempts(5).build()?;
//! let policy = DeliveryPolicy::builder(retry).build()?;
//!
//! let runner = Runner::builder(Queue::new(Sqlite::open(&path)?), "mailer-1", &["email"]).concurrency(8).build();
//! let stop = runner.shutdown_handle();
//! let mailer = std::thread::spawn(move || {
//!     runner.run_blocking(|job| {
//!         // Send the mail in `job.payload`, deduplicated on `job.idempotency_key`.
//!         Handled::Completed
//!     })
//! });
//!
//! // A producer on a connection of its own: each commit wakes the runner.
//! let mut producer = Queue::new(Sqlite::open(&path)?);
//! for to in ["ada", "grace", "edsger"] {
//!     producer.enqueue(NewTask::new("email", to, policy))?;
//! }
//! while producer.tasks(Status::Completed, 10)?.len() < 3 {
//!     std::thread::sleep(Duration::from_millis(5));
//! }
//! stop.shutdown(Duration::from_secs(30)); // running handlers get 30 s to finish
//! let report = mailer.join().expect("the runner's thread");
//! assert_eq!(report.completed, 3);
//! # for suffix in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{suffix}", path.display())); }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod crash;
mod error;
#[cfg(feature = "postgres")]
mod postgres;
mod queue;
mod runner;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod shared;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_file;
mod store;
mod task;
mod wake;
mod worker;

pub use error::QueueError;
#[cfg(feature = "postgres")]
pub use postgres::Postgres;
pub use queue::Queue;
pub use runner::{DEFAULT_RETENTION, MAX_BUFFER, RunReport, Runner, RunnerBuilder, ShutdownHandle};
#[cfg(feature = "sqlite")]
pub use sqlite::{Sqlite, SqliteOptions};
pub use store::{
    Candidates, ClaimVisit, FAR_AHEAD_NS, GuardedWrite, Insert, Row, SetAsideRow, Store, UpdateVisit, Visit, Write,
    declined_marker,
};
pub use task::{CorruptTask, Enqueued, IntoTaskPolicy, Job, NewTask, Status, TaskId, TaskInfo, TaskPolicy, TaskState};
pub use wake::Doorbell;
pub use worker::{Handled, Heartbeat, Worked, Worker};
