//! A supervision decision (S3, S6), measured against a hand-written baseline in the same run.
//!
//! `cargo bench -p persevere --bench supervision -- --warm-up-time 1 --measurement-time 2`
//!
//! - `supervision/baseline/handwritten`: failures + 1, a limit check, a capped exponential
//!   envelope by shift, an equal-jitter draw (one multiply-shift), `until = now + delay`.
//! - `supervision/failure_decision`: [`Supervision::handle_failure`] from `Running` with the S2
//!   defaults (equal jitter) and a retry limit, failure streaks cycling 0..8, plus draining its
//!   two events (`AttemptFailed`, `BackoffScheduled`); includes copying the state in.
//! - `supervision/periodic_cycle`: a whole periodic round: success, drain, timeout, drain.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Failure, Instant, Supervision, SupervisionPolicy, TaskDefaults};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

#[derive(Clone, Copy)]
struct Plain {
    failures: u32,
    until: u64,
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("supervision");
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let policy = SupervisionPolicy::restartable().max_retries(100).build(&TaskDefaults::new()).unwrap();
    group.bench_function("baseline/handwritten", |b| {
        let mut state = Plain { failures: 0, until: 0 };
        b.iter(|| {
            let mut s = black_box(state);
            s.failures = (s.failures & 7) + 1;
            if s.failures > 100 {
                return black_box(0);
            }
            let envelope = (200_000_000u64 << (s.failures - 1)).min(30_000_000_000);
            let half = envelope / 2;
            let draw = ((u128::from(rng.next_u64()) * u128::from(envelope - half + 1)) >> 64) as u64;
            s.until = 5u64.saturating_add(half + draw);
            state = s;
            black_box(state.until)
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
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut task = black_box(tasks[i]);
            let attempt = task.attempt();
            task.handle_failure(
                black_box(&policy),
                Instant::from_secs(1_000),
                attempt,
                Failure::retryable(1),
                &mut rng,
            )
            .unwrap();
            black_box(task.poll_action());
            black_box(task.poll_action())
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
