//! Bodies of other crates' types (axum's, hyper's `Incoming`) retried through
//! `BufferBodyLayer` (H4): buffered up to a limit and sent whole on every attempt; past the
//! limit, or when reading them fails, sent once and whole. Against a real server on loopback.
//!
//! `cargo test -p persevere-tower --test bodies`

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use persevere_tower::{BufferBodyLayer, Buffered, FailureClass, OutcomeKind, RetryLayer, SentOnce};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt, service_fn};

mod common;
use common::{Server, client, policy, status};

/// A body that streams its frames one per poll (what a request body read from a socket does),
/// then fails if told to.
struct Chunks {
    frames: VecDeque<Frame<Bytes>>,
    fail_at_end: bool,
}

impl Chunks {
    fn new(parts: &[&'static str]) -> Chunks {
        let frames = parts.iter().map(|part| Frame::data(Bytes::from_static(part.as_bytes()))).collect();
        Chunks { frames, fail_at_end: false }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if self.fail_at_end => {
                self.fail_at_end = false;
                Poll::Ready(Some(Err(std::io::Error::other("the upload broke off"))))
            }
            None => Poll::Ready(None),
        }
    }
}

fn axum_request(url: &str, parts: &[&'static str]) -> Request<axum_core::body::Body> {
    Request::put(url).body(axum_core::body::Body::new(Chunks::new(parts))).unwrap()
}

#[tokio::test]
async fn h4_an_axum_body_is_buffered_and_sent_whole_on_every_attempt() {
    let server = Server::start([status(503), status(502), status(200)]).await;
    let service =
        ServiceBuilder::new().layer(BufferBodyLayer::new(1024)).layer(RetryLayer::new(policy(3))).service(client());
    let response =
        service.oneshot(axum_request(&server.url("/upload"), &["first ", "second ", "third"])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bodies: Vec<_> = server.seen().into_iter().map(|seen| seen.body).collect();
    assert_eq!(bodies, ["first second third"; 3], "every attempt sends the whole body");
}

#[tokio::test]
async fn h4_a_body_longer_than_the_limit_is_sent_once_and_whole() {
    let server = Server::start([status(503), status(200)]).await;
    let service =
        ServiceBuilder::new().layer(BufferBodyLayer::new(8)).layer(RetryLayer::new(policy(3))).service(client());
    let error =
        service.oneshot(axum_request(&server.url("/upload"), &["twelve bytes", " and more"])).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotClonable));
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Throttled)));
    assert_eq!(error.response().map(|response| response.status()), Some(StatusCode::SERVICE_UNAVAILABLE));
    let bodies: Vec<_> = server.seen().into_iter().map(|seen| seen.body).collect();
    assert_eq!(bodies, ["twelve bytes and more"], "sent once, what was read and then the rest");

    // A body whose size says it is too long is sent once without being read first.
    let server = Server::start([status(503), status(200)]).await;
    let service =
        ServiceBuilder::new().layer(BufferBodyLayer::new(8)).layer(RetryLayer::new(policy(3))).service(client());
    let long =
        Request::put(server.url("/upload")).body(Full::new(Bytes::from_static(b"far too long")).boxed()).unwrap();
    let error = service.oneshot(long).await.unwrap_err();
    assert_eq!(error.sent_once(), Some(SentOnce::NotClonable));
    assert_eq!(server.seen().into_iter().map(|seen| seen.body).collect::<Vec<_>>(), ["far too long"]);
}

#[tokio::test]
async fn h4_trailers_are_kept_and_a_body_that_fails_while_read_fails_when_sent() {
    // The inner service reads what it is given: the data, the trailers, or the body's error.
    let inner = service_fn(|request: Request<Buffered<Chunks>>| async move {
        let whole = request.body().is_whole();
        let collected = request.into_body().collect().await?;
        let trailer = collected.trailers().and_then(|t| t.get("x-checksum")).map(|v| v.to_str().unwrap().to_owned());
        Ok::<_, std::io::Error>(Response::new((whole, collected.to_bytes(), trailer)))
    });
    let layer = BufferBodyLayer::new(1024);

    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    let mut body = Chunks::new(&["data"]);
    body.frames.push_back(Frame::trailers(trailers));
    let service = ServiceBuilder::new().layer(layer).service(inner);
    let response = service.oneshot(Request::new(body)).await.unwrap();
    assert_eq!(response.into_body(), (true, Bytes::from_static(b"data"), Some("abc".to_owned())));

    let mut body = Chunks::new(&["half"]);
    body.fail_at_end = true;
    let service = ServiceBuilder::new().layer(layer).service(inner);
    let error = service.oneshot(Request::new(body)).await.unwrap_err();
    assert_eq!(error.to_string(), "the upload broke off");
}

/// A proxy on loopback: each request's `Incoming` body goes upstream through the buffer and
/// the retry layer, and the upstream's status comes back.
async fn proxy(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream_client = ServiceBuilder::new()
        .layer(BufferBodyLayer::new(64 * 1024))
        .layer(RetryLayer::new(policy(3)))
        .service(client::<Buffered<hyper::body::Incoming>>());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (upstream, upstream_client) = (upstream.clone(), upstream_client.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (upstream, upstream_client) = (upstream.clone(), upstream_client.clone());
                    async move {
                        let (mut parts, body) = request.into_parts();
                        parts.uri = upstream.parse().unwrap();
                        let status = match upstream_client.oneshot(Request::from_parts(parts, body)).await {
                            Ok(response) => response.status(),
                            Err(error) => error.response().map_or(StatusCode::BAD_GATEWAY, |r| r.status()),
                        };
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test]
async fn h4_a_proxy_retries_the_incoming_body_it_received() {
    let upstream = Server::start([status(503), status(200)]).await;
    let proxy = proxy(upstream.url("/orders/1")).await;
    let request = Request::put(proxy).body(Full::new(Bytes::from_static(b"{\"order\":1}"))).unwrap();
    let response = client::<Full<Bytes>>().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bodies: Vec<_> = upstream.seen().into_iter().map(|seen| seen.body).collect();
    assert_eq!(bodies, ["{\"order\":1}"; 2]);
}
