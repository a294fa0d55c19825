//! Rules F1–F10 on the flow machine and the `Flows` registry, the scheduler seed scenario, and
//! G12 (a refused input changes nothing).

use core::time::Duration;

#[cfg(feature = "alloc")]
use persevere::Flows;
use persevere::{
    Backoff, DEFAULT_MAX_HINT, Failure, FailureKind, Flow, FlowAction, FlowError, FlowInfo, FlowPolicy, FlowStatus,
    FlowStatusKind, Hint, Instant, Jitter, PolicyError, SkipReason, TripReason,
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

/// A flow that has just been dispatched at `now` (its dispatch drained).
fn running(now: Instant) -> Flow<u32> {
    let mut flow = Flow::every(now, ms(200));
    flow.handle_timeout(now);
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
    flow
}

/// `trigger`, then drain its dispatch (the drain rule: the next input would be refused).
fn trigger(flow: &mut Flow<u32>, now: Instant) {
    flow.trigger(now).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: flow.run_count() }));
    assert_eq!(flow.poll_action(), None);
}

/// A retryable failure with error `e`.
fn fail(e: u32) -> Failure<u32> {
    Failure::retryable(e)
}

#[test]
fn f1_status_moves_through_idle_running_completed_backoff_tripped() {
    let p = flat(Some(2));
    let mut r = rng();
    let mut flow = Flow::<u32>::cron(at(0));
    assert_eq!(flow.status(), FlowStatus::Idle);
    trigger(&mut flow, at(0));
    assert_eq!(flow.status(), FlowStatus::Running);
    flow.handle_success(at(1)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Completed);
    trigger(&mut flow, at(2));
    flow.handle_failure(&p, at(3), fail(7), &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(103), streak: 1, last_error: &7 });
    trigger(&mut flow, at(4));
    flow.handle_failure(&p, at(5), fail(8), &mut r).unwrap();
    let tripped = FlowStatus::Tripped { streak: 2, last_error: &8, reason: TripReason::Streak };
    assert_eq!(flow.status(), tripped);
    assert_eq!(flow.status().kind(), FlowStatusKind::Tripped);
    assert_eq!(flow.status().cloned(), FlowStatus::Tripped { streak: 2, last_error: 8, reason: TripReason::Streak });
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
    assert_eq!((p.max_hint(), p.restarts_after_hint()), (DEFAULT_MAX_HINT, false), "hints up to 5 min (B6)");
    assert_eq!(FlowPolicy::builder().build().unwrap(), p);
    let mut r = rng();
    let mut flow = running(at(0));
    for n in 1..=200u32 {
        flow.handle_failure(&p, at(0), fail(0), &mut r).unwrap();
        let until = flow.next_eligible().unwrap();
        let delay = until.saturating_duration_since(at(0));
        let envelope = expected.envelope(n);
        let high = envelope.mul_f64(1.1).min(Duration::from_secs(300));
        assert!(delay >= envelope.mul_f64(0.9) - Duration::from_nanos(1) && delay <= high, "{n}: {delay:?}");
        trigger(&mut flow, at(0));
    }
    assert_eq!(flow.streak(), 200, "no trip limit");
}

#[test]
fn f2_with_trip_zero_is_a_configuration_error() {
    assert!(matches!(FlowPolicy::builder().with_trip(0).build(), Err(PolicyError::Zero { setting: "trip limit", .. })));
    assert_eq!(FlowPolicy::builder().with_trip(1).build().unwrap().trip_after(), Some(1));
    assert!(matches!(
        FlowPolicy::builder().max_hint(Duration::ZERO).build(),
        Err(PolicyError::Zero { setting: "max_hint", .. })
    ));
}

#[test]
fn f3_a_success_completes_with_streak_zero_and_no_window() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    trigger(&mut flow, at(2));
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
    flow.handle_failure(&p, at(40), fail(1), &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(140), streak: 1, last_error: &1 });
    assert_eq!(flow.next_eligible(), Some(at(140)));
}

