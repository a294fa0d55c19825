//! The retry layer: each call is one run of the driver's retry loop (T1), whose attempts are
//! calls of the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use persevere::{FailureKind, Hint, RetryPolicy};
use persevere_driver::{Classifier, Operation, Retried, RetryGate, Runtime};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::call::Call;
use crate::classify::{ResponseClassifier, RetryErrors, SentOnce};
use crate::error::{Failed, Last, RetryError};

/// Retries the calls of the service it wraps under a [`RetryPolicy`] (T1): a [`Layer`] whose
/// services run each call through persevere's one driving loop.
///
/// A [`ResponseClassifier`] decides which results are failures (a 503 can be one, T2) and
/// whether a request may be sent again; a [`RetryGate`] (a `Budget`, a `Breaker`, or a tuple
/// of them) may veto each retry, which then ends with `Rejected` (T3). Cheap to clone: the
/// policy is shared.
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, RetryPolicy};
/// use persevere_tower::RetryLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build()?).max_attempts(3).build()?;
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let counted = calls.clone();
/// let service = ServiceBuilder::new().layer(RetryLayer::new(policy)).service(service_fn(move |name: &'static str| {
///     let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
///     async move { if n < 3 { Err("busy") } else { Ok(format!("hello {name}")) } }
/// }));
/// assert_eq!(service.oneshot("world").await.unwrap(), "hello world");
/// assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 3);
/// # Ok(()) }
/// ```
pub struct RetryLayer<Rt, C = RetryErrors, G = ()> {
    runtime: Rt,
    policy: Arc<RetryPolicy>,
    classifier: C,
    gate: G,
}

#[cfg(feature = "tokio")]
impl RetryLayer<persevere_tokio::TokioRuntime> {
    /// Retries under `policy` on tokio's clock and timers, every error retryable (see
    /// [`classify`](Self::classify) and, for HTTP, [`Http`](crate::Http)).
    pub fn new(policy: RetryPolicy) -> Self {
        RetryLayer::with_runtime(persevere_tokio::TokioRuntime::new(), policy)
    }
}

impl<Rt> RetryLayer<Rt> {
    /// Retries under `policy` on `runtime`'s clock and timers (any executor's
    /// [`Runtime`]), every error retryable.
    pub fn with_runtime(runtime: Rt, policy: RetryPolicy) -> Self {
        RetryLayer { runtime, policy: Arc::new(policy), classifier: RetryErrors, gate: () }
    }
}

impl<Rt, C, G> RetryLayer<Rt, C, G> {
    /// Classifies requests and results with `classifier` ([`RetryErrors`] by default).
    pub fn classify<C2>(self, classifier: C2) -> RetryLayer<Rt, C2, G> {
        RetryLayer { runtime: self.runtime, policy: self.policy, classifier, gate: self.gate }
    }

    /// Asks `gate` before each retry (a `Budget`, a `Breaker`, or a tuple of them in the order
    /// they are asked); a refusal ends the call with `Rejected` (T3).
    pub fn gate<G2: RetryGate>(self, gate: G2) -> RetryLayer<Rt, C, G2> {
        RetryLayer { runtime: self.runtime, policy: self.policy, classifier: self.classifier, gate }
    }
}

impl<Rt: Clone, C: Clone, G: Clone> Clone for RetryLayer<Rt, C, G> {
    fn clone(&self) -> Self {
        RetryLayer {
            runtime: self.runtime.clone(),
            policy: self.policy.clone(),
            classifier: self.classifier.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<Rt, C: fmt::Debug, G> fmt::Debug for RetryLayer<Rt, C, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("policy", &self.policy)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

impl<S, Rt: Clone, C: Clone, G: Clone> Layer<S> for RetryLayer<Rt, C, G> {
    type Service = Retry<S, Rt, C, G>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry { inner, layer: self.clone() }
    }
}

/// A service whose calls are retried: made by [`RetryLayer`]. `Clone` when the inner service
/// is; its futures are `Send` and `'static` when the inner service's, the request and the
/// runtime's are.
pub struct Retry<S, Rt, C = RetryErrors, G = ()> {
    inner: S,
    layer: RetryLayer<Rt, C, G>,
}

impl<S: Clone, Rt: Clone, C: Clone, G: Clone> Clone for Retry<S, Rt, C, G> {
    fn clone(&self) -> Self {
        Retry { inner: self.inner.clone(), layer: self.layer.clone() }
    }
}

impl<S: fmt::Debug, Rt, C: fmt::Debug, G> fmt::Debug for Retry<S, Rt, C, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry").field("inner", &self.inner).field("layer", &self.layer).finish()
    }
}

