//! Backoff schedules: how long to wait after the n-th consecutive failure (rules B1–B5).
//!
//! A [`Backoff`] answers questions; it never iterates on a clock of its own. Ask it for the
//! [`envelope`](Backoff::envelope) (the delay without jitter) or for a jittered
//! [`delay`](Backoff::delay), as a pure function of the failure count, the previous delay and a
//! random draw; or keep a [`BackoffState`] and call [`BackoffState::next_delay`] for the same
//! answers incrementally.
//!
//! The order of operations is fixed and documented, because the source systems differ on it:
//!
//! 1. the schedule's raw value for failure `n` (1-based),
//! 2. capped at `max_delay` (this capped value is the *envelope*),
//! 3. jitter applied to the envelope,
//! 4. raised to `min_delay`, then capped at `max_delay` again.
//!
//! So the final delay always lies in `[min_delay, max_delay]`: **a cap is a cap**, also after
//! jitter (B2). No `powf`: exponential growth is computed by repeated squaring with an early exit
//! at the cap, so a failure count of `u32::MAX` or a multiplier of `1e300` simply gives the cap.
//!
//! ```
//! use core::time::Duration;
//! use persevere::{Backoff, Jitter};
//! use rand_core::SeedableRng;
//!
//! let backoff = Backoff::exponential(Duration::from_millis(100), 2.0)
//!     .max_delay(Duration::from_secs(10))
//!     .jitter(Jitter::Equal)
//!     .build()?;
//! assert_eq!(backoff.envelope(1), Duration::from_millis(100));
//! assert_eq!(backoff.envelope(4), Duration::from_millis(800));
//! assert_eq!(backoff.envelope(u32::MAX), Duration::from_secs(10));
//!
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
//! let d = backoff.delay(4, Duration::ZERO, &mut rng);
//! assert!(d >= Duration::from_millis(400) && d <= Duration::from_millis(800));
//! # Ok::<(), persevere::PolicyError>(())
//! ```

use core::hint::select_unpredictable;
use core::time::Duration;

use rand_core::Rng;

use crate::PolicyError;
use crate::random::uniform_inclusive;
use crate::time::{nanos_of, saturating_nanos};

/// The smallest multiplier above 1 that is accepted. Repeated squaring amplifies rounding: the
/// relative error of `m^k` grows like `k·ε`. Up to the failure count where the largest cap
/// (2^64 ns) is reached, `k·ε ≤ ln(2^64)·ε / (m − 1)`, which stays far below one step of growth
/// (`m − 1`) only while `(m − 1)² ≫ 44·ε`; `1 + 1e-6` leaves a factor of 100. Closer to 1 the
/// envelope's monotonicity (B4) would depend on rounding (found by fuzzing).
const MIN_GROWTH: f64 = 1.0 + 1e-6;

/// The shape of the delays before jitter (rule B1). `n` is the 1-based count of consecutive
/// failures.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Schedule {
    /// The same delay every time.
    Constant(Duration),
    /// `initial + step·(n−1)`.
    Linear {
        /// Delay after the first failure.
        initial: Duration,
        /// Added per further failure.
        step: Duration,
    },
    /// `initial·multiplier^(n−1)`.
    Exponential {
        /// Delay after the first failure; must not be zero.
        initial: Duration,
        /// Growth per failure; exactly 1.0, or at least `1 + 1e-6`, and finite.
        multiplier: f64,
    },
    /// AWS's decorrelated jitter: `next = U[base, 3·previous]`, then capped, with
    /// `previous = base` before the first failure. It is its own jitter: no other [`Jitter`]
    /// may be combined with it. Its envelope (the upper bound of the n-th draw) is `base·3^n`, capped.
    Decorrelated {
        /// The smallest delay and the seed of the growth; must not be zero.
        base: Duration,
    },
}

