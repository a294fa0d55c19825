//! A soak of persevere's drivers on tokio's multi-thread runtime, in real time, with faults
//! injected. Each scenario prints a table (throughput, latency percentiles, invariants with
//! PASS/FAIL, live heap and RSS at start, middle and end, the RSS slope, allocations per unit of
//! work) and exits non-zero when an invariant fails.
//!
//! ```text
//! cargo run --release -p persevere-tests --bin soak -- <breaker|supervisor|slots|churn|scheduler|cancel|all> [--secs N]
//! ```
//!
//! - `breaker`: 64 tasks share one `Breaker` and one ratio `Budget` through a dependency that is
//!   healthy, then down, then healthy again.
//! - `supervisor`: 256 slots add supervised tasks one after another: successes, retried failures,
//!   panics, hangs past their timeout and attempts whose drop panics.
//! - `slots`: 10,000 slots (`--slots N`) each add a `once` task that sleeps 200–2,000 ms
//!   (`--sleep-ms MIN..MAX`) and succeeds, await its exit and add the next; `churn`: the same
//!   with tasks that succeed at once. Both print RSS, the live heap and glibc's own figures
//!   once a second, then RSS at 30, 60, 120 and 180 s and its slope over the last minute;
//!   `--trim` calls `malloc_trim(0)` before each sample.
//! - `scheduler`: 10,000 flows every 100 ms, some failing until they trip, while four tasks call
//!   `status`, `trigger` and `reset_flow` on random flows.
//! - `cancel`: 64 tasks start retries and drop or cancel them mid-attempt and mid-sleep.
//!
//! Allocations are counted by a global allocator (every thread); the live heap is what is
//! allocated and not freed. RSS is read from `/proc/self/statm` (0 where it does not exist).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use persevere::{
    Backoff, BreakerPolicy, BreakerStatus, FailureKind, FlowPolicy, FlowStatusKind, RatioBudgetPolicy, RetryPolicy,
    TaskDefaults, TaskOutcomeKind,
};
use persevere_tests::PanicOnDrop;
use persevere_tokio::{
    Breaker, Budget, CallError, Scheduler, Supervisor, SupervisorBuilder, TaskSpec, TokioRuntime, retry,
};

#[global_allocator]
static GLOBAL: alloc_counter::CountingEverywhere = alloc_counter::CountingEverywhere;

const MIB: f64 = 1024.0 * 1024.0;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()).unwrap_or(0) * 4096
}

/// Memory samples once a second, and the lines of the scenario's table.
struct Report {
    name: &'static str,
    started: StdInstant,
    /// `(seconds, live heap, rss)`.
    samples: Mutex<Vec<(f64, u64, u64)>>,
    lines: Mutex<Vec<String>>,
    failed: AtomicBool,
}

impl Report {
    fn new(name: &'static str) -> Arc<Report> {
        let report = Arc::new(Report {
            name,
            started: StdInstant::now(),
            samples: Mutex::new(Vec::new()),
            lines: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
        });
        report.sample();
        report
    }

    fn sample(&self) {
        let at = self.started.elapsed().as_secs_f64();
        self.samples.lock().unwrap().push((at, alloc_counter::live_bytes(), rss_bytes()));
    }

    /// Samples memory every second until `end`.
    fn sampler(self: &Arc<Self>, end: StdInstant) -> tokio::task::JoinHandle<()> {
        let report = self.clone();
        tokio::spawn(async move {
            while StdInstant::now() < end {
                tokio::time::sleep(Duration::from_secs(1).min(end.saturating_duration_since(StdInstant::now()))).await;
                report.sample();
            }
        })
    }

    fn line(&self, label: &str, value: impl std::fmt::Display) {
        self.lines.lock().unwrap().push(format!("| {label:<44} | {value} |"));
    }

    fn check(&self, invariant: &str, holds: bool, detail: impl std::fmt::Display) {
        if !holds {
            self.failed.store(true, Relaxed);
        }
        let verdict = if holds { "PASS" } else { "FAIL" };
        self.lines.lock().unwrap().push(format!("| {verdict}: {invariant:<38} | {detail} |"));
    }

    fn latency(&self, what: &str, histogram: &Histogram) {
        let q = |x| histogram.quantile(x);
        self.line(
            &format!("{what} latency p50 / p99 / p99.9 / max"),
            format!("{} / {} / {} / {} µs ({} samples)", q(0.5), q(0.99), q(0.999), q(1.0), histogram.samples()),
        );
    }

