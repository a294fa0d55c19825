//! # persevere
//!
//! What happens after a failure — backoff, retry, trip, supervision restarts, redelivery —
//! decided by pure, deterministic state machines and driven by whatever runtime you have.
//!
//! The crate is `#![no_std]`, reads no clock, does no I/O, spawns nothing and allocates nothing.
//! Every machine follows the same shape (sans-IO):
//!
//! - **time is an argument**: every mutating call takes `now: `[`Instant`], a `u64` of
//!   nanoseconds from an epoch your driver chooses;
//! - **input** comes in through `handle_*` verbs, **output** goes out through
//!   `poll_action()` (drain until `None`) and `poll_timeout()` (when to call `handle_timeout`);
//! - **randomness** (jitter) comes from your RNG through the [`rand_core::Rng`] trait; if you
//!   have none, [`SplitMix64`] is a fast 8-byte one (you pick its seed: the core owns no entropy);
//! - **policies** ([`Backoff`], [`RetryPolicy`]) are validated once, immutable and shared;
//!   **state** ([`Retry`]) is small plain data you can clone, compare and persist (`serde`);
//! - **domain outcomes** (exhausted, out of time, …) are outputs; only caller mistakes are `Err`,
//!   and a refused input leaves the state exactly as it was.
//!
//! ## The run loop
//!
//! A complete driver for one retried operation, on a hand-moved clock:
//!
//! ```
//! use core::time::Duration;
//! use persevere::{Action, Backoff, Failure, Instant, Jitter, Outcome, Retry, RetryPolicy};
//! use rand_core::SeedableRng;
//!
//! let policy = RetryPolicy::builder(
//!     Backoff::exponential(Duration::from_millis(100), 2.0)
//!         .max_delay(Duration::from_secs(1))
//!         .jitter(Jitter::Equal)
//!         .build()?,
//! )
//! .max_attempts(5)
//! .build()?;
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
//! let mut retry = Retry::<&'static str>::new();
//! let mut now = Instant::ZERO;
//! let mut calls = 0;
//! let mut call = || { calls += 1; if calls < 3 { Err("busy") } else { Ok(()) } };
//!
//! retry.handle_start(&policy, now)?;
//! let (outcome, stats) = loop {
//!     match retry.poll_action() {
//!         Some(Action::Start { attempt, .. }) => match call() {
//!             Ok(()) => retry.handle_success(now, attempt)?,
//!             Err(e) => retry.handle_failure(&policy, now, attempt, Failure::retryable(e), &mut rng)?,
//!         },
//!         Some(Action::Sleep { .. }) | Some(Action::Abandon { .. }) => {}
//!         Some(Action::Finish { outcome, stats }) => break (outcome, stats),
//!         None => {
//!             // Nothing to do until the next timeout: "sleep" until then.
//!             now = now.later(retry.poll_timeout().expect("a pending operation is timed"));
//!             retry.handle_timeout(&policy, now, &mut rng);
//!         }
//!     }
//! };
//! assert_eq!(outcome, Outcome::Succeeded);
//! assert_eq!(stats.attempts, 3);
//! assert_eq!(stats.elapsed, stats.slept); // the attempts themselves took no time here
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Features
//!
//! - `alloc`: keyed collections of machines (`BTreeMap`, never `HashMap`).
//! - `std` (implies `alloc`): `Epoch`, conversions from `std::time::Instant`.
//! - `serde`: `Serialize`/`Deserialize` for policies, states and outputs. Policies deserialize
//!   through their builders, so a persisted policy is validated again when loaded.
#![no_std]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod backoff;
mod breaker;
mod budget;
#[cfg(feature = "alloc")]
mod deliveries;
mod delivery;
mod error;
mod failure;
mod flow;
mod jitter_rng;
pub mod presets;
mod random;
mod retry;
mod supervision;
mod time;

pub use backoff::{Backoff, BackoffBuilder, BackoffState, Jitter, Schedule};
pub use breaker::{
    Breaker, BreakerError, BreakerPolicy, BreakerPolicyBuilder, BreakerStatus, BreakerWindow, CallOutcome, MAX_PERMITS,
    MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS, Permit, Rejected, WindowCounts,
};
pub use budget::{
    BudgetRefused, Grant, MAX_BUDGET_BUCKETS, RatioBudget, RatioBudgetPolicy, RatioBudgetPolicyBuilder, RetryClass,
    TokenBucket, TokenBucketPolicy, TokenBucketPolicyBuilder,
};
#[cfg(feature = "alloc")]
pub use deliveries::{Deliveries, DeliveryCounts};
pub use delivery::{
    AttemptFailure, AttemptProgress, DECLINED_CAPACITY, DeadLetter, Delivery, DeliveryAction, DeliveryError,
    DeliveryPolicy, DeliveryPolicyBuilder, DeliveryState, Durability, FailurePolicy, FreeReturn, HandOut,
    IdempotencyKey, Interruption, RecoveryError, Refused, Terminal, TerminalKind,
};
pub use error::PolicyError;
pub use failure::{Failure, FailureClass, FailureKind, Hint, LastFailure};
#[cfg(feature = "alloc")]
pub use flow::Flows;
pub use flow::{
    Flow, FlowAction, FlowError, FlowFailureRefused, FlowInfo, FlowPolicy, FlowPolicyBuilder, FlowSchedule, FlowStatus,
    FlowStatusKind, SkipReason,
};
pub use jitter_rng::SplitMix64;
pub use retry::{
    Action, FailureRefused, Outcome, OutcomeKind, Retry, RetryError, RetryPolicy, RetryPolicyBuilder, RetryStatus,
    Stats,
};
pub use supervision::{
    Restart, Setting, Supervision, SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder, SupervisionRefused,
    TaskDefaults, TaskEvent, TaskOutcome, TaskOutcomeKind, TaskStatus,
};
#[cfg(feature = "std")]
pub use time::Epoch;
pub use time::Instant;

/// The RNG traits jitter is drawn through, re-exported so that callers use the same version.
pub use rand_core;
