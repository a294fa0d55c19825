//! The cost of `retry` on tokio (current-thread), against baselines measured in the same run.
//!
//! `cargo bench -p persevere-tokio --bench retry`
//!
//! - `success/direct_call`: awaiting the operation itself (the floor).
//! - `success/hand_written_loop`: a hand-written `loop { match op().await { .. } }` retry.
//! - `success/retry`: `persevere_tokio::retry` when the first attempt succeeds.
//! - `success/tower_retry`: a peer in the same run: `tower::retry::Retry` with an attempts
//!   policy around a `service_fn`, called with `oneshot` (poll_ready + call).
//! - `success/backon_retry`: another peer: backon's `Retryable::retry` with its exponential
//!   builder (100 ms, 4 retries) on tokio's sleep.
//! - `fail_three_times/*`: three failures then a success, with zero delays (no timer is touched).
//! - `breaker_closed/*`: the shared `Breaker` admitting and recording a successful call.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Backoff, RetryPolicy};
use tower::ServiceExt;

async fn op(fail_until: &Cell<u32>) -> Result<u64, &'static str> {
    if fail_until.get() > 0 {
        fail_until.set(fail_until.get() - 1);
        Err("busy")
    } else {
        Ok(black_box(42))
    }
}

async fn op_ok() -> Result<u64, &'static str> {
    Ok(black_box(42))
}

/// tower's retry policy for the peer measurement: retry any error, at most `n` times.
#[derive(Clone)]
struct Attempts(u32);

impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for Attempts {
    type Future = std::future::Ready<()>;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some(std::future::ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let exponential = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap();
    let zero =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(5).build().unwrap();

    for (group, failures) in [("success", 0u32), ("fail_three_times", 3)] {
        let policy = if failures == 0 { &exponential } else { &zero };
        let mut g = c.benchmark_group(group);
        g.bench_function("direct_call", |b| {
            b.to_async(&rt).iter(|| async {
                let left = Cell::new(0);
                black_box(op(&left).await)
            })
        });
        g.bench_function("hand_written_loop", |b| {
            b.to_async(&rt).iter(|| async {
                let left = Cell::new(failures);
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match op(&left).await {
                        Ok(v) => break black_box(Ok::<_, &str>(v)),
                        Err(e) if attempts >= 5 => break Err(e),
                        Err(_) => tokio::task::yield_now().await,
                    }
                }
            })
        });
        if failures == 0 {
            let service = tower::retry::Retry::new(Attempts(4), tower::service_fn(|()| op_ok()));
            g.bench_function("tower_retry", |b| {
                b.to_async(&rt).iter(|| async { black_box(service.clone().oneshot(()).await) })
            });
            let backoff = ExponentialBuilder::default().with_min_delay(Duration::from_millis(100)).with_max_times(4);
            g.bench_function("backon_retry", |b| {
                b.to_async(&rt).iter(|| async { black_box(op_ok.retry(backoff).await) })
            });
        }
        g.bench_function("retry", |b| {
            b.to_async(&rt).iter(|| async {
                let left = Cell::new(failures);
                black_box(persevere_tokio::retry(policy, || op(&left)).await.result)
            })
        });
        g.finish();
    }
}

/// The shared `Breaker` on its closed path, against awaiting the call directly.
fn breaker(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let policy = persevere::BreakerPolicy::builder(Backoff::constant(Duration::from_secs(1)).build().unwrap())
        .consecutive_failures(5)
        .build()
        .unwrap();
    let breaker = rt.block_on(async { persevere_tokio::Breaker::new(policy) });
    let mut g = c.benchmark_group("breaker_closed");
    g.bench_function("direct_call", |b| {
        b.to_async(&rt).iter(|| async {
            let left = Cell::new(0);
            black_box(op(&left).await)
        })
    });
    g.bench_function("breaker_call", |b| {
        b.to_async(&rt).iter(|| async {
            let left = Cell::new(0);
            black_box(breaker.call(op(&left)).await)
        })
    });
    g.finish();
}

criterion_group!(benches, bench, breaker);
criterion_main!(benches);
