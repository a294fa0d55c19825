//! What a breaker is configured with: its window, its trip and half-open rules, and the
//! validated [`BreakerPolicy`] with its builder.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The longest count-based window, in calls: the window keeps two bits per call in 16 words.
pub const MAX_WINDOW_CALLS: u32 = 32 * WORDS as u32;
/// The most buckets a time-based window may have.
pub const MAX_WINDOW_BUCKETS: u32 = BUCKETS as u32;
/// The most probes a half-open breaker may let through at once.
pub const MAX_PERMITS: u32 = LEASES as u32;

pub(super) const WORDS: usize = 16;
pub(super) const BUCKETS: usize = 16;
pub(super) const LEASES: usize = 16;
/// The widest time-window bucket: about 18 years, so that a window's key fits in 64 bits.
pub(super) const MAX_BUCKET_WIDTH_NS: u64 = (1 << 59) - 1;

/// A window's shape as one number, unique per shape: 0 for no window (consecutive failures
/// only), `n << 5` for the last `n` calls, `width << 5 | buckets` for a time window (`buckets`
/// is 1..=16, so the low bits tell the kinds apart).
pub(super) const fn window_key(spec: WindowSpec) -> u64 {
    match spec {
        WindowSpec::Calls(n) => (n as u64) << 5,
        WindowSpec::Time { width_ns, buckets } => (width_ns << 5) | buckets as u64,
    }
}

/// Rates are parts per million; a rate above one million can never be reached (`failures ≤ calls`).
pub(super) const PPM: u64 = 1_000_000;
pub(super) const NEVER: u64 = PPM + 1;

/// Which recent calls the rate rules look at (K2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerWindow {
    /// The last `n` recorded calls, `1 ≤ n ≤` [`MAX_WINDOW_CALLS`].
    Calls(u32),
    /// The calls recorded during the last `span`, kept in `buckets` buckets of `span / buckets`
    /// each (`1 ≤ buckets ≤` [`MAX_WINDOW_BUCKETS`]); a bucket leaves the window whole, so the
    /// window covers between `span − span/buckets` and `span`. The bucket width is
    /// `⌊span / buckets⌋` nanoseconds.
    Time {
        /// The span of the window.
        span: Duration,
        /// The number of buckets.
        buckets: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WindowSpec {
    Calls(u32),
    Time { width_ns: u64, buckets: u32 },
}

/// The configuration of a circuit breaker: trip rules (K2), open durations (K3) and half-open
/// probes (K4). Immutable; share one among any number of breakers.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, BreakerPolicy};
///
/// let policy = BreakerPolicy::builder(
///     Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build()?,
/// )
/// .consecutive_failures(5)
/// .failure_rate(0.5)
/// .count_window(100)
/// .minimum_calls(20)
/// .half_open_permits(3)
/// .probe_timeout(Duration::from_secs(2))
/// .build()?;
/// assert_eq!(policy.half_open_permits(), 3);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "BreakerPolicyBuilder", into = "BreakerPolicyBuilder")
)]
pub struct BreakerPolicy {
    pub(super) open: Backoff,
    /// `u64::MAX` for none.
    pub(super) consecutive: u64,
    pub(super) failure_ppm: u64,
    pub(super) slow_ppm: u64,
    /// `u64::MAX` for none.
    pub(super) slow_ns: u64,
    pub(super) window: WindowSpec,
    pub(super) minimum_calls: u32,
    pub(super) permits: u32,
    pub(super) close_after: u32,
    pub(super) probe_timeout_ns: u64,
    pub(super) half_open: HalfOpenRule,
    /// What a closed window must look like for this policy (see [`window_key`]): a state
    /// whose window has another key was made under another policy, and is rebuilt.
    pub(super) window_key: u64,
    // Kept to give the builder back exactly.
    pub(super) failure_rate: Option<f64>,
    pub(super) slow_call_rate: Option<f64>,
    pub(super) window_given: BreakerWindow,
}

/// How a half-open breaker decides between closing and reopening (K4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum HalfOpenRule {
    /// The first probe that fails (or is slow, when a slow-call rate is set, or whose lease
    /// expires) reopens the breaker; `successes_to_close` successful probes close it. The
    /// default: a dependency that is still down is shut off again at its first answer.
    #[default]
    FirstFailure,
    /// resilience4j's rule: the breaker admits `half_open_permits` probes in all (a probe
    /// recorded as [`CallOutcome::Ignored`] gives its place back), and once every one of
    /// them has answered (an expired lease answers as a failure) it reopens if their failure
    /// rate or slow-call rate reaches the policy's `failure_rate` or `slow_call_rate`, and
    /// closes otherwise. Needs a rate rule; `successes_to_close` does not apply.
    Rates,
}

