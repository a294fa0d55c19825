//! A circuit breaker that cannot wedge (rules K1–K5).
//!
//! A [`BreakerPolicy`] is the shared, immutable configuration: when to trip, how long to stay
//! open, how many probes to let through while half-open and how long each probe may take. A
//! [`Breaker`] is one dependency's state: fixed-size plain data (no allocation, no clock, no
//! RNG inside), so it can be cloned, compared and persisted.
//!
//! Admission is a query plus a recorded permit (K5): [`Breaker::try_acquire`] answers with a
//! [`Permit`] or a [`Rejected`] carrying `retry_after`; the caller makes the call and hands the
//! permit back with its outcome to [`Breaker::record`]. A permit names its breaker, the state
//! generation it was issued in and its own id, so a stale or foreign permit is refused as misuse
//! ([`BreakerError`]) and changes nothing.
//!
//! The closed path (admission + record) allocates nothing and is O(1): a consecutive-failure
//! counter, plus, when a rate rule is configured, one two-bit slot of a fixed ring (count
//! window) or one bucket (time window, with a division only when a new bucket starts).

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState};
use crate::outbox::Outbox;
use crate::time::{nanos_of, saturating_nanos};
use crate::{Instant, PolicyError};

/// The longest count-based window, in calls: the window keeps two bits per call in 16 words.
pub const MAX_WINDOW_CALLS: u32 = 32 * WORDS as u32;
/// The most buckets a time-based window may have.
pub const MAX_WINDOW_BUCKETS: u32 = BUCKETS as u32;
/// The most probes a half-open breaker may let through at once.
pub const MAX_PERMITS: u32 = LEASES as u32;

const WORDS: usize = 16;
const BUCKETS: usize = 16;
const LEASES: usize = 16;
/// The widest time-window bucket: about 18 years, so that a window's key fits in 64 bits.
const MAX_BUCKET_WIDTH_NS: u64 = (1 << 59) - 1;

/// A window's shape as one number, unique per shape: 0 for no window (consecutive failures
/// only), `n << 5` for the last `n` calls, `width << 5 | buckets` for a time window (`buckets`
/// is 1..=16, so the low bits tell the kinds apart).
const fn window_key(spec: WindowSpec) -> u64 {
    match spec {
        WindowSpec::Calls(n) => (n as u64) << 5,
        WindowSpec::Time { width_ns, buckets } => (width_ns << 5) | buckets as u64,
    }
}

/// Rates are parts per million; a rate above one million can never be reached (`failures ≤ calls`).
const PPM: u64 = 1_000_000;
const NEVER: u64 = PPM + 1;

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
enum WindowSpec {
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
    open: Backoff,
    /// `u64::MAX` for none.
    consecutive: u64,
    failure_ppm: u64,
    slow_ppm: u64,
    /// `u64::MAX` for none.
    slow_ns: u64,
    window: WindowSpec,
    minimum_calls: u32,
    permits: u32,
    close_after: u32,
    probe_timeout_ns: u64,
    half_open: HalfOpenRule,
    /// What a closed window must look like for this policy (see [`window_key`]): a state
    /// whose window has another key was made under another policy, and is rebuilt.
    window_key: u64,
    // Kept to give the builder back exactly.
    failure_rate: Option<f64>,
    slow_call_rate: Option<f64>,
    window_given: BreakerWindow,
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
        let (window, default_minimum) = match self.window {
            BreakerWindow::Calls(0) => {
                return Err(PolicyError::Zero {
                    setting: "window calls",
                    why: "an empty window has no rate; use at least 1",
                });
            }
            BreakerWindow::Calls(n) if n > MAX_WINDOW_CALLS => {
                return Err(PolicyError::LimitTooLarge { setting: "window calls", max: u64::from(MAX_WINDOW_CALLS) });
            }
            BreakerWindow::Calls(n) => (WindowSpec::Calls(n), n),
            BreakerWindow::Time { buckets: 0, .. } => {
                return Err(PolicyError::Zero {
                    setting: "window buckets",
                    why: "a time window needs at least 1 bucket",
                });
            }
            BreakerWindow::Time { buckets, .. } if buckets > MAX_WINDOW_BUCKETS => {
                return Err(PolicyError::LimitTooLarge {
                    setting: "window buckets",
                    max: u64::from(MAX_WINDOW_BUCKETS),
                });
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
                (WindowSpec::Time { width_ns, buckets }, 100)
            }
        };
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
}

/// A rate in `(0, 1]` as parts per million (rounded to the nearest), or [`NEVER`] when unset.
fn rate_ppm(rate: Option<f64>, setting: &'static str) -> Result<u64, PolicyError> {
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

/// How a call went, as reported to [`Breaker::record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CallOutcome {
    /// The call succeeded (it may still be slow).
    Success,
    /// The call failed in a way that says something about the dependency.
    Failure,
    /// The call says nothing about the dependency (canceled by the caller, rejected as
    /// invalid input): the permit is released and nothing is counted.
    Ignored,
}

/// Leave to make one call, from [`Breaker::try_acquire`]; hand it back to [`Breaker::record`].
///
/// A permit is tied to its breaker (the id given to [`Breaker::new`]), to the state it was
/// issued in (a generation that changes on every transition) and to its own id. Recording it
/// after the breaker changed state, twice, or on another breaker is refused ([`BreakerError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a permit must be handed back to `Breaker::record`; a half-open probe's lease otherwise expires as a failure"]
pub struct Permit {
    breaker: u32,
    generation: u32,
    id: u32,
    acquired_at: Instant,
}

impl Permit {
    /// When it was issued (the `now` given to [`Breaker::try_acquire`]).
    pub const fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Its id (unique among the permits of its breaker until 2³¹ have been issued).
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The state generation it was issued in (see [`Breaker::generation`]).
    pub const fn generation(&self) -> u32 {
        self.generation
    }

    /// The id of the breaker that issued it.
    pub const fn breaker(&self) -> u32 {
        self.breaker
    }

    /// Whether it is a half-open probe (its result decides whether the breaker closes).
    pub const fn is_probe(&self) -> bool {
        self.id & PROBE_BIT != 0
    }
}

/// Probe ids have the top bit set, so a closed-state permit is never mistaken for a probe.
const PROBE_BIT: u32 = 1 << 31;

/// A refused admission: the breaker is open, isolated, or its half-open probes are all out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[error("the circuit breaker rejected the call (retry after {retry_after:?})")]
pub struct Rejected {
    /// How long until the breaker may admit a call again (K3): until it turns half-open, or
    /// until the earliest probe lease ends. `None` while isolated by hand.
    pub retry_after: Option<Duration>,
}

