//! Rules F1–F10 on the flow machine and the `Flows` registry, the scheduler seed scenario, and
//! G12 (a refused input changes nothing).

use core::time::Duration;

#[cfg(feature = "alloc")]
use persevere::Flows;
use persevere::{
    Backoff, Flow, FlowAction, FlowError, FlowInfo, FlowPolicy, FlowStatus, FlowStatusKind, Instant, Jitter,
    PolicyError, SkipReason,
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
    ChaCha8Rng::seed_from_u64(9)
}

/// Constant 100 ms backoff, so that windows are exact.
fn flat(trip: Option<u32>) -> FlowPolicy {
    let mut b = FlowPolicy::builder().backoff(Backoff::constant(ms(100)).build().unwrap());
    b.trip_after = trip;
    b.build().unwrap()
}

/// A flow that has just been dispatched at `now`.
fn running(now: Instant) -> Flow<u32> {
    let mut flow = Flow::every(now, ms(200));
    flow.handle_timeout(now);
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
    flow
}

#[test]
fn f1_status_moves_through_idle_running_completed_backoff_tripped() {
    let p = flat(Some(2));
    let mut r = rng();
    let mut flow = Flow::<u32>::cron(at(0));
    assert_eq!(flow.status(), FlowStatus::Idle);
    flow.trigger(at(0)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Running);
    flow.handle_success(at(1)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Completed);
    flow.trigger(at(2)).unwrap();
    flow.handle_failure(&p, at(3), 7, &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(103), streak: 1, last_error: &7 });
    flow.trigger(at(4)).unwrap();
    flow.handle_failure(&p, at(5), 8, &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 2, last_error: &8 });
    assert_eq!(flow.status().kind(), FlowStatusKind::Tripped);
    assert_eq!(flow.status().cloned(), FlowStatus::Tripped { streak: 2, last_error: 8 });
}

#[test]
fn f2_the_default_policy_is_1s_x2_cap_5min_proportional_0_1_and_never_trips() {
    let expected = Backoff::exponential(Duration::from_secs(1), 2.0)
        .max_delay(Duration::from_secs(300))
        .jitter(Jitter::Proportional(0.1))
        .build()
        .unwrap();
    let p = FlowPolicy::default();
    assert_eq!(p.backoff(), &expected);
    assert_eq!(p.trip_after(), None);
    assert_eq!(FlowPolicy::builder().build().unwrap(), p);
    let mut r = rng();
    let mut flow = running(at(0));
    for n in 1..=200u32 {
        flow.handle_failure(&p, at(0), 0, &mut r).unwrap();
        let until = flow.next_eligible().unwrap();
        let delay = until.saturating_duration_since(at(0));
        let envelope = expected.envelope(n);
        let high = envelope.mul_f64(1.1).min(Duration::from_secs(300));
        assert!(delay >= envelope.mul_f64(0.9) - Duration::from_nanos(1) && delay <= high, "{n}: {delay:?}");
        flow.trigger(at(0)).unwrap();
    }
    assert_eq!(flow.streak(), 200, "no trip limit");
}

#[test]
fn f2_with_trip_zero_is_a_configuration_error() {
    assert!(matches!(FlowPolicy::builder().with_trip(0).build(), Err(PolicyError::Zero { setting: "trip limit", .. })));
    assert_eq!(FlowPolicy::builder().with_trip(1).build().unwrap().trip_after(), Some(1));
}

#[test]
fn f3_a_success_completes_with_streak_zero_and_no_window() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), 1, &mut r).unwrap();
    flow.trigger(at(2)).unwrap();
    flow.handle_success(at(3)).unwrap();
    assert_eq!(
        flow.info(),
        FlowInfo { failure_streak: 0, next_eligible: None, run_count: 2, status: FlowStatus::Completed }
    );
}

#[test]
fn f3_a_failure_backs_off_until_now_plus_delay() {
    let p = flat(Some(3));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(40), 1, &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(140), streak: 1, last_error: &1 });
    assert_eq!(flow.next_eligible(), Some(at(140)));
}

#[test]
fn f3_a_failure_at_the_limit_trips_without_computing_a_delay() {
    let p = FlowPolicy::builder().with_trip(2).build().unwrap(); // jittered backoff draws randomness
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), 1, &mut r).unwrap();
    flow.trigger(at(2)).unwrap();
    let rng_before = r.clone();
    flow.handle_failure(&p, at(3), 2, &mut r).unwrap();
    assert_eq!(r, rng_before, "no delay was drawn");
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 2, last_error: &2 });
    assert_eq!(flow.next_eligible(), None);
}

