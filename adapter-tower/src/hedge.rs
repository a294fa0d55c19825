//! The hedging layer: each call is one run of the driver's hedging loop (X1–X5), whose attempts
//! are calls of clones of the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use persevere::HedgePolicy;
use persevere_driver::{HedgeFuture, Hedged, Operation, Refusal, RetryGate, Runtime};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::call::Call;
use crate::classify::{ReplayRequest, ResponseClassifier, SentOnce};
use crate::error::{Failed, RetryError};
use crate::http::Http;
use crate::retry::{Attempt, ByKind, Ended, Judged};

/// Hedges the calls of the service it wraps under a [`HedgePolicy`]: a [`Layer`] whose services
/// send a call again to a clone of the inner service when it has not answered within the
/// policy's delay, take the first success and drop the others (X1–X5).
///
/// The classifier decides which results are failures ([`ResponseClassifier`]: a 503 can be
/// one) and whether a request may be sent more than once ([`ReplayRequest`]): a request it
/// cannot copy is sent once, never hedged, and the error says so. It is [`Http`] unless another is chosen by name with
/// [`classify`](Self::classify) (H4): a POST is never hedged unless allowed. A [`RetryGate`]
/// (a `Budget`, a `Breaker`, or a tuple of them) may refuse the call before it is sent (an
/// open breaker, T4) and is asked before each hedge, as gRPC counts hedges as retries (X4).
/// Cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use persevere_tower::{HedgeLayer, HedgePolicy, RetryErrors};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let counted = calls.clone();
/// let service = ServiceBuilder::new()
///     .layer(HedgeLayer::new(HedgePolicy::builder(2, Duration::from_millis(50)).build()?).classify(RetryErrors))
///     .service(service_fn(move |name: &'static str| {
///         // The first call is slow; the hedge answers at once.
///         let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
///         async move {
///             if n == 1 {
///                 tokio::time::sleep(Duration::from_secs(5)).await;
///             }
///             Ok::<_, std::io::Error>(format!("hello {name} from call {n}"))
///         }
///     }));
/// let started = tokio::time::Instant::now();
/// assert_eq!(service.oneshot("world").await?, "hello world from call 2");
/// assert_eq!(started.elapsed(), Duration::from_millis(50));
/// # Ok(()) }
/// ```
pub struct HedgeLayer<Rt, C = Http, G = ()> {
    runtime: Rt,
    policy: HedgePolicy,
    /// One attempt, the same limits: for a request that cannot be sent twice.
    once: HedgePolicy,
    classifier: C,
    gate: G,
}

#[cfg(feature = "tokio")]
impl HedgeLayer<persevere_tokio::TokioRuntime> {
    /// Hedges under `policy` on tokio's clock and timers, with HTTP semantics ([`Http`])
    /// unless another classifier is chosen with [`classify`](Self::classify).
    pub fn new(policy: HedgePolicy) -> Self {
        HedgeLayer::with_runtime(persevere_tokio::TokioRuntime::new(), policy)
    }
}

impl<Rt> HedgeLayer<Rt> {
    /// Hedges under `policy` on `runtime`'s clock and timers (any executor's [`Runtime`]).
    pub fn with_runtime(runtime: Rt, policy: HedgePolicy) -> Self {
        let once = HedgePolicy::builder(1, policy.delay())
            .max_hint(policy.max_hint())
            .build()
            .unwrap_or_else(|_| unreachable!("one attempt with a valid policy's durations is valid"));
        HedgeLayer { runtime, policy, once, classifier: Http::new(), gate: () }
    }
}

impl<Rt, C, G> HedgeLayer<Rt, C, G> {
    /// Classifies requests and results with `classifier` ([`Http`] unless chosen here).
    pub fn classify<C2>(self, classifier: C2) -> HedgeLayer<Rt, C2, G> {
        HedgeLayer { runtime: self.runtime, policy: self.policy, once: self.once, classifier, gate: self.gate }
    }

    /// Asks `gate` before each hedge; a refusal starts no further hedge, and the attempts that
    /// run carry on (X4).
    pub fn gate<G2: RetryGate>(self, gate: G2) -> HedgeLayer<Rt, C, G2> {
        HedgeLayer { runtime: self.runtime, policy: self.policy, once: self.once, classifier: self.classifier, gate }
    }
}

