//! The load-shedding layer against a real hyper server on loopback whose service time grows
//! with its queue: each request takes `BASE + PER_CALL × (requests in flight)`. Many clients
//! in a closed loop drive it; with no limit every request waits behind all the others, and
//! with the `LoadShedLayer` the limit settles where the server is still fast and the excess is
//! refused at once with when to come back.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use persevere_tower::{
    Completion, Gate, LimitAlgorithm, Limiter, LimiterPolicy, LoadShedLayer, Refusal, RetryGate, ShedError,
};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

const BASE: Duration = Duration::from_millis(5);
const PER_CALL: Duration = Duration::from_millis(1);
const CLIENTS: usize = 64;
const RUN: Duration = Duration::from_millis(1500);

/// A server on 127.0.0.1 whose every request sleeps `BASE + PER_CALL × in-flight` (itself
/// included), then answers 200. Returns its address.
async fn queueing_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let in_flight = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<hyper::body::Incoming>| {
                    let in_flight = in_flight.clone();
                    async move {
                        let queue = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(BASE + PER_CALL * queue).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Latencies of the answered calls, sorted, and how many calls were shed.
struct Run {
    latencies: Vec<Duration>,
    shed: usize,
}

impl Run {
    fn quantile(&self, q: f64) -> Duration {
        let index = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[index]
    }
}

/// `CLIENTS` tasks call `service` in a closed loop for `RUN`; a shed call waits its
/// `retry_after` (at least 1 ms) before the next. The first third of the run is warm-up and
/// not measured.
async fn drive<S>(service: S, addr: std::net::SocketAddr) -> Run
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Shed + std::fmt::Debug + Send,
{
    let start = Instant::now();
    let measured_from = start + RUN / 3;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move {
                let (mut latencies, mut shed) = (Vec::new(), 0);
                while start.elapsed() < RUN {
                    let request = Request::get(format!("http://{addr}/")).body(Full::new(Bytes::new())).unwrap();
                    let sent = Instant::now();
                    match service.ready().await.unwrap().call(request).await {
                        Ok(response) => {
                            assert_eq!(response.status(), StatusCode::OK);
                            if sent >= measured_from {
                                latencies.push(sent.elapsed());
                            }
                        }
                        Err(error) => {
                            let after = error.retry_after().expect("only sheds fail here");
                            shed += 1;
                            tokio::time::sleep(after.max(Duration::from_millis(1))).await;
                        }
                    }
                }
                (latencies, shed)
            })
        })
        .collect();
    let mut run = Run { latencies: Vec::new(), shed: 0 };
    for task in tasks {
        let (latencies, shed) = task.await.unwrap();
        run.latencies.extend(latencies);
        run.shed += shed;
    }
    run.latencies.sort();
    run
}

/// The inner client's errors never happen on loopback; a shed carries its `retry_after`.
struct Unlimited(Client<HttpConnector, Full<Bytes>>);

#[derive(Debug)]
struct Never;

/// An error that may be a shed call, with how long to wait.
trait Shed {
    fn retry_after(&self) -> Option<Duration>;
}

impl Shed for Never {
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

impl Shed for ShedError<Never> {
    fn retry_after(&self) -> Option<Duration> {
        ShedError::retry_after(self)
    }
}

impl Clone for Unlimited {
    fn clone(&self) -> Self {
        Unlimited(self.0.clone())
    }
}

impl Service<Request<Full<Bytes>>> for Unlimited {
    type Response = Response<hyper::body::Incoming>;
    type Error = Never;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Never>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Never>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let call = self.0.request(request);
        Box::pin(async move { Ok(call.await.expect("loopback answers")) })
    }
}