#[test]
fn f3_a_result_for_a_flow_that_is_not_running_is_refused() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = Flow::<u32>::every(at(0), ms(10));
    let before = flow;
    assert_eq!(flow.handle_success(at(1)), Err(FlowError::NotRunning(FlowStatusKind::Idle)));
    let refused = flow.handle_failure(&p, at(1), 5, &mut r).unwrap_err();
    assert_eq!((refused.error, refused.last_error), (FlowError::NotRunning(FlowStatusKind::Idle), 5));
    assert_eq!(flow.handle_cancel(at(1)), Err(FlowError::NotRunning(FlowStatusKind::Idle)));
    assert_eq!(flow, before);
}

#[test]
fn f4_a_clean_cancel_returns_to_idle_with_the_streak_unchanged() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), 1, &mut r).unwrap();
    flow.trigger(at(2)).unwrap();
    flow.handle_failure(&p, at(3), 2, &mut r).unwrap();
    flow.trigger(at(4)).unwrap();
    flow.handle_cancel(at(5)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Idle);
    assert_eq!(flow.streak(), 2);
    assert_eq!(flow.next_eligible(), Some(at(103)), "the window is unchanged too");
}

#[test]
fn f5_every_dispatches_at_start_then_at_max_of_run_end_plus_interval_and_next_eligible() {
    let p = FlowPolicy::builder().backoff(Backoff::constant(ms(500)).build().unwrap()).build().unwrap();
    let mut r = rng();
    let mut flow = Flow::<u32>::every(at(1_000), ms(200));
    assert_eq!(flow.poll_timeout(), Some(at(1_000)), "dispatch at start");
    flow.handle_timeout(at(1_000));
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
    assert_eq!(flow.poll_timeout(), None, "not while running");
    flow.handle_success(at(1_050)).unwrap();
    assert_eq!(flow.poll_timeout(), Some(at(1_250)), "run end + interval");
    flow.handle_timeout(at(1_249));
    assert_eq!(flow.poll_action(), None, "early");
    flow.handle_timeout(at(1_250));
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
    flow.handle_failure(&p, at(1_300), 0, &mut r).unwrap();
    assert_eq!(flow.poll_timeout(), Some(at(1_800)), "the window (1800) is later than end + interval (1500)");
    let p = flat(None);
    flow.handle_timeout(at(1_800));
    flow.poll_action();
    flow.handle_failure(&p, at(1_900), 0, &mut r).unwrap();
    assert_eq!(flow.poll_timeout(), Some(at(2_100)), "end + interval (2100) is later than the window (2000)");
}

#[test]
fn f6_cron_ticks_inside_the_backoff_window_are_skipped_and_never_replayed() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = Flow::<u32>::cron(at(0));
    assert_eq!(flow.poll_timeout(), None, "cron flows are timed by their ticks");
    flow.handle_tick(at(0), at(0)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
    flow.handle_tick(at(30), at(30)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::TickSkipped { tick: at(30), reason: SkipReason::Running }));
    flow.handle_failure(&p, at(50), 1, &mut r).unwrap(); // window until 150
    for t in [60, 100, 149] {
        flow.handle_tick(at(t), at(t)).unwrap();
        assert_eq!(
            flow.poll_action(),
            Some(FlowAction::TickSkipped { tick: at(t), reason: SkipReason::InBackoff { until: at(150) } })
        );
    }
    flow.handle_timeout(at(10_000));
    assert_eq!(flow.poll_action(), None, "skipped ticks are not replayed when the window ends");
    flow.handle_tick(at(150), at(150)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
    assert_eq!(Flow::<u32>::every(at(0), ms(1)).handle_tick(at(0), at(0)), Err(FlowError::NotCron));
}

#[test]
fn f7_trigger_bypasses_the_backoff_window() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(10), 1, &mut r).unwrap();
    flow.trigger(at(11)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
    assert_eq!(flow.status(), FlowStatus::Running);
}

#[test]
fn f7_trigger_is_rejected_while_tripped_and_while_running() {
    let p = flat(Some(1));
    let mut r = rng();
    let mut flow = running(at(0));
    let before = flow;
    assert_eq!(flow.trigger(at(1)), Err(FlowError::Running));
    assert_eq!(flow, before);
    flow.handle_failure(&p, at(2), 1, &mut r).unwrap();
    let before = flow;
    assert_eq!(flow.trigger(at(3)), Err(FlowError::Tripped { streak: 1 }));
    assert_eq!(flow, before);
}

