//! # persevere-smol
//!
//! persevere's retry, breaker and budget on smol. Timers come from `async-io`, so everything
//! here also runs under async-std's executor (async-std is itself built on async-io). The driving
//! loop lives once in [`persevere_driver`]; this crate supplies the clock and timers
//! ([`SmolRuntime`]) and the same public names as `persevere-tokio`.
//!
//! ```
//! use std::time::Duration;
//! use persevere::{Backoff, RetryPolicy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(2)).build()?)
//!     .max_attempts(3)
//!     .build()?;
//! let mut calls = 0;
//! let done = smol::block_on(persevere_smol::retry(&policy, || {
//!     calls += 1;
//!     let n = calls;
//!     async move { if n < 3 { Err("flaky") } else { Ok(n) } }
//! }));
//! assert_eq!(done.result, Ok(3));
//! assert_eq!(done.stats.attempts, 3);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::borrow::Borrow;
use std::future::Future;

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

/// async-io's clock and timers. Its epoch is its first clock reading, taken lazily: creating
/// one costs nothing and reads no clock.
#[derive(Debug, Default)]
pub struct SmolRuntime {
    epoch: LazyEpoch,
}

/// A clone is a new runtime, as [`new`](Self::new) makes: it reads no clock and copies nothing,
/// and its epoch is its own first reading, so an [`Instant`] of one means nothing to the other.
impl Clone for SmolRuntime {
    fn clone(&self) -> Self {
        SmolRuntime::new()
    }
}

impl SmolRuntime {
    /// A runtime whose epoch is set by its first clock reading.
    pub const fn new() -> Self {
        SmolRuntime { epoch: LazyEpoch::new() }
    }
}

impl persevere_driver::Runtime for SmolRuntime {
    type Sleep = async_io::Timer;

    fn now(&self) -> Instant {
        self.epoch.instant(std::time::Instant::now)
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        match self.epoch.to_std(deadline) {
            Some(at) => async_io::Timer::at(at),
            None => async_io::Timer::never(),
        }
    }
}

/// The future returned by [`retry`] on smol.
pub type RetryFuture<P, Op, Fut, E, C = RetryAll, N = (), G = (), S = std::future::Pending<()>> =
    persevere_driver::RetryFuture<SmolRuntime, P, Op, Fut, E, C, N, G, S>;

/// Retries `op` under `policy` on async-io's timers: every error is retried unless classified
/// otherwise (see [`persevere_driver::RetryFuture`] for `.classify`, `.notify`, `.gate`,
/// `.cancel_on`, `.seed`).
pub fn retry<P, Op, Fut, T, E>(policy: P, op: Op) -> RetryFuture<P, Op, Fut, E>
where
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    persevere_driver::retry(SmolRuntime::new(), policy, op)
}

/// The future returned by [`hedge`] on this runtime.
pub type HedgeFuture<P, Op, Fut, E, C = RetryAll, G = ()> =
    persevere_driver::HedgeFuture<SmolRuntime, P, Op, Fut, E, C, G>;

/// Hedges `op` under `policy` on async-io's timers: attempt 1 at once, another every `policy.delay()`
/// while none has answered, the first success wins and the others are dropped (see
/// [`persevere_driver::HedgeFuture`] for `.classify` and `.gate`).
pub fn hedge<P, Op, Fut, T, E>(policy: P, op: Op) -> HedgeFuture<P, Op, Fut, E>
where
    P: Borrow<HedgePolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    persevere_driver::hedge(SmolRuntime::new(), policy, op)
}

/// A circuit breaker shared by many tasks (cheap to clone), on this runtime's clock.
/// See [`persevere_driver::Breaker`].
pub type Breaker = persevere_driver::Breaker<SmolRuntime>;

/// A retry budget shared by many operations (cheap to clone), on this runtime's clock.
/// Build one with `Budget::tokens(SmolRuntime::new(), policy)` or `Budget::ratio(..)`; attach it with
/// `retry(..).gate(budget.clone())`. See [`persevere_driver::Budget`].
pub type Budget = persevere_driver::Budget<SmolRuntime>;

/// An adaptive concurrency limit shared by many tasks (cheap to clone), on this runtime's
/// clock: `Limiter::new(LimiterPolicy::vegas())`. See [`persevere_driver::Limiter`].
pub type Limiter = persevere_driver::Limiter<SmolRuntime>;

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
/// Spawns the supervisor's tasks and the scheduler's runs: on persevere's own global executor
/// (the default), or on a given executor (`smol::Executor` is `async_executor::Executor`).
///
/// The global executor is one `async_executor::Executor` run by one background thread named
/// `persevere-smol`, started at the first spawn; because it runs on its own thread, the
/// supervisor and the scheduler work under smol's and async-std's executors alike. To run the
/// tasks on threads of your own, give your executor to [`on`](Self::on) and run it.
#[derive(Clone, Debug, Default)]
pub struct SmolSpawn {
    executor: Option<std::sync::Arc<async_executor::Executor<'static>>>,
}

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
impl SmolSpawn {
    /// Spawns on persevere's global executor (its thread starts at the first spawn).
    pub const fn global() -> Self {
        SmolSpawn { executor: None }
    }

    /// Spawns on `executor` (someone must run it).
    pub const fn on(executor: std::sync::Arc<async_executor::Executor<'static>>) -> Self {
        SmolSpawn { executor: Some(executor) }
    }
}

/// The executor behind [`SmolSpawn::global`], and the thread that runs it.
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
fn global_executor() -> &'static async_executor::Executor<'static> {
    static GLOBAL: std::sync::OnceLock<async_executor::Executor<'static>> = std::sync::OnceLock::new();
    GLOBAL.get_or_init(|| {
        // The thread waits for this initialisation to finish before it runs the executor.
        std::thread::Builder::new()
            .name("persevere-smol".into())
            .spawn(|| async_io::block_on(global_executor().run(std::future::pending::<()>())))
            .expect("persevere-smol: the operating system refused to start the executor's thread");
        async_executor::Executor::new()
    })
}

#[cfg(any(feature = "supervisor", feature = "scheduler"))]
impl Spawn for SmolSpawn {
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // A detached task runs to its end; the driver cancels and reports by itself.
        match &self.executor {
            Some(executor) => executor.spawn(future).detach(),
            None => global_executor().spawn(future).detach(),
        }
    }
}

#[cfg(feature = "supervisor")]
/// [`persevere_driver::Supervisor`] on smol: `Supervisor::new(TaskDefaults::new())`.
pub type Supervisor<K, E> = persevere_driver::Supervisor<SmolRuntime, SmolSpawn, K, E>;

#[cfg(feature = "supervisor")]
/// [`persevere_driver::SupervisorBuilder`] on smol.
pub type SupervisorBuilder = persevere_driver::SupervisorBuilder<SmolRuntime, SmolSpawn>;

#[cfg(feature = "scheduler")]
/// [`persevere_driver::Scheduler`] on smol: `Scheduler::new()`.
pub type Scheduler<K, E> = persevere_driver::Scheduler<SmolRuntime, SmolSpawn, K, E>;

#[cfg(feature = "scheduler")]
/// [`persevere_driver::SchedulerHandle`] on smol.
pub type SchedulerHandle<K, E> = persevere_driver::SchedulerHandle<SmolRuntime, SmolSpawn, K, E>;
