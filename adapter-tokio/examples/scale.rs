//! 10,000 flows on one scheduler and 10,000 supervised periodic tasks at once, on tokio with
//! real time: memory per flow and per task, and how late dispatches are.
//!
//! `cargo run --release -p persevere-tokio --example scale`
//!
//! Lateness of a run or attempt is its start minus (the previous one's end + the interval),
//! both read by the job itself, so it also counts the time the driver takes to record the
//! previous result: an upper bound on the timer's own lateness. Memory is the change of the
//! resident set (`/proc/self/statm`, 4 KiB pages) divided by the count, after one round.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use persevere::{Flow, FlowPolicy, Supervision, TaskDefaults};
use persevere_tokio::{JobError, Scheduler, Supervisor, TaskSpec};

const N: usize = 10_000;
const INTERVAL: Duration = Duration::from_millis(100);
const RUN_FOR: Duration = Duration::from_secs(2);

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()).unwrap_or(0) * 4096
}

/// Per-job bookkeeping: the previous end, and a shared sink of lateness samples (µs).
#[derive(Clone)]
struct Lateness {
    base: StdInstant,
    samples: Arc<Mutex<Vec<u32>>>,
}

impl Lateness {
    fn start(&self, previous_end: &AtomicU64) -> u64 {
        let now = self.base.elapsed().as_nanos() as u64;
        let prev = previous_end.load(Ordering::Relaxed);
        if prev != 0 {
            let due = prev + INTERVAL.as_nanos() as u64;
            let late_us = now.saturating_sub(due) / 1_000;
            self.samples.lock().unwrap().push(late_us.min(u64::from(u32::MAX)) as u32);
        }
        now
    }

    fn end(&self, previous_end: &AtomicU64) {
        previous_end.store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn report(&self, what: &str) {
        let mut samples = std::mem::take(&mut *self.samples.lock().unwrap());
        samples.sort_unstable();
        let pick = |q: f64| samples.get(((samples.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
        println!(
            "{what}: {} dispatches measured; lateness p50 {} µs, p99 {} µs, max {} µs",
            samples.len(),
            pick(0.5),
            pick(0.99),
            samples.last().copied().unwrap_or(0)
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "state sizes: Flow<JobError<String>> {} B, Supervision<JobError<String>> {} B, FlowPolicy {} B (shared by all flows)",
        size_of::<Flow<JobError<String>>>(),
        size_of::<Supervision<JobError<String>>>(),
        size_of::<FlowPolicy>(),
    );

    // ---- 10,000 flows, one timer loop.
    let lateness = Lateness { base: StdInstant::now(), samples: Arc::new(Mutex::new(Vec::with_capacity(N * 25))) };
    let before = rss_bytes();
    let mut scheduler: Scheduler<u32, String> = Scheduler::new();
    for id in 0..N as u32 {
        let (l, previous_end) = (lateness.clone(), Arc::new(AtomicU64::new(0)));
        scheduler.every(id, INTERVAL, move || {
            let (l, previous_end) = (l.clone(), previous_end.clone());
            l.start(&previous_end);
            async move {
                l.end(&previous_end);
                Ok(())
            }
        })?;
    }
    let started = StdInstant::now();
    let handle = scheduler.start();
    tokio::time::sleep(INTERVAL / 2).await;
    let per_flow = rss_bytes().saturating_sub(before) / N as u64;
    tokio::time::sleep(RUN_FOR).await;
    handle.stop();
    handle.wait().await;
    let runs: u64 = handle.ids().iter().map(|id| handle.status(id).map_or(0, |i| i.run_count)).sum();
    println!(
        "scheduler: {N} flows every {INTERVAL:?} for {:.1} s: {runs} runs; {per_flow} B resident per flow (job closure, registry entry, due index, state)",
        started.elapsed().as_secs_f64()
    );
    lateness.report("scheduler");
    drop(handle);

    // ---- 10,000 supervised periodic tasks.
    let lateness = Lateness { base: StdInstant::now(), samples: Arc::new(Mutex::new(Vec::with_capacity(N * 25))) };
    let before = rss_bytes();
    let supervisor: Supervisor<u32, String> = Supervisor::new(TaskDefaults::new());
    let attempts = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::with_capacity(N);
    let started = StdInstant::now();
    for id in 0..N as u32 {
        let (l, previous_end, attempts) = (lateness.clone(), Arc::new(AtomicU64::new(0)), attempts.clone());
        handles.push(supervisor.add(id, TaskSpec::periodic(INTERVAL), move || {
            let (l, previous_end) = (l.clone(), previous_end.clone());
            attempts.fetch_add(1, Ordering::Relaxed);
            l.start(&previous_end);
            async move {
                l.end(&previous_end);
                Ok(())
            }
        })?);
    }
    tokio::time::sleep(INTERVAL / 2).await;
    let per_task = rss_bytes().saturating_sub(before) / N as u64;
    tokio::time::sleep(RUN_FOR).await;
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    let mut canceled = 0;
    for handle in handles {
        canceled += usize::from(handle.await.outcome.kind() == persevere::TaskOutcomeKind::Canceled);
    }
    println!(
        "supervisor: {N} periodic tasks every {INTERVAL:?} for {:.1} s: {} attempts; {per_task} B resident per task (spawned driver, machine, registry entry); shutdown: {} completed, {} aborted, {canceled} canceled outcomes; {} events dropped (channel of {})",
        started.elapsed().as_secs_f64(),
        attempts.load(Ordering::Relaxed),
        report.completed.len(),
        report.aborted.len(),
        supervisor.dropped_events(),
        persevere_tokio::DEFAULT_EVENT_CAPACITY,
    );
    lateness.report("supervisor");
    Ok(())
}