impl<S, Req, Rt, C, G> Service<Req> for Retry<S, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime + Clone,
    C: ResponseClassifier<Req, S::Response, S::Error>,
    G: RetryGate + Clone,
{
    type Response = S::Response;
    type Error = RetryError<S::Response, S::Error>;
    type Future = ResponseFuture<S, Req, Rt, C, G>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RetryError::not_ready)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let mut classifier = self.layer.classifier.clone();
        let (template, sent_once) = match classifier.clone_request(&request) {
            Ok(copy) => (Some(copy), None),
            Err(why) => (None, Some(why)),
        };
        // The first attempt goes to the service that said it is ready; retries go to clones,
        // each asked whether it is ready first.
        let first = self.inner.call(request);
        let attempts = Attempts { service: self.inner.clone(), first: Some(first), template, classifier };
        let retry = persevere_driver::retry(self.layer.runtime.clone(), self.layer.policy.clone(), attempts)
            .classify_with(ByKind)
            .gate(self.layer.gate.clone());
        ResponseFuture { retry, sent_once }
    }
}

/// The attempts of one call: the operation the driving loop retries.
struct Attempts<S: Service<Req>, Req, C> {
    /// A clone of the inner service, for the retries.
    service: S,
    /// The first attempt, already called.
    first: Option<S::Future>,
    /// The copy retries are made from; `None` once the request cannot be sent again.
    template: Option<Req>,
    classifier: C,
}

impl<S, Req, C> Operation for Attempts<S, Req, C>
where
    S: Service<Req> + Clone,
    C: ResponseClassifier<Req, S::Response, S::Error>,
{
    type Future = Attempt<S, Req, C>;

    fn attempt(&mut self) -> Self::Future {
        let classifier = self.classifier.clone();
        if let Some(future) = self.first.take() {
            let last = self.template.is_none();
            return Attempt { call: Call::Running { future }, classifier, last };
        }
        // The loop asks for a retry only after a failure it may retry, which a last send never is.
        let Some(template) = &self.template else { unreachable!("a request sent once is not retried") };
        let (request, last) = match self.classifier.clone_request(template) {
            Ok(copy) => (copy, false),
            Err(_) => (self.template.take().unwrap_or_else(|| unreachable!()), true),
        };
        Attempt { call: Call::when_ready(self.service.clone(), request), classifier, last }
    }
}

pin_project! {
    /// One attempt: the inner call, its result classified. `last`: the request cannot be sent
    /// again, so a failure is final.
    struct Attempt<S, Req, C>
    where
        S: Service<Req>,
    {
        #[pin]
        call: Call<S, Req>,
        classifier: C,
        last: bool,
    }
}

impl<S, Req, C> Future for Attempt<S, Req, C>
where
    S: Service<Req>,
    C: ResponseClassifier<Req, S::Response, S::Error>,
{
    type Output = Result<S::Response, Failed<S::Response, S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.call.poll(cx));
        let kind = match this.classifier.classify(&result) {
            None if result.is_ok() => return Poll::Ready(result.map_err(|_| unreachable!())),
            None => FailureKind::Fatal,
            Some(_) if *this.last => FailureKind::Hinted(Hint::DoNotRetry),
            Some(kind) => kind,
        };
        let last = match result {
            Ok(response) => Last::Response(response),
            Err(error) => Last::Error(error),
        };
        Poll::Ready(Err(Failed { kind, last }))
    }
}

/// The driving loop's classifier: the kind the attempt already decided.
struct ByKind;

impl<Res, E> Classifier<Failed<Res, E>> for ByKind {
    #[inline]
    fn classify(&mut self, failed: &Failed<Res, E>) -> FailureKind {
        failed.kind
    }
}

/// The driver's retry future behind one call of [`Retry`].
type Driven<S, Req, Rt, C, G> = persevere_driver::RetryFuture<
    Rt,
    Arc<RetryPolicy>,
    Attempts<S, Req, C>,
    Attempt<S, Req, C>,
    Failed<<S as Service<Req>>::Response, <S as Service<Req>>::Error>,
    ByKind,
    (),
    G,
>;

pin_project! {
    /// The future of a call of [`Retry`]: the attempts, and the sleeps between them.
    #[must_use = "futures do nothing unless awaited"]
    pub struct ResponseFuture<S, Req, Rt, C, G>
    where
        S: Service<Req>,
        Rt: Runtime,
    {
        #[pin]
        retry: Driven<S, Req, Rt, C, G>,
        sent_once: Option<SentOnce>,
    }
}

impl<S, Req, Rt, C, G> fmt::Debug for ResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req>,
    Rt: Runtime,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").field("sent_once", &self.sent_once).finish_non_exhaustive()
    }
}

impl<S, Req, Rt, C, G> Future for ResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime,
    C: ResponseClassifier<Req, S::Response, S::Error>,
    G: RetryGate,
{
    type Output = Result<S::Response, RetryError<S::Response, S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Retried { result, stats } = ready!(this.retry.poll(cx));
        Poll::Ready(result.map_err(|gave_up| RetryError::gave_up(gave_up, stats, *this.sent_once)))
    }
}
