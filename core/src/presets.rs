//! One core, four dialects (rules P): named constructors for the defaults and counting of each
//! source system, on top of the unified machines.
//!
//! | | [`scheduler`] (flows, F2) | [`supervisor`] (tasks, S2) | [`workflow_engine`] | [`durable_step`] | unified core |
//! |---|---|---|---|---|---|
//! | machine | [`Flow`](crate::Flow) | [`Supervision`](crate::Supervision) | [`Retry`](crate::Retry) | [`Retry`](crate::Retry) | — |
//! | schedule | exponential 1 s, ×2, cap 5 min | exponential 200 ms, ×2, cap 30 s | exponential 1 s, ×2, cap 30 s or 60 s | exponential 1 s, ×2, cap 100 s | any B1 schedule, any cap |
//! | jitter | proportional 0.1 | equal (`U[d/2, d]`) | proportional 0.25 | none | B3, uniform over whole ns |
//! | cap, then jitter? | jitter may go up to 10 % past the cap (see below) | equal jitter only shortens | jitter may go up to 25 % past the cap (see below) | no jitter | **capped after jitter** (B2) |
//! | limit counts | consecutive failures until the trip | retries after the first failure of a streak | total attempts, the first included (3) | total attempts, the first included | both: `max_attempts` and `max_retries` |
//! | zero means | trip 0 = trip on the first failure | `max_retries(0)` is a configuration error | — (the preset fixes 3) | `max_attempts` 0 = unlimited | refused wherever zero is meaningless |
//! | success | streak 0, `Completed` | streak 0; periodic repeats never counted | ends the operation | ends the operation | R4: streak 0 |
//! | hints | — | not in S2; the core honours `RetryAfter` up to `max_hint` | — | `RetryAfter` honoured in full, counts as a step | B6: never shortened; past `max_hint` (5 min by default) the operation ends `Deferred` |
//! | only transient errors retried | — | `Fatal`/`Canceled` never retried | when asked ([`WorkflowRetryOn::TransientOnly`]) | `Fatal` never retried | by [`FailureKind`](crate::FailureKind) |
//! | floor | none | attempt starts ≥ 1 ms apart (`min_spacing`) | none | none | optional `min_delay`, `min_spacing` |
//! | precision | see below | see below | see below | see below | whole `u64` nanoseconds, saturating |
//!
//! **Where the unified semantics chose differently, and why.**
//!
//! - *A cap is a cap* (B2). Two of the four sources let jitter push a delay past its cap; of these
//!   dialects only the two with proportional jitter can jitter upwards, so those are the ones that
//!   differ. The presets keep the unified rule: the scheduler's delays never exceed 5 min and the
//!   workflow engine's never exceed its cap. A user who wants the sources' upper range raises
//!   `max_delay` by the jitter factor (5 min × 1.1 = 330 s). Reason: a cap that jitter can break is
//!   not a bound anyone can rely on, and the simulator checks the bound after every step (G1).
//! - *Zero is refused where it is meaningless.* The scheduler's "trip after 0" and the durable
//!   step's "0 attempts" each mean something different from what zero means elsewhere (first
//!   failure; unlimited). The unified builders refuse zero with [`PolicyError::Zero`](crate::PolicyError)
//!   so that a zero coming from a default or a typo cannot silently mean "trip at once" or
//!   "never stop"; the dialect constructors [`scheduler_with_trip`] and
//!   [`durable_step_with_max_attempts`] keep the sources' meaning of zero for code ported from
//!   them.
//! - *Both counts exist.* Retry limits are counted as total attempts (workflow engine, durable
//!   step) or as retries after the first failure (supervisor); the core offers both and converts
//!   exactly (`max_retries(n)` = `max_attempts(n + 1)`).
//! - *Precision.* The core computes in whole nanoseconds with saturating integer arithmetic and an
//!   exponential envelope by repeated squaring that stops at the cap (B4, B5), so no count of
//!   failures overflows or wraps (one source's exponent cast wraps at 2^31 failures and returns a
//!   delay of about zero). The sources' own timer granularities are not reproduced; a driver rounds
//!   to its timer (tokio: 1 ms) when it sleeps.
//!
//! ```
//! use core::time::Duration;
//! use persevere::presets::{self, WorkflowCap};
//!
//! assert_eq!(presets::scheduler().backoff().envelope(1), Duration::from_secs(1));
//! assert_eq!(presets::supervisor().backoff.max_delay(), Duration::from_secs(30));
//! assert_eq!(presets::workflow_engine(WorkflowCap::Secs60).max_attempts(), Some(3));
//! assert_eq!(presets::durable_step().max_attempts(), None);
//! assert_eq!(presets::durable_step_with_max_attempts(0), presets::durable_step());
//! assert_eq!(presets::scheduler_with_trip(0).trip_after(), Some(1));
//! ```
//!
//! **Other systems' budgets and breakers, by name.** [`aws_standard_retry`] with
//! [`TokenBucketPolicy::aws`](crate::TokenBucketPolicy::aws) is the AWS SDKs' standard retry
//! mode; [`TokenBucketPolicy::grpc`](crate::TokenBucketPolicy::grpc) is gRPC's retry
//! throttling; [`RatioBudgetPolicy::finagle`](crate::RatioBudgetPolicy::finagle) is Finagle's
//! retry budget; [`ConcurrencyBudgetPolicy::envoy`](crate::ConcurrencyBudgetPolicy::envoy) is
//! Envoy's retry budget; [`resilience4j_breaker`] is resilience4j's default circuit breaker.
//! Each says what, if anything, still differs from its source.

