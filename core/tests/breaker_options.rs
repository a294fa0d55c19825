//! The breaker's options beyond its defaults: half-open decided by the probes' rates
//! (resilience4j's rule, K4), the metrics-only state and the transitions by hand (K1), each with
//! the refusals that leave the state exactly as it was (G12).

use core::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerError, BreakerPolicy, BreakerPolicyBuilder, BreakerState, BreakerStatus, CallOutcome,
    HalfOpenRule, Instant, Permit, PolicyError, Rejected, SplitMix64, WindowCounts,
};
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn rng() -> SplitMix64 {
    SplitMix64::new(5)
}

/// Open for 1 s, then 2 s, 4 s, … up to 8 s; no jitter.
fn open_backoff() -> Backoff {
    Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(8)).build().unwrap()
}

fn policy(configure: impl FnOnce(BreakerPolicyBuilder) -> BreakerPolicyBuilder) -> BreakerPolicy {
    configure(BreakerPolicy::builder(open_backoff())).build().unwrap()
}

/// resilience4j's shape: opens at 50 % of the last 4 calls, then judges 10 probes by rates.
fn by_rates() -> BreakerPolicy {
    policy(|b| b.failure_rate(0.5).count_window(4).half_open_permits(10).half_open_by_rates())
}

/// A breaker under `p` opened at 0 ms by four failures, open until 1 000 ms.
fn opened(p: &BreakerPolicy) -> Breaker {
    let mut b = Breaker::new(p, 1);
    for _ in 0..4 {
        let permit = b.try_acquire(p, at(0), &mut rng()).unwrap();
        b.record(p, at(0), permit, CallOutcome::Failure, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_000) });
    b
}

/// The ten probes of a half-open breaker, admitted at 1 000 ms.
fn probes(b: &mut Breaker, p: &BreakerPolicy) -> Vec<Permit> {
    (0..10).map(|_| b.try_acquire(p, at(1_000), &mut rng()).unwrap()).collect()
}

#[test]
fn k4_by_rates_the_breaker_waits_for_every_probe_then_reopens_at_the_failure_rate() {
    let p = by_rates();
    // resilience4j's case: 5 of 10 probes fail, 50 % reaches the threshold: open again.
    let mut b = opened(&p);
    let permits = probes(&mut b, &p);
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 10 });
    for (i, permit) in permits.iter().enumerate() {
        // The failures come first: under the default rule the first would reopen it.
        let outcome = if i < 5 { CallOutcome::Failure } else { CallOutcome::Success };
        b.record(&p, at(1_100), *permit, outcome, &mut rng()).unwrap();
        if i < 9 {
            assert_eq!(
                b.status(),
                BreakerStatus::HalfOpen { permits: 9 - i as u32 },
                "undecided after {} answers",
                i + 1
            );
        }
    }
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_100) }, "reopened for the second open duration");

    // 4 of 10 fail, 40 % is under the threshold: closed, with an empty window.
    let mut b = opened(&p);
    for (i, permit) in probes(&mut b, &p).into_iter().enumerate() {
        let outcome = if i < 4 { CallOutcome::Failure } else { CallOutcome::Success };
        b.record(&p, at(1_100), permit, outcome, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::Closed);
    assert_eq!(b.window_counts(), Some(WindowCounts::default()));
    assert_eq!(b.openings(), 0, "closing starts the open durations over");
}

#[test]
fn k4_by_rates_probes_are_admitted_ten_in_all_and_an_ignored_one_gives_its_place_back() {
    let p = by_rates();
    let mut b = opened(&p);
    let permits = probes(&mut b, &p);
    // Answered probes keep their places: the eleventh waits for the earliest lease (10 s).
    b.record(&p, at(1_200), permits[0], CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 9 });
    assert_eq!(b.try_acquire(&p, at(1_200), &mut rng()), Err(Rejected { retry_after: Some(ms(9_800)) }));
    // An ignored probe says nothing about the dependency, and another may take its place.
    b.record(&p, at(1_300), permits[1], CallOutcome::Ignored, &mut rng()).unwrap();
    let replacement = b.try_acquire(&p, at(1_300), &mut rng()).unwrap();
    assert!(replacement.is_probe());
    // Full again; the decision comes at the latest when the last lease (the replacement's) ends.
    assert_eq!(b.try_acquire(&p, at(1_300), &mut rng()), Err(Rejected { retry_after: Some(ms(10_000)) }));
    for permit in permits[2..].iter().chain([&replacement]) {
        b.record(&p, at(1_400), *permit, CallOutcome::Success, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::Closed, "ten successes, the ignored one not among them");
}

