//! Retry budgets shared by many retry machines (rules U1–U4).
//!
//! A budget bounds the *extra* load that retries put on a dependency, across every operation
//! that calls it. Two kinds:
//!
//! - [`TokenBucket`] (U1): retries cost tokens by class, successes refund them, and a retry is
//!   refused when it would leave the balance at or below a threshold. Presets reproduce gRPC's
//!   retry throttling ([`TokenBucketPolicy::grpc`]) and the AWS SDKs' retry quota
//!   ([`TokenBucketPolicy::aws`]).
//! - [`RatioBudget`] (U2): retries ≤ ratio × requests over a sliding time window, plus a floor
//!   of retries per second. [`RatioBudgetPolicy::finagle`] is Finagle's default budget.
//!
//! All arithmetic is exact (U3): tokens are counted in thousandths (milli-tokens), ratios in
//! parts per million, and the ratio test is a cross-multiplication in integers. (One
//! well-known budget computes the cost of a retry as `(1.0 / ratio) as isize`; for a ratio of
//! 0.6 that truncates 1.67 to 1 and grants every request a retry: 100 % instead of 60 %.)
//!
//! **Use with [`Retry`](crate::Retry)** (U4): one budget, many machines. When a machine emits
//! [`RetryAction::Sleep`](crate::RetryAction::Sleep), the driver asks the budget; on a refusal it calls
//! [`Retry::handle_rejected`](crate::Retry::handle_rejected), which ends that operation with
//! [`Outcome::Rejected`](crate::Outcome::Rejected).
//!
//! ```
//! use core::time::Duration;
//! use persevere::{Backoff, Failure, Instant, Retry, RetryAction, RetryClass, RetryPolicy, TokenBucket, TokenBucketPolicy};
//! use rand_core::SeedableRng;
//!
//! let budget_policy = TokenBucketPolicy::aws();
//! let mut budget = TokenBucket::new(&budget_policy);
//! let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build()?).max_attempts(5).build()?;
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
//! let mut retry = Retry::<()>::new();
//! let now = Instant::ZERO;
//! retry.handle_start(&policy, now)?;
//! let _start = retry.poll_action();
//! retry.handle_failure(&policy, now, 1, Failure::retryable(()), &mut rng).unwrap();
//! if let Some(RetryAction::Sleep { .. }) = retry.poll_action() {
//!     if budget.try_acquire(&budget_policy, RetryClass::Transient).is_err() {
//!         retry.handle_rejected(now)?; // ends with Outcome::Rejected
//!     }
//! }
//! assert_eq!(budget.balance_milli(), 495_000); // 500 tokens, one retry at 5
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::time::Duration;

use crate::failure::FailureClass;
use crate::outbox::Outbox;
use crate::time::nanos_of;
use crate::{Instant, PolicyError};

/// Milli-tokens per token.
const MILLI: u64 = 1_000;
/// The largest gRPC `token_ratio` accepted: far beyond any bucket's use, and small enough that
/// its thousandths are exact in `u64` and its decimal digits fit a small buffer.
const MAX_TOKEN_RATIO: u64 = 1_000_000_000_000;

/// The thousandths of a finite, non-negative `x` as it is written (its shortest round-trip
/// decimal), the digits after the third decimal cut off; `None` past [`MAX_TOKEN_RATIO`].
fn thousandths_as_written(x: f64) -> Option<u64> {
    use core::fmt::Write;

    /// Collects formatted text into a fixed buffer; refuses what does not fit.
    struct Buffer {
        bytes: [u8; 64],
        len: usize,
    }

    impl Write for Buffer {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let end = self.len + s.len();
            self.bytes.get_mut(self.len..end).ok_or(core::fmt::Error)?.copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }

    if x > MAX_TOKEN_RATIO as f64 {
        return None;
    }
    if x < 0.001 {
        // Below a thousandth (Display would spell out many zeros): nothing after the cut.
        return Some(0);
    }
    let mut buffer = Buffer { bytes: [0; 64], len: 0 };
    // A value in [0.001, 1e12] prints as at most 13 integer digits and 17 significant ones.
    write!(buffer, "{x}").ok()?;
    let text = buffer.bytes.get(..buffer.len)?;
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], &text[dot + 1..]),
        None => (text, &text[..0]),
    };
    let digit = |b: u8| b.checked_sub(b'0').filter(|d| *d <= 9).map(u64::from);
    let mut milli: u64 = 0;
    for &b in whole {
        milli = milli.checked_mul(10)?.checked_add(digit(b)?)?;
    }
    for i in 0..3 {
        let next = match fraction.get(i) {
            Some(&b) => digit(b)?,
            None => 0,
        };
        milli = milli.checked_mul(10)?.checked_add(next)?;
    }
    Some(milli)
}
/// Parts per million.
const PPM: u64 = 1_000_000;
/// The largest ratio of retries to requests a ratio budget takes (Finagle's bound on
/// `percentCanRetry`).
pub const MAX_RATIO: f64 = 1_000.0;
/// The most buckets a ratio budget's window may have.
pub const MAX_BUDGET_BUCKETS: u32 = BUCKETS as u32;
const BUCKETS: usize = 16;

/// What kind of failure a retry follows; a [`TokenBucket`] charges each its own cost (U1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RetryClass {
    /// The dependency asked the caller to slow down (HTTP 429, a throttling error code, a
    /// `Retry-After`).
    Throttling,
    /// Any other transient failure (HTTP 5xx, a dropped connection).
    Transient,
    /// The attempt timed out.
    Timeout,
}

