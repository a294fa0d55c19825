//! # persevere-tower
//!
//! persevere's retry, circuit breaker and retry budget as [tower] layers, over the one driving
//! loop of [`persevere_driver`] (T1), with HTTP semantics behind the `http` feature (H1–H5) and
//! for reqwest's `Client` behind the `reqwest` feature (H6).
//!
//! - [`RetryLayer`]: each call is retried under a [`RetryPolicy`]. A classifier sees each
//!   request ([`ReplayRequest`]: may it be sent again?) and each whole result
//!   ([`ResponseClassifier`]), so a 503 response is retried like a connection error (T2): it
//!   is [`Http`] unless another is chosen by name (H4). A budget or a breaker given to
//!   [`gate`](RetryLayer::gate) may refuse the call or veto a retry (T3, T4).
//! - [`BufferBodyLayer`]: buffers request bodies up to a limit, so that bodies of other
//!   crates' types (axum's, hyper's `Incoming`, a stream) can be sent again.
//! - [`HedgeLayer`]: each call is hedged under a [`HedgePolicy`]: sent
//!   again to a clone of the service when it has not answered within a delay, the first
//!   success wins and the others are dropped (X1–X5); the gate is asked before each hedge.
//! - [`BreakerLayer`]: every call goes through a shared `Breaker`; while it is open, calls fail
//!   at once with its `retry_after` (T3).
//! - [`LoadShedLayer`]: every call takes a place in a shared adaptive `Limiter` (AIMD, Vegas,
//!   Gradient2); beyond the limit it learned, calls fail at once with [`ShedError::Shed`] and
//!   its `retry_after`, so the calls admitted keep their latency under overload.
//!
//! The order that works: the retry outside, the breaker inside, and the same breaker (then the
//! budget) as the retry's gate. Each attempt is then one call of the breaker, no retry is
//! scheduled into an open breaker, no budget token is spent on a retry the breaker refuses,
//! and a call the open breaker refuses is refused before it is sent, naming the breaker and
//! when to come back ([`RetryError::refused_by`], [`RetryError::retry_after`]).
//!
//! # One dependency
//!
//! This crate re-exports what a tower stack needs: the policies and outcomes of the core
//! ([`RetryPolicy`], [`Backoff`], [`BreakerPolicy`], [`OutcomeKind`], …) and, with the `tokio`
//! feature (on by default), [`Breaker`] and [`Budget`] on tokio's clock, which need no type
//! annotation. For another runtime, [`any_runtime`] has them generic over a [`Runtime`].
//!
//! ```toml
//! [dependencies]
//! persevere-tower = "0.1"
//! tower = { version = "0.5", features = ["util", "timeout"] }
//! ```
//!
//! Its errors ([`RetryError`], [`CallError`]) are `std::error::Error + Send + Sync + 'static`
//! whenever the inner error is `Debug + Display + Send + Sync + 'static`, tower's `BoxError`
//! included, so they stack with tower's own layers, a `TimeoutLayer` inside (per attempt) and
//! outside (a deadline), and `?` turns them into a `BoxError` (T4).
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response};
//! use persevere_tower::{
//!     Backoff, Breaker, BreakerLayer, BreakerPolicy, Budget, ByStatus, RatioBudgetPolicy, RetryLayer, RetryPolicy,
//!     TokioRuntime,
//! };
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
//! // Over `http::Request`s the retry layer applies HTTP semantics (`Http`) unless told otherwise.
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy).gate((breaker.clone(), budget)))
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
#[cfg(feature = "http")]
mod buffer;
mod call;
mod classify;
mod error;
mod hedge;
mod http;
mod policy;
#[cfg(feature = "http")]
mod replay;
#[cfg(feature = "reqwest")]
mod reqwest;
mod retry;
mod shed;

pub use breaker::{BreakerFuture, BreakerLayer, BreakerService};
#[cfg(feature = "http")]
pub use buffer::{BufferBody, BufferBodyLayer, BufferFuture, Buffered};
pub use classify::{ClassifyFn, ReplayRequest, ResponseClassifier, RetryErrors, SentOnce, classify_fn};
pub use error::{Last, RetryError};
pub use hedge::{HedgeLayer, HedgeResponseFuture, HedgeService};
pub use http::Http;
#[cfg(feature = "http")]
pub use http::{ByStatus, IDEMPOTENCY_KEY};
pub use persevere::{
    Backoff, BreakerPolicy, BreakerStatus, CallOutcome, Completion, ConcurrencyBudgetPolicy, FailureClass, FailureKind,
    HedgePolicy, Hint, Jitter, LimitAlgorithm, LimiterPolicy, OutcomeKind, PolicyError, RatioBudgetPolicy, RetryPolicy,
    Stats, TokenBucketPolicy,
};
pub use persevere_driver::{
    BreakerEvent, ByCompletion, ByResult, CallClassifier, CallError, CompletionClassifier, Gate, Refusal, RetryGate,
    Runtime, ShedError,
};
#[cfg(feature = "tokio")]
pub use persevere_tokio::TokioRuntime;
#[cfg(feature = "http")]
pub use replay::ReplayBody;

/// A circuit breaker on tokio's clock, shared by clones: give it to a [`BreakerLayer`] and to
/// the retry layer's [`gate`](RetryLayer::gate). `Breaker::new(policy)` needs no annotation.
#[cfg(feature = "tokio")]
pub type Breaker = persevere_driver::Breaker<TokioRuntime>;

/// A retry budget on tokio's clock, shared by clones: a [`gate`](RetryLayer::gate) of the
/// retry layer.
#[cfg(feature = "tokio")]
pub type Budget = persevere_driver::Budget<TokioRuntime>;

/// An adaptive concurrency limit on tokio's clock, shared by clones: give it to a
/// [`LoadShedLayer`] (and, to refuse retries while it is full, to the retry layer's
/// [`gate`](RetryLayer::gate)). `Limiter::new(LimiterPolicy::vegas())` needs no annotation.
#[cfg(feature = "tokio")]
pub type Limiter = persevere_driver::Limiter<TokioRuntime>;

/// The breaker, the budget and the limiter on any [`Runtime`] (`Breaker<Rt>`, `Budget<Rt>`,
/// `Limiter<Rt>`), for a stack that does not run on tokio. With the `tokio` feature, the crate
/// root's [`Breaker`], [`Budget`] and [`Limiter`] are these on tokio's clock.
pub mod any_runtime {
    pub use persevere_driver::{Breaker, Budget, Limiter};
}
pub use policy::SharedPolicy;
pub use retry::{ResponseFuture, Retry, RetryLayer};
pub use shed::{LoadShedFuture, LoadShedLayer, LoadShedService};