/// How the envelope `d` is randomised (rule B3). All draws are uniform over whole nanoseconds,
/// both ends included.
///
/// **RNG use.** A decision takes one value from the RNG (rarely more: Lemire's method redraws
/// with probability below `range / 2^64`) when its range holds more than one value, and none
/// when it holds exactly one: always for `None`, and for any jitter whose range is a single
/// point (a zero envelope, `Proportional(0.0)`, a spread that rounds to zero). Replays are
/// exact either way; this only says how far each decision advances a shared RNG.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Jitter {
    /// The envelope itself.
    #[default]
    None,
    /// `U[0, d]`.
    Full,
    /// `U[⌊d/2⌋, d]`.
    Equal,
    /// `U[d − ⌊d·f⌋, d + ⌊d·f⌋]` with `f` in `[0, 1]`, then capped at `max_delay`. `f` is
    /// applied in fixed point, rounded to the nearest multiple of 2^-32.
    Proportional(f64),
}

/// The raw schedule in whole nanoseconds, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Constant { delay: u64 },
    Linear { initial: u64, step: u64 },
    Exponential { initial: u64, multiplier: f64, cap_ratio: f64 },
    Decorrelated { base: u64 },
}

/// A validated backoff schedule: shape, cap, floor and jitter. Immutable and `Copy`; share one
/// among any number of machines.
///
/// It is a few hundred bytes (352 on 64-bit targets): it precomputes the jitter's range for
/// the first 16 failures and for the cap, so that a decision is a lookup and one draw. Pass it
/// (and the policies that hold it) by reference on hot paths.
///
/// Build one with [`Backoff::constant`], [`Backoff::linear`], [`Backoff::exponential`] or
/// [`Backoff::decorrelated`], then [`BackoffBuilder::build`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "BackoffBuilder", into = "BackoffBuilder")
)]
pub struct Backoff {
    shape: Shape,
    jitter: Jitter,
    min_ns: u64,
    max_ns: u64,
    /// The proportional jitter factor in units of 2^-32 (`f` rounded to the nearest unit).
    spread_q32: u64,
    /// The first failure count whose envelope is the cap (`u64::MAX` if no `u32` count reaches it).
    cap_from: u64,
    /// The jitter's closed range `(lo, hi)` for failures 1..=TABLE_LEN, precomputed by the
    /// same arithmetic, so the common decision is a lookup and one draw.
    table: [(u64, u64); TABLE_LEN],
    /// The jitter's closed range once the envelope is the cap.
    capped: (u64, u64),
}

/// For how many failure counts a [`Backoff`] precomputes the jitter's range: the common case
/// of a handful of retries is a lookup.
const TABLE_LEN: usize = 16;

/// The settings of a [`Backoff`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct BackoffBuilder {
    /// The shape of the delays.
    pub schedule: Schedule,
    /// The cap; `None` means no cap below `u64::MAX` nanoseconds. [`Duration::MAX`] is
    /// accepted and means the same.
    pub max_delay: Option<Duration>,
    /// The floor applied after jitter; zero by default.
    pub min_delay: Duration,
    /// The jitter; [`Jitter::None`] by default.
    pub jitter: Jitter,
}

impl BackoffBuilder {
    /// A builder for `schedule` with no cap, no floor and no jitter.
    pub const fn new(schedule: Schedule) -> Self {
        BackoffBuilder { schedule, max_delay: None, min_delay: Duration::ZERO, jitter: Jitter::None }
    }