/// The settings of a [`BreakerPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct BreakerPolicyBuilder {
    /// The open duration after the n-th consecutive opening (K3); reset when the breaker closes.
    pub open: Backoff,
    /// Trip after this many consecutive failures (K2).
    pub consecutive_failures: Option<u32>,
    /// Trip when the failure rate over the window reaches this fraction, in `(0, 1]` (K2).
    pub failure_rate: Option<f64>,
    /// Trip when the slow-call rate over the window reaches this fraction, in `(0, 1]` (K2).
    /// Needs `slow_call_threshold`.
    pub slow_call_rate: Option<f64>,
    /// A call that takes at least this long is slow.
    pub slow_call_threshold: Option<Duration>,
    /// The window the rates are computed over; `Calls(100)` by default.
    pub window: BreakerWindow,
    /// The rate rules apply only once the window holds at least this many calls. `None`: the
    /// size of a count window, or 100 for a time window.
    pub minimum_calls: Option<u32>,
    /// Probes admitted at once while half-open (K4); 1 by default, at most [`MAX_PERMITS`].
    pub half_open_permits: u32,
    /// Successful probes that close the breaker; `None`: `half_open_permits`.
    pub successes_to_close: Option<u32>,
    /// Each probe's lease: a probe whose result has not arrived this long after it was
    /// admitted counts as a failure (K4). 10 s by default.
    pub probe_timeout: Duration,
    /// How half-open ends (K4): [`HalfOpenRule::FirstFailure`] by default.
    #[cfg_attr(feature = "serde", serde(default))]
    pub half_open: HalfOpenRule,
}