    /// Prints the table; returns whether every invariant held.
    fn print(&self) -> bool {
        self.sample();
        let samples = self.samples.lock().unwrap().clone();
        let (first, last) = (samples[0], samples[samples.len() - 1]);
        let middle = samples[samples.len() / 2];
        let mem = |s: (f64, u64, u64)| format!("{:.1} MiB heap, {:.1} MiB RSS", s.1 as f64 / MIB, s.2 as f64 / MIB);
        // Least squares over the second half of the run: the slope once the start-up has settled.
        let tail = &samples[samples.len() / 2..];
        let n = tail.len() as f64;
        let (mx, my) = (tail.iter().map(|s| s.0).sum::<f64>() / n, tail.iter().map(|s| s.2 as f64).sum::<f64>() / n);
        let (sxy, sxx) = tail
            .iter()
            .fold((0.0, 0.0), |(sxy, sxx), s| (sxy + (s.0 - mx) * (s.2 as f64 - my), sxx + (s.0 - mx) * (s.0 - mx)));
        let slope = if sxx > 0.0 { sxy / sxx * 60.0 / MIB } else { 0.0 };
        println!("\n## {} ({:.1} s)\n", self.name, self.started.elapsed().as_secs_f64());
        println!("| what | figure |\n|---|---|");
        for line in self.lines.lock().unwrap().iter() {
            println!("{line}");
        }
        println!("| memory at start / middle / end               | {} / {} / {} |", mem(first), mem(middle), mem(last));
        println!("| RSS slope over the second half               | {slope:+.2} MiB/min |");
        !self.failed.load(Relaxed)
    }
}

/// Latencies in microseconds, in fixed bins allocated once (so that the harness's own samples
/// do not show up as heap growth): exact below 1,024 µs, then 1 ms wide up to about 1 s, and
/// one bin for anything longer.
struct Histogram {
    bins: Vec<AtomicU64>,
}

impl Histogram {
    const EXACT: u64 = 1_024;
    const BINS: usize = 2_048;

    fn new() -> Arc<Histogram> {
        Arc::new(Histogram { bins: (0..Self::BINS).map(|_| AtomicU64::new(0)).collect() })
    }

    fn record(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let bin = if us < Self::EXACT { us } else { Self::EXACT + us / 1_000 }.min(Self::BINS as u64 - 1);
        self.bins[bin as usize].fetch_add(1, Relaxed);
    }

