//! Rules X1–X5 on the hedging machine, and G12 (a refused input changes nothing).

mod common;
use common::drain;

use core::time::Duration;

use persevere::{
    Failure, FailureClass, Hedge, HedgeAction, HedgeError, HedgePolicy, HedgeStats, Instant, LastFailure, Outcome,
    OutcomeKind, PolicyError,
};
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn policy(max_attempts: u32, delay_ms: u64) -> HedgePolicy {
    HedgePolicy::builder(max_attempts, ms(delay_ms)).build().unwrap()
}

/// Drains `h`, which must hold exactly its finish.
fn finish<E: core::fmt::Debug>(h: &mut Hedge<E>) -> (Outcome<E>, HedgeStats) {
    let mut actions = drain(h);
    match (actions.pop(), actions.is_empty()) {
        (Some(HedgeAction::Finish { outcome, stats }), true) => (outcome, stats),
        other => panic!("expected the finish alone: {other:?} after {actions:?}"),
    }
}

/// `handle_timeout` at `ms` (a hedge draws no jitter: any RNG will do).
fn wake<E>(h: &mut Hedge<E>, p: &HedgePolicy, ms: u64) {
    h.handle_timeout(p, at(ms));
}

fn starts(attempts: &[u64]) -> Vec<HedgeAction<&'static str>> {
    attempts.iter().map(|&attempt| HedgeAction::Start { attempt }).collect()
}

/// A hedge under `p` (a delay of 100 ms) with attempts 1 and 2 started, at 0 and 100 ms, and
/// drained.
fn two_started(p: &HedgePolicy) -> Hedge<&'static str> {
    let mut h = Hedge::new();
    h.handle_start(p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    wake(&mut h, p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    h
}

/// A hedge under `p` (a delay of 100 ms) with attempts 1, 2 and 3 started, at 0, 100 and
/// 200 ms, and drained.
fn three_started(p: &HedgePolicy) -> Hedge<&'static str> {
    let mut h = two_started(p);
    wake(&mut h, p, 200);
    assert_eq!(drain(&mut h), starts(&[3]));
    h
}