#[test]
fn f3_a_failure_at_the_limit_trips_without_computing_a_delay() {
    let p = FlowPolicy::builder().with_trip(2).build().unwrap(); // jittered backoff draws randomness
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    trigger(&mut flow, at(2));
    let rng_before = r.clone();
    flow.handle_failure(&p, at(3), fail(2), &mut r).unwrap();
    assert_eq!(r, rng_before, "no delay was drawn");
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 2, last_error: &2, reason: TripReason::Streak });
    assert_eq!(flow.next_eligible(), None);
}

#[test]
fn f3_a_fatal_failure_trips_at_once_with_the_reason_in_the_status() {
    // Even a policy that never trips by the streak, and with the streak below any limit.
    for p in [FlowPolicy::default(), FlowPolicy::builder().with_trip(5).build().unwrap()] {
        let mut r = rng();
        let mut flow = running(at(0));
        flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
        trigger(&mut flow, at(2));
        let rng_before = r.clone();
        flow.handle_failure(&p, at(3), Failure::fatal(7), &mut r).unwrap();
        assert_eq!(r, rng_before, "no delay was drawn");
        assert_eq!(flow.status(), FlowStatus::Tripped { streak: 2, last_error: &7, reason: TripReason::Fatal });
        assert_eq!((flow.next_eligible(), flow.poll_timeout()), (None, None), "never dispatched by time (F10)");
        assert_eq!(
            flow.trigger(at(4)),
            Err(FlowError::Tripped { streak: 2, reason: TripReason::Fatal }),
            "F7: reset it first"
        );
        assert_eq!(flow.poll_action(), Some(FlowAction::Tripped { streak: 2, reason: TripReason::Fatal }), "O1");
        flow.reset_flow(at(5)).unwrap();
        assert_eq!(flow.status(), FlowStatus::Idle);
        assert_eq!(flow.poll_action(), Some(FlowAction::Reset { streak: 2, tripped: true }), "O1");
    }
}

#[test]
fn f3_do_not_retry_trips_at_once() {
    let p = FlowPolicy::default(); // never trips by the streak
    let mut r = rng();
    let mut flow = running(at(0));
    let rng_before = r.clone();
    flow.handle_failure(&p, at(1), Failure::do_not_retry(9), &mut r).unwrap();
    assert_eq!(r, rng_before, "no delay was drawn");
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 1, last_error: &9, reason: TripReason::DoNotRetry });
    assert_eq!((flow.next_eligible(), flow.poll_timeout()), (None, None));
    assert_eq!(flow.info().failure_streak, 1);
}

#[test]
fn f3_a_hint_sets_the_window_to_exactly_the_hinted_instant() {
    // B6: the hint replaces the backoff (100 ms, capped at 100 ms here) for one window,
    // shorter or longer, and nothing shortens it: not the cap, not the jitter.
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    let rng_before = r.clone();
    flow.handle_failure(&p, at(10), Failure::retry_after(ms(30), 1), &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(40), streak: 1, last_error: &1 });
    assert_eq!(r, rng_before, "a hinted window draws nothing");
    trigger(&mut flow, at(50));
    flow.handle_failure(&p, at(60), Failure::retry_after(ms(700), 2), &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(760), streak: 2, last_error: &2 });
    assert_eq!(flow.next_eligible(), Some(at(760)));
    assert_eq!(flow.poll_timeout(), Some(at(760)), "later than the run's end + interval (260)");
    trigger(&mut flow, at(800));
    let at_hint = Failure::new(FailureKind::Hinted(Hint::At(at(2_000))), 3);
    flow.handle_failure(&p, at(900), at_hint, &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(2_000), streak: 3, last_error: &3 });
    // An instant in the past is "now"; a hint of exactly max_hint is honoured in full.
    trigger(&mut flow, at(2_000));
    let past = Failure::new(FailureKind::Hinted(Hint::At(at(5))), 4);
    flow.handle_failure(&p, at(2_010), past, &mut r).unwrap();
    assert_eq!(flow.next_eligible(), Some(at(2_010)));
    trigger(&mut flow, at(2_020));
    flow.handle_failure(&p, at(2_030), Failure::retry_after(DEFAULT_MAX_HINT, 5), &mut r).unwrap();
    assert_eq!(flow.next_eligible(), Some(at(2_030) + DEFAULT_MAX_HINT));
    // With a jittered policy too, the window is the hint exactly.
    let p = FlowPolicy::default();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(10), Failure::retry_after(ms(1_234), 6), &mut r).unwrap();
    assert_eq!(flow.next_eligible(), Some(at(1_244)));
}

