//! What a supervised attempt or a scheduled run reports when it fails, and how panics in user
//! code are caught.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Why an attempt of a supervised task, or a run of a scheduled flow, failed: the error it
/// returned, or a panic the driver caught (rule S4). Stored by the core machines as their error
/// payload, so it appears in [`TaskOutcome`](persevere::TaskOutcome)s and in
/// [`FlowStatus`](persevere::FlowStatus).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum JobError<E> {
    /// The error the attempt or run returned.
    Error(E),
    /// It panicked (while being created, polled, or dropped after a timeout); the panic's
    /// message, or `"panic"` when the payload was not a string.
    Panicked(Arc<str>),
}

impl<E> JobError<E> {
    /// The returned error, if it was one.
    pub fn error(&self) -> Option<&E> {
        match self {
            JobError::Error(error) => Some(error),
            JobError::Panicked(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for JobError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Error(error) => error.fmt(f),
            JobError::Panicked(message) => write!(f, "panicked: {message}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for JobError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: Box<dyn Any + Send>) -> Arc<str> {
    if let Some(message) = payload.downcast_ref::<&'static str>() {
        Arc::from(*message)
    } else if let Some(message) = payload.downcast_ref::<String>() {
        Arc::from(message.as_str())
    } else {
        Arc::from("panic")
    }
}

/// Calls `make`, catching a panic.
pub(crate) fn catch_create<T>(make: impl FnOnce() -> T) -> Result<T, Arc<str>> {
    catch_unwind(AssertUnwindSafe(make)).map_err(panic_message)
}

/// Polls `future`, catching a panic (reported as `Ready(Err(message))`).
pub(crate) fn poll_caught<F: Future + ?Sized>(
    future: Pin<&mut F>,
    cx: &mut Context<'_>,
) -> Poll<Result<F::Output, Arc<str>>> {
    match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
        Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(payload) => Poll::Ready(Err(panic_message(payload))),
    }
}

/// Runs `drop_it` (a drop of user code), catching a panic.
#[cfg(feature = "supervisor")]
pub(crate) fn drop_caught(drop_it: impl FnOnce()) -> Option<Arc<str>> {
    catch_unwind(AssertUnwindSafe(drop_it)).err().map(panic_message)
}
