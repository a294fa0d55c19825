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

use persevere::{Instant, RetryPolicy};
use persevere_driver::LazyEpoch;
pub use persevere_driver::{
    BreakerCall, ByResult, ByTrait, CallClassifier, CallError, Classifier, Classify, GaveUp, Notify, Retried, RetryAll,
    RetryEvent, RetryGate, Stats, retry_after,
};
pub use persevere_driver::{
    DEFAULT_EVENT_CAPACITY, EventCounts, Events, JobError, Runtime, SchedulerError, ShutdownReport, Spawn,
    SupervisorError, SupervisorEvent, TaskExit, TaskHandle, TaskSpec,
};

/// async-io's clock and timers. Its epoch is its first clock reading, taken lazily: creating
/// one costs nothing and reads no clock.
#[derive(Debug, Default)]
pub struct SmolRuntime {
    epoch: LazyEpoch,
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
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    persevere_driver::retry(SmolRuntime::new(), policy, op)
}

/// A circuit breaker shared by many tasks (cheap to clone), on this runtime's clock.
/// See [`persevere_driver::Breaker`].
pub type Breaker = persevere_driver::Breaker<SmolRuntime>;

/// A retry budget shared by many operations (cheap to clone), on this runtime's clock.
/// Build one with `Budget::tokens(SmolRuntime::new(), policy)` or `Budget::ratio(..)`; attach it with
/// `retry(..).gate(budget.clone())`. See [`persevere_driver::Budget`].
pub type Budget = persevere_driver::Budget<SmolRuntime>;

/// Spawns the supervisor's tasks and the scheduler's runs: on smol's global executor (the
/// default; it runs its own threads, so this works under async-std's executor too), or on a
/// given `smol::Executor`.
#[derive(Clone, Debug, Default)]
pub struct SmolSpawn {
    executor: Option<std::sync::Arc<smol::Executor<'static>>>,
}

impl SmolSpawn {
    /// Spawns with `smol::spawn` on smol's global executor.
    pub const fn global() -> Self {
        SmolSpawn { executor: None }
    }

    /// Spawns on `executor` (someone must run it).
    pub const fn on(executor: std::sync::Arc<smol::Executor<'static>>) -> Self {
        SmolSpawn { executor: Some(executor) }
    }
}

impl Spawn for SmolSpawn {
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // A detached task runs to its end; the driver cancels and reports by itself.
        match &self.executor {
            Some(executor) => executor.spawn(future).detach(),
            None => smol::spawn(future).detach(),
        }
    }
}

/// [`persevere_driver::Supervisor`] on smol: `Supervisor::new(TaskDefaults::new())`.
pub type Supervisor<K, E> = persevere_driver::Supervisor<SmolRuntime, SmolSpawn, K, E>;

/// [`persevere_driver::SupervisorBuilder`] on smol.
pub type SupervisorBuilder = persevere_driver::SupervisorBuilder<SmolRuntime, SmolSpawn>;

/// [`persevere_driver::Scheduler`] on smol: `Scheduler::new()`.
pub type Scheduler<K, E> = persevere_driver::Scheduler<SmolRuntime, SmolSpawn, K, E>;

/// [`persevere_driver::SchedulerHandle`] on smol.
pub type SchedulerHandle<K, E> = persevere_driver::SchedulerHandle<SmolRuntime, SmolSpawn, K, E>;