impl From<FailureClass> for RetryClass {
    /// [`FailureClass::Timeout`] is a timeout, [`FailureClass::Throttled`] and
    /// [`FailureClass::RetryAfter`] a throttling; every other class is transient.
    fn from(class: FailureClass) -> Self {
        match class {
            FailureClass::Timeout => RetryClass::Timeout,
            FailureClass::RetryAfter | FailureClass::Throttled => RetryClass::Throttling,
            _ => RetryClass::Transient,
        }
    }
}

/// The configuration of a [`TokenBucket`] (U1). Amounts are in milli-tokens (thousandths of a
/// token), so fractional refunds such as gRPC's `tokenRatio` are exact.
///
/// ```
/// use persevere::TokenBucketPolicy;
///
/// let custom = TokenBucketPolicy::builder(100)
///     .costs(1, 2, 5) // throttling, transient, timeout: whole tokens
///     .success_refund_milli(500) // half a token back per success
///     .refuse_at_or_below(10)
///     .build()?;
/// assert_eq!(custom.capacity_milli(), 100_000);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "TokenBucketPolicyBuilder", into = "TokenBucketPolicyBuilder")
)]
pub struct TokenBucketPolicy {
    settings: TokenBucketPolicyBuilder,
}

/// The settings of a [`TokenBucketPolicy`] before validation; all amounts in milli-tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct TokenBucketPolicyBuilder {
    /// The most the bucket holds; it starts full. Not zero.
    pub capacity_milli: u64,
    /// What a retry after a throttling failure costs.
    pub throttling_cost_milli: u64,
    /// What a retry after another transient failure costs.
    pub transient_cost_milli: u64,
    /// What a retry after a timeout costs.
    pub timeout_cost_milli: u64,
    /// Added by each success (capped at the capacity).
    pub success_refund_milli: u64,
    /// Whether a success after a granted retry gives that retry's cost back *instead of*
    /// `success_refund_milli` (the AWS SDKs do; gRPC does not).
    pub refund_retry_cost: bool,
    /// A retry is refused when it would leave the balance at or below this; `None`: refused
    /// only when the balance is below the cost.
    pub threshold_milli: Option<u64>,
    /// Whether a refused retry is still charged (clamped at zero), as gRPC counts every
    /// failure. `false`: a refusal changes nothing.
    pub charge_refused: bool,
    /// Whether the failure that ends an operation with no retry asked for (its attempts used
    /// up, its total budget, a hint past the limit, or a hint not to retry) is charged too (clamped at zero), as gRPC charges every
    /// failed attempt; see [`TokenBucket::record_final_failure`]. `false`: only retries are
    /// charged.
    #[cfg_attr(feature = "serde", serde(default))]
    pub charge_final_failure: bool,
}

impl TokenBucketPolicyBuilder {
    /// Per-class costs in whole tokens: throttling, transient, timeout.
    pub const fn costs(mut self, throttling: u32, transient: u32, timeout: u32) -> Self {
        self.throttling_cost_milli = throttling as u64 * MILLI;
        self.transient_cost_milli = transient as u64 * MILLI;
        self.timeout_cost_milli = timeout as u64 * MILLI;
        self
    }

    /// The refund per success, in milli-tokens.
    pub const fn success_refund_milli(mut self, milli: u64) -> Self {
        self.success_refund_milli = milli;
        self
    }

    /// Whether a successful retry refunds its own cost instead of `success_refund_milli`.
    pub const fn refund_retry_cost(mut self, refund: bool) -> Self {
        self.refund_retry_cost = refund;
        self
    }

    /// Refuse a retry that would leave `tokens` (whole tokens) or fewer.
    pub const fn refuse_at_or_below(mut self, tokens: u32) -> Self {
        self.threshold_milli = Some(tokens as u64 * MILLI);
        self
    }

    /// Whether refused retries are charged too.
    pub const fn charge_refused(mut self, charge: bool) -> Self {
        self.charge_refused = charge;
        self
    }

    /// Whether the failure that ends an operation without a retry is charged too.
    pub const fn charge_final_failure(mut self, charge: bool) -> Self {
        self.charge_final_failure = charge;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when the capacity is zero, a cost is zero or above the capacity, or the
    /// threshold is at or above the capacity (no retry could ever be granted).
    pub fn build(self) -> Result<TokenBucketPolicy, PolicyError> {
        if self.capacity_milli == 0 {
            return Err(PolicyError::Zero { setting: "capacity", why: "an empty bucket never grants a retry" });
        }
        for (setting, cost) in [
            ("throttling cost", self.throttling_cost_milli),
            ("transient cost", self.transient_cost_milli),
            ("timeout cost", self.timeout_cost_milli),
        ] {
            if cost == 0 {
                return Err(PolicyError::Zero {
                    setting,
                    why: "a free retry is not budgeted; use at least 1 milli-token",
                });
            }
            if cost > self.capacity_milli {
                return Err(PolicyError::LimitTooLarge { setting, max: self.capacity_milli });
            }
        }
        if let Some(threshold) = self.threshold_milli
            && threshold >= self.capacity_milli
        {
            return Err(PolicyError::LimitTooLarge {
                setting: "threshold",
                max: self.capacity_milli.saturating_sub(1),
            });
        }
        Ok(TokenBucketPolicy { settings: self })
    }
}

impl TryFrom<TokenBucketPolicyBuilder> for TokenBucketPolicy {
    type Error = PolicyError;

