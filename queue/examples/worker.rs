//! A producer and two runners on one SQLite file, no set-up: retries with backoff, a dead
//! letter, a re-drive, and graceful shutdowns.
//!
//! `cargo run -p persevere-queue --example worker`

use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy};
use persevere_queue::{Handled, Job, NewTask, Queue, QueueError, RunReport, Runner, ShutdownHandle, Sqlite, Status};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("persevere-queue-example-{}.sqlite3", std::process::id()));
    let mut producer = Queue::new(Sqlite::open(&path)?);

    // Two runners without a GPU, each with its own connection and two handlers. They sleep
    // until a task comes: each commit of the producer wakes them.
    let cpus = [start(&path, "cpu-1", &["email", "render"], cpu)?, start(&path, "cpu-2", &["email", "render"], cpu)?];

    // Three attempts, 50 ms then 100 ms apart; a task that declined twice is dead-lettered.
    let retry =
        RetryPolicy::builder(Backoff::exponential(Duration::from_millis(50), 2.0).build()?).max_attempts(3).build()?;
    let policy = DeliveryPolicy::builder(retry).max_redeliveries(1).build()?;
    for name in ["ada", "grace", "edsger"] {
        producer.enqueue(NewTask::new("email", format!("welcome {name}"), policy).key(format!("welcome-{name}")))?;
    }
    // Enqueued twice, stored once (the idempotency key).
    let again = producer.enqueue(NewTask::new("email", "welcome ada", policy).key("welcome-ada"))?;
    println!("enqueued 3 emails (the second 'welcome-ada' returned task {} again)", again.id);
    let render = producer.enqueue(NewTask::new("render", "needs a gpu", policy))?.id;

    wait_for(&mut producer, |queue| {
        Ok(queue.tasks(Status::Completed, 10)?.len() == 3 && queue.task(render)?.status == Status::DeadLettered)
    })?;
    for (name, stop, runner) in cpus {
        // Both are idle: nothing is running, and the shutdown returns at once.
        stop.shutdown(Duration::from_secs(5));
        println!("{name}: {:?}", runner.join().expect("a runner panicked"));
    }

    for task in producer.tasks(Status::Completed, 10)? {
        println!(
            "completed: {} {:?} after {} attempt(s)",
            task.id,
            String::from_utf8_lossy(&task.payload),
            task.attempt()
        );
    }
    let letters = producer.tasks(Status::DeadLettered, 10)?;
    for task in &letters {
        println!("dead letter: {} {:?}: {:?}", task.id, String::from_utf8_lossy(&task.payload), task.terminal());
    }
    assert_eq!(producer.tasks(Status::Completed, 10)?.len(), 3);
    assert_eq!(letters.iter().map(|t| t.id).collect::<Vec<_>>(), [render]);

    // An operator adds a GPU runner and re-drives the dead letter.
    let (name, stop, gpu) = start(&path, "gpu-1", &["render"], |job| {
        println!("gpu-1: task {} attempt {}: rendered", job.id, job.attempt);
        Handled::Completed
    })?;
    producer.redrive(render)?;
    wait_for(&mut producer, |queue| Ok(queue.task(render)?.status == Status::Completed))?;
    stop.shutdown(Duration::from_secs(5));
    let report = gpu.join().expect("a runner panicked");
    println!("{name}: {report:?}");
    assert_eq!(report.completed, 1);

    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}

/// What a worker without a GPU does with a job.
fn cpu(job: &Job) -> Handled {
    let payload = String::from_utf8_lossy(&job.payload);
    let handled = if payload == "needs a gpu" {
        Handled::Declined
    } else if payload.contains("grace") && job.attempt < 3 {
        // Grace's mail server is down for the first two attempts.
        Handled::Failed(Failure::retryable(format!("smtp timeout (attempt {})", job.attempt)))
    } else {
        Handled::Completed
    };
    println!("{}: task {} attempt {}: {handled:?}", job.worker, job.id, job.attempt);
    handled
}

/// A runner called `name` on a connection of its own, on a thread of its own.
fn start(
    path: &Path,
    name: &'static str,
    types: &[&str],
    handler: fn(&Job) -> Handled,
) -> Result<(&'static str, ShutdownHandle, JoinHandle<RunReport>), QueueError> {
    let runner = Runner::builder(Queue::new(Sqlite::open(path)?), name, types).concurrency(2).build();
    let stop = runner.shutdown_handle();
    Ok((name, stop, std::thread::spawn(move || runner.run_blocking(handler))))
}

/// Waits up to 10 s for `done`.
fn wait_for(
    queue: &mut Queue<Sqlite>,
    mut done: impl FnMut(&mut Queue<Sqlite>) -> Result<bool, QueueError>,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    while !done(queue)? {
        if start.elapsed() > Duration::from_secs(10) {
            return Err("the runners did not finish in 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
