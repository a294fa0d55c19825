//! Rules K1–K5 on the circuit breaker, G8 (no admission while open, at most `permits` probes,
//! no wedge) and G12 (a refused input changes nothing).

use core::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerError, BreakerPolicy, BreakerPolicyBuilder, BreakerStatus, BreakerWindow, CallOutcome,
    HalfOpenRule, Instant, Jitter, Permit, PolicyError, Rejected,
};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn rng() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(5)
}

/// Open for 1 s, then 2 s, 4 s, … up to 8 s; no jitter.
fn open_backoff() -> Backoff {
    Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(8)).build().unwrap()
}

fn policy(configure: impl FnOnce(BreakerPolicyBuilder) -> BreakerPolicyBuilder) -> BreakerPolicy {
    configure(BreakerPolicy::builder(open_backoff())).build().unwrap()
}

/// One call at `now` that returns `outcome` immediately.
fn call(b: &mut Breaker, p: &BreakerPolicy, now: Instant, outcome: CallOutcome) -> Result<(), Rejected> {
    let permit = b.try_acquire(p, now, &mut rng())?;
    b.record(p, now, permit, outcome, &mut rng()).unwrap();
    Ok(())
}

fn fail(b: &mut Breaker, p: &BreakerPolicy, now: Instant) {
    call(b, p, now, CallOutcome::Failure).unwrap();
}

fn succeed(b: &mut Breaker, p: &BreakerPolicy, now: Instant) {
    call(b, p, now, CallOutcome::Success).unwrap();
}

#[test]
fn k1_automatic_states_closed_open_half_open_closed() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    assert_eq!(b.status(), BreakerStatus::Closed);
    fail(&mut b, &p, at(0));
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_000) });
    assert_eq!(b.poll_timeout(), Some(at(1_000)));
    b.handle_timeout(&p, at(999), &mut rng());
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_000) }, "early timeout does nothing");
    b.handle_timeout(&p, at(1_000), &mut rng());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 0 });
    let probe = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    assert!(probe.is_probe());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    b.record(&p, at(1_001), probe, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Closed);
    assert_eq!(b.openings(), 0);
}

#[test]
fn k1_isolated_rejects_everything_and_disabled_admits_everything_until_reset() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    b.handle_isolate(at(0));
    assert_eq!(b.status(), BreakerStatus::Isolated);
    assert_eq!(b.try_acquire(&p, at(1_000_000), &mut rng()), Err(Rejected { retry_after: None }));
    assert_eq!(b.poll_timeout(), None);
    b.handle_timeout(&p, Instant::MAX, &mut rng());
    assert_eq!(b.status(), BreakerStatus::Isolated);

    b.handle_disable(at(1));
    assert_eq!(b.status(), BreakerStatus::Disabled);
    for i in 0..50 {
        fail(&mut b, &p, at(2 + i));
    }
    assert_eq!(b.status(), BreakerStatus::Disabled, "nothing is counted while disabled");

    b.handle_reset(&p, at(100));
    assert_eq!(b.status(), BreakerStatus::Closed);
    fail(&mut b, &p, at(100));
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_100) }, "automatic again after reset");
}

#[test]
fn k2_consecutive_failures_trip_at_n_and_a_success_resets_the_streak() {
    let p = policy(|b| b.consecutive_failures(3));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    succeed(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    assert_eq!(b.status(), BreakerStatus::Closed);
    assert_eq!(b.window_counts().unwrap().consecutive_failures, 2);
    fail(&mut b, &p, at(0));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));
}

#[test]
fn k2_failure_rate_over_a_count_window_trips_only_after_minimum_calls() {
    let p = policy(|b| b.failure_rate(0.5).count_window(10).minimum_calls(4));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    assert_eq!(b.status(), BreakerStatus::Closed, "3 of 3 failed, but fewer than minimum_calls");
    succeed(&mut b, &p, at(0));
    // 3 failures in 4 calls: 75 % ≥ 50 %.
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));

    // Exactly at the rate trips; just below does not.
    let mut b = Breaker::new(&p, 2);
    for _ in 0..5 {
        succeed(&mut b, &p, at(0));
    }
    for _ in 0..4 {
        fail(&mut b, &p, at(0));
    }
    assert_eq!(b.status(), BreakerStatus::Closed, "4 of 9 is below 50 %");
    fail(&mut b, &p, at(0));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "5 of 10 is 50 %");
}

#[test]
fn k2_a_count_window_holds_only_the_last_n_calls() {
    let p = policy(|b| b.failure_rate(0.5).count_window(4).minimum_calls(4));
    let mut b = Breaker::new(&p, 1);
    // F S S S: 25 %; then S replaces F: 0 %; then F F: 2 of the last 4 = 50 %.
    fail(&mut b, &p, at(0));
    for _ in 0..3 {
        succeed(&mut b, &p, at(0));
    }
    assert_eq!(b.window_counts().unwrap().failures, 1);
    succeed(&mut b, &p, at(0));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures), (4, 0), "the oldest failure left the window");
    fail(&mut b, &p, at(0));
    assert_eq!(b.status(), BreakerStatus::Closed);
    fail(&mut b, &p, at(0));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));
}

#[test]
fn k2_a_large_count_window_wraps_correctly() {
    let p = policy(|b| b.failure_rate(1.0).count_window(512).minimum_calls(512));
    let mut b = Breaker::new(&p, 1);
    for round in 0..3 {
        for i in 0..512u64 {
            // One success at the same place every round keeps the rate below 100 %.
            if i == 100 {
                succeed(&mut b, &p, at(0))
            } else {
                fail(&mut b, &p, at(0))
            }
            if b.status() != BreakerStatus::Closed {
                panic!("tripped at round {round} call {i}");
            }
        }
    }
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures), (512, 511));
}

