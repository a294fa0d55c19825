//! An adaptive concurrency limit (L2–L4): Netflix's concurrency-limits and Envoy's adaptive
//! concurrency filter as one sans-IO machine. The limit moves only from what completions
//! report; permits are leases; the minimum RTT is re-measured on a jittered schedule.

use core::time::Duration;

use rand_core::Rng;

use crate::Instant;
use crate::bulkhead::Shed;
use crate::limit_policy::{LimitAlgorithm, LimiterPolicy, MAX_LIMIT};
use crate::random::uniform_inclusive;
use crate::time::saturating_nanos;

/// How a call made under a [`LimiterPermit`] ended (L2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Completion {
    /// It was answered; its RTT is a sample.
    Success,
    /// It was dropped or timed out: a loss, and its RTT is a sample too.
    Dropped,
    /// It says nothing about the dependency (canceled before it was sent, rejected as invalid):
    /// the permit is returned and nothing is sampled.
    Ignored,
}

/// Leave to make one call through a [`Limiter`]: hand it back to [`Limiter::release`]. It is
/// neither `Clone` nor `Copy`, so it is released at most once (L4); it carries what the
/// completion reports besides its RTT: when the call started and how many were in flight then.
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a permit holds a place until it is released; release it with Completion::Ignored if the call is not made"]
pub struct LimiterPermit {
    limiter: u32,
    started_at: Instant,
    in_flight: u32,
}

impl LimiterPermit {
    /// When it was issued.
    pub const fn started_at(&self) -> Instant {
        self.started_at
    }

    /// Calls in flight when it was issued, itself included.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The id of the limiter that issued it.
    pub const fn limiter(&self) -> u32 {
        self.limiter
    }
}

/// A caller mistake on [`Limiter::release`]; nothing changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The permit was issued by another limiter.
    #[error("the permit belongs to limiter {got}, not to this one ({this})")]
    Foreign {
        /// This limiter's id.
        this: u32,
        /// The id in the permit.
        got: u32,
    },
    /// No call is in flight (a permit of an earlier state of this limiter).
    #[error("no call is in flight; release each permit once, on the limiter that issued it")]
    NotOutstanding,
}

/// A minimum-RTT window in progress (L3).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
struct ProbeWindow {
    started: Instant,
    /// Completions still to measure: at least 1.
    left: u32,
    /// The smallest RTT measured so far (`u64::MAX`: none yet).
    min_ns: u64,
}

/// An adaptive concurrency limit (L2–L4): AIMD, Vegas or Gradient2 as its policy says.
///
/// Verbs: [`try_acquire`](Self::try_acquire) before a call (a [`LimiterPermit`] while fewer
/// than the limit are in flight, else [`Shed`] with how long to wait), and
/// [`release`](Self::release) when it ends with its [`Completion`] and `now` (the RTT is
/// `now − started_at`, or given with [`release_with_rtt`](Self::release_with_rtt)). Outputs:
/// the answers of those calls; [`poll_timeout`](Self::poll_timeout) is when the next
/// minimum-RTT window opens, and [`handle_timeout`](Self::handle_timeout) (or the first
/// `try_acquire` at or after it) opens it. No clock is read: the limit moves only on
/// completions (L2).
///
/// **Bounds (L3).** The limit stays within the policy's `[min_limit, max_limit]`, finite and
/// at least 1. During a minimum-RTT window, admission drops to the probe's `floor` (the
/// limit itself is kept, and not moved, until the window ends).
///
/// **Leases (L4).** Every permit returns its place once, however the call ended (a dropped
/// call included); in-flight never goes below zero, and a new permit is issued only while
/// in-flight is under the admission limit. A state loaded with more in flight, or under a
/// policy whose bounds exclude its limit, admits nothing until enough calls end, and is
/// clamped into the new bounds at its next completion.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Completion, Instant, Limiter, LimiterPolicy, SplitMix64};
///
/// let policy = LimiterPolicy::aimd();
/// let mut limiter = Limiter::new(&policy, 1);
/// let mut rng = SplitMix64::new(7);
/// let permit = limiter.try_acquire(&policy, Instant::ZERO)?;
/// limiter.release(&policy, Instant::from_millis(10), permit, Completion::Dropped, &mut rng)?;
/// assert_eq!(limiter.limit(), 20, "AIMD backs off, but never below min_limit");
/// assert_eq!(limiter.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Limiter {
    id: u32,
    in_flight: u32,
    /// Calls admitted at once: `⌊estimate⌋`, or the probe's floor during a window.
    cap: u32,
    estimate: f64,
    /// The minimum RTT measured (0: none yet).
    min_rtt_ns: u64,
    /// Gradient2's long RTT, and the completions averaged into it.
    long_rtt_ns: f64,
    long_count: u32,
    /// When the next minimum-RTT window opens (`Instant::MAX`: none scheduled).
    next_probe: Instant,
    probe: Option<ProbeWindow>,
}

