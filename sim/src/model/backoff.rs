//! The backoff schedule (B1–B4) from the rules' formulas: the envelope of the `n`-th consecutive
//! failure and the bounds of the delay a schedule may draw there. Never computed from the core's
//! `Backoff::envelope` or `delay`: the families' G1 checks and the fuzz targets' B1–B3 checks both
//! hold the core to these.

use persevere::{Backoff, Instant, Jitter, Schedule};

/// The envelope B1's formula gives for failure `n` (`n = 0` read as 1), before the cap: an
/// exact integer where the formula is integral, a float otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Formula {
    /// `Constant` and `Linear`, and `Exponential` at its first failure or with multiplier 1.
    Exact(u128),
    /// `Exponential` past its first failure (`initial · multiplier^(n−1)`), and the
    /// decorrelated schedule's `base · 3^n` (its largest possible delay).
    Approx(f64),
}

/// B1: the uncapped envelope of failure `n`.
pub fn formula(backoff: &Backoff, n: u32) -> Formula {
    let n = n.max(1);
    match backoff.schedule() {
        Schedule::Constant(d) => Formula::Exact(d.as_nanos()),
        Schedule::Linear { initial, step } => Formula::Exact(initial.as_nanos() + step.as_nanos() * u128::from(n - 1)),
        Schedule::Exponential { initial, multiplier } if n == 1 || multiplier == 1.0 => {
            Formula::Exact(initial.as_nanos())
        }
        Schedule::Exponential { initial, multiplier } => {
            Formula::Approx(initial.as_nanos() as f64 * multiplier.powf(f64::from(n - 1)))
        }
        Schedule::Decorrelated { base } => Formula::Approx(base.as_nanos() as f64 * 3f64.powf(f64::from(n))),
    }
}

/// How far a float formula may be from an exact computation of it at failure `n`: relative
/// (repeated squaring's rounding error grows with the exponent, about `n·ε`), plus 2 ns.
pub fn tolerance(n: u32) -> (f64, f64) {
    ((1e-9_f64).max(f64::from(n) * 8.0 * f64::EPSILON), 2.0)
}

/// B1, B2: the least and most the envelope of failure `n` can be, capped at `max_delay`
/// (equal, for an exact formula).
pub fn envelope_bounds(backoff: &Backoff, n: u32) -> (u64, u64) {
    let cap = nanos(backoff.max_delay());
    match formula(backoff, n) {
        Formula::Exact(raw) => {
            let capped = raw.min(u128::from(cap)) as u64;
            (capped, capped)
        }
        Formula::Approx(raw) => {
            let (relative, absolute) = tolerance(n);
            // `as` saturates: an infinite formula is past any cap.
            let lo = (raw * (1.0 - relative) - absolute).max(0.0) as u64;
            let hi = (raw * (1.0 + relative) + absolute) as u64;
            (lo.min(cap), hi.min(cap))
        }
    }
}

/// B3: the spread proportional jitter `f` allows around an envelope of `envelope_ns`, as
/// documented: `f` in fixed point, rounded to the nearest multiple of 2^-32.
pub fn proportional_spread(envelope_ns: u64, f: f64) -> u64 {
    let q32 = (f * 4_294_967_296.0).round() as u128;
    ((u128::from(envelope_ns) * q32) >> 32) as u64
}

/// B2, B3: the least and most delay `backoff` may draw after the `n`-th consecutive failure,
/// `previous_ns` being the delay it drew before (which bounds a decorrelated schedule's next):
/// the envelope jittered, raised to the floor and capped.
pub fn delay_bounds(backoff: &Backoff, n: u32, previous_ns: u64) -> (u64, u64) {
    let cap = nanos(backoff.max_delay());
    let floor = nanos(backoff.min_delay());
    let (env_lo, env_hi) = envelope_bounds(backoff, n);
    let (lo, hi) = match (backoff.schedule(), backoff.jitter_kind()) {
        (Schedule::Decorrelated { base }, _) => {
            let base = nanos(base);
            (base, previous_ns.max(base).saturating_mul(3))
        }
        (_, Jitter::None) => (env_lo, env_hi),
        (_, Jitter::Full) => (0, env_hi),
        (_, Jitter::Equal) => (env_lo / 2, env_hi),
        // `e − spread(e)` and `e + spread(e)` both grow with `e`.
        (_, Jitter::Proportional(f)) => (
            env_lo.saturating_sub(proportional_spread(env_lo, f)),
            env_hi.saturating_add(proportional_spread(env_hi, f)),
        ),
    };
    let clamp = |x: u64| x.max(floor).min(cap);
    (clamp(lo), clamp(hi))
}

