//! A retry budget on retries in flight (U2, U4): Envoy's `retry_budget`.
//!
//! Where a ratio budget counts retries over a time window, this one counts what runs now:
//! retries in flight may be at most a percentage of the requests in flight, and never fewer
//! than a floor. A retry counts from its grant until its attempt ends; a request from its
//! start until its operation ends.

use crate::PolicyError;
use crate::budget::{BudgetEvent, BudgetRefused, Throttle};

/// Fractions of a percent are parts per million of the requests.
const PPM: u64 = 1_000_000;

/// The configuration of a [`ConcurrencyBudget`]: Envoy's
/// `CircuitBreakers.Thresholds.RetryBudget`.
///
/// ```
/// use persevere::{ConcurrencyBudget, ConcurrencyBudgetPolicy};
///
/// // Envoy's defaults: 20 % of the requests in flight, and never fewer than 3 retries.
/// let policy = ConcurrencyBudgetPolicy::envoy();
/// let mut budget = ConcurrencyBudget::new();
/// for _ in 0..100 {
///     budget.record_request_start();
/// }
/// assert_eq!(budget.limit(&policy), 20);
/// assert!((0..20).all(|_| budget.try_acquire(&policy).is_ok()));
/// assert!(budget.try_acquire(&policy).is_err(), "the 21st retry in flight");
/// budget.release_retry()?;
/// assert!(budget.try_acquire(&policy).is_ok(), "a retry that ended gave its place back");
/// # Ok::<(), persevere::ConcurrencyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "ConcurrencyBudgetPolicyBuilder", into = "ConcurrencyBudgetPolicyBuilder")
)]
pub struct ConcurrencyBudgetPolicy {
    /// The budget as parts per million of the requests in flight.
    ppm: u64,
    min_retry_concurrency: u32,
    /// Kept to give the builder back exactly.
    budget_percent_bits: u64,
}

/// The settings of a [`ConcurrencyBudgetPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct ConcurrencyBudgetPolicyBuilder {
    /// Retries in flight, as a percentage of the requests in flight: `[0, 100]`, exact to a
    /// ten-thousandth of a percent.
    pub budget_percent: f64,
    /// Retries allowed in flight whatever the requests.
    pub min_retry_concurrency: u32,
}

impl ConcurrencyBudgetPolicyBuilder {
    /// Retries allowed in flight whatever the requests.
    pub const fn min_retry_concurrency(mut self, n: u32) -> Self {
        self.min_retry_concurrency = n;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when `budget_percent` is not finite or outside `[0, 100]`, or both it and
    /// `min_retry_concurrency` are zero (no retry could ever be granted).
    pub fn build(self) -> Result<ConcurrencyBudgetPolicy, PolicyError> {
        let percent = self.budget_percent;
        if !percent.is_finite() {
            return Err(PolicyError::NotFinite { setting: "budget_percent", value: percent });
        }
        if !(0.0..=100.0).contains(&percent) {
            return Err(PolicyError::OutOfRange { setting: "budget_percent", value: percent, min: 0.0, max: 100.0 });
        }
        // A percent is 10 000 ppm; rounded to the nearest ppm, so 33.3 is 333 000 exactly.
        let ppm = (percent * 10_000.0 + 0.5) as u64;
        if ppm == 0 && self.min_retry_concurrency == 0 {
            return Err(PolicyError::Zero {
                setting: "budget_percent and min_retry_concurrency",
                why: "with both zero no retry is ever granted; allow a percentage, a floor, or both",
            });
        }
        Ok(ConcurrencyBudgetPolicy {
            ppm,
            min_retry_concurrency: self.min_retry_concurrency,
            budget_percent_bits: percent.to_bits(),
        })
    }
}

impl TryFrom<ConcurrencyBudgetPolicyBuilder> for ConcurrencyBudgetPolicy {
    type Error = PolicyError;

    fn try_from(builder: ConcurrencyBudgetPolicyBuilder) -> Result<Self, PolicyError> {
        builder.build()
    }
}

impl From<ConcurrencyBudgetPolicy> for ConcurrencyBudgetPolicyBuilder {
    fn from(policy: ConcurrencyBudgetPolicy) -> Self {
        ConcurrencyBudgetPolicyBuilder {
            budget_percent: f64::from_bits(policy.budget_percent_bits),
            min_retry_concurrency: policy.min_retry_concurrency,
        }
    }
}

impl ConcurrencyBudgetPolicy {
    /// A builder: retries in flight up to `budget_percent` % of the requests in flight, with no
    /// floor yet.
    pub const fn builder(budget_percent: f64) -> ConcurrencyBudgetPolicyBuilder {
        ConcurrencyBudgetPolicyBuilder { budget_percent, min_retry_concurrency: 0 }
    }

