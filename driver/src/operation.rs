//! What [`retry`](crate::retry) retries: anything that starts one attempt when asked.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Starts the attempts of an operation: each [`attempt`](Self::attempt) returns the future of
/// one new attempt.
///
/// Every closure `FnMut() -> impl Future` is an `Operation`, which is how `retry` is usually
/// called. Implement it on a type of your own when the retry's future must have a type you can
/// write down: a closure's type cannot be named, so a [`RetryFuture`](crate::RetryFuture) over
/// one cannot be stored in a struct field or returned as a tower `Service::Future` without a box.
///
/// ```
/// use std::future::{Ready, ready};
/// use std::time::Duration;
/// use persevere::{Backoff, RetryPolicy};
/// use persevere_driver::{Operation, RetryFuture, retry};
/// # #[derive(Clone, Copy)]
/// # struct Clock;
/// # impl persevere_driver::Runtime for Clock {
/// #     type Sleep = Ready<()>;
/// #     fn now(&self) -> persevere::Instant { persevere::Instant::ZERO }
/// #     fn sleep_until(&self, _: persevere::Instant) -> Self::Sleep { ready(()) }
/// # }
///
/// /// Fails until its third attempt.
/// struct ThirdTime(u32);
///
/// impl Operation for ThirdTime {
///     type Future = Ready<Result<u32, &'static str>>;
///     fn attempt(&mut self) -> Self::Future {
///         self.0 += 1;
///         ready(if self.0 < 3 { Err("busy") } else { Ok(self.0) })
///     }
/// }
///
/// /// A retry kept in a struct: its type is written out in full.
/// struct Pending<'p> {
///     retry: RetryFuture<Clock, &'p RetryPolicy, ThirdTime, Ready<Result<u32, &'static str>>, &'static str>,
/// }
///
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?;
/// let pending = Pending { retry: retry(Clock, &policy, ThirdTime(0)) };
/// let done = futures_lite::future::block_on(pending.retry);
/// assert_eq!(done.result, Ok(3));
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub trait Operation {
    /// The future of one attempt.
    type Future: Future;

    /// Starts one attempt.
    fn attempt(&mut self) -> Self::Future;
}

impl<F, Fut> Operation for F
where
    F: FnMut() -> Fut,
    Fut: Future,
{
    type Future = Fut;

    #[inline(always)]
    fn attempt(&mut self) -> Fut {
        self()
    }
}

/// Starts a new attempt of `op`, catching a panic raised while creating it (`None`).
#[inline(always)]
pub(crate) fn start_attempt<Op: Operation>(op: &mut Op) -> Option<Op::Future> {
    catch_unwind(AssertUnwindSafe(|| op.attempt())).ok()
}

/// Polls an attempt, catching a panic: its value, its error, or `Err(None)` if it panicked.
#[inline(always)]
pub(crate) fn poll_attempt<F, T, E>(attempt: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<Result<T, Option<E>>>
where
    F: Future<Output = Result<T, E>>,
{
    match catch_unwind(AssertUnwindSafe(|| attempt.poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(result)) => Poll::Ready(result.map_err(Some)),
        Err(_panic) => Poll::Ready(Err(None)),
    }
}