#[test]
fn f3_a_hint_past_max_hint_trips_with_the_hinted_instant() {
    let p = FlowPolicy::builder().max_hint(Duration::from_secs(1)).build().unwrap();
    assert_eq!(p.max_hint(), Duration::from_secs(1));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(10), Failure::retry_after(ms(1_001), 1), &mut r).unwrap();
    let reason = TripReason::Deferred { retry_at: at(1_011) };
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 1, last_error: &1, reason });
    assert_eq!((flow.next_eligible(), flow.poll_timeout()), (None, None), "tripped: it waits for a reset");
    assert_eq!(flow.trigger(at(2_000)), Err(FlowError::Tripped { streak: 1, reason }));
    // The default max_hint (5 min): a `Retry-After` of an hour trips, with the hour's end.
    let p = FlowPolicy::default();
    let mut flow = running(at(0));
    let hour = Duration::from_secs(3_600);
    flow.handle_failure(&p, at(10), Failure::retry_after(hour, 2), &mut r).unwrap();
    let reason = TripReason::Deferred { retry_at: at(10) + hour };
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 1, last_error: &2, reason });
    // With max_hint = Duration::MAX, any hint is honoured: the hour is the window.
    let p = FlowPolicy::builder().max_hint(Duration::MAX).build().unwrap();
    assert_eq!(p.max_hint(), Duration::MAX);
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(10), Failure::retry_after(hour, 3), &mut r).unwrap();
    assert_eq!(flow.status(), FlowStatus::Backoff { until: at(10) + hour, streak: 1, last_error: &3 });
}

#[test]
fn f3_restart_after_hint_restarts_the_schedule_but_not_the_streak() {
    let backoff = Backoff::exponential(ms(100), 2.0).max_delay(ms(60_000)).jitter(Jitter::None).build().unwrap();
    let windows = |restart: bool| {
        let p = FlowPolicy::builder().backoff(backoff).with_trip(5).restart_after_hint(restart).build().unwrap();
        assert_eq!(p.restarts_after_hint(), restart);
        let mut r = rng();
        let mut flow = running(at(0));
        let mut seen = Vec::new();
        for n in 1..=5u32 {
            let failure = if n == 3 { Failure::retry_after(ms(50), n) } else { fail(n) };
            flow.handle_failure(&p, at(0), failure, &mut r).unwrap();
            seen.push((flow.next_eligible().map(|until| until.saturating_duration_since(at(0))), flow.streak()));
            if n < 5 {
                trigger(&mut flow, at(0));
            }
        }
        (seen, flow.status().kind())
    };
    assert_eq!(
        windows(true),
        (
            vec![(Some(ms(100)), 1), (Some(ms(200)), 2), (Some(ms(50)), 3), (Some(ms(100)), 4), (None, 5)],
            FlowStatusKind::Tripped
        ),
        "the schedule starts over after the hint; the streak goes on and trips at 5"
    );
    assert_eq!(
        windows(false),
        (
            vec![(Some(ms(100)), 1), (Some(ms(200)), 2), (Some(ms(50)), 3), (Some(ms(800)), 4), (None, 5)],
            FlowStatusKind::Tripped
        )
    );
}

#[test]
fn f3_a_result_for_a_flow_that_is_not_running_is_refused() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = Flow::<u32>::every(at(0), ms(10));
    let before = flow;
    assert_eq!(flow.handle_success(at(1)), Err(FlowError::NotRunning(FlowStatusKind::Idle)));
    let refused = flow.handle_failure(&p, at(1), fail(5), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (FlowError::NotRunning(FlowStatusKind::Idle), fail(5)));
    assert_eq!(flow.handle_cancel(at(1)), Err(FlowError::NotRunning(FlowStatusKind::Idle)));
    assert_eq!(flow, before);
}