/// The crate's vocabulary: an early or repeated `handle_timeout` changes nothing, not even the
/// machine's `now` (an early call used to move it on, and with it the operation's elapsed time).
#[test]
fn an_early_or_repeated_hedge_timeout_changes_nothing() {
    let p = policy(3, 100);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    let waiting = h.clone();
    wake(&mut h, &p, 99);
    assert_eq!(h, waiting, "early for attempt 2");
    wake(&mut h, &p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    let started = h.clone();
    wake(&mut h, &p, 100);
    assert_eq!(h, started, "repeated");
    wake(&mut h, &p, 199);
    assert_eq!(h, started, "early for attempt 3");
    assert_eq!(h.stats().elapsed, ms(100));
}

#[test]
fn x1_attempts_start_hedging_delay_apart_up_to_max_attempts() {
    let p = policy(3, 100);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    assert_eq!(h.poll_timeout(), Some(at(100)));
    wake(&mut h, &p, 99);
    assert_eq!(drain(&mut h), starts(&[]), "early: nothing");
    wake(&mut h, &p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    // Told late: the third starts when told, not at its time, and none follows it.
    wake(&mut h, &p, 450);
    assert_eq!(drain(&mut h), starts(&[3]));
    assert_eq!(h.poll_timeout(), None, "max_attempts reached");
    wake(&mut h, &p, 10_000);
    assert_eq!(drain(&mut h), starts(&[]));
    assert_eq!((h.started(), h.in_flight()), (3, 3));

    // A zero delay starts every attempt at once (gRPC's default hedgingDelay).
    let mut all = Hedge::<&str>::new();
    all.handle_start(&policy(4, 0), at(0)).unwrap();
    assert_eq!(drain(&mut all), starts(&[1, 2, 3, 4]));
}

#[test]
fn x2_the_first_success_wins_and_every_other_attempt_in_flight_is_cancelled() {
    let p = policy(3, 100);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    wake(&mut h, &p, 100);
    // Inputs wait for the drain (and a timeout does nothing meanwhile).
    assert_eq!(h.handle_success(at(100), 1), Err(HedgeError::Undrained));
    wake(&mut h, &p, 200);
    assert_eq!(drain(&mut h), starts(&[2]));
    wake(&mut h, &p, 200);
    assert_eq!(drain(&mut h), starts(&[3]));
    h.handle_success(at(250), 2).unwrap();
    assert_eq!(
        drain(&mut h),
        [
            HedgeAction::Cancel { attempt: 1 },
            HedgeAction::Cancel { attempt: 3 },
            HedgeAction::Finish {
                outcome: Outcome::Succeeded,
                stats: HedgeStats { started: 3, canceled: 2, winner: Some(2), elapsed: ms(250) }
            },
        ]
    );
    // A result that still arrives for a cancelled attempt is refused and changes nothing.
    let before = h.clone();
    assert_eq!(h.handle_success(at(260), 1), Err(HedgeError::Finished(OutcomeKind::Succeeded)));
    let refused = h.handle_failure(&p, at(260), 3, Failure::retryable("late")).unwrap_err();
    assert_eq!(refused.input.error, "late", "handed back");
    assert_eq!(h, before);
}

#[test]
fn x3_a_fatal_failure_ends_hedging_at_once_and_cancels_the_rest() {
    let p = policy(3, 100);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    wake(&mut h, &p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    h.handle_failure(&p, at(120), 2, Failure::fatal("invalid")).unwrap();
    let actions = drain(&mut h);
    assert_eq!(actions[0], HedgeAction::Cancel { attempt: 1 });
    assert_eq!(
        actions[1],
        HedgeAction::Finish {
            outcome: Outcome::Fatal { failure: LastFailure { class: FailureClass::Fatal, error: Some("invalid") } },
            stats: HedgeStats { started: 2, canceled: 1, winner: None, elapsed: ms(120) },
        }
    );
    assert_eq!(h.poll_timeout(), None, "no third attempt");
}

#[test]
fn x3_a_non_fatal_failure_starts_the_next_hedge_at_once_or_at_its_time() {
    let mut h = Hedge::<&str>::new();
    let p = policy(3, 100);
    h.handle_start(&p, at(0)).unwrap();
    drain(&mut h);
    h.handle_failure(&p, at(30), 1, Failure::retryable("busy")).unwrap();
    assert_eq!(drain(&mut h), starts(&[2]), "at once, not at 100 ms");
    assert_eq!(h.poll_timeout(), Some(at(130)), "the next one delay after this one");

    let waits = HedgePolicy::builder(3, ms(100)).next_on_failure(false).build().unwrap();
    let mut h = Hedge::<&str>::new();
    h.handle_start(&waits, at(0)).unwrap();
    drain(&mut h);
    h.handle_failure(&waits, at(30), 1, Failure::retryable("busy")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]), "nothing runs, and the next waits for its time");
    wake(&mut h, &waits, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    // Every attempt failing ends the operation exhausted, with the last failure.
    h.handle_failure(&waits, at(150), 2, Failure::retryable("busy")).unwrap();
    wake(&mut h, &waits, 200);
    assert_eq!(drain(&mut h), starts(&[3]));
    h.handle_failure(&waits, at(210), 3, Failure::timeout("slow")).unwrap();
    let (outcome, stats) = finish(&mut h);
    assert_eq!(
        outcome,
        Outcome::Exhausted { last_failure: LastFailure { class: FailureClass::Timeout, error: Some("slow") } }
    );
    assert_eq!((stats.started, stats.canceled, stats.winner), (3, 0, None));
}

#[test]
fn x3_pushback_delays_the_next_hedge_never_shortening_it_and_stops_it_past_max_hint() {
    let p = HedgePolicy::builder(3, ms(100)).max_hint(ms(1_000)).build().unwrap();
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    drain(&mut h);
    // Pushback of 400 ms from attempt 1: the next hedge waits for it, even after a failure.
    h.handle_failure(&p, at(50), 1, Failure::retry_after(ms(400), "later")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]));
    assert_eq!(h.poll_timeout(), Some(at(450)));
    wake(&mut h, &p, 450);
    assert_eq!(drain(&mut h), starts(&[2]));
    // A pushback past max_hint stops further hedges; the operation ends Deferred once nothing runs.
    h.handle_failure(&p, at(500), 2, Failure::retry_after(ms(5_000), "much later")).unwrap();
    let (outcome, stats) = finish(&mut h);
    assert_eq!(outcome.kind(), OutcomeKind::Deferred);
    assert_eq!(outcome.retry_at(), Some(at(5_500)));
    assert_eq!(stats.started, 2);

    // "Do not retry" stops further hedges but lets the running ones answer.
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    wake(&mut h, &p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    h.handle_failure(&p, at(120), 1, Failure::do_not_retry("stop")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]));
    assert_eq!(h.poll_timeout(), None);
    h.handle_success(at(130), 2).unwrap();
    let (outcome, stats) = finish(&mut h);
    assert_eq!((outcome, stats.winner), (Outcome::Succeeded, Some(2)));
}