/// A caller mistake on [`Breaker::record`]; the breaker is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum BreakerError {
    /// The permit was issued by another breaker.
    #[error(
        "the permit belongs to breaker {got}, not to this breaker ({this}); record it on the breaker that issued it"
    )]
    Foreign {
        /// This breaker's id.
        this: u32,
        /// The id in the permit.
        got: u32,
    },
    /// The breaker changed state since the permit was issued; its result no longer counts.
    #[error(
        "stale permit from state generation {got} (the breaker is at {current}); its result no longer counts and may be dropped"
    )]
    Stale {
        /// The breaker's generation.
        current: u32,
        /// The generation in the permit.
        got: u32,
    },
    /// The permit was already recorded, or its probe lease already expired. Probes are tracked
    /// one by one; closed-state permits are only counted (a table would cost the closed path
    /// its speed), so a closed permit recorded twice is caught only when no other permit of
    /// the same state is outstanding.
    #[error("permit {id} is not outstanding: already recorded, its lease expired, or never issued")]
    NotOutstanding {
        /// The permit's id.
        id: u32,
    },
    /// A transition by hand ([`Breaker::handle_open`], [`Breaker::handle_half_open`]) that
    /// makes no sense from where the breaker is.
    #[error("a breaker that is {from:?} cannot be moved to {to:?} by hand: {why}")]
    IllegalTransition {
        /// Where the breaker is.
        from: BreakerState,
        /// Where it was asked to go.
        to: BreakerState,
        /// Why not, and what to do instead.
        why: &'static str,
    },
}

/// Where a breaker is (K1); see [`Breaker::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerStatus {
    /// Calls are admitted and counted.
    Closed,
    /// Calls are rejected until `until`.
    Open {
        /// When it turns half-open.
        until: Instant,
    },
    /// Probes are admitted, at most the policy's `half_open_permits` at once (in all, under
    /// [`HalfOpenRule::Rates`]).
    HalfOpen {
        /// Probes in flight.
        permits: u32,
    },
    /// Forced open by hand: every call is rejected until [`Breaker::handle_reset`].
    Isolated,
    /// Forced closed by hand: every call is admitted and nothing is counted until
    /// [`Breaker::handle_reset`].
    Disabled,
    /// Forced closed by hand, still counting: every call is admitted and counted in the window
    /// ([`Breaker::window_counts`]), and no rule trips it, until [`Breaker::handle_reset`].
    MetricsOnly,
}

impl BreakerStatus {
    /// The kind of state, without its details.
    pub const fn state(&self) -> BreakerState {
        match self {
            BreakerStatus::Closed => BreakerState::Closed,
            BreakerStatus::Open { .. } => BreakerState::Open,
            BreakerStatus::HalfOpen { .. } => BreakerState::HalfOpen,
            BreakerStatus::Isolated => BreakerState::Isolated,
            BreakerStatus::Disabled => BreakerState::Disabled,
            BreakerStatus::MetricsOnly => BreakerState::MetricsOnly,
        }
    }
}

/// The kinds of [`BreakerStatus`], as named by [`BreakerError::IllegalTransition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerState {
    /// See [`BreakerStatus::Closed`].
    Closed,
    /// See [`BreakerStatus::Open`].
    Open,
    /// See [`BreakerStatus::HalfOpen`].
    HalfOpen,
    /// See [`BreakerStatus::Isolated`].
    Isolated,
    /// See [`BreakerStatus::Disabled`].
    Disabled,
    /// See [`BreakerStatus::MetricsOnly`].
    MetricsOnly,
}

/// A change of a breaker's state (O1), drained with [`Breaker::poll_event`].
///
/// Only changes of kind are events: closed, open, half-open, isolated, disabled, metrics-only.
/// Probes going out and coming back while half-open are not, nor is a reset of a closed
/// breaker. Each event's `from` is of the kind of the previous event's `to`, and the last
/// event's `to` of the kind of the breaker's [`status`](Breaker::status); `from` and `to` are the
/// statuses at the moment of the change (a half-open breaker's probes out may differ between
/// one event's `to` and the next's `from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct BreakerEvent {
    /// The state the breaker left.
    pub from: BreakerStatus,
    /// The state it entered; `Open { until }` says until when it rejects calls.
    pub to: BreakerStatus,
    /// When: the `now` of the input that made the change, or, for an expired probe lease, the
    /// lease's deadline.
    pub at: Instant,
    /// The generation of the state entered ([`Breaker::generation`]); it grows with every
    /// change, so events heard out of order can be put back in order.
    pub generation: u32,
    /// Which rule made the change.
    pub reason: BreakerReason,
}

impl BreakerEvent {
    /// For an opening, how long the breaker rejects calls (`until − at`, drawn from the open
    /// backoff, K3); `None` for every other change.
    pub const fn open_for(&self) -> Option<Duration> {
        match self.to {
            BreakerStatus::Open { until } => Some(until.saturating_duration_since(self.at)),
            _ => None,
        }
    }
}