#[test]
fn k2_slow_call_rate_trips_on_slow_successes() {
    let p = policy(|b| b.slow_call_rate(0.5, ms(100)).count_window(4).minimum_calls(4));
    let mut b = Breaker::new(&p, 1);
    let slow = |b: &mut Breaker, took: u64| {
        let permit = b.try_acquire(&p, at(0), &mut rng()).unwrap();
        b.record(&p, at(took), permit, CallOutcome::Success, &mut rng()).unwrap();
    };
    slow(&mut b, 99);
    slow(&mut b, 100);
    slow(&mut b, 5);
    assert_eq!(b.window_counts().unwrap().slow, 1);
    assert_eq!(b.status(), BreakerStatus::Closed);
    slow(&mut b, 250);
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "2 of 4 calls took ≥ 100 ms");

    // A caller-measured duration is used as given.
    let mut b = Breaker::new(&p, 2);
    for _ in 0..4 {
        let permit = b.try_acquire(&p, at(0), &mut rng()).unwrap();
        b.record_with_duration(&p, at(0), permit, CallOutcome::Success, ms(150), &mut rng()).unwrap();
    }
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));
}

#[test]
fn k2_a_time_window_forgets_buckets_older_than_its_span() {
    let p = policy(|b| b.failure_rate(0.5).time_window(Duration::from_secs(10), 10).minimum_calls(4));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(500));
    fail(&mut b, &p, at(1_200));
    assert_eq!(b.window_counts().unwrap().calls, 3);
    // 10 s later the first bucket (0–1 s) has left; its two failures with it.
    succeed(&mut b, &p, at(10_000));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures), (2, 1));
    succeed(&mut b, &p, at(10_100));
    assert_eq!(b.status(), BreakerStatus::Closed, "1 of 3, then 1 of 4: 25 %");
    fail(&mut b, &p, at(10_200));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "2 of 4 in the window");

    // A long quiet spell empties the window.
    let mut b = Breaker::new(&p, 2);
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    succeed(&mut b, &p, at(1_000_000));
    assert_eq!(b.window_counts().unwrap().calls, 1);
}

/// Found by the `breaker` fuzz target: with a bucket width that divides 2^64 − 1 (17 ns
/// here), every call at the last representable instant opened a new bucket, so the window
/// dropped calls that were still in it.
#[test]
fn k2_calls_at_the_last_instant_stay_in_the_time_window() {
    let p = policy(|b| b.failure_rate(0.5).time_window(Duration::from_nanos(51), 3).minimum_calls(10));
    let mut b = Breaker::new(&p, 1);
    let last = Instant::MAX;
    for n in 1..=5 {
        succeed(&mut b, &p, last);
        assert_eq!(b.window_counts().unwrap().calls, n);
    }
    // An earlier time is read as the latest one: the call lands in the same bucket.
    succeed(&mut b, &p, Instant::from_nanos(u64::MAX - 1_000));
    succeed(&mut b, &p, last);
    assert_eq!(b.window_counts().unwrap().calls, 7);
}