#[cfg(feature = "alloc")]
#[test]
fn f7_trigger_and_every_other_input_on_an_unknown_id_is_rejected() {
    let p = flat(None);
    let mut r = rng();
    let mut flows = Flows::<u32, u32>::new();
    flows.insert(1, Flow::cron(at(0))).unwrap();
    let before = flows.clone();
    assert_eq!(flows.trigger(&2, at(1)), Err(FlowError::UnknownId));
    assert_eq!(flows.reset_flow(&2, at(1)), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_success(&2, at(1)), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_cancel(&2, at(1)), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_tick(&2, at(1), at(1)), Err(FlowError::UnknownId));
    let refused = flows.handle_failure(&p, &2, at(1), 44, &mut r).unwrap_err();
    assert_eq!((refused.error, refused.last_error), (FlowError::UnknownId, 44));
    assert_eq!(flows.insert(1, Flow::cron(at(0))).map_err(|(id, _)| id), Err(1));
    assert_eq!(flows, before);
}

#[test]
fn f8_reset_flow_zeroes_streak_and_window_and_sets_idle() {
    let p = flat(Some(2));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), 1, &mut r).unwrap();
    flow.reset_flow(at(2));
    assert_eq!(
        flow.info(),
        FlowInfo { failure_streak: 0, next_eligible: None, run_count: 1, status: FlowStatus::Idle }
    );
    flow.trigger(at(3)).unwrap();
    flow.handle_success(at(4)).unwrap();
    flow.reset_flow(at(5));
    assert_eq!(flow.status(), FlowStatus::Idle, "Completed becomes Idle as well");
}

#[test]
fn f8_reset_while_running_keeps_the_run_and_its_failure_starts_a_new_streak_at_one() {
    let p = flat(Some(3));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), 1, &mut r).unwrap();
    flow.trigger(at(2)).unwrap();
    flow.handle_failure(&p, at(3), 2, &mut r).unwrap();
    flow.trigger(at(4)).unwrap();
    flow.reset_flow(at(5));
    assert_eq!(flow.status(), FlowStatus::Running);
    assert_eq!((flow.streak(), flow.next_eligible()), (0, None));
    flow.handle_failure(&p, at(6), 3, &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(106), streak: 1, last_error: &3 });
}

#[cfg(feature = "alloc")]
#[test]
fn f9_flow_info_exposes_streak_next_eligible_run_count_and_status() {
    let p = flat(None);
    let mut r = rng();
    let mut flows = Flows::<&str, u32>::new();
    flows.insert("f", Flow::every(at(0), ms(10))).unwrap();
    flows.handle_timeout(at(0));
    assert_eq!(flows.poll_action(), Some(("f", FlowAction::Dispatch { run: 1 })));
    flows.handle_failure(&p, &"f", at(5), 3, &mut r).unwrap();
    assert_eq!(
        flows.info(&"f"),
        Some(FlowInfo {
            failure_streak: 1,
            next_eligible: Some(at(105)),
            run_count: 1,
            status: FlowStatus::Backoff { until: at(105), streak: 1, last_error: &3 },
        })
    );
    assert_eq!(flows.info(&"g"), None);
}

#[cfg(feature = "alloc")]
#[test]
fn f10_a_tripped_flow_is_not_dispatched_by_time_or_tick_until_reset() {
    let p = flat(Some(1));
    let mut r = rng();
    let mut flows = Flows::<u8, u32>::new();
    flows.insert(1, Flow::every(at(0), ms(10))).unwrap();
    flows.insert(2, Flow::cron(at(0))).unwrap();
    flows.handle_timeout(at(0));
    assert_eq!(flows.poll_action(), Some((1, FlowAction::Dispatch { run: 1 })));
    flows.handle_failure(&p, &1, at(1), 1, &mut r).unwrap();
    assert_eq!(flows.trigger(&2, at(1)), Ok(FlowAction::Dispatch { run: 1 }));
    flows.handle_failure(&p, &2, at(1), 1, &mut r).unwrap();
    assert_eq!(flows.poll_timeout(), None);
    flows.handle_timeout(at(1_000_000));
    assert_eq!(flows.poll_action(), None);
    assert_eq!(
        flows.handle_tick(&2, at(1_000_000), at(1_000_000)),
        Ok(FlowAction::TickSkipped { tick: at(1_000_000), reason: SkipReason::Tripped })
    );
    flows.reset_flow(&1, at(1_000_001)).unwrap();
    assert_eq!(flows.poll_timeout(), Some(at(11)), "due again at run end + interval");
    flows.handle_timeout(at(1_000_001));
    assert_eq!(flows.poll_action(), Some((1, FlowAction::Dispatch { run: 2 })));
}

