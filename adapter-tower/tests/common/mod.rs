//! A scripted HTTP/1.1 server on loopback and a hyper-util client, shared by the tests that
//! drive the layers over real connections. One reply per connection, taken from the script in
//! order (200 once it runs out); the server closes each connection after its reply and the
//! client pools none, so every request opens its own.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use persevere::{Backoff, RetryPolicy};
use persevere_tower::IDEMPOTENCY_KEY;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// What the server does with the next connection.
#[derive(Clone, Debug)]
pub(crate) enum Reply {
    /// Responds with this status and these headers.
    Status(u16, Vec<(&'static str, String)>),
    /// Responds 200 after this long.
    Slow(Duration),
    /// Reads the request, then resets the connection without a response.
    Reset,
}

pub(crate) fn status(code: u16) -> Reply {
    Reply::Status(code, Vec::new())
}

pub(crate) fn status_with(code: u16, header: &'static str, value: impl Into<String>) -> Reply {
    Reply::Status(code, vec![(header, value.into())])
}

/// A request as the server received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) idempotency_key: bool,
    pub(crate) at: Instant,
    /// The request's body (empty for a connection reset after the head).
    pub(crate) body: Bytes,
}

/// A scripted HTTP/1.1 server on loopback: one reply per connection, taken from the script in
/// order (200 once it runs out).
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub(crate) async fn start(script: impl IntoIterator<Item = Reply>) -> Server {
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

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The gaps between the requests received.
    pub(crate) fn gaps(&self) -> Vec<Duration> {
        self.seen().windows(2).map(|w| w[1].at - w[0].at).collect()
    }

    pub(crate) fn replies_left(&self) -> usize {
        self.script.lock().unwrap().len()
    }
}

pub(crate) async fn serve(mut stream: tokio::net::TcpStream, reply: Reply, seen: Arc<Mutex<Vec<Seen>>>) {
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
            body: Bytes::new(),
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
            let at = Instant::now();
            let method = request.method().to_string();
            let idempotency_key = request.headers().contains_key(IDEMPOTENCY_KEY);
            let body = request.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
            seen.lock().unwrap().push(Seen { method, idempotency_key, at, body });
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
pub(crate) fn client<B>() -> Client<HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http()
}

pub(crate) fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(Duration::from_millis(20)).build().unwrap())
        .max_attempts(attempts)
        .build()
        .unwrap()
}

pub(crate) fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

pub(crate) fn post(url: &str) -> Request<Full<Bytes>> {
    Request::post(url).body(Full::new(Bytes::from_static(b"{\"order\":1}"))).unwrap()
}
