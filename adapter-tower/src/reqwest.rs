//! The HTTP rules for reqwest's `Client`, a tower `Service` of its own (H6).

use std::any::Any;
use std::error::Error;

use bytes::Bytes;
use persevere::{CallOutcome, FailureKind};
use persevere_driver::{CallClassifier, CallError};

use crate::classify::{ReplayRequest, ResponseClassifier, SentOnce};
use crate::http::{ByStatus, Http};
use crate::replay::ReplayBody;

/// H1–H5 for `reqwest::Request`s and `reqwest::Response`s, as for `http`'s: a request is
/// copied with `reqwest::Request::try_clone`, so one whose body is a stream is sent once.
impl ReplayRequest<reqwest::Request> for Http {
    fn clone_request(&mut self, request: &reqwest::Request) -> Result<reqwest::Request, SentOnce> {
        if !self.may_repeat(request.method(), request.headers()) {
            return Err(SentOnce::NotIdempotent);
        }
        request.try_clone().ok_or(SentOnce::NotClonable)
    }
}

impl<E: 'static> ResponseClassifier<reqwest::Response, E> for Http {
    fn classify(&self, result: &Result<reqwest::Response, E>) -> Option<FailureKind> {
        match result {
            Ok(response) => self.classify_status(response.status(), response.headers()),
            Err(error) => Some(self.classify_error(error)),
        }
    }
}

/// A reqwest body is copied when it is buffered (made from bytes or a string); a stream is sent
/// once.
impl ReplayBody for reqwest::Body {
    fn try_clone(&self) -> Option<Self> {
        self.as_bytes().map(|bytes| reqwest::Body::from(Bytes::copy_from_slice(bytes)))
    }
}

/// For a [`BreakerLayer`](crate::BreakerLayer) over reqwest's `Client`, as for `http`'s
/// responses.
impl<E> CallClassifier<reqwest::Response, E> for ByStatus {
    fn outcome(self, result: &Result<reqwest::Response, E>) -> CallOutcome {
        match result {
            Ok(response) => ByStatus::of_status(response.status()),
            Err(_) => CallOutcome::Failure,
        }
    }
}

/// Whether `error` is a reqwest error that waiting cannot heal (H5): an invalid request
/// (`is_builder`: a URL the client cannot use) or a redirect loop (`is_redirect`). Found as
/// the error itself, inside a breaker's [`CallError`], or anywhere in the chain of a boxed
/// error (tower's `BoxError`, from a `TimeoutLayer` inside).
pub(crate) fn cannot_heal<E: 'static>(error: &E) -> bool {
    let any: &dyn Any = error;
    if let Some(error) = any.downcast_ref::<reqwest::Error>() {
        return final_error(error);
    }
    if let Some(CallError::Failed(error)) = any.downcast_ref::<CallError<reqwest::Error>>() {
        return final_error(error);
    }
    if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send + Sync>>() {
        return chain_cannot_heal(&**boxed);
    }
    if let Some(CallError::Failed(boxed)) = any.downcast_ref::<CallError<Box<dyn Error + Send + Sync>>>() {
        return chain_cannot_heal(&**boxed);
    }
    false
}

/// Whether a reqwest error is found in `error`'s chain, and cannot heal.
fn chain_cannot_heal(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(error) = error.downcast_ref::<reqwest::Error>() {
            return final_error(error);
        }
        if let Some(CallError::Failed(error)) = error.downcast_ref::<CallError<reqwest::Error>>() {
            return final_error(error);
        }
        next = error.source();
    }
    false
}

fn final_error(error: &reqwest::Error) -> bool {
    error.is_builder() || error.is_redirect()
}
