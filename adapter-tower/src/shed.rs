//! The load-shedding layer: every call takes a place in a shared adaptive [`Limiter`]; a call
//! that finds the limit full is refused at once (L2–L4, T4).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use persevere_driver::{ByCompletion, CompletionClassifier, Limiter, LimiterCall, Runtime, ShedError};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::call::Call;

/// Puts a shared adaptive [`Limiter`] in front of the service it wraps: a call is made only
/// while fewer calls than the limit are in flight; beyond it, the call fails at once with
/// [`ShedError::Shed`] and its [`retry_after`](ShedError::retry_after) (the minimum RTT
/// measured), and the inner service is not called. Each completion moves the limit by the
/// limiter's algorithm (AIMD, Vegas, Gradient2), with the RTT measured on the runtime's clock.
///
/// The classifier chooses each result's [`Completion`](persevere::Completion):
/// [`ByCompletion`] (an `Err` is a drop) by default, or any `Clone` closure
/// `FnOnce(&Result<Res, E>) -> Completion`. A call whose future is dropped before it ends
/// returns its place as `Completion::Ignored`.
///
/// Unlike tower's `ConcurrencyLimit`, which waits in `poll_ready` for a place, this layer
/// never waits: under overload the excess is refused, so the calls it admits keep the latency
/// the dependency has at the limit it learned.
pub struct LoadShedLayer<Rt, C = ByCompletion> {
    limiter: Limiter<Rt>,
    classify: C,
}

impl<Rt> LoadShedLayer<Rt> {
    /// Calls through `limiter` (a clone shares its state), every `Err` a drop.
    pub fn new(limiter: Limiter<Rt>) -> Self {
        LoadShedLayer { limiter, classify: ByCompletion }
    }
}

impl<Rt, C> LoadShedLayer<Rt, C> {
    /// Reports each result as `classify` says.
    pub fn classify<C2>(self, classify: C2) -> LoadShedLayer<Rt, C2> {
        LoadShedLayer { limiter: self.limiter, classify }
    }
}

impl<Rt, C: Clone> Clone for LoadShedLayer<Rt, C> {
    fn clone(&self) -> Self {
        LoadShedLayer { limiter: self.limiter.clone(), classify: self.classify.clone() }
    }
}

impl<Rt, C> fmt::Debug for LoadShedLayer<Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedLayer").field("limiter", &self.limiter).finish_non_exhaustive()
    }
}

impl<S, Rt, C: Clone> Layer<S> for LoadShedLayer<Rt, C> {
    type Service = LoadShedService<S, Rt, C>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShedService { inner, layer: self.clone() }
    }
}

/// A service behind a concurrency limit: made by [`LoadShedLayer`]. `Clone` when the inner
/// service is (the clones share the limiter).
pub struct LoadShedService<S, Rt, C = ByCompletion> {
    inner: S,
    layer: LoadShedLayer<Rt, C>,
}

impl<S: Clone, Rt, C: Clone> Clone for LoadShedService<S, Rt, C> {
    fn clone(&self) -> Self {
        LoadShedService { inner: self.inner.clone(), layer: self.layer.clone() }
    }
}

impl<S: fmt::Debug, Rt, C> fmt::Debug for LoadShedService<S, Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedService").field("inner", &self.inner).field("layer", &self.layer).finish()
    }
}

pin_project! {
    /// The future of a call of [`LoadShedService`]: a place at the first poll (or the refusal),
    /// then the inner call. Dropping it before the call ends returns the place.
    #[must_use = "futures do nothing unless awaited"]
    pub struct LoadShedFuture<S, Req, Rt, C>
    where
        S: Service<Req>,
        Rt: Runtime,
    {
        #[pin]
        call: LimiterCall<Rt, Call<S, Req>, C>,
    }
}

impl<S: Service<Req>, Req, Rt: Runtime, C> fmt::Debug for LoadShedFuture<S, Req, Rt, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadShedFuture").finish_non_exhaustive()
    }
}

impl<S, Req, Rt, C> Future for LoadShedFuture<S, Req, Rt, C>
where
    S: Service<Req>,
    Rt: Runtime,
    C: CompletionClassifier<S::Response, S::Error>,
{
    type Output = Result<S::Response, ShedError<S::Error>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().call.poll(cx)
    }
}

impl<S, Req, Rt, C> Service<Req> for LoadShedService<S, Rt, C>
where
    S: Service<Req> + Clone,
    Rt: Runtime,
    C: CompletionClassifier<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = ShedError<S::Error>;
    type Future = LoadShedFuture<S, Req, Rt, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ShedError::Failed)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // The service that said it is ready is called only once the limiter admits the call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        LoadShedFuture {
            call: self.layer.limiter.call_classified(Call::ready(ready, request), self.layer.classify.clone()),
        }
    }
}
