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

/// Decides, for the [`RetryLayer`](crate::RetryLayer), whether a request may be sent again
/// and what each result of sending it says (T2).
///
/// Each call of the service works on its own clone of the classifier:
/// [`clone_request`](Self::clone_request) sees the request before it is first sent, and the
/// same value then [`classify`](Self::classify)s every result of that call, so a classifier
/// that needs something of the request (its method, a header) keeps it there.
pub trait ResponseClassifier<Req, Res, E>: Clone {
    /// A copy of `request` to send again, or why it can be sent only once (then the call is
    /// one attempt whatever its result, and the error says why).
    ///
    /// # Errors
    /// [`SentOnce`] when the request must not, or cannot, be sent twice.
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce>;

    /// What `result` is: `None` when it stands as it is (returned to the caller; for the
    /// layer's gates, an `Ok` is a success), or the kind of failure it is. A failed `Ok` (a
    /// 503 response) is retried like an error; if the retry gives up, the response is in the
    /// [`RetryError`](crate::RetryError). An `Err` classified `None` ends the call at once, as
    /// [`FailureKind::Fatal`] would.
    fn classify(&self, result: &Result<Res, E>) -> Option<FailureKind>;
}

/// The classifier for requests that are `Clone`: every error is retryable, every response a
/// success. The [`RetryLayer`](crate::RetryLayer)'s default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryErrors;

impl<Req: Clone, Res, E> ResponseClassifier<Req, Res, E> for RetryErrors {
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce> {
        Ok(request.clone())
    }

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
/// assert_eq!(ResponseClassifier::<&str, _, _>::classify(&classifier, &Ok(503)), Some(FailureKind::Retryable));
/// assert_eq!(ResponseClassifier::<&str, _, _>::classify(&classifier, &Ok(200)), None);
/// ```
pub fn classify_fn<Res, E, F>(classify: F) -> ClassifyFn<F>
where
    F: Fn(&Result<Res, E>) -> Option<FailureKind> + Clone,
{
    ClassifyFn(classify)
}

impl<Req: Clone, Res, E, F> ResponseClassifier<Req, Res, E> for ClassifyFn<F>
where
    F: Fn(&Result<Res, E>) -> Option<FailureKind> + Clone,
{
    fn clone_request(&mut self, request: &Req) -> Result<Req, SentOnce> {
        Ok(request.clone())
    }

    fn classify(&self, result: &Result<Res, E>) -> Option<FailureKind> {
        (self.0)(result)
    }
}
