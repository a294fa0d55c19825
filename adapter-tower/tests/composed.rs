//! The layers stacked the way tower users stack them (T4): tower's `TimeoutLayer` inside the
//! retry (per attempt) and outside it (a deadline), the breaker inside, and `?` into a
//! `BoxError`; refusals that name their gate. Everything persevere comes from
//! `persevere_tower` alone, with no type annotation.
//!
//! `cargo test -p persevere-tower --test composed`

use std::error::Error;
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use hyper::body::Incoming;
use persevere_tower::{
    Backoff, Breaker, BreakerLayer, BreakerPolicy, Budget, ByStatus, CallError, FailureClass, Gate, HedgeLayer,
    HedgePolicy, OutcomeKind, RatioBudgetPolicy, RetryError, RetryLayer, RetryPolicy, TokioRuntime,
};
use tower::timeout::TimeoutLayer;
use tower::timeout::error::Elapsed;
use tower::{BoxError, ServiceBuilder, ServiceExt};

mod common;
use common::{Reply, Server, client, get, status};

fn retries(attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(Duration::from_millis(20)).build().unwrap())
        .max_attempts(attempts)
        .build()
        .unwrap()
}

/// A breaker that opens for 30 s after `failures` failures in a row.
fn breaker(failures: u32) -> Breaker {
    let open_for = Backoff::constant(Duration::from_secs(30)).build().unwrap();
    Breaker::new(BreakerPolicy::builder(open_for).consecutive_failures(failures).build().unwrap())
}

fn is_error<T: Error + Send + Sync + 'static>() {}

#[test]
fn t4_the_layer_errors_are_errors_that_box_whenever_the_inner_error_does() {
    is_error::<RetryError<Response<Incoming>, BoxError>>();
    is_error::<RetryError<Response<Incoming>, CallError<BoxError>>>();
    is_error::<RetryError<Response<Incoming>, hyper_util::client::legacy::Error>>();
    is_error::<CallError<BoxError>>();
    is_error::<CallError<hyper_util::client::legacy::Error>>();
}

/// The stack of the issue that found E0277 and E0599: a deadline outside the retry, a timeout
/// per attempt inside it, then the breaker and a real client.
async fn get_status(server: &Server, breaker: &Breaker, deadline: Duration) -> Result<StatusCode, BoxError> {
    let service = ServiceBuilder::new()
        .layer(TimeoutLayer::new(deadline))
        .layer(RetryLayer::new(retries(3)).gate(breaker.clone()))
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .layer(BreakerLayer::new(breaker.clone()).classify(ByStatus))
        .service(client());
    let response = service.oneshot(get(&server.url("/"))).await?;
    Ok(response.status())
}