    fn try_from(builder: TokenBucketPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<TokenBucketPolicy> for TokenBucketPolicyBuilder {
    fn from(policy: TokenBucketPolicy) -> Self {
        policy.settings
    }
}

impl TokenBucketPolicy {
    /// A builder for a bucket of `capacity` whole tokens; every retry costs one token, a
    /// success refunds one, and a retry is refused only when the balance is below its cost.
    pub const fn builder(capacity: u32) -> TokenBucketPolicyBuilder {
        TokenBucketPolicyBuilder {
            capacity_milli: capacity as u64 * MILLI,
            throttling_cost_milli: MILLI,
            transient_cost_milli: MILLI,
            timeout_cost_milli: MILLI,
            success_refund_milli: MILLI,
            refund_retry_cost: false,
            threshold_milli: None,
            charge_refused: false,
            charge_final_failure: false,
        }
    }

    /// gRPC's retry throttling (gRFC A6, `retryThrottling` in the service config, implemented
    /// in milli-tokens in gRPC core's `retry_throttle.cc`): the bucket holds `max_tokens` and
    /// starts full; every failure costs 1 token, also when its retry is refused; every success
    /// adds `token_ratio`; a retry is allowed while the balance after the failure stays above
    /// `max_tokens / 2`. gRPC has no default values: the service config must give both
    /// (`max_tokens` in `1..=1000`, `token_ratio > 0`, with at most three decimals; further
    /// decimals are ignored, as gRPC does).
    ///
    /// Every failed attempt is charged, as in gRPC, when the driver tells the bucket of the
    /// failure that ends an operation ([`TokenBucket::record_final_failure`]; the driver's
    /// `Budget` does): the retries it asks for, granted or refused, and the last attempt of an
    /// operation whose attempts are used up.
    ///
    /// # Errors
    /// [`PolicyError`] when `max_tokens` is outside `1..=1000`, or `token_ratio` is not finite,
    /// negative, below 0.001 once cut to three decimals, or above 10¹².
    ///
    /// ```
    /// use persevere::TokenBucketPolicy;
    ///
    /// let refund = |ratio| TokenBucketPolicy::grpc(10, ratio).map(|p| p.settings().success_refund_milli);
    /// assert_eq!(refund(0.1239996), Ok(123)); // cut, not rounded
    /// assert_eq!(refund(0.9999999), Ok(999));
    /// assert_eq!(refund(1.005), Ok(1005)); // as written, though the f64 is just below 1.005
    /// assert!(refund(0.0009999).is_err()); // zero thousandths: gRPC refuses it
    /// ```
    pub fn grpc(max_tokens: u32, token_ratio: f64) -> Result<TokenBucketPolicy, PolicyError> {
        if max_tokens == 0 {
            return Err(PolicyError::Zero { setting: "max_tokens", why: "gRPC requires max_tokens > 0" });
        }
        if max_tokens > 1000 {
            return Err(PolicyError::LimitTooLarge { setting: "max_tokens", max: 1000 });
        }
        if !token_ratio.is_finite() {
            return Err(PolicyError::NotFinite { setting: "token_ratio", value: token_ratio });
        }
        if token_ratio < 0.0 {
            return Err(PolicyError::FractionOutOfRange { setting: "token_ratio", value: token_ratio });
        }
        // gRPC reads the number as written, in thousandths, and ignores further decimals: the
        // digits of the shortest decimal that is this `f64` (what the service config held), cut
        // after the third decimal. No rounding: 0.1239996 is 123, 0.9999999 is 999, 0.0009999
        // is 0 (refused, as gRPC refuses it).
        let Some(ratio_milli) = thousandths_as_written(token_ratio) else {
            return Err(PolicyError::LimitTooLarge { setting: "token_ratio", max: MAX_TOKEN_RATIO });
        };
        if ratio_milli == 0 {
            return Err(PolicyError::Zero {
                setting: "token_ratio",
                why: "gRPC requires token_ratio > 0 with at most three decimals (at least 0.001)",
            });
        }
        let max_milli = u64::from(max_tokens) * MILLI;
        TokenBucketPolicyBuilder {
            capacity_milli: max_milli,
            throttling_cost_milli: MILLI,
            transient_cost_milli: MILLI,
            timeout_cost_milli: MILLI,
            success_refund_milli: ratio_milli,
            refund_retry_cost: false,
            threshold_milli: Some(max_milli / 2),
            charge_refused: true,
            charge_final_failure: true,
        }
        .build()
    }

    /// The AWS SDKs' retry quota (standard retry mode; constants `INITIAL_RETRY_TOKENS = 500`,
    /// `RETRY_COST = 5`, `TIMEOUT_RETRY_COST = 10`, `NO_RETRY_INCREMENT = 1` in the
    /// JavaScript SDK v3's `middleware-retry`): a bucket of 500 tokens, starting full; a retry
    /// costs 5 tokens (10 after a timeout); it is refused when the balance is below its cost;
    /// a success without retry adds 1 token, and a successful retry gives its cost back.
    pub fn aws() -> TokenBucketPolicy {
        TokenBucketPolicy {
            settings: TokenBucketPolicyBuilder {
                capacity_milli: 500 * MILLI,
                throttling_cost_milli: 5 * MILLI,
                transient_cost_milli: 5 * MILLI,
                timeout_cost_milli: 10 * MILLI,
                success_refund_milli: MILLI,
                refund_retry_cost: true,
                threshold_milli: None,
                charge_refused: false,
                charge_final_failure: false,
            },
        }
    }

    /// The capacity, in milli-tokens.
    pub const fn capacity_milli(&self) -> u64 {
        self.settings.capacity_milli
    }

    /// What a retry of `class` costs, in milli-tokens.
    pub const fn cost_milli(&self, class: RetryClass) -> u64 {
        match class {
            RetryClass::Throttling => self.settings.throttling_cost_milli,
            RetryClass::Transient => self.settings.transient_cost_milli,
            RetryClass::Timeout => self.settings.timeout_cost_milli,
        }
    }

    /// The settings, as given.
    pub const fn settings(&self) -> &TokenBucketPolicyBuilder {
        &self.settings
    }
}

/// A granted retry from a [`TokenBucket`]: what it cost, to be given back to
/// [`TokenBucket::record_success`] if the retry succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "hand the grant back to `record_success` when the retry succeeds"]
pub struct Grant {
    cost_milli: u64,
}

impl Grant {
    /// What the retry cost, in milli-tokens.
    pub const fn cost_milli(&self) -> u64 {
        self.cost_milli
    }
}

/// A retry the budget refused; the operation should end with
/// [`Outcome::Rejected`](crate::Outcome::Rejected) (U4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[error("the retry budget refused the retry")]
pub struct BudgetRefused;

/// A budget starting or ending a run of refusals (O1), drained with `poll_event` on
/// [`TokenBucket`], [`RatioBudget`] and [`ConcurrencyBudget`](crate::ConcurrencyBudget).
///
/// Each refusal is already told by `try_acquire`'s [`BudgetRefused`]; the events mark where
/// the budget turns: the first refusal after a grant, and the first grant after refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BudgetEvent {
    /// A retry was refused, and the one asked for before it (if any) was granted: the budget
    /// is spent, and refuses retries until it recovers.
    Exhausted,
    /// A retry was granted after refusals.
    Recovered {
        /// The retries refused in a row before it.
        refused: u32,
    },
}

/// The run of refusals a budget is in, and its undrained [`BudgetEvent`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(crate) struct Throttle {
    /// Retries refused since the last grant (saturating).
    refused: u32,
    /// Outputs, not state: never serialized. One input makes at most one.
    #[cfg_attr(feature = "serde", serde(skip))]
    events: Outbox<BudgetEvent, 2>,
}

impl Throttle {
    pub(crate) const fn new() -> Self {
        Throttle { refused: 0, events: Outbox::new() }
    }