#[test]
fn k2_invalid_configurations_are_policy_errors() {
    let base = || BreakerPolicy::builder(open_backoff());
    assert!(matches!(base().build(), Err(PolicyError::Zero { setting: "trip rules", .. })));
    assert!(matches!(base().consecutive_failures(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(base().failure_rate(f64::NAN).build(), Err(PolicyError::NotFinite { .. })));
    assert!(matches!(base().failure_rate(f64::INFINITY).build(), Err(PolicyError::NotFinite { .. })));
    assert!(matches!(base().failure_rate(1.5).build(), Err(PolicyError::FractionOutOfRange { .. })));
    assert!(matches!(base().failure_rate(-0.1).build(), Err(PolicyError::FractionOutOfRange { .. })));
    assert!(matches!(base().failure_rate(0.0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(base().slow_call_rate(0.5, Duration::ZERO).build(), Err(PolicyError::Zero { .. })));
    let mut no_threshold = base();
    no_threshold.slow_call_rate = Some(0.5);
    assert!(matches!(no_threshold.build(), Err(PolicyError::Zero { setting: "slow_call_threshold", .. })));
    assert!(matches!(base().failure_rate(0.5).count_window(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(base().failure_rate(0.5).count_window(513).build(), Err(PolicyError::LimitTooLarge { .. })));
    assert!(matches!(
        base().failure_rate(0.5).time_window(Duration::from_secs(1), 0).build(),
        Err(PolicyError::Zero { .. })
    ));
    assert!(matches!(
        base().failure_rate(0.5).time_window(Duration::from_secs(1), 17).build(),
        Err(PolicyError::LimitTooLarge { .. })
    ));
    assert!(matches!(
        base().failure_rate(0.5).time_window(Duration::from_nanos(3), 4).build(),
        Err(PolicyError::Zero { .. })
    ));
    assert!(matches!(
        base().failure_rate(0.5).time_window(Duration::MAX, 4).build(),
        Err(PolicyError::DurationOverflow { .. })
    ));
    assert!(matches!(base().failure_rate(0.5).minimum_calls(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(
        base().failure_rate(0.5).count_window(10).minimum_calls(11).build(),
        Err(PolicyError::Conflict { .. })
    ));
    assert!(matches!(base().consecutive_failures(1).half_open_permits(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(
        base().consecutive_failures(1).half_open_permits(17).build(),
        Err(PolicyError::LimitTooLarge { .. })
    ));
    assert!(matches!(base().consecutive_failures(1).successes_to_close(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(
        base().consecutive_failures(1).probe_timeout(Duration::ZERO).build(),
        Err(PolicyError::Zero { .. })
    ));
    // The defaults: a count window of 100 with minimum_calls 100, one permit, 10 s leases.
    let p = base().failure_rate(0.5).build().unwrap();
    assert_eq!((p.minimum_calls(), p.half_open_permits(), p.successes_to_close()), (100, 1, 1));
    assert_eq!(p.window(), BreakerWindow::Calls(100));
    assert_eq!(p.probe_timeout(), Duration::from_secs(10));
}

#[test]
fn k3_open_duration_follows_the_backoff_over_consecutive_openings() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    let mut now = at(0);
    let mut durations = Vec::new();
    for _ in 0..6 {
        fail(&mut b, &p, now);
        let BreakerStatus::Open { until } = b.status() else { panic!("not open") };
        durations.push(until.saturating_duration_since(now));
        now = until;
        // The probe fails: open again, for longer.
        let probe = b.try_acquire(&p, now, &mut rng()).unwrap();
        b.record(&p, now, probe, CallOutcome::Failure, &mut rng()).unwrap();
        let BreakerStatus::Open { until } = b.status() else { panic!("not reopened") };
        durations.push(until.saturating_duration_since(now));
        now = until;
        let probe = b.try_acquire(&p, now, &mut rng()).unwrap();
        b.record(&p, now, probe, CallOutcome::Success, &mut rng()).unwrap();
        assert_eq!(b.status(), BreakerStatus::Closed);
    }
    // Each closing starts the schedule over: 1 s then 2 s, every time.
    for pair in durations.chunks(2) {
        assert_eq!(pair, [Duration::from_secs(1), Duration::from_secs(2)]);
    }
    // Without closing in between, the openings climb to the cap.
    let mut b = Breaker::new(&p, 2);
    fail(&mut b, &p, at(0));
    let mut seen = Vec::new();
    for _ in 0..6 {
        let BreakerStatus::Open { until } = b.status() else { panic!() };
        seen.push(b.openings());
        let probe = b.try_acquire(&p, until, &mut rng()).unwrap();
        let before = until;
        b.record(&p, until, probe, CallOutcome::Failure, &mut rng()).unwrap();
        let BreakerStatus::Open { until } = b.status() else { panic!() };
        seen.push(until.saturating_duration_since(before).as_secs() as u32);
    }
    assert_eq!(seen, [1, 2, 2, 4, 3, 8, 4, 8, 5, 8, 6, 8]);
}

#[test]
fn k3_jittered_open_durations_stay_in_the_envelope() {
    let backoff = Backoff::exponential(Duration::from_secs(1), 2.0)
        .max_delay(Duration::from_secs(8))
        .jitter(Jitter::Full)
        .build()
        .unwrap();
    let p = BreakerPolicy::builder(backoff).consecutive_failures(1).build().unwrap();
    let mut r = ChaCha8Rng::seed_from_u64(9);
    let mut b = Breaker::new(&p, 1);
    let permit = b.try_acquire(&p, at(0), &mut r).unwrap();
    b.record(&p, at(0), permit, CallOutcome::Failure, &mut r).unwrap();
    let BreakerStatus::Open { until } = b.status() else { panic!() };
    assert!(until <= at(1_000));
}

#[test]
fn k3_a_rejection_carries_the_time_until_half_open() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let before = b;
    assert_eq!(b.try_acquire(&p, at(250), &mut rng()), Err(Rejected { retry_after: Some(ms(750)) }));
    assert_eq!(b.try_acquire(&p, at(999), &mut rng()), Err(Rejected { retry_after: Some(ms(1)) }));
    assert_eq!(b, before, "a rejection changes nothing");
    // A clock that steps back is read as the latest time seen.
    assert_eq!(b.try_acquire(&p, at(0), &mut rng()), Err(Rejected { retry_after: Some(ms(1_000)) }));
    assert!(b.try_acquire(&p, at(1_000), &mut rng()).is_ok());
}

#[test]
fn k4_half_open_admits_at_most_permits_probes_at_once() {
    let p = policy(|b| b.consecutive_failures(1).half_open_permits(3).successes_to_close(5));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let probes: Vec<Permit> = (0..3).map(|i| b.try_acquire(&p, at(1_000 + i), &mut rng()).unwrap()).collect();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 3 });
    // The fourth waits for the earliest lease (acquired at 1 000 ms, 10 s lease).
    assert_eq!(b.try_acquire(&p, at(2_000), &mut rng()), Err(Rejected { retry_after: Some(ms(9_000)) }));
    // A success frees its permit for another probe; the breaker stays half-open until 5 successes.
    b.record(&p, at(2_000), probes[0], CallOutcome::Success, &mut rng()).unwrap();
    let fourth = b.try_acquire(&p, at(2_000), &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 3 });
    for permit in [probes[1], probes[2], fourth] {
        b.record(&p, at(2_001), permit, CallOutcome::Success, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 0 });
    succeed(&mut b, &p, at(2_002));
    assert_eq!(b.status(), BreakerStatus::Closed, "the fifth success closes it");
}

#[test]
fn k4_one_failed_probe_reopens_and_outstanding_probes_become_stale() {
    let p = policy(|b| b.consecutive_failures(1).half_open_permits(2));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let first = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let second = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_010), first, CallOutcome::Failure, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_010) });
    let before = b;
    assert!(matches!(
        b.record(&p, at(1_020), second, CallOutcome::Success, &mut rng()),
        Err(BreakerError::Stale { .. })
    ));
    assert_eq!(b, before);
}

/// What `outstanding_permits` reports: the current state's permits not yet recorded, so an
/// operator can see a leak (a permit neither recorded nor released).
#[test]
fn k4_outstanding_permits_count_the_current_states_unrecorded_permits() {
    let p = policy(|b| b.consecutive_failures(2).half_open_permits(2));
    let mut b = Breaker::new(&p, 1);
    let mut r = rng();
    let closed: Vec<Permit> = (0..3).map(|_| b.try_acquire(&p, at(0), &mut r).unwrap()).collect();
    assert_eq!(b.outstanding_permits(), 3);
    b.record(&p, at(1), closed[1], CallOutcome::Success, &mut r).unwrap();
    assert_eq!(b.outstanding_permits(), 2, "recording one settles one, in any order");
    b.record(&p, at(2), closed[0], CallOutcome::Success, &mut r).unwrap();
    b.record(&p, at(2), closed[2], CallOutcome::Ignored, &mut r).unwrap();
    assert_eq!(b.outstanding_permits(), 0);
    let before = b;
    assert!(b.record(&p, at(3), closed[2], CallOutcome::Success, &mut r).is_err());
    assert_eq!((b, b.outstanding_permits()), (before, 0), "a record with none out settles nothing");
    fail(&mut b, &p, at(3));
    fail(&mut b, &p, at(3));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));
    assert_eq!(b.outstanding_permits(), 0, "open: nothing is out");

    let probes: Vec<Permit> = (0..2).map(|_| b.try_acquire(&p, at(1_003), &mut r).unwrap()).collect();
    assert_eq!(b.outstanding_permits(), 2, "half-open: the probes out");
    b.record(&p, at(1_004), probes[0], CallOutcome::Ignored, &mut r).unwrap();
    assert_eq!(b.outstanding_permits(), 1);
    b.record(&p, at(1_005), probes[1], CallOutcome::Failure, &mut r).unwrap();
    assert_eq!(b.outstanding_permits(), 0, "reopened");

    b.handle_disable(at(5_000));
    let disabled = b.try_acquire(&p, at(5_000), &mut r).unwrap();
    assert_eq!(b.outstanding_permits(), 1, "disabled still counts its permits");
    b.handle_isolate(at(5_001));
    assert_eq!(b.outstanding_permits(), 0, "isolated: the disabled permit is stale");
    assert!(b.record(&p, at(5_002), disabled, CallOutcome::Success, &mut r).is_err());
}

#[test]
fn k4_a_lost_probe_result_expires_at_its_lease_deadline_as_a_failure() {
    let p = policy(|b| b.consecutive_failures(1).probe_timeout(ms(500)));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let lost = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    assert_eq!(b.poll_timeout(), Some(at(1_500)), "the lease deadline is the next timeout");
    b.handle_timeout(&p, at(1_499), &mut rng());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    b.handle_timeout(&p, at(1_500), &mut rng());
    // Reopened at the deadline for the second open duration (2 s).
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_500) });
    assert!(matches!(b.record(&p, at(1_600), lost, CallOutcome::Success, &mut rng()), Err(BreakerError::Stale { .. })));

    // A driver that never calls handle_timeout does not wedge it either: the next
    // try_acquire expires the lease, at its deadline, with the same result.
    let mut lazy = Breaker::new(&p, 1);
    fail(&mut lazy, &p, at(0));
    let _lost = lazy.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    assert_eq!(lazy.try_acquire(&p, at(2_000), &mut rng()), Err(Rejected { retry_after: Some(ms(1_500)) }));
    assert_eq!(lazy.status(), BreakerStatus::Open { until: at(3_500) });
    assert_eq!(lazy.status(), b.status());

    // A result that arrives after its deadline, before anyone noticed, counts as the failure
    // the expiry already was.
    let mut late = Breaker::new(&p, 1);
    fail(&mut late, &p, at(0));
    let probe = late.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    late.record(&p, at(1_700), probe, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(late.status(), BreakerStatus::Open { until: at(3_500) });
}