impl BreakerPolicyBuilder {
    /// Trip after `n` consecutive failures.
    pub const fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = Some(n);
        self
    }

    /// Trip when the failure rate over the window reaches `rate` (in `(0, 1]`).
    pub const fn failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = Some(rate);
        self
    }

    /// Trip when the rate of calls taking at least `threshold` reaches `rate` (in `(0, 1]`).
    pub const fn slow_call_rate(mut self, rate: f64, threshold: Duration) -> Self {
        self.slow_call_rate = Some(rate);
        self.slow_call_threshold = Some(threshold);
        self
    }

    /// Computes the rates over the last `n` calls.
    pub const fn count_window(mut self, n: u32) -> Self {
        self.window = BreakerWindow::Calls(n);
        self
    }

    /// Computes the rates over the last `span`, in `buckets` buckets.
    pub const fn time_window(mut self, span: Duration, buckets: u32) -> Self {
        self.window = BreakerWindow::Time { span, buckets };
        self
    }

    /// The rate rules apply once the window holds at least `n` calls.
    pub const fn minimum_calls(mut self, n: u32) -> Self {
        self.minimum_calls = Some(n);
        self
    }

    /// At most `n` probes at once while half-open.
    pub const fn half_open_permits(mut self, n: u32) -> Self {
        self.half_open_permits = n;
        self
    }

    /// `n` successful probes close the breaker.
    pub const fn successes_to_close(mut self, n: u32) -> Self {
        self.successes_to_close = Some(n);
        self
    }

    /// Each probe's lease.
    pub const fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Half-open ends as resilience4j's does ([`HalfOpenRule::Rates`]): after
    /// `half_open_permits` probes have answered, by their failure and slow-call rates.
    pub const fn half_open_by_rates(mut self) -> Self {
        self.half_open = HalfOpenRule::Rates;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when no trip rule is set, `consecutive_failures` is zero, a rate is NaN,
    /// infinite, outside `[0, 1]` or zero, a slow-call rate has no (or a zero) threshold, the
    /// window is empty, too long or has too many buckets, `minimum_calls` is zero or larger
    /// than a count window, `half_open_permits` or `successes_to_close` is zero or
    /// `half_open_permits` exceeds [`MAX_PERMITS`], `probe_timeout` is zero or overflows, or
    /// [`HalfOpenRule::Rates`] is chosen without a rate rule or with `successes_to_close`.
    pub fn build(self) -> Result<BreakerPolicy, PolicyError> {
        if self.consecutive_failures.is_none() && self.failure_rate.is_none() && self.slow_call_rate.is_none() {
            return Err(PolicyError::Zero {
                setting: "trip rules",
                why: "with no consecutive_failures, failure_rate or slow_call_rate the breaker never opens; use `Breaker::handle_disable` for a breaker that never opens",
            });
        }
        let consecutive = match self.consecutive_failures {
            None => u64::MAX,
            Some(0) => {
                return Err(PolicyError::Zero {
                    setting: "consecutive_failures",
                    why: "the breaker would open before any call; use at least 1",
                });
            }
            Some(n) => u64::from(n),
        };
        let failure_ppm = rate_ppm(self.failure_rate, "failure_rate")?;
        let slow_ppm = rate_ppm(self.slow_call_rate, "slow_call_rate")?;
        let slow_ns = match self.slow_call_threshold {
            None if self.slow_call_rate.is_some() => {
                return Err(PolicyError::Zero {
                    setting: "slow_call_threshold",
                    why: "a slow-call rate needs the duration from which a call is slow",
                });
            }
            None => u64::MAX,
            Some(d) if d.is_zero() => {
                return Err(PolicyError::Zero {
                    setting: "slow_call_threshold",
                    why: "every call would be slow; leave slow_call_rate unset instead",
                });
            }
            Some(d) => saturating_nanos(d),
        };
        let (window, default_minimum) = window_spec(self.window)?;
        let minimum_calls = match self.minimum_calls {
            None => default_minimum,
            Some(0) => {
                return Err(PolicyError::Zero {
                    setting: "minimum_calls",
                    why: "a rate over no calls is meaningless; use at least 1",
                });
            }
            Some(n) => n,
        };
        if let WindowSpec::Calls(n) = window
            && minimum_calls > n
        {
            return Err(PolicyError::Conflict {
                setting: "minimum_calls",
                other: "a shorter count window",
                why: "the window never holds that many calls, so the rate rules would never apply",
            });
        }
        let close_after = self.close_after()?;
        let probe_timeout_ns =
            nanos_of(self.probe_timeout).ok_or(PolicyError::DurationOverflow { setting: "probe_timeout" })?;
        if probe_timeout_ns == 0 {
            return Err(PolicyError::Zero {
                setting: "probe_timeout",
                why: "every probe would fail at once; a probe needs time to answer",
            });
        }
        let rated = failure_ppm != NEVER || slow_ppm != NEVER;
        Ok(BreakerPolicy {
            open: self.open,
            consecutive,
            failure_ppm,
            slow_ppm,
            slow_ns,
            window_key: if rated { window_key(window) } else { 0 },
            window,
            minimum_calls,
            permits: self.half_open_permits,
            close_after,
            probe_timeout_ns,
            half_open: self.half_open,
            failure_rate: self.failure_rate,
            slow_call_rate: self.slow_call_rate,
            window_given: self.window,
        })
    }

    /// How many probe successes close the breaker; refuses half-open settings that could
    /// never close it or contradict the half-open rule.
    fn close_after(&self) -> Result<u32, PolicyError> {
        if self.half_open_permits == 0 {
            return Err(PolicyError::Zero {
                setting: "half_open_permits",
                why: "no probe could ever close the breaker; use at least 1",
            });
        }
        if self.half_open_permits > MAX_PERMITS {
            return Err(PolicyError::LimitTooLarge { setting: "half_open_permits", max: u64::from(MAX_PERMITS) });
        }
        let close_after = match self.successes_to_close {
            None => self.half_open_permits,
            Some(0) => {
                return Err(PolicyError::Zero {
                    setting: "successes_to_close",
                    why: "the breaker would close without a probe; use at least 1",
                });
            }
            Some(n) => n,
        };
        if self.half_open == HalfOpenRule::Rates {
            if self.failure_rate.is_none() && self.slow_call_rate.is_none() {
                return Err(PolicyError::Conflict {
                    setting: "half_open (Rates)",
                    other: "no failure_rate or slow_call_rate",
                    why: "the probes' rates are judged against the policy's rate rules; set one, or keep HalfOpenRule::FirstFailure",
                });
            }
            if self.successes_to_close.is_some() {
                return Err(PolicyError::Conflict {
                    setting: "successes_to_close",
                    other: "half_open (Rates)",
                    why: "under the Rates rule the breaker decides after half_open_permits probes have answered; leave successes_to_close unset",
                });
            }
        }
        Ok(close_after)
    }
}

/// A window as the breaker keeps it, and the default `minimum_calls` for it; refuses an empty,
/// too long or too finely bucketed window.
fn window_spec(window: BreakerWindow) -> Result<(WindowSpec, u32), PolicyError> {
    match window {
        BreakerWindow::Calls(0) => {
            Err(PolicyError::Zero { setting: "window calls", why: "an empty window has no rate; use at least 1" })
        }
        BreakerWindow::Calls(n) if n > MAX_WINDOW_CALLS => {
            Err(PolicyError::LimitTooLarge { setting: "window calls", max: u64::from(MAX_WINDOW_CALLS) })
        }
        BreakerWindow::Calls(n) => Ok((WindowSpec::Calls(n), n)),
        BreakerWindow::Time { buckets: 0, .. } => {
            Err(PolicyError::Zero { setting: "window buckets", why: "a time window needs at least 1 bucket" })
        }
        BreakerWindow::Time { buckets, .. } if buckets > MAX_WINDOW_BUCKETS => {
            Err(PolicyError::LimitTooLarge { setting: "window buckets", max: u64::from(MAX_WINDOW_BUCKETS) })
        }
        BreakerWindow::Time { span, buckets } => {
            let span_ns = nanos_of(span).ok_or(PolicyError::DurationOverflow { setting: "window span" })?;
            let width_ns = span_ns / u64::from(buckets);
            if width_ns == 0 {
                return Err(PolicyError::Zero {
                    setting: "window span",
                    why: "each bucket must be at least 1 ns wide (span ≥ buckets ns)",
                });
            }
            if width_ns > MAX_BUCKET_WIDTH_NS {
                return Err(PolicyError::LimitTooLarge {
                    setting: "window bucket width (ns)",
                    max: MAX_BUCKET_WIDTH_NS,
                });
            }
            Ok((WindowSpec::Time { width_ns, buckets }, 100))
        }
    }
}