crate::serde_validated!(Limiter, "Limiter");

impl Limiter {
    /// A limiter at the policy's initial limit, nothing in flight, no RTT measured. `id` tells
    /// its permits apart from other limiters'.
    pub fn new(policy: &LimiterPolicy, id: u32) -> Self {
        let estimate = f64::from(policy.initial_limit);
        Limiter {
            id,
            in_flight: 0,
            cap: policy.initial_limit,
            estimate,
            min_rtt_ns: 0,
            long_rtt_ns: 0.0,
            long_count: 0,
            next_probe: Instant::MAX,
            probe: None,
        }
    }

    /// Asks to make one call at `now`: a permit while fewer calls than the admission limit
    /// are in flight (opening a due minimum-RTT window first).
    ///
    /// # Errors
    /// [`Shed`], with the minimum RTT measured as how long to wait (a place frees about then).
    #[inline]
    pub fn try_acquire(&mut self, policy: &LimiterPolicy, now: Instant) -> Result<LimiterPermit, Shed> {
        if now >= self.next_probe {
            self.open_window(policy, now);
        }
        if self.in_flight < self.cap {
            self.in_flight += 1;
            return Ok(LimiterPermit { limiter: self.id, started_at: now, in_flight: self.in_flight });
        }
        Err(Shed { retry_after: Duration::from_nanos(self.min_rtt_ns) })
    }

    /// The call made with `permit` ended at `now` with `completion`; its RTT is
    /// `now − permit.started_at()`. The place returns; the limit moves by the policy's
    /// algorithm (not during a minimum-RTT window, whose samples it is instead); `rng` draws
    /// the next window's jitter when one ends.
    ///
    /// # Errors
    /// [`LimiterError`]: a foreign permit, or none in flight; nothing changes.
    #[inline]
    pub fn release<R: Rng + ?Sized>(
        &mut self,
        policy: &LimiterPolicy,
        now: Instant,
        permit: LimiterPermit,
        completion: Completion,
        rng: &mut R,
    ) -> Result<(), LimiterError> {
        // 1 ns at least, for a `now` at or before the start (one comparison, where a saturating
        // subtraction then a `max(1)` would be two).
        let rtt_ns = if now > permit.started_at { now.as_nanos() - permit.started_at.as_nanos() } else { 1 };
        self.release_ns(policy, now, permit, completion, rtt_ns, rng)
    }

    /// [`release`](Self::release) with the RTT measured by the caller.
    ///
    /// # Errors
    /// As [`release`](Self::release); nothing changes.
    pub fn release_with_rtt<R: Rng + ?Sized>(
        &mut self,
        policy: &LimiterPolicy,
        now: Instant,
        permit: LimiterPermit,
        completion: Completion,
        rtt: Duration,
        rng: &mut R,
    ) -> Result<(), LimiterError> {
        self.release_ns(policy, now, permit, completion, saturating_nanos(rtt).max(1), rng)
    }

    /// Both releases, with an RTT of at least 1 ns (0 would read as no load at all).
    #[inline]
    fn release_ns<R: Rng + ?Sized>(
        &mut self,
        policy: &LimiterPolicy,
        now: Instant,
        permit: LimiterPermit,
        completion: Completion,
        rtt_ns: u64,
        rng: &mut R,
    ) -> Result<(), LimiterError> {
        if permit.limiter != self.id {
            return Err(LimiterError::Foreign { this: self.id, got: permit.limiter });
        }
        self.in_flight = self.in_flight.checked_sub(1).ok_or(LimiterError::NotOutstanding)?;
        if completion == Completion::Ignored {
            return Ok(());
        }
        if self.in_window(policy) {
            self.sample_probe(policy, now, permit.started_at, rtt_ns, rng);
            if self.probe.is_some() {
                return Ok(());
            }
        }
        self.update(policy, rtt_ns, permit.in_flight, completion == Completion::Dropped);
        Ok(())
    }

    /// Whether a completion belongs to the minimum-RTT re-probe: a window is open, or the
    /// policy re-probes and none is scheduled yet (the first completion schedules it).
    #[inline]
    fn in_window(&self, policy: &LimiterPolicy) -> bool {
        match policy.probe {
            None => self.probe.is_some(),
            Some(_) => self.probe.is_some() || self.next_probe == Instant::MAX,
        }
    }