/// Found by the simulator (`cargo run -p sim --release -- replay breaker 1357` before the fix):
/// an expired lease reopened the breaker for an open period that had already ended by `now`,
/// and `handle_timeout` stopped there, so a second `handle_timeout` at the same instant turned
/// it half-open, and a `try_acquire` at that instant was rejected with `retry_after` zero.
#[test]
fn k4_a_lease_expiry_whose_open_period_already_ended_is_half_open_in_one_timeout() {
    // A zero open duration: the reopening at the lease deadline ends at once.
    let p = BreakerPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap())
        .consecutive_failures(1)
        .probe_timeout(ms(500))
        .build()
        .unwrap();
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let _lost = b.try_acquire(&p, at(0), &mut rng()).unwrap();
    b.handle_timeout(&p, at(500), &mut rng());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 0 }, "the open period ended at the deadline");
    let once = b;
    b.handle_timeout(&p, at(500), &mut rng());
    assert_eq!(b, once, "a second timeout at the same instant changes nothing");
    assert!(b.poll_timeout().is_none_or(|t| t > at(500)), "nothing is due any more");

    // The same through try_acquire, and with a lease noticed late: open for 2 s from the
    // deadline at 1.5 s, noticed at 4 s, when the open period has ended too.
    let p = policy(|b| b.consecutive_failures(1).probe_timeout(ms(500)));
    let mut lazy = Breaker::new(&p, 1);
    fail(&mut lazy, &p, at(0));
    let _lost = lazy.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let probe = lazy.try_acquire(&p, at(4_000), &mut rng()).expect("the open period ended at 3.5 s");
    assert!(probe.is_probe());
    assert_eq!(lazy.status(), BreakerStatus::HalfOpen { permits: 1 });
    let mut prompt = Breaker::new(&p, 1);
    fail(&mut prompt, &p, at(0));
    let _lost = prompt.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    prompt.handle_timeout(&p, at(1_500), &mut rng());
    prompt.handle_timeout(&p, at(3_500), &mut rng());
    let _probe = prompt.try_acquire(&p, at(4_000), &mut rng()).unwrap();
    assert_eq!(prompt.status(), lazy.status(), "the state does not depend on how promptly the driver woke it");
}