#[test]
fn k4_by_rates_an_expired_lease_answers_as_a_failure_at_its_deadline() {
    let p = policy(|b| {
        b.failure_rate(0.5).count_window(4).half_open_permits(2).half_open_by_rates().probe_timeout(ms(500))
    });
    let mut b = opened(&p);
    let first = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let _lost = b.try_acquire(&p, at(1_200), &mut rng()).unwrap();
    b.record(&p, at(1_100), first, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.poll_timeout(), Some(at(1_700)), "the lost probe's lease");
    b.handle_timeout(&p, at(1_699), &mut rng());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    // One success, one expired: 50 % failed, which reaches the rate; reopened at the deadline
    // for the second open duration, also when the breaker is told late.
    let mut told_late = b;
    b.handle_timeout(&p, at(1_700), &mut rng());
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_700) });
    told_late.handle_timeout(&p, at(3_000), &mut rng());
    assert_eq!(told_late.status(), BreakerStatus::Open { until: at(3_700) });

    // A lease that expires before the others answered is one answer, not the decision.
    let mut b = opened(&p);
    let _lost = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let late = b.try_acquire(&p, at(1_400), &mut rng()).unwrap();
    b.handle_timeout(&p, at(1_500), &mut rng());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 }, "one answer of two");
    b.record(&p, at(1_600), late, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_600) }, "1 failed of 2 is 50 %");
}

/// Found in review: a result recorded at or after its own lease deadline was counted twice
/// under the rates rule (once as the expiry's failure, once as itself), deciding with a probe
/// still out.
#[test]
fn k4_by_rates_a_result_that_comes_after_its_lease_ended_is_not_counted_again() {
    let p = policy(|b| {
        b.failure_rate(0.5).count_window(4).half_open_permits(2).half_open_by_rates().probe_timeout(ms(500))
    });
    let mut b = opened(&p);
    let late = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let other = b.try_acquire(&p, at(1_200), &mut rng()).unwrap();
    // At 1 500 ms the first lease has ended: one answer, a failure; its result no longer counts.
    b.record(&p, at(1_500), late, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 }, "one answer of two, the other probe still out");
    // No place is free until the breaker decides: at the latest when the last lease ends.
    assert_eq!(b.try_acquire(&p, at(1_500), &mut rng()), Err(Rejected { retry_after: Some(ms(200)) }));
    b.record(&p, at(1_600), other, CallOutcome::Success, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_600) }, "1 failed of 2 reaches 50 %");
}

