//! Two supervised tasks on tokio, printing their lifecycle events as they happen:
//! - `fetch`, restartable with exponential backoff from 100 ms and equal jitter, at most 3
//!   retries: it fails twice, then succeeds;
//! - `heartbeat`, periodic every 300 ms, stopped by a graceful shutdown after about 1.2 s.
//!
//! `cargo run -p persevere-tokio --example supervised`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use persevere::{Backoff, Jitter, SupervisionAction, TaskDefaults};
use persevere_tokio::{Supervisor, TaskSpec};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let supervisor: Supervisor<&'static str, String> = Supervisor::new(TaskDefaults::new());
    let events = supervisor.events();
    let printer = tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            let at = e.at.since_epoch().as_millis();
            match &e.event {
                SupervisionAction::AttemptStarting { attempt, .. } => {
                    println!("{at:>5} ms  {:<9} attempt {attempt} starting", e.id)
                }
                SupervisionAction::AttemptSucceeded { attempt } => {
                    println!("{at:>5} ms  {:<9} attempt {attempt} succeeded", e.id)
                }
                SupervisionAction::AttemptFailed { attempt, class } => {
                    println!("{at:>5} ms  {:<9} attempt {attempt} failed ({class:?})", e.id)
                }
                SupervisionAction::AttemptTimedOut { attempt } => {
                    println!("{at:>5} ms  {:<9} attempt {attempt} timed out", e.id)
                }
                SupervisionAction::AttemptCanceled { attempt } => {
                    println!("{at:>5} ms  {:<9} attempt {attempt} canceled", e.id)
                }
                SupervisionAction::BackoffScheduled { next_attempt, delay, .. } => {
                    println!("{at:>5} ms  {:<9} attempt {next_attempt} in {} ms", e.id, delay.as_millis())
                }
                SupervisionAction::TaskFinished { outcome, attempts } => {
                    println!("{at:>5} ms  {:<9} finished after {attempts} attempts: {outcome:?}", e.id);
                    if e.id == "heartbeat" {
                        break;
                    }
                }
            }
        }
    });

    let calls = Arc::new(AtomicU32::new(0));
    let fetch = supervisor.add(
        "fetch",
        TaskSpec::restartable()
            .backoff(Backoff::exponential(Duration::from_millis(100), 2.0).jitter(Jitter::Equal).build()?)
            .max_retries(3),
        move || {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if n < 3 { Err(format!("connection refused (call {n})")) } else { Ok(()) }
            }
        },
    )?;
    let beats = Arc::new(AtomicU32::new(0));
    let beats_seen = beats.clone();
    supervisor.add("heartbeat", TaskSpec::periodic(Duration::from_millis(300)), move || {
        beats.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    })?;

    let exit = fetch.await;
    println!("fetch's outcome: {:?} after {} attempts", exit.outcome, exit.attempts);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    println!("shutdown: completed {:?}, aborted {:?}", report.completed, report.aborted);
    println!(
        "heartbeat ran {} times; {} events dropped",
        beats_seen.load(Ordering::SeqCst),
        supervisor.dropped_events()
    );
    printer.await?;
    Ok(())
}