/// Found in review: a plain failure after a pushback started the next hedge at once, cutting
/// the pushback short; and the outcome of a stop named a later failure instead of the pushback.
#[test]
fn x3_a_pushback_holds_off_every_later_start_and_is_the_outcome_it_stops_with() {
    let p = HedgePolicy::builder(3, ms(100)).max_hint(ms(1_000)).build().unwrap();
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut h), starts(&[1]));
    wake(&mut h, &p, 100);
    assert_eq!(drain(&mut h), starts(&[2]));
    h.handle_failure(&p, at(120), 1, Failure::retry_after(ms(400), "later")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]));
    // Attempt 2 fails plainly: the next hedge still waits for the pushback (520 ms).
    h.handle_failure(&p, at(130), 2, Failure::retryable("reset")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]));
    assert_eq!(h.poll_timeout(), Some(at(520)));
    wake(&mut h, &p, 520);
    assert_eq!(drain(&mut h), starts(&[3]));

    // Told not to retry by attempt 1, then attempt 2 fails plainly: the outcome is the
    // "do not retry" (Fatal), not the later failure.
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    drain(&mut h);
    wake(&mut h, &p, 100);
    drain(&mut h);
    h.handle_failure(&p, at(110), 1, Failure::do_not_retry("stop")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]));
    h.handle_failure(&p, at(120), 2, Failure::retryable("reset")).unwrap();
    let (outcome, _) = finish(&mut h);
    assert_eq!(
        outcome,
        Outcome::Fatal { failure: LastFailure { class: FailureClass::DoNotRetry, error: Some("stop") } }
    );
}

/// Found in review: a hedge running for a while could be "refused", dropped from the count
/// with no cancel. Only the starts of the latest input may be refused.
#[test]
fn x4_only_a_hedge_the_latest_input_started_may_be_refused() {
    let p = policy(3, 100);
    let mut h = two_started(&p);
    // Another input since attempt 2 started (an early timeout is none: it changes nothing).
    // It starts attempt 3 at once (next on failure).
    h.handle_failure(&p, at(150), 1, Failure::retryable("lost")).unwrap();
    assert_eq!(drain(&mut h), starts(&[3]));
    let before = h.clone();
    assert_eq!(h.handle_rejected(at(150), 2), Err(HedgeError::NothingToReject { attempt: 2 }));
    assert_eq!(h, before);
}

