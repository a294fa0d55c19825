//! Rules B1–B5: the backoff schedule, its cap, floor and jitter, and its validation.

use core::time::Duration;

use persevere::{Backoff, BackoffState, Jitter, PolicyError, Schedule};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

#[test]
fn b1_constant_linear_and_exponential_follow_their_formulas() {
    let constant = Backoff::constant(ms(70)).build().unwrap();
    let linear = Backoff::linear(ms(100), ms(30)).build().unwrap();
    let exponential = Backoff::exponential(ms(100), 3.0).build().unwrap();
    for n in 1..=10u32 {
        assert_eq!(constant.envelope(n), ms(70));
        assert_eq!(linear.envelope(n), ms(100 + 30 * u64::from(n - 1)));
        assert_eq!(exponential.envelope(n), ms(100 * 3u64.pow(n - 1)));
    }
    let fractional = Backoff::exponential(Duration::from_secs(1), 1.5).build().unwrap();
    assert_eq!(fractional.envelope(3), Duration::from_millis(2250));
}

/// Found by the `backoff` fuzz target: an initial delay above 2^53 ns went through `f64` and
/// came back rounded (2^54 − 1 ns gave 2^54 ns), so envelope(1) was not `initial`.
#[test]
fn b1_an_exponential_envelope_starts_exactly_at_initial() {
    for initial in [(1u64 << 53) + 1, (1 << 54) - 1, 11_863_788_345_444_574_372, u64::MAX - 1] {
        let initial = Duration::from_nanos(initial);
        let grows = Backoff::exponential(initial, 2.0).build().unwrap();
        assert_eq!(grows.envelope(1), initial);
        assert_eq!(grows.envelope(0), initial);
        let flat = Backoff::exponential(initial, 1.0).build().unwrap();
        for n in [1, 2, 17, u32::MAX] {
            assert_eq!(flat.envelope(n), initial);
        }
    }
}

#[test]
fn b1_failure_count_zero_is_read_as_one() {
    let b = Backoff::exponential(ms(100), 2.0).build().unwrap();
    assert_eq!(b.envelope(0), b.envelope(1));
}

#[test]
fn b1_decorrelated_draws_between_base_and_three_times_the_previous_delay() {
    let b = Backoff::decorrelated(ms(10)).max_delay(ms(1_000)).build().unwrap();
    let mut r = rng(9);
    let mut previous = Duration::ZERO;
    let mut reached_cap = false;
    for n in 1..200 {
        let d = b.delay(n, previous, &mut r);
        let upper = previous.max(ms(10)) * 3;
        assert!(d >= ms(10) && d <= upper.min(ms(1_000)), "n={n} d={d:?} previous={previous:?}");
        assert!(d <= b.envelope(n), "the envelope bounds every draw");
        reached_cap |= d == ms(1_000);
        previous = d;
    }
    assert!(reached_cap, "decorrelated delays grow to the cap");
}

#[test]
fn b2_cap_is_never_exceeded_after_jitter_even_by_proportional_overshoot() {
    // Envelope at the cap, +100% jitter: half the draws would overshoot without the final cap.
    let b = Backoff::exponential(ms(100), 2.0).max_delay(ms(400)).jitter(Jitter::Proportional(1.0)).build().unwrap();
    let mut r = rng(1);
    let mut at_cap = 0;
    for _ in 0..1_000 {
        let d = b.delay(10, Duration::ZERO, &mut r);
        assert!(d <= ms(400));
        at_cap += usize::from(d == ms(400));
    }
    assert!(at_cap > 400, "the overshooting half lands on the cap, got {at_cap}");
}

#[test]
fn b2_floor_is_applied_after_jitter() {
    let b = Backoff::constant(ms(100)).min_delay(ms(60)).jitter(Jitter::Full).build().unwrap();
    let mut r = rng(2);
    for _ in 0..1_000 {
        let d = b.delay(1, Duration::ZERO, &mut r);
        assert!(d >= ms(60) && d <= ms(100), "{d:?}");
    }
}

/// Draws `count` delays for a fixed envelope and returns (min, max, mean) in nanoseconds.
fn spread(jitter: Jitter, count: u32) -> (u64, u64, f64) {
    let b = Backoff::constant(Duration::from_nanos(1_000_000)).jitter(jitter).build().unwrap();
    let mut r = rng(3);
    let (mut lo, mut hi, mut sum) = (u64::MAX, 0u64, 0f64);
    for _ in 0..count {
        let d = b.delay(1, Duration::ZERO, &mut r).as_nanos() as u64;
        lo = lo.min(d);
        hi = hi.max(d);
        sum += d as f64;
    }
    (lo, hi, sum / f64::from(count))
}

