//! Rules L1–L4 on the bulkhead and the adaptive limiter: at most N at once with an ordered,
//! bounded wait (L1); a limit moved only by reported completions, by each algorithm (L2);
//! bounds and the jittered minimum-RTT re-probe (L3); permits as leases (L4).

use core::time::Duration;

use persevere::{
    Bulkhead, BulkheadError, BulkheadPolicy, Completion, Full, Instant, LimitAlgorithm, Limiter, LimiterError,
    LimiterPolicy, MinRttProbe, PolicyError, Shed, SplitMix64,
};
use proptest::prelude::*;

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn queued(answer: Result<persevere::BulkheadPermit, Full>) -> persevere::Ticket {
    match answer {
        Err(Full::Queued(ticket)) => ticket,
        other => panic!("expected a ticket, got {other:?}"),
    }
}

#[test]
fn l1_a_bulkhead_admits_at_most_n_and_refuses_at_once_without_a_queue() {
    let policy = BulkheadPolicy::builder(3).retry_after(Duration::from_millis(20)).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let permits: Vec<_> = (0..3).map(|_| bulkhead.try_acquire(&policy, ms(0)).expect("a place")).collect();
    assert_eq!(bulkhead.in_flight(), 3);
    assert_eq!(
        bulkhead.try_acquire(&policy, ms(1)).unwrap_err(),
        Full::Shed(Shed { retry_after: Duration::from_millis(20) }),
        "the fourth is refused at once, and told how long to wait"
    );
    for permit in permits {
        bulkhead.release(permit).unwrap();
    }
    assert!(bulkhead.try_acquire(&policy, ms(2)).is_ok());
}

#[test]
fn l1_waiters_are_served_in_arrival_order_and_newcomers_queue_behind_them() {
    let policy = BulkheadPolicy::builder(1).max_wait(Duration::from_millis(100), 3).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let running = bulkhead.try_acquire(&policy, ms(0)).unwrap();
    let first = queued(bulkhead.try_acquire(&policy, ms(1)));
    let second = queued(bulkhead.try_acquire(&policy, ms(2)));
    assert!(first.number < second.number);
    assert_eq!(bulkhead.try_claim(&policy, ms(3), second), Ok(None), "not its turn, and no place");
    bulkhead.release(running).unwrap();
    let third = queued(bulkhead.try_acquire(&policy, ms(4)));
    assert_eq!(bulkhead.ready(&policy, ms(4)), Some(first), "a freed place goes to the oldest waiter");
    assert_eq!(bulkhead.try_claim(&policy, ms(4), second), Ok(None), "the second may not overtake the first");
    let permit = bulkhead.try_claim(&policy, ms(5), first).unwrap().expect("the first's turn");
    bulkhead.release(permit).unwrap();
    assert_eq!(bulkhead.ready(&policy, ms(6)), Some(second));
    bulkhead.cancel(second).unwrap();
    assert_eq!(bulkhead.ready(&policy, ms(6)), Some(third), "one who gave up is skipped");
}

#[test]
fn l1_a_wait_ends_at_its_deadline_and_a_full_queue_says_when_a_place_frees() {
    let policy = BulkheadPolicy::builder(1).max_wait(Duration::from_millis(50), 1).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let _running = bulkhead.try_acquire(&policy, ms(0)).unwrap();
    let ticket = queued(bulkhead.try_acquire(&policy, ms(10)));
    assert_eq!(ticket.deadline, ms(60));
    assert_eq!(
        bulkhead.try_acquire(&policy, ms(20)).unwrap_err(),
        Full::Shed(Shed { retry_after: Duration::from_millis(40) }),
        "the queue is full until the waiter's deadline"
    );
    assert_eq!(bulkhead.poll_timeout(), Some(ms(60)));
    let before = bulkhead.clone();
    assert_eq!(bulkhead.try_claim(&policy, ms(60), ticket), Err(BulkheadError::Expired { number: ticket.number }));
    assert_eq!(bulkhead, before, "a refused claim changes nothing");
    bulkhead.handle_timeout(ms(59));
    assert_eq!(bulkhead.waiting(), 1, "an early timeout changes nothing");
    bulkhead.handle_timeout(ms(60));
    assert_eq!((bulkhead.waiting(), bulkhead.poll_timeout()), (0, None));
    assert_eq!(bulkhead.cancel(ticket), Err(BulkheadError::NotWaiting { number: ticket.number }));
}