#[test]
fn k4_a_slow_probe_counts_as_a_failure_when_slow_calls_trip() {
    let p = policy(|b| b.slow_call_rate(1.0, ms(100)).count_window(1).consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let probe = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_200), probe, CallOutcome::Success, &mut rng()).unwrap();
    assert!(matches!(b.status(), BreakerStatus::Open { .. }));
}

#[test]
fn k4_an_ignored_probe_frees_its_permit_without_deciding() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let probe = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_001), probe, CallOutcome::Ignored, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 0 });
    assert_eq!(b.poll_timeout(), None);
    succeed(&mut b, &p, at(1_002));
    assert_eq!(b.status(), BreakerStatus::Closed);
}

#[test]
fn k5_a_permit_from_another_breaker_is_refused_and_changes_nothing() {
    let p = policy(|b| b.consecutive_failures(1));
    let mut a = Breaker::new(&p, 1);
    let mut b = Breaker::new(&p, 2);
    let permit = a.try_acquire(&p, at(0), &mut rng()).unwrap();
    let _own = b.try_acquire(&p, at(0), &mut rng()).unwrap();
    let before = b;
    assert_eq!(
        b.record(&p, at(0), permit, CallOutcome::Failure, &mut rng()),
        Err(BreakerError::Foreign { this: 2, got: 1 })
    );
    assert_eq!(b, before);
}

#[test]
fn k5_a_permit_from_an_earlier_state_is_refused_and_changes_nothing() {
    let p = policy(|b| b.consecutive_failures(2));
    let mut b = Breaker::new(&p, 1);
    let old = b.try_acquire(&p, at(0), &mut rng()).unwrap();
    fail(&mut b, &p, at(0));
    fail(&mut b, &p, at(0));
    b.handle_reset(&p, at(1));
    let before = b;
    assert!(matches!(b.record(&p, at(2), old, CallOutcome::Failure, &mut rng()), Err(BreakerError::Stale { .. })));
    assert_eq!(b, before);
}

#[test]
fn k5_a_permit_recorded_twice_or_never_issued_is_refused_and_changes_nothing() {
    let p = policy(|b| b.consecutive_failures(5));
    let mut b = Breaker::new(&p, 1);
    let permit = b.try_acquire(&p, at(0), &mut rng()).unwrap();
    b.record(&p, at(0), permit, CallOutcome::Failure, &mut rng()).unwrap();
    let before = b;
    assert_eq!(
        b.record(&p, at(0), permit, CallOutcome::Failure, &mut rng()),
        Err(BreakerError::NotOutstanding { id: permit.id() })
    );
    assert_eq!(b, before);

    // Half-open: a probe recorded twice.
    let p = policy(|b| b.consecutive_failures(1).half_open_permits(2).successes_to_close(2));
    let mut b = Breaker::new(&p, 1);
    fail(&mut b, &p, at(0));
    let probe = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_000), probe, CallOutcome::Success, &mut rng()).unwrap();
    let before = b;
    assert!(matches!(
        b.record(&p, at(1_000), probe, CallOutcome::Success, &mut rng()),
        Err(BreakerError::NotOutstanding { .. })
    ));
    assert_eq!(b, before);
}

#[test]
fn k5_closed_and_disabled_permits_are_counted_out_and_back_across_states() {
    let p = policy(|b| b.consecutive_failures(1).half_open_permits(1));
    let mut b = Breaker::new(&p, 1);
    let permits: Vec<_> = (0..3).map(|_| b.try_acquire(&p, at(0), &mut rng()).unwrap()).collect();
    for permit in &permits {
        b.record(&p, at(0), *permit, CallOutcome::Success, &mut rng()).unwrap();
    }
    let before = b;
    assert!(matches!(
        b.record(&p, at(0), permits[1], CallOutcome::Success, &mut rng()),
        Err(BreakerError::NotOutstanding { .. })
    ));
    assert_eq!(b, before, "three out, three back: a fourth record changes nothing");

    // Open, half-open, closed again: the new closed state starts with none outstanding,
    // although the permit counter went on through the probe.
    fail(&mut b, &p, at(0));
    succeed(&mut b, &p, at(1_000));
    assert_eq!(b.status(), BreakerStatus::Closed);
    let fresh = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_000), fresh, CallOutcome::Ignored, &mut rng()).unwrap();
    assert!(matches!(
        b.record(&p, at(1_000), fresh, CallOutcome::Ignored, &mut rng()),
        Err(BreakerError::NotOutstanding { .. })
    ));

    // Disabled counts the same way.
    b.handle_disable(at(1_000));
    let permit = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_000), permit, CallOutcome::Failure, &mut rng()).unwrap();
    assert!(matches!(
        b.record(&p, at(1_000), permit, CallOutcome::Failure, &mut rng()),
        Err(BreakerError::NotOutstanding { .. })
    ));
    assert_eq!(b.status(), BreakerStatus::Disabled);
}

/// Found by the `breaker` fuzz target: a slow-call threshold of `u64::MAX` ns or more was
/// handed back by the builder conversion as "no threshold", so the policy no longer rebuilt
/// (nor deserialized): a slow-call rate needs its threshold.
#[test]
fn k2_a_slow_call_threshold_beyond_u64_nanoseconds_rebuilds_to_the_same_policy() {
    for threshold in [Duration::MAX, Duration::from_nanos(u64::MAX), Duration::from_secs(u64::MAX)] {
        let p = policy(|b| b.slow_call_rate(0.5, threshold));
        assert_eq!(BreakerPolicyBuilder::from(p).build(), Ok(p));
        #[cfg(feature = "serde")]
        {
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<BreakerPolicy>(&text).unwrap(), p);
        }
    }
}

