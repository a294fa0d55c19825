//! HTTP semantics for the layers (H1–H6), on the `http` 1.x types that hyper, axum and tonic
//! share, and with the `reqwest` feature on reqwest's own.

#[cfg(feature = "http")]
use std::time::{Duration, SystemTime};

#[cfg(feature = "http")]
use http::header::{HeaderMap, HeaderName, RETRY_AFTER};
#[cfg(feature = "http")]
use http::{Method, Request, Response, StatusCode, Uri};
#[cfg(feature = "http")]
use persevere::{CallOutcome, FailureKind, Hint};
#[cfg(feature = "http")]
use persevere_driver::{CallClassifier, retry_after};

#[cfg(feature = "http")]
use crate::classify::{ReplayRequest, ResponseClassifier, SentOnce};
#[cfg(feature = "http")]
use crate::replay::ReplayBody;

/// HTTP semantics: the classifier the [`RetryLayer`](crate::RetryLayer) and the
/// [`HedgeLayer`](crate::HedgeLayer) use unless another is chosen by name with their
/// `classify` (H4). It classifies `http::Request`s and `http::Response`s with the `http`
/// feature (on by default), and `reqwest::Request`s and `reqwest::Response`s with the
/// `reqwest` feature (H6).
///
/// - **H1**: an error of the inner service (no response: the connection was refused or reset,
///   or the request timed out) and the statuses 408, 425, 429, 500, 502, 503 and 504 are
///   retryable; every other response stands and is returned as it is.
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
/// - **H5**: a client error that waiting cannot heal is not retried (below).
///
/// A request is copied for retries with its method, URI, version, headers, extensions and a
/// [`ReplayBody`] copy of its body; a request that cannot be copied is sent once. A call whose
/// request was sent once and failed ends [`Exhausted`](persevere::OutcomeKind::Exhausted):
/// one attempt was all it had; [`RetryError::sent_once`](crate::RetryError::sent_once) says
/// why, and [`class`](crate::RetryError::class) is its failure's own class.
///
/// # `Retry-After: 0`
///
/// A hint takes the place of the policy's backoff for the retry it precedes (B6), so a
/// `Retry-After: 0` (or an HTTP-date already past) is retried at once, with no delay at all: a
/// server that answers every attempt so gets them back to back, four attempts within a few
/// milliseconds however long the backoff. When that is not wanted, set a floor with
/// [`min_retry_after`](Self::min_retry_after): a hint shorter than it waits the floor
/// instead, and a longer one is still waited in full.
///
/// # Client errors that cannot heal (H5)
///
/// Waiting does not change the request, so an answer about the request itself is final:
///
/// - Every 4xx status but 408 (the server timed out waiting: send it again), 425 (too early:
///   send it again outside TLS early data, RFC 8470) and 429 (too many requests) stands:
///   400 and 422 (malformed or invalid), 401, 403 and 407 (credentials), 404 and 410 (no such
///   resource), 405 (method), 406 and 415 (content types), 409, 412 and 428 (the resource's
///   state or preconditions), 411, 413, 414 and 431 (lengths and sizes: a 413 is not retried
///   even with a `Retry-After`, which only 429 and 503 carry as a hint, H2), 416, 417, 421
///   (misdirected: another connection is needed, which the layer cannot choose), 426 and 451.
///   So do 501 (not implemented) and 505 (version not supported).
/// - An error for a request whose URI has no scheme or no authority (a relative URI: a client
///   has nowhere to send it) is [`Fatal`](FailureKind::Fatal): it fails alike every time.
/// - With the `reqwest` feature, reqwest's errors for an invalid request (`is_builder`: a URL
///   the client cannot use, such as `https://` on a client built without TLS) and for a
///   redirect loop or too many redirects (`is_redirect`) are `Fatal`, also when they reach
///   the retry layer inside a `BoxError` (a `TimeoutLayer` inside) or a
///   [`CallError`](crate::CallError) (a [`BreakerLayer`](crate::BreakerLayer) inside).
/// - Other errors are retried as connection failures: hyper-util's client tells an invalid
///   request from a failed connection only in its message, and TLS stacks refuse a certificate
///   with errors of their own types. Choose a classifier of your own to stop on them.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use persevere::FailureKind;
/// use persevere_tower::{Http, ReplayRequest, ResponseClassifier, SentOnce};
///
/// let mut http = Http::new();
/// let post = Request::post("http://example.com/orders").body(String::new())?;
/// assert_eq!(http.clone_request(&post).err(), Some(SentOnce::NotIdempotent));
///
/// let unavailable = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).header("retry-after", "2").body(())?;
/// let kind = ResponseClassifier::<_, ()>::classify(&http, &Ok(unavailable));
/// assert_eq!(kind, Some(FailureKind::Hinted(persevere::Hint::After(Duration::from_secs(2)))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Http {
    retry_non_idempotent: bool,
    #[cfg(feature = "http")]
    min_retry_after: Duration,
    /// `None` for [`IDEMPOTENCY_KEY`]: the default costs nothing to clone (a custom
    /// `HeaderName` is reference-counted bytes, and each call clones the classifier).
    #[cfg(feature = "http")]
    idempotency_header: Option<HeaderName>,
    /// Set by `clone_request` on the clone that classifies one call: its request has no
    /// scheme or no authority, so an error for it cannot heal (H5).
    #[cfg(feature = "http")]
    unroutable: bool,
}

impl Default for Http {
    fn default() -> Self {
        Http::new()
    }
}

