//! The retry layer: each call is one run of the driver's retry loop (T1), whose attempts are
//! calls of the inner service.

use std::any::Any;
use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use persevere::{FailureKind, Hint, RetryPolicy};
use persevere_driver::{Classifier, Operation, Refusal, Retried, RetryGate, Runtime};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::call::Call;
use crate::classify::{ReplayRequest, ResponseClassifier, SentOnce};
use crate::error::{Failed, Last, RetryError};
use crate::http::Http;
use crate::policy::SharedPolicy;

/// Retries the calls of the service it wraps under a [`RetryPolicy`] (T1): a [`Layer`] whose
/// services run each call through persevere's one driving loop.
///
/// A classifier decides whether a request may be sent again ([`ReplayRequest`]) and which
/// results are failures ([`ResponseClassifier`]: a 503 can be one, T2). It is [`Http`] unless
/// another is chosen by name with [`classify`](Self::classify) (H4), so HTTP semantics are never
/// silently off; requests that are not HTTP requests need a classifier named
/// ([`RetryErrors`](crate::RetryErrors) retries every error). (Without one, a method call such
/// as `oneshot` is refused with "`Retry<..>: Service<_>` is not satisfied", which names no
/// trait; where a bound requires a `Service`, the compiler names [`ReplayRequest`] and this
/// fix.) A [`RetryGate`] (a `Budget`, a
/// `Breaker`, or a tuple of them) may refuse the call before it is sent (an open breaker) or
/// veto each retry, which then ends with `Rejected` (T3, T4). Cheap to clone: the policy is
/// shared.
///
/// ```
/// use std::time::Duration;
/// use persevere_tower::{Backoff, RetryErrors, RetryLayer, RetryPolicy};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build()?).max_attempts(3).build()?;
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let counted = calls.clone();
/// // Requests that are not HTTP requests: every error is retried.
/// let layer = RetryLayer::new(policy).classify(RetryErrors);
/// let service = ServiceBuilder::new().layer(layer).service(service_fn(move |name: &'static str| {
///     let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
///     async move { if n < 3 { Err("busy") } else { Ok(format!("hello {name}")) } }
/// }));
/// assert_eq!(service.oneshot("world").await.unwrap(), "hello world");
/// assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 3);
/// # Ok(()) }
/// ```
pub struct RetryLayer<Rt, C = Http, G = ()> {
    runtime: Rt,
    policy: SharedPolicy,
    /// For a request that can be sent only once: one attempt, under the policy's deadline,
    /// total budget and `max_hint`.
    once: SharedPolicy,
    classifier: C,
    gate: G,
}

#[cfg(feature = "tokio")]
impl RetryLayer<persevere_tokio::TokioRuntime> {
    /// Retries under `policy` on tokio's clock and timers, with HTTP semantics ([`Http`])
    /// unless another classifier is chosen with [`classify`](Self::classify). `policy` is a
    /// `RetryPolicy`, an `Arc` of one, or a `&'static` one (see [`SharedPolicy`]).
    pub fn new(policy: impl Into<SharedPolicy>) -> Self {
        RetryLayer::with_runtime(persevere_tokio::TokioRuntime::new(), policy)
    }
}

impl<Rt> RetryLayer<Rt> {
    /// Retries under `policy` on `runtime`'s clock and timers (any executor's
    /// [`Runtime`]), with HTTP semantics unless another classifier is chosen.
    pub fn with_runtime(runtime: Rt, policy: impl Into<SharedPolicy>) -> Self {
        let policy = policy.into();
        let once = SharedPolicy::from(once(Borrow::<RetryPolicy>::borrow(&policy)));
        RetryLayer { runtime, policy, once, classifier: Http::new(), gate: () }
    }
}

/// `policy` for a request that can be sent only once: one attempt, under the same deadline,
/// total budget and `max_hint`, so that its failure ends the call `Exhausted` with its own class.
fn once(policy: &RetryPolicy) -> RetryPolicy {
    let mut once = RetryPolicy::builder(*policy.backoff()).max_attempts(1).max_hint(policy.max_hint());
    if let Some(total) = policy.total() {
        once = once.total(total);
    }
    if let Some(timeout) = policy.attempt_timeout() {
        once = once.attempt_timeout(timeout);
    }
    once.build().unwrap_or_else(|_| unreachable!("one attempt under a valid policy's limits is valid"))
}

impl<Rt, C, G> RetryLayer<Rt, C, G> {
    /// Classifies requests and results with `classifier` ([`Http`] unless chosen here).
    pub fn classify<C2>(self, classifier: C2) -> RetryLayer<Rt, C2, G> {
        RetryLayer { runtime: self.runtime, policy: self.policy, once: self.once, classifier, gate: self.gate }
    }