    /// Envoy's retry budget with its defaults (`budget_percent` 20 %, `min_retry_concurrency`
    /// 3): at most `max(3, ⌊20 % × requests in flight⌋)` retries in flight.
    ///
    /// What differs, and why: Envoy counts the requests and pending requests of an upstream
    /// cluster, in which a retry's request is one more; here a request is an operation from
    /// its start until it ends (its retries are not counted again), and a retry counts from
    /// its grant until its attempt ends (Envoy too counts it from when it is scheduled). Envoy
    /// computes the limit in floating point; here it is exact (U3).
    pub const fn envoy() -> ConcurrencyBudgetPolicy {
        ConcurrencyBudgetPolicy { ppm: 200_000, min_retry_concurrency: 3, budget_percent_bits: 0x4034_0000_0000_0000 }
    }

    /// The budget, as a percentage of the requests in flight.
    pub fn budget_percent(&self) -> f64 {
        f64::from_bits(self.budget_percent_bits)
    }

    /// Retries allowed in flight whatever the requests.
    pub const fn min_retry_concurrency(&self) -> u32 {
        self.min_retry_concurrency
    }

    /// The retries allowed in flight while `requests` are: `max(min_retry_concurrency,
    /// ⌊budget × requests⌋)`.
    pub const fn limit(&self, requests: u64) -> u64 {
        let share = (requests as u128 * self.ppm as u128 / PPM as u128) as u64;
        if share > self.min_retry_concurrency as u64 { share } else { self.min_retry_concurrency as u64 }
    }
}

/// A caller mistake on a [`ConcurrencyBudget`]: an end reported for nothing in flight. Nothing
/// changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum ConcurrencyError {
    /// `record_request_end` with no request in flight.
    #[error("no request is in flight; record each request's end once, after its start")]
    NoRequestInFlight,
    /// `release_retry` with no retry in flight.
    #[error("no retry is in flight; release each granted retry once")]
    NoRetryInFlight,
}

/// A budget on retries in flight, shared by many operations (Envoy's retry budget).
///
/// Verbs: [`record_request_start`](Self::record_request_start) and
/// [`record_request_end`](Self::record_request_end) around each operation;
/// [`try_acquire`](Self::try_acquire) when one wants to retry (granted while the retries in
/// flight are under the [limit](ConcurrencyBudgetPolicy::limit)), and
/// [`release_retry`](Self::release_retry) when that retry's attempt ends, however it ends. No
/// clock. Two counters of plain data: any pair loads, and one over its limit only refuses
/// retries until enough end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConcurrencyBudget {
    requests: u64,
    retries: u64,
    #[cfg_attr(feature = "serde", serde(default))]
    throttle: Throttle,
}

impl ConcurrencyBudget {
    /// Nothing in flight.
    pub const fn new() -> Self {
        ConcurrencyBudget { requests: 0, retries: 0, throttle: Throttle::new() }
    }

    /// The oldest undrained [`BudgetEvent`] (O1), as [`TokenBucket::poll_event`](crate::TokenBucket::poll_event)
    /// tells them.
    pub fn poll_event(&mut self) -> Option<BudgetEvent> {
        self.throttle.poll_event()
    }

    /// Events pushed out unseen because more than two waited.
    pub const fn dropped_events(&self) -> u32 {
        self.throttle.dropped_events()
    }

    /// An operation started.
    pub fn record_request_start(&mut self) {
        self.requests = self.requests.saturating_add(1);
    }

    /// An operation ended, however it ended.
    ///
    /// # Errors
    /// [`ConcurrencyError::NoRequestInFlight`]; nothing changes.
    pub fn record_request_end(&mut self) -> Result<(), ConcurrencyError> {
        self.requests = self.requests.checked_sub(1).ok_or(ConcurrencyError::NoRequestInFlight)?;
        Ok(())
    }

    /// Asks for one retry: granted, and counted in flight, while fewer than the policy's limit
    /// are.
    ///
    /// # Errors
    /// [`BudgetRefused`]: the operation should end `Rejected`. Nothing is counted in flight
    /// (the refusal only starts or extends the run of refusals that [`BudgetEvent`]s mark).
    pub fn try_acquire(&mut self, policy: &ConcurrencyBudgetPolicy) -> Result<(), BudgetRefused> {
        if self.retries >= policy.limit(self.requests) {
            self.throttle.refused();
            return Err(BudgetRefused);
        }
        self.retries += 1;
        self.throttle.granted();
        Ok(())
    }

    /// A granted retry's attempt ended (or the retry was given up before it started).
    ///
    /// # Errors
    /// [`ConcurrencyError::NoRetryInFlight`]; nothing changes.
    pub fn release_retry(&mut self) -> Result<(), ConcurrencyError> {
        self.retries = self.retries.checked_sub(1).ok_or(ConcurrencyError::NoRetryInFlight)?;
        Ok(())
    }

    /// Operations in flight.
    pub const fn requests(&self) -> u64 {
        self.requests
    }

    /// Retries in flight.
    pub const fn retries(&self) -> u64 {
        self.retries
    }

    /// The retries `policy` allows in flight now.
    pub const fn limit(&self, policy: &ConcurrencyBudgetPolicy) -> u64 {
        policy.limit(self.requests)
    }
}