#[test]
fn x4_a_refused_hedge_stops_further_hedges_but_not_those_in_flight() {
    let p = policy(4, 0);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&p, at(0)).unwrap();
    // The budget refuses hedge 3: neither it nor 4 starts.
    assert_eq!(drain(&mut h), starts(&[1, 2, 3, 4]));
    let before = h.clone();
    assert_eq!(h.handle_rejected(at(0), 1), Err(HedgeError::NothingToReject { attempt: 1 }));
    assert_eq!(h, before, "the first attempt is not a hedge");
    h.handle_rejected(at(0), 3).unwrap();
    assert_eq!((h.started(), h.in_flight()), (2, 2));
    assert_eq!(drain(&mut h), starts(&[]));
    h.handle_failure(&p, at(10), 1, Failure::retryable("busy")).unwrap();
    assert_eq!(drain(&mut h), starts(&[]), "no hedge after a refusal, even on a non-fatal failure");
    h.handle_failure(&p, at(20), 2, Failure::retryable("busy")).unwrap();
    let (outcome, stats) = finish(&mut h);
    assert_eq!(outcome.kind(), OutcomeKind::Rejected);
    assert_eq!((stats.started, stats.canceled), (2, 0));
}

#[test]
fn x5_invalid_policies_and_misuse_are_refused() {
    assert!(matches!(HedgePolicy::builder(0, ms(1)).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(HedgePolicy::builder(17, ms(1)).build(), Err(PolicyError::LimitTooLarge { max: 16, .. })));
    assert!(HedgePolicy::builder(16, ms(1)).build().is_ok(), "the limit itself is allowed");
    assert!(matches!(HedgePolicy::builder(2, Duration::MAX).build(), Err(PolicyError::DurationOverflow { .. })));
    let p = policy(2, 10);
    let mut h = Hedge::<()>::new();
    assert_eq!(h.handle_success(at(0), 1), Err(HedgeError::NotStarted));
    assert_eq!(h.handle_cancel(at(0)), Err(HedgeError::NotStarted));
    h.handle_start(&p, at(0)).unwrap();
    assert_eq!(h.handle_start(&p, at(0)), Err(HedgeError::AlreadyStarted));
    drain(&mut h);
    for attempt in [0, 2, 17, u64::MAX] {
        let before = h.clone();
        assert_eq!(h.handle_success(at(1), attempt), Err(HedgeError::NotInFlight { attempt }));
        assert_eq!(h, before);
    }
    h.handle_cancel(at(5)).unwrap();
    let actions = drain(&mut h);
    assert_eq!(actions[0], HedgeAction::Cancel { attempt: 1 });
    assert!(matches!(actions[1], HedgeAction::Finish { outcome: Outcome::Canceled { last_failure: None }, .. }));
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Timeout(u64),
    Success(u8),
    Failure(u8, u8),
    Reject,
    Cancel,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..300).prop_map(Op::Timeout),
        1 => any::<u8>().prop_map(Op::Success),
        4 => (any::<u8>(), 0u8..7).prop_map(|(pick, kind)| Op::Failure(pick, kind)),
        1 => Just(Op::Reject),
        1 => Just(Op::Cancel),
    ]
}

/// What the driver has seen, kept beside the machine by the property below.
#[derive(Default)]
struct Seen {
    running: Vec<u64>,
    /// (attempt, started at ms)
    started: Vec<(u64, u64)>,
    canceled: u64,
    refused: u64,
    failed_since_start: bool,
    finishes: u32,
}