#[test]
fn f3_an_input_before_the_action_is_drained_is_refused() {
    let p = flat(Some(3));
    let mut r = rng();
    // An every-flow dispatched by time: its dispatch waits to be drained.
    let mut flow = Flow::<u32>::every(at(0), ms(200));
    flow.handle_timeout(at(0));
    let before = flow;
    let rng_before = r.clone();
    assert_eq!(flow.handle_success(at(1)), Err(FlowError::Undrained));
    let refused = flow.handle_failure(&p, at(1), fail(5), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (FlowError::Undrained, fail(5)));
    assert_eq!(flow.handle_cancel(at(1)), Err(FlowError::Undrained));
    assert_eq!(flow.trigger(at(1)), Err(FlowError::Running), "a validity error takes precedence");
    assert_eq!(flow.handle_tick(at(1), at(1)), Err(FlowError::NotCron), "a validity error takes precedence");
    flow.handle_timeout(at(1_000));
    assert_eq!(flow, before, "nothing changed, not even the accepted now");
    assert_eq!(r, rng_before);
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
    assert_eq!(flow.poll_action(), None);
    flow.handle_failure(&p, at(1), fail(5), &mut r).unwrap();
    // A trigger's dispatch, on a flow in its window.
    flow.trigger(at(2)).unwrap();
    let before = flow;
    assert_eq!(flow.handle_success(at(3)), Err(FlowError::Undrained));
    assert_eq!(flow, before);
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
    flow.handle_success(at(3)).unwrap();
    // A cron flow's skipped tick: the next tick and a trigger wait for it to be drained.
    let mut flow = Flow::<u32>::cron(at(0));
    trigger(&mut flow, at(0));
    flow.handle_failure(&p, at(10), fail(1), &mut r).unwrap(); // window until 110
    flow.handle_tick(at(20), at(20)).unwrap();
    let before = flow;
    assert_eq!(flow.handle_tick(at(120), at(120)), Err(FlowError::Undrained));
    assert_eq!(flow.trigger(at(120)), Err(FlowError::Undrained));
    assert_eq!(flow, before);
    let skipped = FlowAction::TickSkipped { tick: at(20), reason: SkipReason::InBackoff { until: at(110) } };
    assert_eq!(flow.poll_action(), Some(skipped));
    flow.handle_tick(at(120), at(120)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
    // `reset_flow` obeys the drain rule too: refused while the dispatch waits, which stays.
    let mut flow = Flow::<u32>::cron(at(0));
    flow.trigger(at(0)).unwrap();
    assert_eq!(flow.reset_flow(at(1)), Err(FlowError::Undrained));
    assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
}

#[test]
fn f4_a_clean_cancel_returns_to_idle_with_the_streak_unchanged() {
    let p = flat(None);
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    trigger(&mut flow, at(2));
    flow.handle_failure(&p, at(3), fail(2), &mut r).unwrap();
    trigger(&mut flow, at(4));
    flow.handle_cancel(at(5)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Idle);
    assert_eq!(flow.streak(), 2);
    assert_eq!(flow.next_eligible(), Some(at(103)), "the window is unchanged too");
}

#[test]
fn f4_a_canceled_failure_is_a_clean_cancel() {
    let p = flat(Some(2)); // one more failure would trip it
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    trigger(&mut flow, at(2));
    let mut canceled = flow;
    flow.handle_cancel(at(5)).unwrap();
    let rng_before = r.clone();
    canceled.handle_failure(&p, at(5), Failure::canceled(9), &mut r).unwrap();
    assert_eq!(r, rng_before);
    assert_eq!(canceled.status(), FlowStatus::Idle);
    assert_eq!((canceled.streak(), canceled.next_eligible()), (1, Some(at(101))), "streak and window unchanged");
    assert_eq!(canceled, flow, "exactly what handle_cancel does");
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
    flow.handle_failure(&p, at(1_300), fail(0), &mut r).unwrap();
    assert_eq!(flow.poll_timeout(), Some(at(1_800)), "the window (1800) is later than end + interval (1500)");
    let p = flat(None);
    flow.handle_timeout(at(1_800));
    flow.poll_action();
    flow.handle_failure(&p, at(1_900), fail(0), &mut r).unwrap();
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
    flow.handle_failure(&p, at(50), fail(1), &mut r).unwrap(); // window until 150
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
    flow.handle_failure(&p, at(10), fail(1), &mut r).unwrap();
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
    flow.handle_failure(&p, at(2), fail(1), &mut r).unwrap();
    let before = flow;
    assert_eq!(flow.trigger(at(3)), Err(FlowError::Tripped { streak: 1, reason: TripReason::Streak }));
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
    assert_eq!(flows.trigger(at(1), &2), Err(FlowError::UnknownId));
    assert_eq!(flows.reset_flow(at(1), &2), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_success(at(1), &2), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_cancel(at(1), &2), Err(FlowError::UnknownId));
    assert_eq!(flows.handle_tick(at(1), &2, at(1)), Err(FlowError::UnknownId));
    let refused = flows.handle_failure(&p, at(1), &2, fail(44), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (FlowError::UnknownId, fail(44)));
    let refused = flows.insert(1, Flow::every(at(0), ms(5))).unwrap_err();
    assert_eq!((refused.error, refused.input), (FlowError::DuplicateId, (1, Flow::every(at(0), ms(5)))));
    assert_eq!(flows, before);
}

#[test]
fn f8_reset_flow_zeroes_streak_and_window_and_sets_idle() {
    let p = flat(Some(2));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    flow.reset_flow(at(2)).unwrap();
    assert_eq!(
        flow.info(),
        FlowInfo { failure_streak: 0, next_eligible: None, run_count: 1, status: FlowStatus::Idle }
    );
    assert_eq!(flow.poll_action(), Some(FlowAction::Reset { streak: 1, tripped: false }), "O1");
    trigger(&mut flow, at(3));
    flow.handle_success(at(4)).unwrap();
    flow.reset_flow(at(5)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Idle, "Completed becomes Idle as well");
    assert_eq!(flow.poll_action(), None, "a reset that cleared no streak is no transition");
}

#[test]
fn f8_reset_while_running_keeps_the_run_and_its_failure_starts_a_new_streak_at_one() {
    let p = flat(Some(3));
    let mut r = rng();
    let mut flow = running(at(0));
    flow.handle_failure(&p, at(1), fail(1), &mut r).unwrap();
    trigger(&mut flow, at(2));
    flow.handle_failure(&p, at(3), fail(2), &mut r).unwrap();
    trigger(&mut flow, at(4));
    flow.reset_flow(at(5)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Running);
    assert_eq!((flow.streak(), flow.next_eligible()), (0, None));
    assert_eq!(flow.poll_action(), Some(FlowAction::Reset { streak: 2, tripped: false }));
    flow.handle_failure(&p, at(6), fail(3), &mut r).unwrap();
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
    flows.handle_failure(&p, at(5), &"f", fail(3), &mut r).unwrap();
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
    flows.handle_failure(&p, at(1), &1, fail(1), &mut r).unwrap();
    assert_eq!(flows.trigger(at(1), &2), Ok(FlowAction::Dispatch { run: 1 }));
    flows.handle_failure(&p, at(1), &2, fail(1), &mut r).unwrap();
    assert_eq!(flows.poll_timeout(), None);
    flows.handle_timeout(at(1_000_000));
    assert_eq!(flows.poll_action(), None);
    assert_eq!(
        flows.handle_tick(at(1_000_000), &2, at(1_000_000)),
        Ok(FlowAction::TickSkipped { tick: at(1_000_000), reason: SkipReason::Tripped })
    );
    flows.reset_flow(at(1_000_001), &1).unwrap();
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
        flows.handle_failure(&p, now, &"sync", Failure::retryable("boom"), &mut r).unwrap();
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
    assert_eq!(
        flows.info(&"sync").unwrap().status,
        FlowStatus::Tripped { streak: 3, last_error: &"boom", reason: TripReason::Streak }
    );
    assert_eq!(flows.poll_timeout(), None, "a tripped flow is not dispatched");
    flows.handle_timeout(now.saturating_add(Duration::from_secs(3600)));
    assert_eq!(flows.poll_action(), None);
    let before = flows.clone();
    assert_eq!(flows.trigger(now, &"sync"), Err(FlowError::Tripped { streak: 3, reason: TripReason::Streak }));
    assert_eq!(flows, before);
    now = now.saturating_add(Duration::from_secs(3600));
    flows.reset_flow(now, &"sync").unwrap();
    assert_eq!(
        flows.info(&"sync").unwrap(),
        FlowInfo { failure_streak: 0, next_eligible: None, run_count: 3, status: FlowStatus::Idle }
    );
    flows.handle_timeout(now);
    assert_eq!(flows.poll_action(), Some(("sync", FlowAction::Dispatch { run: 4 })), "it runs again");
    flows.handle_success(now.saturating_add(ms(5)), &"sync").unwrap();
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

#[cfg(all(feature = "alloc", feature = "serde"))]
#[test]
fn flows_persist_with_serde_and_an_invalid_flow_is_refused_on_load() {
    let p = flat(Some(3));
    let mut r = rng();
    let mut flows = Flows::<u32, u32>::new();
    for id in 0..6u32 {
        flows.insert(id, Flow::every(at(u64::from(id)), ms(1_000))).unwrap();
    }
    flows.insert(9, Flow::cron(at(0))).unwrap();
    flows.handle_timeout(at(3));
    let dispatched: Vec<_> = core::iter::from_fn(|| flows.poll_action()).map(|(id, _)| id).collect();
    assert_eq!(dispatched, vec![0, 1, 2, 3]);
    flows.handle_failure(&p, at(10), &0, fail(7), &mut r).unwrap(); // backoff until 110
    flows.handle_success(at(20), &1).unwrap(); // due at 1020
    flows.handle_failure(&p, at(30), &2, Failure::fatal(8), &mut r).unwrap(); // tripped
    flows.trigger(at(40), &9).unwrap(); // running
    let json = serde_json::to_string(&flows).unwrap();
    let mut back: Flows<u32, u32> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, flows, "flows, due index and latest now");
    assert_eq!(back.poll_timeout(), flows.poll_timeout());
    assert_eq!(back.now(), flows.now());
    for (id, flow) in flows.iter() {
        assert_eq!(back.get(id), Some(flow));
    }
    // Both dispatch the same flows in the same order from here on.
    for now in [at(500), at(1_100), at(5_000)] {
        flows.handle_timeout(now);
        back.handle_timeout(now);
        let a: Vec<_> = core::iter::from_fn(|| flows.poll_action()).collect();
        let b: Vec<_> = core::iter::from_fn(|| back.poll_action()).collect();
        assert_eq!(a, b);
        assert!(!a.is_empty(), "at {now:?}");
        for (id, _) in a {
            flows.handle_success(now, &id).unwrap();
            back.handle_success(now, &id).unwrap();
        }
        assert_eq!(back.poll_timeout(), flows.poll_timeout());
    }
    assert_eq!(back, flows);
    // An edited state that no transition could make: a backing-off flow whose next_eligible
    // is not its window's end.
    let mut flows = Flows::<u32, u32>::new();
    flows.insert(0, Flow::every(at(0), ms(1_000))).unwrap();
    flows.handle_timeout(at(0));
    flows.poll_action().unwrap();
    flows.handle_failure(&p, at(10), &0, fail(7), &mut r).unwrap();
    let mut value = serde_json::to_value(&flows).unwrap();
    let flow = &mut value["flows"]["0"];
    assert_eq!(flow["next_eligible"], serde_json::to_value(at(110)).unwrap(), "the layout this test edits: {flow}");
    flow["next_eligible"] = serde_json::to_value(at(111)).unwrap();
    let error = serde_json::from_value::<Flows<u32, u32>>(value.clone()).unwrap_err().to_string();
    assert!(error.contains("invalid state of a Flow"), "{error}");
    // Put back, it loads.
    value["flows"]["0"]["next_eligible"] = serde_json::to_value(at(110)).unwrap();
    assert_eq!(serde_json::from_value::<Flows<u32, u32>>(value.clone()).unwrap(), flows);
    // A flow that holds an action (its dispatch never reached the registry's driver).
    let mut holding = Flow::<u32>::every(at(0), ms(1_000));
    holding.handle_timeout(at(0));
    assert!(holding.clone().poll_action().is_some(), "the flow this test loads holds its dispatch");
    value["flows"]["0"] = serde_json::to_value(holding).unwrap();
    let error = serde_json::from_value::<Flows<u32, u32>>(value).unwrap_err().to_string();
    assert!(error.contains("a flow holds an action"), "{error}");
}

// ---------------------------------------------------------------- properties

#[derive(Clone, Copy, Debug)]
enum Op {
    Timeout(u64),
    Tick(u64),
    Trigger(u64),
    Success(u64),
    /// A failure at the time, of the kind [`failure_of`] picks.
    Failure(u64, u8),
    Cancel(u64),
    Reset(u64),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..5_000u64).prop_map(Op::Timeout),
        2 => (0..5_000u64).prop_map(Op::Tick),
        2 => (0..5_000u64).prop_map(Op::Trigger),
        2 => (0..5_000u64).prop_map(Op::Success),
        3 => (0..5_000u64, 0..10u8).prop_map(|(t, k)| Op::Failure(t, k)),
        1 => (0..5_000u64).prop_map(Op::Cancel),
        1 => (0..5_000u64).prop_map(Op::Reset),
    ]
}

