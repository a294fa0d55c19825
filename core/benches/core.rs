//! The core's decisions, measured against hand-written baselines in the same run (the bar and the
//! figures: `benches/README.md`).
//!
//! `cargo bench -p persevere --bench core`
//!
//! - `baseline/handwritten_full_jitter`: what a hand-written capped exponential with a full-jitter
//!   draw costs (`min(cap, base << n)`, then one multiply-shift draw), with the same RNG.
//! - `next_delay/*`: one failure → next delay decision, for each jitter, through
//!   [`BackoffState::next_delay`] (failure count cycling 1..=8, so both growth and cap are hit),
//!   with a ChaCha8 RNG; `next_delay_splitmix/*`: the same with the [`SplitMix64`] the adapters use.
//! - `*/decorrelated_independent`: decorrelated decisions each from one of eight saved states,
//!   not chained on one state (each decorrelated delay depends on the previous one).
//! - `retry/cycle`: a whole operation: start → fail → sleep → start → success, drained.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Backoff, BackoffState, Failure, Instant, Jitter, Retry, RetryAction, RetryPolicy, SplitMix64};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

fn backoff(jitter: Jitter) -> Backoff {
    Backoff::exponential(Duration::from_millis(10), 2.0)
        .max_delay(Duration::from_secs(1))
        .jitter(jitter)
        .build()
        .unwrap()
}

fn next_delay(c: &mut Criterion) {
    next_delay_with(c, "next_delay", ChaCha8Rng::seed_from_u64(1));
    next_delay_with(c, "next_delay_splitmix", SplitMix64::new(1));
}

/// The same decisions with two RNGs: ChaCha8 (a draw costs a few ns of its own) and the
/// [`SplitMix64`] the adapters own per operation (a draw costs about one).
fn next_delay_with<R: Rng>(c: &mut Criterion, group: &str, mut rng: R) {
    let mut group = c.benchmark_group(group);
    group.bench_function("baseline/handwritten_full_jitter", |b| {
        let mut n = 0u32;
        b.iter(|| {
            n = (n & 7) + 1;
            let envelope = (10_000_000u64 << (n - 1)).min(1_000_000_000);
            let draw = ((u128::from(rng.next_u64()) * u128::from(envelope + 1)) >> 64) as u64;
            Duration::from_nanos(draw)
        })
    });
    for (name, jitter) in [
        ("none", Jitter::None),
        ("full", Jitter::Full),
        ("equal", Jitter::Equal),
        ("proportional", Jitter::Proportional(0.1)),
    ] {
        let backoff = backoff(jitter);
        let mut state = BackoffState::new();
        group.bench_function(name, |b| {
            // Hidden once, as a caller's policy is: its settings are read, never folded in.
            let backoff = black_box(&backoff);
            b.iter(|| {
                if state.failures() == 8 {
                    state.reset();
                }
                state.next_delay(backoff, &mut rng)
            })
        });
    }
    let decorrelated =
        Backoff::decorrelated(Duration::from_millis(10)).max_delay(Duration::from_secs(1)).build().unwrap();
    let mut state = BackoffState::new();
    group.bench_function("decorrelated", |b| {
        let decorrelated = black_box(&decorrelated);
        b.iter(|| {
            if state.failures() == 8 {
                state.reset();
            }
            state.next_delay(decorrelated, &mut rng)
        })
    });
    // Each decorrelated delay depends on the previous one, so back to back on one state the
    // decisions form a serial chain. Here each decision starts from one of eight states
    // (streaks 0..8), as decisions of independent operations do.
    let mut states = [BackoffState::new(); 8];
    for i in 1..8 {
        states[i] = states[i - 1];
        states[i].next_delay(&decorrelated, &mut rng);
    }
    group.bench_function("decorrelated_independent", |b| {
        let decorrelated = black_box(&decorrelated);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut state = states[i];
            state.next_delay(decorrelated, &mut rng)
        })
    });
    group.finish();
}

fn retry_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("retry");
    let policy = RetryPolicy::builder(backoff(Jitter::Full)).max_attempts(3).build().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    group.bench_function("baseline/direct_call", |b| b.iter(|| black_box(black_box(7u64).wrapping_add(1))));
    group.bench_function("cycle", |b| {
        b.iter(|| {
            let mut retry = Retry::<u32>::new();
            let now = black_box(Instant::from_secs(1));
            retry.handle_start(&policy, now).unwrap();
            let Some(RetryAction::Start { attempt, .. }) = retry.poll_action() else { unreachable!() };
            retry.handle_failure(&policy, now, attempt, Failure::retryable(7), &mut rng).unwrap();
            let Some(RetryAction::Sleep { until, .. }) = retry.poll_action() else { unreachable!() };
            retry.handle_timeout(&policy, until, &mut rng);
            let Some(RetryAction::Start { attempt, .. }) = retry.poll_action() else { unreachable!() };
            retry.handle_success(until, attempt).unwrap();
            black_box(retry.poll_action())
        })
    });
    group.bench_function("first_attempt_success", |b| {
        b.iter(|| {
            let mut retry = Retry::<u32>::new();
            retry.handle_start(&policy, black_box(Instant::from_secs(1))).unwrap();
            let Some(RetryAction::Start { attempt, .. }) = retry.poll_action() else { unreachable!() };
            retry.handle_success(Instant::from_secs(1), attempt).unwrap();
            black_box(retry.poll_action())
        })
    });
    group.finish();
}

criterion_group!(benches, next_delay, retry_cycle);
criterion_main!(benches);