#[cfg(feature = "serde")]
#[test]
fn k1_state_and_policy_round_trip_through_serde() {
    let p = policy(|b| b.failure_rate(0.5).time_window(Duration::from_secs(10), 10).minimum_calls(2));
    let mut b = Breaker::new(&p, 3);
    fail(&mut b, &p, at(0));
    let text = serde_json::to_string(&b).unwrap();
    assert_eq!(serde_json::from_str::<Breaker>(&text).unwrap(), b);
    let text = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<BreakerPolicy>(&text).unwrap(), p);
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*). A breaker saved
/// under a policy with consecutive failures only keeps no window; driven under a failure-rate
/// policy, its window is rebuilt for that policy at the next record, and the rate rule trips it.
/// (Before, it kept counting into no window and the rate rule silently never tripped.)
#[test]
fn k2_a_breaker_saved_under_consecutive_failures_and_driven_under_a_failure_rate_policy_trips_on_the_rate() {
    let consecutive = policy(|b| b.consecutive_failures(5));
    let mut b = Breaker::new(&consecutive, 1);
    for i in 0..3 {
        succeed(&mut b, &consecutive, at(i));
    }
    assert_eq!(b.window_counts().unwrap().calls, 0, "consecutive failures alone keep no window");
    #[cfg(feature = "serde")]
    let mut b: Breaker = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();

    let rated = policy(|b| b.failure_rate(0.5).count_window(4).minimum_calls(4));
    succeed(&mut b, &rated, at(10));
    succeed(&mut b, &rated, at(11));
    fail(&mut b, &rated, at(12));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures), (3, 1), "the rate policy's window counts every call");
    assert_eq!(b.status(), BreakerStatus::Closed, "1 of 3 calls failed, fewer than minimum_calls");
    fail(&mut b, &rated, at(13));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "2 of 4 is the 50 % rate: {:?}", b.status());
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a closed window
/// made for another window shape is rebuilt empty at the next record (a rate is never computed over
/// calls counted in another shape), keeping the consecutive failures, which no window shape
/// changes.
#[test]
fn k2_a_breaker_driven_under_another_window_shape_rebuilds_its_window_empty() {
    // A count window of 10, then of 20.
    let ten = policy(|b| b.consecutive_failures(5).failure_rate(0.5).count_window(10).minimum_calls(10));
    let twenty = policy(|b| b.consecutive_failures(5).failure_rate(0.5).count_window(20).minimum_calls(10));
    let mut b = Breaker::new(&ten, 1);
    for outcome in [CallOutcome::Success, CallOutcome::Success, CallOutcome::Success] {
        call(&mut b, &ten, at(0), outcome).unwrap();
    }
    fail(&mut b, &ten, at(0));
    fail(&mut b, &ten, at(0));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures, counts.consecutive_failures), (5, 2, 2));
    let mut longer = b;
    fail(&mut b, &twenty, at(1));
    let counts = b.window_counts().unwrap();
    assert_eq!(
        (counts.calls, counts.failures, counts.consecutive_failures),
        (1, 1, 3),
        "the counts restart; the consecutive failures go on"
    );
    fail(&mut b, &twenty, at(1));
    assert_eq!(b.status(), BreakerStatus::Closed);
    fail(&mut b, &twenty, at(1));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "2 + 3 consecutive failures trip it");
    // The rebuilt window is 20 calls long.
    for _ in 0..25 {
        succeed(&mut longer, &twenty, at(2));
    }
    assert_eq!(longer.window_counts().unwrap().calls, 20);

    // A time window, then a count window.
    let timed = policy(|b| {
        b.consecutive_failures(5).failure_rate(0.5).time_window(Duration::from_secs(10), 10).minimum_calls(2)
    });
    let counted = policy(|b| b.consecutive_failures(5).failure_rate(0.5).count_window(10).minimum_calls(10));
    let mut b = Breaker::new(&timed, 2);
    succeed(&mut b, &timed, at(0));
    succeed(&mut b, &timed, at(1_000));
    fail(&mut b, &timed, at(2_000));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures, counts.consecutive_failures), (3, 1, 1));
    fail(&mut b, &counted, at(3_000));
    let counts = b.window_counts().unwrap();
    assert_eq!((counts.calls, counts.failures, counts.consecutive_failures), (1, 1, 2));
    fail(&mut b, &counted, at(3_000));
    fail(&mut b, &counted, at(3_000));
    assert_eq!(b.status(), BreakerStatus::Closed, "3 calls, fewer than minimum_calls; 4 consecutive");
    fail(&mut b, &counted, at(3_000));
    assert!(matches!(b.status(), BreakerStatus::Open { .. }), "1 + 4 consecutive failures trip it");
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a persisted
/// breaker whose time window no sequence of calls could have made is refused when it loads.
/// (Before, a zero bucket width divided by zero, and a current bucket near `u32::MAX` overflowed,
/// on the next record.)
#[cfg(feature = "serde")]
#[test]
fn k2_a_loaded_breaker_with_an_impossible_window_is_refused() {
    let p = policy(|b| b.failure_rate(0.5).time_window(Duration::from_secs(10), 10).minimum_calls(5));
    let mut b = Breaker::new(&p, 1);
    succeed(&mut b, &p, at(0));
    fail(&mut b, &p, at(1_500));
    let json = serde_json::to_string(&b).unwrap();
    let loaded: Breaker = serde_json::from_str(&json).unwrap();
    assert_eq!(loaded, b, "the unedited state loads");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(value["phase"]["Closed"]["ring"]["Time"].is_object(), "the breaker's JSON shape changed: {json}");

    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 5] = [
        ("a zero bucket width", |v| v["phase"]["Closed"]["ring"]["Time"]["width"] = 0.into()),
        ("a current bucket near u32::MAX", |v| v["phase"]["Closed"]["ring"]["Time"]["slot"] = u32::MAX.into()),
        ("a current bucket past the bucket count", |v| v["phase"]["Closed"]["ring"]["Time"]["slot"] = 10.into()),
        ("calls that are not the sum of the buckets", |v| v["phase"]["Closed"]["calls"] = 7.into()),
        ("failures that are not the sum of the buckets", |v| v["phase"]["Closed"]["failures"] = 0.into()),
    ];
    for (what, edit) in edits {
        let mut edited = value.clone();
        edit(&mut edited);
        assert_ne!(edited, value, "{what}: the edit changed nothing");
        let err = serde_json::from_str::<Breaker>(&edited.to_string()).unwrap_err().to_string();
        assert!(err.contains("invalid state of a Breaker"), "{what}: {err}");
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    Record { pick: usize, outcome: u8, took_ms: u64 },
    Timeout,
    Advance(u64),
    Isolate,
    Disable,
    Reset,
    Open,
    HalfOpen,
    MetricsOnly,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Acquire),
        6 => (any::<usize>(), 0u8..3, 0u64..300).prop_map(|(pick, outcome, took_ms)| Op::Record { pick, outcome, took_ms }),
        2 => Just(Op::Timeout),
        4 => (0u64..3_000).prop_map(Op::Advance),
        1 => Just(Op::Isolate),
        1 => Just(Op::Disable),
        1 => Just(Op::Reset),
        1 => Just(Op::Open),
        1 => Just(Op::HalfOpen),
        1 => Just(Op::MetricsOnly),
    ]
}

