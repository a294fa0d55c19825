//! The cost of `hedge` on tokio (current-thread) when the first attempt answers at once, against
//! baselines measured in the same run.
//!
//! `cargo bench -p persevere-tokio --bench hedge`
//!
//! - `first_success/direct_call`: awaiting the operation itself (the floor).
//! - `first_success/tower_hedge`: the peer, `tower::hedge::Hedge` (hedges at the 90th
//!   percentile of the latencies it has seen, after 10 data points, over 10 s) around a
//!   `service_fn`, held by `&mut` and called as `svc.ready().await?.call(req)`.
//! - `first_success/hedge`: `persevere_tokio::hedge` with 3 attempts, 50 ms apart.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::HedgePolicy;
use tower::{Service, ServiceExt};

/// The operation: succeeds at once.
async fn op() -> Result<u64, &'static str> {
    Ok(black_box(42))
}

/// tower's hedge policy: every request may be hedged, and cloned.
#[derive(Clone)]
struct Always;

impl tower::hedge::Policy<()> for Always {
    fn clone_request(&self, _: &()) -> Option<()> {
        Some(())
    }

    fn can_retry(&self, _: &()) -> bool {
        true
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let policy = HedgePolicy::builder(3, Duration::from_millis(50)).build().unwrap();
    let mut g = c.benchmark_group("first_success");
    g.bench_function("direct_call", |b| b.to_async(&rt).iter(|| async { black_box(op().await) }));
    g.bench_function("tower_hedge", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let mut service =
                tower::hedge::Hedge::new(tower::service_fn(|()| op()), Always, 10, 0.9, Duration::from_secs(10));
            let start = std::time::Instant::now();
            for _ in 0..iters {
                let ready = service.ready().await.unwrap();
                let _ = black_box(ready.call(()).await);
            }
            start.elapsed()
        })
    });
    g.bench_function("hedge", |b| {
        b.to_async(&rt).iter(|| async { black_box(persevere_tokio::hedge(&policy, op).await.result) })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
