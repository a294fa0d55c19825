//! # persevere
//!
//! What happens after a failure — backoff, retry, trip, supervision restarts, redelivery —
//! decided by pure, deterministic state machines and driven by whatever runtime you have.
//!
//! The crate is `#![no_std]`, reads no clock, does no I/O, spawns nothing and allocates nothing.
//!
//! ## One vocabulary
//!
//! Every machine speaks the same language (sans-IO); a reader who knows one knows them all.
//!
//! | | [`Retry`] | [`Supervision`] | [`Flow`] | [`Delivery`] | [`Breaker`] | [`Hedge`] |
//! |---|---|---|---|---|---|---|
//! | policy (shared, validated) | [`RetryPolicy`] | [`SupervisionPolicy`] | [`FlowPolicy`] | [`DeliveryPolicy`] | [`BreakerPolicy`] | [`HedgePolicy`] |
//! | output, drained by `poll_action` | [`RetryAction`] | [`SupervisionAction`] | [`FlowAction`] | [`DeliveryAction`] | (the result of `try_acquire`) | [`HedgeAction`] |
//! | transitions (O1) | `Finish` | every `Attempt*`, `BackoffScheduled`, `TaskFinished` | `Tripped`, `Reset` | `Finish` (dead letters too) | [`BreakerEvent`], drained by `poll_event` | `Finish` |
//! | where it is: `status()` | [`RetryStatus`] | [`SupervisionStatus`] | [`FlowStatus`] | [`DeliveryStatus`] | [`BreakerStatus`] | `started()`, `in_flight()`, `stats()` |
//! | misuse | [`RetryError`] | [`SupervisionError`] | [`FlowError`] | [`DeliveryError`] | [`BreakerError`] | [`HedgeError`] |
//!
//! - **Time is an argument.** Every input takes `now:` [`Instant`], a `u64` of nanoseconds from
//!   an epoch your driver chooses. A `now` earlier than the latest one a machine accepted is
//!   read as that latest one: time never runs backwards inside a machine.
//! - **Inputs** are `handle_*` verbs whose arguments always come in one order:
//!   `(policy, now, subject, input, rng)` — the policy, the time, what the input is about (an
//!   attempt number, a task id, a permit), the input itself (a [`Failure`], a checkpoint), and
//!   the RNG. A verb takes only what it reads: the policy when its answer depends on it (a
//!   start, a failure, a wake-up that may start or time out an attempt), the RNG when it may
//!   draw jitter (a failure, and a wake-up that may turn into one), so no caller builds a value
//!   to be ignored. Every machine with timed work has `handle_timeout`; calling it early,
//!   twice, or spuriously changes nothing. The machines that emit actions follow these verbs:
//!
//!   | | `handle_start` | `handle_success` | `handle_failure` | `handle_timeout` | `handle_cancel` |
//!   |---|---|---|---|---|---|
//!   | [`Retry`] | `(policy, now)` | `(now, attempt)` | `(policy, now, attempt, failure, rng)` | `(policy, now, rng)` | `(now)` |
//!   | [`Supervision`] | `(policy, now)` | `(policy, now, attempt)` | `(policy, now, attempt, failure, rng)` | `(policy, now)` | `(now)` |
//!   | [`Flow`] | (made by `every` / `cron`) | `(now)` | `(policy, now, failure, rng)` | `(now)` | `(now)` |
//!   | [`Delivery`] | `handle_hand_out(policy, now, worker)` | `(now, attempt, worker)` | `(policy, now, attempt, worker, failure, rng)` | `(policy, now, rng)` | — |
//!   | [`Hedge`] | `(policy, now)` | `(now, attempt)` | `(policy, now, attempt, failure)` | `(policy, now)` | `(now)` |
//!
//!   A success ends an operation whatever the policy, except a [`Supervision`]'s, whose policy
//!   may repeat the task. A [`Retry`]'s or a [`Delivery`]'s wake-up may time an attempt out and
//!   decide that failure at once, so it takes the RNG; a [`Supervision`]'s reports the timeout
//!   and decides on [`handle_abandoned`](Supervision::handle_abandoned), which takes it. A
//!   [`Flow`]'s wake-up dispatches at a time already set, and a [`Hedge`] draws no jitter.
//!   Cancels, [`Retry::handle_rejected`] and [`Hedge::handle_rejected`], and a
//!   [`Delivery`]'s `handle_persisted` read neither. The [`Flows`] and [`Deliveries`] tables
//!   take what their machines take, with the task's id as the subject.
//!
//!   The breaker and the budgets are driven by calls whose answer is the output
//!   (`try_acquire`, `record…`) rather than by these verbs. The [`Breaker`] takes
//!   `(policy, now, rng)` wherever its open period may start (its open duration may be
//!   jittered), its `handle_timeout` too; `handle_isolate(now)` and `handle_disable(now)` set
//!   it by hand whatever the policy. A [`TokenBucket`] takes no `now` (its tokens do not refill
//!   with time), a [`RatioBudget`] takes one (its window slides), and a [`ConcurrencyBudget`]'s
//!   end of a request reads neither policy nor time; none of the budgets has timed work, so
//!   none has `handle_timeout`.
//! - **Outputs** come out of `poll_action()`, drained until `None`, and `poll_timeout()` says
//!   when `handle_timeout` is next due (a pure query). The machines that emit actions share
//!   them through the [`Drain`] trait, so one generic loop (`machine.drain()`) drains any of
//!   them.
//! - **The drain rule.** Outputs accumulate in order until drained, and none is ever dropped
//!   unseen: an input that would make outputs of an earlier one stale is refused with the
//!   machine's `Undrained` error and changes nothing (`handle_timeout` then does nothing). For
//!   `Retry`, `Supervision`, `Flow` and `Delivery` that is every input while outputs wait
//!   (only inputs that make none and change none, such as a failover of a pending task, are
//!   accepted). Drain after every input and this never happens. The
//!   [`Deliveries`] table drains its tasks into its own queue after every input, so there
//!   outputs of many inputs accumulate, in order; the [`Flows`] registry hands a flow's action
//!   back from the input that made it, and dispatches due flows one by one as
//!   `poll_action` is called.
//! - **Transitions are outputs (O1).** Each machine tells its changes of state where it tells
//!   everything else: an operation's or a task's end, a flow's trip and reset, and a task's
//!   dead letter are actions. The machines driven by calls rather than actions (the
//!   [`Breaker`], and the budgets [`TokenBucket`], [`RatioBudget`], [`ConcurrencyBudget`]) keep
//!   a small outbox drained by `poll_event`: a breaker's [`BreakerEvent`] says which rule moved
//!   it ([`BreakerReason`]) and for how long it opened; a budget's [`BudgetEvent`] marks where
//!   it is exhausted and where it recovers. An outbox is written on transitions only (nothing on
//!   the closed or granted path), holds a few events in place, counts any it had to push out
//!   unseen (`dropped_events`), and is not serialized: events are outputs, not state.
//!   The concurrency limits, a [`Bulkhead`] (L1) and an adaptive [`Limiter`] (L2–L4), are
//!   driven by calls as well: `try_acquire` answers with a permit or [`Shed`] (with
//!   `retry_after`), the permit is handed back once to `release`, and `poll_timeout` /
//!   `handle_timeout` cover a bulkhead's waits and a limiter's minimum-RTT windows.
//! - **Domain outcomes are outputs; only caller mistakes are `Err`.** Exhausted, tripped, open,
//!   dead-lettered are actions or statuses. A mistake (a result for an attempt that is not
//!   running, an unknown id) is refused with [`Refused`]`<Error, Input>` — the reason and the
//!   input handed back — or the bare error when there is nothing to hand back, and the state
//!   is exactly as it was.
//! - **One attempt engine, one failure decision.** [`Retry`] and [`Supervision`] run their
//!   attempts on one engine (numbered from 1 as `u64`), [`Delivery`] embeds a [`Retry`], and
//!   [`Flow`] decides its runs' failures by the same rule: a [`Failure`]'s class (`Fatal`,
//!   `DoNotRetry` and `Canceled` stop), then the limit (a streak past it stops), then a hint
//!   (never shortened; past `max_hint`, [`DEFAULT_MAX_HINT`] by default, the operation ends
//!   `Deferred` with the hinted instant) or else the backoff (B6, R3, S3, F3).
//! - **Randomness** (jitter) comes from your RNG through the [`rand_core::Rng`] trait; if you
//!   have none, [`SplitMix64`] is a fast 8-byte one (you pick its seed: the core owns no entropy).
//! - **Plain data.** Policies are validated once, immutable and shared; states are small
//!   `Clone + Debug + PartialEq` values you can persist (`serde`). **Any state that loads is
//!   safe to drive**: a state that no sequence of inputs could have made is refused when it
//!   loads, and a state driven under another policy than the one it was made under either
//!   follows the new policy at once or, where its shape depends on the policy (a breaker's or
//!   a ratio budget's window), is rebuilt, as each type documents.
//! - **One [`Stats`]** (attempts, time asleep, elapsed time) for the core and every driver.
//!
//! ## The run loop
//!
//! A complete driver for one retried operation, on a hand-moved clock:
//!
//! ```
//! use core::time::Duration;
//! use persevere::{Backoff, Failure, Instant, Jitter, Outcome, Retry, RetryAction, RetryPolicy};
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
//!         Some(RetryAction::Start { attempt, .. }) => match call() {
//!             Ok(()) => retry.handle_success(now, attempt)?,
//!             Err(e) => retry.handle_failure(&policy, now, attempt, Failure::retryable(e), &mut rng)?,
//!         },
//!         Some(RetryAction::Sleep { .. }) | Some(RetryAction::Abandon { .. }) => {}
//!         Some(RetryAction::Finish { outcome, stats }) => break (outcome, stats),
//!         None => {
//!             // Nothing to do until the next timeout: "sleep" until then.
//!             now = now.later(retry.poll_timeout().expect("a pending operation is timed"));
//!             retry.handle_timeout(&policy, now, &mut rng);
//!         }
//!     }
//! };
//! assert_eq!(outcome, Outcome::Succeeded);
//! assert_eq!(stats.attempts, 3);
//! assert_eq!(stats.elapsed, Some(stats.slept)); // the attempts themselves took no time here
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Features
//!
//! - `alloc`: keyed collections of machines (`BTreeMap`, never `HashMap`).
//! - `std` (implies `alloc`): `Epoch`, conversions from `std::time::Instant`.
//! - `serde`: `Serialize`/`Deserialize` for policies, states and outputs. Policies deserialize
//!   through their builders, so a persisted policy is validated again when loaded; states are
//!   validated too.
#![no_std]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

