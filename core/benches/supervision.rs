//! A supervision decision (S3, S6), measured against a hand-written baseline in the same run.
//!
//! `cargo bench -p persevere --bench supervision -- --warm-up-time 1 --measurement-time 2`
//!
//! - `supervision/baseline/handwritten`: failures + 1, a limit check, a capped exponential
//!   envelope by shift, an equal-jitter draw (one multiply-shift), `until = now + delay`.
//! - `supervision/failure_decision`: [`Supervision::handle_failure`] from `Running` with the S2
//!   defaults (equal jitter) and a retry limit, failure streaks cycling 0..8, then its decision
//!   ([`Supervision::poll_timeout`], the next start); includes copying the state in.
//! - `supervision/failure_decision_and_events`: the same, then draining its two events
//!   (`AttemptFailed`, `BackoffScheduled`) instead.
//! - `supervision/periodic_cycle`: a whole periodic round: success, drain, timeout, drain.
//!
//! Every measured input starts from a drained task (the drain rule: an input that arrives while
//! actions wait to be drained is refused).
//!
//! Draws come from [`SplitMix64`], the RNG the adapters' drivers own (baseline and machine alike).
//! States are copied in from a table and policies hidden from the optimiser once per bench, not
//! through `black_box` per call: that writes them to a stack slot and reads them back, and the
//! reload stalls on store forwarding (the harness, not the decision, would be measured).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Failure, Instant, SplitMix64, Supervision, SupervisionPolicy, TaskDefaults};
use rand_core::Rng;

#[derive(Clone, Copy)]
struct Plain {
    failures: u32,
    until: u64,
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("supervision");
    let mut rng = SplitMix64::new(1);
    let policy = SupervisionPolicy::restartable().max_retries(100).build(&TaskDefaults::new()).unwrap();
    group.bench_function("baseline/handwritten", |b| {
        let mut state = Plain { failures: 0, until: 0 };
        b.iter(|| {
            let mut s = state;
            s.failures = (s.failures & 7) + 1;
            if s.failures > 100 {
                return black_box(0);
            }
            let envelope = (200_000_000u64 << (s.failures - 1)).min(30_000_000_000);
            let half = envelope / 2;
            let draw = ((u128::from(rng.next_u64()) * u128::from(envelope - half + 1)) >> 64) as u64;
            s.until = 5u64.saturating_add(half + draw);
            state = s;
            state.until
        })
    });
    // Tasks running attempt k + 1 after k consecutive failures, k = 0..8.
    let mut task = Supervision::<u32>::new();
    task.handle_start(&policy, Instant::ZERO).unwrap();
    let mut tasks = Vec::new();
    for attempt in 1..=8u64 {
        while task.poll_action().is_some() {}
        tasks.push(task);
        task.handle_failure(&policy, Instant::ZERO, attempt, Failure::retryable(0), &mut rng).unwrap();
        while task.poll_action().is_some() {}
        let until = task.poll_timeout().unwrap();
        task.handle_timeout(&policy, until);
    }
    group.bench_function("failure_decision", |b| {
        let policy = black_box(&policy);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut task = tasks[i];
            let attempt = task.attempt();
            task.handle_failure(policy, Instant::from_secs(1_000), attempt, Failure::retryable(1), &mut rng).unwrap();
            task.poll_timeout()
        })
    });
    // Written out again rather than shared through a helper that returns the task: returning
    // the state by value sends it through memory and the reload stalls (12.8 ns, measured).
    group.bench_function("failure_decision_and_events", |b| {
        let policy = black_box(&policy);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut task = tasks[i];
            let attempt = task.attempt();
            task.handle_failure(policy, Instant::from_secs(1_000), attempt, Failure::retryable(1), &mut rng).unwrap();
            let failed = task.poll_action().is_some();
            (failed, task.poll_action())
        })
    });
    let periodic = SupervisionPolicy::periodic(Duration::ZERO).build(&TaskDefaults::new()).unwrap();
    group.bench_function("periodic_cycle", |b| {
        let mut task = Supervision::<u32>::new();
        let mut now = Instant::ZERO;
        task.handle_start(&periodic, now).unwrap();
        task.poll_action();
        b.iter(|| {
            task.handle_success(black_box(&periodic), now, task.attempt()).unwrap();
            black_box(task.poll_action());
            black_box(task.poll_action());
            now = task.poll_timeout().unwrap_or(now);
            task.handle_timeout(&periodic, now);
            black_box(task.poll_action())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
