//! Admission plus release on the uncontended path (one call in flight at a time) of the
//! bulkhead and the adaptive limiter, against hand-written baselines and the breaker's closed
//! path in the same run (the bar and the figures: `benches/README.md`).
//!
//! `cargo bench -p persevere --bench limits -- --warm-up-time 1 --measurement-time 2`
//!
//! - `limits/baseline/direct_call`: a trivial closure (the floor of the harness).
//! - `limits/baseline/atomic_counter`: a hand-written limit: an `AtomicU32` in-flight counter,
//!   compared with the limit, incremented, then decremented (what a semaphore's fast path does,
//!   uncontended).
//! - `limits/breaker_closed`: [`Breaker::try_acquire`] + [`Breaker::record`] on the closed
//!   path (consecutive failures), the bar.
//! - `limits/bulkhead`: [`Bulkhead::try_acquire`] + [`Bulkhead::release`].
//! - `limits/limiter/*`: [`Limiter::try_acquire`] + [`Limiter::release`] under each preset
//!   (its algorithm's update runs on every release; with one call in flight none moves the
//!   limit, as in an uncontended service).
//!
//! As in `breaker.rs`, the policy is hidden from the optimiser once per bench and each
//! iteration returns one `bool`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{
    Backoff, Breaker, BreakerPolicy, Bulkhead, BulkheadPolicy, CallOutcome, Completion, Instant, Limiter, LimiterPolicy,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// A hand-written concurrency limit: one atomic counter.
struct AtomicLimit {
    in_flight: AtomicU32,
    limit: u32,
}

impl AtomicLimit {
    #[inline]
    fn try_acquire(&self) -> bool {
        let mut current = self.in_flight.load(Ordering::Relaxed);
        loop {
            if current >= self.limit {
                return false;
            }
            match self.in_flight.compare_exchange_weak(current, current + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    #[inline]
    fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::Release);
    }
}

fn limits(c: &mut Criterion) {
    let mut group = c.benchmark_group("limits");
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    group.bench_function("baseline/direct_call", |b| {
        let mut n = 0u64;
        b.iter(|| {
            n = n.wrapping_add(1);
            black_box(n)
        })
    });
    let atomic = AtomicLimit { in_flight: AtomicU32::new(0), limit: 20 };
    group.bench_function("baseline/atomic_counter", |b| {
        b.iter(|| {
            let limit = black_box(&atomic);
            let admitted = limit.try_acquire();
            if admitted {
                limit.release();
            }
            admitted
        })
    });
    let open = Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build().unwrap();
    let breaker_policy = BreakerPolicy::builder(open).consecutive_failures(5).build().unwrap();
    let mut breaker = Breaker::new(&breaker_policy, 1);
    let mut i = 0u64;
    group.bench_function("breaker_closed", |b| {
        let policy = black_box(&breaker_policy);
        b.iter(|| {
            i = i.wrapping_add(1);
            let now = Instant::from_micros(i);
            match breaker.try_acquire(policy, now, &mut rng) {
                Ok(permit) => breaker.record(policy, now, permit, CallOutcome::Success, &mut rng).is_ok(),
                Err(_) => false,
            }
        })
    });
    let bulkhead_policy = BulkheadPolicy::builder(20).max_wait(Duration::from_millis(10), 8).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    group.bench_function("bulkhead", |b| {
        let policy = black_box(&bulkhead_policy);
        b.iter(|| {
            i = i.wrapping_add(1);
            match bulkhead.try_acquire(policy, Instant::from_micros(i)) {
                Ok(permit) => bulkhead.release(permit).is_ok(),
                Err(_) => false,
            }
        })
    });
    for (name, policy) in
        [("aimd", LimiterPolicy::aimd()), ("vegas", LimiterPolicy::vegas()), ("gradient2", LimiterPolicy::gradient2())]
    {
        let mut limiter = Limiter::new(&policy, 1);
        group.bench_function(format!("limiter/{name}"), |b| {
            let policy = black_box(&policy);
            b.iter(|| {
                i = i.wrapping_add(1);
                // Each call takes 1 µs.
                match limiter.try_acquire(policy, Instant::from_micros(i)) {
                    Ok(permit) => limiter
                        .release(policy, Instant::from_micros(i + 1), permit, Completion::Success, &mut rng)
                        .is_ok(),
                    Err(_) => false,
                }
            })
        });
        assert_eq!(limiter.in_flight(), 0, "{name} leaked a permit");
    }
    group.finish();
}

criterion_group!(benches, limits);
criterion_main!(benches);
