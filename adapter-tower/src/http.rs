//! HTTP semantics for the layers (H1–H3), on the `http` 1.x types that hyper, axum, reqwest
//! and tonic share.

use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderName, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use persevere::{CallOutcome, FailureKind};
use persevere_driver::{CallClassifier, retry_after};

use crate::classify::{ResponseClassifier, SentOnce};

/// A request body that may be copied for a retry: [`try_clone`](Self::try_clone) returns a
/// copy, or `None` when the body cannot be sent twice (a stream), in which case the request is
/// sent once and the error says [`SentOnce::NotClonable`].
///
/// Implemented for the buffered bodies of `http-body-util` (`Full`, `Empty`), for `Bytes`,
/// `String`, `Vec<u8>`, `&'static str` and `()`; the boxed bodies (`BoxBody`,
/// `UnsyncBoxBody`) cannot be copied. Implement it for a body type of your own that is
/// sometimes buffered and sometimes a stream.
pub trait ReplayBody: Sized {
    /// A copy of this body, or `None` if it cannot be sent twice.
    fn try_clone(&self) -> Option<Self>;
}

macro_rules! replay_by_clone {
    ($($body:ty),* $(,)?) => {
        $(impl ReplayBody for $body {
            fn try_clone(&self) -> Option<Self> {
                Some(self.clone())
            }
        })*
    };
}

replay_by_clone!(Bytes, String, Vec<u8>, &'static str, ());

impl<D: Clone> ReplayBody for http_body_util::Full<D> {
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> ReplayBody for http_body_util::Empty<D> {
    fn try_clone(&self) -> Option<Self> {
        Some(http_body_util::Empty::new())
    }
}

impl<D, E> ReplayBody for http_body_util::combinators::BoxBody<D, E> {
    fn try_clone(&self) -> Option<Self> {
        None
    }
}

impl<D, E> ReplayBody for http_body_util::combinators::UnsyncBoxBody<D, E> {
    fn try_clone(&self) -> Option<Self> {
        None
    }
}

/// The header that, present on a request, allows a non-idempotent method to be retried (H3):
/// the server uses it to recognise a repeat.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY_NAME);

const IDEMPOTENCY_KEY_NAME: &str = "idempotency-key";

/// HTTP semantics for the [`RetryLayer`](crate::RetryLayer) (H1–H3).
///
/// - **H1**: an error of the inner service (no response: the connection was refused or reset,
///   or the request timed out) and the statuses 408, 429, 500, 502, 503 and 504 are retryable;
///   every other response stands.
/// - **H2**: a `Retry-After` on a 429 or 503 response (seconds, or an HTTP-date measured from
///   the system clock) is a hint (B6): the next attempt never starts before it, and a hint
///   past the policy's `max_hint` ends the call as `Deferred` with the hint in
///   [`RetryError::retry_after`](crate::RetryError::retry_after). A 429 or 503 without one is
///   [`Throttled`](FailureKind::Throttled): retried by the schedule, and charged by a retry
///   budget as throttling.
/// - **H3**: requests whose method is not idempotent (POST, PATCH, CONNECT and extension
///   methods; GET, HEAD, OPTIONS, TRACE, PUT and DELETE are, RFC 9110 §9.2.2) are sent once,
///   unless they carry an [`IDEMPOTENCY_KEY`] header (or the one set with
///   [`idempotency_header`](Self::idempotency_header)) or retrying them is allowed with
///   [`retry_non_idempotent`](Self::retry_non_idempotent).
///
/// A request is copied for retries with its method, URI, version, headers, extensions and a
/// [`ReplayBody`] copy of its body.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use persevere::FailureKind;
/// use persevere_tower::{Http, ResponseClassifier, SentOnce};
///
/// let mut http = Http::new();
/// let post = Request::post("http://example.com/orders").body(String::new())?;
/// let refused = ResponseClassifier::<_, Response<()>, ()>::clone_request(&mut http, &post);
/// assert_eq!(refused.err(), Some(SentOnce::NotIdempotent));
///
/// let unavailable = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).header("retry-after", "2").body(())?;
/// let kind = ResponseClassifier::<Request<String>, _, ()>::classify(&http, &Ok(unavailable));
/// assert_eq!(kind, Some(FailureKind::Hinted(persevere::Hint::After(Duration::from_secs(2)))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Http {
    retry_non_idempotent: bool,
    /// `None` for [`IDEMPOTENCY_KEY`]: the default costs nothing to clone (a custom
    /// `HeaderName` is reference-counted bytes, and each call clones the classifier).
    idempotency_header: Option<HeaderName>,
}

impl Default for Http {
    fn default() -> Self {
        Http::new()
    }
}

impl Http {
    /// H1–H3 as listed above.
    pub fn new() -> Self {
        Http { retry_non_idempotent: false, idempotency_header: None }
    }

    /// Retries requests of every method, idempotent or not (H3's opt-in for all requests).
    pub fn retry_non_idempotent(mut self) -> Self {
        self.retry_non_idempotent = true;
        self
    }

    /// The header whose presence allows a non-idempotent request to be retried
    /// ([`IDEMPOTENCY_KEY`] by default).
    pub fn idempotency_header(mut self, header: HeaderName) -> Self {
        self.idempotency_header = Some(header);
        self
    }

    fn may_repeat<B>(&self, request: &Request<B>) -> bool {
        let idempotent = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
        );
        let keyed = match &self.idempotency_header {
            Some(header) => request.headers().contains_key(header),
            None => request.headers().contains_key(IDEMPOTENCY_KEY_NAME),
        };
        idempotent || self.retry_non_idempotent || keyed
    }
}

/// Whether `status` is one H1 retries.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

impl<B, ResB, E> ResponseClassifier<Request<B>, Response<ResB>, E> for Http
where
    B: ReplayBody,
{
    fn clone_request(&mut self, request: &Request<B>) -> Result<Request<B>, SentOnce> {
        if !self.may_repeat(request) {
            return Err(SentOnce::NotIdempotent);
        }
        let body = request.body().try_clone().ok_or(SentOnce::NotClonable)?;
        let mut copy = Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Ok(copy)
    }

    fn classify(&self, result: &Result<Response<ResB>, E>) -> Option<FailureKind> {
        let response = match result {
            Ok(response) => response,
            Err(_) => return Some(FailureKind::Retryable),
        };
        let status = response.status();
        if !retryable(status) {
            return None;
        }
        let overloaded = matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE);
        let hint = overloaded
            .then(|| response.headers().get(RETRY_AFTER)?.to_str().ok())
            .flatten()
            .and_then(|value| retry_after(value, SystemTime::now()));
        // An overloaded server that gave no (readable) hint is throttling: retried by the
        // schedule, and charged as throttling by a budget.
        let unhinted = if overloaded { FailureKind::Throttled } else { FailureKind::Retryable };
        Some(hint.map_or(unhinted, FailureKind::Hinted))
    }
}

/// What an HTTP call means for a [`BreakerLayer`](crate::BreakerLayer): an error (no
/// response) and the statuses H1 retries (408, 429, 500, 502, 503, 504) are failures of the
/// dependency; every other response is a success (a 404 says the server is up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByStatus;

impl<B, E> CallClassifier<Response<B>, E> for ByStatus {
    fn outcome(self, result: &Result<Response<B>, E>) -> CallOutcome {
        match result {
            Ok(response) if !retryable(response.status()) => CallOutcome::Success,
            _ => CallOutcome::Failure,
        }
    }
}