fn any_policy() -> impl Strategy<Value = BreakerPolicy> {
    (1u32..5, 1u32..5, 1u32..4, 1u64..2_000, prop::bool::ANY, 1u32..20, prop::bool::ANY).prop_map(
        |(consecutive, permits, close, lease_ms, timed, n, by_rates)| {
            let b = BreakerPolicy::builder(open_backoff())
                .consecutive_failures(consecutive)
                .failure_rate(0.5)
                .slow_call_rate(0.8, ms(200))
                .half_open_permits(permits)
                .probe_timeout(ms(lease_ms));
            let b = if by_rates { b.half_open_by_rates() } else { b.successes_to_close(close) };
            let b = if timed { b.time_window(Duration::from_secs(5), 5) } else { b.count_window(n) };
            b.minimum_calls(n.min(5)).build().unwrap()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// G8: no call admitted while open or isolated; never more than `permits` probes out at
    /// once; never half-open past a lease deadline once the breaker has been told the time.
    /// G12: every refused `record` leaves the state equal.
    #[test]
    fn g8_no_admission_while_open_at_most_permits_probes_and_no_wedge(
        p in any_policy(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut r = ChaCha8Rng::seed_from_u64(1);
        let mut b = Breaker::new(&p, 1);
        let mut other = Breaker::new(&p, 2);
        let mut now = at(0);
        let mut held: Vec<Permit> = Vec::new();
        for op in ops {
            // Whether the breaker accepted an input at `now` (a refused input changes nothing).
            let mut told = true;
            match op {
                Op::Acquire => {
                    let before = b;
                    let status = b.status();
                    match b.try_acquire(&p, now, &mut r) {
                        Ok(permit) => {
                            if let BreakerStatus::Open { until } = status {
                                prop_assert!(until <= now, "admitted while open");
                            }
                            prop_assert!(status != BreakerStatus::Isolated, "admitted while isolated");
                            held.push(permit);
                        }
                        Err(rejected) => {
                            if let BreakerStatus::Open { until } = status {
                                prop_assert_eq!(b, before, "a rejection while open changes nothing");
                                prop_assert_eq!(rejected.retry_after, Some(until.saturating_duration_since(now)));
                            }
                        }
                    }
                }
                Op::Record { pick, outcome, took_ms } => {
                    let outcome = [CallOutcome::Success, CallOutcome::Failure, CallOutcome::Ignored][outcome as usize];
                    let foreign = pick % 11 == 0;
                    let permit = if foreign || held.is_empty() {
                        other.try_acquire(&p, now, &mut r).ok()
                    } else {
                        Some(held[pick % held.len()])
                    };
                    if let Some(permit) = permit {
                        let before = b;
                        let when = now.saturating_add(ms(took_ms));
                        match b.record(&p, when, permit, outcome, &mut r) {
                            Ok(()) => {
                                held.retain(|h| *h != permit);
                                now = now.later(when);
                            }
                            Err(_) => {
                                told = false;
                                prop_assert_eq!(b, before, "G12: a refused record changes nothing");
                            }
                        }
                    }
                }
                Op::Timeout => b.handle_timeout(&p, now, &mut r),
                Op::Advance(d) => {
                    told = false;
                    now = now.saturating_add(ms(d));
                }
                Op::Isolate => b.handle_isolate(now),
                Op::Disable => b.handle_disable(now),
                Op::Reset => b.handle_reset(&p, now),
                Op::Open | Op::HalfOpen => {
                    let before = b;
                    let done = if matches!(op, Op::Open) {
                        b.handle_open(&p, now, &mut r)
                    } else {
                        b.handle_half_open(&p, now, &mut r)
                    };
                    if done.is_err() {
                        told = false;
                        prop_assert_eq!(b, before, "G12: a refused transition changes nothing");
                    }
                }
                Op::MetricsOnly => b.handle_metrics_only(&p, now),
            }
            if let BreakerStatus::HalfOpen { permits } = b.status() {
                prop_assert!(permits <= p.half_open_permits(), "{} probes out", permits);
                let live = held.iter().filter(|h| h.is_probe() && b.generation() == h.generation()).count();
                prop_assert!(live as u32 <= p.half_open_permits());
                // Any accepted input at `now` has settled every lease due by `now`.
                if told && let Some(deadline) = b.poll_timeout() {
                    prop_assert!(deadline > now, "half-open past a lease deadline without a decision");
                }
            }
            // Liveness: following poll_timeout always leaves half-open with leases out: at the
            // first deadline under the first-failure rule, by the last one under the rates rule
            // (which then has either decided or frees every place for new probes).
            if matches!(b.status(), BreakerStatus::HalfOpen { permits } if permits > 0) {
                let mut probe = b;
                let mut deadlines = 0;
                while let BreakerStatus::HalfOpen { permits: 1.. } = probe.status() {
                    let deadline = probe.poll_timeout().expect("a held lease is timed");
                    probe.handle_timeout(&p, deadline, &mut r);
                    deadlines += 1;
                    prop_assert!(deadlines <= persevere::MAX_PERMITS, "half-open with leases past every deadline");
                }
                if p.half_open_rule() == HalfOpenRule::FirstFailure {
                    let reopened = matches!(probe.status(), BreakerStatus::Open { .. });
                    prop_assert!(reopened && deadlines == 1, "handle_timeout at the lease deadline must reopen");
                } else if let BreakerStatus::HalfOpen { .. } = probe.status() {
                    prop_assert!(probe.try_acquire(&p, probe.now(), &mut r).is_ok(), "rates: no place left and no lease");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The window counts exactly what a reference model of the last `n` calls, or of the calls
    /// in the last `buckets` buckets, counts; and the breaker trips exactly when the model's
    /// counts meet a trip rule.
    #[test]
    fn k2_the_window_matches_a_reference_model(
        timed in any::<bool>(),
        n in 1u32..40,
        buckets in 1u32..=16,
        min in 1u32..10,
        calls in prop::collection::vec((0u8..8, 0u64..700), 1..300),
    ) {
        let b = BreakerPolicy::builder(open_backoff())
            .consecutive_failures(6)
            .failure_rate(0.7)
            .slow_call_rate(0.6, ms(50));
        let b = if timed { b.time_window(Duration::from_millis(1_600), buckets) } else { b.count_window(n) };
        let p = b.minimum_calls(min.min(if timed { u32::MAX } else { n })).build().unwrap();
        let width = if timed { 1_600_000_000 / u64::from(buckets) } else { 1 };
        let mut breaker = Breaker::new(&p, 1);
        let mut r = rng();
        let mut now = 0u64;
        let mut log: Vec<(u64, bool, bool)> = Vec::new();
        let mut consecutive = 0u32;
        for (kind, advance_ms) in calls {
            now += advance_ms * 1_000_000 / 4;
            let (failed, slow) = (kind & 1 == 1, kind & 6 == 6);
            let permit = breaker.try_acquire(&p, Instant::from_nanos(now), &mut r).unwrap();
            let took = if slow { ms(60) } else { ms(1) };
            breaker
                .record_with_duration(&p, Instant::from_nanos(now), permit, if failed { CallOutcome::Failure } else { CallOutcome::Success }, took, &mut r)
                .unwrap();
            consecutive = if failed { consecutive + 1 } else { 0 };
            let epoch = now / width;
            log.push((epoch, failed, slow));
            let window: Vec<_> = if timed {
                log.iter().filter(|(e, _, _)| e + u64::from(buckets) > epoch).collect()
            } else {
                log.iter().rev().take(n as usize).collect()
            };
            let c = window.len() as u64;
            let f = window.iter().filter(|(_, f, _)| *f).count() as u64;
            let s = window.iter().filter(|(_, _, s)| *s).count() as u64;
            let trips = consecutive >= 6
                || (c >= u64::from(p.minimum_calls()) && (f * 10 >= 7 * c || s * 10 >= 6 * c));
            if trips {
                prop_assert!(matches!(breaker.status(), BreakerStatus::Open { .. }), "{c} calls, {f} failed, {s} slow");
                break;
            }
            let counts = breaker.window_counts().expect("closed");
            prop_assert_eq!(
                (u64::from(counts.calls), u64::from(counts.failures), u64::from(counts.slow), counts.consecutive_failures),
                (c, f, s, consecutive)
            );
        }
    }
}

#[test]
fn k2_consecutive_failures_are_visible_and_rate_rules_count_every_call() {
    let backoff = persevere::Backoff::constant(Duration::from_secs(1)).build().unwrap();
    let consecutive = persevere::BreakerPolicy::builder(backoff).consecutive_failures(3).build().unwrap();
    let rated = persevere::BreakerPolicy::builder(backoff).failure_rate(0.5).count_window(10).build().unwrap();
    assert!(!consecutive.counts_every_call());
    assert!(rated.counts_every_call());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut breaker = persevere::Breaker::new(&consecutive, 1);
    for expected in 1..=2 {
        let permit = breaker.try_acquire(&consecutive, persevere::Instant::ZERO, &mut rng).unwrap();
        breaker
            .record(&consecutive, persevere::Instant::ZERO, permit, persevere::CallOutcome::Failure, &mut rng)
            .unwrap();
        assert_eq!(breaker.consecutive_failures(), expected);
    }
    let permit = breaker.try_acquire(&consecutive, persevere::Instant::ZERO, &mut rng).unwrap();
    breaker.record(&consecutive, persevere::Instant::ZERO, permit, persevere::CallOutcome::Failure, &mut rng).unwrap();
    assert_eq!(breaker.consecutive_failures(), 0, "open: no streak is counted");
}