    /// Sets the cap: no delay, jittered or not, ever exceeds it (B2).
    pub const fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = Some(max_delay);
        self
    }

    /// Sets the floor: no delay is below it, also after jitter.
    pub const fn min_delay(mut self, min_delay: Duration) -> Self {
        self.min_delay = min_delay;
        self
    }

    /// Sets the jitter (B3).
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when a duration does not fit in `u64` nanoseconds (the cap excepted), a
    /// multiplier is not finite or below 1, a jitter factor is outside `[0, 1]`, an exponential
    /// or decorrelated schedule starts from zero, the cap is below the first delay or the floor,
    /// or decorrelated is combined with another jitter.
    pub fn build(self) -> Result<Backoff, PolicyError> {
        let max_ns = self.max_delay.map_or(u64::MAX, saturating_nanos);
        let min_ns = nanos(self.min_delay, "min_delay")?;
        let (shape, first_ns, first_name) = match self.schedule {
            Schedule::Constant(delay) => {
                let delay = nanos(delay, "constant delay")?;
                (Shape::Constant { delay }, delay, "the constant delay")
            }
            Schedule::Linear { initial, step } => {
                let initial = nanos(initial, "initial delay")?;
                let step = nanos(step, "linear step")?;
                (Shape::Linear { initial, step }, initial, "the initial delay")
            }
            Schedule::Exponential { initial, multiplier } => {
                let initial = nanos(initial, "initial delay")?;
                if initial == 0 {
                    return Err(PolicyError::Zero {
                        setting: "initial delay",
                        why: "an exponential schedule from zero stays at zero; use a constant zero delay for immediate retries",
                    });
                }
                if !multiplier.is_finite() {
                    return Err(PolicyError::NotFinite { setting: "multiplier", value: multiplier });
                }
                if multiplier != 1.0 && multiplier < MIN_GROWTH {
                    return Err(PolicyError::MultiplierOutOfRange { value: multiplier });
                }
                let cap_ratio = max_ns as f64 / initial as f64;
                (Shape::Exponential { initial, multiplier, cap_ratio }, initial, "the initial delay")
            }
            Schedule::Decorrelated { base } => {
                let base = nanos(base, "decorrelated base")?;
                if base == 0 {
                    return Err(PolicyError::Zero {
                        setting: "decorrelated base",
                        why: "U[0, 3·0] is always zero; use a constant zero delay for immediate retries",
                    });
                }
                if self.jitter != Jitter::None {
                    return Err(PolicyError::Conflict {
                        setting: "a decorrelated schedule",
                        other: "a jitter",
                        why: "decorrelated is its own jitter (U[base, 3·previous]); leave jitter as None",
                    });
                }
                (Shape::Decorrelated { base }, base, "the decorrelated base")
            }
        };
        if let Jitter::Proportional(f) = self.jitter {
            if !f.is_finite() {
                return Err(PolicyError::NotFinite { setting: "jitter factor", value: f });
            }
            if !(0.0..=1.0).contains(&f) {
                return Err(PolicyError::FractionOutOfRange { setting: "jitter factor", value: f });
            }
        }
        if max_ns < first_ns {
            return Err(PolicyError::CapBelow { setting: first_name, max_delay_ns: max_ns, value_ns: first_ns });
        }
        if max_ns < min_ns {
            return Err(PolicyError::CapBelow { setting: "min_delay", max_delay_ns: max_ns, value_ns: min_ns });
        }
        Ok(Backoff::assemble(shape, self.jitter, min_ns, max_ns))
    }
}

fn nanos(span: Duration, setting: &'static str) -> Result<u64, PolicyError> {
    nanos_of(span).ok_or(PolicyError::DurationOverflow { setting })
}

impl TryFrom<BackoffBuilder> for Backoff {
    type Error = PolicyError;

    fn try_from(builder: BackoffBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<Backoff> for BackoffBuilder {
    fn from(backoff: Backoff) -> Self {
        BackoffBuilder {
            schedule: backoff.schedule(),
            max_delay: (backoff.max_ns != u64::MAX).then(|| Duration::from_nanos(backoff.max_ns)),
            min_delay: Duration::from_nanos(backoff.min_ns),
            jitter: backoff.jitter,
        }
    }
}

impl Backoff {
    /// The same delay after every failure.
    pub const fn constant(delay: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Schedule::Constant(delay))
    }

    /// `initial + step·(n−1)` after the n-th failure.
    pub const fn linear(initial: Duration, step: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Schedule::Linear { initial, step })
    }

    /// `initial·multiplier^(n−1)` after the n-th failure.
    pub const fn exponential(initial: Duration, multiplier: f64) -> BackoffBuilder {
        BackoffBuilder::new(Schedule::Exponential { initial, multiplier })
    }

    /// Decorrelated jitter: `U[base, 3·previous]`, capped.
    pub const fn decorrelated(base: Duration) -> BackoffBuilder {
        BackoffBuilder::new(Schedule::Decorrelated { base })
    }

