//! One call of the inner service: waits for it to be ready (unless it already is), then calls
//! it and runs the call's future. Both layers start their inner calls through it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

pin_project! {
    /// A call of `S` with `Req`, started lazily: nothing reaches the inner service before the
    /// first poll.
    #[project = Projection]
    pub(crate) enum Call<S, Req>
    where
        S: Service<Req>,
    {
        /// Not yet called: `ready` says whether `service` has already said it is ready.
        Waiting { service: S, request: Option<Req>, ready: bool },
        /// Called: the inner call's future.
        Running { #[pin] future: S::Future },
    }
}

impl<S: Service<Req>, Req> Call<S, Req> {
    /// A call of `service`, which has already said it is ready (through `poll_ready`).
    pub(crate) fn ready(service: S, request: Req) -> Self {
        Call::Waiting { service, request: Some(request), ready: true }
    }

    /// A call of `service`, which must be asked whether it is ready first.
    pub(crate) fn when_ready(service: S, request: Req) -> Self {
        Call::Waiting { service, request: Some(request), ready: false }
    }
}

impl<S: Service<Req>, Req> Future for Call<S, Req> {
    type Output = Result<S::Response, S::Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                Projection::Running { future } => return future.poll(cx),
                Projection::Waiting { service, request, ready } => {
                    if !*ready {
                        ready!(service.poll_ready(cx))?;
                        *ready = true;
                    }
                    let Some(request) = request.take() else { unreachable!("a waiting call holds its request") };
                    let future = service.call(request);
                    self.set(Call::Running { future });
                }
            }
        }
    }
}