/// Mostly retryable failures; also fatal, do-not-retry, canceled, and hinted ones (a hint of
/// `t % 400` ms, or of an hour, past the default `max_hint`). The error is `t`.
fn failure_of(t: u64, k: u8) -> Failure<u32> {
    let e = t as u32;
    match k {
        0..=3 => Failure::retryable(e),
        4 => Failure::fatal(e),
        5 => Failure::do_not_retry(e),
        6 => Failure::canceled(e),
        7 | 8 => Failure::retry_after(ms(t % 400), e),
        _ => Failure::retry_after(Duration::from_secs(3_600), e),
    }
}

fn any_policy() -> impl Strategy<Value = FlowPolicy> {
    (prop::option::of(1..5u32), 1..300u64, 0..3u8, 0..3u8, any::<bool>()).prop_map(
        |(trip, initial, jitter, max_hint, restart_after_hint)| {
            let jitter = [Jitter::None, Jitter::Proportional(0.1), Jitter::Full][jitter as usize];
            let backoff = Backoff::exponential(ms(initial), 2.0).max_delay(ms(2_000)).jitter(jitter).build().unwrap();
            let mut b = FlowPolicy::builder().backoff(backoff).restart_after_hint(restart_after_hint);
            b.trip_after = trip;
            // The default (5 min), 200 ms (some hints trip the flow), or any.
            b.max_hint = [DEFAULT_MAX_HINT, ms(200), Duration::MAX][max_hint as usize];
            b.build().unwrap()
        },
    )
}