    /// The lower edge (µs) of the bin holding quantile `q`.
    fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.bins.iter().map(|b| b.load(Relaxed)).sum();
        let rank = ((total.max(1) - 1) as f64 * q) as u64;
        let mut seen = 0;
        for (bin, count) in self.bins.iter().enumerate() {
            seen += count.load(Relaxed);
            if seen > rank {
                let bin = bin as u64;
                return if bin < Self::EXACT { bin } else { (bin - Self::EXACT) * 1_000 };
            }
        }
        0
    }

    /// Adds `other`'s samples to this one's.
    fn merge(&self, other: &Histogram) {
        for (mine, theirs) in self.bins.iter().zip(&other.bins) {
            mine.fetch_add(theirs.load(Relaxed), Relaxed);
        }
    }

    fn samples(&self) -> u64 {
        self.bins.iter().map(|b| b.load(Relaxed)).sum()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A small xorshift generator per task (the soak's faults need no quality, only speed).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

// ---------------------------------------------------------------------------------------------
// breaker: a shared breaker and budget through an outage and a recovery.

async fn breaker(secs: u64) -> bool {
    let report = Report::new("breaker + budget: outage and recovery, 64 tasks");
    let start = StdInstant::now();
    let total = Duration::from_secs(secs);
    let onset = total * 4 / 10;
    let recovery = total * 7 / 10;
    let end = start + total;
    let sampler = report.sampler(end);

    let open_for = ms(200);
    let breaker = Breaker::new(
        BreakerPolicy::builder(Backoff::constant(open_for).build().unwrap())
            .consecutive_failures(20)
            .half_open_permits(1)
            .build()
            .unwrap(),
    );
    let ratio = RatioBudgetPolicy::builder(0.1).min_retries_per_sec(10).burst_window(Duration::from_secs(1));
    let budget = Budget::ratio(TokioRuntime::new(), ratio.build().unwrap());
    let policy = Arc::new(
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(3).build().unwrap(),
    );

    let seconds = secs as usize + 1;
    let per_second = || Arc::new((0..seconds).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let (requests, retries) = (per_second(), per_second());
    let outage_calls_while_opened = Arc::new(AtomicU64::new(0));
    let opened_once = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let latency = Histogram::new();
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (breaker, budget, policy) = (breaker.clone(), budget.clone(), policy.clone());
        let (requests, retries, ops) = (requests.clone(), retries.clone(), ops.clone());
        let (outage_calls, opened_once) = (outage_calls_while_opened.clone(), opened_once.clone());
        // One histogram per task: 64 tasks recording into one would contend on its bins.
        let latency = Histogram::new();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while StdInstant::now() < end {
                let began = StdInstant::now();
                let second = began.duration_since(start).as_secs() as usize;
                requests[second.min(seconds - 1)].fetch_add(1, Relaxed);
                let retries = retries.clone();
                let _ = retry(&*policy, || {
                    let (outage_calls, opened_once) = (outage_calls.clone(), opened_once.clone());
                    breaker.call(async move {
                        let elapsed = start.elapsed();
                        let down = elapsed >= onset && elapsed < recovery;
                        if down && opened_once.load(Relaxed) {
                            outage_calls.fetch_add(1, Relaxed);
                        }
                        if down { Err("dependency down") } else { Ok(()) }
                    })
                })
                .classify(|e| match e {
                    // A rejection asks the budget for a retry, so that the budget is what bounds
                    // the retries of the outage (the breaker alone would stop them all).
                    CallError::Rejected { .. } => FailureKind::Retryable,
                    CallError::Failed(_) => FailureKind::Retryable,
                })
                .notify(move |_| {
                    let second = start.elapsed().as_secs() as usize;
                    retries[second.min(seconds - 1)].fetch_add(1, Relaxed);
                })
                .gate(budget.clone())
                .seed(t)
                .await;
                n += 1;
                if n.is_multiple_of(64) {
                    latency.record(began.elapsed());
                    tokio::task::yield_now().await;
                }
            }
            ops.fetch_add(n, Relaxed);
            latency
        }));
    }
    // The monitor: when the breaker first opened, how many open periods it had, when it closed.
    let mut first_open = None;
    let mut open_periods = 0u64;
    let mut last_until = None;
    let mut closed_after_recovery = None;
    let mut open_while_healthy = 0u64;
    while StdInstant::now() < end {
        let status = breaker.status();
        let elapsed = start.elapsed();
        match status {
            BreakerStatus::Open { until } => {
                if first_open.is_none() {
                    first_open = Some(elapsed);
                    opened_once.store(true, Relaxed);
                }
                if last_until != Some(until) {
                    open_periods += 1;
                    last_until = Some(until);
                }
                if elapsed < onset {
                    open_while_healthy += 1;
                }
            }
            BreakerStatus::Closed if elapsed >= recovery && closed_after_recovery.is_none() => {
                closed_after_recovery = Some(elapsed - recovery);
            }
            _ => {}
        }
        tokio::time::sleep(ms(1)).await;
    }
    for task in tasks {
        latency.merge(&task.await.unwrap());
    }
    sampler.await.unwrap();
    let ops = ops.load(Relaxed);
    report.line("operations (retry around a breaker call)", format!("{ops} ({:.0}/s)", ops as f64 / secs as f64));
    report.latency("operation (1 in 64)", &latency);
    let opened_in = first_open.map(|at| at.saturating_sub(onset));
    report.check(
        "the breaker opens within 100 ms of the outage",
        opened_in.is_some_and(|d| d <= ms(100)) && first_open.is_some_and(|at| at >= onset),
        format!("opened {opened_in:?} after the onset"),
    );
    report.check(
        "the breaker never opens while healthy",
        open_while_healthy == 0,
        format!("{open_while_healthy} samples"),
    );
    let calls = outage_calls_while_opened.load(Relaxed);
    report.check(
        "after opening, only probes reach the dependency",
        calls <= open_periods + 64,
        format!(
            "{calls} calls in the outage after it opened; {open_periods} open periods (+64 calls in flight at most)"
        ),
    );
    report.check(
        "it closes within an open period of recovery",
        closed_after_recovery.is_some_and(|d| d <= open_for + ms(100)),
        format!("closed {closed_after_recovery:?} after the recovery"),
    );
    report.check(
        "no permit is left outstanding",
        breaker.outstanding_permits() == 0,
        format!("{} outstanding", breaker.outstanding_permits()),
    );
    // The budget: every second of the outage retries at most 0.1 of its requests and of the
    // bucket before it (the burst window's bound, 1 s buckets) plus the floor of 10 per second.
    let (from, to) = (onset.as_secs() as usize, (recovery.as_secs() as usize).min(seconds - 1));
    let mut worst = (0.0f64, 0);
    let mut within = true;
    for s in from..to {
        let (q, r) = (requests[s].load(Relaxed), retries[s].load(Relaxed));
        let before = if s > 0 { requests[s - 1].load(Relaxed) } else { 0 };
        within &= r as f64 <= 0.1 * (q + before) as f64 + 20.0;
        let share = r as f64 / q.max(1) as f64;
        if share > worst.0 {
            worst = (share, s);
        }
    }
    let first = (requests[from].load(Relaxed), retries[from].load(Relaxed));
    report.line(
        "retries / requests, first second of the outage",
        format!("{} / {} = {:.3}", first.1, first.0, first.1 as f64 / first.0.max(1) as f64),
    );
    report.check(
        "the budget holds each outage second",
        within,
        format!("worst second {}: {:.3} of its requests", worst.1, worst.0),
    );
    report.print()
}

// ---------------------------------------------------------------------------------------------
// supervisor: churn with panics, hangs and panicking drops.

async fn panicking() -> Result<(), String> {
    panic!("soak: a panicking attempt")
}

type Job = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A task of kind `kind`: its spec, its job and the outcome and attempts it must end with.
fn churn_task(kind: u64) -> (TaskSpec, Box<dyn FnMut() -> Job + Send>, TaskOutcomeKind, u64) {
    let quick = Backoff::constant(ms(1)).build().unwrap();
    match kind {
        0 => (TaskSpec::once(), Box::new(|| Box::pin(async { Ok(()) }) as Job), TaskOutcomeKind::Completed, 1),
        1 => {
            let calls = Arc::new(AtomicU32::new(0));
            let job = move || {
                let n = calls.fetch_add(1, Relaxed);
                Box::pin(async move { if n < 2 { Err(format!("failure {n}")) } else { Ok(()) } }) as Job
            };
            (TaskSpec::restartable().backoff(quick), Box::new(job), TaskOutcomeKind::Completed, 3)
        }
        2 => {
            let job = || Box::pin(panicking()) as Job;
            // A panicking attempt is a failure of class Panicked: a `once` task ends Failed.
            (TaskSpec::once(), Box::new(job), TaskOutcomeKind::Failed, 1)
        }
        3 => {
            let job = || Box::pin(std::future::pending()) as Job;
            let spec = TaskSpec::restartable().backoff(quick).attempt_timeout(ms(5)).max_retries(1);
            (spec, Box::new(job), TaskOutcomeKind::TimedOut, 2)
        }
        _ => {
            let job = || Box::pin(PanicOnDrop) as Job;
            (TaskSpec::once().attempt_timeout(ms(5)), Box::new(job), TaskOutcomeKind::Panicked, 1)
        }
    }
}