#[test]
fn b3_full_jitter_is_uniform_over_zero_to_the_envelope() {
    let (lo, hi, mean) = spread(Jitter::Full, 20_000);
    assert!(lo < 10_000 && hi > 990_000, "covers [0, d]: {lo}..{hi}");
    assert!((mean - 500_000.0).abs() < 10_000.0, "mean {mean}");
}

#[test]
fn b3_equal_jitter_is_uniform_over_half_to_the_envelope() {
    let (lo, hi, mean) = spread(Jitter::Equal, 20_000);
    assert!((500_000..510_000).contains(&lo) && (990_001..=1_000_000).contains(&hi), "{lo}..{hi}");
    assert!((mean - 750_000.0).abs() < 5_000.0, "mean {mean}");
}

#[test]
fn b3_proportional_jitter_spreads_both_ways_by_the_factor() {
    let (lo, hi, mean) = spread(Jitter::Proportional(0.1), 20_000);
    assert!((900_000..902_000).contains(&lo) && (1_098_001..=1_100_000).contains(&hi), "{lo}..{hi}");
    assert!((mean - 1_000_000.0).abs() < 2_000.0, "mean {mean}");
}

#[test]
fn b3_no_jitter_draws_nothing_and_returns_the_envelope() {
    let b = Backoff::linear(ms(5), ms(5)).build().unwrap();
    let mut r = rng(4);
    let before = r.clone();
    assert_eq!(b.delay(3, Duration::ZERO, &mut r), ms(15));
    assert_eq!(r, before, "no randomness consumed");
}

#[test]
fn b3_a_single_point_range_takes_nothing_from_the_rng_and_a_wider_one_takes_one_draw() {
    let zero = Duration::ZERO;
    let single_point = [
        Backoff::constant(zero).jitter(Jitter::Full).build().unwrap(),
        Backoff::linear(zero, ms(5)).jitter(Jitter::Equal).build().unwrap(),
        Backoff::constant(ms(7)).jitter(Jitter::Proportional(0.0)).build().unwrap(),
        // A spread of ⌊3 ns · 0.1⌋ = 0 ns.
        Backoff::constant(Duration::from_nanos(3)).jitter(Jitter::Proportional(0.1)).build().unwrap(),
    ];
    for b in single_point {
        let mut r = rng(6);
        let before = r.clone();
        assert_eq!(b.delay(1, zero, &mut r), b.envelope(1), "{b:?}");
        assert_eq!(r, before, "{b:?}: no randomness consumed");
    }
    let wide = Backoff::constant(ms(7)).jitter(Jitter::Full).build().unwrap();
    let (mut r, mut one_draw) = (rng(6), rng(6));
    let _ = wide.delay(1, zero, &mut r);
    let _ = one_draw.next_u64();
    assert_eq!(r, one_draw, "a range of more than one value takes one draw");
}

#[test]
fn b4_extreme_inputs_give_the_cap_never_zero_and_never_a_panic() {
    let cap = Duration::from_secs(30);
    let huge = Backoff::exponential(ms(1), 1e300).max_delay(cap).build().unwrap();
    assert_eq!(huge.envelope(2), cap);
    assert_eq!(huge.envelope(u32::MAX), cap);
    let slow = Backoff::exponential(ms(1), 1.000_01).max_delay(cap).build().unwrap();
    assert_eq!(slow.envelope(u32::MAX), cap);
    let uncapped = Backoff::exponential(ms(1), 2.0).max_delay(Duration::MAX).build().unwrap();
    assert_eq!(uncapped.envelope(u32::MAX), Duration::from_nanos(u64::MAX));
    assert_eq!(uncapped.envelope(31), ms(1 << 30), "no wrap at 2^31 or anywhere near it");
    let linear =
        Backoff::linear(Duration::from_secs(1), Duration::from_secs(u64::MAX / 2_000_000_000)).build().unwrap();
    assert_eq!(linear.envelope(u32::MAX), Duration::from_nanos(u64::MAX));
    let mut r = rng(5);
    for jitter in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Proportional(1.0)] {
        let b = Backoff::exponential(ms(1), 2.0).max_delay(Duration::MAX).jitter(jitter).build().unwrap();
        let d = b.delay(u32::MAX, Duration::MAX, &mut r);
        assert!(d <= Duration::from_nanos(u64::MAX));
    }
    let decorrelated = Backoff::decorrelated(ms(1)).build().unwrap();
    assert!(decorrelated.delay(u32::MAX, Duration::MAX, &mut r) >= ms(1));
}