/// Drains `h` at `now`, checking each output against what was seen.
fn apply(h: &mut Hedge<u8>, now: u64, seen: &mut Seen, max: u32, delay: u64) -> Result<(), TestCaseError> {
    while let Some(action) = h.poll_action() {
        prop_assert!(seen.finishes == 0, "an output after the finish");
        match action {
            HedgeAction::Start { attempt } => {
                prop_assert_eq!(attempt, seen.started.len() as u64 + 1 + seen.refused, "in order");
                prop_assert!(attempt <= u64::from(max));
                if let Some(&(_, previous)) = seen.started.last() {
                    prop_assert!(
                        seen.failed_since_start || now >= previous + delay,
                        "started {} ms after the previous",
                        now - previous
                    );
                }
                seen.started.push((attempt, now));
                seen.running.push(attempt);
                seen.failed_since_start = false;
            }
            HedgeAction::Cancel { attempt } => {
                prop_assert!(seen.running.contains(&attempt), "cancel of {} which does not run", attempt);
                seen.running.retain(|&a| a != attempt);
                seen.canceled += 1;
            }
            HedgeAction::Finish { outcome, stats } => {
                prop_assert!(seen.running.is_empty(), "finished with {:?} still running", seen.running);
                prop_assert_eq!(stats.started, seen.started.len() as u64);
                prop_assert_eq!(stats.canceled, seen.canceled);
                prop_assert_eq!(stats.winner.is_some(), outcome == Outcome::Succeeded);
                seen.finishes += 1;
            }
        }
    }
    Ok(())
}

/// A policy reads back its `next_on_failure` (on by default), and a hint of exactly
/// `max_hint` is waited, not deferred (B6); only one past it ends the operation. Kills the
/// cargo-mutants survivors `next_on_failure` → `true`, `> max_hint` → `>=` and the hinted
/// instant's `- now` → `+ now` in `handle_failure`.
#[test]
fn x3_b6_a_hint_of_exactly_max_hint_is_waited_and_one_past_it_defers() {
    assert!(policy(3, 100).next_on_failure());
    assert!(!HedgePolicy::builder(3, ms(100)).next_on_failure(false).build().unwrap().next_on_failure());
    let p = HedgePolicy::builder(3, ms(100)).max_hint(ms(500)).build().unwrap();
    for (hint_ms, deferred) in [(499, false), (500, false), (501, true)] {
        let mut h = Hedge::<&str>::new();
        h.handle_start(&p, at(1_000)).unwrap();
        drain(&mut h);
        wake(&mut h, &p, 1_100);
        assert_eq!(drain(&mut h), starts(&[2]));
        let hint = persevere::FailureKind::Hinted(persevere::Hint::After(ms(hint_ms)));
        h.handle_failure(&p, at(1_100), 1, Failure::new(hint, "busy")).unwrap();
        assert_eq!(drain(&mut h), starts(&[]), "a hint of {hint_ms} ms");
        if deferred {
            // No attempt starts again; the running one decides the outcome.
            assert_eq!(h.poll_timeout(), None, "a hint of {hint_ms} ms");
        } else {
            assert_eq!(h.poll_timeout(), Some(at(1_100 + hint_ms)), "a hint of {hint_ms} ms");
        }
    }
}

/// A failure is kept as the last one and a canceled attempt ends the operation `Canceled`
/// (kills `last_failure` and `finished` → `None` and the deleted `Canceled` arm of
/// `handle_failure`), a refusal of hedge 2 itself is taken (kills `attempt < 2` → `<= 2` in
/// `handle_rejected`), and a timeout after the outcome changes nothing (kills `||` → `&&` in
/// `handle_timeout`'s guard).
#[test]
fn x4_x5_a_canceled_attempt_ends_it_hedge_two_can_be_refused_and_a_late_timeout_does_nothing() {
    let p = policy(3, 100);
    let mut h = two_started(&p);
    h.handle_failure(&p, at(100), 2, Failure::retryable("busy")).unwrap();
    drain(&mut h);
    assert_eq!(h.last_failure(), Some(&LastFailure { class: FailureClass::Retryable, error: Some("busy") }));
    assert_eq!(h.finished(), None);
    h.handle_failure(&p, at(110), 1, Failure::new(persevere::FailureKind::Canceled, "stop")).unwrap();
    assert_eq!(h.finished(), Some(OutcomeKind::Canceled));
    // Attempt 3 started at once on attempt 2's failure (`next_on_failure`); it is canceled.
    let actions = drain(&mut h);
    assert!(
        matches!(
            actions.as_slice(),
            [HedgeAction::Cancel { attempt: 3 }, HedgeAction::Finish { outcome: Outcome::Canceled { .. }, .. }]
        ),
        "{actions:?}"
    );
    let done = h.clone();
    wake(&mut h, &p, 10_000);
    assert_eq!(h, done, "a timeout after the outcome");

    let mut r = two_started(&p);
    assert_eq!(r.handle_rejected(at(100), 2), Ok(()));
    assert_eq!((r.started(), r.in_flight()), (1, 1));
}