async fn supervisor(secs: u64) -> bool {
    let report = Report::new("supervisor: churn of 256 slots with panics, hangs and panicking drops");
    let end = StdInstant::now() + Duration::from_secs(secs);
    let sampler = report.sampler(end);
    let sup: Supervisor<u64, String> = SupervisorBuilder::new(TaskDefaults::new()).seed(1).build();
    let next_id = Arc::new(AtomicU64::new(0));
    let (wrong, added, attempts) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let latency = Histogram::new();
    let mut slots = Vec::new();
    for slot in 0..256u64 {
        let (sup, next_id, wrong, added, attempts) =
            (sup.clone(), next_id.clone(), wrong.clone(), added.clone(), attempts.clone());
        let latency = latency.clone();
        slots.push(tokio::spawn(async move {
            let mut dice = Dice(slot * 0x9E37_79B9 + 1);
            while StdInstant::now() < end {
                let (spec, job, expected, expected_attempts) = churn_task(dice.below(5));
                let id = next_id.fetch_add(1, Relaxed);
                let began = StdInstant::now();
                let handle = sup.add(id, spec, job).expect("a fresh id");
                added.fetch_add(1, Relaxed);
                let exit = handle.await;
                attempts.fetch_add(exit.attempts, Relaxed);
                if (exit.outcome.kind(), exit.attempts, exit.aborted) != (expected, expected_attempts, false)
                    && wrong.fetch_add(1, Relaxed) == 0
                {
                    eprintln!("unexpected exit: {exit:?}, expected {expected:?} after {expected_attempts} attempts");
                }
                latency.record(began.elapsed());
            }
        }));
    }
    for slot in slots {
        slot.await.unwrap();
    }
    sampler.await.unwrap();
    let (added, attempts) = (added.load(Relaxed), attempts.load(Relaxed));
    report.line("tasks added and finished", format!("{added} ({:.0}/s)", added as f64 / secs as f64));
    report.line("attempts", format!("{attempts} ({:.0}/s)", attempts as f64 / secs as f64));
    report.latency("task (add to exit)", &latency);
    let wrong = wrong.load(Relaxed);
    report.check("every exit has the expected outcome", wrong == 0, format!("{wrong} unexpected exits"));
    let counts = sup.event_counts();
    report.check(
        "one TaskFinished per task (S6)",
        counts.task_finished == added,
        format!("{} TaskFinished for {added} tasks", counts.task_finished),
    );
    report.check(
        "one AttemptStarting per attempt (S6)",
        counts.attempt_starting == attempts,
        format!(
            "{} AttemptStarting for {attempts} attempts ({} events dropped)",
            counts.attempt_starting, counts.dropped
        ),
    );
    report.check("the supervisor is empty at the end", sup.is_empty(), format!("{} tasks left", sup.len()));
    report.print()
}

// ---------------------------------------------------------------------------------------------
// slots / churn: many slots of `once` tasks, memory printed once a second.

/// How the `slots` and `churn` scenarios run.
#[derive(Clone, Copy, Debug)]
struct SlotOptions {
    slots: u64,
    /// Each task sleeps a duration drawn in `[min, max]` ms, then succeeds; `None`: it succeeds
    /// at once.
    sleep: Option<(u64, u64)>,
    /// Calls `malloc_trim(0)` once a second, before each sample.
    trim: bool,
}

/// A sample: `(seconds, rss, live heap, glibc's figures, tasks finished so far)`.
type SlotSample = (f64, u64, u64, Option<alloc_counter::MallocStats>, u64);

/// RSS (MiB) at `at` seconds: the last sample at or before it.
fn rss_at(samples: &[SlotSample], at: f64) -> Option<f64> {
    samples
        .iter()
        .take_while(|s| s.0 <= at + 0.5)
        .last()
        .filter(|_| samples.last().unwrap().0 >= at - 0.5)
        .map(|s| s.1 as f64 / MIB)
}

/// Least-squares slope of RSS (MiB/min) over the samples of the last `window` seconds.
fn rss_slope(samples: &[SlotSample], window: f64) -> f64 {
    let end = samples.last().map_or(0.0, |s| s.0);
    let tail: Vec<_> = samples.iter().filter(|s| s.0 >= end - window).collect();
    let n = tail.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (tail.iter().map(|s| s.0).sum::<f64>() / n, tail.iter().map(|s| s.1 as f64).sum::<f64>() / n);
    let (sxy, sxx) = tail
        .iter()
        .fold((0.0, 0.0), |(sxy, sxx), s| (sxy + (s.0 - mx) * (s.1 as f64 - my), sxx + (s.0 - mx) * (s.0 - mx)));
    if sxx > 0.0 { sxy / sxx * 60.0 / MIB } else { 0.0 }
}