    /// A retry was granted.
    #[inline]
    pub(crate) fn granted(&mut self) {
        if self.refused != 0 {
            self.recovered();
        }
    }

    #[cold]
    fn recovered(&mut self) {
        self.events.push(BudgetEvent::Recovered { refused: self.refused });
        self.refused = 0;
    }

    /// A retry was refused.
    #[inline]
    pub(crate) fn refused(&mut self) {
        if self.refused == 0 {
            self.exhausted();
        }
        self.refused = self.refused.saturating_add(1);
    }

    #[cold]
    fn exhausted(&mut self) {
        self.events.push(BudgetEvent::Exhausted);
    }

    pub(crate) fn poll_event(&mut self) -> Option<BudgetEvent> {
        self.events.pop()
    }

    pub(crate) const fn dropped_events(&self) -> u32 {
        self.events.dropped()
    }
}

/// A token bucket retry budget (U1): one shared balance, in milli-tokens.
///
/// Verbs: [`try_acquire`](Self::try_acquire) when an operation wants to retry,
/// [`record_success`](Self::record_success) when an operation succeeds,
/// [`record_final_failure`](Self::record_final_failure) when one ends on a failure it did not
/// ask to retry. No clock: this kind of
/// budget refills by successes only. A bucket driven under a policy with a smaller capacity
/// than the one it was filled under (a persisted bucket, a replaced policy) is read as full at
/// the new capacity: it never grants more than the policy it is driven under holds.
///
/// ```
/// use persevere::{RetryClass, TokenBucket, TokenBucketPolicy};
///
/// // gRPC's throttling with maxTokens 4 and tokenRatio 1.6 (the example of gRPC's own test).
/// let policy = TokenBucketPolicy::grpc(4, 1.6)?;
/// let mut bucket = TokenBucket::new(&policy);
/// assert!(bucket.try_acquire(&policy, RetryClass::Transient).is_ok()); // 3 > 2
/// bucket.record_success(&policy, None); // 4.6, capped at 4
/// assert!(bucket.try_acquire(&policy, RetryClass::Transient).is_ok()); // 3 > 2
/// assert!(bucket.try_acquire(&policy, RetryClass::Transient).is_err()); // 2 is not > 2
/// assert_eq!(bucket.balance_milli(), 2_000);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenBucket {
    balance_milli: u64,
    #[cfg_attr(feature = "serde", serde(default))]
    throttle: Throttle,
}

impl TokenBucket {
    /// A full bucket.
    pub const fn new(policy: &TokenBucketPolicy) -> Self {
        TokenBucket { balance_milli: policy.settings.capacity_milli, throttle: Throttle::new() }
    }

    /// The oldest undrained [`BudgetEvent`] (O1): exhausted at the first refusal after a grant,
    /// recovered at the first grant after refusals. Each `try_acquire` makes at most one; two
    /// wait, and a third pushes the oldest out ([`dropped_events`](Self::dropped_events)).
    /// Events are outputs, not state: a serialized budget leaves them out.
    pub fn poll_event(&mut self) -> Option<BudgetEvent> {
        self.throttle.poll_event()
    }

    /// Events pushed out unseen because more than two waited; 0 for a driver that drains after
    /// every `try_acquire`.
    pub const fn dropped_events(&self) -> u32 {
        self.throttle.dropped_events()
    }