use core::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::breaker::BreakerPolicy;
use crate::decision::DEFAULT_MAX_HINT;
use crate::failure::Failure;
use crate::flow::FlowPolicy;
use crate::retry::RetryPolicy;
use crate::supervision::TaskDefaults;
use crate::time::saturating_nanos;

/// The scheduler dialect (F2): exponential 1 s, ×2, cap 5 min, proportional jitter 0.1, never
/// trips.
pub fn scheduler() -> FlowPolicy {
    FlowPolicy::default()
}

/// The scheduler dialect with a trip limit, counted as that source counts it: the flow trips
/// when its streak of consecutive failures reaches `n`, and `n = 0` trips on the first failure
/// (the unified [`FlowPolicyBuilder::with_trip`](crate::FlowPolicyBuilder::with_trip) refuses 0).
pub fn scheduler_with_trip(n: u32) -> FlowPolicy {
    FlowPolicy::f2_tripping_after(n.max(1))
}

/// The supervisor dialect (S2): restart on failure, exponential 200 ms, ×2, cap 30 s, equal
/// jitter, no attempt timeout, unlimited retries, starts ≥ 1 ms apart.
pub fn supervisor() -> TaskDefaults {
    TaskDefaults::new()
}

/// The workflow engine's two caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum WorkflowCap {
    /// Delays up to 30 s.
    Secs30,
    /// Delays up to 60 s.
    Secs60,
}

impl WorkflowCap {
    /// The cap as a span.
    pub const fn duration(self) -> Duration {
        match self {
            WorkflowCap::Secs30 => Duration::from_secs(30),
            WorkflowCap::Secs60 => Duration::from_secs(60),
        }
    }
}

/// The workflow-engine dialect: 3 attempts in all, exponential from 1 s, ×2, capped at 30 s or
/// 60 s, proportional jitter 0.25 (capped after jitter, B2). Classify failures with
/// [`WorkflowRetryOn`].
pub fn workflow_engine(cap: WorkflowCap) -> RetryPolicy {
    let cap_ns = match cap {
        WorkflowCap::Secs30 => 30_000_000_000,
        WorkflowCap::Secs60 => 60_000_000_000,
    };
    RetryPolicy::preset(
        Backoff::exponential_unchecked(1_000_000_000, 2.0, cap_ns, Jitter::Proportional(0.25)),
        Some(3),
        saturating_nanos(DEFAULT_MAX_HINT),
    )
}

/// Which failures the workflow engine retries: all, or, when asked, only transient ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum WorkflowRetryOn {
    /// Every failure is retried (the default).
    #[default]
    AnyFailure,
    /// Only transient failures are retried; any other failure is fatal.
    TransientOnly,
}

impl WorkflowRetryOn {
    /// The [`Failure`] to report for an error that is (or is not) transient.
    pub const fn classify<E>(self, transient: bool, error: E) -> Failure<E> {
        match (self, transient) {
            (WorkflowRetryOn::TransientOnly, false) => Failure::fatal(error),
            _ => Failure::retryable(error),
        }
    }
}

/// The durable-step dialect: exponential 1 s, ×2, cap 100 s, no jitter, unlimited attempts
/// (explicitly [`unbounded`](crate::RetryPolicyBuilder::unbounded): a durable step retries until
/// it succeeds or fails fatally), and `RetryAfter` hints honoured in full, however long (each
/// counts as one step of the schedule; a durable engine persists the wait instead of holding
/// anything open, so no `max_hint` applies).
pub fn durable_step() -> RetryPolicy {
    durable_step_with_max_attempts(0)
}