/// `slots` slots each add a `once` task and await its exit, then add the next, for `secs`
/// seconds; prints RSS, the live heap and glibc's figures once a second, then a summary.
async fn slots(secs: u64, options: SlotOptions) -> bool {
    let SlotOptions { slots, sleep, trim } = options;
    let title = match sleep {
        Some((min, max)) => format!("slots: {slots} slots of `once` tasks sleeping {min}–{max} ms"),
        None => format!("churn: {slots} slots of `once` tasks that end at once"),
    };
    println!("\n## {title}{}\n", if trim { ", malloc_trim(0) once a second" } else { "" });
    println!("| s | RSS MiB | live heap MiB | glibc held / free MiB | tasks/s |\n|---|---|---|---|---|");
    let started = StdInstant::now();
    let end = started + Duration::from_secs(secs);
    let sup: Supervisor<u64, String> = SupervisorBuilder::new(TaskDefaults::new()).seed(1).build();
    let next_id = Arc::new(AtomicU64::new(0));
    let (finished, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for slot in 0..slots {
        let (sup, next_id, finished, wrong) = (sup.clone(), next_id.clone(), finished.clone(), wrong.clone());
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice(slot * 0x9E37_79B9 + 1);
            // The slots go on a little past the last sample, so that every sample sees them all.
            while StdInstant::now() < end + Duration::from_secs(2) {
                let nap = sleep.map(|(min, max)| ms(min + dice.below(max - min + 1)));
                let id = next_id.fetch_add(1, Relaxed);
                let handle = sup
                    .add(id, TaskSpec::once(), move || async move {
                        if let Some(nap) = nap {
                            tokio::time::sleep(nap).await;
                        }
                        Ok(())
                    })
                    .expect("a fresh id");
                let exit = handle.await;
                if exit.outcome.kind() != TaskOutcomeKind::Completed || exit.attempts != 1 {
                    wrong.fetch_add(1, Relaxed);
                }
                finished.fetch_add(1, Relaxed);
            }
        }));
    }
    let sample = |finished: u64| -> SlotSample {
        if trim {
            alloc_counter::malloc_trim();
        }
        let at = started.elapsed().as_secs_f64();
        (at, rss_bytes(), alloc_counter::live_bytes(), alloc_counter::malloc_stats(), finished)
    };
    let allocations_before = alloc_counter::total_allocations();
    let mut samples = vec![sample(0)];
    let mut max_heap = 0u64;
    let mut next = started;
    while StdInstant::now() < end {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
        let s = sample(finished.load(Relaxed));
        let previous = samples.last().unwrap();
        let rate = (s.4 - previous.4) as f64 / (s.0 - previous.0);
        let glibc = s.3.map_or("-".to_string(), |m| format!("{:.1} / {:.1}", m.held as f64 / MIB, m.free as f64 / MIB));
        println!("| {:.0} | {:.1} | {:.1} | {glibc} | {rate:.0} |", s.0, s.1 as f64 / MIB, s.2 as f64 / MIB);
        max_heap = max_heap.max(s.2);
        samples.push(s);
    }
    let allocations = alloc_counter::total_allocations() - allocations_before;
    let total = finished.load(Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let last = *samples.last().unwrap();
    let at = |t: f64| rss_at(&samples, t).map_or("-".to_string(), |v| format!("{v:.1}"));
    println!("\n| what | figure |\n|---|---|");
    println!("| tasks finished | {total} ({:.0}/s) |", total as f64 / secs.max(1) as f64);
    // The harness's own share is nearly nothing: the slots are spawned once, before the count.
    println!("| allocations per task (every thread) | {:.2} |", allocations as f64 / total.max(1) as f64);
    println!("| RSS at 30 / 60 / 120 / 180 s | {} / {} / {} / {} MiB |", at(30.0), at(60.0), at(120.0), at(180.0));
    // Over a shorter run the last minute holds the start-up.
    let slope =
        if last.0 >= 120.0 { format!("{:+.2} MiB/min", rss_slope(&samples, 60.0)) } else { "- (under 2 min)".into() };
    println!("| RSS slope over the last minute | {slope} |");
    println!("| live heap at {secs} s / at most | {:.1} / {:.1} MiB |", last.2 as f64 / MIB, max_heap as f64 / MIB);
    if let Some(m) = last.3 {
        let secs = last.0.round();
        println!(
            "| glibc: held / in use / free at {secs} s | {:.1} / {:.1} / {:.1} MiB |",
            m.held as f64 / MIB,
            m.in_use as f64 / MIB,
            m.free as f64 / MIB
        );
    }
    let wrong = wrong.load(Relaxed);
    let ok = wrong == 0 && sup.is_empty();
    println!(
        "| {}: every task completed after one attempt, none left | {wrong} otherwise, {} left |",
        if ok { "PASS" } else { "FAIL" },
        sup.len()
    );
    ok
}

// ---------------------------------------------------------------------------------------------
// scheduler: 10,000 flows and concurrent status / trigger / reset_flow.