/// The no-load latency: one call at a time.
async fn no_load(addr: std::net::SocketAddr) -> Duration {
    let client = client();
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let sent = Instant::now();
        let request = Request::get(format!("http://{addr}/")).body(Full::new(Bytes::new())).unwrap();
        client.request(request).await.unwrap();
        best = best.min(sent.elapsed());
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l2_a_load_shed_layer_keeps_latency_bounded_where_no_limit_lets_it_grow_with_the_queue() {
    let addr = queueing_server().await;
    let no_load = no_load(addr).await;

    let unlimited = drive(Unlimited(client()), addr).await;

    // Vegas from a small limit, so its first samples measure the server nearly unloaded.
    let policy = LimiterPolicy::builder(LimitAlgorithm::Vegas { smoothing: 1.0 }).limits(1, 4, 200).build().unwrap();
    let limiter = Limiter::new(policy);
    let shedding = ServiceBuilder::new().layer(LoadShedLayer::new(limiter.clone())).service(Unlimited(client()));
    let limited = drive(shedding, addr).await;

    let (u50, u99) = (unlimited.quantile(0.5), unlimited.quantile(0.99));
    let (l50, l99) = (limited.quantile(0.5), limited.quantile(0.99));
    eprintln!(
        "no load {no_load:?}; no limit: p50 {u50:?} p99 {u99:?} ({} answered); \
         shed layer (limit {}): p50 {l50:?} p99 {l99:?} ({} answered, {} shed)",
        unlimited.latencies.len(),
        limiter.limit(),
        limited.latencies.len(),
        limited.shed,
    );
    // With no limit every request queues behind the other clients': about BASE + CLIENTS × PER_CALL.
    assert_eq!(unlimited.shed, 0);
    assert!(u50 >= BASE + PER_CALL * (CLIENTS as u32 * 3 / 4), "no limit: p50 {u50:?}");
    // With the layer the limit settles low, the excess is shed, and the answered calls keep a
    // latency a small multiple of the no-load one, a fraction of the unlimited one.
    assert!(limited.shed > 0, "the layer shed nothing");
    assert!(limiter.limit() < CLIENTS as u32 / 2, "limit {}", limiter.limit());
    assert!(l99 <= u50 / 2, "shed layer p99 {l99:?} against no limit's p50 {u50:?}");
    assert!(l50 <= no_load * 5, "shed layer p50 {l50:?} against no load {no_load:?}");
    assert_eq!(limiter.in_flight(), 0, "every place returned");
}

#[tokio::test]
async fn t4_a_shed_call_is_a_typed_error_with_retry_after_and_the_inner_service_is_not_called() {
    let policy = LimiterPolicy::builder(LimitAlgorithm::Vegas { smoothing: 1.0 }).limits(1, 1, 1).build().unwrap();
    let limiter = Limiter::new(policy);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    let wait = Arc::new(tokio::sync::Mutex::new(Some(wait)));
    let mut service = ServiceBuilder::new()
        .layer(LoadShedLayer::new(limiter.clone()).classify(|_: &Result<u32, Infallible>| Completion::Success))
        .service_fn(move |n: u32| {
            counted.fetch_add(1, Ordering::SeqCst);
            let wait = wait.clone();
            async move {
                if let Some(wait) = wait.lock().await.take() {
                    let _ = wait.await;
                }
                Ok::<_, Infallible>(n)
            }
        });
    // The first call holds the only place.
    let first = tokio::spawn(service.ready().await.unwrap().call(1));
    while limiter.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let shed = service.ready().await.unwrap().call(2).await.unwrap_err();
    assert_eq!(shed.retry_after(), Some(Duration::ZERO), "no RTT measured yet");
    assert_eq!(shed.refusal().map(|r| r.gate()), Some(Gate::Limiter));
    assert!(matches!(shed, ShedError::Shed { .. }));
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(shed);
    assert!(boxed.to_string().starts_with("concurrency limit full"), "{boxed}");
    assert_eq!(limiter.admit(), Err(Refusal::new(Gate::Limiter, Some(Duration::ZERO))));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the shed call never reached the service");
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(service.ready().await.unwrap().call(3).await.unwrap(), 3);
    assert_eq!(limiter.in_flight(), 0);
    assert!(limiter.min_rtt().is_some());
}
