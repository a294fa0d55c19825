//! The breaker layer: every call goes through a shared [`Breaker`] (T1, T3).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use persevere_driver::{Breaker, BreakerCall, ByResult, CallClassifier, CallError, Runtime};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::call::Call;

/// Puts a shared [`Breaker`] in front of the service it wraps: while the breaker is open a
/// call fails at once with [`CallError::Rejected`] and its `retry_after`, and the inner
/// service is not called (T3); otherwise the call's outcome is recorded.
///
/// The classifier says what a result means for the breaker: [`ByResult`] (every `Err` a
/// failure) by default, [`ByStatus`](crate::ByStatus) for HTTP responses, or any closure
/// `FnOnce(&Result<Res, E>) -> CallOutcome` that is `Clone`.
///
/// Under a [`RetryLayer`](crate::RetryLayer), each attempt is one call of the breaker; give the
/// same breaker to the retry layer's [`gate`](crate::RetryLayer::gate), so that a retry is not
/// even scheduled while the breaker is open (the call then ends as `Rejected`).
pub struct BreakerLayer<Rt, C = ByResult> {
    breaker: Breaker<Rt>,
    classify: C,
}

impl<Rt> BreakerLayer<Rt> {
    /// Calls through `breaker` (a clone shares its state), every `Err` a failure.
    pub fn new(breaker: Breaker<Rt>) -> Self {
        BreakerLayer { breaker, classify: ByResult }
    }
}

impl<Rt, C> BreakerLayer<Rt, C> {
    /// Records each result as `classify` says.
    pub fn classify<C2>(self, classify: C2) -> BreakerLayer<Rt, C2> {
        BreakerLayer { breaker: self.breaker, classify }
    }
}

impl<Rt, C: Clone> Clone for BreakerLayer<Rt, C> {
    fn clone(&self) -> Self {
        BreakerLayer { breaker: self.breaker.clone(), classify: self.classify.clone() }
    }
}

impl<Rt, C> fmt::Debug for BreakerLayer<Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerLayer").field("breaker", &self.breaker).finish_non_exhaustive()
    }
}

impl<S, Rt, C: Clone> Layer<S> for BreakerLayer<Rt, C> {
    type Service = BreakerService<S, Rt, C>;

    fn layer(&self, inner: S) -> Self::Service {
        BreakerService { inner, layer: self.clone() }
    }
}

/// A service behind a breaker: made by [`BreakerLayer`]. `Clone` when the inner service is
/// (the clones share the breaker).
pub struct BreakerService<S, Rt, C = ByResult> {
    inner: S,
    layer: BreakerLayer<Rt, C>,
}

impl<S: Clone, Rt, C: Clone> Clone for BreakerService<S, Rt, C> {
    fn clone(&self) -> Self {
        BreakerService { inner: self.inner.clone(), layer: self.layer.clone() }
    }
}

impl<S: fmt::Debug, Rt, C> fmt::Debug for BreakerService<S, Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerService").field("inner", &self.inner).field("layer", &self.layer).finish()
    }
}

pin_project! {
    /// The future of a call of [`BreakerService`]: admission at the first poll, then the inner
    /// call. Dropping it before the call ends releases the breaker's permit.
    #[must_use = "futures do nothing unless awaited"]
    pub struct BreakerFuture<S, Req, Rt, C>
    where
        S: Service<Req>,
        Rt: Runtime,
        Rt: 'static,
    {
        #[pin]
        call: BreakerCall<'static, Rt, Call<S, Req>, C>,
    }
}

impl<S: Service<Req>, Req, Rt: Runtime + 'static, C> fmt::Debug for BreakerFuture<S, Req, Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerFuture").finish_non_exhaustive()
    }
}

impl<S, Req, Rt, C> Future for BreakerFuture<S, Req, Rt, C>
where
    S: Service<Req>,
    Rt: Runtime + 'static,
    C: CallClassifier<S::Response, S::Error>,
{
    type Output = Result<S::Response, CallError<S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().call.poll(cx)
    }
}

impl<S, Req, Rt, C> Service<Req> for BreakerService<S, Rt, C>
where
    S: Service<Req> + Clone,
    Rt: Runtime + 'static,
    C: CallClassifier<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = CallError<S::Error>;
    type Future = BreakerFuture<S, Req, Rt, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(CallError::Failed)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // The service that said it is ready is called only once the breaker admits the call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        BreakerFuture { call: self.layer.breaker.call_owned(Call::ready(ready, request), self.layer.classify.clone()) }
    }
}