async fn scheduler(secs: u64) -> bool {
    const FLOWS: u32 = 10_000;
    const INTERVAL: Duration = Duration::from_millis(100);
    const TRIP_AFTER: u32 = 3;
    let report = Report::new("scheduler: 10,000 flows every 100 ms, status / trigger / reset_flow meanwhile");
    let start = StdInstant::now();
    let end = start + Duration::from_secs(secs);
    let sampler = report.sampler(end);
    let mut scheduler: Scheduler<u32, String> = Scheduler::new();
    scheduler.default_backoff(
        FlowPolicy::builder()
            .backoff(Backoff::constant(ms(50)).build().unwrap())
            .with_trip(TRIP_AFTER)
            .build()
            .unwrap(),
    );
    // Per flow: runs in flight (never above 1), and the previous end for lateness.
    let running: Arc<Vec<AtomicU32>> = Arc::new((0..FLOWS).map(|_| AtomicU32::new(0)).collect());
    let overlaps = Arc::new(AtomicU64::new(0));
    let lateness = Histogram::new();
    let ends: Arc<Vec<AtomicU64>> = Arc::new((0..FLOWS).map(|_| AtomicU64::new(0)).collect());
    for id in 0..FLOWS {
        let (running, overlaps, lateness, ends) = (running.clone(), overlaps.clone(), lateness.clone(), ends.clone());
        // One flow in ten always fails (it trips and stays tripped: nobody resets it); one in ten
        // fails every other run; the rest succeed.
        let counter = AtomicU32::new(0);
        scheduler
            .every(id, INTERVAL, move || {
                let runs = counter.fetch_add(1, Relaxed) + 1;
                let now = start.elapsed().as_nanos() as u64;
                let previous = ends[id as usize].load(Relaxed);
                if previous != 0 && id % 10 > 1 && id % 97 != 3 {
                    lateness.record(Duration::from_nanos(now.saturating_sub(previous + INTERVAL.as_nanos() as u64)));
                }
                if running[id as usize].fetch_add(1, Relaxed) != 0 {
                    overlaps.fetch_add(1, Relaxed);
                }
                let (running, ends) = (running.clone(), ends.clone());
                let fail = id % 10 == 0 || (id % 10 == 1 && runs.is_multiple_of(2));
                async move {
                    running[id as usize].fetch_sub(1, Relaxed);
                    ends[id as usize].store(start.elapsed().as_nanos() as u64, Relaxed);
                    if fail { Err("soak failure".to_string()) } else { Ok(()) }
                }
            })
            .unwrap();
    }
    let handle = Arc::new(scheduler.start());
    let calls = Arc::new(AtomicU64::new(0));
    let mut pokers = Vec::new();
    for p in 0..4u64 {
        let (handle, calls) = (handle.clone(), calls.clone());
        pokers.push(tokio::spawn(async move {
            let mut dice = Dice(p + 7);
            let mut unexpected = 0u64;
            while StdInstant::now() < end {
                // Flows whose id is ≡ 3 (mod 97) are poked; the always-failing ones never are.
                let id = (dice.below(u64::from(FLOWS) / 97) * 97 + 3) as u32;
                let _ = handle.status(&id).unwrap();
                match dice.below(3) {
                    0 => {}
                    1 => match handle.trigger(&id) {
                        Ok(())
                        | Err(
                            persevere_tokio::SchedulerError::Running | persevere_tokio::SchedulerError::Tripped { .. },
                        ) => {}
                        Err(_) => unexpected += 1,
                    },
                    _ => unexpected += u64::from(handle.reset_flow(&id).is_err()),
                }
                calls.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            unexpected
        }));
    }
    tokio::time::sleep_until(end.into()).await;
    handle.stop();
    handle.wait().await;
    let mut unexpected = 0;
    for poker in pokers {
        unexpected += poker.await.unwrap();
    }
    sampler.await.unwrap();
    let ids = handle.ids();
    let runs: u64 = ids.iter().map(|id| handle.status(id).map_or(0, |i| i.run_count)).sum();
    report.line("flows", FLOWS);
    report.line("runs dispatched", format!("{runs} ({:.0}/s)", runs as f64 / secs as f64));
    report.line("status / trigger / reset_flow calls", calls.load(Relaxed));
    report.line("cron ticks skipped", handle.skipped_ticks());
    report.latency("dispatch lateness (healthy flows)", &lateness);
    report.check(
        "no flow runs twice at once (F5)",
        overlaps.load(Relaxed) == 0,
        format!("{} overlaps", overlaps.load(Relaxed)),
    );
    let mut wrong_trips = 0;
    for id in (0..FLOWS).filter(|id| id % 10 == 0 && id % 97 != 3) {
        let info = handle.status(&id).unwrap();
        if info.status.kind() != FlowStatusKind::Tripped || info.run_count != u64::from(TRIP_AFTER) {
            wrong_trips += 1;
        }
    }
    report.check(
        "a tripped flow is never dispatched (F3, G5)",
        wrong_trips == 0,
        format!("{wrong_trips} always-failing flows not tripped after exactly {TRIP_AFTER} runs"),
    );
    report.check(
        "status / trigger / reset_flow answer as documented",
        unexpected == 0,
        format!("{unexpected} unexpected errors"),
    );
    report.check(
        "nothing in flight after stop and wait",
        handle.in_flight() == 0,
        format!("{} in flight", handle.in_flight()),
    );
    report.print()
}

// ---------------------------------------------------------------------------------------------
// cancel: retries dropped or canceled mid-attempt and mid-sleep.

/// Counts the attempts alive: made when an attempt is created, dropped with it.
struct Alive(Arc<AtomicU64>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

async fn cancel(secs: u64) -> bool {
    let report = Report::new("cancel: retries dropped or canceled mid-attempt and mid-sleep, 64 tasks");
    let end = StdInstant::now() + Duration::from_secs(secs);
    let sampler = report.sampler(end);
    let heap_before = alloc_counter::live_bytes();
    let alive = Arc::new(AtomicU64::new(0));
    let policy = Arc::new(
        RetryPolicy::builder(Backoff::exponential(ms(1), 2.0).max_delay(ms(4)).build().unwrap())
            .max_attempts(3)
            .build()
            .unwrap(),
    );
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (alive, policy) = (alive.clone(), policy.clone());
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice(t * 31 + 5);
            let (mut dropped, mut canceled, mut finished) = (0u64, 0u64, 0u64);
            while StdInstant::now() < end {
                let attempt_ms = dice.below(3);
                let limit = ms(dice.below(12));
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let alive2 = alive.clone();
                let operation = retry(&*policy, move || {
                    alive2.fetch_add(1, Relaxed);
                    let guard = Alive(alive2.clone());
                    async move {
                        tokio::time::sleep(ms(attempt_ms)).await;
                        drop(guard);
                        Err::<(), _>("busy")
                    }
                })
                .cancel_on(async move {
                    let _ = rx.await;
                });
                if dice.below(2) == 0 {
                    match tokio::time::timeout(limit, operation).await {
                        Ok(_) => finished += 1,
                        Err(_) => dropped += 1,
                    }
                } else {
                    let mut operation = std::pin::pin!(operation);
                    tokio::select! {
                        _ = &mut operation => finished += 1,
                        () = tokio::time::sleep(limit) => {
                            let _ = tx.send(());
                            let _ = operation.await;
                            canceled += 1;
                        }
                    }
                }
            }
            (dropped, canceled, finished)
        }));
    }
    let (mut dropped, mut canceled, mut finished) = (0, 0, 0);
    for task in tasks {
        let (d, c, f) = task.await.unwrap();
        (dropped, canceled, finished) = (dropped + d, canceled + c, finished + f);
    }
    sampler.await.unwrap();
    let total = dropped + canceled + finished;
    report.line("retries started", format!("{total} ({:.0}/s)", total as f64 / secs as f64));
    report.line("dropped / canceled / ran to their end", format!("{dropped} / {canceled} / {finished}"));
    report.check(
        "every attempt was dropped",
        alive.load(Relaxed) == 0,
        format!("{} attempts alive", alive.load(Relaxed)),
    );
    let growth = alloc_counter::live_bytes() as i64 - heap_before as i64;
    report.check("the live heap returns to where it began", growth < 1 << 20, format!("{growth:+} B"));
    report.print()
}