/// Why a breaker changed state, as told by its [`BreakerEvent`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum BreakerReason {
    /// Opened: the consecutive-failure rule held (K2).
    ConsecutiveFailures,
    /// Opened: the failure rate reached the policy's, over the closed window's calls or, under
    /// [`HalfOpenRule::Rates`], over the half-open probes' answers.
    FailureRate,
    /// Opened: the slow-call rate reached the policy's, over the same calls.
    SlowCallRate,
    /// Reopened: a probe failed, or was slow, under [`HalfOpenRule::FirstFailure`] (K4).
    ProbeFailed,
    /// Reopened: a probe's lease ran out before its result came, under
    /// [`HalfOpenRule::FirstFailure`] (counted as a failure at the lease's deadline, K4).
    ProbeExpired,
    /// Closed: enough probes succeeded.
    ProbesSucceeded,
    /// Half-open: the open period ended.
    OpenPeriodEnded,
    /// A change made by hand: `handle_open`, `handle_half_open`, `handle_isolate`,
    /// `handle_disable`, `handle_metrics_only` or `handle_reset`.
    ByHand,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Bucket {
    calls: u32,
    failures: u32,
    slow: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Ring {
    /// The trip rules need no window (consecutive failures only).
    None,
    /// Bits `2i` (failed) and `2i + 1` (slow) of the bitset are call slot `i` of `len`;
    /// `head` is the next slot to write.
    Calls { head: u32, len: u32, bits: [u64; WORDS] },
    /// Epoch `e` (= `now / width`) has a bucket while `e` is among the `count` newest epochs;
    /// `slot` is the newest epoch's bucket, and `start` the instant (ns) that epoch starts (a
    /// multiple of `width`, so it never overflows), so that a call within the current bucket
    /// costs no division.
    Time { start: u64, slot: u32, width: u64, count: u32, buckets: [Bucket; BUCKETS] },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Window {
    consecutive: u32,
    calls: u32,
    failures: u32,
    slow: u32,
    /// The policy's `window_key` this window was built for.
    key: u64,
    ring: Ring,
}

impl Window {
    fn new(policy: &BreakerPolicy) -> Self {
        let ring = if policy.window_key == 0 {
            Ring::None
        } else {
            match policy.window {
                WindowSpec::Calls(n) => Ring::Calls { head: 0, len: n.clamp(1, MAX_WINDOW_CALLS), bits: [0; WORDS] },
                WindowSpec::Time { width_ns, buckets } => Ring::Time {
                    start: 0,
                    slot: 0,
                    width: width_ns.max(1),
                    count: buckets.clamp(1, MAX_WINDOW_BUCKETS),
                    buckets: [Bucket::default(); BUCKETS],
                },
            }
        };
        Window { consecutive: 0, calls: 0, failures: 0, slow: 0, key: policy.window_key, ring }
    }

    /// The window for `policy` after one made under another policy: empty, keeping the
    /// consecutive failures (which no window shape changes).
    #[cold]
    fn rebuild(&mut self, policy: &BreakerPolicy) {
        let consecutive = self.consecutive;
        *self = Window::new(policy);
        self.consecutive = consecutive;
    }

    /// The key of this window's own shape (what `key` must say).
    fn own_key(&self) -> u64 {
        match self.ring {
            Ring::None => 0,
            Ring::Calls { len, .. } => window_key(WindowSpec::Calls(len)),
            Ring::Time { width, count, .. } => window_key(WindowSpec::Time { width_ns: width, buckets: count }),
        }
    }

    /// Whether a loaded window is one `push` could have made.
    fn validate(&self) -> Result<(), &'static str> {
        if self.key != self.own_key() {
            return Err("a window's key does not describe its shape");
        }
        let (calls, failures, slow) = match &self.ring {
            Ring::None => (0, 0, 0),
            Ring::Calls { head, len, bits } => {
                if *len == 0 || *len > MAX_WINDOW_CALLS || *head >= *len || self.calls > *len {
                    return Err("a count window's length, head or call count is out of range");
                }
                if self.calls < *len && *head != self.calls {
                    return Err("a count window that is not full does not continue where it stopped");
                }
                let (mut failed, mut slow) = (0u64, 0u64);
                for slot in 0..MAX_WINDOW_CALLS {
                    let pair = (bits[(slot >> 5) as usize] >> ((slot & 31) * 2)) & 3;
                    if slot >= self.calls && pair != 0 {
                        return Err("a count window holds a call in a slot it never wrote");
                    }
                    failed += pair & 1;
                    slow += pair >> 1;
                }
                (u64::from(self.calls), failed, slow)
            }
            Ring::Time { start, slot, width, count, buckets } => {
                if *width == 0 || *width > MAX_BUCKET_WIDTH_NS || *count == 0 || *count > MAX_WINDOW_BUCKETS {
                    return Err("a time window's width or bucket count is out of range");
                }
                if *slot >= *count || !start.is_multiple_of(*width) {
                    return Err("a time window's current bucket is out of range");
                }
                let (mut calls, mut failed, mut slow) = (0u64, 0u64, 0u64);
                for (i, b) in buckets.iter().enumerate() {
                    if (i as u32 >= *count && *b != Bucket::default()) || b.failures > b.calls || b.slow > b.calls {
                        return Err("a time window's bucket holds counts it cannot have");
                    }
                    calls += u64::from(b.calls);
                    failed += u64::from(b.failures);
                    slow += u64::from(b.slow);
                }
                (calls, failed, slow)
            }
        };
        // Totals saturate at `u32::MAX` (more calls than that in one window are counted as
        // that many), so a sum past it stands for a saturated total.
        let saturated = |sum: u64| sum.min(u64::from(u32::MAX));
        if (u64::from(self.calls), u64::from(self.failures), u64::from(self.slow))
            != (saturated(calls), saturated(failures), saturated(slow))
        {
            return Err("a window's totals are not the sums of its calls");
        }
        Ok(())
    }

    /// Which trip rule holds, once [`push`](Self::push) said one does.
    #[cold]
    fn trip_reason(&self, policy: &BreakerPolicy) -> BreakerReason {
        if u64::from(self.consecutive) >= policy.consecutive {
            BreakerReason::ConsecutiveFailures
        } else if u64::from(self.failures) * PPM >= policy.failure_ppm * u64::from(self.calls) {
            BreakerReason::FailureRate
        } else {
            BreakerReason::SlowCallRate
        }
    }

    /// Counts one call; returns whether a trip rule now holds. O(1) for a count window, O(1)
    /// amortised for a time window (a division only when the call opens a new bucket).
    #[inline]
    fn push(&mut self, policy: &BreakerPolicy, now: Instant, failed: bool, slow: bool) -> bool {
        // Wraps to 0 only after 2^32 failures with no consecutive limit set (a limit trips first).
        self.consecutive = self.consecutive.wrapping_add(1).wrapping_mul(u32::from(failed));
        let (f, s) = (u32::from(failed), u32::from(slow));
        match &mut self.ring {
            Ring::None => return u64::from(self.consecutive) >= policy.consecutive,
            Ring::Calls { head, len, bits } => {
                let slot = *head & (MAX_WINDOW_CALLS - 1);
                let (word, shift) = ((slot >> 5) as usize & (WORDS - 1), (slot & 31) * 2);
                let w = bits[word];
                let old = (w >> shift) as u32;
                bits[word] = (w & !(3 << shift)) | (u64::from(f | (s << 1)) << shift);
                // A set bit was counted when it was set, so these never underflow.
                self.failures = self.failures.wrapping_add(f).wrapping_sub(old & 1);
                self.slow = self.slow.wrapping_add(s).wrapping_sub((old >> 1) & 1);
                self.calls += u32::from(self.calls < *len);
                *head = if slot + 1 >= *len { 0 } else { slot + 1 };
            }
            Ring::Time { start, slot, width, count, buckets } => {
                let now = now.as_nanos();
                // An earlier `now` than the newest epoch's start is read as in that epoch.
                if now.saturating_sub(*start) >= *width {
                    let epoch = now / *width;
                    let current = *start / *width;
                    let gap = epoch.saturating_sub(current).min(u64::from(*count)) as u32;
                    for _ in 0..gap {
                        *slot = if *slot + 1 >= *count { 0 } else { *slot + 1 };
                        let b = &mut buckets[*slot as usize & (BUCKETS - 1)];
                        self.calls = self.calls.saturating_sub(b.calls);
                        self.failures = self.failures.saturating_sub(b.failures);
                        self.slow = self.slow.saturating_sub(b.slow);
                        *b = Bucket::default();
                    }
                    *start = epoch * *width;
                }
                let b = &mut buckets[*slot as usize & (BUCKETS - 1)];
                b.calls = b.calls.saturating_add(1);
                b.failures = b.failures.saturating_add(f);
                b.slow = b.slow.saturating_add(s);
                self.calls = self.calls.saturating_add(1);
                self.failures = self.failures.saturating_add(f);
                self.slow = self.slow.saturating_add(s);
            }
        }
        let calls = u64::from(self.calls);
        u64::from(self.consecutive) >= policy.consecutive
            || (self.calls >= policy.minimum_calls
                && (u64::from(self.failures) * PPM >= policy.failure_ppm * calls
                    || u64::from(self.slow) * PPM >= policy.slow_ppm * calls))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct Probes {
    successes: u32,
    /// Bit `i` set: lease slot `i` is held.
    busy: u16,
    ids: [u32; LEASES],
    deadlines: [Instant; LEASES],
    /// Under [`HalfOpenRule::Rates`]: probes that answered (recorded, or expired as failures),
    /// and how many of them failed and how many were slow.
    #[cfg_attr(feature = "serde", serde(default))]
    answered: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    failed: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    slow: u32,
}

impl Probes {
    const fn new() -> Self {
        Probes {
            successes: 0,
            busy: 0,
            ids: [0; LEASES],
            deadlines: [Instant::ZERO; LEASES],
            answered: 0,
            failed: 0,
            slow: 0,
        }
    }

    const fn held(&self) -> u32 {
        self.busy.count_ones()
    }

    fn slot_of(&self, id: u32) -> Option<usize> {
        (0..LEASES).find(|&i| self.busy & (1 << i) != 0 && self.ids[i] == id)
    }

    /// The earliest deadline among held leases.
    fn earliest(&self) -> Option<Instant> {
        self.earliest_slot().map(|(_, deadline)| deadline)
    }

    /// The latest deadline among held leases.
    fn latest(&self) -> Option<Instant> {
        (0..LEASES).filter(|&i| self.busy & (1 << i) != 0).map(|i| self.deadlines[i]).max()
    }

    /// The held lease with the earliest deadline, and that deadline.
    fn earliest_slot(&self) -> Option<(usize, Instant)> {
        (0..LEASES).filter(|&i| self.busy & (1 << i) != 0).map(|i| (i, self.deadlines[i])).min_by_key(|&(_, d)| d)
    }

    /// Counts an answer under [`HalfOpenRule::Rates`].
    fn answer(&mut self, failed: bool, slow: bool) {
        self.answered = self.answered.saturating_add(1);
        self.failed = self.failed.saturating_add(u32::from(failed));
        self.slow = self.slow.saturating_add(u32::from(slow));
    }
}

/// `repr(u8)`: an explicit tag byte, so telling closed from the rest is one compare (without
/// it the tag hides in `Ring`'s niche and every call decodes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u8)]
enum Phase {
    Closed(Window),
    Open { until: Instant },
    HalfOpen(Probes),
    Isolated,
    Disabled,
    MetricsOnly(Window),
}

/// One dependency's circuit breaker (rules K1–K5).
///
/// # Driving it
///
/// Before each call, [`try_acquire`](Self::try_acquire): a [`Permit`] means make the call, a
/// [`Rejected`] means don't (and says when to ask again). After the call,
/// [`record`](Self::record) the permit with its [`CallOutcome`]. Wake the breaker at
/// [`poll_timeout`](Self::poll_timeout) with [`handle_timeout`](Self::handle_timeout): the end
/// of the open period, or the earliest probe lease. Every verb also does the work that is due,
/// so a driver that never calls `handle_timeout` still cannot wedge the breaker: the next
/// `try_acquire` turns it half-open, and expires overdue probe leases as failures (K4).
///
/// Its decisions are the results of `try_acquire`, and its state is [`status`](Self::status).
/// Transitions happen only inside `try_acquire`, `record`, `handle_timeout` and the manual
/// `handle_open` / `handle_half_open` / `handle_isolate` / `handle_disable` /
/// `handle_metrics_only` / `handle_reset`; each one is told as a [`BreakerEvent`], with its
/// reason, drained with [`poll_event`](Self::poll_event) (O1).
///
/// **Drain order.** Events come out in the order they happened. One input makes at most three
/// (a probe lease noticed late reopens the breaker, its open period has already ended, and a
/// hand-made change follows); up to four wait, and a fifth pushes the oldest out, counted by
/// [`dropped_events`](Self::dropped_events). Drain after every input to lose none. Draining
/// costs nothing when there is nothing to drain; a breaker nobody drains pays nothing on the
/// closed path either (events are written on transitions only). Events are outputs, not state:
/// a serialized breaker leaves them out.
///
/// **States** (K1): `Closed` → (a trip rule holds, K2) → `Open { until }` → (at `until`) →
/// `HalfOpen` → (`successes_to_close` successful probes) → `Closed`, or (one failed or expired
/// probe) → `Open` again, for the next, longer open duration of the backoff (K3); under
/// [`HalfOpenRule::Rates`], half-open instead waits for `half_open_permits` answers and decides
/// by their rates. `Isolated`, `Disabled` and `MetricsOnly` are set and left by hand, and a
/// breaker can be opened or turned half-open by hand (`handle_open`, `handle_half_open`).
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. A probe lease that expired is counted as a failure at its deadline, also
/// when the breaker only notices later, so the state does not depend on how promptly
/// `handle_timeout` was called. `handle_timeout` early or twice changes nothing.
///
/// **Misuse** (a permit from another breaker, from an earlier state, or recorded twice)
/// returns a [`BreakerError`] and leaves the breaker exactly as it was (G12).
///
/// **Another policy.** A breaker is plain data and may outlive its policy (persisted, then
/// loaded under a new one). The thresholds, permits and `successes_to_close` of the policy it
/// is driven under apply at once (a half-open breaker holding more probes than the new
/// `half_open_permits` admits no more until enough return); an open period or a probe lease
/// already set is kept, and the new open durations and leases apply from the next opening or
/// probe. A closed window built for another
/// window shape (another kind, length, span or bucket count, or none where a rate rule now
/// needs one) is rebuilt empty at the next recorded call, keeping the consecutive failures: a
/// rate is never computed over calls counted under another shape. A loaded state is validated
/// (`serde`): one that no sequence of calls could have made is refused.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, Breaker, BreakerPolicy, BreakerStatus, CallOutcome, Instant};
/// use rand_core::SeedableRng;
///
/// let policy = BreakerPolicy::builder(Backoff::constant(Duration::from_secs(5)).build()?)
///     .consecutive_failures(2)
///     .build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut breaker = Breaker::new(&policy, 7);
/// let now = Instant::from_secs(100);
/// for _ in 0..2 {
///     let permit = breaker.try_acquire(&policy, now, &mut rng)?;
///     breaker.record(&policy, now, permit, CallOutcome::Failure, &mut rng)?;
/// }
/// assert_eq!(breaker.status(), BreakerStatus::Open { until: Instant::from_secs(105) });
/// let rejected = breaker.try_acquire(&policy, Instant::from_secs(101), &mut rng).unwrap_err();
/// assert_eq!(rejected.retry_after, Some(Duration::from_secs(4)));
///
/// // At `until` one probe goes through; its success closes the breaker.
/// let probe = breaker.try_acquire(&policy, Instant::from_secs(105), &mut rng)?;
/// assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 1 });
/// breaker.record(&policy, Instant::from_secs(106), probe, CallOutcome::Success, &mut rng)?;
/// assert_eq!(breaker.status(), BreakerStatus::Closed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Breaker {
    id: u32,
    generation: u32,
    /// The next permit id (probe ids are drawn from the same counter, with [`PROBE_BIT`]).
    next_id: u32,
    /// Closed or disabled: `next_id` when this generation began, plus the permits recorded
    /// since (mod 2^31), so `next_id − settled` permits are outstanding. Only `record` writes
    /// it and only `try_acquire` writes `next_id`: one store each per call on the closed path.
    settled: u32,
    last_now: Instant,
    openings: BackoffState,
    phase: Phase,
    /// Undrained transitions (outputs, not state: never serialized).
    #[cfg_attr(feature = "serde", serde(skip))]
    events: Outbox<BreakerEvent, 4>,
}

impl Breaker {
    /// A closed breaker with an empty window. `id` tells its permits apart from other
    /// breakers' (any value unique among the breakers a permit could be confused with).
    pub fn new(policy: &BreakerPolicy, id: u32) -> Self {
        Breaker {
            id,
            generation: 0,
            next_id: 0,
            settled: 0,
            last_now: Instant::ZERO,
            openings: BackoffState::new(),
            phase: Phase::Closed(Window::new(policy)),
            events: Outbox::new(),
        }
    }

    /// Asks to make one call at `now` (K5). Closed or disabled: a permit. Open: a permit for
    /// the first probe once `until` has passed (the breaker turns half-open), a [`Rejected`]
    /// before. Half-open: a probe permit while fewer than `half_open_permits` are out (K4),
    /// after expiring overdue leases as failures (a reopening whose open period has already
    /// ended admits the probe at once). Isolated: rejected.
    ///
    /// `rng` is drawn from only when an expired probe lease reopens the breaker (jitter of
    /// the open duration).
    ///
    /// # Errors
    /// [`Rejected`], with the time until the breaker may admit a call again.
    #[inline]
    pub fn try_acquire<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<Permit, Rejected> {
        match self.phase {
            Phase::Closed(_) => Ok(self.issue(now)),
            // Open and not yet due: nothing changes.
            Phase::Open { until } if now < until && self.last_now < until => {
                Err(Rejected { retry_after: Some(until.saturating_duration_since(self.last_now.later(now))) })
            }
            _ => {
                let id = self.acquire_slow(policy, now, rng)?;
                let acquired_at = if id & PROBE_BIT != 0 { self.last_now } else { now };
                Ok(Permit { breaker: self.id, generation: self.generation, id, acquired_at })
            }
        }
    }

    /// A closed or disabled state's permit.
    #[inline]
    fn issue(&mut self, now: Instant) -> Permit {
        let id = self.next_id;
        self.next_id = id.wrapping_add(1) & !PROBE_BIT;
        Permit { breaker: self.id, generation: self.generation, id, acquired_at: now }
    }

    /// Every state but closed. Returns the permit's id only (a probe's was acquired at
    /// `last_now`, a disabled breaker's at `now`): 16 bytes come back in registers, where a
    /// whole `Result<Permit, _>` would come back through memory and make the caller's closed
    /// path build its permit in memory too.
    #[cold]
    fn acquire_slow<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<u32, Rejected> {
        if let Phase::Disabled | Phase::MetricsOnly(_) = self.phase {
            return Ok(self.issue(now).id);
        }
        let now = self.last_now.later(now);
        self.settle(policy, now, rng);
        match &mut self.phase {
            Phase::HalfOpen(probes) => {
                let cap = policy.permits.min(MAX_PERMITS);
                // Under the rates rule the probes that answered keep their places: `cap` in all.
                let taken = match policy.half_open {
                    HalfOpenRule::FirstFailure => probes.held(),
                    HalfOpenRule::Rates => probes.held().saturating_add(probes.answered),
                };
                if taken >= cap && probes.busy != 0 {
                    // A place frees when a lease ends (first failure); under the rates rule the
                    // breaker decides, at the latest, when the last lease ends.
                    let next = match policy.half_open {
                        HalfOpenRule::FirstFailure => probes.earliest(),
                        HalfOpenRule::Rates => probes.latest(),
                    };
                    let next = next.unwrap_or(now);
                    return Err(Rejected { retry_after: Some(next.saturating_duration_since(now)) });
                }
                let slot = (!probes.busy).trailing_zeros() as usize % LEASES;
                let id = self.next_id | PROBE_BIT;
                self.next_id = self.next_id.wrapping_add(1) & !PROBE_BIT;
                probes.busy |= 1 << slot;
                probes.ids[slot] = id;
                probes.deadlines[slot] = now.saturating_add_nanos(policy.probe_timeout_ns);
                self.last_now = now;
                Ok(id)
            }
            Phase::Open { until } => Err(Rejected { retry_after: Some(until.saturating_duration_since(now)) }),
            Phase::Isolated => Err(Rejected { retry_after: None }),
            // Unreachable: closed, disabled and metrics-only are admitted above.
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                Err(Rejected { retry_after: Some(Duration::ZERO) })
            }
        }
    }

    /// Records the outcome of the call made with `permit`, measuring its duration as
    /// `now − permit.acquired_at()` (a call taking at least the policy's
    /// `slow_call_threshold` is slow). Closed: counted in the window; the breaker opens when
    /// a trip rule holds (K2), for the next open duration drawn from `rng` (K3). Half-open:
    /// a failure (or a slow call, when a slow-call rate is configured) reopens it; the
    /// `successes_to_close`-th success closes it (K4). Disabled: nothing is counted.
    ///
    /// # Errors
    /// [`BreakerError`] when the permit is foreign, stale (the breaker changed state since)
    /// or not outstanding (see [`BreakerError::NotOutstanding`] for what is detected); nothing
    /// changes.
    #[inline]
    pub fn record<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let elapsed = now.as_nanos().saturating_sub(permit.acquired_at.as_nanos());
        self.record_ns(policy, now, permit, outcome, elapsed, rng)
    }

    /// [`record`](Self::record) with the call's duration measured by the caller.
    ///
    /// # Errors
    /// As [`record`](Self::record); nothing changes.
    #[inline]
    pub fn record_with_duration<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        duration: Duration,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        self.record_ns(policy, now, permit, outcome, saturating_nanos(duration), rng)
    }

    #[inline]
    fn record_ns<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        elapsed_ns: u64,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        if permit.breaker != self.id || permit.generation != self.generation {
            return Err(self.misfit(permit.breaker, permit.generation));
        }
        if let Phase::Closed(window) = &mut self.phase {
            // Closed permits are counted, not tracked one by one (that would take a table).
            settle_closed_permit(self.next_id, &mut self.settled, permit.id)?;
            if outcome == CallOutcome::Ignored {
                return Ok(());
            }
            if window.key != policy.window_key {
                window.rebuild(policy);
            }
            if window.push(policy, now, outcome == CallOutcome::Failure, elapsed_ns >= policy.slow_ns) {
                let reason = window.trip_reason(policy);
                self.open(policy, now, reason, rng);
            }
            return Ok(());
        }
        self.record_slow(policy, now, permit.id, outcome, elapsed_ns, rng)
    }

    /// Why a permit from another breaker or generation is refused.
    #[cold]
    fn misfit(&self, breaker: u32, generation: u32) -> BreakerError {
        if breaker != self.id {
            BreakerError::Foreign { this: self.id, got: breaker }
        } else {
            BreakerError::Stale { current: self.generation, got: generation }
        }
    }

    /// `record` in every state but closed.
    #[cold]
    fn record_slow<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        id: u32,
        outcome: CallOutcome,
        elapsed_ns: u64,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        match &mut self.phase {
            Phase::Disabled => settle_closed_permit(self.next_id, &mut self.settled, id),
            Phase::MetricsOnly(window) => {
                settle_closed_permit(self.next_id, &mut self.settled, id)?;
                if outcome != CallOutcome::Ignored {
                    if window.key != policy.window_key {
                        window.rebuild(policy);
                    }
                    // Counted, never tripping.
                    let _ = window.push(policy, now, outcome == CallOutcome::Failure, elapsed_ns >= policy.slow_ns);
                }
                Ok(())
            }
            Phase::HalfOpen(probes) => {
                let Some(slot) = probes.slot_of(id) else {
                    return Err(BreakerError::NotOutstanding { id });
                };
                let now = self.last_now.later(now);
                // A lease that ended before its result came is the failure it already was; this
                // permit's result no longer counts, whether the expiry moved the breaker on
                // (first failure) or only counted the lease as an answer (rates).
                let generation = self.generation;
                self.settle(policy, now, rng);
                self.last_now = now;
                if self.generation != generation {
                    return Ok(());
                }
                let Phase::HalfOpen(probes) = &mut self.phase else { return Ok(()) };
                if probes.slot_of(id) != Some(slot) {
                    return Ok(());
                }
                probes.busy &= !(1 << slot);
                let slow = policy.slow_ppm != NEVER && elapsed_ns >= policy.slow_ns;
                let failed = match outcome {
                    CallOutcome::Ignored => return Ok(()),
                    CallOutcome::Failure => true,
                    CallOutcome::Success => false,
                };
                match policy.half_open {
                    HalfOpenRule::FirstFailure if failed || slow => {
                        self.open(policy, now, BreakerReason::ProbeFailed, rng);
                    }
                    HalfOpenRule::FirstFailure => {
                        probes.successes = probes.successes.saturating_add(1);
                        if probes.successes >= policy.close_after {
                            self.close(policy, BreakerReason::ProbesSucceeded);
                        }
                    }
                    HalfOpenRule::Rates => {
                        probes.answer(failed, slow);
                        self.judge(policy, now, rng);
                    }
                }
                Ok(())
            }
            // No permit is issued in these states, and entering them changed the generation;
            // closed is handled by `record_ns`.
            Phase::Open { .. } | Phase::Isolated | Phase::Closed(_) => Err(BreakerError::NotOutstanding { id }),
        }
    }

    /// Wakes the breaker: at the end of the open period it turns half-open; an expired probe
    /// lease counts as a failure and reopens it (K4), at the lease's deadline, so if that open
    /// period has ended by `now` too it is half-open again at once. Early, repeated or spurious
    /// calls change nothing.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        let now = self.last_now.later(now);
        self.settle(policy, now, rng);
    }

    /// Does all the work due at `now`: expires overdue probe leases (reopening the breaker at
    /// the earliest deadline), then turns an open breaker whose open period has ended
    /// half-open. Both in one call, so that the state at `now` does not depend on how often, or
    /// how promptly, the driver woke the breaker: a reopening whose open period already ended
    /// by `now` (a zero open duration, or a lease noticed late) is half-open at once.
    fn settle<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        if let Phase::HalfOpen(_) = self.phase {
            self.expire(policy, now, rng);
        }
        if let Phase::Open { until } = self.phase
            && until <= now
        {
            self.last_now = now;
            self.enter(Phase::HalfOpen(Probes::new()), BreakerReason::OpenPeriodEnded);
        }
    }

    /// Opens the breaker by hand, as a trip rule would: for the next open duration of the
    /// backoff (counted as an opening, K3), after which it turns half-open on its own.
    /// Outstanding permits become stale. The work due at `now` is done first (as by
    /// [`handle_timeout`](Self::handle_timeout)), so the transition starts from the state the
    /// breaker is in at `now`.
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] when it is open already, or metrics-only (a state
    /// that never trips: leave it with [`handle_reset`](Self::handle_reset) first); nothing
    /// changes, not even the work due (though `rng` may have been drawn from, when that work
    /// would have reopened the breaker).
    pub fn handle_open<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let (mut next, now) = self.settled_copy(policy, now, rng);
        let why = match next.phase {
            Phase::Open { .. } => "it is open already; `handle_half_open` ends the open period early",
            Phase::MetricsOnly(_) => {
                "a metrics-only breaker never trips; leave it with `handle_reset` (closed) or `handle_isolate` (forced open)"
            }
            _ => {
                next.open(policy, now, BreakerReason::ByHand, rng);
                *self = next;
                return Ok(());
            }
        };
        Err(next.illegal(BreakerState::Open, why))
    }

    /// Turns the breaker half-open by hand: the open period (or the isolation) ends now, and
    /// probes are admitted as if it had ended on its own (K4). Outstanding permits become
    /// stale. The work due at `now` is done first, as by [`handle_open`](Self::handle_open).
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] unless the breaker is open or isolated: a closed,
    /// disabled or metrics-only breaker admits every call, so there is nothing to probe, and a
    /// half-open one is half-open already; nothing changes.
    pub fn handle_half_open<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let (mut next, now) = self.settled_copy(policy, now, rng);
        let why = match next.phase {
            Phase::Open { .. } | Phase::Isolated => {
                next.last_now = now;
                next.enter(Phase::HalfOpen(Probes::new()), BreakerReason::ByHand);
                *self = next;
                return Ok(());
            }
            Phase::HalfOpen(_) => "it is half-open already",
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                "it admits every call, so there is nothing to probe; `handle_open` opens it"
            }
        };
        Err(next.illegal(BreakerState::HalfOpen, why))
    }

    /// This breaker as it is at `now` once the work due is done, leaving `self` as it is (a
    /// transition by hand that is refused changes nothing), and `now` clamped.
    fn settled_copy<R: Rng + ?Sized>(&self, policy: &BreakerPolicy, now: Instant, rng: &mut R) -> (Breaker, Instant) {
        let now = self.last_now.later(now);
        let mut next = *self;
        next.settle(policy, now, rng);
        next.last_now = now;
        (next, now)
    }

    /// The refusal of a transition by hand to `to`.
    #[cold]
    fn illegal(&self, to: BreakerState, why: &'static str) -> BreakerError {
        BreakerError::IllegalTransition { from: self.status().state(), to, why }
    }

    /// Forces the breaker closed by hand but keeps counting (resilience4j's `METRICS_ONLY`):
    /// every call is admitted and counted in a fresh window ([`window_counts`](Self::window_counts)),
    /// and no rule trips it, until [`handle_reset`](Self::handle_reset). Outstanding permits
    /// become stale.
    pub fn handle_metrics_only(&mut self, policy: &BreakerPolicy, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::MetricsOnly(Window::new(policy)), BreakerReason::ByHand);
    }

    /// Forces the breaker open by hand (K1): every call is rejected until
    /// [`handle_reset`](Self::handle_reset). Outstanding permits become stale.
    pub fn handle_isolate(&mut self, policy: &BreakerPolicy, now: Instant) {
        let _ = policy;
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Isolated, BreakerReason::ByHand);
    }

    /// Forces the breaker closed by hand (K1): every call is admitted and nothing is counted
    /// until [`handle_reset`](Self::handle_reset). Outstanding permits become stale.
    pub fn handle_disable(&mut self, policy: &BreakerPolicy, now: Instant) {
        let _ = policy;
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Disabled, BreakerReason::ByHand);
    }

    /// Closes the breaker by hand, from any state, and returns it to automatic operation:
    /// closed, with an empty window and the open durations starting over. Outstanding permits
    /// become stale.
    pub fn handle_reset(&mut self, policy: &BreakerPolicy, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.close(policy, BreakerReason::ByHand);
    }

    /// Closes, with an empty window and the open durations starting over.
    fn close(&mut self, policy: &BreakerPolicy, reason: BreakerReason) {
        self.openings.reset();
        self.enter(Phase::Closed(Window::new(policy)), reason);
    }

    /// Under [`HalfOpenRule::Rates`], once every probe has answered: reopens (from `at`) if
    /// their failure or slow-call rate reaches the policy's, closes otherwise.
    fn judge<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, at: Instant, rng: &mut R) {
        let Phase::HalfOpen(probes) = &self.phase else { return };
        if policy.half_open != HalfOpenRule::Rates || probes.answered < policy.permits.min(MAX_PERMITS) {
            return;
        }
        let answered = u64::from(probes.answered);
        if u64::from(probes.failed) * PPM >= policy.failure_ppm * answered {
            self.open(policy, at, BreakerReason::FailureRate, rng);
        } else if u64::from(probes.slow) * PPM >= policy.slow_ppm * answered {
            self.open(policy, at, BreakerReason::SlowCallRate, rng);
        } else {
            self.last_now = self.last_now.later(at);
            self.close(policy, BreakerReason::ProbesSucceeded);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the end of the open period,
    /// or the earliest probe lease; `None` otherwise. A pure query.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Open { until } => Some(*until),
            Phase::HalfOpen(probes) => probes.earliest(),
            Phase::Closed(_) | Phase::Isolated | Phase::Disabled | Phase::MetricsOnly(_) => None,
        }
    }

    /// The oldest undrained [`BreakerEvent`]: the transitions made so far, in the order they
    /// happened (O1).
    #[inline]
    pub fn poll_event(&mut self) -> Option<BreakerEvent> {
        self.events.pop()
    }

    /// Events pushed out unseen because more than four waited (see the drain order above);
    /// stays 0 for a driver that drains after every input.
    pub const fn dropped_events(&self) -> u32 {
        self.events.dropped()
    }

    /// Where the breaker is (K1).
    pub fn status(&self) -> BreakerStatus {
        match &self.phase {
            Phase::Closed(_) => BreakerStatus::Closed,
            Phase::Open { until } => BreakerStatus::Open { until: *until },
            Phase::HalfOpen(probes) => BreakerStatus::HalfOpen { permits: probes.held() },
            Phase::Isolated => BreakerStatus::Isolated,
            Phase::Disabled => BreakerStatus::Disabled,
            Phase::MetricsOnly(_) => BreakerStatus::MetricsOnly,
        }
    }

    /// This breaker's id, as carried by its permits.
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The latest `now` the breaker accepted.
    pub const fn now(&self) -> Instant {
        self.last_now
    }

    /// The state generation: it changes on every transition, which makes older permits stale.
    pub const fn generation(&self) -> u32 {
        self.generation
    }

    /// Consecutive failures counted while closed or metrics-only (zero in any other state).
    pub const fn consecutive_failures(&self) -> u32 {
        match &self.phase {
            Phase::Closed(window) | Phase::MetricsOnly(window) => window.consecutive,
            _ => 0,
        }
    }

    /// Permits of the current state that are out and not yet recorded: closed or disabled,
    /// the calls admitted and not yet recorded (mod 2^31); half-open, the probes out; open
    /// and isolated, none. A permit of an earlier state is stale and not counted. A caller
    /// that records or releases every permit sees this return to 0 when its calls are done.
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Backoff, Breaker, BreakerPolicy, CallOutcome, Instant, SplitMix64};
    ///
    /// let open = Backoff::constant(Duration::from_secs(5)).build()?;
    /// let policy = BreakerPolicy::builder(open).consecutive_failures(1).build()?;
    /// let (mut breaker, mut rng) = (Breaker::new(&policy, 0), SplitMix64::new(1));
    /// let now = Instant::from_secs(1);
    /// let a = breaker.try_acquire(&policy, now, &mut rng)?;
    /// let b = breaker.try_acquire(&policy, now, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 2);
    /// breaker.record(&policy, now, a, CallOutcome::Ignored, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 1);
    /// // `b` fails and opens the breaker: nothing of the closed state is out any more.
    /// breaker.record(&policy, now, b, CallOutcome::Failure, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 0);
    /// // Half-open, the probe is the one permit out.
    /// let _probe = breaker.try_acquire(&policy, Instant::from_secs(6), &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn outstanding_permits(&self) -> u32 {
        match &self.phase {
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                closed_permits_out(self.next_id, self.settled)
            }
            Phase::HalfOpen(probes) => probes.held(),
            Phase::Open { .. } | Phase::Isolated => 0,
        }
    }

    /// Consecutive openings since the breaker last closed (the backoff's failure count, K3).
    pub const fn openings(&self) -> u32 {
        self.openings.failures()
    }

    /// Closed or metrics-only: the calls, failures and slow calls in the window, and the
    /// consecutive failures. A policy without a rate rule (consecutive failures only) keeps no
    /// window: its calls, failures and slow calls stay 0.
    pub fn window_counts(&self) -> Option<WindowCounts> {
        match &self.phase {
            Phase::Closed(w) | Phase::MetricsOnly(w) => Some(WindowCounts {
                calls: w.calls,
                failures: w.failures,
                slow: w.slow,
                consecutive_failures: w.consecutive,
            }),
            _ => None,
        }
    }

    /// Half-open: expires every lease whose deadline is at or before `now`, as a failure at
    /// its deadline, in deadline order. Under [`HalfOpenRule::FirstFailure`] the earliest one
    /// reopens the breaker; under [`HalfOpenRule::Rates`] each is an answer, and the one that
    /// completes the probes decides at its deadline (as does a breaker that already holds all
    /// its answers, say under a policy with fewer permits than the one it was made under).
    fn expire<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        let mut expired = false;
        while let Phase::HalfOpen(probes) = &mut self.phase {
            let Some((slot, deadline)) = probes.earliest_slot().filter(|&(_, d)| d <= now) else { break };
            expired = true;
            if policy.half_open == HalfOpenRule::FirstFailure {
                self.open(policy, deadline, BreakerReason::ProbeExpired, rng);
                break;
            }
            probes.busy &= !(1 << slot);
            probes.answer(true, false);
            self.judge(policy, deadline, rng);
        }
        self.judge(policy, now, rng);
        if expired {
            self.last_now = self.last_now.later(now);
        }
    }

    /// Opens for the next open duration of the backoff, counted from `at`.
    #[cold]
    fn open<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, at: Instant, reason: BreakerReason, rng: &mut R) {
        let at = self.last_now.later(at);
        let delay = self.openings.next_delay_ns(&policy.open, rng);
        let until = at.saturating_add_nanos(delay);
        self.last_now = at;
        self.enter(Phase::Open { until }, reason);
    }

    /// Moves to `phase` at `last_now` (a new generation), and tells the change of kind, if it
    /// is one, as an event.
    fn enter(&mut self, phase: Phase, reason: BreakerReason) {
        let from = self.status();
        self.phase = phase;
        self.generation = self.generation.wrapping_add(1);
        self.settled = self.next_id;
        let to = self.status();
        if from.state() != to.state() {
            self.events.push(BreakerEvent { from, to, at: self.last_now, generation: self.generation, reason });
        }
    }
}