#[tokio::test]
async fn t4_timeouts_inside_and_outside_the_retry_and_the_breaker_inside_compose_with_question_marks() {
    // The first attempt outlives its 200 ms; the retry answers.
    let server = Server::start([Reply::Slow(Duration::from_secs(5)), status(200)]).await;
    let breaker = breaker(5);
    assert_eq!(get_status(&server, &breaker, Duration::from_secs(5)).await.unwrap(), StatusCode::OK);
    assert_eq!(server.seen().len(), 2);

    // Every attempt times out: the retry gives up, and its error, boxed by `?`, has the last
    // attempt's timeout as its source.
    let server = Server::start(vec![Reply::Slow(Duration::from_secs(5)); 3]).await;
    let error = get_status(&server, &breaker, Duration::from_secs(5)).await.unwrap_err();
    let retry = error.downcast_ref::<RetryError<Response<Incoming>, BoxError>>().expect("the retry's error");
    assert_eq!((retry.outcome(), retry.stats().attempts), (OutcomeKind::Exhausted, 3));
    assert!(error.source().is_some_and(|source| source.is::<Elapsed>()), "{error:?}");

    // The deadline outside ends the whole call first.
    let server = Server::start(vec![Reply::Slow(Duration::from_secs(5)); 3]).await;
    let started = Instant::now();
    let error = get_status(&server, &breaker, Duration::from_millis(300)).await.unwrap_err();
    assert!(error.is::<Elapsed>(), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn t4_a_timeout_inside_the_breaker_boxes_too() {
    // The breaker outside the per-attempt timeout: the retry's inner error is a
    // `CallError<BoxError>`.
    let server = Server::start([Reply::Slow(Duration::from_secs(5)), status(200)]).await;
    let breaker = breaker(5);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(retries(3)).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker).classify(ByStatus))
        .layer(TimeoutLayer::new(Duration::from_millis(200)))
        .service(client());
    let call = async move { Ok::<_, BoxError>(service.oneshot(get(&server.url("/"))).await?.status()) };
    assert_eq!(call.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn t4_a_call_an_open_breaker_refuses_is_not_sent_counts_no_attempt_and_names_the_breaker() {
    let server = Server::start([status(200)]).await;
    let breaker = breaker(1);
    breaker.open().unwrap();
    let error = get_status(&server, &breaker, Duration::from_secs(5)).await.unwrap_err();
    let retry = error.downcast_ref::<RetryError<Response<Incoming>, BoxError>>().expect("the retry's error");
    assert_eq!(retry.outcome(), OutcomeKind::Rejected);
    assert_eq!((retry.refused_by(), retry.stats().attempts, retry.class()), (Some(Gate::Breaker), 0, None));
    let after = retry.retry_after().expect("the breaker's time left");
    assert!(after > Duration::from_secs(29) && after <= Duration::from_secs(30), "{after:?}");
    assert!(error.to_string().starts_with("not sent: the circuit breaker refused the call (retry after"), "{error}");
    assert_eq!(server.seen().len(), 0, "nothing reached the server");

    // The hedge layer refuses it alike.
    let hedged = ServiceBuilder::new()
        .layer(HedgeLayer::new(HedgePolicy::builder(2, Duration::from_millis(50)).build().unwrap()).gate(breaker))
        .service(client());
    let error = hedged.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!((error.refused_by(), error.stats().attempts), (Some(Gate::Breaker), 0));
    assert_eq!(server.seen().len(), 0);
}

#[tokio::test]
async fn t4_a_retry_refused_after_a_503_names_the_breaker_and_its_wait() {
    // One failure opens the breaker: the 503 is kept, the retry is refused with the breaker's wait.
    let server = Server::start([status(503), status(200)]).await;
    let breaker = breaker(1);
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(retries(3)).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker).classify(ByStatus))
        .service(client());
    let error = service.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!((error.outcome(), error.refused_by()), (OutcomeKind::Rejected, Some(Gate::Breaker)));
    assert_eq!((error.stats().attempts, error.class()), (1, Some(FailureClass::Throttled)));
    assert!(error.retry_after().is_some_and(|after| after > Duration::from_secs(29)), "{error:?}");
    assert_eq!(error.response().map(|response| response.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert!(error.to_string().starts_with("gave up after 1 attempt: the circuit breaker refused the retry"), "{error}");
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn t4_a_retry_refused_by_a_budget_names_the_budget() {
    let server = Server::start([status(503), status(200)]).await;
    // No floor: one request earns a tenth of a retry.
    let budget =
        Budget::ratio(TokioRuntime::new(), RatioBudgetPolicy::builder(0.1).min_retries_per_sec(0).build().unwrap());
    let breaker = breaker(5);
    let service = ServiceBuilder::new().layer(RetryLayer::new(retries(3)).gate((breaker, budget))).service(client());
    let error = service.oneshot(get(&server.url("/"))).await.unwrap_err();
    assert_eq!(
        (error.outcome(), error.refused_by(), error.retry_after()),
        (OutcomeKind::Rejected, Some(Gate::Budget), None)
    );
    assert_eq!(error.stats().attempts, 1);
    assert!(error.to_string().starts_with("gave up after 1 attempt: the retry budget refused the retry"), "{error}");
}
