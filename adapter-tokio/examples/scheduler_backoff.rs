//! A flow every 200 ms whose job fails three times in a row: with a backoff from 300 ms, ×2,
//! capped at 2 s, jitter 0.1 and a trip after 3 failures, it trips; the example prints its
//! status, shows that it is not dispatched while tripped, resets it, and it recovers.
//!
//! `cargo run -p persevere-tokio --example scheduler_backoff`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use persevere::{Backoff, FlowPolicy, FlowStatus, Jitter};
use persevere_tokio::{Runtime, Scheduler};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = FlowPolicy::builder()
        .backoff(
            Backoff::exponential(Duration::from_millis(300), 2.0)
                .max_delay(Duration::from_secs(2))
                .jitter(Jitter::Proportional(0.1))
                .build()?,
        )
        .with_trip(3)
        .build()?;

    let runs = Arc::new(AtomicU32::new(0));
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut scheduler: Scheduler<&'static str, String> = Scheduler::new();
    let (r, h) = (runs.clone(), healthy.clone());
    let started = tokio::time::Instant::now();
    let started = move || started.elapsed();
    scheduler.every("sync", Duration::from_millis(200), move || {
        let n = r.fetch_add(1, Ordering::SeqCst) + 1;
        let ok = h.load(Ordering::SeqCst);
        let at = started().as_millis();
        async move {
            println!("{at:>5} ms  run {n}: {}", if ok { "ok" } else { "upstream unavailable" });
            if ok { Ok(()) } else { Err("upstream unavailable".to_string()) }
        }
    })?;
    scheduler.set_backoff(&"sync", policy)?;
    let handle = scheduler.start();

    // Watch it back off, then trip.
    let mut last = None;
    loop {
        let info = handle.status(&"sync")?;
        let now = handle.runtime().now();
        let ms = now.since_epoch().as_millis();
        if last != Some(info.clone()) {
            match &info.status {
                FlowStatus::Backoff { until, streak, .. } => println!(
                    "{ms:>5} ms  backoff: streak {streak}, next run in {} ms",
                    until.saturating_duration_since(now).as_millis()
                ),
                other => println!("{ms:>5} ms  status {:?}, streak {}", other.kind(), info.failure_streak),
            }
        }
        if matches!(info.status, FlowStatus::Tripped { .. }) {
            println!("tripped: {info:?}");
            break;
        }
        last = Some(info);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Tripped flows are never dispatched (F10), and cannot be triggered (F7).
    let runs_when_tripped = runs.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let refused = handle.trigger(&"sync").unwrap_err();
    println!("600 ms later: {} runs (still {runs_when_tripped}); trigger: {refused}", runs.load(Ordering::SeqCst));

    // The upstream is back: reset, and the flow runs again on its schedule.
    healthy.store(true, Ordering::SeqCst);
    handle.reset_flow(&"sync")?;
    println!("after reset: {:?}", handle.status(&"sync")?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = handle.status(&"sync")?;
    println!("recovered: {info:?}");
    assert!(info.run_count >= 5 && info.failure_streak == 0, "the flow recovered");
    handle.stop();
    handle.wait().await;
    Ok(())
}
