//! The configuration of an adaptive [`Limiter`](crate::Limiter) (L2, L3): its algorithm, its
//! bounds and its minimum-RTT re-probe, validated once; and the presets that reproduce each
//! algorithm's published defaults.

use core::time::Duration;

use crate::PolicyError;
use crate::time::nanos_of;

/// The largest limit a policy may set (`max_limit`): limits are exact in `f64` far beyond it.
pub const MAX_LIMIT: u32 = 1 << 20;

/// How a [`Limiter`](crate::Limiter) moves its limit from the completions it is told of (L2).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum LimitAlgorithm {
    /// Loss-based (Netflix's `AIMDLimit`): a dropped call, or one slower than `timeout`,
    /// multiplies the limit by `backoff_ratio`; any other adds 1 while at least half the limit
    /// was in flight.
    Aimd {
        /// In `[0.5, 1)`.
        backoff_ratio: f64,
        /// A call slower than this counts as dropped.
        timeout: Duration,
    },
    /// Queue estimate from the minimum RTT (Netflix's `VegasLimit`): `queue = ⌈limit × (1 −
    /// min_rtt / rtt)⌉`, with `a = ⌊log10 limit⌋` (at least 1), grows by `6a` when `queue ≤ a`,
    /// by `a` when `queue < 3a`, shrinks by `a` when `queue > 6a` or the call dropped; the step
    /// is weighted by `smoothing`.
    Vegas {
        /// In `(0, 1]`: the weight of the new limit against the old one.
        smoothing: f64,
    },
    /// Long against short RTT (Netflix's `Gradient2Limit`): `gradient = clamp(rtt_tolerance ×
    /// long / rtt, 0.5, 1)`, `new = limit × gradient + queue_size`, weighted by `smoothing`;
    /// `long` is an exponential average over `long_window` completions (the first 10 averaged).
    Gradient2 {
        /// In `(0, 1]`.
        smoothing: f64,
        /// At least 1: how much slower than the long RTT a call may be before the limit falls.
        rtt_tolerance: f64,
        /// Added to the limit on every update: the queue allowed to form.
        queue_size: u32,
        /// At least 1: the long RTT's window, in completions.
        long_window: u32,
    },
}

/// The minimum-RTT re-probe (L3, Envoy's minRTT window): every `interval` (delayed by up to
/// `jitter × interval`, drawn afresh each time), admission drops to `floor` until `samples`
/// calls started in the window have completed; the smallest of their RTTs is the new
/// minimum RTT.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MinRttProbe {
    /// Between the end of one window and the start of the next.
    pub interval: Duration,
    /// In `[0, 1]`: the start is delayed by up to this fraction of `interval`.
    pub jitter: f64,
    /// Completions measured in one window: at least 1.
    pub samples: u32,
    /// Calls admitted at once during the window: at least 1.
    pub floor: u32,
}

impl MinRttProbe {
    /// Envoy's `MinimumRTTCalculationParams` defaults (`request_count` 50, `jitter` 15 %,
    /// `min_concurrency` 3) every `interval` (which Envoy requires: it has no default). Source:
    /// envoyproxy/envoy,
    /// `api/envoy/extensions/filters/http/adaptive_concurrency/v3/adaptive_concurrency.proto`,
    /// and <https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/adaptive_concurrency_filter>.
    pub const fn envoy(interval: Duration) -> MinRttProbe {
        MinRttProbe { interval, jitter: 0.15, samples: 50, floor: 3 }
    }
}

/// The configuration of a [`Limiter`](crate::Limiter).
///
/// ```
/// use persevere::{LimitAlgorithm, LimiterPolicy};
///
/// let policy = LimiterPolicy::vegas();
/// assert_eq!((policy.min_limit(), policy.initial_limit(), policy.max_limit()), (1, 20, 1000));
/// assert!(LimiterPolicy::aimd().to_builder().limits(0, 20, 10).build().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "LimiterPolicyBuilder", into = "LimiterPolicyBuilder")
)]
pub struct LimiterPolicy {
    pub(crate) algorithm: LimitAlgorithm,
    pub(crate) min_limit: u32,
    pub(crate) initial_limit: u32,
    pub(crate) max_limit: u32,
    pub(crate) probe: Option<MinRttProbe>,
    /// AIMD's timeout in ns (u64::MAX for the other algorithms).
    pub(crate) timeout_ns: u64,
    pub(crate) probe_interval_ns: u64,
    /// Gradient2's long-RTT weight, `2 / (long_window + 1)` (0 for the other algorithms).
    pub(crate) long_factor: f64,
}

