//! # persevere-driver
//!
//! The one async driving loop of persevere, written once and generic over a tiny [`Runtime`]
//! trait (a clock and a timer). The tokio adapter (`persevere-tokio`), the smol adapter
//! (`persevere-smol`, which also runs under async-std's executor) and the simulator implement
//! `Runtime` and re-export what is here; they hold only what differs per executor.
//!
//! What lives here, once:
//! - [`retry`] / [`RetryFuture`]: drains the core's [`persevere::Retry`] machine, sleeps until
//!   its timeouts (never for a zero delay), runs each attempt under its deadline, catches panics,
//!   classifies errors ([`Classify`], closures) and feeds the result back;
//! - [`Breaker`]: a shared circuit breaker over the core's [`persevere::Breaker`], with a
//!   lock-free closed path;
//! - [`Budget`]: a shared retry budget (token bucket or ratio) that [`retry`] consults;
//! - [`retry_after`]: an HTTP `Retry-After` value as a [`persevere::Hint`].
#![deny(missing_docs)]

mod breaker;
mod budget;
mod classify;
mod jitter_rng;
mod retry;
mod retry_after;
mod runtime;

pub use breaker::{Breaker, CallError};
pub use budget::Budget;
pub use classify::{ByTrait, Classifier, Classify, Notify, RetryAll, RetryEvent, RetryGate};
pub use retry::{GaveUp, Retried, RetryFuture, Stats, retry};
pub use retry_after::retry_after;
pub use runtime::{LazyEpoch, Runtime};