#[test]
fn k4_by_rates_slow_probes_count_toward_the_slow_call_rate_whatever_their_outcome() {
    let p = policy(|b| {
        b.slow_call_rate(0.5, ms(100)).count_window(4).half_open_permits(4).half_open_by_rates().probe_timeout(ms(900))
    });
    let slow_call = |b: &mut Breaker, outcome| {
        let permit = b.try_acquire(&p, at(0), &mut rng()).unwrap();
        b.record(&p, at(200), permit, outcome, &mut rng()).unwrap();
    };
    let mut b = Breaker::new(&p, 1);
    for _ in 0..4 {
        slow_call(&mut b, CallOutcome::Success);
    }
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_200) });
    let permits: Vec<Permit> = (0..4).map(|_| b.try_acquire(&p, at(1_200), &mut rng()).unwrap()).collect();
    // Two fast successes, one slow success, one slow failure: 2 of 4 slow.
    b.record(&p, at(1_210), permits[0], CallOutcome::Success, &mut rng()).unwrap();
    b.record(&p, at(1_250), permits[1], CallOutcome::Success, &mut rng()).unwrap();
    b.record(&p, at(1_400), permits[2], CallOutcome::Success, &mut rng()).unwrap();
    assert!(matches!(b.status(), BreakerStatus::HalfOpen { .. }));
    b.record(&p, at(1_400), permits[3], CallOutcome::Failure, &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: at(3_400) }, "2 of 4 slow reach 50 %; no failure rate is set");

    // 1 of 4 slow: closed.
    let mut b = Breaker::new(&p, 1);
    for _ in 0..4 {
        slow_call(&mut b, CallOutcome::Success);
    }
    let permits: Vec<Permit> = (0..4).map(|_| b.try_acquire(&p, at(1_200), &mut rng()).unwrap()).collect();
    for (i, permit) in permits.into_iter().enumerate() {
        let outcome = if i == 0 { CallOutcome::Failure } else { CallOutcome::Success };
        b.record(&p, at(if i == 0 { 1_300 } else { 1_210 }), permit, outcome, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::Closed);
}

#[test]
fn k4_half_open_by_rates_needs_a_rate_rule_and_no_successes_to_close() {
    let base = || BreakerPolicy::builder(open_backoff()).half_open_by_rates();
    assert!(matches!(base().consecutive_failures(3).build(), Err(PolicyError::Conflict { .. })));
    assert!(matches!(
        base().failure_rate(0.5).successes_to_close(2).build(),
        Err(PolicyError::Conflict { setting: "successes_to_close", .. })
    ));
    let p = base().failure_rate(0.5).build().unwrap();
    assert_eq!(p.half_open_rule(), HalfOpenRule::Rates);
    assert_eq!(BreakerPolicy::try_from(BreakerPolicyBuilder::from(p)), Ok(p), "the builder round-trips");
    assert_eq!(BreakerPolicy::builder(open_backoff()).half_open, HalfOpenRule::FirstFailure, "the default");
}

#[test]
fn k1_metrics_only_admits_and_counts_every_call_and_never_trips_until_reset() {
    let p = policy(|b| b.consecutive_failures(2).failure_rate(0.5).count_window(10));
    let mut b = Breaker::new(&p, 1);
    b.handle_metrics_only(&p, at(0));
    assert_eq!(b.status(), BreakerStatus::MetricsOnly);
    let mut out = Vec::new();
    for i in 0..12 {
        out.push(b.try_acquire(&p, at(i), &mut rng()).unwrap());
    }
    assert_eq!(b.outstanding_permits(), 12);
    for (i, permit) in out.into_iter().enumerate() {
        let outcome = if i == 0 { CallOutcome::Ignored } else { CallOutcome::Failure };
        b.record(&p, at(20), permit, outcome, &mut rng()).unwrap();
    }
    assert_eq!(b.status(), BreakerStatus::MetricsOnly, "eleven failures trip nothing");
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(
        b.window_counts(),
        Some(WindowCounts { calls: 10, failures: 10, slow: 0, consecutive_failures: 11 }),
        "counted in the window, the ignored call not"
    );
    assert_eq!(b.consecutive_failures(), 11);
    b.handle_reset(&p, at(30));
    assert_eq!(b.status(), BreakerStatus::Closed);
    assert_eq!(b.window_counts(), Some(WindowCounts::default()), "closing by hand starts counting afresh");
}

/// Every state, reached from a fresh breaker under `p`.
fn in_each_state(p: &BreakerPolicy) -> Vec<Breaker> {
    let fresh = Breaker::new(p, 1);
    let mut open = fresh;
    open.handle_open(p, at(0), &mut rng()).unwrap();
    let mut half_open = open;
    half_open.handle_half_open(p, at(10), &mut rng()).unwrap();
    let mut isolated = fresh;
    isolated.handle_isolate(at(0));
    let mut disabled = fresh;
    disabled.handle_disable(at(0));
    let mut metrics_only = fresh;
    metrics_only.handle_metrics_only(p, at(0));
    vec![fresh, open, half_open, isolated, disabled, metrics_only]
}

