//! # persevere-tokio
//!
//! persevere's retry, breaker and budget on tokio. The driving loop lives once in
//! [`persevere_driver`]; this crate supplies tokio's clock and timers ([`TokioRuntime`]) and the
//! same public names as `persevere-smol`.
//!
//! ```
//! use std::time::Duration;
//! use persevere::{Backoff, RetryPolicy};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(500), 2.0).build()?)
//!     .max_attempts(3)
//!     .build()?;
//! let mut calls = 0;
//! let done = persevere_tokio::retry(&policy, || {
//!     calls += 1;
//!     let n = calls;
//!     async move { if n < 3 { Err("flaky") } else { Ok(n) } }
//! })
//! .await;
//! assert_eq!(done.result, Ok(3));
//! assert_eq!(done.stats.attempts, 3);
//! assert_eq!(done.stats.slept, Duration::from_millis(1_500));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::borrow::Borrow;
use std::future::Future;
use std::time::Duration;

use persevere::{HedgePolicy, Instant, RetryPolicy};
use persevere_driver::LazyEpoch;
pub use persevere_driver::Runtime;
#[cfg(feature = "http")]
pub use persevere_driver::retry_after;
pub use persevere_driver::{
    BreakerCall, BreakerEvent, BudgetRequest, BudgetTicket, ByCompletion, ByResult, ByTrait, CallClassifier, CallError,
    Classifier, Classify, CompletionClassifier, GaveUp, Hedged, LimiterCall, LimiterGuard, Notify, Operation, Retried,
    RetryAll, RetryEvent, RetryGate, ShedError, Stats,
};
#[cfg(feature = "supervisor")]
pub use persevere_driver::{
    DEFAULT_EVENT_CAPACITY, EventCounts, Events, ShutdownReport, SupervisorError, SupervisorEvent, TaskExit,
    TaskHandle, TaskSpec,
};
#[cfg(feature = "scheduler")]
pub use persevere_driver::{FlowChange, FlowTransition, SchedulerError};
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
pub use persevere_driver::{JobError, Spawn};

/// How far ahead an instant beyond the clock's range is put (about 30 years, as tokio does).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// tokio's clock and timers. Its epoch is its first clock reading, taken lazily: creating one
/// costs nothing and reads no clock. Honours tokio's paused time (`start_paused`,
/// `tokio::time::pause`).
#[derive(Debug, Default)]
pub struct TokioRuntime {
    epoch: LazyEpoch,
}

/// A clone is a new runtime, as [`new`](Self::new) makes: it reads no clock and copies nothing,
/// and its epoch is its own first reading, so an [`Instant`] of one means nothing to the other.
impl Clone for TokioRuntime {
    fn clone(&self) -> Self {
        TokioRuntime::new()
    }
}

impl TokioRuntime {
    /// A runtime whose epoch is set by its first clock reading.
    pub const fn new() -> Self {
        TokioRuntime { epoch: LazyEpoch::new() }
    }
}

impl persevere_driver::Runtime for TokioRuntime {
    type Sleep = tokio::time::Sleep;

    fn now(&self) -> Instant {
        self.epoch.instant(|| tokio::time::Instant::now().into_std())
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        match self.epoch.to_std(deadline) {
            Some(at) => tokio::time::sleep_until(at.into()),
            // Beyond the clock's range: as good as never (tokio's own "far future").
            None => tokio::time::sleep(FAR_FUTURE),
        }
    }
}

/// The future returned by [`retry`] on tokio.
pub type RetryFuture<P, Op, Fut, E, C = RetryAll, N = (), G = (), S = std::future::Pending<()>> =
    persevere_driver::RetryFuture<TokioRuntime, P, Op, Fut, E, C, N, G, S>;

/// Retries `op` under `policy` on tokio's timers: every error is retried unless classified
/// otherwise (see [`persevere_driver::RetryFuture`] for `.classify`, `.notify`, `.gate`,
/// `.cancel_on`, `.seed`).
pub fn retry<P, Op, Fut, T, E>(policy: P, op: Op) -> RetryFuture<P, Op, Fut, E>
where
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    persevere_driver::retry(TokioRuntime::new(), policy, op)
}