/// All sixteen attempts can run and be answered, and an answer for no attempt in flight is
/// refused (kills `attempt > MAX_HEDGED_ATTEMPTS` → `>=` / `==` in `check`; its first `||` →
/// `&&` is equivalent, as an attempt out of range has no bit in flight);
/// a state driven under a policy with fewer attempts starts no more than that policy allows
/// (kills `started < max` → `<=` in `advance`; its twin on `next_at` is equivalent, since the
/// end of `advance` clears it whenever the limit is reached).
#[test]
fn x1_x5_sixteen_attempts_are_answered_and_a_smaller_policy_starts_no_more() {
    let all = policy(16, 0);
    let mut h = Hedge::<&str>::new();
    h.handle_start(&all, at(0)).unwrap();
    assert_eq!(drain(&mut h).len(), 16);
    for attempt in [0, 17] {
        assert_eq!(h.handle_success(at(1), attempt), Err(HedgeError::NotInFlight { attempt }));
    }
    assert_eq!(h.handle_success(at(1), 16), Ok(()));

    let (four, three) = (policy(4, 100), policy(3, 100));
    let mut h = three_started(&four);
    assert_eq!(h.poll_timeout(), Some(at(300)), "a fourth attempt is due under four");
    wake(&mut h, &three, 300);
    assert_eq!(drain(&mut h), starts(&[]), "none under three");
    assert_eq!(h.started(), 3);
}