#[test]
fn b4_multiplier_one_is_a_constant_envelope() {
    let b = Backoff::exponential(ms(250), 1.0).max_delay(ms(1_000)).build().unwrap();
    assert_eq!(b.envelope(1), ms(250));
    assert_eq!(b.envelope(u32::MAX), ms(250));
}

#[test]
fn b5_incremental_state_gives_what_the_pure_function_gives() {
    for jitter in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Proportional(0.3)] {
        let b = Backoff::exponential(ms(10), 1.7).max_delay(ms(5_000)).jitter(jitter).build().unwrap();
        let (mut a, mut c) = (rng(6), rng(6));
        let mut state = BackoffState::new();
        let mut previous = Duration::ZERO;
        for n in 1..=40 {
            let incremental = state.next_delay(&b, &mut a);
            let pure = b.delay(n, previous, &mut c);
            assert_eq!(incremental, pure, "{jitter:?} n={n}");
            assert_eq!(state.failures(), n);
            previous = pure;
        }
        state.reset();
        assert_eq!(state, BackoffState::new());
    }
}

#[test]
fn policy_errors_name_the_bad_setting() {
    let e = |b: persevere::BackoffBuilder| b.build().unwrap_err();
    assert!(matches!(e(Backoff::exponential(ms(1), f64::NAN)), PolicyError::NotFinite { setting: "multiplier", .. }));
    assert!(matches!(e(Backoff::exponential(ms(1), f64::INFINITY)), PolicyError::NotFinite { .. }));
    assert!(matches!(e(Backoff::exponential(ms(1), 0.5)), PolicyError::MultiplierOutOfRange { .. }));
    assert!(matches!(e(Backoff::exponential(ms(1), 1.0 + 1e-15)), PolicyError::MultiplierOutOfRange { .. }));
    assert!(matches!(e(Backoff::exponential(ms(1), 1.0 + 1e-7)), PolicyError::MultiplierOutOfRange { .. }));
    assert!(matches!(e(Backoff::exponential(Duration::ZERO, 2.0)), PolicyError::Zero { .. }));
    assert!(matches!(e(Backoff::decorrelated(Duration::ZERO)), PolicyError::Zero { .. }));
    assert!(matches!(
        e(Backoff::constant(ms(1)).jitter(Jitter::Proportional(1.5))),
        PolicyError::FractionOutOfRange { .. }
    ));
    assert!(matches!(
        e(Backoff::constant(ms(1)).jitter(Jitter::Proportional(-0.1))),
        PolicyError::FractionOutOfRange { .. }
    ));
    assert!(matches!(
        e(Backoff::constant(ms(1)).jitter(Jitter::Proportional(f64::NAN))),
        PolicyError::NotFinite { .. }
    ));
    assert!(matches!(e(Backoff::exponential(ms(10), 2.0).max_delay(ms(5))), PolicyError::CapBelow { .. }));
    assert!(matches!(
        e(Backoff::constant(ms(1)).min_delay(ms(10)).max_delay(ms(5))),
        PolicyError::CapBelow { setting: "min_delay", .. }
    ));
    assert!(matches!(e(Backoff::constant(Duration::MAX)), PolicyError::DurationOverflow { .. }));
    assert!(matches!(e(Backoff::decorrelated(ms(1)).jitter(Jitter::Full)), PolicyError::Conflict { .. }));
    let message = e(Backoff::exponential(ms(10), 2.0).max_delay(ms(5))).to_string();
    assert!(message.contains("max_delay") && message.contains("initial delay"), "{message}");
}

#[test]
fn a_backoff_reports_the_settings_it_was_built_from() {
    let b = Backoff::linear(ms(1), ms(2)).max_delay(ms(9)).min_delay(ms(1)).jitter(Jitter::Equal).build().unwrap();
    assert_eq!(b.schedule(), Schedule::Linear { initial: ms(1), step: ms(2) });
    assert_eq!((b.max_delay(), b.min_delay(), b.jitter_kind()), (ms(9), ms(1), Jitter::Equal));
}

fn any_jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::Full),
        Just(Jitter::Equal),
        (0.0..=1.0f64).prop_map(Jitter::Proportional)
    ]
}