#[test]
fn k1_transitions_by_hand_are_made_where_they_make_sense_and_refused_with_a_reason_elsewhere() {
    let p = policy(|b| b.consecutive_failures(3));
    use BreakerState::*;
    let states = in_each_state(&p);
    let kinds: Vec<BreakerState> = states.iter().map(|b| b.status().state()).collect();
    assert_eq!(kinds, [Closed, Open, HalfOpen, Isolated, Disabled, MetricsOnly]);
    for b in states {
        let from = b.status().state();

        let mut opened = b;
        match opened.handle_open(&p, at(100), &mut rng()) {
            Ok(()) => {
                assert!(!matches!(from, Open | MetricsOnly), "opened from {from:?}");
                assert!(matches!(opened.status(), BreakerStatus::Open { until } if until > at(100)));
                assert_eq!(opened.openings(), b.openings() + 1, "an opening by hand counts as one (K3)");
                assert!(opened.generation() != b.generation(), "its permits are stale");
            }
            Err(BreakerError::IllegalTransition { from: f, to: Open, why }) => {
                assert!(matches!(from, Open | MetricsOnly), "refused from {from:?}");
                assert_eq!(f, from);
                assert!(!why.is_empty());
                assert_eq!(opened, b, "a refused transition changes nothing");
            }
            Err(other) => panic!("{other}"),
        }

        let mut probing = b;
        match probing.handle_half_open(&p, at(100), &mut rng()) {
            Ok(()) => {
                assert!(matches!(from, Open | Isolated), "half-open from {from:?}");
                assert_eq!(probing.status(), BreakerStatus::HalfOpen { permits: 0 });
                let probe = probing.try_acquire(&p, at(100), &mut rng()).unwrap();
                assert!(probe.is_probe());
                probing.record(&p, at(110), probe, CallOutcome::Success, &mut rng()).unwrap();
                assert_eq!(probing.status(), BreakerStatus::Closed);
            }
            Err(e @ BreakerError::IllegalTransition { to: HalfOpen, .. }) => {
                assert!(matches!(from, Closed | HalfOpen | Disabled | MetricsOnly), "refused from {from:?}");
                assert!(e.to_string().contains("cannot be moved to HalfOpen by hand"), "{e}");
                assert_eq!(probing, b);
            }
            Err(other) => panic!("{other}"),
        }

        // Closing by hand is allowed from everywhere.
        let mut closed = b;
        closed.handle_reset(&p, at(100));
        assert_eq!(closed.status(), BreakerStatus::Closed);
    }
}

#[test]
fn k3_an_open_by_hand_turns_half_open_on_its_own_after_the_open_duration() {
    let p = policy(|b| b.consecutive_failures(3));
    let mut b = Breaker::new(&p, 1);
    b.handle_open(&p, at(500), &mut rng()).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: at(1_500) });
    assert_eq!(b.try_acquire(&p, at(1_000), &mut rng()), Err(Rejected { retry_after: Some(ms(500)) }));
    assert!(b.try_acquire(&p, at(1_500), &mut rng()).unwrap().is_probe());
}