/// Found in review: a hedge whose every attempt had failed, woken for its next hedge under a
/// policy that allows no more, started nothing and waited for ever (no attempt, no timer, no
/// outcome). It ends `Exhausted` there.
#[test]
fn x5_a_hedge_woken_under_a_policy_that_allows_no_more_attempts_ends() {
    let four = HedgePolicy::builder(4, ms(100)).next_on_failure(false).build().unwrap();
    let three = HedgePolicy::builder(3, ms(100)).next_on_failure(false).build().unwrap();
    let mut h = three_started(&four);
    for attempt in 1..=3 {
        h.handle_failure(&four, at(250), attempt, Failure::retryable("down")).unwrap();
        assert_eq!(drain(&mut h), starts(&[]));
    }
    assert_eq!(h.poll_timeout(), Some(at(300)), "attempt 4 is due under four");
    wake(&mut h, &three, 300);
    let (outcome, stats) = finish(&mut h);
    assert_eq!(
        outcome,
        Outcome::Exhausted { last_failure: LastFailure { class: FailureClass::Retryable, error: Some("down") } }
    );
    assert_eq!(stats.started, 3);
    assert_eq!(h.poll_timeout(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// X1, X2, X5 and G12 against a record kept beside the machine: attempts start in order,
    /// never more than `max_attempts`, never two starts closer than `delay` unless a failure
    /// came between; exactly one outcome, after which nothing is output or accepted; at the
    /// outcome every attempt still running has been told to cancel, and the statistics agree
    /// with what was seen; a refused input changes nothing; followed to the end, it never
    /// wedges.
    #[test]
    fn x5_exactly_one_outcome_and_every_running_attempt_cancelled(
        max in 1u32..=6,
        delay in 0u64..200,
        next_on_failure in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let p = HedgePolicy::builder(max, ms(delay)).next_on_failure(next_on_failure).max_hint(ms(500)).build().unwrap();
        let mut h = Hedge::<u8>::new();
        let mut now = 0u64;
        let mut seen = Seen::default();
        h.handle_start(&p, at(now)).unwrap();
        apply(&mut h, now, &mut seen, max, delay)?;
        for op in ops {
            let before = h.clone();
            let pick_running = |pick: u8, seen: &Seen| {
                seen.running.get(pick as usize % seen.running.len().max(1)).copied().unwrap_or(u64::from(pick))
            };
            let accepted = match op {
                Op::Timeout(d) => {
                    now += d;
                    wake(&mut h, &p, now);
                    true
                }
                Op::Success(pick) => {
                    let attempt = pick_running(pick, &seen);
                    let ok = h.handle_success(at(now), attempt).is_ok();
                    if ok {
                        seen.running.retain(|&a| a != attempt);
                    }
                    ok
                }
                Op::Failure(pick, kind) => {
                    let attempt = pick_running(pick, &seen);
                    let failure = match kind {
                        0 => Failure::fatal(kind),
                        1 => Failure::do_not_retry(kind),
                        2 => Failure::retry_after(ms(u64::from(pick) * 4), kind),
                        3 => Failure::canceled(kind),
                        _ => Failure::retryable(kind),
                    };
                    let ok = h.handle_failure(&p, at(now), attempt, failure).is_ok();
                    if ok {
                        seen.running.retain(|&a| a != attempt);
                        seen.failed_since_start = true;
                    }
                    ok
                }
                Op::Reject => match seen.running.last().copied() {
                    Some(newest) if newest >= 2 => {
                        let ok = h.handle_rejected(at(now), newest).is_ok();
                        if ok {
                            seen.running.retain(|&a| a != newest);
                            seen.started.retain(|&(a, _)| a != newest);
                            seen.refused += 1;
                        }
                        ok
                    }
                    _ => h.handle_rejected(at(now), 1).is_ok(),
                },
                Op::Cancel => h.handle_cancel(at(now)).is_ok(),
            };
            if !accepted {
                prop_assert_eq!(&h, &before, "G12: a refused input changes nothing");
            }
            apply(&mut h, now, &mut seen, max, delay)?;
            prop_assert_eq!(seen.running.len() as u32, h.in_flight());
        }
        // Driven to the end: answer every running attempt with a failure and follow the timer.
        for _ in 0..64 {
            if seen.finishes == 1 {
                break;
            }
            if let Some(&attempt) = seen.running.first() {
                h.handle_failure(&p, at(now), attempt, Failure::retryable(0)).unwrap();
                seen.running.remove(0);
                seen.failed_since_start = true;
            } else {
                let due = h.poll_timeout().expect("nothing runs and nothing is due: a wedge");
                now = now.max(due.as_nanos().div_ceil(1_000_000));
                wake(&mut h, &p, now);
            }
            apply(&mut h, now, &mut seen, max, delay)?;
        }
        prop_assert_eq!(seen.finishes, 1, "exactly one outcome");
    }
}

#[test]
fn b6_a_hedge_policy_reads_max_hint_as_every_policy_does() {
    let any = HedgePolicy::builder(3, Duration::from_millis(10)).max_hint(Duration::MAX).build().unwrap();
    assert_eq!(any.max_hint(), Duration::MAX, "Duration::MAX honours any hint");
    let retry = persevere::RetryPolicy::builder(persevere::Backoff::constant(Duration::ZERO).build().unwrap())
        .max_attempts(3)
        .max_hint(Duration::MAX)
        .build()
        .unwrap();
    assert_eq!(any.max_hint(), retry.max_hint(), "as a retry policy reads it");
    let zero = HedgePolicy::builder(3, Duration::from_millis(10)).max_hint(Duration::ZERO).build();
    assert!(matches!(zero, Err(persevere::PolicyError::Zero { setting: "max_hint", .. })), "{zero:?}");
}
