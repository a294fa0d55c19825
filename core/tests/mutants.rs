//! Tests written to kill the mutants cargo-mutants found surviving (`.ci/mutants`): each pins
//! down a boundary or a formula that the rule tests only bounded.
//!
//! Survivors of `.ci/mutants core/src/{decision,backoff,time,random,jitter_rng}.rs` that no
//! test can kill, because the mutant behaves the same:
//! - `backoff.rs` `delay_ns`: `drawn < min` → `<=` and `floored > max` → `>=` select the
//!   bound when the draw equals it, which is the draw.
//! - `backoff.rs` `first_capped`: `< max` → `<=` on the last failure count, `>=` → `<` in the
//!   search, and `raw_envelope`'s cap ratio `max / base` → `max * base`: each changes only the
//!   failure count from which the cap is looked up instead of computed, and the computed
//!   envelope is capped to the same value.
//! - `random.rs` `uniform_inclusive`: `low < range` → `<=` sends a low product equal to the
//!   range to the rejection check, which keeps it (the threshold is below the range).

use core::convert::Infallible;
use core::time::Duration;

use persevere::{Backoff, Instant, Jitter, SplitMix64};
use rand_core::{Rng, TryRng};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An RNG that always draws the same value: 0 draws the low end of a range, `u64::MAX` its
/// high end.
struct Fixed(u64);

impl TryRng for Fixed {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.0 as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        dst.fill(0);
        Ok(())
    }
}

#[test]
fn b2_a_cap_equal_to_the_initial_delay_or_to_the_floor_is_accepted() {
    let at_initial = Backoff::exponential(ms(5), 2.0).max_delay(ms(5)).build().unwrap();
    assert_eq!((at_initial.envelope(1), at_initial.envelope(9)), (ms(5), ms(5)));
    let at_floor = Backoff::constant(ms(3)).min_delay(ms(5)).max_delay(ms(5)).build().unwrap();
    assert_eq!(at_floor.delay(1, Duration::ZERO, &mut Fixed(0)), ms(5));
}

#[test]
fn b2_b4_a_capped_envelope_grows_to_the_cap_then_stays_there() {
    let b = Backoff::exponential(ms(100), 2.0).max_delay(ms(1_000)).build().unwrap();
    let envelopes: Vec<_> = [1, 2, 3, 4, 5, 6, 16, 17, 40, u32::MAX].iter().map(|&n| b.envelope(n)).collect();
    assert_eq!(envelopes, [100, 200, 400, 800, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000].map(ms));
    // Without jitter a delay is its envelope, below the cap and at it.
    assert_eq!(b.delay(3, Duration::ZERO, &mut Fixed(0)), ms(400));
    assert_eq!(b.delay(30, Duration::ZERO, &mut Fixed(0)), ms(1_000));
}

#[test]
fn b1_a_decorrelated_envelope_is_base_times_three_to_the_n_capped() {
    let b = Backoff::decorrelated(ms(10)).max_delay(ms(1_000)).build().unwrap();
    let envelopes: Vec<_> = (1..=6).map(|n| b.envelope(n)).collect();
    assert_eq!(envelopes, [30, 90, 270, 810, 1_000, 1_000].map(ms));
}

#[test]
fn b1_a_decorrelated_delay_draws_up_to_three_times_the_previous_one() {
    let b = Backoff::decorrelated(ms(10)).max_delay(Duration::from_secs(60)).build().unwrap();
    // The high end of U[base, 3·previous] follows `previous`; the low end is the base.
    assert_eq!(b.delay(1, ms(100), &mut Fixed(u64::MAX)), ms(300));
    assert_eq!(b.delay(1, Duration::from_secs(1), &mut Fixed(u64::MAX)), Duration::from_secs(3));
    assert_eq!(b.delay(1, Duration::from_secs(1), &mut Fixed(0)), ms(10));
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(u64::MAX)), ms(30), "previous below base reads as base");
}

#[test]
fn b3_a_proportional_spread_is_rounded_to_the_nearest_unit() {
    // An envelope of 2^32 ns makes the spread equal to the factor in units of 2^-32: here
    // 2^31 + 0.75, which rounds up to 2^31 + 1.
    let envelope = Duration::from_nanos(1 << 32);
    let factor = 0.5 + 0.75 / 4_294_967_296.0;
    let b = Backoff::constant(envelope).jitter(Jitter::Proportional(factor)).build().unwrap();
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(0)), Duration::from_nanos((1 << 31) - 1));
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(u64::MAX)), Duration::from_nanos((1 << 32) + (1 << 31) + 1));
}

#[test]
fn splitmix64_draws_32_bits_from_the_top_of_its_64() {
    let (mut a, mut b) = (SplitMix64::new(42), SplitMix64::new(42));
    for _ in 0..4 {
        assert_eq!(a.next_u32(), (b.next_u64() >> 32) as u32);
    }
}

#[test]
fn instants_add_and_subtract_checked_and_in_place() {
    let one = Instant::from_secs(1);
    assert_eq!(one.checked_add(Duration::from_secs(2)), Some(Instant::from_secs(3)));
    assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
    assert_eq!(one.checked_sub(ms(250)), Some(Instant::from_millis(750)));
    assert_eq!(one.checked_sub(Duration::from_secs(2)), None);
    let mut t = one;
    t += ms(500);
    assert_eq!(t, Instant::from_millis(1_500));
    t -= Duration::from_secs(1);
    assert_eq!(t, Instant::from_millis(500));
    t -= Duration::from_secs(9);
    assert_eq!(t, Instant::ZERO, "saturates at the epoch");
}