/// The durable-step dialect with an attempt limit, counted as that source counts it: total
/// attempts, the first included, and `0` for unlimited (the unified
/// [`RetryPolicyBuilder::max_attempts`](crate::RetryPolicyBuilder::max_attempts) refuses 0).
pub fn durable_step_with_max_attempts(max_attempts: u32) -> RetryPolicy {
    let limit = if max_attempts == 0 { None } else { Some(max_attempts) };
    RetryPolicy::preset(
        Backoff::exponential_unchecked(1_000_000_000, 2.0, 100_000_000_000, Jitter::None),
        limit,
        u64::MAX,
    )
}

/// The AWS SDKs' standard retry mode (the JavaScript SDK v3's `StandardRetryStrategy`,
/// `DEFAULT_MAX_ATTEMPTS = 3`, `DEFAULT_RETRY_DELAY_BASE = 100` ms,
/// `THROTTLING_RETRY_DELAY_BASE = 500` ms, `MAXIMUM_RETRY_DELAY = 20` s): 3 attempts in all;
/// before retry `i` (from 0) a delay drawn uniformly from `[0, min(base × 2^i, 20 s)]` (full
/// jitter), where the base is 500 ms after a [`Throttled`](crate::FailureKind::Throttled)
/// failure and 100 ms after any other. Pair it with the retry quota,
/// [`TokenBucketPolicy::aws`](crate::TokenBucketPolicy::aws), gating each retry.
///
/// What differs: the SDK floors each delay to a millisecond; the core draws whole
/// nanoseconds. A `Retry-After` hint is honoured up to the core's `max_hint` (B6).
pub fn aws_standard_retry() -> RetryPolicy {
    let full_jitter = |base_ns| Backoff::exponential_unchecked(base_ns, 2.0, 20_000_000_000, Jitter::Full);
    RetryPolicy::builder(full_jitter(100_000_000))
        .max_attempts(3)
        .throttling_backoff(full_jitter(500_000_000))
        .build()
        .unwrap_or_else(|_| unreachable!("the AWS SDKs' standard mode is a valid policy"))
}

/// resilience4j's default circuit breaker (`CircuitBreakerConfig.ofDefaults()`): it opens when
/// at least 50 % of the last 100 calls failed (`failureRateThreshold = 50`, a count window of
/// `slidingWindowSize = 100` calls, judged once `minimumNumberOfCalls = 100` are in it) or when
/// all of them were slow (`slowCallRateThreshold = 100`, `slowCallDurationThreshold = 60` s);
/// it stays open 60 s (`waitDurationInOpenState`), then admits 10 probes
/// (`permittedNumberOfCallsInHalfOpenState`). resilience4j counts a call slow when it takes
/// longer than the threshold, this breaker when it takes at least its threshold: the preset's
/// threshold is 60 s and 1 ns, so a call of exactly 60 s is not slow in either.
///
/// Half-open is decided as resilience4j decides it ([`HalfOpenRule::Rates`](crate::HalfOpenRule::Rates)):
/// after the 10 probes have answered, it reopens if at least 50 % of them failed or all of
/// them were slow, and closes otherwise (this breaker's default reopens at the first failed
/// probe instead).
///
/// What differs, and why:
/// - *A probe that never answers.* resilience4j waits for it for ever by default
///   (`maxWaitDurationInHalfOpenState = 0`), so a hung probe holds the breaker half-open; here a
///   probe's lease ends after 60 s (the slow-call threshold) and counts as a failure.
/// - *Open to half-open.* As with resilience4j's default
///   (`automaticTransitionFromOpenToHalfOpenEnabled = false`), the breaker turns half-open when
///   a call asks after the open period, not on its own.
pub fn resilience4j_breaker() -> BreakerPolicy {
    let minute = Duration::from_secs(60);
    let open = Backoff::constant(minute).build().unwrap_or_else(|_| unreachable!("60 s is a valid delay"));
    BreakerPolicy::builder(open)
        .failure_rate(0.5)
        .slow_call_rate(1.0, minute + Duration::from_nanos(1))
        .count_window(100)
        .minimum_calls(100)
        .half_open_permits(10)
        .half_open_by_rates()
        .probe_timeout(minute)
        .build()
        .unwrap_or_else(|_| unreachable!("resilience4j's defaults are a valid policy"))
}