    /// An exponential backoff from settings the crate knows to be valid (the presets' and
    /// defaults' constants), without the `Result` of [`BackoffBuilder::build`]: `initial_ns > 0`,
    /// a multiplier of 1.0 or at least `1 + 1e-6`, `max_ns >= initial_ns`, a proportional factor
    /// in `[0, 1]`, no floor. Every caller has a test comparing its value with `build()`'s.
    pub(crate) fn exponential_unchecked(initial_ns: u64, multiplier: f64, max_ns: u64, jitter: Jitter) -> Backoff {
        let cap_ratio = max_ns as f64 / initial_ns as f64;
        Backoff::assemble(Shape::Exponential { initial: initial_ns, multiplier, cap_ratio }, jitter, 0, max_ns)
    }

    /// The validated parts, with the derived fields (jitter spread, cap index, range table).
    fn assemble(shape: Shape, jitter: Jitter, min_ns: u64, max_ns: u64) -> Backoff {
        let spread_q32 = match jitter {
            Jitter::Proportional(f) => (f * 4_294_967_296.0 + 0.5) as u64,
            _ => 0,
        };
        let mut backoff = Backoff {
            shape,
            jitter,
            min_ns,
            max_ns,
            spread_q32,
            cap_from: 1,
            table: [(0, 0); TABLE_LEN],
            capped: (0, 0),
        };
        backoff.cap_from = backoff.first_capped();
        backoff.capped = backoff.jitter_range(max_ns);
        for i in 0..TABLE_LEN {
            backoff.table[i] = backoff.jitter_range(raw_envelope(shape, max_ns, i as u32 + 1));
        }
        backoff
    }

    /// The schedule this backoff was built from.
    pub fn schedule(&self) -> Schedule {
        match self.shape {
            Shape::Constant { delay } => Schedule::Constant(Duration::from_nanos(delay)),
            Shape::Linear { initial, step } => {
                Schedule::Linear { initial: Duration::from_nanos(initial), step: Duration::from_nanos(step) }
            }
            Shape::Exponential { initial, multiplier, .. } => {
                Schedule::Exponential { initial: Duration::from_nanos(initial), multiplier }
            }
            Shape::Decorrelated { base } => Schedule::Decorrelated { base: Duration::from_nanos(base) },
        }
    }

    /// The jitter.
    pub const fn jitter_kind(&self) -> Jitter {
        self.jitter
    }

