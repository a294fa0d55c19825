//! reqwest's `Client`, a tower `Service` of its own, through the layers with the `reqwest`
//! feature (H6): the HTTP rules (H1–H5) on `reqwest::Request` and `reqwest::Response`, against
//! the scripted server on loopback. reqwest is built without TLS, and the client looks up no
//! system proxy.
//!
//! `cargo test -p persevere-tower --features reqwest --test reqwest`

use std::time::Duration;

use bytes::Bytes;
use persevere_tower::{Backoff, Http};
use persevere_tower::{
    Breaker, BreakerLayer, BreakerPolicy, ByStatus, FailureClass, IDEMPOTENCY_KEY, OutcomeKind, ReplayBody, RetryLayer,
    SentOnce,
};
use reqwest::{Client, Method, StatusCode, Url};
use tower::{ServiceBuilder, ServiceExt};

mod common;
use common::{Reply, Server, policy, status, status_with};

fn reqwest_client() -> Client {
    Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap()
}

fn request(method: Method, url: &str) -> reqwest::Request {
    reqwest::Request::new(method, Url::parse(url).unwrap())
}

#[tokio::test]
async fn h6_a_503_and_a_reset_connection_are_retried_through_reqwests_client() {
    let server = Server::start([status(503), Reply::Reset, status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(reqwest_client());
    let response = service.oneshot(request(Method::GET, &server.url("/"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.text().await.unwrap(), "scripted");
    assert_eq!(server.seen().len(), 3);
    assert!(server.gaps().iter().all(|gap| *gap >= Duration::from_millis(20)), "{:?}", server.gaps());
}

#[tokio::test]
async fn h6_retry_after_on_a_429_is_honoured_and_a_breaker_classifies_reqwests_responses() {
    let server = Server::start([status_with(429, "retry-after", "1"), status(200)]).await;
    let breaker = Breaker::new(
        BreakerPolicy::builder(Backoff::constant(Duration::from_millis(500)).build().unwrap())
            .consecutive_failures(1)
            .build()
            .unwrap(),
    );
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(2)))
        .layer(BreakerLayer::new(breaker.clone()).classify(ByStatus))
        .service(reqwest_client());
    assert_eq!(service.oneshot(request(Method::GET, &server.url("/"))).await.unwrap().status(), StatusCode::OK);
    assert!(server.gaps()[0] >= Duration::from_secs(1), "{:?}", server.gaps());
    // The 429 opened the breaker for 500 ms; the retry a second later was its probe, and closed it.
    assert_eq!(breaker.status(), persevere_tower::BreakerStatus::Closed);
}

#[tokio::test]
async fn h6_a_post_is_sent_once_unless_keyed_and_a_streamed_body_is_sent_once() {
    let server = Server::start([status(503), status(503), status(200), status(503), status(200)]).await;
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(reqwest_client());

    let mut post = request(Method::POST, &server.url("/orders"));
    *post.body_mut() = Some(reqwest::Body::from("{\"order\":1}"));
    let error = service.clone().oneshot(post).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotIdempotent));
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Throttled)));

    let mut keyed = request(Method::POST, &server.url("/orders"));
    keyed.headers_mut().insert(IDEMPOTENCY_KEY, "order-1".parse().unwrap());
    *keyed.body_mut() = Some(reqwest::Body::from("{\"order\":1}"));
    assert_eq!(service.clone().oneshot(keyed).await.unwrap().status(), StatusCode::OK);

    // A body made of a stream cannot be copied: the PUT is sent once, whole.
    let mut streamed = request(Method::PUT, &server.url("/orders/1"));
    *streamed.body_mut() = Some(reqwest::Body::wrap(http_body_util::Full::new(Bytes::from_static(b"streamed"))));
    let error = service.oneshot(streamed).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotClonable));

    let seen: Vec<_> = server.seen().into_iter().map(|seen| (seen.method, seen.body)).collect();
    let order = Bytes::from_static(b"{\"order\":1}");
    assert_eq!(
        seen,
        [
            ("POST".to_owned(), order.clone()),
            ("POST".to_owned(), order.clone()),
            ("POST".to_owned(), order),
            ("PUT".to_owned(), Bytes::from_static(b"streamed")),
        ]
    );
}

#[test]
fn h6_a_reqwest_body_is_copied_when_buffered_and_not_when_streamed() {
    let buffered = reqwest::Body::from("bytes");
    assert_eq!(buffered.try_clone().and_then(|copy| copy.as_bytes().map(<[u8]>::to_vec)), Some(b"bytes".to_vec()));
    assert!(reqwest::Body::wrap(String::from("streamed")).try_clone().is_none());
}

#[tokio::test]
async fn h5_a_url_reqwest_cannot_use_is_not_retried() {
    // A scheme reqwest does not speak: an invalid request (`is_builder`), the same every time.
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(4))).service(reqwest_client());
    let error = service.oneshot(request(Method::GET, "ftp://127.0.0.1/file")).await.unwrap_err();
    assert_eq!(
        (error.outcome(), error.class(), error.stats().attempts),
        (OutcomeKind::Fatal, Some(FailureClass::Fatal), 1)
    );
    assert!(error.error().is_some_and(reqwest::Error::is_builder), "{error:?}");
}

#[tokio::test]
async fn h5_a_redirect_loop_is_not_retried() {
    // The server redirects to itself more often than reqwest follows (10 times).
    let server = Server::start(std::iter::repeat_n(status_with(302, "location", "/loop"), 40)).await;
    let url = server.url("/loop");
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy(3))).service(reqwest_client());
    let error = service.oneshot(request(Method::GET, &url)).await.unwrap_err();
    assert!(error.error().is_some_and(reqwest::Error::is_redirect), "{error:?}");
    assert_eq!((error.outcome(), error.stats().attempts), (OutcomeKind::Fatal, 1));
    assert_eq!(server.seen().len(), 11, "one call: the request and its ten redirects");
}

fn served<S: tower::Service<reqwest::Request>>(_: &S) {}

#[tokio::test]
async fn h6_http_named_or_by_default_makes_a_service_of_reqwests_client() {
    served(&ServiceBuilder::new().layer(RetryLayer::new(policy(2))).service(reqwest_client()));
    let layer = RetryLayer::new(policy(2)).classify(Http::new().retry_non_idempotent());
    served(&ServiceBuilder::new().layer(layer).service(reqwest_client()));
}