/// Applies `op`; returns whether it was refused (`handle_timeout` and `reset_flow` never are).
fn apply(flow: &mut Flow<u32>, policy: &FlowPolicy, op: Op, r: &mut ChaCha8Rng) -> bool {
    match op {
        Op::Timeout(t) => {
            flow.handle_timeout(at(t));
            false
        }
        Op::Tick(t) => flow.handle_tick(at(t), at(t)).is_err(),
        Op::Trigger(t) => flow.trigger(at(t)).is_err(),
        Op::Success(t) => flow.handle_success(at(t)).is_err(),
        Op::Failure(t, k) => flow.handle_failure(policy, at(t), failure_of(t, k), r).is_err(),
        Op::Cancel(t) => flow.handle_cancel(at(t)).is_err(),
        Op::Reset(t) => flow.reset_flow(at(t)).is_err(),
    }
}

proptest! {
    /// G12, and the drain rule: every op is applied to a drained flow; when an accepted one
    /// leaves an action, `intruder` (if any) comes before it is drained and must be refused
    /// without any change (a timeout does nothing; `reset_flow` is always accepted).
    #[test]
    fn g12_a_refused_input_changes_nothing(
        policy in any_policy(),
        cron in any::<bool>(),
        ops in prop::collection::vec((any_op(), prop::option::of(any_op())), 1..80),
        seed in any::<u64>(),
    ) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut flow = if cron { Flow::cron(at(0)) } else { Flow::every(at(0), ms(100)) };
        for (op, intruder) in ops {
            let before = flow;
            let rng_before = r.clone();
            if apply(&mut flow, &policy, op, &mut r) {
                prop_assert_eq!(flow, before, "{:?} was refused but changed the state", op);
                prop_assert_eq!(&r, &rng_before);
            }
            let undrained = { let mut probe = flow; probe.poll_action().is_some() };
            if let (Some(intruder), true) = (intruder, undrained)
                && !matches!(intruder, Op::Reset(_))
            {
                let before = flow;
                let rng_before = r.clone();
                let refused = apply(&mut flow, &policy, intruder, &mut r);
                prop_assert!(refused || matches!(intruder, Op::Timeout(_)), "{:?} was accepted undrained", intruder);
                prop_assert_eq!(flow, before, "{:?} changed an undrained flow", intruder);
                prop_assert_eq!(&r, &rng_before);
            }
            flow.poll_action();
            prop_assert_eq!(flow.poll_action(), None, "at most one action per input");
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
                Op::Tick(t) => flows.handle_tick(at(t), &id, at(t)).is_err(),
                Op::Trigger(t) => flows.trigger(at(t), &id).is_err(),
                Op::Success(t) => flows.handle_success(at(t), &id).is_err(),
                Op::Failure(t, k) => flows.handle_failure(&policy, at(t), &id, failure_of(t, k), &mut r).is_err(),
                Op::Cancel(t) => flows.handle_cancel(at(t), &id).is_err(),
                Op::Reset(t) => flows.reset_flow(at(t), &id).is_err(),
            };
            if refused {
                prop_assert_eq!(&flows, &before, "{:?} on {} was refused but changed the registry", op, id);
            }
            // The registry drains its flows itself: none ever holds an action.
            for (id, flow) in flows.iter() {
                let mut probe = *flow;
                prop_assert_eq!(probe.poll_action(), None, "flow {} holds an action", id);
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
        // The streak's length when the schedule last started over after a hint (B6).
        let mut restarted_at = 0u32;
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
                    restarted_at = 0;
                }
                Op::Reset(_) => restarted_at = 0,
                Op::Failure(t, k) if failure_of(t, k).kind == FailureKind::Canceled => {
                    // F4: a clean cancel.
                    prop_assert_eq!(flow.status(), FlowStatus::Idle);
                    prop_assert_eq!((flow.streak(), flow.next_eligible()), (before.streak(), before.next_eligible()));
                }
                Op::Failure(t, k) => {
                    let kind = failure_of(t, k).kind;
                    let streak = before.streak() + 1;
                    prop_assert_eq!(flow.streak(), streak);
                    let hint = match kind {
                        FailureKind::Hinted(Hint::After(hint)) => Some(hint),
                        _ => None,
                    };
                    let expected_trip = match kind {
                        FailureKind::Fatal => Some(TripReason::Fatal),
                        FailureKind::Hinted(Hint::DoNotRetry) => Some(TripReason::DoNotRetry),
                        _ if policy.trip_after().is_some_and(|n| streak >= n) => Some(TripReason::Streak),
                        _ => hint.filter(|h| *h > policy.max_hint()).map(|h| TripReason::Deferred { retry_at: now + h }),
                    };
                    match flow.status() {
                        FlowStatus::Tripped { streak: s, last_error, reason } => {
                            prop_assert_eq!(Some(reason), expected_trip);
                            prop_assert_eq!((s, *last_error), (streak, t as u32));
                            prop_assert_eq!(flow.next_eligible(), None);
                        }
                        FlowStatus::Backoff { until, streak: s, last_error } => {
                            prop_assert_eq!(expected_trip, None);
                            prop_assert_eq!((s, *last_error), (streak, t as u32));
                            prop_assert_eq!(flow.next_eligible(), Some(until));
                            prop_assert!(until >= now);
                            let delay = until.saturating_duration_since(now);
                            if let Some(hint) = hint {
                                prop_assert_eq!(delay, hint, "the window is exactly the hint (B6)");
                                if policy.restarts_after_hint() {
                                    restarted_at = streak;
                                }
                            } else {
                                prop_assert!(delay <= policy.backoff().max_delay());
                                if policy.backoff().jitter_kind() == Jitter::None {
                                    prop_assert_eq!(delay, policy.backoff().envelope(streak - restarted_at));
                                }
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
        Op::Failure(t, k) => Op::Failure(step(t), k),
        Op::Cancel(t) => Op::Cancel(step(t)),
        Op::Reset(t) => Op::Reset(step(t)),
    }
}
