//! # persevere-tower
//!
//! persevere's retry, circuit breaker and retry budget as [tower] layers, over the one driving
//! loop of [`persevere_driver`] (T1), with HTTP semantics behind the `http` feature (H1–H3).
//!
//! - [`RetryLayer`]: each call is retried under a [`RetryPolicy`](persevere::RetryPolicy). A
//!   [`ResponseClassifier`] sees each request (may it be sent again?) and each whole result, so
//!   a 503 response is retried like a connection error (T2); [`Http`] is the HTTP one. A
//!   budget or a breaker given to [`gate`](RetryLayer::gate) may veto a retry (T3).
//! - [`HedgeLayer`]: each call is hedged under a [`HedgePolicy`](persevere::HedgePolicy): sent
//!   again to a clone of the service when it has not answered within a delay, the first
//!   success wins and the others are dropped (X1–X5); the gate is asked before each hedge.
//! - [`BreakerLayer`]: every call goes through a shared `Breaker`; while it is open, calls fail
//!   at once with its `retry_after` (T3).
//!
//! The order that works: the retry outside, the breaker inside, and the same breaker (then the
//! budget) as the retry's gate. Each attempt is then one call of the breaker, no retry is
//! scheduled into an open breaker, and no budget token is spent on a retry the breaker refuses.
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response};
//! use persevere::{Backoff, BreakerPolicy, RatioBudgetPolicy, RetryPolicy};
//! use persevere_tokio::{Breaker, Budget, TokioRuntime};
//! use persevere_tower::{BreakerLayer, ByStatus, Http, RetryLayer};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build()?)
//!     .max_attempts(3)
//!     .attempt_timeout(Duration::from_secs(2))
//!     .build()?;
//! let breaker = Breaker::new(
//!     BreakerPolicy::builder(Backoff::constant(Duration::from_secs(5)).build()?).consecutive_failures(5).build()?,
//! );
//! let budget = Budget::ratio(TokioRuntime::new(), RatioBudgetPolicy::builder(0.1).build()?);
//!
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy).classify(Http::new()).gate((breaker.clone(), budget)))
//!     .layer(BreakerLayer::new(breaker).classify(ByStatus))
//!     .service(service_fn(|request: Request<String>| async move {
//!         // A real client (hyper-util's, reqwest's) goes here.
//!         Ok::<_, std::io::Error>(Response::new(format!("{} {}", request.method(), request.uri())))
//!     }));
//!
//! let response = client.oneshot(Request::get("http://example.com/").body(String::new())?).await?;
//! assert_eq!(response.body(), "GET http://example.com/");
//! # Ok(()) }
//! ```
//!
//! `tests/http.rs` drives a real hyper server on loopback through these layers and a real
//! hyper-util client; `examples/http_client.rs` prints the timeline of such calls.
//!
//! [tower]: https://docs.rs/tower
#![deny(missing_docs)]

mod breaker;
mod call;
mod classify;
mod error;
mod hedge;
#[cfg(feature = "http")]
mod http;
mod policy;
mod retry;

pub use breaker::{BreakerFuture, BreakerLayer, BreakerService};
pub use classify::{ClassifyFn, ResponseClassifier, RetryErrors, SentOnce, classify_fn};
pub use error::{Last, RetryError};
pub use hedge::{HedgeLayer, HedgeResponseFuture, HedgeService};
#[cfg(feature = "http")]
pub use http::{ByStatus, Http, IDEMPOTENCY_KEY, ReplayBody};
pub use persevere_driver::{Breaker, BreakerEvent, CallError, RetryGate, Runtime};
pub use policy::SharedPolicy;
pub use retry::{ResponseFuture, Retry, RetryLayer};