/// The scheduler seed scenario: a flow every 200 ms with policy initial 300 ms, ×2, cap 2 s,
/// jitter 0.1, trip after 3.
#[cfg(feature = "alloc")]
#[test]
fn seed_scenario_scheduler_flow_trips_after_three_failures_and_runs_again_after_reset() {
    let p = FlowPolicy::builder()
        .backoff(
            Backoff::exponential(ms(300), 2.0)
                .max_delay(Duration::from_secs(2))
                .jitter(Jitter::Proportional(0.1))
                .build()
                .unwrap(),
        )
        .with_trip(3)
        .build()
        .unwrap();
    let mut r = rng();
    let mut flows = Flows::<&str, &str>::new();
    flows.insert("sync", Flow::every(at(0), ms(200))).unwrap();
    let mut now = at(0);
    let mut dispatches = Vec::new();
    for failure in 1..=3u32 {
        now = flows.poll_timeout().unwrap();
        flows.handle_timeout(now);
        let (id, action) = flows.poll_action().unwrap();
        assert_eq!((id, action), ("sync", FlowAction::Dispatch { run: u64::from(failure) }));
        dispatches.push(now);
        now = now.saturating_add(ms(10)); // the run takes 10 ms and fails
        flows.handle_failure(&p, &"sync", now, "boom", &mut r).unwrap();
        let info = flows.info(&"sync").unwrap();
        assert_eq!(info.failure_streak, failure);
        if failure < 3 {
            let until = info.next_eligible.unwrap();
            let delay = until.saturating_duration_since(now);
            let envelope = ms(300 * (1 << (failure - 1)));
            assert!(delay >= envelope.mul_f64(0.9) && delay <= envelope.mul_f64(1.1), "{failure}: {delay:?}");
            assert!(delay > ms(200), "the window, not the interval, sets the next dispatch");
            assert_eq!(flows.poll_timeout(), Some(until));
        }
    }
    assert_eq!(flows.info(&"sync").unwrap().status, FlowStatus::Tripped { streak: 3, last_error: &"boom" });
    assert_eq!(flows.poll_timeout(), None, "a tripped flow is not dispatched");
    flows.handle_timeout(now.saturating_add(Duration::from_secs(3600)));
    assert_eq!(flows.poll_action(), None);
    let before = flows.clone();
    assert_eq!(flows.trigger(&"sync", now), Err(FlowError::Tripped { streak: 3 }));
    assert_eq!(flows, before);
    now = now.saturating_add(Duration::from_secs(3600));
    flows.reset_flow(&"sync", now).unwrap();
    assert_eq!(
        flows.info(&"sync").unwrap(),
        FlowInfo { failure_streak: 0, next_eligible: None, run_count: 3, status: FlowStatus::Idle }
    );
    flows.handle_timeout(now);
    assert_eq!(flows.poll_action(), Some(("sync", FlowAction::Dispatch { run: 4 })), "it runs again");
    flows.handle_success(&"sync", now.saturating_add(ms(5))).unwrap();
    assert_eq!(flows.info(&"sync").unwrap().status, FlowStatus::Completed);
}

#[cfg(feature = "alloc")]
#[test]
fn flows_dispatch_the_earliest_due_first_and_keep_the_index_in_step() {
    let mut flows = Flows::<u32, ()>::new();
    for id in 0..100u32 {
        flows.insert(id, Flow::every(at(u64::from((id * 37) % 100)), ms(1_000))).unwrap();
    }
    flows.handle_timeout(at(49));
    let mut seen = Vec::new();
    while let Some((id, FlowAction::Dispatch { .. })) = flows.poll_action() {
        seen.push((id * 37) % 100);
    }
    assert_eq!(seen, (0..50).collect::<Vec<_>>(), "due order, all due ones, none early");
    assert_eq!(flows.poll_timeout(), Some(at(50)));
    assert!(flows.remove(&((50 * 73) % 100)).is_some()); // 73 = 37⁻¹ mod 100: the flow due at 50
    assert_eq!(flows.poll_timeout(), Some(at(51)));
    assert_eq!(flows.len(), 99);
    assert_eq!(flows.get(&7).unwrap().schedule(), persevere::FlowSchedule::Every { interval: ms(1_000) });
}