impl<Rt: Clone, C: Clone, G: Clone> Clone for HedgeLayer<Rt, C, G> {
    fn clone(&self) -> Self {
        HedgeLayer {
            runtime: self.runtime.clone(),
            policy: self.policy,
            once: self.once,
            classifier: self.classifier.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<Rt, C: fmt::Debug, G> fmt::Debug for HedgeLayer<Rt, C, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("policy", &self.policy)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

impl<S, Rt: Clone, C: Clone, G: Clone> Layer<S> for HedgeLayer<Rt, C, G> {
    type Service = HedgeService<S, Rt, C, G>;

    fn layer(&self, inner: S) -> Self::Service {
        HedgeService { inner, layer: self.clone() }
    }
}

/// A service whose calls are hedged: made by [`HedgeLayer`]. `Clone` when the inner service is.
pub struct HedgeService<S, Rt, C = Http, G = ()> {
    inner: S,
    layer: HedgeLayer<Rt, C, G>,
}

impl<S: Clone, Rt: Clone, C: Clone, G: Clone> Clone for HedgeService<S, Rt, C, G> {
    fn clone(&self) -> Self {
        HedgeService { inner: self.inner.clone(), layer: self.layer.clone() }
    }
}

impl<S: fmt::Debug, Rt, C: fmt::Debug, G> fmt::Debug for HedgeService<S, Rt, C, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeService").field("inner", &self.inner).field("layer", &self.layer).finish()
    }
}

impl<S, Req, Rt, C, G> Service<Req> for HedgeService<S, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime + Clone,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
    G: RetryGate + Clone,
{
    type Response = S::Response;
    type Error = RetryError<S::Response, S::Error>;
    type Future = HedgeResponseFuture<S, Req, Rt, C, G>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RetryError::not_ready)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // Refused before it is sent, as by the retry layer (T4).
        if let Err(refusal) = self.layer.gate.admit() {
            return HedgeResponseFuture { hedge: None, sent_once: None, refusal: Some(refusal) };
        }
        let mut classifier = self.layer.classifier.clone();
        let (template, sent_once) = match classifier.clone_request(&request) {
            Ok(copy) => (Some(copy), None),
            Err(why) => (None, Some(why)),
        };
        let policy = if template.is_some() { self.layer.policy } else { self.layer.once };
        // Attempt 1 goes to the service that said it is ready; hedges go to clones, each asked
        // whether it is ready first.
        // A request sent once runs under the one-attempt policy, which ends the call on its
        // failure: it is not marked last.
        let first = Judged { future: self.inner.call(request), classifier: classifier.clone(), last: false };
        let attempts = HedgeAttempts {
            service: self.inner.clone(),
            first: Some(Attempt::First { judged: first }),
            template,
            classifier,
        };
        let hedge = persevere_driver::hedge(self.layer.runtime.clone(), policy, attempts)
            .classify_with(ByKind)
            .gate(self.layer.gate.clone());
        HedgeResponseFuture { hedge: Some(hedge), sent_once, refusal: None }
    }
}

/// The attempts of one hedged call: the operation the hedging loop runs.
pub(crate) struct HedgeAttempts<S: Service<Req>, Req, C> {
    service: S,
    first: Option<Attempt<S, Req, C>>,
    template: Option<Req>,
    classifier: C,
}

impl<S, Req, C> Operation for HedgeAttempts<S, Req, C>
where
    S: Service<Req> + Clone,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
{
    type Future = Attempt<S, Req, C>;

    fn attempt(&mut self) -> Self::Future {
        if let Some(first) = self.first.take() {
            return first;
        }
        let Some(template) = &self.template else {
            // The last copy was sent (the classifier copied the request once and then refused
            // to): a further hedge cannot be made, and fails as a panic would (non-fatal: the
            // attempts that run carry on). It was counted as started, and the gate was asked
            // for it; a classifier that can copy a request once can, in practice, copy it again.
            return Attempt::Ended {
                ended: Some(Ended::Panicked(Box::new("the request could not be copied for another hedge"))),
            };
        };
        let (request, last) = match self.classifier.clone_request(template) {
            Ok(copy) => (copy, false),
            Err(_) => (self.template.take().unwrap_or_else(|| unreachable!("the template was just read")), true),
        };
        let judged = Judged {
            future: Call::when_ready(self.service.clone(), request),
            classifier: self.classifier.clone(),
            last,
        };
        Attempt::Retry { judged }
    }
}

/// The driver's hedging future behind one call of [`HedgeService`].
type Driven<S, Req, Rt, C, G> = HedgeFuture<
    Rt,
    HedgePolicy,
    HedgeAttempts<S, Req, C>,
    Attempt<S, Req, C>,
    Failed<<S as Service<Req>>::Response, <S as Service<Req>>::Error>,
    ByKind,
    G,
>;

pin_project! {
    /// The future of a call of [`HedgeService`]: the hedging loop, held inline.
    #[must_use = "futures do nothing unless awaited"]
    pub struct HedgeResponseFuture<S, Req, Rt, C, G>
    where
        S: Service<Req>,
        Rt: Runtime,
        G: RetryGate,
    {
        // `None` when a gate refused the call before it was sent.
        #[pin]
        hedge: Option<Driven<S, Req, Rt, C, G>>,
        sent_once: Option<SentOnce>,
        refusal: Option<Refusal>,
    }
}

impl<S, Req, Rt, C, G> fmt::Debug for HedgeResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req>,
    Rt: Runtime,
    G: RetryGate,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeResponseFuture").finish_non_exhaustive()
    }
}

impl<S, Req, Rt, C, G> Future for HedgeResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
    G: RetryGate,
{
    type Output = Result<S::Response, RetryError<S::Response, S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(hedge) = this.hedge.as_pin_mut() else {
            let Some(refusal) = this.refusal.take() else { panic!("`HedgeResponseFuture` polled after it completed") };
            return Poll::Ready(Err(RetryError::refused(refusal)));
        };
        let Hedged { result, stats } = ready!(hedge.poll(cx));
        Poll::Ready(result.map_err(|gave_up| RetryError::hedged(gave_up, stats, *this.sent_once)))
    }
}