fn any_backoff() -> impl Strategy<Value = Backoff> {
    let schedule = prop_oneof![
        (0..10_000_000_000u64).prop_map(|n| Schedule::Constant(Duration::from_nanos(n))),
        (0..10_000_000_000u64, 0..10_000_000_000u64)
            .prop_map(|(i, s)| Schedule::Linear { initial: Duration::from_nanos(i), step: Duration::from_nanos(s) }),
        (1..10_000_000_000u64, prop_oneof![Just(1.0), 1.000_001..1e6f64, 1.000_001..4.0f64])
            .prop_map(|(i, m)| { Schedule::Exponential { initial: Duration::from_nanos(i), multiplier: m } }),
        (1..10_000_000_000u64).prop_map(|b| Schedule::Decorrelated { base: Duration::from_nanos(b) }),
    ];
    (schedule, any_jitter(), 0..4u8, any::<u64>(), any::<u64>()).prop_filter_map(
        "valid settings only",
        |(schedule, jitter, cap_kind, cap, floor)| {
            let jitter = if matches!(schedule, Schedule::Decorrelated { .. }) { Jitter::None } else { jitter };
            let mut builder = persevere::BackoffBuilder::new(schedule).jitter(jitter);
            builder = match cap_kind {
                0 => builder,
                1 => builder.max_delay(Duration::MAX),
                _ => builder.max_delay(Duration::from_nanos(cap)),
            };
            let max = builder.max_delay.map_or(u64::MAX, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
            builder = builder.min_delay(Duration::from_nanos(floor % max.saturating_add(1).max(1)));
            builder.build().ok()
        },
    )
}

proptest! {
    #[test]
    fn b2_every_jittered_delay_lies_between_floor_and_cap(
        backoff in any_backoff(), failures in any::<u32>(), previous in any::<u64>(), seed in any::<u64>()
    ) {
        let mut r = rng(seed);
        let d = backoff.delay(failures, Duration::from_nanos(previous), &mut r);
        prop_assert!(d <= backoff.max_delay(), "{d:?} > cap {:?}", backoff.max_delay());
        prop_assert!(d >= backoff.min_delay(), "{d:?} < floor {:?}", backoff.min_delay());
        if !matches!(backoff.schedule(), Schedule::Decorrelated { .. }) {
            let envelope = backoff.envelope(failures);
            let most = match backoff.jitter_kind() {
                Jitter::Proportional(f) => envelope + Duration::from_nanos((envelope.as_nanos() as f64 * f) as u64),
                _ => envelope,
            };
            prop_assert!(d <= most.max(backoff.min_delay()));
        }
    }

    #[test]
    fn b4_envelope_is_non_decreasing_reaches_the_cap_and_stays(
        backoff in any_backoff(), a in any::<u32>(), b in any::<u32>()
    ) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(backoff.envelope(lo) <= backoff.envelope(hi), "n={lo}: {:?} > n={hi}: {:?}", backoff.envelope(lo), backoff.envelope(hi));
        prop_assert!(backoff.envelope(hi) <= backoff.max_delay());
        prop_assert!(backoff.envelope(hi) > Duration::ZERO || backoff.envelope(1) == Duration::ZERO, "no wrap to zero");
        let grows = match backoff.schedule() {
            Schedule::Exponential { multiplier, .. } => multiplier >= 1.001,
            Schedule::Decorrelated { .. } => true,
            _ => false,
        };
        if grows {
            prop_assert_eq!(backoff.envelope(u32::MAX), backoff.max_delay(), "a growing schedule reaches the cap");
        }
    }

    #[test]
    fn b4_consecutive_envelopes_never_shrink(backoff in any_backoff(), n in any::<u32>()) {
        prop_assert!(backoff.envelope(n) <= backoff.envelope(n.saturating_add(1)));
    }
}

#[test]
fn b4_the_slowest_accepted_multiplier_stays_monotone_up_to_the_largest_cap() {
    // Repeated squaring's rounding error grows with the failure count; the minimum multiplier
    // (1 + 1e-6) keeps it below one step of growth all the way to 2^64 ns (about 4.4e7
    // failures from 1 ns). A fuzzer found the envelope drifting at 4.3e9 failures with
    // ×(1 + 1.5e-11), which is now refused.
    let b = Backoff::exponential(Duration::from_nanos(1), 1.0 + 1e-6).max_delay(Duration::MAX).build().unwrap();
    let mut n = 1u32;
    while n < 50_000_000 {
        for k in n..n + 64 {
            assert!(b.envelope(k) <= b.envelope(k + 1), "envelope({k}) > envelope({})", k + 1);
        }
        n = n.saturating_mul(3).saturating_add(7);
    }
    assert_eq!(b.envelope(u32::MAX), Duration::from_nanos(u64::MAX));
    assert!(Backoff::exponential(Duration::from_nanos(1), 1.0 + 1.52e-11).build().is_err());
}