// ---------------------------------------------------------------- properties

#[derive(Clone, Copy, Debug)]
enum Op {
    Timeout(u64),
    Tick(u64),
    Trigger(u64),
    Success(u64),
    Failure(u64),
    Cancel(u64),
    Reset(u64),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..5_000u64).prop_map(Op::Timeout),
        2 => (0..5_000u64).prop_map(Op::Tick),
        2 => (0..5_000u64).prop_map(Op::Trigger),
        2 => (0..5_000u64).prop_map(Op::Success),
        3 => (0..5_000u64).prop_map(Op::Failure),
        1 => (0..5_000u64).prop_map(Op::Cancel),
        1 => (0..5_000u64).prop_map(Op::Reset),
    ]
}

fn any_policy() -> impl Strategy<Value = FlowPolicy> {
    (prop::option::of(1..5u32), 1..300u64, 0..3u8).prop_map(|(trip, initial, jitter)| {
        let jitter = [Jitter::None, Jitter::Proportional(0.1), Jitter::Full][jitter as usize];
        let backoff = Backoff::exponential(ms(initial), 2.0).max_delay(ms(2_000)).jitter(jitter).build().unwrap();
        let mut b = FlowPolicy::builder().backoff(backoff);
        b.trip_after = trip;
        b.build().unwrap()
    })
}

/// Applies `op`; returns whether it was refused. Times are offsets from the flow's last time,
/// so that most inputs move forward.
fn apply(flow: &mut Flow<u32>, policy: &FlowPolicy, op: Op, r: &mut ChaCha8Rng) -> bool {
    match op {
        Op::Timeout(t) => {
            flow.handle_timeout(at(t));
            false
        }
        Op::Tick(t) => flow.handle_tick(at(t), at(t)).is_err(),
        Op::Trigger(t) => flow.trigger(at(t)).is_err(),
        Op::Success(t) => flow.handle_success(at(t)).is_err(),
        Op::Failure(t) => flow.handle_failure(policy, at(t), t as u32, r).is_err(),
        Op::Cancel(t) => flow.handle_cancel(at(t)).is_err(),
        Op::Reset(t) => {
            flow.reset_flow(at(t));
            false
        }
    }
}

