//! The concurrency limits' admission plus release, uncontended (one call in flight at a time),
//! in one run: the core machines, the driver's shared ones, and the tower services, against a
//! hand-written atomic counter (the bar and the figures: `benches/README.md`).
//!
//! `cargo bench -p persevere-tower --bench limits`
//!
//! - `baseline/atomic_counter`: a hand-written limit, an `AtomicU32` in-flight counter compared
//!   with the limit and incremented (compare-exchange), then decremented (what a semaphore's
//!   fast path does, uncontended). Every ratio in the README is against it.
//! - `core/breaker_closed`: the core [`Breaker`]'s admission and record on the closed path;
//!   `core/limiter/*`: the core [`Limiter`]'s admission and release under each preset (every
//!   call takes 1 µs and succeeds), as in `core/benches/limits.rs`.
//! - `shared/direct_call`: awaiting the call itself (the floor of the async rows);
//!   `shared/breaker`: `Breaker::call` on a closed breaker (its clean path: no lock, no
//!   clock); `shared/limiter/*`: `Limiter::call` under each preset (a lock and a clock
//!   reading on admission and on release).
//! - `tower/service_fn`: the bare service (the floor of the tower rows);
//!   `tower/concurrency_limit`: tower's `ConcurrencyLimit` (a semaphore, limit 20) around it;
//!   `tower/load_shed`: `LoadShedLayer` over a shared AIMD `Limiter` around it. Both held
//!   across calls and called as `svc.ready().await?.call(7).await`.
//!
//! The async rows run on a current-thread tokio runtime. As in `core/benches/`, policies are
//! hidden from the optimiser once per bench, not per call.

use std::future::ready;
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use persevere::{
    Backoff, Breaker, BreakerPolicy, CallOutcome, Completion, Instant, Limiter, LimiterPolicy, SplitMix64,
};
use persevere_tower::LoadShedLayer;
use tokio::runtime::Runtime;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceExt, service_fn};

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

fn presets() -> [(&'static str, LimiterPolicy); 3] {
    [("aimd", LimiterPolicy::aimd()), ("vegas", LimiterPolicy::vegas()), ("gradient2", LimiterPolicy::gradient2())]
}

fn breaker_policy() -> BreakerPolicy {
    let open = Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build().unwrap();
    BreakerPolicy::builder(open).consecutive_failures(5).build().unwrap()
}

/// The call behind every async row: ready at once, and a success.
async fn op() -> Result<u64, &'static str> {
    Ok(black_box(7))
}

fn core(group: &mut BenchmarkGroup<'_, WallTime>) {
    let mut rng = SplitMix64::new(1);
    let breaker_policy = breaker_policy();
    let mut breaker = Breaker::new(&breaker_policy, 1);
    group.bench_function("core/breaker_closed", |b| {
        let policy = black_box(&breaker_policy);
        let mut i = 0u64;
        b.iter(|| {
            i = i.wrapping_add(1);
            match breaker.try_acquire(policy, Instant::from_micros(i), &mut rng) {
                Ok(permit) => {
                    breaker.record(policy, Instant::from_micros(i + 1), permit, CallOutcome::Success, &mut rng).is_ok()
                }
                Err(_) => false,
            }
        })
    });
    for (name, policy) in presets() {
        let mut limiter = Limiter::new(&policy, 1);
        group.bench_function(format!("core/limiter/{name}"), |b| {
            let policy = black_box(&policy);
            let mut i = 0u64;
            b.iter(|| {
                i = i.wrapping_add(1);
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
}

fn shared(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime) {
    group.bench_function("shared/direct_call", |b| b.to_async(rt).iter(op));
    let breaker = persevere_tokio::Breaker::new(breaker_policy());
    group.bench_function("shared/breaker", |b| b.to_async(rt).iter(|| breaker.call(op())));
    for (name, policy) in presets() {
        let limiter = persevere_tokio::Limiter::new(policy);
        group.bench_function(format!("shared/limiter/{name}"), |b| b.to_async(rt).iter(|| limiter.call(op())));
        assert_eq!(limiter.in_flight(), 0, "{name} leaked a place");
    }
}

/// Benchmarks `service`, held across calls (a clone per measurement, not per call), called as
/// `svc.ready().await?.call(7).await` (as `held` in `layers.rs`).
fn held<S>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, service: &S)
where
    S: Service<u64> + Clone,
    S::Error: std::fmt::Debug,
{
    group.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| {
            let mut service = service.clone();
            async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let ready = service.ready().await.unwrap();
                    black_box(ready.call(black_box(7)).await.unwrap());
                }
                start.elapsed()
            }
        })
    });
}

fn limits(c: &mut Criterion) {
    let mut group = c.benchmark_group("limits");
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
    core(&mut group);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    shared(&mut group, &rt);
    let echo = service_fn(|n: u64| ready(Ok::<u64, &'static str>(black_box(n))));
    held(&mut group, &rt, "tower/service_fn", &echo);
    held(&mut group, &rt, "tower/concurrency_limit", &ConcurrencyLimitLayer::new(20).layer(echo));
    let limiter = persevere_tokio::Limiter::new(LimiterPolicy::aimd());
    held(&mut group, &rt, "tower/load_shed", &LoadShedLayer::new(limiter).layer(echo));
    group.finish();
}

criterion_group!(benches, limits);
criterion_main!(benches);