impl Http {
    /// H1–H5 as listed above.
    pub fn new() -> Self {
        Http {
            retry_non_idempotent: false,
            #[cfg(feature = "http")]
            min_retry_after: Duration::ZERO,
            #[cfg(feature = "http")]
            idempotency_header: None,
            #[cfg(feature = "http")]
            unroutable: false,
        }
    }

    /// Retries requests of every method, idempotent or not (H3's opt-in for all requests).
    pub fn retry_non_idempotent(mut self) -> Self {
        self.retry_non_idempotent = true;
        self
    }

    /// Waits at least `floor` for a `Retry-After` hint: a shorter one (a `Retry-After: 0`)
    /// waits `floor`, a longer one is waited in full. Zero by default: a hint replaces the
    /// backoff whatever it says.
    #[cfg(feature = "http")]
    pub fn min_retry_after(mut self, floor: Duration) -> Self {
        self.min_retry_after = floor;
        self
    }

    /// The header whose presence allows a non-idempotent request to be retried
    /// ([`IDEMPOTENCY_KEY`] by default).
    #[cfg(feature = "http")]
    pub fn idempotency_header(mut self, header: HeaderName) -> Self {
        self.idempotency_header = Some(header);
        self
    }
}

/// The header that, present on a request, allows a non-idempotent method to be retried (H3):
/// the server uses it to recognise a repeat.
#[cfg(feature = "http")]
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY_NAME);

#[cfg(feature = "http")]
const IDEMPOTENCY_KEY_NAME: &str = "idempotency-key";

#[cfg(feature = "http")]
impl Http {
    /// Whether a request with `method` and `headers` may be sent more than once (H3).
    pub(crate) fn may_repeat(&self, method: &Method, headers: &HeaderMap) -> bool {
        let idempotent = matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
        );
        let keyed = match &self.idempotency_header {
            Some(header) => headers.contains_key(header),
            None => headers.contains_key(IDEMPOTENCY_KEY_NAME),
        };
        idempotent || self.retry_non_idempotent || keyed
    }

    /// Notes, for the call this clone classifies, whether its request has anywhere to go (H5).
    fn note_target(&mut self, uri: &Uri) {
        self.unroutable = uri.scheme().is_none() || uri.authority().is_none();
    }

    /// What a response with `status` and `headers` is (H1, H2, H5).
    pub(crate) fn classify_status(&self, status: StatusCode, headers: &HeaderMap) -> Option<FailureKind> {
        // 425 (too early, RFC 8470) heals when sent again outside TLS early data.
        if !retryable(status) && status.as_u16() != 425 {
            return None;
        }
        let overloaded = matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE);
        let hint = overloaded
            .then(|| headers.get(RETRY_AFTER)?.to_str().ok())
            .flatten()
            .and_then(|value| retry_after(value, SystemTime::now()))
            .map(|hint| match hint {
                Hint::After(delay) => Hint::After(delay.max(self.min_retry_after)),
                other => other,
            });
        // An overloaded server that gave no (readable) hint is throttling: retried by the
        // schedule, and charged as throttling by a budget.
        let unhinted = if overloaded { FailureKind::Throttled } else { FailureKind::Retryable };
        Some(hint.map_or(unhinted, FailureKind::Hinted))
    }

    /// What an error of the inner service is: retryable as a connection failure, unless it
    /// cannot heal (H5).
    pub(crate) fn classify_error<E: 'static>(&self, error: &E) -> FailureKind {
        if self.unroutable || cannot_heal(error) { FailureKind::Fatal } else { FailureKind::Retryable }
    }
}

/// Whether `error` is one of those H5 knows cannot heal: reqwest's (H6).
#[cfg(feature = "http")]
fn cannot_heal<E: 'static>(error: &E) -> bool {
    #[cfg(feature = "reqwest")]
    return crate::reqwest::cannot_heal(error);
    #[cfg(not(feature = "reqwest"))]
    {
        let _ = error;
        false
    }
}

/// Whether `status` is one H1 names: 408, 429, 500, 502, 503, 504.
#[cfg(feature = "http")]
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

#[cfg(feature = "http")]
impl<B: ReplayBody> ReplayRequest<Request<B>> for Http {
    fn clone_request(&mut self, request: &Request<B>) -> Result<Request<B>, SentOnce> {
        self.note_target(request.uri());
        if !self.may_repeat(request.method(), request.headers()) {
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
}

#[cfg(feature = "http")]
impl<ResB, E: 'static> ResponseClassifier<Response<ResB>, E> for Http {
    fn classify(&self, result: &Result<Response<ResB>, E>) -> Option<FailureKind> {
        match result {
            Ok(response) => self.classify_status(response.status(), response.headers()),
            Err(error) => Some(self.classify_error(error)),
        }
    }
}

/// What an HTTP call means for a [`BreakerLayer`](crate::BreakerLayer): an error (no
/// response) and the statuses H1 retries (408, 429, 500, 502, 503, 504) are failures of the
/// dependency; every other response is a success (a 404 says the server is up, and a 425 that
/// the request came too early, not that the server is down).
#[cfg(feature = "http")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByStatus;

#[cfg(feature = "http")]
impl ByStatus {
    /// The outcome of a call that answered `status`.
    pub(crate) fn of_status(status: StatusCode) -> CallOutcome {
        if retryable(status) { CallOutcome::Failure } else { CallOutcome::Success }
    }
}

#[cfg(feature = "http")]
impl<B, E> CallClassifier<Response<B>, E> for ByStatus {
    fn outcome(self, result: &Result<Response<B>, E>) -> CallOutcome {
        match result {
            Ok(response) => ByStatus::of_status(response.status()),
            Err(_) => CallOutcome::Failure,
        }
    }
}
