//! What the retry layer asks about each request and each result (T2).

use std::fmt;

use persevere::FailureKind;

/// Why a request was sent once and not retried (T2, H3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SentOnce {
    /// The request could not be copied (for example, its body is a stream), so it can be sent
    /// only once.
    NotClonable,
    /// The request's method is not idempotent (POST, PATCH, …) and the caller did not opt in
    /// to retrying it (H3).
    NotIdempotent,
}

impl fmt::Display for SentOnce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SentOnce::NotClonable => "the request could not be copied for a retry",
            SentOnce::NotIdempotent => "the request's method is not idempotent and retrying it was not allowed",
        })
    }
}

/// Decides, for the [`RetryLayer`](crate::RetryLayer) and the [`HedgeLayer`](crate::HedgeLayer),
/// whether a request may be sent again, and makes the copy (T2, H3): the request side of a
/// classifier, whose result side is [`ResponseClassifier`].
///
/// Each call of the service works on its own clone of the classifier:
/// [`clone_request`](Self::clone_request) sees the request before it is first sent, and the
/// same value then [`classify`](ResponseClassifier::classify)s every result of that call, so a
/// classifier that needs something of the request (its method, a header) keeps it there.
///
/// The layers classify with [`Http`](crate::Http) unless another classifier is chosen by name
/// (H4): requests of another type than `http::Request` (or `reqwest::Request`, with the
/// `reqwest` feature) need one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot copy a `{Req}` for a retry",
    label = "the retry layer's classifier must copy its requests",
    note = "the retry and hedge layers classify with `Http` (HTTP semantics, H1-H5) unless a classifier is chosen by name; `Http` copies `http::Request`s (the `http` feature) whose bodies implement `ReplayBody`, and `reqwest::Request`s (the `reqwest` feature)",
    note = "for requests of another type, choose a classifier by name: `.classify(RetryErrors)` retries every error and no response, `.classify(classify_fn(|result| ..))` decides from each result"
)]
pub trait ReplayRequest<Req>: Clone {
    /// A copy of `request` to send again, or why it can be sent only once (then the call is
    /// one attempt whatever its result, and the error says why).
    ///
    /// # Errors
    /// [`SentOnce`] when the request must not, or cannot, be sent twice.
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce>;
}

/// Says what each result of a call is, for the [`RetryLayer`](crate::RetryLayer) and the
/// [`HedgeLayer`](crate::HedgeLayer) (T2): the result side of a classifier, whose request side
/// is [`ReplayRequest`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify a `Result<{Res}, {E}>`",
    label = "the retry layer's classifier must classify the inner service's results",
    note = "the retry and hedge layers classify with `Http` unless a classifier is chosen by name; `Http` classifies `http::Response`s (the `http` feature) and `reqwest::Response`s (the `reqwest` feature)",
    note = "for results of other types, choose a classifier by name: `.classify(RetryErrors)` retries every error and no response, `.classify(classify_fn(|result| ..))` decides from each result"
)]
pub trait ResponseClassifier<Res, E>: Clone {
    /// What `result` is: `None` when it stands as it is (returned to the caller; for the
    /// layer's gates, an `Ok` is a success), or the kind of failure it is. A failed `Ok` (a
    /// 503 response) is retried like an error; if the retry gives up, the response is in the
    /// [`RetryError`](crate::RetryError). An `Err` classified `None` ends the call at once, as
    /// [`FailureKind::Fatal`] would.
    fn classify(&self, result: &Result<Res, E>) -> Option<FailureKind>;
}

/// The classifier for requests that are `Clone`: every error is retryable, every response a
/// success. Choose it by name for requests that are not HTTP requests:
/// `RetryLayer::new(policy).classify(RetryErrors)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryErrors;

impl<Req: Clone> ReplayRequest<Req> for RetryErrors {
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce> {
        Ok(request.clone())
    }
}

impl<Res, E> ResponseClassifier<Res, E> for RetryErrors {
    fn classify(&self, result: &Result<Res, E>) -> Option<FailureKind> {
        result.as_ref().err().map(|_| FailureKind::Retryable)
    }
}

/// A classifier made of a closure over the result, for requests that are `Clone`: see
/// [`classify_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F>(F);

impl<F> fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClassifyFn")
    }
}

/// A classifier that copies each request with `Clone` and classifies each result with
/// `classify`.
///
/// ```
/// use persevere::FailureKind;
/// use persevere_tower::{ResponseClassifier, classify_fn};
///
/// // Responses are status codes here: 503 is retried, like every error.
/// let classifier = classify_fn(|result: &Result<u16, std::io::Error>| match result {
///     Ok(503) | Err(_) => Some(FailureKind::Retryable),
///     Ok(_) => None,
/// });
/// assert_eq!(classifier.classify(&Ok(503)), Some(FailureKind::Retryable));
/// assert_eq!(classifier.classify(&Ok(200)), None);
/// ```
pub fn classify_fn<Res, E, F>(classify: F) -> ClassifyFn<F>
where
    F: Fn(&Result<Res, E>) -> Option<FailureKind> + Clone,
{
    ClassifyFn(classify)
}

impl<Req: Clone, F: Clone> ReplayRequest<Req> for ClassifyFn<F> {
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce> {
        Ok(request.clone())
    }
}

impl<Res, E, F> ResponseClassifier<Res, E> for ClassifyFn<F>
where
    F: Fn(&Result<Res, E>) -> Option<FailureKind> + Clone,
{
    fn classify(&self, result: &Result<Res, E>) -> Option<FailureKind> {
        (self.0)(result)
    }
}