/// The delay a model adopts for a draw it does not make: the machine under test drew it from
/// its RNG, and after the same input waits until `observed` (`None`: it does not wait).
///
/// A model never draws jitter itself (that would restate the core's sampling, and check the
/// core against itself): it holds the wait the machine chose to the bounds `lo..=hi` of
/// [`delay_bounds`] and adopts it, clamped to them. A wait outside the bounds so adopts a bound,
/// and the model's prediction then differs from the machine's, which the runner reports (as a
/// model mismatch, unless its own bounds check (B3, G1, K3) on the machine's wait comes first).
/// Where something else lengthens the wait (a supervisor's restart spacing), the clamped wait is
/// an upper bound of the draw, which only widens a decorrelated schedule's next bounds; where
/// the wait is over before it can be seen (a breaker already half-open), the caller passes the
/// latest instant it can have ended, which gives an upper bound too.
///
/// What adopting cannot see: under wide bounds (full jitter, a decorrelated schedule) a draw
/// from the wrong place or previous delay that still lands within this place's bounds. The
/// unjittered schedules keep those exact.
///
/// When the machine does not wait, the model adopts the longest draw if `ends` says it ends
/// the operation (a delay past the total budget), else the shortest, so that it predicts a
/// wait the machine did not make. (A machine that ends where only some draws would, e.g.
/// when `ends(lo)` is false, is accepted: the draw is not observable.)
pub fn adopt(observed: Option<Instant>, now: Instant, (lo, hi): (u64, u64), ends: impl Fn(u64) -> bool) -> u64 {
    match observed {
        Some(until) => nanos(until.saturating_duration_since(now)).clamp(lo, hi),
        None if ends(hi) => hi,
        None => lo,
    }
}

/// Where a model stands in a backoff schedule (B1–B3, B6): the failures since the schedule
/// last started over, and the delay it waited last (which bounds a decorrelated schedule's
/// next). Written once for the retry, supervision and flow models.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// Failures since the schedule last started over.
    pub place: u32,
    /// The last delay (or an upper bound of it, where something else lengthened the wait), in
    /// nanoseconds.
    pub previous_ns: u64,
}

impl Place {
    /// The schedule starts over (a success, a reset).
    pub fn start_over(&mut self) {
        *self = Self::default();
    }

    /// A hinted delay of `hinted_ns` took the schedule's turn (B6): under `restart_after_hint`
    /// the schedule starts over; otherwise the hint counts as the delay of the next place.
    pub fn hinted(&mut self, restart_after_hint: bool, hinted_ns: u64) {
        if restart_after_hint {
            self.start_over();
        } else {
            self.place = self.place.saturating_add(1);
            self.previous_ns = hinted_ns;
        }
    }

    /// The bounds of the delay `backoff` may draw at the next place ([`delay_bounds`]).
    pub fn next_bounds(&self, backoff: &Backoff) -> (u64, u64) {
        delay_bounds(backoff, self.place.saturating_add(1), self.previous_ns)
    }

    /// Moves to the next place and returns its delay: the one the machine drew, held to the
    /// bounds ([`adopt`], with `observed`, `now` and `ends` as there).
    pub fn scheduled(
        &mut self,
        backoff: &Backoff,
        observed: Option<Instant>,
        now: Instant,
        ends: impl Fn(u64) -> bool,
    ) -> u64 {
        let bounds = self.next_bounds(backoff);
        self.place = self.place.saturating_add(1);
        self.previous_ns = adopt(observed, now, bounds, ends);
        self.previous_ns
    }
}

/// A span in nanoseconds, saturating at `u64::MAX`.
pub(crate) fn nanos(span: core::time::Duration) -> u64 {
    u64::try_from(span.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::*;

    #[test]
    fn bounds_follow_the_formulas() {
        let ms = Duration::from_millis;
        let linear = Backoff::linear(ms(10), ms(5)).max_delay(ms(100)).build().unwrap();
        assert_eq!(delay_bounds(&linear, 3, 0), (20_000_000, 20_000_000));
        assert_eq!(delay_bounds(&linear, 1_000, 0), (100_000_000, 100_000_000), "capped");
        let full = Backoff::constant(ms(8)).jitter(Jitter::Full).build().unwrap();
        assert_eq!(delay_bounds(&full, 7, 0), (0, 8_000_000));
        let equal = Backoff::constant(ms(8)).jitter(Jitter::Equal).min_delay(ms(5)).build().unwrap();
        assert_eq!(delay_bounds(&equal, 1, 0), (5_000_000, 8_000_000), "raised to the floor");
        let half = Backoff::constant(ms(8)).jitter(Jitter::Proportional(0.5)).build().unwrap();
        assert_eq!(delay_bounds(&half, 1, 0), (4_000_000, 12_000_000));
        let exponential = Backoff::exponential(ms(1), 2.0).max_delay(ms(1_000)).build().unwrap();
        let (lo, hi) = delay_bounds(&exponential, 4, 0);
        assert!(lo <= 8_000_000 && 8_000_000 <= hi && hi - lo < 100, "{lo}..{hi}");
        assert_eq!(delay_bounds(&exponential, 60, 0), (1_000_000_000, 1_000_000_000));
        let decorrelated = Backoff::decorrelated(ms(2)).max_delay(ms(50)).build().unwrap();
        assert_eq!(delay_bounds(&decorrelated, 9, 10_000_000), (2_000_000, 30_000_000));
    }

    #[test]
    fn a_model_adopts_the_observed_wait_clamped_to_the_bounds() {
        let now = Instant::from_millis(10);
        let never = |_| false;
        assert_eq!(adopt(Some(Instant::from_millis(13)), now, (1_000_000, 5_000_000), never), 3_000_000);
        assert_eq!(adopt(Some(Instant::from_millis(30)), now, (1_000_000, 5_000_000), never), 5_000_000);
        assert_eq!(adopt(Some(Instant::from_millis(5)), now, (1_000_000, 5_000_000), never), 1_000_000);
        assert_eq!(adopt(None, now, (1, 9), never), 1, "no wait where every draw waits: the shortest");
        assert_eq!(adopt(None, now, (1, 9), |d| d > 4), 9, "some draw ends the operation: the longest");
    }
}