    /// Moves the estimate by the algorithm, then clamps it into `[min_limit, max_limit]` (L3).
    #[inline]
    fn update(&mut self, policy: &LimiterPolicy, rtt_ns: u64, in_flight: u32, dropped: bool) {
        let limit = self.estimate;
        // At least half the limit was in flight: only then does a success say the limit is
        // used (Netflix's `inflight * 2 >= limit`).
        let used = f64::from(in_flight) * 2.0 >= limit;
        let next = match &policy.algorithm {
            LimitAlgorithm::Aimd { backoff_ratio, .. } => {
                if dropped || rtt_ns > policy.timeout_ns {
                    floor(limit * backoff_ratio)
                } else if used {
                    limit + 1.0
                } else {
                    return;
                }
            }
            LimitAlgorithm::Vegas { smoothing } => {
                if self.min_rtt_ns == 0 || rtt_ns < self.min_rtt_ns {
                    self.min_rtt_ns = rtt_ns;
                    return;
                }
                if !dropped && !used {
                    return;
                }
                match vegas_target(limit, self.min_rtt_ns, rtt_ns, dropped) {
                    Some(target) => (1.0 - smoothing) * limit + smoothing * target,
                    None => return,
                }
            }
            LimitAlgorithm::Gradient2 { smoothing, rtt_tolerance, queue_size, .. } => {
                let long = self.long_rtt(rtt_ns, policy.long_factor);
                if !used {
                    return;
                }
                let gradient = (rtt_tolerance * long / rtt_ns as f64).clamp(0.5, 1.0);
                let target = limit * gradient + f64::from(*queue_size);
                limit * (1.0 - smoothing) + target * smoothing
            }
        };
        self.set_estimate(policy, next);
    }

    /// Adds a sample to Gradient2's long RTT (the first 10 averaged, then an exponential
    /// average with weight `factor`, `2 / (long_window + 1)`), pulling it down when it is more
    /// than twice the sample.
    #[inline]
    fn long_rtt(&mut self, rtt_ns: u64, factor: f64) -> f64 {
        let sample = rtt_ns as f64;
        if self.long_count < 10 {
            self.long_count += 1;
            self.long_rtt_ns += (sample - self.long_rtt_ns) / f64::from(self.long_count);
        } else {
            self.long_rtt_ns += (sample - self.long_rtt_ns) * factor;
        }
        if self.long_rtt_ns > 2.0 * sample {
            self.long_rtt_ns *= 0.95;
        }
        self.long_rtt_ns
    }

    fn set_estimate(&mut self, policy: &LimiterPolicy, next: f64) {
        let (min, max) = (f64::from(policy.min_limit), f64::from(policy.max_limit));
        // NaN cannot arise from valid inputs; were it to, the limit keeps its last value.
        if next.is_nan() {
            return;
        }
        self.estimate = next.clamp(min, max);
        self.cap = self.estimate as u32;
    }

    /// Opens a minimum-RTT window at `now` (or unschedules it under a policy without one).
    #[cold]
    fn open_window(&mut self, policy: &LimiterPolicy, now: Instant) {
        match policy.probe {
            Some(probe) if self.probe.is_none() => {
                self.probe = Some(ProbeWindow { started: now, left: probe.samples, min_ns: u64::MAX });
                self.cap = probe.floor.min(self.estimate as u32).max(1);
                self.next_probe = Instant::MAX;
            }
            _ => self.next_probe = Instant::MAX,
        }
    }

    /// A completion while a window is open (or before the first is scheduled): a sample of the
    /// window if its call started in it; the window closes on its last sample, setting the
    /// minimum RTT and scheduling the next one.
    #[cold]
    fn sample_probe<R: Rng + ?Sized>(
        &mut self,
        policy: &LimiterPolicy,
        now: Instant,
        started_at: Instant,
        rtt_ns: u64,
        rng: &mut R,
    ) {
        let Some(probe) = policy.probe else {
            // Loaded under a policy without a re-probe: the window ends unmeasured.
            if self.probe.take().is_some() {
                self.cap = self.estimate as u32;
            }
            return;
        };
        let Some(window) = &mut self.probe else {
            // The first completion under a re-probing policy schedules the first window.
            self.next_probe = next_window(&probe, policy.probe_interval_ns, now, rng);
            return;
        };
        if started_at < window.started {
            return;
        }
        window.min_ns = window.min_ns.min(rtt_ns);
        window.left = window.left.saturating_sub(1);
        if window.left == 0 {
            self.min_rtt_ns = window.min_ns;
            self.probe = None;
            self.cap = self.estimate as u32;
            self.next_probe = next_window(&probe, policy.probe_interval_ns, now, rng);
        }
    }

