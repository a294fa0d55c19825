//! Request bodies that can be sent again (T2, H4).

use bytes::Bytes;

/// A request body that may be copied for a retry: [`try_clone`](Self::try_clone) returns a
/// copy, or `None` when the body cannot be sent twice (a stream), in which case the request is
/// sent once and the error says [`SentOnce::NotClonable`](crate::SentOnce::NotClonable).
///
/// Implemented for the buffered bodies of `http-body-util` (`Full`, `Empty`), for `Bytes`,
/// `String`, `Vec<u8>`, `&'static str` and `()`, for [`Buffered`](crate::Buffered) (what
/// [`BufferBodyLayer`](crate::BufferBodyLayer) makes of any body), and with the `reqwest`
/// feature for `reqwest::Body`; the boxed bodies (`BoxBody`, `UnsyncBoxBody`) cannot be
/// copied, and are sent once.
///
/// A body of a type you do not own (axum's `Body`, a `StreamBody`, hyper's `Incoming`) cannot
/// be given this trait here (the orphan rule): put [`BufferBodyLayer`](crate::BufferBodyLayer)
/// outside the retry layer, which buffers each body up to a limit (and sends a longer one
/// once). Implement it for a body type of your own that is sometimes buffered and sometimes a
/// stream.
#[diagnostic::on_unimplemented(
    message = "the request body `{Self}` cannot be copied for a retry: it does not implement `ReplayBody`",
    label = "the retry classifier needs a `ReplayBody` here",
    note = "put `BufferBodyLayer::new(max_bytes)` outside the retry layer: it buffers each body up to `max_bytes` so that it can be sent again (as `Buffered<{Self}>`), and sends a longer one once",
    note = "or implement `ReplayBody` for a body type of your own: `try_clone` returns `None` for a body that must be sent once"
)]
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