    /// Asks `gate` before each call (a `Breaker` refuses one while open, before it is sent) and
    /// before each retry (a `Budget`, a `Breaker`, or a tuple of them in the order they are
    /// asked); a refusal ends the call with `Rejected`, naming the gate (T3, T4).
    pub fn gate<G2: RetryGate>(self, gate: G2) -> RetryLayer<Rt, C, G2> {
        RetryLayer { runtime: self.runtime, policy: self.policy, once: self.once, classifier: self.classifier, gate }
    }
}

impl<Rt: Clone, C: Clone, G: Clone> Clone for RetryLayer<Rt, C, G> {
    fn clone(&self) -> Self {
        RetryLayer {
            runtime: self.runtime.clone(),
            policy: self.policy.clone(),
            once: self.once.clone(),
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
/// is; its futures are `Send` and `'static` when the inner service's, the request, the
/// runtime's and the gate's (with its `Ticket` and `Request`) are.
pub struct Retry<S, Rt, C = Http, G = ()> {
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
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
    G: RetryGate + Clone,
{
    type Response = S::Response;
    type Error = RetryError<S::Response, S::Error>;
    type Future = ResponseFuture<S, Req, Rt, C, G>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RetryError::not_ready)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        // A gate that refuses every call now (an open breaker) refuses this one before it is
        // sent: no attempt, and the gate hears of no request (T4).
        if let Err(refusal) = self.layer.gate.admit() {
            return ResponseFuture { state: State::Refused { refusal: Some(refusal) }, sent_once: None };
        }
        let mut classifier = self.layer.classifier.clone();
        let (template, sent_once) = match classifier.clone_request(&request) {
            Ok(copy) => (Some(copy), None),
            Err(why) => (None, Some(why)),
        };
        // The first attempt goes to the service that said it is ready; retries go to clones,
        // each asked whether it is ready first.
        // A request sent once runs under the one-attempt policy, which ends the call on its
        // failure: no attempt of it is marked last.
        let first = Judged { future: self.inner.call(request), classifier: classifier.clone(), last: false };
        let policy = if template.is_some() { &self.layer.policy } else { &self.layer.once };
        // The gate hears of the call as it starts (a concurrency budget counts it in flight
        // from here), and the loop, if it takes over, keeps what it returned.
        let request = Some(self.layer.gate.on_request(None));
        let rest = Rest {
            service: self.inner.clone(),
            template,
            classifier,
            runtime: self.layer.runtime.clone(),
            policy: policy.clone(),
            gate: self.layer.gate.clone(),
            request,
        };
        let state = if Borrow::<RetryPolicy>::borrow(&self.layer.policy).needs_clock() {
            // The first attempt has a deadline (or counts against a total budget): the loop
            // runs it from the start.
            State::Looping { retry: rest.into_loop(Attempt::First { judged: first }) }
        } else {
            State::First { attempt: first, rest: Some(rest) }
        };
        ResponseFuture { state, sent_once }
    }
}

/// What a call needs beyond its first attempt, kept until that attempt fails.
struct Rest<S, Req, Rt, C, G: RetryGate> {
    /// A clone of the inner service, for the retries.
    service: S,
    /// The copy retries are made from; `None` if the request cannot be sent again.
    template: Option<Req>,
    classifier: C,
    runtime: Rt,
    policy: SharedPolicy,
    gate: G,
    /// What the gate keeps for this call until it ends.
    request: Option<G::Request>,
}

impl<S, Req, Rt, C, G> Rest<S, Req, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
    G: RetryGate,
{
    /// The driving loop for this call, whose attempt 1 is `first` (running, or already ended).
    fn into_loop(self, first: Attempt<S, Req, C>) -> Loop<S, Req, Rt, C, G> {
        let Rest { service, template, classifier, runtime, policy, gate, request } = self;
        let attempts = Attempts { service, first: Some(first), template, classifier };
        let retry = persevere_driver::retry(runtime, policy, attempts).classify_with(ByKind).gate(gate);
        Loop(Some(Box::pin(match request {
            Some(request) => retry.requested(request),
            None => retry,
        })))
    }
}

/// The attempts of one call: the operation the driving loop retries.
struct Attempts<S: Service<Req>, Req, C> {
    /// A clone of the inner service, for the retries.
    service: S,
    /// Attempt 1, already called.
    first: Option<Attempt<S, Req, C>>,
    /// The copy retries are made from; `None` once the request cannot be sent again.
    template: Option<Req>,
    classifier: C,
}

impl<S, Req, C> Operation for Attempts<S, Req, C>
where
    S: Service<Req> + Clone,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
{
    type Future = Attempt<S, Req, C>;

    fn attempt(&mut self) -> Self::Future {
        if let Some(first) = self.first.take() {
            return first;
        }
        // The loop asks for a retry only after a failure it may retry, which a last send never is.
        let Some(template) = &self.template else { unreachable!("a request sent once is not retried") };
        let (request, last) = match self.classifier.clone_request(template) {
            Ok(copy) => (copy, false),
            Err(_) => (self.template.take().unwrap_or_else(|| unreachable!()), true),
        };
        let judged = Judged {
            future: Call::when_ready(self.service.clone(), request),
            classifier: self.classifier.clone(),
            last,
        };
        Attempt::Retry { judged }
    }
}

/// How an attempt that ended before the loop took over ended.
pub(crate) enum Ended<Res, E> {
    Failed(Failed<Res, E>),
    /// It panicked; the panic is raised again inside the loop, which counts it as `Panicked`.
    Panicked(Box<dyn Any + Send>),
}

pin_project! {
    /// An attempt's future, and what classifies its result (`last`: the request cannot be sent
    /// again, so a failure is final).
    pub(crate) struct Judged<F, C> {
        #[pin]
        pub(crate) future: F,
        pub(crate) classifier: C,
        pub(crate) last: bool,
    }
}

impl<F, C> Judged<F, C> {
    /// Polls the attempt: its result, an `Err` if the classifier calls it a failure.
    #[inline(always)]
    fn poll_judged<Res, E>(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Res, Failed<Res, E>>>
    where
        F: Future<Output = Result<Res, E>>,
        C: ResponseClassifier<Res, E>,
    {
        let this = self.project();
        let result = ready!(this.future.poll(cx));
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

pin_project! {
    /// One attempt of the loop: attempt 1 (the call made by [`Retry::call`]), a retry (a call
    /// of a clone of the service, asked whether it is ready first), or attempt 1 that ended
    /// before the loop took over.
    #[project = AttemptProjection]
    pub(crate) enum Attempt<S, Req, C>
    where
        S: Service<Req>,
    {
        First { #[pin] judged: Judged<S::Future, C> },
        Retry { #[pin] judged: Judged<Call<S, Req>, C> },
        Ended { ended: Option<Ended<S::Response, S::Error>> },
    }
}

impl<S, Req, C> Future for Attempt<S, Req, C>
where
    S: Service<Req>,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
{
    type Output = Result<S::Response, Failed<S::Response, S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AttemptProjection::First { judged } => judged.poll_judged(cx),
            AttemptProjection::Retry { judged } => judged.poll_judged(cx),
            AttemptProjection::Ended { ended } => match ended.take() {
                Some(Ended::Failed(failed)) => Poll::Ready(Err(failed)),
                Some(Ended::Panicked(payload)) => resume_unwind(payload),
                None => panic!("an ended attempt polled after it completed"),
            },
        }
    }
}

/// The driving loop's classifier: the kind the attempt already decided.
pub(crate) struct ByKind;

impl<Res, E> Classifier<Failed<Res, E>> for ByKind {
    #[inline]
    fn classify(&mut self, failed: &Failed<Res, E>) -> FailureKind {
        failed.kind
    }
}

/// The driver's retry future behind one call of [`Retry`].
type Driven<S, Req, Rt, C, G> = persevere_driver::RetryFuture<
    Rt,
    SharedPolicy,
    Attempts<S, Req, C>,
    Attempt<S, Req, C>,
    Failed<<S as Service<Req>>::Response, <S as Service<Req>>::Error>,
    ByKind,
    (),
    G,
>;

/// The driver's retry future, pinned in its own allocation.
type Allocated<S, Req, Rt, C, G> = Pin<Box<Driven<S, Req, Rt, C, G>>>;

/// The driving loop of one call, in its own allocation (`None` only while it is dropped).
///
/// Dropped out of line: inlined, the loop's drop made the drop of every [`ResponseFuture`] too
/// large to inline, and a call that succeeded at once, which never builds a loop, paid a call
/// for it. (Its `Drop` means a dropped future needs its type parameters still alive: a request
/// type that borrows must outlive the future, as it must for the loop itself.)
struct Loop<S, Req, Rt, C, G>(Option<Allocated<S, Req, Rt, C, G>>)
where
    S: Service<Req>,
    Rt: Runtime,
    G: RetryGate;

impl<S, Req, Rt, C, G> Loop<S, Req, Rt, C, G>
where
    S: Service<Req>,
    Rt: Runtime,
    G: RetryGate,
{
    /// The loop, pinned in its allocation.
    fn get(&mut self) -> Pin<&mut Driven<S, Req, Rt, C, G>> {
        let Some(driven) = self.0.as_mut() else { unreachable!("a loop is only emptied by its drop") };
        driven.as_mut()
    }
}

impl<S, Req, Rt, C, G> Drop for Loop<S, Req, Rt, C, G>
where
    S: Service<Req>,
    Rt: Runtime,
    G: RetryGate,
{
    #[inline]
    fn drop(&mut self) {
        if let Some(driven) = self.0.take() {
            drop_out_of_line(driven);
        }
    }
}

/// Drops `value` in a call of its own (not `#[cold]`: a policy with an attempt timeout or a
/// total budget builds the loop, and so drops it, on every call).
#[inline(never)]
fn drop_out_of_line<T>(value: T) {
    drop(value);
}

pin_project! {
    /// Where a call stands: its first attempt, or the driving loop.
    #[project = StateProjection]
    enum State<S, Req, Rt, C, G>
    where
        S: Service<Req>,
        Rt: Runtime,
        G: RetryGate,
    {
        /// Attempt 1 of a policy that needs no clock, with what a retry would need.
        First {
            #[pin]
            attempt: Judged<S::Future, C>,
            rest: Option<Rest<S, Req, Rt, C, G>>,
        },
        /// The driving loop, from attempt 1 (a policy with a deadline or a budget) or from
        /// the first failure.
        Looping { retry: Loop<S, Req, Rt, C, G> },
        /// A gate refused the call before it was sent (`None` once that is returned).
        Refused { refusal: Option<Refusal> },
    }
}

pin_project! {
    /// The future of a call of [`Retry`].
    ///
    /// While attempt 1 runs it holds that attempt and what a retry would need (unless the
    /// policy has an attempt timeout or a total budget): a call that succeeds at once allocates
    /// nothing and never builds the loop, as the loop's own first attempt would not. At the
    /// first failure, the call moves into the driving loop, which decides everything from
    /// there: one allocation per retried call (or per call, for a policy with a deadline),
    /// which keeps this future small.
    #[must_use = "futures do nothing unless awaited"]
    pub struct ResponseFuture<S, Req, Rt, C, G>
    where
        S: Service<Req>,
        Rt: Runtime,
        G: RetryGate,
    {
        #[pin]
        state: State<S, Req, Rt, C, G>,
        // Why the request could be sent only once, if it could. Beside the state rather than in
        // its `Looping` variant: there, its byte lay inside the bytes of attempt 1's result,
        // which `call` then stored in four pieces and the first poll read back whole (a
        // store-forwarding stall on every successful call).
        sent_once: Option<SentOnce>,
    }
}

impl<S, Req, Rt, C, G> fmt::Debug for ResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req>,
    Rt: Runtime,
    G: RetryGate,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, Req, Rt, C, G> Future for ResponseFuture<S, Req, Rt, C, G>
where
    S: Service<Req> + Clone,
    Rt: Runtime,
    C: ReplayRequest<Req> + ResponseClassifier<S::Response, S::Error>,
    G: RetryGate,
{
    type Output = Result<S::Response, RetryError<S::Response, S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let ended = match this.state.as_mut().project() {
                StateProjection::Refused { refusal } => {
                    let Some(refusal) = refusal.take() else { panic!("`ResponseFuture` polled after it completed") };
                    return Poll::Ready(Err(RetryError::refused(refusal)));
                }
                StateProjection::Looping { retry } => {
                    let Retried { result, stats } = ready!(retry.get().poll(cx));
                    return Poll::Ready(result.map_err(|gave_up| RetryError::gave_up(gave_up, stats, *this.sent_once)));
                }
                // As the loop's own first attempt: a panic is caught, a success is told to
                // the gate (with the request, which the loop tells it of when it takes over).
                StateProjection::First { attempt, rest } => {
                    match catch_unwind(AssertUnwindSafe(|| attempt.poll_judged(cx))) {
                        Ok(Poll::Pending) => return Poll::Pending,
                        Ok(Poll::Ready(Ok(response))) => {
                            // The call ends here: the gate's request with it. What a retry
                            // would have needed is dropped where it is, not moved out first
                            // (copying it out read back what `call` had just stored, in wider
                            // loads: a store-forwarding stall on every successful call).
                            // Dropped also if the gate panics: polled again, the call is over.
                            let rest = ClearOnDrop(rest);
                            if let Some(rest) = rest.0.as_ref() {
                                rest.gate.on_success(None);
                            }
                            return Poll::Ready(Ok(response));
                        }
                        Ok(Poll::Ready(Err(failed))) => (Ended::Failed(failed), rest.take()),
                        Err(payload) => (Ended::Panicked(payload), rest.take()),
                    }
                }
            };
            let (ended, Some(rest)) = ended else { panic!("`ResponseFuture` polled after it completed") };
            let retry = rest.into_loop(Attempt::Ended { ended: Some(ended) });
            this.state.set(State::Looping { retry });
        }
    }
}

/// Empties its slot when dropped, on return or unwind alike.
struct ClearOnDrop<'a, T>(&'a mut Option<T>);

impl<T> Drop for ClearOnDrop<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        *self.0 = None;
    }
}