    /// Asks for one retry after a failure of `class`. Granted when the balance covers the cost
    /// and what is left stays above the threshold; the cost is then taken.
    ///
    /// # Errors
    /// [`BudgetRefused`]: the operation should end with
    /// [`Outcome::Rejected`](crate::Outcome::Rejected). The balance is unchanged, unless the
    /// policy charges refused retries (gRPC), or it was above this policy's capacity (filled
    /// under another policy): it is then read, and kept, as full at this capacity.
    #[inline]
    pub fn try_acquire(&mut self, policy: &TokenBucketPolicy, class: RetryClass) -> Result<Grant, BudgetRefused> {
        let cost = policy.cost_milli(class);
        // A balance kept under a larger capacity is read as full at this one.
        self.balance_milli = self.balance_milli.min(policy.settings.capacity_milli);
        let after = self.balance_milli.checked_sub(cost);
        let granted = match (after, policy.settings.threshold_milli) {
            (Some(after), Some(threshold)) => after > threshold,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if granted {
            self.balance_milli = after.unwrap_or(0);
            self.throttle.granted();
            Ok(Grant { cost_milli: cost })
        } else {
            if policy.settings.charge_refused {
                self.balance_milli = after.unwrap_or(0);
            }
            self.throttle.refused();
            Err(BudgetRefused)
        }
    }

    /// An operation ended on a failure of `class` without asking for a retry (its attempts
    /// used up, its total budget, a hint past its limit, or the other side's hint not to
    /// retry): under a policy that charges final failures (gRPC's "every failed attempt"), its
    /// cost is taken, clamped at zero; otherwise nothing changes. A failure of your own making
    /// that is not worth retrying (fatal, canceled) is not a budget matter: don't record it.
    #[inline]
    pub fn record_final_failure(&mut self, policy: &TokenBucketPolicy, class: RetryClass) {
        if policy.settings.charge_final_failure {
            let cost = policy.cost_milli(class);
            self.balance_milli = self.balance_milli.min(policy.settings.capacity_milli).saturating_sub(cost);
        }
    }

    /// An operation succeeded: refunds `success_refund_milli`, or, if the policy refunds retry
    /// costs and the success came from the retry `grant`, that retry's cost. Capped at the
    /// capacity.
    #[inline]
    pub fn record_success(&mut self, policy: &TokenBucketPolicy, grant: Option<Grant>) {
        let refund = match grant {
            Some(grant) if policy.settings.refund_retry_cost => grant.cost_milli,
            _ => policy.settings.success_refund_milli,
        };
        self.balance_milli = self.balance_milli.saturating_add(refund).min(policy.settings.capacity_milli);
    }

    /// The balance, in milli-tokens.
    pub const fn balance_milli(&self) -> u64 {
        self.balance_milli
    }

    /// The bucket's policy is replaced by `to` (gRPC: a new `retryThrottling` in the service
    /// config): the balance keeps its share of the capacity, `balance × to's capacity / from's
    /// capacity`, rounded down, so a bucket that was throttling on the old scale still does on
    /// the new one. gRPC computes the share in floating point and truncates; here it is exact
    /// (U3), which can be one milli-token higher where the floating-point share falls just short.
    pub fn rescale(&mut self, from: &TokenBucketPolicy, to: &TokenBucketPolicy) {
        let balance = u128::from(self.balance_milli.min(from.settings.capacity_milli));
        let scaled = balance * u128::from(to.settings.capacity_milli) / u128::from(from.settings.capacity_milli);
        // At most `to`'s capacity, which is a u64.
        self.balance_milli = scaled as u64;
    }
}

/// The configuration of a [`RatioBudget`] (U2): retries ≤ `ratio` × requests over a sliding
/// window of `ttl`, plus `min_retries_per_sec` × `ttl` (in seconds) retries that need no request.
///
/// **The outage burst.** The window is sliding: retries are weighed against every request of
/// the last `ttl`, so the allowance a healthy stretch earns and does not spend is still there
/// when an outage begins, and the first moments of the outage may retry far more than `ratio`
/// of their own requests (with a 10 s window and every request failing, up to all of them for a
/// second). [`burst_window`](RatioBudgetPolicyBuilder::burst_window) bounds that: every recent
/// stretch of buckets must also keep its retries within the ratio of its own requests.
///
/// ```
/// use core::time::Duration;
/// use persevere::RatioBudgetPolicy;
///
/// let finagle = RatioBudgetPolicy::finagle();
/// assert_eq!(finagle.ratio_ppm(), 200_000);
/// let strict = RatioBudgetPolicy::builder(0.1).ttl(Duration::from_secs(30)).min_retries_per_sec(0).build()?;
/// assert_eq!(strict.floor_retries(), 0);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "RatioBudgetPolicyBuilder", into = "RatioBudgetPolicyBuilder")
)]
pub struct RatioBudgetPolicy {
    ratio_ppm: u64,
    /// `min_retries_per_sec × ttl` in millionths of a retry (exact: `per_sec × ttl_ns / 1000`).
    floor_ppm: u64,
    width_ns: u64,
    buckets: u32,
    /// The buckets of the burst window; 0 without one.
    burst_buckets: u32,
    /// `min_retries_per_sec × burst_window` in millionths of a retry.
    burst_floor_ppm: u64,
    given: RatioBudgetPolicyBuilder,
}

