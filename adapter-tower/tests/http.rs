//! The tower layers against a real hyper 1.x server on 127.0.0.1, called by a real hyper-util
//! client through the layers (T1–T3, H1–H3). Every test scripts the server's replies, one per
//! connection (the server closes each connection after one reply, the client pools none), and
//! checks what the server received, the delays between requests, and the outcome.
//!
//! `cargo test -p persevere-tower --test http`

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use persevere::{Backoff, BreakerPolicy, FailureClass, HedgePolicy, OutcomeKind, RatioBudgetPolicy, RetryPolicy};
use persevere_tokio::{Breaker, Budget, TokioRuntime};
use persevere_tower::{BreakerLayer, ByStatus, CallError, HedgeLayer, Http, IDEMPOTENCY_KEY, RetryLayer, SentOnce};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

/// What the server does with the next connection.
#[derive(Clone, Debug)]
enum Reply {
    /// Responds with this status and these headers.
    Status(u16, Vec<(&'static str, String)>),
    /// Responds 200 after this long.
    Slow(Duration),
    /// Reads the request, then resets the connection without a response.
    Reset,
}

fn status(code: u16) -> Reply {
    Reply::Status(code, Vec::new())
}

fn status_with(code: u16, header: &'static str, value: impl Into<String>) -> Reply {
    Reply::Status(code, vec![(header, value.into())])
}

/// A request as the server received it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    idempotency_key: bool,
    at: Instant,
}

/// A scripted HTTP/1.1 server on loopback: one reply per connection, taken from the script in
/// order (200 once it runs out).
struct Server {
    addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start(script: impl IntoIterator<Item = Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(script.into_iter().collect::<VecDeque<_>>()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, n) = (script.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let reply = s.lock().unwrap().pop_front().unwrap_or(status(200));
                tokio::spawn(serve(stream, reply, n.clone()));
            }
        });
        Server { addr, script, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The gaps between the requests received.
    fn gaps(&self) -> Vec<Duration> {
        self.seen().windows(2).map(|w| w[1].at - w[0].at).collect()
    }

    fn replies_left(&self) -> usize {
        self.script.lock().unwrap().len()
    }
}

async fn serve(mut stream: tokio::net::TcpStream, reply: Reply, seen: Arc<Mutex<Vec<Seen>>>) {
    if let Reply::Reset = reply {
        // Read the request head, record it, and reset the connection.
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let method = text.split(' ').next().unwrap_or_default().to_ascii_uppercase();
        seen.lock().unwrap().push(Seen {
            method,
            idempotency_key: text.contains("idempotency-key:"),
            at: Instant::now(),
        });
        // A zero linger resets the connection on drop and never blocks (what the deprecation warns of).
        #[allow(deprecated)]
        stream.set_linger(Some(Duration::ZERO)).unwrap();
        return;
    }
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let reply = reply.clone();
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(Seen {
                method: request.method().to_string(),
                idempotency_key: request.headers().contains_key(IDEMPOTENCY_KEY),
                at: Instant::now(),
            });
            let response = match reply {
                Reply::Status(code, headers) => {
                    let mut response = Response::builder().status(code);
                    for (name, value) in headers {
                        response = response.header(name, value);
                    }
                    response.body(Full::new(Bytes::from_static(b"scripted"))).unwrap()
                }
                Reply::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    Response::new(Full::new(Bytes::from_static(b"slow")))
                }
                Reply::Reset => unreachable!("handled before hyper"),
            };
            Ok::<_, Infallible>(response)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// A hyper-util client that keeps no idle connection, so every request opens its own.
fn client<B>() -> Client<HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http()
}

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(Duration::from_millis(20)).build().unwrap())
        .max_attempts(attempts)
        .build()
        .unwrap()
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

fn post(url: &str) -> Request<Full<Bytes>> {
    Request::post(url).body(Full::new(Bytes::from_static(b"{\"order\":1}"))).unwrap()
}

fn assert_send_static<T: Send + 'static>(_: &T) {}