    /// Opens a due minimum-RTT window; early, repeated or spurious calls change nothing.
    pub fn handle_timeout(&mut self, policy: &LimiterPolicy, now: Instant) {
        if now >= self.next_probe {
            self.open_window(policy, now);
        }
    }

    /// When the next minimum-RTT window opens; `None` while one is open or none is scheduled.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.next_probe != Instant::MAX).then_some(self.next_probe)
    }

    /// The limit (L3): within the policy's bounds, at least 1.
    pub const fn limit(&self) -> u32 {
        self.estimate as u32
    }

    /// The limit before rounding down.
    pub const fn estimate(&self) -> f64 {
        self.estimate
    }

    /// Calls admitted at once now: the limit, or the probe's floor during a minimum-RTT window.
    pub const fn admission_limit(&self) -> u32 {
        self.cap
    }

    /// Calls in flight.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The id its permits carry.
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The minimum RTT measured, if any.
    pub fn min_rtt(&self) -> Option<Duration> {
        (self.min_rtt_ns != 0).then(|| Duration::from_nanos(self.min_rtt_ns))
    }

    /// Whether a minimum-RTT window is open.
    pub const fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// Whether a loaded state could have been made by the verbs: a finite limit in
    /// `[1, MAX_LIMIT]`, an admission limit that is the limit's floor (or, in a window, at
    /// least 1 and at most it), a finite long RTT, and a window with samples left.
    pub fn validate(&self) -> Result<(), &'static str> {
        if !self.estimate.is_finite() || !(1.0..=f64::from(MAX_LIMIT)).contains(&self.estimate) {
            return Err("the limit is not a finite number in [1, MAX_LIMIT]");
        }
        if !self.long_rtt_ns.is_finite() || self.long_rtt_ns < 0.0 {
            return Err("the long RTT is not a finite, non-negative number");
        }
        match self.probe {
            None if self.cap != self.estimate as u32 => Err("the admission limit is not the limit"),
            Some(window) if window.left == 0 => Err("a minimum-RTT window with nothing left to measure"),
            Some(_) if self.cap == 0 || self.cap > self.estimate as u32 => {
                Err("a window's admission limit outside [1, limit]")
            }
            Some(_) if self.next_probe != Instant::MAX => Err("a window open while the next is scheduled"),
            _ => Ok(()),
        }
    }
}

/// `now + interval + uniform[0, jitter × interval]` (Envoy delays the window's start by up to
/// the jitter).
fn next_window<R: Rng + ?Sized>(probe: &crate::MinRttProbe, interval_ns: u64, now: Instant, rng: &mut R) -> Instant {
    let spread = (probe.jitter * interval_ns as f64) as u64;
    let delay = interval_ns.saturating_add(uniform_inclusive(rng, 0, spread));
    // Instant::MAX means "none scheduled": a window due at the end of time is never due.
    now.saturating_add(Duration::from_nanos(delay)).earlier(Instant::from_nanos(u64::MAX - 1))
}

/// Vegas's target once the limit is used or a call dropped, or `None` when it keeps the limit
/// (a queue in its sweet spot): `queue = ⌈limit × (1 − min_rtt / rtt)⌉` against `a = ⌊log10
/// limit⌋`, at least 1.
fn vegas_target(limit: f64, min_rtt_ns: u64, rtt_ns: u64, dropped: bool) -> Option<f64> {
    let a = f64::from(log10_floor(limit as u32).max(1));
    if dropped {
        return Some(limit - a);
    }
    let queue = ceil(limit * (1.0 - min_rtt_ns as f64 / rtt_ns as f64));
    if queue <= a {
        Some(limit + 6.0 * a)
    } else if queue < 3.0 * a {
        Some(limit + a)
    } else if queue > 6.0 * a {
        Some(limit - a)
    } else {
        None
    }
}

fn floor(x: f64) -> f64 {
    let t = x as i64 as f64;
    if t > x { t - 1.0 } else { t }
}

fn ceil(x: f64) -> f64 {
    -floor(-x)
}

/// `⌊log10 n⌋` (0 for 0), as Netflix's `Log10RootIntFunction` before its floor of 1.
fn log10_floor(mut n: u32) -> u32 {
    let mut digits = 0;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}