/// The settings of a [`RatioBudgetPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct RatioBudgetPolicyBuilder {
    /// Retries allowed per request, in `[0, 1000]` (Finagle's `percentCanRetry`: 0.1 grants a
    /// retry per 10 requests, 2.0 two retries per request); kept exactly as parts per million
    /// (rounded to the nearest).
    pub ratio: f64,
    /// How long a request (and a retry) counts; 10 s by default.
    pub ttl: Duration,
    /// The window is kept in this many buckets of `ttl / buckets`; 10 by default, at most
    /// [`MAX_BUDGET_BUCKETS`]. A bucket leaves the window whole.
    pub buckets: u32,
    /// Retries per second allowed without any request (for clients that just started or call
    /// rarely); over the window, `min_retries_per_sec × ttl` retries. 10 by default.
    pub min_retries_per_sec: u32,
    /// When set (a whole number of buckets, from one bucket to `ttl`), a retry is also granted
    /// only if every stretch of whole buckets that ends with the current one and lies within
    /// the latest `burst_window` keeps its retries, this one included, within `ratio` × its own
    /// requests plus `min_retries_per_sec × burst_window`. An outage then cannot spend the
    /// allowance a quiet stretch earned: from the bucket an outage begins in, its retries stay
    /// within `ratio` × its requests (and those of that bucket before the onset) plus that
    /// floor. `None` (the default, as Finagle): only the whole window counts.
    #[cfg_attr(feature = "serde", serde(default))]
    pub burst_window: Option<Duration>,
}

impl RatioBudgetPolicyBuilder {
    /// How long a request counts.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The number of buckets the window is kept in.
    pub const fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// The floor of retries per second.
    pub const fn min_retries_per_sec(mut self, n: u32) -> Self {
        self.min_retries_per_sec = n;
        self
    }

    /// Holds every stretch of the latest `span` (a whole number of buckets) to the ratio of its
    /// own requests plus the floor; see [`burst_window`](Self::burst_window).
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Instant, RatioBudget, RatioBudgetPolicy};
    ///
    /// let bounded = RatioBudgetPolicy::builder(0.1)
    ///     .min_retries_per_sec(0)
    ///     .burst_window(Duration::from_secs(1))
    ///     .build()?;
    /// let mut budget = RatioBudget::new();
    /// // Nine healthy seconds of 100 requests each, no retries...
    /// for second in 0..9 {
    ///     for _ in 0..100 {
    ///         budget.record_request(&bounded, Instant::from_secs(second));
    ///     }
    /// }
    /// // ...then every request of the tenth second fails and asks for a retry.
    /// let outage = Instant::from_secs(9);
    /// let mut granted = 0;
    /// for _ in 0..100 {
    ///     budget.record_request(&bounded, outage);
    ///     granted += u32::from(budget.try_acquire(&bounded, outage).is_ok());
    /// }
    /// assert_eq!(granted, 10, "0.1 of this second's requests; without the bound, 100");
    /// # Ok::<(), persevere::PolicyError>(())
    /// ```
    pub const fn burst_window(mut self, span: Duration) -> Self {
        self.burst_window = Some(span);
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when the ratio is NaN, infinite or outside `[0, 1000]` ([`MAX_RATIO`]), the ttl is zero,
    /// overflows or is shorter than `buckets` nanoseconds, `buckets` is zero or above
    /// [`MAX_BUDGET_BUCKETS`], or a `burst_window` is zero, longer than `ttl` or not a whole
    /// number of buckets.
    pub fn build(self) -> Result<RatioBudgetPolicy, PolicyError> {
        if !self.ratio.is_finite() {
            return Err(PolicyError::NotFinite { setting: "ratio", value: self.ratio });
        }
        if !(0.0..=MAX_RATIO).contains(&self.ratio) {
            return Err(PolicyError::OutOfRange { setting: "ratio", value: self.ratio, min: 0.0, max: MAX_RATIO });
        }
        let ratio_ppm = (self.ratio * PPM as f64 + 0.5) as u64;
        let ttl_ns = nanos_of(self.ttl).ok_or(PolicyError::DurationOverflow { setting: "ttl" })?;
        if ttl_ns == 0 {
            return Err(PolicyError::Zero {
                setting: "ttl",
                why: "requests would never count; use a window of seconds",
            });
        }
        if self.buckets == 0 {
            return Err(PolicyError::Zero { setting: "buckets", why: "the window needs at least 1 bucket" });
        }
        if self.buckets > MAX_BUDGET_BUCKETS {
            return Err(PolicyError::LimitTooLarge { setting: "buckets", max: u64::from(MAX_BUDGET_BUCKETS) });
        }
        let width_ns = ttl_ns / u64::from(self.buckets);
        if width_ns == 0 {
            return Err(PolicyError::Zero {
                setting: "ttl",
                why: "each bucket must be at least 1 ns wide (ttl ≥ buckets ns)",
            });
        }
        let floor_ppm = |span_ns: u64| {
            let floor = u128::from(self.min_retries_per_sec) * u128::from(span_ns) / 1_000;
            u64::try_from(floor).unwrap_or(u64::MAX)
        };
        let (burst_buckets, burst_floor_ppm) = match self.burst_window {
            None => (0, 0),
            Some(span) => {
                let span_ns = nanos_of(span).filter(|&ns| ns <= ttl_ns).ok_or(PolicyError::Conflict {
                    setting: "burst_window",
                    other: "ttl",
                    why: "the burst window lies within the window; make it at most ttl",
                })?;
                if span_ns == 0 {
                    return Err(PolicyError::Zero { setting: "burst_window", why: "it must hold at least one bucket" });
                }
                if !span_ns.is_multiple_of(width_ns) {
                    return Err(PolicyError::Conflict {
                        setting: "burst_window",
                        other: "buckets",
                        why: "the burst window is counted in whole buckets; make it a multiple of ttl / buckets",
                    });
                }
                ((span_ns / width_ns) as u32, floor_ppm(span_ns))
            }
        };
        Ok(RatioBudgetPolicy {
            ratio_ppm,
            floor_ppm: floor_ppm(ttl_ns),
            width_ns,
            buckets: self.buckets,
            burst_buckets,
            burst_floor_ppm,
            given: self,
        })
    }
}

impl TryFrom<RatioBudgetPolicyBuilder> for RatioBudgetPolicy {
    type Error = PolicyError;