// ---------------------------------------------------------------------------------------------
// Allocations per unit of work, each measured alone on a current-thread runtime.

/// Prints the allocations of each unit of work; returns whether each stays within what the
/// design needs (a task: its spawned future and the cell it shares with its handle; a restart
/// and a retry: nothing).
/// Allocations per run dispatched by a scheduler of `flows` every-flows (10 ms, jobs that
/// succeed at once), over 500 ms after 200 ms of warm-up.
async fn allocations_per_dispatch(flows: u32) -> f64 {
    let mut scheduler: Scheduler<u32, String> = Scheduler::new();
    let runs = Arc::new(AtomicU64::new(0));
    for id in 0..flows {
        let runs = runs.clone();
        scheduler
            .every(id, ms(10), move || {
                runs.fetch_add(1, Relaxed);
                async { Ok(()) }
            })
            .unwrap();
    }
    let handle = scheduler.start();
    tokio::time::sleep(ms(200)).await;
    let (before, runs_before) = (alloc_counter::total_allocations(), runs.load(Relaxed));
    tokio::time::sleep(ms(500)).await;
    let per_dispatch =
        (alloc_counter::total_allocations() - before) as f64 / (runs.load(Relaxed) - runs_before).max(1) as f64;
    handle.stop();
    handle.wait().await;
    per_dispatch
}