/// A rate in `(0, 1]` as parts per million (rounded to the nearest), or [`NEVER`] when unset.
pub(super) fn rate_ppm(rate: Option<f64>, setting: &'static str) -> Result<u64, PolicyError> {
    let Some(rate) = rate else { return Ok(NEVER) };
    if !rate.is_finite() {
        return Err(PolicyError::NotFinite { setting, value: rate });
    }
    if !(0.0..=1.0).contains(&rate) {
        return Err(PolicyError::FractionOutOfRange { setting, value: rate });
    }
    let ppm = (rate * PPM as f64 + 0.5) as u64;
    if ppm == 0 {
        return Err(PolicyError::Zero {
            setting,
            why: "a zero rate (below 1 ppm) trips on every window, even one without failures; leave it unset",
        });
    }
    Ok(ppm)
}

impl TryFrom<BreakerPolicyBuilder> for BreakerPolicy {
    type Error = PolicyError;

    fn try_from(builder: BreakerPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<BreakerPolicy> for BreakerPolicyBuilder {
    fn from(policy: BreakerPolicy) -> Self {
        BreakerPolicyBuilder {
            open: policy.open,
            consecutive_failures: (policy.consecutive != u64::MAX).then_some(policy.consecutive as u32),
            failure_rate: policy.failure_rate,
            slow_call_rate: policy.slow_call_rate,
            // A slow-call rate always has a threshold, also one that saturated to `u64::MAX` ns.
            slow_call_threshold: (policy.slow_ns != u64::MAX || policy.slow_call_rate.is_some())
                .then(|| Duration::from_nanos(policy.slow_ns)),
            window: policy.window_given,
            minimum_calls: Some(policy.minimum_calls),
            half_open_permits: policy.permits,
            successes_to_close: (policy.half_open == HalfOpenRule::FirstFailure).then_some(policy.close_after),
            probe_timeout: Duration::from_nanos(policy.probe_timeout_ns),
            half_open: policy.half_open,
        }
    }
}

impl BreakerPolicy {
    /// A builder with `open` durations, no trip rule yet, a window of the last 100 calls, one
    /// half-open probe at a time and a 10 s probe lease.
    pub const fn builder(open: Backoff) -> BreakerPolicyBuilder {
        BreakerPolicyBuilder {
            open,
            consecutive_failures: None,
            failure_rate: None,
            slow_call_rate: None,
            slow_call_threshold: None,
            window: BreakerWindow::Calls(100),
            minimum_calls: None,
            half_open_permits: 1,
            successes_to_close: None,
            probe_timeout: Duration::from_secs(10),
            half_open: HalfOpenRule::FirstFailure,
        }
    }

    /// The open durations over consecutive openings.
    pub const fn open_backoff(&self) -> &Backoff {
        &self.open
    }

    /// Probes admitted at once while half-open.
    pub const fn half_open_permits(&self) -> u32 {
        self.permits
    }

    /// Successful probes that close the breaker (under [`HalfOpenRule::FirstFailure`]).
    pub const fn successes_to_close(&self) -> u32 {
        self.close_after
    }

    /// How half-open ends.
    pub const fn half_open_rule(&self) -> HalfOpenRule {
        self.half_open
    }

    /// Each probe's lease.
    pub const fn probe_timeout(&self) -> Duration {
        Duration::from_nanos(self.probe_timeout_ns)
    }

    /// The calls the window must hold before the rate rules apply.
    pub const fn minimum_calls(&self) -> u32 {
        self.minimum_calls
    }

    /// The window the rates are computed over.
    pub const fn window(&self) -> BreakerWindow {
        self.window_given
    }

    /// Whether a rate rule (failure or slow-call rate) is set, so that every call must be
    /// recorded in the window; with consecutive failures alone, a success while closed with no
    /// streak changes nothing.
    pub const fn counts_every_call(&self) -> bool {
        self.failure_ppm != NEVER || self.slow_ppm != NEVER
    }
}
