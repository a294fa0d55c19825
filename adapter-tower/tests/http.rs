//! The tower layers against a real hyper 1.x server on 127.0.0.1, called by a real hyper-util
//! client through the layers (T1–T3, H1–H5). Every test scripts the server's replies, one per
//! connection (the server closes each connection after one reply, the client pools none), and
//! checks what the server received, the delays between requests, and the outcome.
//!
//! `cargo test -p persevere-tower --test http`

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use persevere::{Backoff, BreakerPolicy, FailureClass, HedgePolicy, OutcomeKind, RatioBudgetPolicy, RetryPolicy};
use persevere_tokio::{Breaker, Budget, TokioRuntime};
use persevere_tower::{
    BreakerLayer, ByStatus, CallError, Gate, HedgeLayer, Http, IDEMPOTENCY_KEY, RetryErrors, RetryLayer, SentOnce,
};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

mod common;
use common::{Reply, Server, client, get, policy, post, status, status_with};

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
    // Its one attempt was all it had: the outcome says so, and the class is the 503's own.
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Throttled)));
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

    // Under a retry gated by the same breaker, the call is refused before it is sent (T4):
    // `Rejected` by the breaker, with its time left, and no attempt.
    let retrying = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(5)).classify(Http::new()).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker).classify(ByStatus))
        .service(client());
    let error = retrying.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!(
        (error.outcome(), error.refused_by(), error.stats().attempts),
        (OutcomeKind::Rejected, Some(Gate::Breaker), 0)
    );
    assert!(error.retry_after().is_some_and(|after| after > Duration::from_secs(29)), "{error:?}");
    assert!(error.error().is_none() && error.response().is_none(), "{error:?}");
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

#[tokio::test]
async fn h4_a_retry_layer_that_names_no_classifier_applies_http_semantics() {
    // No `.classify(..)`: a 503 is retried (H1), a POST is sent once (H3).
    let server = Server::start([status(503), status(200), status(503), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(client());
    assert_eq!(service.clone().oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    let error = service.oneshot(post(&server.url("/orders"))).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotIdempotent));
    let methods: Vec<_> = server.seen().into_iter().map(|seen| seen.method).collect();
    assert_eq!(methods, ["GET", "GET", "POST"]);

    // Another classifier chosen by name is used instead: `RetryErrors` retries errors only, so
    // the 503 stands and the POST's reset is retried.
    let server = Server::start([status(503), Reply::Reset, status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3)).classify(RetryErrors)).service(client());
    assert_eq!(service.clone().oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(service.oneshot(post(&server.url("/orders"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 3);

    // The hedge layer too: a slow POST is never hedged.
    let server = Server::start([Reply::Slow(Duration::from_millis(200)), status(200)]).await;
    let hedging = HedgePolicy::builder(3, Duration::from_millis(20)).build().unwrap();
    let service = ServiceBuilder::new().layer(HedgeLayer::new(hedging)).service(client());
    assert_eq!(service.oneshot(post(&server.url("/orders"))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(server.seen().len(), 1);
}

/// The 4xx (and 5xx) statuses H5 lets stand: the request itself is the problem, and waiting
/// does not change it.
const UNHEALABLE: [u16; 24] = [
    400, 401, 403, 404, 405, 406, 407, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421, 422, 426, 428, 431, 451, 501,
    505,
];

#[tokio::test]
async fn h5_client_errors_that_waiting_cannot_heal_are_not_retried() {
    for code in UNHEALABLE {
        // A `Retry-After` does not make them retryable (a 413 may carry one).
        let server = Server::start([status_with(code, "retry-after", "0"), status(200)]).await;
        let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(client());
        let response = service.oneshot(get(&server.url("/"))).await.unwrap();
        assert_eq!((response.status().as_u16(), server.seen().len()), (code, 1), "{code}");
    }
}

#[tokio::test]
async fn h5_408_425_and_429_heal_by_waiting_and_are_retried() {
    for code in [408, 425, 429] {
        let server = Server::start([status(code), status(200)]).await;
        let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(client());
        let response = service.oneshot(get(&server.url("/"))).await.unwrap();
        assert_eq!((code, response.status(), server.seen().len()), (code, StatusCode::OK, 2));
    }
}

#[tokio::test]
async fn h5_a_relative_uri_is_not_retried() {
    // hyper-util's client refuses a URI with no scheme and no authority: it has nowhere to go,
    // and never will.
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(4))).service(client());
    let started = Instant::now();
    let error = service.oneshot(get("/orders/1")).await.unwrap_err();
    assert_eq!(
        (error.outcome(), error.class(), error.stats().attempts),
        (OutcomeKind::Fatal, Some(FailureClass::Fatal), 1)
    );
    assert!(error.error().is_some(), "{error:?}");
    assert!(started.elapsed() < Duration::from_millis(20), "not slept: {:?}", started.elapsed());
}

#[tokio::test]
async fn h2_retry_after_zero_replaces_the_backoff_unless_a_floor_is_set() {
    // A 500 ms backoff, and a server that asks for no wait at all: the retry comes at once.
    let backoff = RetryPolicy::builder(Backoff::constant(Duration::from_millis(500)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    let server =
        Server::start([status_with(503, "retry-after", "0"), status_with(429, "retry-after", "0"), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(backoff)).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert!(server.gaps().iter().all(|gap| *gap < Duration::from_millis(100)), "{:?}", server.gaps());

    // With a floor, a shorter hint waits the floor.
    let server = Server::start([status_with(503, "retry-after", "0"), status(200)]).await;
    let floored = RetryLayer::new(backoff).classify(Http::new().min_retry_after(Duration::from_millis(200)));
    let service = ServiceBuilder::new().layer(floored).service(client());
    assert_eq!(service.oneshot(get(&server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert!(server.gaps()[0] >= Duration::from_millis(200), "{:?}", server.gaps());
}

#[tokio::test]
async fn t2_a_request_sent_once_ends_exhausted_with_its_own_class_also_when_it_times_out() {
    // A POST that outlives its attempt timeout: one attempt, never sent again.
    let slow = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build().unwrap())
        .max_attempts(3)
        .attempt_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let server = Server::start([Reply::Slow(Duration::from_secs(5)), status(200), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(slow)).service(client());
    let error = service.oneshot(post(&server.url("/orders"))).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotIdempotent));
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Timeout)));
    assert_eq!(error.stats().attempts, 1);
    assert!(error.to_string().starts_with("not retried: the request's method is not idempotent"), "{error}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.seen().len(), 1);
}
