//! The cost of each layer on the success path, against baselines measured in the same run.
//!
//! `cargo bench -p persevere-tower --bench layers`
//!
//! Every variant holds its service and calls it as `svc.ready().await?.call(req).await` on a
//! current-thread tokio runtime; the innermost service is the same `service_fn` returning a
//! ready `Ok`.
//!
//! - `success/service_fn`: the bare service (the floor).
//! - `success/tower_retry`: `tower::retry::Retry` with an attempts policy (the peer), whose
//!   retries wait on a no-op (ready) future; `success/tower_retry_sleeping` the same with a
//!   policy whose retries wait on a `tokio::time::Sleep`, as any tower policy with a delay does.
//! - `success/retry_layer`: `persevere_tower::RetryLayer`, every error retryable, its policy
//!   behind an `Arc` (the default: two atomic operations per call);
//!   `success/retry_layer_static_policy` the same with a `&'static RetryPolicy`.
//! - `success/http_service_fn`, `success/tower_retry_http`, `success/retry_layer_http`: the same
//!   three with an `http::Request<String>` (building it is part of every variant), tower's policy
//!   and the `Http` classifier each copying the request per call.
//! - `success/breaker_layer`: `persevere_tower::BreakerLayer` on a closed breaker.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use persevere::{Backoff, BreakerPolicy, RetryPolicy};
use persevere_tokio::Breaker;
use persevere_tower::{BreakerLayer, Http, RetryErrors, RetryLayer};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt, service_fn};

/// tower's retry policy for the peer: retry any error, at most `n` times; copies the request.
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
fn no_wait() -> Ready<()> {
    ready(())
}

/// A real timer of 100 ms.
fn sleep_100ms() -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(100))
}

/// tower's peer for HTTP: the same, copying an `http::Request<String>` by hand.
#[derive(Clone)]
struct HttpAttempts(u32);

impl<Res, E> tower::retry::Policy<Request<String>, Res, E> for HttpAttempts {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Request<String>, result: &mut Result<Res, E>) -> Option<Self::Future> {
        match result {
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap()
}

/// Benchmarks `service`, held across calls (a clone per measurement, not per call), called as
/// `svc.ready().await?.call(request()).await`. `iter_custom`, because a closure that returns
/// futures cannot lend them its captured `&mut`.
fn held<S, Req>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    service: &S,
    request: impl Fn() -> Req,
) where
    S: Service<Req> + Clone,
    S::Error: std::fmt::Debug,
{
    group.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| {
            let mut service = service.clone();
            let request = &request;
            async move {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    let ready = service.ready().await.unwrap();
                    black_box(ready.call(request()).await.unwrap());
                }
                start.elapsed()
            }
        })
    });
}

fn success(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let mut group = c.benchmark_group("success");
    let echo = service_fn(|n: u64| ready(Ok::<u64, &'static str>(black_box(n))));
    let seven = || black_box(7u64);

    held(&mut group, &rt, "service_fn", &echo, seven);
    held(&mut group, &rt, "tower_retry", &tower::retry::RetryLayer::new(Attempts(4, no_wait)).layer(echo), seven);
    let sleeping = tower::retry::RetryLayer::new(Attempts(4, sleep_100ms)).layer(echo);
    held(&mut group, &rt, "tower_retry_sleeping", &sleeping, seven);
    held(&mut group, &rt, "retry_layer", &RetryLayer::new(policy()).classify(RetryErrors).layer(echo), seven);
    let shared: &'static RetryPolicy = Box::leak(Box::new(policy()));
    held(
        &mut group,
        &rt,
        "retry_layer_static_policy",
        &RetryLayer::new(shared).classify(RetryErrors).layer(echo),
        seven,
    );
    let open_for = Backoff::constant(Duration::from_secs(1)).build().unwrap();
    let breaker = Breaker::new(BreakerPolicy::builder(open_for).consecutive_failures(5).build().unwrap());
    held(&mut group, &rt, "breaker_layer", &BreakerLayer::new(breaker).layer(echo), seven);

    let http = service_fn(|req: Request<String>| ready(Ok::<_, Infallible>(Response::new(black_box(req.into_body())))));
    let request = || Request::get("http://example.com/items/7").header("x-trace", "abc").body(String::new()).unwrap();
    held(&mut group, &rt, "http_service_fn", &http, request);
    held(&mut group, &rt, "tower_retry_http", &tower::retry::RetryLayer::new(HttpAttempts(4)).layer(http), request);
    held(&mut group, &rt, "retry_layer_http", &RetryLayer::new(policy()).classify(Http::new()).layer(http), request);
    group.finish();
}

criterion_group!(benches, success);
criterion_main!(benches);
