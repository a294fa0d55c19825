//! The breaker's and the budgets' per-call decisions, against hand-written baselines in the same
//! run (the bar and the figures: `benches/README.md`).
//!
//! `cargo bench -p persevere --bench breaker -- --warm-up-time 1 --measurement-time 2`
//!
//! - `breaker/baseline/direct_call`: a trivial closure (the floor of the harness).
//! - `breaker/baseline/handwritten_closed`: a hand-written breaker's closed path: a state check,
//!   then a consecutive-failure counter and its trip test.
//! - `breaker/closed/*`: [`Breaker::try_acquire`] + [`Breaker::record`] on the closed path, for
//!   each trip rule (every fourth call fails: the breaker never trips).
//! - `breaker/open_rejection`: [`Breaker::try_acquire`] while open, before `until`.
//! - `budget/*`: one retry decision (with its refund or request) for each budget.
//!
//! Results are consumed as a caller does, by branching on them, and each iteration returns one
//! `bool` (which criterion black-boxes). The policy is hidden from the optimiser once per bench,
//! not per call: `black_box` writes its argument to a stack slot, and per call those slots (and
//! the `Result`s LLVM then keeps in them) cost stores that measure the harness, not the decision.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{
    Backoff, Breaker, BreakerPolicy, CallOutcome, Instant, RatioBudget, RatioBudgetPolicy, RetryClass, TokenBucket,
    TokenBucketPolicy,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn open_backoff() -> Backoff {
    Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build().unwrap()
}

/// What a minimal hand-written breaker does per call while closed.
struct Handwritten {
    open: bool,
    consecutive: u32,
    limit: u32,
}

impl Handwritten {
    #[inline]
    fn try_acquire(&mut self) -> Result<(), ()> {
        if self.open { Err(()) } else { Ok(()) }
    }

    #[inline]
    fn record(&mut self, failed: bool) {
        self.consecutive = if failed { self.consecutive + 1 } else { 0 };
        if self.consecutive >= self.limit {
            self.open = true;
        }
    }
}

fn breaker(c: &mut Criterion) {
    let mut group = c.benchmark_group("breaker");
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    group.bench_function("baseline/direct_call", |b| {
        let mut n = 0u64;
        b.iter(|| {
            n = n.wrapping_add(1);
            black_box(n)
        })
    });
    group.bench_function("baseline/handwritten_closed", |b| {
        let mut hand = Handwritten { open: false, consecutive: 0, limit: 5 };
        let mut i = 0u32;
        b.iter(|| {
            i = i.wrapping_add(1);
            let hand = black_box(&mut hand);
            let admitted = hand.try_acquire().is_ok();
            if admitted {
                hand.record(i & 3 == 0);
            }
            admitted
        })
    });
    let policies = [
        ("consecutive", BreakerPolicy::builder(open_backoff()).consecutive_failures(5).build().unwrap()),
        (
            "count_window",
            BreakerPolicy::builder(open_backoff())
                .consecutive_failures(5)
                .failure_rate(0.5)
                .slow_call_rate(0.9, Duration::from_secs(1))
                .count_window(100)
                .minimum_calls(10)
                .build()
                .unwrap(),
        ),
        (
            "time_window",
            BreakerPolicy::builder(open_backoff())
                .failure_rate(0.5)
                .time_window(Duration::from_secs(10), 10)
                .minimum_calls(10)
                .build()
                .unwrap(),
        ),
    ];
    for (name, policy) in policies {
        let mut breaker = Breaker::new(&policy, 1);
        let mut i = 0u64;
        group.bench_function(format!("closed/{name}"), |b| {
            // Hidden once, as a caller's policy is: its settings are read, never folded in.
            let policy = black_box(&policy);
            b.iter(|| {
                i = i.wrapping_add(1);
                // 1 µs per call: the time window moves to a new bucket every million calls.
                let now = Instant::from_micros(i);
                let outcome = if i & 3 == 0 { CallOutcome::Failure } else { CallOutcome::Success };
                match breaker.try_acquire(policy, now, &mut rng) {
                    Ok(permit) => breaker.record(policy, now, permit, outcome, &mut rng).is_ok(),
                    Err(_) => false,
                }
            })
        });
        assert_eq!(breaker.status(), persevere::BreakerStatus::Closed, "{name} tripped during its bench");
    }
    let policy = BreakerPolicy::builder(open_backoff()).consecutive_failures(1).build().unwrap();
    let mut breaker = Breaker::new(&policy, 1);
    let permit = breaker.try_acquire(&policy, Instant::ZERO, &mut rng).unwrap();
    breaker.record(&policy, Instant::ZERO, permit, CallOutcome::Failure, &mut rng).unwrap();
    group.bench_function("open_rejection", |b| {
        let policy = black_box(&policy);
        let mut i = 0u64;
        b.iter(|| {
            // Calls during the first second of a one-second open period.
            i = (i + 1) & 0xffff;
            breaker.try_acquire(policy, Instant::from_micros(i), &mut rng).is_err()
        })
    });
    group.finish();
}

fn budget(c: &mut Criterion) {
    let mut group = c.benchmark_group("budget");
    let grpc = TokenBucketPolicy::grpc(100, 0.1).unwrap();
    let mut bucket = TokenBucket::new(&grpc);
    group.bench_function("token_bucket/grpc", |b| {
        b.iter(|| {
            let granted = bucket.try_acquire(black_box(&grpc), black_box(RetryClass::Transient));
            bucket.record_success(&grpc, None);
            black_box(granted.is_ok())
        })
    });
    let aws = TokenBucketPolicy::aws();
    let mut bucket = TokenBucket::new(&aws);
    group.bench_function("token_bucket/aws", |b| {
        b.iter(|| {
            let granted = bucket.try_acquire(black_box(&aws), black_box(RetryClass::Timeout));
            bucket.record_success(&aws, granted.ok());
            black_box(bucket.balance_milli())
        })
    });
    let finagle = RatioBudgetPolicy::finagle();
    let mut ratio = RatioBudget::new();
    let mut i = 0u64;
    group.bench_function("ratio/finagle", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let now = Instant::from_micros(i);
            ratio.record_request(black_box(&finagle), now);
            black_box(ratio.try_acquire(black_box(&finagle), now).is_ok())
        })
    });
    // The same budget with a burst window of 5 buckets: every grant weighs up to 5 stretches.
    let bounded = RatioBudgetPolicy::builder(0.2).burst_window(Duration::from_secs(5)).build().unwrap();
    let mut ratio = RatioBudget::new();
    group.bench_function("ratio/finagle_burst_5s", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let now = Instant::from_micros(i);
            ratio.record_request(black_box(&bounded), now);
            black_box(ratio.try_acquire(black_box(&bounded), now).is_ok())
        })
    });
    group.finish();
}

criterion_group!(benches, breaker, budget);
criterion_main!(benches);