    /// The cap (`u64::MAX` nanoseconds when none was set).
    pub const fn max_delay(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The floor.
    pub const fn min_delay(&self) -> Duration {
        Duration::from_nanos(self.min_ns)
    }

    /// The delay without jitter after the `failures`-th consecutive failure, capped at
    /// `max_delay` (B4: non-decreasing in `failures`, reaching the cap and staying there up to
    /// `u32::MAX`). `failures == 0` is read as 1. For [`Schedule::Decorrelated`] it is the upper
    /// bound of the n-th draw, `base·3^n`, capped.
    #[inline]
    pub fn envelope(&self, failures: u32) -> Duration {
        Duration::from_nanos(self.envelope_ns(failures))
    }

    /// The jittered delay after the `failures`-th consecutive failure: the envelope, jittered,
    /// raised to `min_delay` and capped at `max_delay` (B1–B3). `previous` is the delay returned
    /// for the failure before (only [`Schedule::Decorrelated`] uses it; pass `Duration::ZERO`
    /// for the first failure, which is read as `base`).
    ///
    /// A pure function of its arguments and the draws it takes from `rng`.
    #[inline]
    pub fn delay<R: Rng + ?Sized>(&self, failures: u32, previous: Duration, rng: &mut R) -> Duration {
        Duration::from_nanos(self.delay_ns(failures, saturating_nanos(previous), rng))
    }

    #[inline(always)]
    pub(crate) fn delay_ns<R: Rng + ?Sized>(&self, failures: u32, previous_ns: u64, rng: &mut R) -> u64 {
        let (lo, hi) = match self.shape {
            Shape::Decorrelated { base } => (base, previous_ns.max(base).saturating_mul(3)),
            _ => self.range_ns(failures),
        };
        // A one-point range takes nothing from the RNG (see "RNG use" on `Jitter`).
        let drawn = if lo == hi { lo } else { uniform_inclusive(rng, lo, hi) };
        // Whether a draw lands beyond the floor or the cap is a coin toss (proportional jitter
        // at the cap overshoots half the time): selects, not branches that mispredict.
        let floored = select_unpredictable(drawn < self.min_ns, self.min_ns, drawn);
        select_unpredictable(floored > self.max_ns, self.max_ns, floored)
    }

    /// The closed range the jitter draws from after the `failures`-th failure (not for
    /// [`Schedule::Decorrelated`]): a lookup for the first [`TABLE_LEN`] failures and once capped.
    #[inline]
    fn range_ns(&self, failures: u32) -> (u64, u64) {
        let n = failures.max(1);
        if u64::from(n) >= self.cap_from {
            self.capped
        } else if let Some(&range) = self.table.get(n as usize - 1) {
            range
        } else {
            self.jitter_range(raw_envelope(self.shape, self.max_ns, n))
        }
    }

    /// The closed range the jitter draws from around `envelope` (B3), before floor and cap.
    fn jitter_range(&self, envelope: u64) -> (u64, u64) {
        match self.jitter {
            Jitter::None => (envelope, envelope),
            Jitter::Full => (0, envelope),
            Jitter::Equal => (envelope / 2, envelope),
            Jitter::Proportional(_) => {
                // `spread_q32 <= 2^32`, so `spread <= envelope` and only the top end can saturate.
                let spread = ((u128::from(envelope) * u128::from(self.spread_q32)) >> 32) as u64;
                (envelope - spread, envelope.saturating_add(spread))
            }
        }
    }

    #[inline]
    pub(crate) fn envelope_ns(&self, failures: u32) -> u64 {
        let n = failures.max(1);
        if u64::from(n) >= self.cap_from { self.max_ns } else { raw_envelope(self.shape, self.max_ns, n) }
    }

    /// The first `n` whose envelope is the cap, by binary search (the envelope is monotone).
    fn first_capped(&self) -> u64 {
        let (mut lo, mut hi) = (1u32, u32::MAX);
        if raw_envelope(self.shape, self.max_ns, hi) < self.max_ns {
            return u64::MAX;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if raw_envelope(self.shape, self.max_ns, mid) >= self.max_ns {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        u64::from(lo)
    }
}

/// The envelope of failure `n ≥ 1`, computed from scratch and capped at `max_ns`.
fn raw_envelope(shape: Shape, max_ns: u64, n: u32) -> u64 {
    let raw = match shape {
        Shape::Constant { delay } => delay,
        Shape::Linear { initial, step } => initial.saturating_add(step.saturating_mul(u64::from(n - 1))),
        Shape::Exponential { initial, multiplier, cap_ratio } => match growth(multiplier, n - 1, cap_ratio) {
            // `initial·1` is `initial` exactly: through `f64` it would round above 2^53 ns.
            Some(1.0) => initial,
            Some(factor) => ((initial as f64 * factor) as u64).max(initial),
            None => u64::MAX,
        },
        Shape::Decorrelated { base } => match growth(3.0, n, max_ns as f64 / base as f64) {
            Some(factor) => ((base as f64 * factor) as u64).max(base),
            None => u64::MAX,
        },
    };
    raw.min(max_ns)
}

/// `multiplier^exponent` by repeated squaring, or `None` once it reaches `limit` (the ratio at
/// which the cap is reached). Every factor is ≥ 1, so an intermediate power at or above
/// `limit` proves the result is too.
#[inline]
fn growth(multiplier: f64, mut exponent: u32, limit: f64) -> Option<f64> {
    if exponent == 0 || multiplier == 1.0 {
        return Some(1.0);
    }
    let mut base = multiplier;
    let mut acc = 1.0;
    loop {
        if exponent & 1 == 1 {
            acc *= base;
            if acc >= limit {
                return None;
            }
        }
        exponent >>= 1;
        if exponent == 0 {
            return Some(acc);
        }
        base *= base;
        if base >= limit {
            return None;
        }
    }
}

/// The incremental form of a [`Backoff`]: a streak of consecutive failures, the place in the
/// schedule it has reached, and the last delay.
///
/// Sixteen bytes of plain data that a machine embeds; [`next_delay`](Self::next_delay) gives
/// exactly what [`Backoff::delay`] gives for the same place, previous delay and draws (B5).
/// The streak ([`failures`](Self::failures)) and the schedule's place differ only after a
/// hinted delay under a policy that restarts the schedule after hints (B6): the streak goes on,
/// the schedule starts over from its first delay.
///
/// Loaded with serde, a state whose schedule restarted after more failures than its streak has
/// is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct BackoffState {
    failures: u32,
    /// The streak's length when the schedule last started over (`≤ failures`).
    restarted_at: u32,
    last_delay_ns: u64,
}

impl BackoffState {
    /// No failure yet.
    pub const fn new() -> Self {
        BackoffState { failures: 0, restarted_at: 0, last_delay_ns: 0 }
    }

    /// Counts one more failure and returns the delay to wait before the next try.
    #[inline]
    pub fn next_delay<R: Rng + ?Sized>(&mut self, backoff: &Backoff, rng: &mut R) -> Duration {
        Duration::from_nanos(self.next_delay_ns(backoff, rng))
    }

    #[inline(always)]
    pub(crate) fn next_delay_ns<R: Rng + ?Sized>(&mut self, backoff: &Backoff, rng: &mut R) -> u64 {
        self.failures = self.failures.saturating_add(1);
        // `restarted_at ≤ failures` holds for every state this crate makes and every state it
        // loads (validated); `saturating_sub` keeps even a hand-made one total.
        let place = self.failures.saturating_sub(self.restarted_at);
        self.last_delay_ns = backoff.delay_ns(place, self.last_delay_ns, rng);
        self.last_delay_ns
    }

    /// Counts a failure whose delay came from elsewhere (a hint), keeping the schedule's place
    /// unless `restart` asks it to start over from its first delay (B6).
    #[inline]
    pub(crate) fn record_hinted(&mut self, delay_ns: u64, restart: bool) {
        self.failures = self.failures.saturating_add(1);
        if restart {
            self.restarted_at = self.failures;
            self.last_delay_ns = 0;
        } else {
            self.last_delay_ns = delay_ns;
        }
    }

    /// Counts a failure that is not followed by a delay (it ends the operation or trips).
    #[inline]
    pub(crate) fn record_final(&mut self) {
        self.failures = self.failures.saturating_add(1);
    }

    /// Ends the streak: the next failure is the first again (after a success, or a reset).
    #[inline]
    pub fn reset(&mut self) {
        *self = BackoffState::new();
    }

    /// Consecutive failures counted so far (the streak).
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// The last delay returned (zero before the first failure, and after the schedule
    /// started over).
    pub const fn last_delay(&self) -> Duration {
        Duration::from_nanos(self.last_delay_ns)
    }

    /// Whether a loaded state is one this crate could have made.
    pub(crate) const fn is_valid(&self) -> bool {
        self.restarted_at <= self.failures
    }

    /// Why a loaded state is not one this crate could have made, if it is not.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.is_valid() { Ok(()) } else { Err("the schedule restarted after more failures than the streak has") }
    }
}

crate::serde_validated!(BackoffState, "a BackoffState");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The lookup table and the cap shortcut answer exactly what the arithmetic answers.
        #[test]
        fn b5_shortcuts_agree_with_the_arithmetic(
            initial in 1..5_000_000_000u64,
            multiplier in prop_oneof![Just(1.0), 1.000_001..1.01f64, 1.01..100.0f64],
            cap in prop::option::of(1..u64::MAX),
            jitter in prop_oneof![
                Just(Jitter::None),
                Just(Jitter::Full),
                Just(Jitter::Equal),
                (0.0..=1.0f64).prop_map(Jitter::Proportional),
            ],
            n in prop_oneof![1..40u32, any::<u32>()],
        ) {
            let mut builder = Backoff::exponential(Duration::from_nanos(initial), multiplier).jitter(jitter);
            if let Some(cap) = cap {
                builder = builder.max_delay(Duration::from_nanos(cap.max(initial)));
            }
            let backoff = builder.build().unwrap();
            let envelope = raw_envelope(backoff.shape, backoff.max_ns, n);
            prop_assert_eq!(backoff.envelope_ns(n), envelope);
            prop_assert_eq!(backoff.range_ns(n), backoff.jitter_range(envelope));
        }
    }
}