impl Breaker {
    /// Whether a loaded state is one the transitions could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.next_id & PROBE_BIT != 0 || self.settled & PROBE_BIT != 0 {
            return Err("a permit counter has the probe bit set");
        }
        if !self.openings.is_valid() {
            return Err("the open durations' schedule restarted after more openings than it counted");
        }
        match &self.phase {
            Phase::Closed(window) => window.validate(),
            Phase::HalfOpen(probes) => {
                let held = (0..LEASES).filter(|&i| probes.busy & (1 << i) != 0);
                for i in held.clone() {
                    if probes.ids[i] & PROBE_BIT == 0 {
                        return Err("a probe lease holds an id without the probe bit");
                    }
                    if held.clone().any(|j| j != i && probes.ids[j] == probes.ids[i]) {
                        return Err("two probe leases hold the same id");
                    }
                }
                if probes.failed > probes.answered || probes.slow > probes.answered {
                    return Err("more probes failed or were slow than answered");
                }
                Ok(())
            }
            Phase::MetricsOnly(window) => window.validate(),
            Phase::Open { .. } | Phase::Isolated | Phase::Disabled => Ok(()),
        }
    }
}

crate::serde_validated!(Breaker, "a Breaker");

/// Counts a closed or disabled permit as recorded, if one is outstanding (`next_id − settled`,
/// mod 2^31). Wraps (and then refuses a valid permit) only with 2^31 permits of one state
/// outstanding at once.
#[inline]
fn settle_closed_permit(next_id: u32, settled: &mut u32, id: u32) -> Result<(), BreakerError> {
    if closed_permits_out(next_id, *settled) == 0 {
        return Err(BreakerError::NotOutstanding { id });
    }
    *settled = settled.wrapping_add(1) & !PROBE_BIT;
    Ok(())
}

/// Closed or disabled permits issued and not yet recorded: `next_id − settled`, mod 2^31.
#[inline]
const fn closed_permits_out(next_id: u32, settled: u32) -> u32 {
    next_id.wrapping_sub(settled) & !PROBE_BIT
}

/// The counts of a closed breaker's window; see [`Breaker::window_counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WindowCounts {
    /// Calls in the window.
    pub calls: u32,
    /// Failed calls in the window.
    pub failures: u32,
    /// Slow calls in the window.
    pub slow: u32,
    /// Consecutive failures, ending with the latest call.
    pub consecutive_failures: u32,
}