#[test]
fn l1_a_newcomer_takes_a_free_place_once_the_waits_before_it_ended() {
    let policy = BulkheadPolicy::builder(1).max_wait(Duration::from_millis(10), 2).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let running = bulkhead.try_acquire(&policy, ms(0)).unwrap();
    let _gone = queued(bulkhead.try_acquire(&policy, ms(0)));
    bulkhead.release(running).unwrap();
    assert!(bulkhead.try_acquire(&policy, ms(5)).is_err(), "the waiter's turn comes first");
    assert!(bulkhead.try_acquire(&policy, ms(20)).is_ok(), "its wait ended unswept: the place is free");
}

#[test]
fn l1_bulkhead_policies_are_validated() {
    assert!(matches!(BulkheadPolicy::builder(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(
        BulkheadPolicy::builder(1).max_wait(Duration::from_millis(1), 33).build(),
        Err(PolicyError::LimitTooLarge { .. })
    ));
    assert!(matches!(BulkheadPolicy::builder(1).max_wait(Duration::ZERO, 2).build(), Err(PolicyError::Zero { .. })));
    assert_eq!(BulkheadPolicy::resilience4j().max_concurrent(), 25);
}

/// Drives `limiter` with `n` completions of `rtt` each, every one started with `in_flight`
/// others (the limiter is filled to `in_flight` first and drained after).
fn complete(limiter: &mut Limiter, policy: &LimiterPolicy, at: &mut u64, n: usize, rtt_ms: u64, dropped: bool) {
    let mut rng = SplitMix64::new(1);
    for _ in 0..n {
        let fill = limiter.admission_limit();
        let permits: Vec<_> = (0..fill).map_while(|_| limiter.try_acquire(policy, ms(*at)).ok()).collect();
        *at += rtt_ms;
        let completion = if dropped { Completion::Dropped } else { Completion::Success };
        for permit in permits {
            limiter.release(policy, ms(*at), permit, completion, &mut rng).unwrap();
        }
    }
}

#[test]
fn l2_aimd_adds_one_under_load_and_backs_off_multiplicatively_on_a_drop_or_a_timeout() {
    let policy = LimiterPolicy::aimd();
    let mut limiter = Limiter::new(&policy, 0);
    let mut at = 0;
    complete(&mut limiter, &policy, &mut at, 1, 10, false);
    // 20 permits started with 1..=20 in flight: those started with at least half the limit in
    // flight (the 11 started with 10 to 20) add 1 each.
    assert_eq!(limiter.limit(), 31, "+1 for each completion that started under load");
    complete(&mut limiter, &policy, &mut at, 1, 10, true);
    assert!(limiter.limit() < 40 && limiter.limit() >= 20, "{}", limiter.limit());
    let policy = LimiterPolicy::builder(LimitAlgorithm::Aimd { backoff_ratio: 0.5, timeout: Duration::from_millis(5) })
        .limits(1, 64, 200)
        .build()
        .unwrap();
    let mut limiter = Limiter::new(&policy, 0);
    let mut rng = SplitMix64::new(1);
    let permit = limiter.try_acquire(&policy, ms(0)).unwrap();
    limiter.release(&policy, ms(6), permit, Completion::Success, &mut rng).unwrap();
    assert_eq!(limiter.limit(), 32, "a call slower than the timeout counts as a drop");
}

#[test]
fn l2_vegas_grows_without_queueing_and_shrinks_when_latency_shows_a_queue() {
    let policy = LimiterPolicy::vegas();
    let mut limiter = Limiter::new(&policy, 0);
    let mut at = 0;
    complete(&mut limiter, &policy, &mut at, 1, 10, false);
    assert_eq!(limiter.min_rtt(), Some(Duration::from_millis(10)));
    let grown = limiter.limit();
    assert!(grown > 20, "no queue: +6·log10 per completion, got {grown}");
    complete(&mut limiter, &policy, &mut at, 3, 40, false);
    assert!(limiter.limit() < grown, "RTT 4× the minimum: a queue; {} ≥ {grown}", limiter.limit());
}

#[test]
fn l2_gradient2_falls_when_short_rtt_exceeds_the_tolerated_long_rtt() {
    let policy = LimiterPolicy::gradient2().to_builder().limits(20, 100, 200).build().unwrap();
    let mut limiter = Limiter::new(&policy, 0);
    let mut at = 0;
    complete(&mut limiter, &policy, &mut at, 1, 10, false);
    let steady = limiter.estimate();
    assert!(steady > 100.0, "at the long RTT the gradient is 1 and the queue allowance grows it");
    complete(&mut limiter, &policy, &mut at, 1, 100, false);
    assert!(limiter.estimate() < steady, "10× the long RTT: gradient 0.5");
}

#[test]
fn l2_the_limit_moves_only_on_completions_never_on_time_alone() {
    let policy =
        LimiterPolicy::vegas().to_builder().min_rtt_probe(MinRttProbe::envoy(Duration::from_secs(1))).build().unwrap();
    let mut limiter = Limiter::new(&policy, 0);
    let before = limiter.clone();
    limiter.handle_timeout(&policy, Instant::from_secs(3600));
    assert_eq!(limiter, before, "no window is scheduled before a completion: nothing moves with time");
}

#[test]
fn l2_presets_reproduce_the_published_defaults() {
    let aimd = LimiterPolicy::aimd();
    assert_eq!((aimd.min_limit(), aimd.initial_limit(), aimd.max_limit()), (20, 20, 200));
    assert_eq!(aimd.algorithm(), LimitAlgorithm::Aimd { backoff_ratio: 0.9, timeout: Duration::from_secs(5) });
    let vegas = LimiterPolicy::vegas();
    assert_eq!((vegas.min_limit(), vegas.initial_limit(), vegas.max_limit()), (1, 20, 1000));
    assert_eq!(vegas.algorithm(), LimitAlgorithm::Vegas { smoothing: 1.0 });
    let gradient = LimiterPolicy::gradient2();
    assert_eq!((gradient.min_limit(), gradient.initial_limit(), gradient.max_limit()), (20, 20, 200));
    assert_eq!(
        gradient.algorithm(),
        LimitAlgorithm::Gradient2 { smoothing: 0.2, rtt_tolerance: 1.5, queue_size: 4, long_window: 600 }
    );
    let probe = MinRttProbe::envoy(Duration::from_secs(60));
    assert_eq!((probe.samples, probe.floor, probe.jitter), (50, 3, 0.15));
}

#[test]
fn l3_limiter_policies_are_validated() {
    let aimd = |ratio| LimitAlgorithm::Aimd { backoff_ratio: ratio, timeout: Duration::from_secs(1) };
    assert!(LimiterPolicy::builder(aimd(1.0)).build().is_err(), "a backoff of 1 never backs off");
    assert!(LimiterPolicy::builder(aimd(f64::NAN)).build().is_err());
    assert!(LimiterPolicy::builder(aimd(0.9)).limits(0, 1, 10).build().is_err(), "a limit of zero");
    assert!(LimiterPolicy::builder(aimd(0.9)).limits(5, 4, 10).build().is_err());
    assert!(LimiterPolicy::builder(LimitAlgorithm::Vegas { smoothing: 0.0 }).build().is_err());
    let probe = MinRttProbe { interval: Duration::from_secs(1), jitter: 2.0, samples: 1, floor: 1 };
    assert!(LimiterPolicy::builder(aimd(0.9)).min_rtt_probe(probe).build().is_err());
}

#[test]
fn l3_a_minimum_rtt_window_opens_on_a_jittered_schedule_drops_admission_to_the_floor_and_remeasures() {
    let probe = MinRttProbe { interval: Duration::from_secs(10), jitter: 0.5, samples: 4, floor: 2 };
    let policy = LimiterPolicy::vegas().to_builder().min_rtt_probe(probe).build().unwrap();
    let mut starts = Vec::new();
    for seed in 0..8 {
        let mut limiter = Limiter::new(&policy, 0);
        let mut rng = SplitMix64::new(seed);
        let permit = limiter.try_acquire(&policy, ms(0)).unwrap();
        limiter.release(&policy, ms(5), permit, Completion::Success, &mut rng).unwrap();
        let due = limiter.poll_timeout().expect("the first completion schedules a window");
        assert!(due >= ms(10_005) && due <= ms(15_005), "{due:?}");
        starts.push(due);
        limiter.handle_timeout(&policy, due);
        assert!(limiter.probing());
        assert_eq!(limiter.admission_limit(), 2, "the floor");
        assert_eq!(limiter.limit(), 20, "the limit itself is kept");
        let a = limiter.try_acquire(&policy, due).unwrap();
        let b = limiter.try_acquire(&policy, due).unwrap();
        assert!(limiter.try_acquire(&policy, due).is_err(), "no more than the floor during the window");
        let later = due.saturating_add(Duration::from_millis(8));
        limiter.release(&policy, later, a, Completion::Success, &mut rng).unwrap();
        limiter.release(&policy, later, b, Completion::Success, &mut rng).unwrap();
        for _ in 0..2 {
            let p = limiter.try_acquire(&policy, later).unwrap();
            limiter
                .release(&policy, later.saturating_add(Duration::from_millis(7)), p, Completion::Success, &mut rng)
                .unwrap();
        }
        assert!(!limiter.probing());
        assert_eq!(limiter.min_rtt(), Some(Duration::from_millis(7)), "re-measured, even upwards");
        assert_eq!(limiter.admission_limit(), limiter.limit());
    }
    starts.sort();
    starts.dedup();
    assert!(starts.len() > 1, "the schedule is jittered");
}

#[test]
fn l4_a_permit_is_a_lease_released_once_dropped_calls_included() {
    let policy = LimiterPolicy::aimd();
    let mut limiter = Limiter::new(&policy, 7);
    let mut other = Limiter::new(&policy, 8);
    let mut rng = SplitMix64::new(3);
    let permit = limiter.try_acquire(&policy, ms(0)).unwrap();
    assert_eq!(permit.in_flight(), 1);
    let foreign = other.try_acquire(&policy, ms(0)).unwrap();
    let before = limiter.clone();
    assert_eq!(
        limiter.release(&policy, ms(1), foreign, Completion::Success, &mut rng),
        Err(LimiterError::Foreign { this: 7, got: 8 })
    );
    assert_eq!(limiter, before, "a refused release changes nothing");
    limiter.release(&policy, ms(1), permit, Completion::Dropped, &mut rng).unwrap();
    assert_eq!(limiter.in_flight(), 0, "a dropped call returned its place");
    let stray = other.try_acquire(&policy, ms(0)).unwrap();
    let mut twin = Limiter::new(&policy, 8);
    assert_eq!(twin.release(&policy, ms(1), stray, Completion::Ignored, &mut rng), Err(LimiterError::NotOutstanding));
    assert_eq!(twin.in_flight(), 0, "in-flight never goes below zero");
}

proptest! {
    /// L3 and L4 under any sequence: the limit within [min, max] and finite, in-flight never
    /// above the admission limit when a permit is issued, never below zero, and back to zero
    /// once every permit is released.
    #[test]
    fn l3_l4_bounds_and_leases_hold_for_any_completions(
        algorithm in 0..3u8,
        ops in proptest::collection::vec((any::<bool>(), 0..200u64, 0..3u8), 1..300),
    ) {
        let policy = match algorithm {
            0 => LimiterPolicy::aimd(),
            1 => LimiterPolicy::vegas(),
            _ => LimiterPolicy::gradient2(),
        };
        let policy = policy.to_builder().min_rtt_probe(MinRttProbe::envoy(Duration::from_millis(500))).build().unwrap();
        let mut limiter = Limiter::new(&policy, 0);
        let mut rng = SplitMix64::new(9);
        let mut held = Vec::new();
        let mut now = 0;
        for (acquire, step, kind) in ops {
            now += step;
            limiter.handle_timeout(&policy, ms(now));
            if acquire {
                let before = limiter.in_flight();
                if let Ok(permit) = limiter.try_acquire(&policy, ms(now)) {
                    prop_assert!(before < limiter.admission_limit());
                    held.push(permit);
                }
            } else if let Some(permit) = held.pop() {
                let completion = [Completion::Success, Completion::Dropped, Completion::Ignored][kind as usize];
                limiter.release(&policy, ms(now), permit, completion, &mut rng).unwrap();
            }
            let limit = limiter.estimate();
            prop_assert!(limit.is_finite() && limit >= f64::from(policy.min_limit()) && limit <= f64::from(policy.max_limit()));
            prop_assert!(limiter.admission_limit() >= 1);
            prop_assert_eq!(limiter.in_flight() as usize, held.len());
        }
        for permit in held.drain(..) {
            limiter.release(&policy, ms(now), permit, Completion::Success, &mut rng).unwrap();
        }
        prop_assert_eq!(limiter.in_flight(), 0);
    }
}

/// Plain data: states round-trip, and a state no sequence of inputs could make is refused when
/// it loads (L3: a limit of zero or NaN; L1: a ring whose head is not waiting).
#[cfg(feature = "serde")]
#[test]
fn l1_l3_states_round_trip_and_impossible_ones_are_refused_on_load() {
    let policy = LimiterPolicy::gradient2();
    let mut limiter = Limiter::new(&policy, 3);
    let permit = limiter.try_acquire(&policy, ms(0)).unwrap();
    let json = serde_json::to_string(&limiter).unwrap();
    assert_eq!(serde_json::from_str::<Limiter>(&json).unwrap(), limiter);
    for bad in ["0.0", "NaN", "1e300"] {
        let edited = json.replace("\"estimate\":20.0", &format!("\"estimate\":{bad}"));
        assert!(serde_json::from_str::<Limiter>(&edited).is_err(), "estimate {bad} loaded");
    }
    limiter.release(&policy, ms(1), permit, Completion::Ignored, &mut SplitMix64::new(1)).unwrap();
    let policy_json = serde_json::to_string(&policy).unwrap();
    assert_eq!(serde_json::from_str::<LimiterPolicy>(&policy_json).unwrap(), policy);
    let bad_policy = policy_json.replace("\"min_limit\":20", "\"min_limit\":0");
    assert!(serde_json::from_str::<LimiterPolicy>(&bad_policy).is_err(), "policies are validated on load");

    let bulkhead_policy = BulkheadPolicy::builder(1).max_wait(Duration::from_millis(5), 2).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let _running = bulkhead.try_acquire(&bulkhead_policy, ms(0)).unwrap();
    let _ticket = queued(bulkhead.try_acquire(&bulkhead_policy, ms(0)));
    let json = serde_json::to_string(&bulkhead).unwrap();
    assert_eq!(serde_json::from_str::<Bulkhead>(&json).unwrap(), bulkhead);
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["ring"][0] = serde_json::json!(0);
    assert!(serde_json::from_str::<Bulkhead>(&value.to_string()).is_err(), "a head that is not waiting");
}
