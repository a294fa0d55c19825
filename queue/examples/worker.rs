//! A producer and two workers on one SQLite file, no set-up: retries with backoff, a dead
//! letter, and a re-drive.
//!
//! `cargo run -p persevere-queue --example worker`

use std::time::Duration;

use persevere::{Backoff, DeliveryPolicy, Failure, RetryPolicy};
use persevere_queue::{Handled, NewTask, Queue, Sqlite, Status, Worker};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("persevere-queue-example-{}.sqlite3", std::process::id()));
    let mut producer = Queue::new(Sqlite::open(&path)?);

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

    // Two workers without a GPU, on threads of their own, each with its own connection.
    let workers: Vec<_> = ["cpu-1", "cpu-2"]
        .into_iter()
        .map(|name| {
            let path = path.clone();
            std::thread::spawn(move || -> Result<(), persevere_queue::QueueError> {
                let mut worker = Worker::new(Queue::new(Sqlite::open(&path)?), name, &["email", "render"]);
                let mut idle = 0;
                while idle < 20 {
                    let worked = worker.work_one(|job, _lease| {
                        let payload = String::from_utf8_lossy(&job.payload).into_owned();
                        if payload == "needs a gpu" {
                            return Handled::Declined;
                        }
                        // Grace's mail server is down for the first two attempts.
                        if payload.contains("grace") && job.attempt < 3 {
                            return Handled::Failed(Failure::retryable(format!(
                                "smtp timeout (attempt {})",
                                job.attempt
                            )));
                        }
                        Handled::Completed
                    })?;
                    match worked {
                        Some(w) => {
                            idle = 0;
                            println!("{name}: task {} attempt {}: {:?} -> {}", w.id, w.attempt, w.handled, w.status);
                        }
                        None => {
                            idle += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker panicked")?;
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

    // An operator adds a GPU worker and re-drives the dead letter.
    producer.redrive(render)?;
    let mut gpu = Worker::new(producer, "gpu-1", &["render"]);
    let worked = gpu.work_one(|_, _| Handled::Completed)?.expect("the re-driven task is due");
    println!("re-driven: gpu-1: task {} attempt {} -> {}", worked.id, worked.attempt, worked.status);
    assert_eq!(gpu.queue().task(render)?.status, Status::Completed);

    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}