#[tokio::test]
async fn t1_the_layers_wrap_a_real_client_are_clone_and_their_futures_are_send_and_static() {
    let server = Server::start([status(503), status(200)]).await;
    let breaker = Breaker::new(
        BreakerPolicy::builder(Backoff::constant(Duration::from_secs(5)).build().unwrap())
            .consecutive_failures(5)
            .build()
            .unwrap(),
    );
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(3)).classify(Http::new()).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker.clone()).classify(ByStatus))
        .service(client::<Full<Bytes>>());
    let mut clone = service.clone();
    let future = clone.ready().await.unwrap().call(get(&server.url("/a")));
    assert_send_static(&future);
    let response = tokio::spawn(future).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);
    // The original service still works, and shares the breaker: one failure was recorded,
    // then a success closed the streak.
    let response = service.oneshot(get(&server.url("/b"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!((server.seen().len(), breaker.outstanding_permits()), (3, 0));
}

#[tokio::test]
async fn t2_a_503_response_and_a_reset_connection_are_retried_alike() {
    let server = Server::start([status(503), Reply::Reset, status(200)]).await;
    let service = RetryLayer::new(policy(3)).classify(Http::new());
    let response = ServiceBuilder::new().layer(service).service(client()).oneshot(get(&server.url("/"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "scripted");
    assert_eq!(server.seen().len(), 3);
    assert!(server.gaps().iter().all(|gap| *gap >= Duration::from_millis(20)), "{:?}", server.gaps());
}

#[tokio::test]
async fn t2_a_retry_that_gives_up_on_responses_returns_the_last_one_with_its_stats() {
    let server = Server::start([status(502), status(500), status(503)]).await;
    let layer = RetryLayer::new(policy(3)).classify(Http::new());
    let error = ServiceBuilder::new().layer(layer).service(client()).oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!(error.outcome(), OutcomeKind::Exhausted);
    assert_eq!(error.class(), Some(FailureClass::Throttled), "the last, a 503 without Retry-After, is throttling");
    assert_eq!(error.stats().attempts, 3);
    assert!(error.stats().slept >= Duration::from_millis(40), "{:?}", error.stats());
    assert_eq!(error.sent_once(), None);
    assert_eq!(error.into_response().map(|r| r.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn t2_a_response_slower_than_the_attempt_timeout_is_retried() {
    let server = Server::start([Reply::Slow(Duration::from_secs(5)), status(200)]).await;
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build().unwrap())
        .max_attempts(2)
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy).classify(Http::new())).service(client());
    let response = service.oneshot(get(&server.url("/"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);
    assert!(server.gaps()[0] >= Duration::from_millis(310), "{:?}", server.gaps());

    let server = Server::start([Reply::Slow(Duration::from_secs(5)), Reply::Slow(Duration::from_secs(5))]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy).classify(Http::new())).service(client());
    let error = service.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Timeout)));
    assert!(error.response().is_none() && error.error().is_none());
    assert_eq!(error.stats().attempts, 2);
}

#[tokio::test]
async fn t2_a_request_whose_body_cannot_be_copied_is_sent_once_and_the_error_says_so() {
    let server = Server::start([status(503), status(200)]).await;
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(3)).classify(Http::new()))
        .service(client::<BoxBody<Bytes, Infallible>>());
    let request = Request::put(server.url("/stream")).body(Full::new(Bytes::from_static(b"chunk")).boxed()).unwrap();
    let error = service.oneshot(request).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotClonable));
    assert_eq!(error.class(), Some(FailureClass::DoNotRetry));
    assert_eq!(error.stats().attempts, 1);
    assert_eq!(error.response().map(|r| r.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert!(error.to_string().starts_with("not retried: the request could not be copied"), "{error}");
    assert_eq!((server.seen().len(), server.replies_left()), (1, 1));
}

#[tokio::test]
async fn t3_an_open_breaker_fails_the_call_at_once_with_its_retry_after() {
    let server = Server::start([status(500), status(503)]).await;
    let open_for = Backoff::constant(Duration::from_secs(30)).build().unwrap();
    let breaker = Breaker::new(BreakerPolicy::builder(open_for).consecutive_failures(2).build().unwrap());
    let service = ServiceBuilder::new().layer(BreakerLayer::new(breaker.clone()).classify(ByStatus)).service(client());
    for expected in [500, 503] {
        let response = service.clone().oneshot(get(&server.url("/"))).await.unwrap();
        assert_eq!(response.status().as_u16(), expected);
    }
    let started = Instant::now();
    match service.clone().oneshot(get(&server.url("/"))).await {
        Err(CallError::Rejected { retry_after: Some(after) }) => {
            assert!(after > Duration::from_secs(29) && after <= Duration::from_secs(30), "{after:?}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(29), "rejected at once");
    assert_eq!(server.seen().len(), 2, "an open breaker sends nothing");

    // Under a retry gated by the same breaker, the call ends as Rejected, with the breaker's
    // rejection as its last error; nothing is sent either.
    let retrying = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(5)).classify(Http::new()).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker).classify(ByStatus))
        .service(client());
    let error = retrying.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!((error.outcome(), error.stats().attempts), (OutcomeKind::Rejected, 1));
    assert!(matches!(error.error(), Some(CallError::Rejected { retry_after: Some(_) })), "{error:?}");
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn t3_a_budget_refusal_ends_the_retry_as_rejected() {
    let server = Server::start([status(503), status(200)]).await;
    // A ratio budget with no floor: one request earns a tenth of a retry, not a whole one.
    let budget =
        Budget::ratio(TokioRuntime::new(), RatioBudgetPolicy::builder(0.1).min_retries_per_sec(0).build().unwrap());
    let service =
        ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(Http::new()).gate(budget)).service(client());
    let error = service.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!(error.outcome(), OutcomeKind::Rejected);
    assert_eq!(error.response().map(|r| r.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(error.stats().attempts, 1);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn h1_the_retryable_statuses_and_connection_failures_are_retried_and_no_others() {
    for code in [408, 429, 500, 502, 503, 504] {
        let server = Server::start([status(code), status(200)]).await;
        let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
        let response = service.oneshot(get(&server.url("/"))).await.unwrap();
        assert_eq!((code, response.status(), server.seen().len()), (code, StatusCode::OK, 2));
    }
    for code in [200, 201, 301, 400, 401, 404, 409, 501, 505] {
        let server = Server::start([status(code), status(200)]).await;
        let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
        let response = service.oneshot(get(&server.url("/"))).await.unwrap();
        assert_eq!((response.status().as_u16(), server.seen().len()), (code, 1));
    }
    // A reset connection is retried.
    let server = Server::start([Reply::Reset, status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);
    // A refused connection is retried until the policy gives up, with the client's error.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(Http::new())).service(client());
    let error = service.oneshot(get(&url)).await.unwrap_err();
    assert_eq!((error.outcome(), error.stats().attempts), (OutcomeKind::Exhausted, 3));
    assert!(error.error().is_some_and(|e| e.is_connect()), "{error:?}");
}

#[tokio::test]
async fn h2_retry_after_in_seconds_on_a_503_is_honoured() {
    let server = Server::start([status_with(503, "retry-after", "1"), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);
    assert!(server.gaps()[0] >= Duration::from_secs(1), "the hint is never undercut: {:?}", server.gaps());
}

#[tokio::test]
async fn h2_retry_after_as_an_http_date_on_a_429_is_honoured() {
    // Two seconds ahead, written to the second: the hint is between one and two seconds.
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
    let server = Server::start([status_with(429, "retry-after", date), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert!(server.gaps()[0] >= Duration::from_millis(900), "{:?}", server.gaps());
}

#[tokio::test]
async fn h2_a_retry_after_past_max_hint_ends_the_call_deferred_with_the_hint() {
    let server = Server::start([status_with(503, "retry-after", "120"), status(200)]).await;
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(20)).build().unwrap())
        .max_attempts(3)
        .max_hint(Duration::from_secs(60))
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy).classify(Http::new())).service(client());
    let error = service.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Deferred, Some(FailureClass::RetryAfter)));
    assert_eq!(error.retry_after(), Some(Duration::from_secs(120)));
    assert_eq!(error.response().map(|r| r.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn h2_retry_after_on_other_statuses_is_not_a_hint() {
    // A 500 asking for two minutes is retried on the schedule, not deferred.
    let server = Server::start([status_with(500, "retry-after", "120"), status(200)]).await;
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(20)).build().unwrap())
        .max_attempts(2)
        .max_hint(Duration::from_secs(60))
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy).classify(Http::new())).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn h2_a_429_without_retry_after_is_throttled_and_a_budget_charges_it_so() {
    // A 429 and a 503 without a hint, then success; the budget's throttling cost is 7 tokens.
    let server = Server::start([status(429), status(503), status(200)]).await;
    let budget = persevere_tokio::Budget::tokens(
        persevere_tokio::TokioRuntime::new(),
        persevere::TokenBucketPolicy::builder(100).costs(7, 1, 1).build().unwrap(),
    );
    let layer = RetryLayer::new(policy(3)).classify(Http::new()).gate(budget.clone());
    let service = ServiceBuilder::new().layer(layer).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 3);
    assert_eq!(budget.balance_milli(), Some(100_000 - 2 * 7_000 + 1_000), "two throttling retries, a success's token");
}

#[tokio::test]
async fn h3_a_post_is_sent_once_and_the_error_says_why() {
    let server = Server::start([status(503), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(Http::new())).service(client());
    let error = service.oneshot(post(&server.url("/orders"))).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotIdempotent));
    assert_eq!(error.stats().attempts, 1);
    assert_eq!(error.response().map(|r| r.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    let seen = server.seen();
    assert_eq!((seen.len(), seen[0].method.as_str()), (1, "POST"));

    // PATCH too; a PUT is idempotent and retried.
    let server = Server::start([status(503), status(503), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(Http::new())).service(client());
    let patch = Request::patch(server.url("/orders/1")).body(Full::new(Bytes::new())).unwrap();
    assert_eq!(service.clone().oneshot(patch).await.unwrap_err().sent_once(), Some(SentOnce::NotIdempotent));
    let put = Request::put(server.url("/orders/1")).body(Full::new(Bytes::new())).unwrap();
    assert_eq!(service.oneshot(put).await.unwrap().status(), StatusCode::OK);
    let methods: Vec<_> = server.seen().into_iter().map(|s| s.method).collect();
    assert_eq!(methods, ["PATCH", "PUT", "PUT"]);
}

#[tokio::test]
async fn h3_a_post_is_retried_with_an_idempotency_key_or_when_the_caller_opts_in() {
    let server = Server::start([status(503), status(200), Reply::Reset, status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(Http::new())).service(client());
    let mut keyed = post(&server.url("/orders"));
    keyed.headers_mut().insert(IDEMPOTENCY_KEY, "order-1".parse().unwrap());
    assert_eq!(service.oneshot(keyed).await.unwrap().status(), StatusCode::OK);

    let opted_in = Http::new().retry_non_idempotent();
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(opted_in)).service(client());
    assert_eq!(service.oneshot(post(&server.url("/orders"))).await.unwrap().status(), StatusCode::OK);

    let seen = server.seen();
    let summary: Vec<_> = seen.iter().map(|s| (s.method.as_str(), s.idempotency_key)).collect();
    assert_eq!(summary, [("POST", true), ("POST", true), ("POST", false), ("POST", false)]);
}

#[tokio::test]
async fn t2_every_attempt_sends_the_whole_request_again() {
    // The copy keeps the method, headers and body: the server sees the same request twice.
    let seen_bodies = Arc::new(Mutex::new(Vec::new()));
    let bodies = seen_bodies.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let bodies = bodies.clone();
            let code = if std::mem::take(&mut first) { 503 } else { 200 };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let bodies = bodies.clone();
                    async move {
                        let header = request.headers().get("x-trace").cloned();
                        let method = request.method().clone();
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        bodies.lock().unwrap().push((method, header, body));
                        Ok::<_, Infallible>(Response::builder().status(code).body(Full::new(Bytes::new())).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(2)).classify(Http::new())).service(client());
    let request = Request::builder()
        .method(Method::DELETE)
        .uri(format!("http://{addr}/items/7"))
        .header("x-trace", "abc")
        .body(Full::new(Bytes::from_static(b"reason=expired")))
        .unwrap();
    assert_eq!(service.oneshot(request).await.unwrap().status(), StatusCode::OK);
    let bodies = seen_bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[0].2, "reason=expired");
}

#[tokio::test]
async fn x2_a_slow_response_is_hedged_on_a_second_connection_and_not_waited_for() {
    let server = Server::start([Reply::Slow(Duration::from_secs(5)), status(200)]).await;
    let hedging = HedgePolicy::builder(3, Duration::from_millis(100)).build().unwrap();
    let service = ServiceBuilder::new().layer(HedgeLayer::new(hedging).classify(Http::new())).service(client());
    assert_send_static(&service.clone().oneshot(get(&server.url("/"))));
    let started = Instant::now();
    let response = service.oneshot(get(&server.url("/slow"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(100) && took < Duration::from_secs(2), "answered after {took:?}");
    let seen = server.seen();
    // The probe of `assert_send_static` was never polled: two requests, about 100 ms apart (the
    // delay runs from the first attempt's first pending poll, a little before the server reads it).
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(server.gaps()[0] >= Duration::from_millis(80), "{:?}", server.gaps());
}

#[tokio::test]
async fn x3_a_503_is_a_non_fatal_failure_that_starts_the_next_hedge_at_once_and_a_post_is_never_hedged() {
    let server = Server::start([status(503), status(200)]).await;
    let hedging = HedgePolicy::builder(2, Duration::from_secs(10)).build().unwrap();
    let service = ServiceBuilder::new().layer(HedgeLayer::new(hedging).classify(Http::new())).service(client());
    let started = Instant::now();
    assert_eq!(service.clone().oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(5), "the 503 did not wait out the 10 s delay");
    assert_eq!(server.seen().len(), 2);

    // A POST cannot be sent twice: one attempt, never hedged, however slow.
    let server = Server::start([Reply::Slow(Duration::from_millis(300)), status(200)]).await;
    let service = ServiceBuilder::new()
        .layer(
            HedgeLayer::new(HedgePolicy::builder(3, Duration::from_millis(20)).build().unwrap()).classify(Http::new()),
        )
        .service(client());
    let response = service.oneshot(post(&server.url("/orders"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 1, "never hedged");
}