fn allocations_per_unit() -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    const N: u64 = 2_000;
    let per_retry = rt.block_on(async {
        let sup: Supervisor<u64, String> = SupervisorBuilder::new(TaskDefaults::new()).seed(1).build();
        let quick = Backoff::constant(Duration::ZERO).build().unwrap();
        // Warm up the channel, the registry's tree and tokio's timer slabs.
        for id in 0..N {
            let _ = sup.add(id, TaskSpec::once(), || async { Ok(()) }).unwrap().await;
        }
        // A task added, run once and finished, awaited through its handle.
        let before = alloc_counter::total_allocations();
        for i in 0..N {
            let _ = sup.add(10 * N + i, TaskSpec::once(), || async { Ok(()) }).unwrap().await;
        }
        let task = alloc_counter::total_allocations() - before;
        let per_task = task as f64 / N as f64;
        // The same with three failures first: three more attempts (restarts), zero backoff.
        let before = alloc_counter::total_allocations();
        for i in 0..N {
            let calls = Arc::new(AtomicU32::new(0));
            let job = move || {
                let n = calls.fetch_add(1, Relaxed);
                async move { if n < 3 { Err("again".to_string()) } else { Ok(()) } }
            };
            let _ = sup.add(20 * N + i, TaskSpec::restartable().backoff(quick), job).unwrap().await;
        }
        // Minus the task itself, the job's own Arc and its three error Strings.
        let restarts = (alloc_counter::total_allocations() - before) as i64 - (task + 4 * N) as i64;
        // Rounded to the printed precision (an amortised tree node can make it a hair below 0).
        let per_restart = (restarts as f64 / (3 * N) as f64 * 100.0).round() / 100.0 + 0.0;
        println!("\n## allocations per unit of work (current-thread runtime, {N} each, after a warm-up)\n");
        println!("| unit | allocations |\n|---|---|");
        println!("| supervised task added, one successful attempt, exit awaited | {per_task:.2} |");
        println!(
            "| supervised restart (a failed attempt and the next one; job's error String excluded) | {per_restart:.2} |"
        );

        // With a few flows the registry's due index fits one B-tree node; with 100 its nodes
        // split and merge as due times move, an amortised fraction of an allocation per run.
        let per_dispatch_few = allocations_per_dispatch(3).await;
        let per_dispatch = allocations_per_dispatch(100).await;
        println!("| scheduler dispatch (3 flows every 10 ms, steady state) | {per_dispatch_few:.2} |");
        println!(
            "| scheduler dispatch (100 flows every 10 ms, steady state; B-tree nodes of the due index included) | {per_dispatch:.2} |"
        );

        let policy =
            RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(4).build().unwrap();
        let before = alloc_counter::total_allocations();
        for _ in 0..N {
            let _ = retry(&policy, || async { Err::<(), _>("busy") }).await;
        }
        let per_retry = (alloc_counter::total_allocations() - before) as f64 / N as f64;
        println!("| retry(..) of 4 failing attempts, zero delay | {per_retry:.2} |");
        (per_task, per_restart, per_dispatch_few, per_dispatch, per_retry)
    });
    let (per_task, per_restart, per_dispatch_few, per_dispatch, per_retry) = per_retry;
    let checks = [
        ("a supervised task allocates at most 2", (per_task * 100.0).round() <= 200.0),
        ("a restart allocates nothing", per_restart == 0.0),
        ("a dispatch allocates only its spawned run", (per_dispatch_few * 100.0).round() == 100.0),
        ("the due index adds at most 0.25 per dispatch at 100 flows", per_dispatch <= 1.25),
        ("a retry allocates nothing", per_retry == 0.0),
    ];
    for (what, holds) in checks {
        println!("| {}: {what} | |", if holds { "PASS" } else { "FAIL" });
    }
    checks.iter().all(|(_, holds)| *holds)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut scenario = String::from("all");
    let mut secs = 10;
    let mut slot_count = 10_000;
    let mut sleep = (200, 2_000);
    let mut trim = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--secs" => {
                secs = args.next().and_then(|s| s.parse().ok()).expect("--secs takes a whole number of seconds")
            }
            "--slots" => slot_count = args.next().and_then(|s| s.parse().ok()).expect("--slots takes a number"),
            "--sleep-ms" => {
                sleep = args
                    .next()
                    .and_then(|s| {
                        let (min, max) = s.split_once("..")?;
                        Some((min.parse().ok()?, max.parse().ok()?)).filter(|(min, max)| min <= max)
                    })
                    .expect("--sleep-ms takes MIN..MAX milliseconds")
            }
            "--trim" => trim = true,
            "breaker" | "supervisor" | "slots" | "churn" | "scheduler" | "cancel" | "allocations" | "all" => {
                scenario = arg
            }
            other => {
                eprintln!(
                    "unknown argument {other:?}\nusage: soak <breaker|supervisor|slots|churn|scheduler|cancel|allocations|all> \
                     [--secs N] [--slots N] [--sleep-ms MIN..MAX] [--trim]"
                );
                std::process::exit(2);
            }
        }
    }
    // The panics injected on purpose are expected; keep the output to the tables.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
        let soak = message.is_some_and(|m| m.starts_with("soak:") || m == PanicOnDrop::MESSAGE);
        if !soak {
            default_hook(info);
        }
    }));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let run = |name: &str| scenario == "all" || scenario == name;
    let mut ok = true;
    if run("allocations") {
        ok &= allocations_per_unit();
    }
    if run("breaker") {
        ok &= rt.block_on(breaker(secs));
    }
    if run("supervisor") {
        ok &= rt.block_on(supervisor(secs));
    }
    if run("slots") {
        ok &= rt.block_on(slots(secs, SlotOptions { slots: slot_count, sleep: Some(sleep), trim }));
    }
    if run("churn") {
        ok &= rt.block_on(slots(secs, SlotOptions { slots: slot_count, sleep: None, trim }));
    }
    if run("scheduler") {
        ok &= rt.block_on(scheduler(secs));
    }
    if run("cancel") {
        ok &= rt.block_on(cancel(secs));
    }
    if !ok {
        eprintln!("\nsoak: an invariant failed");
        std::process::exit(1);
    }
}