#[cfg(feature = "serde")]
#[test]
fn k4_states_and_policies_saved_before_the_rates_rule_still_load() {
    let p = policy(|b| b.consecutive_failures(1).half_open_permits(2));
    let mut b = Breaker::new(&p, 1);
    b.handle_open(&p, at(0), &mut rng()).unwrap();
    let _probe = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    // Written as the earlier version wrote them: without the new fields.
    let mut state: serde_json::Value = serde_json::to_value(b).unwrap();
    let probes = state.pointer_mut("/phase/HalfOpen").and_then(|v| v.as_object_mut()).expect("half-open probes");
    for field in ["answered", "failed", "slow"] {
        probes.remove(field).expect("a field of the new version");
    }
    assert_eq!(serde_json::from_value::<Breaker>(state).unwrap(), b);
    let mut builder: serde_json::Value = serde_json::to_value(p).unwrap();
    builder.as_object_mut().unwrap().remove("half_open").unwrap();
    assert_eq!(serde_json::from_value::<BreakerPolicy>(builder).unwrap(), p);

    // A loaded state that counts more failed probes than answers is refused.
    let p = by_rates();
    let mut b = opened(&p);
    let permit = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_000), permit, CallOutcome::Failure, &mut rng()).unwrap();
    let mut state: serde_json::Value = serde_json::to_value(b).unwrap();
    *state.pointer_mut("/phase/HalfOpen/failed").unwrap() = 2.into();
    assert!(serde_json::from_value::<Breaker>(state).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Half-open by rates against a reference written from the rule: with `n` probes, the
    /// breaker decides exactly when the n-th answer (a result or an expiry) arrives, reopening
    /// iff failures ≥ rate × n or slow ≥ rate × n; before that it stays half-open, and it never
    /// has more than n probes admitted and not given back.
    #[test]
    fn k4_half_open_by_rates_matches_a_reference_model(
        n in 1u32..=16,
        failure_pct in 1u32..=100,
        slow_pct in 1u32..=100,
        answers in prop::collection::vec((0u8..4, 0u64..400), 1..40),
    ) {
        let p = policy(|b| {
            b.failure_rate(f64::from(failure_pct) / 100.0)
                .slow_call_rate(f64::from(slow_pct) / 100.0, ms(100))
                .count_window(1)
                .half_open_permits(n)
                .half_open_by_rates()
                .probe_timeout(ms(300))
        });
        let mut b = Breaker::new(&p, 1);
        b.handle_open(&p, at(0), &mut rng()).unwrap();
        // Results are recorded at `now` with their durations given, so only an expiry moves
        // the clock, and it moves past every lease taken so far.
        let mut now = 1_000;
        let (mut answered, mut failed, mut slow) = (0u64, 0u64, 0u64);
        let mut out: Vec<Permit> = Vec::new();
        for (kind, took) in answers {
            // Fill the free places, then answer the oldest probe.
            while let Ok(permit) = b.try_acquire(&p, at(now), &mut rng()) {
                out.push(permit);
            }
            prop_assert!(out.len() as u64 + answered <= u64::from(n), "more than n probes in play");
            let Some(permit) = (!out.is_empty()).then(|| out.remove(0)) else { break };
            let (outcome, expire) = match kind {
                0 => (CallOutcome::Success, false),
                1 => (CallOutcome::Failure, false),
                2 => (CallOutcome::Ignored, false),
                _ => (CallOutcome::Success, true),
            };
            if expire {
                // Every lease was taken at or before `now`, so all expire: each one answers.
                now += 300;
                b.handle_timeout(&p, at(now), &mut rng());
                let expired = out.len() as u64 + 1;
                out.clear();
                for _ in 0..expired {
                    if answered < u64::from(n) {
                        answered += 1;
                        failed += 1;
                    }
                }
            } else {
                b.record_with_duration(&p, at(now), permit, outcome, ms(took), &mut rng()).unwrap();
                if outcome != CallOutcome::Ignored {
                    answered += 1;
                    failed += u64::from(outcome == CallOutcome::Failure);
                    slow += u64::from(took >= 100);
                }
            }
            if answered < u64::from(n) {
                prop_assert!(matches!(b.status(), BreakerStatus::HalfOpen { .. }), "decided after {answered} of {n}");
                continue;
            }
            let reopen = failed * 100 >= u64::from(failure_pct) * answered || slow * 100 >= u64::from(slow_pct) * answered;
            prop_assert_eq!(
                matches!(b.status(), BreakerStatus::Open { .. }),
                reopen,
                "{} failed, {} slow of {}: {:?}", failed, slow, answered, b.status()
            );
            prop_assert_eq!(b.status() == BreakerStatus::Closed, !reopen);
            break;
        }
    }
}
