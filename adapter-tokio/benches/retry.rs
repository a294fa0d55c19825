//! The cost of `retry` on tokio (current-thread), against baselines measured in the same run.
//!
//! `cargo bench -p persevere-tokio --bench retry`
//!
//! - `success/direct_call`: awaiting the operation itself (the floor).
//! - `success/hand_written_loop`: a hand-written `loop { match op().await { .. } }` retry.
//! - `*/retry`: `persevere_tokio::retry`, awaited in a new `async` block per call through
//!   criterion's `iter` (the harness of `tower_retry` and `backon_retry`).
//! - `*/retry_loop`: the same calls awaited directly in the bench's own `iter_custom` loop, the
//!   harness of `tower_retry_held`, so that each pair compares like for like.
//! - `*/tower_retry`: a peer in the same run: `tower::retry::Retry` with an attempts policy
//!   whose "sleep" is a ready future (tower's machinery with a no-op sleep) around a
//!   `service_fn`, cloned and called with `oneshot` (poll_ready + call) per operation.
//! - `*/tower_retry_held`: the same service held by `&mut` and called as
//!   `svc.ready().await?.call(req)`, no clone per call.
//! - `success/tower_retry_sleeping`: `tower_retry` with a policy whose retry waits on a real
//!   `tokio::time::Sleep` (as a tower policy with backoff does), so that its future holds a
//!   timer's slot as `retry`'s does. In criterion's `iter` harness each call's future is moved
//!   into place, and a bigger future costs more (256 more bytes cost `tower_retry` about 1.3 ns
//!   here); `tower_retry`'s no-op sleep keeps its future small.
//! - `*/backon_retry`: another peer: backon's `Retryable::retry` with its exponential builder
//!   (100 ms, 4 retries); on the failure path with a no-op sleeper (`.sleep(|_| ready(()))`).
//! - `fail_three_times/*`: three failures then a success, with zero delays (no timer is touched).
//! - `breaker_closed/*`: the shared `Breaker` admitting and recording a successful call.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Backoff, RetryPolicy};
use tower::{Service, ServiceExt};

thread_local! {
    /// Failures left before the operation succeeds. A thread-local, so that every variant
    /// (tower's services included, which take owned requests) calls the very same operation.
    static LEFT: Cell<u32> = const { Cell::new(0) };
}

/// The operation: fails while `LEFT` is above zero, then returns 42.
async fn op() -> Result<u64, &'static str> {
    let left = LEFT.get();
    if left > 0 {
        LEFT.set(left - 1);
        Err("busy")
    } else {
        Ok(black_box(42))
    }
}

/// tower's retry policy for the peer measurement: retry any error, at most `n` times.
/// Each retry waits on the future `.1` makes: [`no_wait`] (tower's machinery with a no-op sleep)
/// or [`sleep_100ms`] (a `tokio::time::Sleep`, as any tower policy with a delay waits on; tower's
/// own `ExponentialBackoff` yields one). A success makes no wait, but its future holds the
/// wait's slot: 12 bytes with the first, 104 with the second.
#[derive(Clone)]
struct Attempts<W>(u32, W);

impl<Req: Clone, Res, E, W, F> tower::retry::Policy<Req, Res, E> for Attempts<W>
where
    W: Fn() -> F + Clone,
    F: std::future::Future<Output = ()>,
{
    type Future = F;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some((self.1)())
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// No wait at all.
fn no_wait() -> std::future::Ready<()> {
    std::future::ready(())
}

/// A real timer of 100 ms.
fn sleep_100ms() -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(100))
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
                LEFT.set(0);
                black_box(op().await)
            })
        });
        g.bench_function("hand_written_loop", |b| {
            b.to_async(&rt).iter(|| async {
                LEFT.set(failures);
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match op().await {
                        Ok(v) => break black_box(Ok::<_, &str>(v)),
                        Err(e) if attempts >= 5 => break Err(e),
                        Err(_) => tokio::task::yield_now().await,
                    }
                }
            })
        });
        let service = tower::retry::Retry::new(Attempts(4, no_wait), tower::service_fn(|()| op()));
        g.bench_function("tower_retry", |b| {
            b.to_async(&rt).iter(|| async {
                LEFT.set(failures);
                black_box(service.clone().oneshot(()).await)
            })
        });
        if failures == 0 {
            let sleeping = tower::retry::Retry::new(Attempts(4, sleep_100ms), tower::service_fn(|()| op()));
            g.bench_function("tower_retry_sleeping", |b| {
                b.to_async(&rt).iter(|| async {
                    LEFT.set(0);
                    black_box(sleeping.clone().oneshot(()).await)
                })
            });
        }
        g.bench_function("tower_retry_held", |b| {
            // The service is held by `&mut` across calls; `iter_custom` because a closure that
            // returns futures cannot lend them its captured `&mut`.
            b.to_async(&rt).iter_custom(|iters| {
                let mut service = service.clone();
                async move {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        LEFT.set(failures);
                        let ready = service.ready().await.unwrap();
                        let _ = black_box(ready.call(()).await);
                    }
                    start.elapsed()
                }
            })
        });
        let backoff = ExponentialBuilder::default().with_min_delay(Duration::from_millis(100)).with_max_times(4);
        if failures == 0 {
            g.bench_function("backon_retry", |b| {
                b.to_async(&rt).iter(|| async {
                    LEFT.set(0);
                    black_box(op.retry(backoff).await)
                })
            });
        } else {
            g.bench_function("backon_retry", |b| {
                b.to_async(&rt).iter(|| async {
                    LEFT.set(failures);
                    black_box(op.retry(backoff).sleep(|_| std::future::ready(())).await)
                })
            });
        }
        g.bench_function("retry", |b| {
            b.to_async(&rt).iter(|| async {
                LEFT.set(failures);
                black_box(persevere_tokio::retry(policy, op).await.result)
            })
        });
        g.bench_function("retry_loop", |b| {
            // The harness of `tower_retry_held`: every call from one loop in one future.
            b.to_async(&rt).iter_custom(|iters| async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    LEFT.set(failures);
                    let _ = black_box(persevere_tokio::retry(policy, op).await.result);
                }
                start.elapsed()
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
            LEFT.set(0);
            black_box(op().await)
        })
    });
    g.bench_function("breaker_call", |b| {
        b.to_async(&rt).iter(|| async {
            LEFT.set(0);
            black_box(breaker.call(op()).await)
        })
    });
    g.finish();
}

criterion_group!(benches, bench, breaker);
criterion_main!(benches);