/// `Serialize` and `Deserialize` for a machine whose state is validated when it loads: the
/// type derives both with `#[serde(remote = "Self")]` (which makes them inherent functions)
/// and has `fn validate(&self) -> Result<(), &'static str>`; the trait impls call them, and a
/// state that fails validation is refused with a message naming the type and the reason.
#[cfg(feature = "serde")]
macro_rules! serde_validated {
    ($ty:ident $(< $($gen:ident),* >)?, $what:literal) => {
        impl$(<$($gen: serde::Serialize),*>)? serde::Serialize for $ty$(<$($gen),*>)? {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $ty::serialize(self, serializer)
            }
        }

        impl<'de $($(, $gen: serde::Deserialize<'de>)*)?> serde::Deserialize<'de> for $ty$(<$($gen),*>)? {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let state = $ty::deserialize(deserializer)?;
                match state.validate() {
                    Ok(()) => Ok(state),
                    Err(why) => Err(<D::Error as serde::de::Error>::custom(format_args!(
                        concat!("invalid state of ", $what, ": {}"),
                        why
                    ))),
                }
            }
        }
    };
}
#[cfg(not(feature = "serde"))]
macro_rules! serde_validated {
    ($($anything:tt)*) => {};
}
pub(crate) use serde_validated;

mod attempt;
mod backoff;
mod breaker;
mod budget;
mod bulkhead;
mod concurrency_budget;
mod decision;
#[cfg(feature = "alloc")]
mod deliveries;
mod delivery;
mod drain;
mod error;
mod failure;
mod flow;
mod hedge;
mod jitter_rng;
mod limit_policy;
mod limiter;
mod outbox;
pub mod presets;
mod random;
mod retry;
mod supervision;
mod time;

