//! # persevere-driver
//!
//! persevere's async driving loops, written once and generic over a tiny [`Runtime`] trait (a
//! clock and a timer). The tokio adapter (`persevere-tokio`), the smol adapter
//! (`persevere-smol`, which also runs under async-std's executor) and the simulator implement
//! `Runtime` and re-export what is here; they hold only what differs per executor.
//!
//! There is one loop per shape of work: a single operation ([`retry`], [`hedge`]), a fleet of
//! long-running tasks ([`Supervisor`]) and a registry of flows ([`Scheduler`]). Each drains its
//! core machine after every input, acting on each action in turn, and feeds back what happened.
//! All four turn the runtime's clock into their machine's [`Instant`](persevere::Instant)s the
//! same way, a stopwatch over the clock: running from the start (the supervisor, the scheduler,
//! a retry whose policy has a deadline or a budget), only while it sleeps (any other retry, so
//! that its success path reads no clock), or from its first wait (a hedge).
//!
//! What lives here, once:
//! - [`retry`] / [`RetryFuture`]: drains the core's [`persevere::Retry`] machine, sleeps until
//!   its timeouts (never for a zero delay), runs each attempt under its deadline, catches panics,
//!   classifies errors ([`Classify`], closures) and feeds the result back;
//! - [`hedge`] / [`HedgeFuture`]: drains the core's [`persevere::Hedge`] machine: several
//!   attempts in flight, a new one every delay while none has answered, the first success wins;
//! - [`Breaker`]: a shared circuit breaker over the core's [`persevere::Breaker`], with a
//!   lock-free closed path;
//! - [`Limiter`]: a shared adaptive concurrency limit over the core's [`persevere::Limiter`]
//!   (AIMD, Vegas, Gradient2): calls beyond it are shed with how long to wait;
//! - [`Budget`]: a shared retry budget (token bucket or ratio) that [`retry`] consults;
//! - [`retry_after`]: an HTTP `Retry-After` value as a [`persevere::Hint`];
//! - [`Supervisor`] + [`TaskSpec`]: long-running tasks restarted by policy (S1–S6), with
//!   lifecycle [`Events`] and a reliable [`TaskExit`] per task;
//! - [`Scheduler`] + [`SchedulerHandle`]: recurring flows (`every`, `cron`) that back off and
//!   trip (F1–F10), all driven by one timer loop over the core's [`persevere::Flows`] registry.
//!
//! Besides [`Runtime`], the supervisor and the scheduler need one more capability of an
//! executor, `Spawn`: start a future in the background. Cancellation, abort and outcomes are
//! done here, the same on every executor.
//!
//! # Features
//! `supervisor`, `scheduler` and `http` (`retry_after`) are on by default; `tracing` is off.
//! [`blocking::retry`] runs the same loop on the calling thread, for code that is not async.
//!
//! With `default-features = false`, only [`retry`], [`blocking`], [`Breaker`] and [`Budget`] are built, and
//! none of the supervisor's and scheduler's dependencies are compiled.
#![deny(missing_docs)]

pub mod blocking;
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
pub mod bounds;
mod breaker;
mod budget;
mod classify;
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
mod fault;
mod hedge;
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
mod job;
mod limiter;
mod listeners;
mod operation;
mod refusal;
mod retry;
#[cfg(feature = "http")]
mod retry_after;
mod runtime;
#[cfg(feature = "scheduler")]
mod scheduler;
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
mod signals;
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
mod spawn;
#[cfg(feature = "supervisor")]
mod supervisor;
mod sync;

pub use breaker::{Breaker, BreakerCall, ByResult, CallClassifier, CallError, boxed_error};
pub use budget::{Budget, BudgetRequest, BudgetTicket};
pub use classify::{ByTrait, Classifier, Classify, Notify, RetryAll, RetryEvent, RetryGate};
#[cfg(all(feature = "fault-injection", any(feature = "supervisor", feature = "scheduler")))]
#[doc(hidden)]
pub use fault::Fault;
pub use hedge::{HedgeFuture, Hedged, hedge};
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
pub use job::JobError;
pub use limiter::{ByCompletion, CompletionClassifier, Limiter, LimiterCall, LimiterGuard, ShedError};
pub use operation::Operation;
pub use persevere::BreakerEvent;
pub use persevere::Stats;
pub use refusal::{Gate, Refusal};
pub use retry::{GaveUp, Retried, RetryFuture, retry};
#[cfg(feature = "http")]
pub use retry_after::retry_after;
pub use runtime::{LazyEpoch, Runtime};
#[cfg(feature = "scheduler")]
pub use scheduler::{FlowChange, FlowTransition, Scheduler, SchedulerError, SchedulerHandle};
#[cfg(any(feature = "supervisor", feature = "scheduler"))]
pub use spawn::Spawn;
#[cfg(feature = "supervisor")]
pub use supervisor::{
    DEFAULT_EVENT_CAPACITY, EventCounts, Events, ShutdownReport, Supervisor, SupervisorBuilder, SupervisorError,
    SupervisorEvent, TaskExit, TaskHandle, TaskSpec,
};