    fn try_from(builder: RatioBudgetPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<RatioBudgetPolicy> for RatioBudgetPolicyBuilder {
    fn from(policy: RatioBudgetPolicy) -> Self {
        policy.given
    }
}

impl RatioBudgetPolicy {
    /// A builder for `ratio` retries per request, with Finagle's ttl (10 s) and floor (10
    /// retries per second), in 10 buckets.
    pub const fn builder(ratio: f64) -> RatioBudgetPolicyBuilder {
        RatioBudgetPolicyBuilder {
            ratio,
            ttl: Duration::from_secs(10),
            buckets: 10,
            min_retries_per_sec: 10,
            burst_window: None,
        }
    }

    /// Finagle's default `RetryBudget`: 20 % of requests may be retried (`percentCanRetry =
    /// 0.2`), on top of 10 retries per second (`minRetriesPerSec = 10`), with deposits
    /// expiring after 10 s (`ttl`), as published with Finagle 6.31 ("Retry Budgets", 2016).
    /// Kept in 10 buckets of 1 s.
    pub fn finagle() -> RatioBudgetPolicy {
        RatioBudgetPolicy {
            ratio_ppm: 200_000,
            floor_ppm: 100 * PPM,
            width_ns: 1_000_000_000,
            buckets: 10,
            burst_buckets: 0,
            burst_floor_ppm: 0,
            given: RatioBudgetPolicy::builder(0.2),
        }
    }

    /// The ratio, in parts per million.
    pub const fn ratio_ppm(&self) -> u64 {
        self.ratio_ppm
    }

    /// The retries the floor allows over one window, whole (`min_retries_per_sec × ttl`,
    /// rounded down).
    pub const fn floor_retries(&self) -> u64 {
        self.floor_ppm / PPM
    }

    /// The width of one bucket.
    pub const fn bucket_width(&self) -> Duration {
        Duration::from_nanos(self.width_ns)
    }

    /// The number of buckets.
    pub const fn buckets(&self) -> u32 {
        self.buckets
    }

    /// The burst window, in buckets; `None` without one.
    pub const fn burst_buckets(&self) -> Option<u32> {
        if self.burst_buckets == 0 { None } else { Some(self.burst_buckets) }
    }

    /// Whether one more retry fits a span that holds `retries` retries and `requests` requests,
    /// with a floor of `floor_ppm` millionths of a retry: `(retries + 1) × 10⁶ ≤ ratio_ppm ×
    /// requests + floor`.
    #[inline]
    const fn fits(&self, retries: u64, requests: u64, floor_ppm: u64) -> bool {
        (retries + 1) * PPM <= self.ratio_ppm.saturating_mul(requests).saturating_add(floor_ppm)
    }

    /// Retries allowed over a window holding `requests` requests, whole:
    /// `⌊(ratio_ppm × requests + floor) / 10⁶⌋`.
    pub const fn allowance(&self, requests: u64) -> u64 {
        self.ratio_ppm.saturating_mul(requests).saturating_add(self.floor_ppm) / PPM
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Counts {
    requests: u32,
    retries: u32,
}

/// A ratio retry budget (U2): counts of requests and granted retries over a sliding window of
/// buckets; a retry is granted while `(retries + 1) × 10⁶ ≤ ratio_ppm × requests + floor`.
///
/// Verbs: [`record_request`](Self::record_request) for each new operation (a first attempt),
/// [`try_acquire`](Self::try_acquire) when an operation wants to retry. A bucket that has left
/// the window is cleared on the next call; a `now` earlier than the latest one is read as the
/// latest one.
///
/// The bound holds at every grant (G9): the retries granted in the window that ends with a
/// grant, that one included, never exceed `ratio × requests` in that window plus the floor;
/// with a burst window, the same holds of every stretch of buckets ending with the current one
/// within the burst window, with the burst floor.
/// Later, requests may leave the window before the retries granted against them, as in
/// Finagle.
///
/// The window remembers the bucket width and count it was kept in. Driven under a policy with
/// another width or count (a persisted budget, a replaced policy), it starts over empty: counts
/// kept in buckets of one width are never read as buckets of another. A loaded state is
/// validated (`serde`).
///
/// ```
/// use persevere::{Instant, RatioBudget, RatioBudgetPolicy};
///
/// let policy = RatioBudgetPolicy::builder(0.6).min_retries_per_sec(0).build()?;
/// let mut budget = RatioBudget::new();
/// let now = Instant::from_secs(1);
/// for _ in 0..10 {
///     budget.record_request(&policy, now);
/// }
/// let granted = (0..10).filter(|_| budget.try_acquire(&policy, now).is_ok()).count();
/// assert_eq!(granted, 6);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct RatioBudget {
    /// The bucket width and count the window is kept in; `(0, 0)` before the first call.
    width_ns: u64,
    count: u32,
    /// The instant (ns) the current bucket's epoch starts (a multiple of the bucket width, so
    /// it never overflows); calls before the next epoch need no division.
    start: u64,
    /// The current bucket.
    slot: u32,
    requests: u32,
    retries: u32,
    buckets: [Counts; BUCKETS],
    #[cfg_attr(feature = "serde", serde(default))]
    throttle: Throttle,
}

impl RatioBudget {
    /// An empty window.
    pub const fn new() -> Self {
        RatioBudget {
            width_ns: 0,
            count: 0,
            start: 0,
            slot: 0,
            requests: 0,
            retries: 0,
            buckets: [Counts { requests: 0, retries: 0 }; BUCKETS],
            throttle: Throttle::new(),
        }
    }

    /// The oldest undrained [`BudgetEvent`] (O1), as [`TokenBucket::poll_event`] tells them.
    pub fn poll_event(&mut self) -> Option<BudgetEvent> {
        self.throttle.poll_event()
    }

    /// Events pushed out unseen because more than two waited.
    pub const fn dropped_events(&self) -> u32 {
        self.throttle.dropped_events()
    }

    /// Counts one request (a first attempt) at `now`.
    #[inline]
    pub fn record_request(&mut self, policy: &RatioBudgetPolicy, now: Instant) {
        let slot = self.advance(policy, now);
        self.buckets[slot].requests = self.buckets[slot].requests.saturating_add(1);
        self.requests = self.requests.saturating_add(1);
    }

    /// Asks for one retry at `now`; counts it when granted.
    ///
    /// # Errors
    /// [`BudgetRefused`]: the operation should end with
    /// [`Outcome::Rejected`](crate::Outcome::Rejected). Only buckets that left the window are
    /// cleared; the counts of the window are unchanged.
    #[inline]
    pub fn try_acquire(&mut self, policy: &RatioBudgetPolicy, now: Instant) -> Result<(), BudgetRefused> {
        let slot = self.advance(policy, now);
        if !policy.fits(u64::from(self.retries), u64::from(self.requests), policy.floor_ppm)
            || (policy.burst_buckets != 0 && !self.burst_allows(policy))
        {
            self.throttle.refused();
            return Err(BudgetRefused);
        }
        self.buckets[slot].retries = self.buckets[slot].retries.saturating_add(1);
        self.retries = self.retries.saturating_add(1);
        self.throttle.granted();
        Ok(())
    }

    /// Whether one more retry fits every stretch of the burst window: for the current bucket
    /// and each run of buckets back from it, up to the burst window's, the retries of the
    /// stretch, this one included, within `ratio` × its requests plus the burst floor.
    #[inline(never)]
    fn burst_allows(&self, policy: &RatioBudgetPolicy) -> bool {
        let count = self.count.clamp(1, MAX_BUDGET_BUCKETS);
        let (mut requests, mut retries) = (0u64, 0u64);
        for back in 0..policy.burst_buckets.min(count) {
            let slot = (self.slot + count - back) % count;
            let b = &self.buckets[slot as usize & (BUCKETS - 1)];
            requests += u64::from(b.requests);
            retries += u64::from(b.retries);
            if !policy.fits(retries, requests, policy.burst_floor_ppm) {
                return false;
            }
        }
        true
    }

    /// Requests in the window (as of the latest call).
    pub const fn requests(&self) -> u32 {
        self.requests
    }

    /// Retries granted in the window (as of the latest call).
    pub const fn retries(&self) -> u32 {
        self.retries
    }

    /// Moves the window to `now`'s bucket, clearing the buckets that left it; returns the
    /// index of `now`'s bucket.
    #[inline]
    fn advance(&mut self, policy: &RatioBudgetPolicy, now: Instant) -> usize {
        if (self.width_ns, self.count) != (policy.width_ns, policy.buckets) {
            self.reshape(policy);
        }
        let now = now.as_nanos();
        let width = policy.width_ns.max(1);
        // An earlier `now` than the current epoch's start is read as in that epoch.
        if now.saturating_sub(self.start) >= width {
            let count = policy.buckets.clamp(1, MAX_BUDGET_BUCKETS);
            let epoch = now / width;
            let current = self.start / width;
            let gap = epoch.saturating_sub(current).min(u64::from(count)) as u32;
            for _ in 0..gap {
                self.slot = if self.slot + 1 >= count { 0 } else { self.slot + 1 };
                let b = &mut self.buckets[self.slot as usize & (BUCKETS - 1)];
                self.requests = self.requests.saturating_sub(b.requests);
                self.retries = self.retries.saturating_sub(b.retries);
                *b = Counts::default();
            }
            self.start = epoch * width;
        }
        self.slot as usize & (BUCKETS - 1)
    }

    /// Starts over, empty, in `policy`'s bucket width and count (the first call, or a policy
    /// with another shape).
    #[cold]
    fn reshape(&mut self, policy: &RatioBudgetPolicy) {
        // The counts are of the old shape; the run of refusals (and its undrained events) is
        // the budget's, whatever its window.
        *self = RatioBudget { throttle: self.throttle, ..RatioBudget::new() };
        self.width_ns = policy.width_ns;
        self.count = policy.buckets;
    }

    /// Whether a loaded state is one the calls could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.width_ns == 0 {
            return if *self == RatioBudget::new() { Ok(()) } else { Err("a window with no shape holds counts") };
        }
        if self.count == 0 || self.count > MAX_BUDGET_BUCKETS || self.slot >= self.count {
            return Err("the bucket count or the current bucket is out of range");
        }
        if !self.start.is_multiple_of(self.width_ns) {
            return Err("the current bucket does not start on a bucket boundary");
        }
        let (mut requests, mut retries) = (0u64, 0u64);
        for (i, b) in self.buckets.iter().enumerate() {
            if i as u32 >= self.count && *b != Counts::default() {
                return Err("a bucket past the window's count holds counts");
            }
            requests += u64::from(b.requests);
            retries += u64::from(b.retries);
        }
        // Totals saturate at `u32::MAX`, so a sum past it stands for a saturated total.
        let saturated = |sum: u64| sum.min(u64::from(u32::MAX));
        if (saturated(requests), saturated(retries)) != (u64::from(self.requests), u64::from(self.retries)) {
            return Err("the window's totals are not the sums of its buckets");
        }
        Ok(())
    }
}

crate::serde_validated!(RatioBudget, "a RatioBudget");