/// The future returned by [`hedge`] on this runtime.
pub type HedgeFuture<P, Op, Fut, E, C = RetryAll, G = ()> =
    persevere_driver::HedgeFuture<TokioRuntime, P, Op, Fut, E, C, G>;

/// Hedges `op` under `policy` on tokio's timers: attempt 1 at once, another every `policy.delay()`
/// while none has answered, the first success wins and the others are dropped (see
/// [`persevere_driver::HedgeFuture`] for `.classify` and `.gate`).
pub fn hedge<P, Op, Fut, T, E>(policy: P, op: Op) -> HedgeFuture<P, Op, Fut, E>
where
    P: Borrow<HedgePolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    persevere_driver::hedge(TokioRuntime::new(), policy, op)
}

/// A circuit breaker shared by many tasks (cheap to clone), on this runtime's clock.
/// See [`persevere_driver::Breaker`].
pub type Breaker = persevere_driver::Breaker<TokioRuntime>;

/// A retry budget shared by many operations (cheap to clone), on this runtime's clock.
/// Build one with `Budget::tokens(TokioRuntime::new(), policy)` or `Budget::ratio(..)`; attach it with
/// `retry(..).gate(budget.clone())`. See [`persevere_driver::Budget`].
pub type Budget = persevere_driver::Budget<TokioRuntime>;

/// An adaptive concurrency limit shared by many tasks (cheap to clone), on this runtime's
/// clock: `Limiter::new(LimiterPolicy::vegas())`. See [`persevere_driver::Limiter`].
pub type Limiter = persevere_driver::Limiter<TokioRuntime>;

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
/// Spawns the supervisor's tasks and the scheduler's runs on tokio.
///
/// The default spawns on the runtime current when it is created (so a supervisor or scheduler
/// made inside a runtime can be driven from any thread, e.g. `trigger` from a plain thread), or
/// with `tokio::spawn` at each spawn when it was created outside one.
#[derive(Clone, Debug)]
pub struct TokioSpawn {
    handle: Option<tokio::runtime::Handle>,
}

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
impl Default for TokioSpawn {
    fn default() -> Self {
        TokioSpawn { handle: tokio::runtime::Handle::try_current().ok() }
    }
}

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
impl TokioSpawn {
    /// Spawns with `tokio::spawn` on the runtime current at each spawn (panics outside one).
    pub const fn current() -> Self {
        TokioSpawn { handle: None }
    }

    /// Spawns on the runtime of `handle`, from anywhere.
    pub const fn on(handle: tokio::runtime::Handle) -> Self {
        TokioSpawn { handle: Some(handle) }
    }
}

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
impl Spawn for TokioSpawn {
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Dropping a `JoinHandle` detaches the task; the driver cancels and reports by itself.
        drop(match &self.handle {
            Some(handle) => handle.spawn(future),
            None => tokio::spawn(future),
        });
    }
}

#[cfg(feature = "supervisor")]
/// [`persevere_driver::Supervisor`] on tokio: `Supervisor::new(TaskDefaults::new())`.
pub type Supervisor<K, E> = persevere_driver::Supervisor<TokioRuntime, TokioSpawn, K, E>;

#[cfg(feature = "supervisor")]
/// [`persevere_driver::SupervisorBuilder`] on tokio.
pub type SupervisorBuilder = persevere_driver::SupervisorBuilder<TokioRuntime, TokioSpawn>;

#[cfg(feature = "scheduler")]
/// [`persevere_driver::Scheduler`] on tokio: `Scheduler::new()`.
pub type Scheduler<K, E> = persevere_driver::Scheduler<TokioRuntime, TokioSpawn, K, E>;

#[cfg(feature = "scheduler")]
/// [`persevere_driver::SchedulerHandle`] on tokio.
pub type SchedulerHandle<K, E> = persevere_driver::SchedulerHandle<TokioRuntime, TokioSpawn, K, E>;
