//! Retrying code that is not async (a CLI, a build script, a sync client, a thread pool) on
//! the calling thread, driven by the same loop as [`retry`](crate::retry).
//!
//! [`retry`] returns the driver's own [`RetryFuture`], so every option is the same
//! (`classify`, `notify`, `gate`, `seed`, `measure_elapsed`) and so is the result
//! ([`Retried`], with the same [`Stats`](crate::Stats)); [`RetryFuture::wait`] runs it on the
//! calling thread. Its runtime is [`ThreadClock`]: `std::time::Instant` for the clock, and a
//! sleep that blocks the thread (`std::thread::sleep`) when the loop waits on it.
//!
//! ```
//! use std::time::Duration;
//! use persevere::{Backoff, RetryPolicy};
//! use persevere_driver::blocking;
//!
//! let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build()?).max_attempts(3).build()?;
//! let mut calls = 0;
//! let done = blocking::retry(&policy, || {
//!     calls += 1;
//!     if calls < 3 { Err("busy") } else { Ok(calls) }
//! })
//! .notify(|e| println!("retry {} in {:?}", e.next_attempt, e.delay))
//! .wait();
//! assert_eq!(done.result, Ok(3));
//! assert_eq!(done.stats.attempts, 3);
//! assert!(done.stats.slept >= Duration::from_millis(2));
//! # Ok::<(), persevere::PolicyError>(())
//! ```
//!
//! An attempt is a plain call and cannot be interrupted: with an
//! [`attempt_timeout`](persevere::RetryPolicyBuilder::attempt_timeout), a call that returns
//! after its deadline still counts with what it returned. A total budget is honoured between
//! attempts (no sleep ends and no attempt starts past it).

use std::borrow::Borrow;
use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use persevere::{Instant, RetryPolicy};

use crate::classify::{Classifier, Notify, RetryGate};
use crate::operation::Operation;
use crate::retry::{Retried, RetryFuture};
use crate::runtime::{LazyEpoch, Runtime};

/// A [`Runtime`] whose sleeps block the calling thread when the loop waits on them: what
/// [`RetryFuture::wait`] needs. A runtime that implements it must complete every sleep the
/// first time it is polled (having blocked until its deadline, or moved its own clock there).
pub trait Blocking: Runtime {}

impl<R: Blocking + ?Sized> Blocking for &R {}

/// The clock and sleep of a blocking retry: `std::time::Instant` and `std::thread::sleep`.
/// Its epoch is its first clock reading, taken lazily: a retry whose policy needs no clock and
/// whose first attempt succeeds reads none.
#[derive(Debug, Default)]
pub struct ThreadClock {
    epoch: LazyEpoch,
}

impl ThreadClock {
    /// A clock whose epoch is set by its first reading.
    pub const fn new() -> Self {
        ThreadClock { epoch: LazyEpoch::new() }
    }
}

/// A sleep of the [`ThreadClock`]: blocks the thread until its deadline when polled.
#[derive(Debug)]
pub struct ThreadSleep {
    until: Option<std::time::Instant>,
}

impl Future for ThreadSleep {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if let Some(until) = self.until {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if !left.is_zero() {
                thread::sleep(left);
            }
        }
        Poll::Ready(())
    }
}

impl Runtime for ThreadClock {
    type Sleep = ThreadSleep;

    fn now(&self) -> Instant {
        self.epoch.instant(std::time::Instant::now)
    }

    fn sleep_until(&self, deadline: Instant) -> ThreadSleep {
        // The loop reads the clock before it sleeps, so the epoch is fixed; an instant beyond
        // the platform's range sleeps for ever, as it asks.
        let until = self.epoch.to_std(deadline).or_else(|| {
            let far = std::time::Duration::from_secs(86_400 * 365 * 30);
            std::time::Instant::now().checked_add(far)
        });
        ThreadSleep { until }
    }
}

impl Blocking for ThreadClock {}

/// A plain function as an [`Operation`]: each attempt is one call, whose result is ready at
/// once.
#[derive(Debug)]
pub struct Call<F>(F);

impl<F, T, E> Operation for Call<F>
where
    F: FnMut() -> Result<T, E>,
{
    type Future = Ready<Result<T, E>>;

    #[inline]
    fn attempt(&mut self) -> Self::Future {
        ready((self.0)())
    }
}

/// The retry of a plain function on the calling thread, as [`retry`] returns it.
pub type BlockingRetry<P, F, T, E> = RetryFuture<ThreadClock, P, Call<F>, Ready<Result<T, E>>, E>;

/// Retries `op` under `policy` on the calling thread: configure it as any [`RetryFuture`], then
/// call [`wait`](RetryFuture::wait). Every error is retried unless a classifier says otherwise.
pub fn retry<P, F, T, E>(policy: P, op: F) -> BlockingRetry<P, F, T, E>
where
    P: Borrow<RetryPolicy>,
    F: FnMut() -> Result<T, E>,
{
    retry_on(ThreadClock::new(), policy, op)
}

/// [`retry`] on another [`Blocking`] runtime (a fake clock in tests).
pub fn retry_on<Rt, P, F, T, E>(runtime: Rt, policy: P, op: F) -> RetryFuture<Rt, P, Call<F>, Ready<Result<T, E>>, E>
where
    Rt: Blocking,
    P: Borrow<RetryPolicy>,
    F: FnMut() -> Result<T, E>,
{
    crate::retry(runtime, policy, Call(op))
}

/// Wakes the thread that waits on a future.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl<Rt, P, Op, Fut, T, E, C, N, G, S> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S>
where
    Rt: Blocking,
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    /// Runs the retry on the calling thread until it ends: attempts are called in turn, and
    /// the sleeps between them block the thread.
    pub fn wait(self) -> Retried<T, E> {
        let mut future = pin!(self);
        // A retry of plain calls is never pending: polled with a no-op waker, it allocates
        // nothing. An attempt that is pending (an async operation on a blocking runtime) is
        // polled again with a waker that unparks this thread, and the thread parks until then.
        if let Poll::Ready(done) = future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return done;
        }
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        loop {
            if let Poll::Ready(done) = future.as_mut().poll(&mut Context::from_waker(&waker)) {
                return done;
            }
            thread::park();
        }
    }
}