pub use backoff::{Backoff, BackoffBuilder, BackoffState, Jitter, Schedule};
pub use breaker::{
    Breaker, BreakerError, BreakerEvent, BreakerPolicy, BreakerPolicyBuilder, BreakerReason, BreakerState,
    BreakerStatus, BreakerWindow, CallOutcome, HalfOpenRule, MAX_PERMITS, MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS, Permit,
    Rejected, WindowCounts,
};
pub use budget::{
    BudgetEvent, BudgetRefused, Grant, MAX_BUDGET_BUCKETS, MAX_RATIO, RatioBudget, RatioBudgetPolicy,
    RatioBudgetPolicyBuilder, RetryClass, TokenBucket, TokenBucketPolicy, TokenBucketPolicyBuilder,
};
pub use bulkhead::{
    Bulkhead, BulkheadError, BulkheadPermit, BulkheadPolicy, BulkheadPolicyBuilder, Full, MAX_WAITERS, Shed, Ticket,
};
pub use concurrency_budget::{
    ConcurrencyBudget, ConcurrencyBudgetPolicy, ConcurrencyBudgetPolicyBuilder, ConcurrencyError,
};
pub use decision::DEFAULT_MAX_HINT;
#[cfg(feature = "alloc")]
pub use deliveries::{Deliveries, DeliveryCounts};
pub use delivery::{
    AttemptFailure, AttemptProgress, DECLINED_CAPACITY, DeadLetter, Delivery, DeliveryAction, DeliveryError,
    DeliveryPolicy, DeliveryPolicyBuilder, DeliveryStatus, Durability, FailurePolicy, FreeReturn, HandOut,
    IdempotencyKey, Interruption, RecoveryError, Terminal, TerminalKind,
};
pub use drain::{Drain, Drained};
pub use error::{PolicyError, Refused};
pub use failure::{Failure, FailureClass, FailureKind, Hint, LastFailure};
#[cfg(feature = "alloc")]
pub use flow::Flows;
pub use flow::{
    Flow, FlowAction, FlowError, FlowInfo, FlowPolicy, FlowPolicyBuilder, FlowSchedule, FlowStatus, FlowStatusKind,
    SkipReason, TripReason,
};
pub use hedge::{Hedge, HedgeAction, HedgeError, HedgePolicy, HedgePolicyBuilder, HedgeStats, MAX_HEDGED_ATTEMPTS};
pub use jitter_rng::SplitMix64;
pub use limit_policy::{LimitAlgorithm, LimiterPolicy, LimiterPolicyBuilder, MAX_LIMIT, MinRttProbe};
pub use limiter::{Completion, Limiter, LimiterError, LimiterPermit};
pub use retry::{
    Outcome, OutcomeKind, Retry, RetryAction, RetryError, RetryPolicy, RetryPolicyBuilder, RetryStatus, Stats,
};
pub use supervision::{
    Restart, Setting, Supervision, SupervisionAction, SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder,
    SupervisionStatus, TaskDefaults, TaskOutcome, TaskOutcomeKind,
};
#[cfg(feature = "std")]
pub use time::Epoch;
pub use time::Instant;

/// The RNG traits jitter is drawn through, re-exported so that callers use the same version.
pub use rand_core;
