//! The one capability the supervisor and the scheduler need from an executor besides a clock:
//! running a future in the background.

use std::future::Future;

/// Runs a future in the background, detached.
///
/// That is all the [`Supervisor`](crate::Supervisor) and the [`Scheduler`](crate::Scheduler)
/// ask of an executor. Cancellation, abort and the final outcome of each task are handled by
/// the driver itself (a shared flag that the spawned future watches, and a one-shot slot that
/// its drop guard fills), so they behave the same on every executor: an executor only has to
/// poll the future, and drop it if it shuts down.
///
/// `persevere-tokio` implements it with `tokio::spawn` (and for a `tokio::runtime::Handle`);
/// `persevere-smol` on its own global `async_executor::Executor` or a given one. For any other executor, a
/// one-line implementation:
///
/// ```
/// use std::future::Future;
/// use persevere_driver::Spawn;
///
/// /// Spawns a thread per future (for illustration only).
/// #[derive(Clone, Copy, Default)]
/// struct ThreadPerTask;
///
/// impl Spawn for ThreadPerTask {
///     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
///         std::thread::spawn(move || futures_lite::future::block_on(future));
///     }
/// }
/// ```
pub trait Spawn: Send + Sync + 'static {
    /// Starts `future` in the background; its handle, if the executor has one, is dropped
    /// (detached). The scheduler calls it while it holds its registry lock, so it must hand the
    /// future over and return, never poll it to completion inline.
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static;
}

impl<S: Spawn> Spawn for std::sync::Arc<S> {
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        (**self).spawn(future)
    }
}
