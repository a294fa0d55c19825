//! A hyper-util client behind persevere's tower layers, calling a flaky server on loopback, with
//! the timeline of what happened.
//!
//! `cargo run -p persevere-tower --example http_client`
//!
//! The server answers in turn: 503, a reset connection, 429 with `Retry-After: 1`, then 200 for
//! the first call; the second call is a POST that meets a 503 and is not retried (H3); the third
//! meets three failures in a row, the fourth failure in a row opens the breaker and the retry
//! ends as rejected; a last call is refused at once without being sent.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use persevere::{Backoff, BreakerPolicy, RetryPolicy};
use persevere_tokio::Breaker;
use persevere_tower::{BreakerLayer, ByStatus, Http, RetryLayer};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

/// The server's replies, one per connection: a status (0 resets the connection) and an
/// optional `Retry-After`.
const SCRIPT: [(u16, Option<&str>); 8] =
    [(503, None), (0, None), (429, Some("1")), (200, None), (503, None), (500, None), (503, None), (500, None)];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let say = {
        let log = log.clone();
        move |line: String| {
            let line = format!("{:>7.3}s  {line}", start.elapsed().as_secs_f64());
            println!("{line}");
            log.lock().unwrap().push(line);
        }
    };

    // The flaky server.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let served = Arc::new(AtomicUsize::new(0));
    let server_say = say.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let n = served.fetch_add(1, Ordering::Relaxed);
            let (code, retry_after) = SCRIPT.get(n).copied().unwrap_or((200, None));
            if code == 0 {
                server_say(format!("server: request {} -> connection reset", n + 1));
                // A zero linger resets the connection on drop and never blocks (what the deprecation warns of).
                #[allow(deprecated)]
                stream.set_linger(Some(Duration::ZERO)).unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            let say = server_say.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let hint = retry_after.map(|s| format!(", Retry-After: {s}")).unwrap_or_default();
                    say(format!("server: request {} {} {} -> {code}{hint}", n + 1, request.method(), request.uri()));
                    let mut response = Response::builder().status(code);
                    if let Some(seconds) = retry_after {
                        response = response.header("retry-after", seconds);
                    }
                    std::future::ready(Ok::<_, Infallible>(response.body(Full::new(Bytes::new())).unwrap()))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    // The client: retry (gated by the breaker) outside, the breaker inside.
    let policy = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build()?)
        .max_attempts(5)
        .attempt_timeout(Duration::from_secs(2))
        .build()?;
    let breaker = Breaker::new(
        BreakerPolicy::builder(Backoff::constant(Duration::from_secs(10)).build()?).consecutive_failures(4).build()?,
    );
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http::<Full<Bytes>>();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policy).classify(Http::new()).gate(breaker.clone()))
        .layer(BreakerLayer::new(breaker.clone()).classify(ByStatus))
        .service(client);

    let url = format!("http://{addr}");
    say("client: GET /report".into());
    let response = service.clone().oneshot(Request::get(format!("{url}/report")).body(Full::default())?).await?;
    say(format!("client: GET /report -> {}", response.status()));

    say("client: POST /orders".into());
    let post = Request::post(format!("{url}/orders")).body(Full::new(Bytes::from_static(b"{}")))?;
    match service.clone().oneshot(post).await {
        Ok(response) => say(format!("client: POST /orders -> {}", response.status())),
        Err(error) => say(format!("client: POST /orders -> error: {error}")),
    }

    say("client: GET /health".into());
    match service.clone().oneshot(Request::get(format!("{url}/health")).body(Full::default())?).await {
        Ok(response) => say(format!("client: GET /health -> {}", response.status())),
        Err(error) => say(format!("client: GET /health -> error: {error}")),
    }
    say(format!("breaker: {:?}", breaker.status()));

    say("client: GET /report".into());
    match service.oneshot(Request::get(format!("{url}/report")).body(Full::default())?).await {
        Ok(response) => say(format!("client: GET /report -> {}", response.status())),
        Err(error) => say(format!("client: GET /report -> error: {error}")),
    }

    // What CI checks: the first call was retried through a 503, a reset and a 429 whose
    // Retry-After was honoured; the POST was sent once; the breaker opened and refused the last.
    let log = log.lock().unwrap().join("\n");
    assert!(log.contains("GET /report -> 200 OK"), "{log}");
    assert!(log.contains("not retried: the request's method is not idempotent"), "{log}");
    assert!(
        log.contains("GET /health -> error: gave up after 3 attempts: the circuit breaker refused the retry"),
        "{log}"
    );
    assert!(log.contains("GET /report -> error: not sent: the circuit breaker refused the call (retry after"), "{log}");
    assert_eq!(log.matches("server: request").count(), 8, "{log}");
    Ok(())
}