/// The settings of a [`LimiterPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct LimiterPolicyBuilder {
    /// The algorithm and its settings.
    pub algorithm: LimitAlgorithm,
    /// The smallest limit: at least 1.
    pub min_limit: u32,
    /// The limit a new limiter starts at, in `[min_limit, max_limit]`.
    pub initial_limit: u32,
    /// The largest limit: at most [`MAX_LIMIT`].
    pub max_limit: u32,
    /// The minimum-RTT re-probe, if any.
    pub probe: Option<MinRttProbe>,
}

impl LimiterPolicyBuilder {
    /// Another algorithm, the bounds and the probe kept.
    pub const fn algorithm(mut self, algorithm: LimitAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The bounds and the starting limit.
    pub const fn limits(mut self, min: u32, initial: u32, max: u32) -> Self {
        self.min_limit = min;
        self.initial_limit = initial;
        self.max_limit = max;
        self
    }

    /// Re-measures the minimum RTT on a jittered schedule (L3).
    pub const fn min_rtt_probe(mut self, probe: MinRttProbe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when a limit is zero, out of order or above [`MAX_LIMIT`], a ratio or
    /// smoothing is not finite or out of its range, a window, sample count or floor is zero,
    /// or a duration overflows.
    pub fn build(self) -> Result<LimiterPolicy, PolicyError> {
        if self.min_limit == 0 {
            return Err(PolicyError::Zero { setting: "min_limit", why: "a limit of 0 admits nothing; use at least 1" });
        }
        if self.max_limit > MAX_LIMIT {
            return Err(PolicyError::LimitTooLarge { setting: "max_limit", max: u64::from(MAX_LIMIT) });
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return Err(PolicyError::OutOfRange {
                setting: "initial_limit",
                value: f64::from(self.initial_limit),
                min: f64::from(self.min_limit),
                max: f64::from(self.max_limit),
            });
        }
        let timeout_ns = check_algorithm(&self.algorithm)?;
        let probe_interval_ns = match &self.probe {
            Some(probe) => check_probe(probe)?,
            None => u64::MAX,
        };
        Ok(LimiterPolicy {
            algorithm: self.algorithm,
            min_limit: self.min_limit,
            initial_limit: self.initial_limit,
            max_limit: self.max_limit,
            probe: self.probe,
            timeout_ns,
            probe_interval_ns,
            long_factor: match self.algorithm {
                LimitAlgorithm::Gradient2 { long_window, .. } => 2.0 / (f64::from(long_window) + 1.0),
                _ => 0.0,
            },
        })
    }
}

fn in_range(setting: &'static str, value: f64, min: f64, max: f64) -> Result<(), PolicyError> {
    if !value.is_finite() {
        return Err(PolicyError::NotFinite { setting, value });
    }
    if !(min..=max).contains(&value) {
        return Err(PolicyError::OutOfRange { setting, value, min, max });
    }
    Ok(())
}

/// The algorithm's settings; AIMD's timeout in ns (`u64::MAX` for the others).
fn check_algorithm(algorithm: &LimitAlgorithm) -> Result<u64, PolicyError> {
    match *algorithm {
        LimitAlgorithm::Aimd { backoff_ratio, timeout } => {
            in_range("backoff_ratio", backoff_ratio, 0.5, 1.0)?;
            if backoff_ratio >= 1.0 {
                return Err(PolicyError::OutOfRange {
                    setting: "backoff_ratio",
                    value: 1.0,
                    min: 0.5,
                    max: 1.0 - 1e-9,
                });
            }
            let ns = nanos_of(timeout).ok_or(PolicyError::DurationOverflow { setting: "timeout" })?;
            if ns == 0 {
                return Err(PolicyError::Zero { setting: "timeout", why: "every call would count as dropped" });
            }
            Ok(ns)
        }
        LimitAlgorithm::Vegas { smoothing } => {
            positive_fraction("smoothing", smoothing)?;
            Ok(u64::MAX)
        }
        LimitAlgorithm::Gradient2 { smoothing, rtt_tolerance, long_window, .. } => {
            positive_fraction("smoothing", smoothing)?;
            in_range("rtt_tolerance", rtt_tolerance, 1.0, 1e6)?;
            if long_window == 0 {
                return Err(PolicyError::Zero { setting: "long_window", why: "the long RTT needs a window" });
            }
            Ok(u64::MAX)
        }
    }
}

fn positive_fraction(setting: &'static str, value: f64) -> Result<(), PolicyError> {
    in_range(setting, value, 0.0, 1.0)?;
    if value == 0.0 {
        return Err(PolicyError::Zero { setting, why: "the limit would never move" });
    }
    Ok(())
}

/// The probe's settings; its interval in ns.
fn check_probe(probe: &MinRttProbe) -> Result<u64, PolicyError> {
    if !probe.jitter.is_finite() || !(0.0..=1.0).contains(&probe.jitter) {
        return Err(PolicyError::FractionOutOfRange { setting: "probe jitter", value: probe.jitter });
    }
    if probe.samples == 0 {
        return Err(PolicyError::Zero { setting: "probe samples", why: "a window must measure at least one call" });
    }
    if probe.floor == 0 {
        return Err(PolicyError::Zero { setting: "probe floor", why: "a window must admit at least one call" });
    }
    let ns = nanos_of(probe.interval).ok_or(PolicyError::DurationOverflow { setting: "probe interval" })?;
    if ns == 0 {
        return Err(PolicyError::Zero { setting: "probe interval", why: "the limiter would probe for ever" });
    }
    Ok(ns)
}

impl TryFrom<LimiterPolicyBuilder> for LimiterPolicy {
    type Error = PolicyError;

    fn try_from(builder: LimiterPolicyBuilder) -> Result<Self, PolicyError> {
        builder.build()
    }
}

impl From<LimiterPolicy> for LimiterPolicyBuilder {
    fn from(policy: LimiterPolicy) -> Self {
        policy.to_builder()
    }
}

impl LimiterPolicy {
    /// A builder for `algorithm` with Netflix's common bounds (20 ≤ limit ≤ 200, starting at
    /// 20) and no re-probe.
    pub const fn builder(algorithm: LimitAlgorithm) -> LimiterPolicyBuilder {
        LimiterPolicyBuilder { algorithm, min_limit: 20, initial_limit: 20, max_limit: 200, probe: None }
    }

    /// The settings this policy was built from.
    pub const fn to_builder(&self) -> LimiterPolicyBuilder {
        LimiterPolicyBuilder {
            algorithm: self.algorithm,
            min_limit: self.min_limit,
            initial_limit: self.initial_limit,
            max_limit: self.max_limit,
            probe: self.probe,
        }
    }

    /// Netflix's `AIMDLimit` builder defaults: limit in [20, 200] from 20, `backoffRatio` 0.9,
    /// `timeout` 5 s. Source: Netflix/concurrency-limits,
    /// `concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/AIMDLimit.java`.
    pub fn aimd() -> LimiterPolicy {
        let algorithm = LimitAlgorithm::Aimd { backoff_ratio: 0.9, timeout: Duration::from_secs(5) };
        LimiterPolicy::builder(algorithm).build().expect("Netflix's AIMD defaults are valid")
    }

    /// Netflix's `VegasLimit` builder defaults: limit in [1, 1000] from 20 (`maxConcurrency`
    /// 1000; the Java limit is clamped at 1), `smoothing` 1.0, alpha `3·log10`, beta `6·log10`,
    /// threshold, increase and decrease `log10` of the limit. Source: Netflix/concurrency-limits,
    /// `concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/VegasLimit.java`.
    /// Netflix's Vegas re-measures its no-load RTT every `probeMultiplier` (30) × limit
    /// completions; here the re-probe is the machine's one jittered schedule (L3), left unset:
    /// add [`MinRttProbe::envoy`] to re-measure.
    pub fn vegas() -> LimiterPolicy {
        LimiterPolicy::builder(LimitAlgorithm::Vegas { smoothing: 1.0 })
            .limits(1, 20, 1000)
            .build()
            .expect("Netflix's Vegas defaults are valid")
    }

    /// Netflix's `Gradient2Limit` builder defaults: limit in [20, 200] from 20, `smoothing`
    /// 0.2, `queueSize` 4, `longWindow` 600, `rttTolerance` 1.5. Source:
    /// Netflix/concurrency-limits,
    /// `concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/Gradient2Limit.java`.
    pub fn gradient2() -> LimiterPolicy {
        let algorithm =
            LimitAlgorithm::Gradient2 { smoothing: 0.2, rtt_tolerance: 1.5, queue_size: 4, long_window: 600 };
        LimiterPolicy::builder(algorithm).build().expect("Netflix's Gradient2 defaults are valid")
    }

    /// The algorithm.
    pub const fn algorithm(&self) -> LimitAlgorithm {
        self.algorithm
    }

    /// The smallest limit.
    pub const fn min_limit(&self) -> u32 {
        self.min_limit
    }

    /// The limit a new limiter starts at.
    pub const fn initial_limit(&self) -> u32 {
        self.initial_limit
    }

    /// The largest limit.
    pub const fn max_limit(&self) -> u32 {
        self.max_limit
    }

    /// The minimum-RTT re-probe, if any.
    pub const fn probe(&self) -> Option<MinRttProbe> {
        self.probe
    }
}