proptest! {
    #[test]
    fn g12_a_refused_input_changes_nothing(policy in any_policy(), cron in any::<bool>(), ops in prop::collection::vec(any_op(), 1..80), seed in any::<u64>()) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut flow = if cron { Flow::cron(at(0)) } else { Flow::every(at(0), ms(100)) };
        for op in ops {
            let before = flow;
            let rng_before = r.clone();
            if apply(&mut flow, &policy, op, &mut r) {
                prop_assert_eq!(flow, before, "{:?} was refused but changed the state", op);
                prop_assert_eq!(&r, &rng_before);
            }
            flow.poll_action();
        }
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn g12_a_refused_registry_input_changes_nothing(policy in any_policy(), ops in prop::collection::vec((any_op(), 0..3u8), 1..60), seed in any::<u64>()) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut flows = Flows::<u8, u32>::new();
        flows.insert(0, Flow::every(at(0), ms(100))).unwrap();
        flows.insert(1, Flow::cron(at(0))).unwrap();
        for (op, id) in ops {
            let before = flows.clone();
            let refused = match op {
                Op::Timeout(t) => { flows.handle_timeout(at(t)); while flows.poll_action().is_some() {} false }
                Op::Tick(t) => flows.handle_tick(&id, at(t), at(t)).is_err(),
                Op::Trigger(t) => flows.trigger(&id, at(t)).is_err(),
                Op::Success(t) => flows.handle_success(&id, at(t)).is_err(),
                Op::Failure(t) => flows.handle_failure(&policy, &id, at(t), 0, &mut r).is_err(),
                Op::Cancel(t) => flows.handle_cancel(&id, at(t)).is_err(),
                Op::Reset(t) => flows.reset_flow(&id, at(t)).is_err(),
            };
            if refused {
                prop_assert_eq!(&flows, &before, "{:?} on {} was refused but changed the registry", op, id);
            }
            // The index always agrees with the flows.
            let earliest = flows.iter().filter_map(|(_, f)| f.poll_timeout()).min();
            prop_assert_eq!(flows.poll_timeout(), earliest);
        }
    }

    #[test]
    fn f3_every_outcome_lands_in_exactly_one_status_with_exact_streak_arithmetic(
        policy in any_policy(),
        ops in prop::collection::vec(any_op(), 1..80),
        seed in any::<u64>(),
    ) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut flow = Flow::<u32>::every(at(0), ms(100));
        let mut clock = 0;
        for op in ops {
            // Times only move forward here, so that `now` is each run's end exactly.
            let op = forward(op, &mut clock);
            let now = at(clock);
            let before = flow;
            let refused = apply(&mut flow, &policy, op, &mut r);
            flow.poll_action();
            if refused { continue; }
            match op {
                Op::Success(_) => {
                    prop_assert_eq!(flow.status(), FlowStatus::Completed);
                    prop_assert_eq!((flow.streak(), flow.next_eligible()), (0, None));
                }
                Op::Failure(t) => {
                    let streak = before.streak() + 1;
                    prop_assert_eq!(flow.streak(), streak);
                    let tripped = policy.trip_after().is_some_and(|n| streak >= n);
                    match flow.status() {
                        FlowStatus::Tripped { streak: s, last_error } => {
                            prop_assert!(tripped);
                            prop_assert_eq!((s, *last_error), (streak, t as u32));
                            prop_assert_eq!(flow.next_eligible(), None);
                        }
                        FlowStatus::Backoff { until, streak: s, last_error } => {
                            prop_assert!(!tripped);
                            prop_assert_eq!((s, *last_error), (streak, t as u32));
                            prop_assert_eq!(flow.next_eligible(), Some(until));
                            prop_assert!(until >= now);
                            let delay = until.saturating_duration_since(now);
                            prop_assert!(delay <= policy.backoff().max_delay());
                            if policy.backoff().jitter_kind() == Jitter::None {
                                prop_assert_eq!(delay, policy.backoff().envelope(streak));
                            }
                        }
                        other => prop_assert!(false, "a failure landed in {:?}", other),
                    }
                }
                Op::Cancel(_) => {
                    prop_assert_eq!(flow.status(), FlowStatus::Idle);
                    prop_assert_eq!((flow.streak(), flow.next_eligible()), (before.streak(), before.next_eligible()));
                }
                _ => {}
            }
            // Exactly one status, consistent with the counters.
            match flow.status() {
                FlowStatus::Backoff { streak, .. } | FlowStatus::Tripped { streak, .. } => {
                    prop_assert_eq!(streak, flow.streak());
                    prop_assert!(streak >= 1);
                }
                FlowStatus::Completed => prop_assert_eq!(flow.streak(), 0),
                _ => {}
            }
        }
    }

    #[test]
    fn f10_a_tripped_flow_is_never_dispatched_until_reset(
        trip in 1..4u32,
        ops in prop::collection::vec(any_op(), 1..120),
        cron in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let policy = flat(Some(trip));
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut flow = if cron { Flow::<u32>::cron(at(0)) } else { Flow::every(at(0), ms(100)) };
        for op in ops {
            let was_tripped = flow.status().kind() == FlowStatusKind::Tripped;
            let refused = apply(&mut flow, &policy, op, &mut r);
            let action = flow.poll_action();
            if was_tripped && !matches!(op, Op::Reset(_)) {
                prop_assert!(!matches!(action, Some(FlowAction::Dispatch { .. })), "{:?} dispatched a tripped flow", op);
                prop_assert_eq!(flow.status().kind(), FlowStatusKind::Tripped);
                if matches!(op, Op::Trigger(_)) { prop_assert!(refused); }
                prop_assert_eq!(flow.poll_timeout(), None);
            }
        }
    }
}

/// The op with its time replaced by a clock that moves forward by its time modulo 300 ms.
fn forward(op: Op, clock: &mut u64) -> Op {
    let mut step = |t: u64| {
        *clock += t % 300;
        *clock
    };
    match op {
        Op::Timeout(t) => Op::Timeout(step(t)),
        Op::Tick(t) => Op::Tick(step(t)),
        Op::Trigger(t) => Op::Trigger(step(t)),
        Op::Success(t) => Op::Success(step(t)),
        Op::Failure(t) => Op::Failure(step(t)),
        Op::Cancel(t) => Op::Cancel(step(t)),
        Op::Reset(t) => Op::Reset(step(t)),
    }
}
