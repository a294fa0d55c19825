//! Rules R1–R6 and B6 on the retry machine, and G12 (a refused input changes nothing).

use core::time::Duration;

use persevere::{
    Action, Backoff, Failure, FailureClass, Instant, Jitter, LastFailure, Outcome, OutcomeKind, Retry, RetryError,
    RetryPolicy, RetryStatus,
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
    ChaCha8Rng::seed_from_u64(11)
}

/// Constant 100 ms delays, no jitter, with the given limits.
fn policy(configure: impl FnOnce(persevere::RetryPolicyBuilder) -> persevere::RetryPolicyBuilder) -> RetryPolicy {
    configure(RetryPolicy::builder(Backoff::constant(ms(100)).build().unwrap())).build().unwrap()
}

fn drain<E>(retry: &mut Retry<E>) -> Vec<Action<E>> {
    core::iter::from_fn(|| retry.poll_action()).collect()
}

fn lf(class: FailureClass, error: u32) -> LastFailure<u32> {
    LastFailure { class, error: Some(error) }
}

/// Fails every attempt with `failure(attempt)`, sleeping exactly as told, and returns the
/// whole action trace.
fn run_failing(policy: &RetryPolicy, failure: impl Fn(u32) -> Failure<u32>) -> (Vec<Action<u32>>, Instant) {
    let mut r = rng();
    let mut retry = Retry::new();
    let mut now = at(0);
    let mut trace = Vec::new();
    retry.handle_start(policy, now).unwrap();
    for _ in 0..1_000 {
        let actions = drain(&mut retry);
        let mut started = None;
        for a in &actions {
            if let Action::Start { attempt, .. } = a {
                started = Some(*attempt);
            }
        }
        let finished = actions.iter().any(|a| matches!(a, Action::Finish { .. }));
        trace.extend(actions);
        if finished {
            return (trace, now);
        }
        if let Some(attempt) = started {
            retry.handle_failure(policy, now, attempt, failure(attempt), &mut r).unwrap();
        } else {
            now = retry.poll_timeout().unwrap();
            retry.handle_timeout(policy, now, &mut r);
        }
    }
    panic!("did not finish");
}

fn finish(trace: &[Action<u32>]) -> (Outcome<u32>, persevere::Stats) {
    match trace.last() {
        Some(Action::Finish { outcome, stats }) => (*outcome, *stats),
        other => panic!("no finish: {other:?}"),
    }
}

fn starts(trace: &[Action<u32>]) -> Vec<u32> {
    trace.iter().filter_map(|a| if let Action::Start { attempt, .. } = a { Some(*attempt) } else { None }).collect()
}

#[test]
fn r1_attempts_are_numbered_from_one_and_never_overlap() {
    let p = policy(|b| b.max_attempts(4));
    let (trace, _) = run_failing(&p, Failure::retryable);
    assert_eq!(starts(&trace), vec![1, 2, 3, 4]);
    // Between two starts there is always a sleep: a start never follows a start.
    for pair in trace.windows(2) {
        assert!(!matches!(pair, [Action::Start { .. }, Action::Start { .. }]), "{pair:?}");
    }
}

#[test]
fn r1_a_second_result_for_the_same_attempt_is_refused() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    retry.handle_failure(&p, at(1), 1, Failure::retryable(1), &mut r).unwrap();
    let err = retry.handle_failure(&p, at(2), 1, Failure::retryable(9), &mut r).unwrap_err();
    assert_eq!(err.error, RetryError::NoAttemptRunning);
    assert_eq!(err.failure, Failure::retryable(9), "the refused failure is handed back");
    assert_eq!(retry.handle_success(at(2), 1), Err(RetryError::NoAttemptRunning));
}

#[test]
fn r2_fatal_canceled_and_do_not_retry_are_never_retried() {
    let p = policy(|b| b.max_attempts(10));
    let (trace, _) = run_failing(&p, Failure::fatal);
    assert_eq!(finish(&trace).0, Outcome::Fatal { failure: lf(FailureClass::Fatal, 1) });
    let (trace, _) = run_failing(&p, Failure::canceled);
    assert_eq!(finish(&trace).0, Outcome::Canceled { last_failure: Some(lf(FailureClass::Canceled, 1)) });
    let (trace, _) = run_failing(&p, Failure::do_not_retry);
    assert_eq!(finish(&trace).0, Outcome::Fatal { failure: lf(FailureClass::DoNotRetry, 1) });
    for trace in [run_failing(&p, Failure::fatal).0, run_failing(&p, Failure::canceled).0] {
        assert_eq!(starts(&trace), vec![1]);
        assert!(!trace.iter().any(|a| matches!(a, Action::Sleep { .. })));
    }
}

#[test]
fn r2_timeouts_panics_and_retry_after_are_retried() {
    let p = policy(|b| b.max_attempts(3));
    for failure in [Failure::timeout as fn(u32) -> Failure<u32>, Failure::panicked, Failure::retryable] {
        let (trace, _) = run_failing(&p, failure);
        assert_eq!(starts(&trace), vec![1, 2, 3]);
        assert_eq!(finish(&trace).0.kind(), OutcomeKind::Exhausted);
    }
    let (trace, end) = run_failing(&p, |a| Failure::retry_after(ms(250), a));
    assert_eq!(starts(&trace), vec![1, 2, 3]);
    assert_eq!(end, at(500), "two hinted sleeps of 250 ms, not the schedule's 100 ms");
    assert_eq!(finish(&trace).0, Outcome::Exhausted { last_failure: lf(FailureClass::RetryAfter, 3) });
}

#[test]
fn r3_max_attempts_counts_the_first_attempt() {
    let (trace, _) = run_failing(&policy(|b| b.max_attempts(1)), Failure::retryable);
    assert_eq!(starts(&trace), vec![1]);
    let (trace, _) = run_failing(&policy(|b| b.max_attempts(5)), Failure::retryable);
    assert_eq!(finish(&trace).1.attempts, 5);
}

#[test]
fn r3_max_retries_of_three_allows_four_failed_attempts() {
    let (trace, _) = run_failing(&policy(|b| b.max_retries(3)), Failure::retryable);
    assert_eq!(starts(&trace), vec![1, 2, 3, 4]);
    assert_eq!(finish(&trace).0, Outcome::Exhausted { last_failure: lf(FailureClass::Retryable, 4) });
    let (trace, _) = run_failing(&policy(|b| b.max_retries(0)), Failure::retryable);
    assert_eq!(starts(&trace), vec![1]);
}

#[test]
fn r3_the_total_budget_stops_a_sleep_that_would_end_past_it() {
    // Budget 250 ms, delays 100 ms, attempts take no time: starts at 0, 100, 200; the sleep
    // to 300 would overrun.
    let p = policy(|b| b.total(ms(250)));
    let (trace, end) = run_failing(&p, Failure::retryable);
    assert_eq!(starts(&trace), vec![1, 2, 3]);
    assert_eq!(end, at(200));
    assert_eq!(finish(&trace).0.kind(), OutcomeKind::OutOfTime);
    // A sleep ending exactly at the budget is allowed.
    let (trace, _) = run_failing(&policy(|b| b.total(ms(200))), Failure::retryable);
    assert_eq!(starts(&trace), vec![1, 2, 3]);
}

#[test]
fn r3_the_total_budget_never_cuts_a_running_attempt() {
    let p = policy(|b| b.total(ms(50)));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Start { attempt: 1, deadline: None }]);
    assert_eq!(retry.poll_timeout(), None, "the budget sets no deadline on the attempt");
    retry.handle_timeout(&p, at(10_000), &mut r);
    assert_eq!(retry.status(), RetryStatus::Running { attempt: 1, deadline: None });
    retry.handle_success(at(10_000), 1).unwrap();
    assert_eq!(finish(&drain(&mut retry)).0, Outcome::Succeeded);
}

#[test]
fn r3_an_attempt_past_its_deadline_is_abandoned_and_counts_as_a_timeout() {
    let p = policy(|b| b.attempt_timeout(ms(30)).max_attempts(2));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(5)).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Start { attempt: 1, deadline: Some(at(35)) }]);
    assert_eq!(retry.poll_timeout(), Some(at(35)));
    retry.handle_timeout(&p, at(34), &mut r);
    assert!(drain(&mut retry).is_empty(), "early: nothing happens");
    retry.handle_timeout(&p, at(35), &mut r);
    assert_eq!(
        drain(&mut retry),
        vec![Action::Abandon { attempt: 1 }, Action::Sleep { next_attempt: 2, delay: ms(100), until: at(135) }]
    );
    assert_eq!(retry.last_failure(), Some(&LastFailure { class: FailureClass::Timeout, error: None }));
    assert_eq!(
        retry.handle_success(at(36), 1),
        Err(RetryError::NoAttemptRunning),
        "a late result of the abandoned attempt is refused"
    );
    retry.handle_timeout(&p, at(135), &mut r);
    assert_eq!(drain(&mut retry), vec![Action::Start { attempt: 2, deadline: Some(at(165)) }]);
    retry.handle_timeout(&p, at(165), &mut r);
    let trace = drain(&mut retry);
    assert_eq!(trace[0], Action::Abandon { attempt: 2 });
    assert_eq!(
        finish(&trace).0,
        Outcome::Exhausted { last_failure: LastFailure { class: FailureClass::Timeout, error: None } }
    );
}

#[test]
fn r4_a_success_resets_the_failure_streak() {
    let p = policy(|b| b.max_attempts(5));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    retry.handle_failure(&p, at(0), 1, Failure::retryable(1), &mut r).unwrap();
    retry.handle_timeout(&p, at(100), &mut r);
    retry.handle_failure(&p, at(100), 2, Failure::retryable(2), &mut r).unwrap();
    assert_eq!(retry.streak(), 2);
    retry.handle_timeout(&p, at(200), &mut r);
    retry.handle_success(at(200), 3).unwrap();
    assert_eq!(retry.streak(), 0);
    assert_eq!(retry.last_failure(), None);
}

#[test]
fn r5_the_outcome_carries_attempts_time_asleep_and_elapsed_time() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(1_000)).unwrap();
    retry.handle_failure(&p, at(1_040), 1, Failure::retryable(1), &mut r).unwrap();
    retry.handle_timeout(&p, at(1_150), &mut r); // woke 10 ms late: slept 110 ms
    retry.handle_failure(&p, at(1_170), 2, Failure::retryable(2), &mut r).unwrap();
    retry.handle_timeout(&p, at(1_270), &mut r);
    retry.handle_success(at(1_300), 3).unwrap();
    let (outcome, stats) = finish(&drain(&mut retry));
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(stats, persevere::Stats { attempts: 3, slept: ms(210), elapsed: ms(300) });
}

#[test]
fn r5_exactly_one_finish_is_emitted_and_everything_after_it_is_refused() {
    let p = policy(|b| b.max_attempts(1));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    retry.handle_failure(&p, at(0), 1, Failure::retryable(7), &mut r).unwrap();
    let trace = drain(&mut retry);
    assert_eq!(trace.iter().filter(|a| matches!(a, Action::Finish { .. })).count(), 1);
    assert_eq!(retry.poll_action(), None);
    let done = RetryError::Finished(OutcomeKind::Exhausted);
    assert_eq!(retry.handle_start(&p, at(1)), Err(done));
    assert_eq!(retry.handle_success(at(1), 1), Err(done));
    assert_eq!(retry.handle_cancel(at(1)), Err(done));
    assert_eq!(retry.handle_rejected(at(1)), Err(done));
    assert_eq!(retry.handle_failure(&p, at(1), 1, Failure::retryable(8), &mut r).unwrap_err().error, done);
    let before = retry;
    retry.handle_timeout(&p, at(1_000_000), &mut r);
    assert_eq!(retry, before);
    assert_eq!(retry.poll_timeout(), None);
}

#[test]
fn r6_the_timeline_is_start_result_sleep_start_finish() {
    let p = policy(|b| b.max_attempts(2));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    assert_eq!(retry.poll_timeout(), None);
    retry.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Start { attempt: 1, deadline: None }]);
    retry.handle_failure(&p, at(20), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 2, delay: ms(100), until: at(120) }]);
    assert_eq!(retry.poll_timeout(), Some(at(120)));
    assert_eq!(retry.status(), RetryStatus::Sleeping { next_attempt: 2, until: at(120) });
    retry.handle_timeout(&p, at(119), &mut r);
    assert_eq!(retry.poll_action(), None);
    retry.handle_timeout(&p, at(120), &mut r);
    retry.handle_timeout(&p, at(120), &mut r); // twice: nothing more
    assert_eq!(drain(&mut retry), vec![Action::Start { attempt: 2, deadline: None }]);
    retry.handle_success(at(130), 2).unwrap();
    assert_eq!(finish(&drain(&mut retry)).0, Outcome::Succeeded);
}

#[test]
fn r6_a_zero_delay_schedules_a_sleep_that_is_already_due() {
    let p = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(2).build().unwrap();
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(7)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(7), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 2, delay: Duration::ZERO, until: at(7) }]);
    assert_eq!(retry.poll_timeout(), Some(at(7)), "due now: the driver needs no timer");
}

#[test]
fn b6_a_hint_is_clamped_by_max_hint() {
    let p = policy(|b| b.max_attempts(2).max_hint(ms(1_000)));
    let (trace, end) = run_failing(&p, |a| Failure::retry_after(Duration::from_secs(3_600), a));
    assert_eq!(end, at(1_000));
    assert!(trace.contains(&Action::Sleep { next_attempt: 2, delay: ms(1_000), until: at(1_000) }));
}

#[test]
fn b6_a_hint_is_clamped_by_the_remaining_budget() {
    let p = policy(|b| b.max_attempts(2).total(ms(400)));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(150), 1, Failure::retry_after(ms(10_000), 1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 2, delay: ms(250), until: at(400) }]);
}

#[test]
fn b6_a_hint_at_an_instant_waits_until_then_and_a_past_instant_means_now() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(100)).unwrap();
    drain(&mut retry);
    let hint = |t, e| Failure::new(persevere::FailureKind::Hinted(persevere::Hint::At(t)), e);
    retry.handle_failure(&p, at(100), 1, hint(at(175), 1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 2, delay: ms(75), until: at(175) }]);
    retry.handle_timeout(&p, at(175), &mut r);
    drain(&mut retry);
    retry.handle_failure(&p, at(180), 2, hint(at(3), 2), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 3, delay: Duration::ZERO, until: at(180) }]);
}

#[test]
fn b6_restart_after_hint_is_a_policy_option() {
    let exponential = Backoff::exponential(ms(100), 2.0).build().unwrap();
    let delays = |restart: bool| {
        let p = RetryPolicy::builder(exponential).max_attempts(4).restart_after_hint(restart).build().unwrap();
        let (trace, _) =
            run_failing(&p, |a| if a == 2 { Failure::retry_after(ms(5), a) } else { Failure::retryable(a) });
        trace
            .iter()
            .filter_map(|a| if let Action::Sleep { delay, .. } = a { Some(*delay) } else { None })
            .collect::<Vec<_>>()
    };
    assert_eq!(delays(false), vec![ms(100), ms(5), ms(400)], "the hint counts as a step of the schedule");
    assert_eq!(delays(true), vec![ms(100), ms(5), ms(100)], "the schedule starts over after the hint");
}

#[test]
fn cancel_abandons_a_running_attempt_and_finishes_canceled() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_cancel(at(5)).unwrap();
    let trace = drain(&mut retry);
    assert_eq!(trace[0], Action::Abandon { attempt: 1 });
    assert_eq!(finish(&trace).0, Outcome::Canceled { last_failure: None });
    // Canceled while asleep: the last failure is kept, nothing to abandon.
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    retry.handle_failure(&p, at(0), 1, Failure::retryable(4), &mut r).unwrap();
    drain(&mut retry);
    retry.handle_cancel(at(50)).unwrap();
    let trace = drain(&mut retry);
    assert_eq!(trace.len(), 1);
    assert_eq!(finish(&trace).0, Outcome::Canceled { last_failure: Some(lf(FailureClass::Retryable, 4)) });
}

#[test]
fn u4_a_refused_retry_finishes_rejected() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(0)).unwrap();
    assert_eq!(retry.handle_rejected(at(0)), Err(RetryError::NothingToReject));
    retry.handle_failure(&p, at(0), 1, Failure::retryable(3), &mut r).unwrap();
    drain(&mut retry);
    retry.handle_rejected(at(0)).unwrap();
    let (outcome, stats) = finish(&drain(&mut retry));
    assert_eq!(outcome, Outcome::Rejected { last_failure: lf(FailureClass::Retryable, 3) });
    assert_eq!(stats.attempts, 1);
}

#[test]
fn time_never_runs_backwards_inside_the_machine() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&p, at(500)).unwrap();
    drain(&mut retry);
    // A failure reported with an earlier clock is read as happening at 500.
    retry.handle_failure(&p, at(100), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![Action::Sleep { next_attempt: 2, delay: ms(100), until: at(600) }]);
    retry.handle_timeout(&p, at(650), &mut r);
    retry.handle_success(at(0), 2).unwrap();
    let (_, stats) = finish(&drain(&mut retry));
    assert_eq!(stats.elapsed, ms(150));
}

#[test]
fn retry_policy_errors_are_clear() {
    let b = Backoff::constant(ms(1)).build().unwrap();
    let e = |x: persevere::RetryPolicyBuilder| x.build().unwrap_err();
    use persevere::PolicyError::*;
    assert!(matches!(e(RetryPolicy::builder(b).max_attempts(0)), Zero { setting: "max_attempts", .. }));
    assert!(matches!(e(RetryPolicy::builder(b).max_retries(u32::MAX)), LimitTooLarge { .. }));
    assert!(matches!(e(RetryPolicy::builder(b).max_retries(1).max_attempts(2)), Conflict { .. }));
    assert!(matches!(e(RetryPolicy::builder(b).total(Duration::ZERO)), Zero { setting: "total", .. }));
    assert!(matches!(e(RetryPolicy::builder(b).attempt_timeout(Duration::ZERO)), Zero { .. }));
    assert!(matches!(e(RetryPolicy::builder(b).max_hint(Duration::ZERO)), Zero { .. }));
    let unlimited = RetryPolicy::builder(b).total(Duration::MAX).attempt_timeout(Duration::MAX).build().unwrap();
    assert_eq!(unlimited.max_attempts(), None);
    assert!(e(RetryPolicy::builder(b).max_attempts(0)).to_string().contains("max_attempts"));
}

#[test]
fn the_retry_state_is_at_most_64_bytes() {
    assert!(size_of::<Retry<()>>() <= 64, "{} bytes", size_of::<Retry<()>>());
}

// ---- properties -----------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Start(u64),
    Success(u64, u32),
    Failure(u64, u32, u8),
    Timeout(u64),
    Cancel(u64),
    Reject(u64),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2_000u64).prop_map(Op::Start),
        (0..2_000u64, 0..6u32).prop_map(|(t, a)| Op::Success(t, a)),
        (0..2_000u64, 0..6u32, 0..7u8).prop_map(|(t, a, k)| Op::Failure(t, a, k)),
        (0..2_000u64).prop_map(Op::Timeout),
        (0..2_000u64).prop_map(Op::Cancel),
        (0..2_000u64).prop_map(Op::Reject),
    ]
}

fn failure_of(kind: u8, attempt: u32) -> Failure<u32> {
    match kind {
        0 => Failure::retryable(attempt),
        1 => Failure::timeout(attempt),
        2 => Failure::fatal(attempt),
        3 => Failure::canceled(attempt),
        4 => Failure::retry_after(ms(u64::from(attempt) * 7), attempt),
        5 => Failure::do_not_retry(attempt),
        _ => Failure::panicked(attempt),
    }
}

fn any_policy() -> impl Strategy<Value = RetryPolicy> {
    (1..6u32, prop::option::of(1..500u64), prop::option::of(1..300u64), any::<bool>(), 0..4u8).prop_map(
        |(attempts, total, timeout, restart, jitter)| {
            let jitter = [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Proportional(0.5)][usize::from(jitter)];
            let backoff = Backoff::exponential(ms(10), 2.0).max_delay(ms(200)).jitter(jitter).build().unwrap();
            let mut b = RetryPolicy::builder(backoff).max_attempts(attempts).restart_after_hint(restart);
            if let Some(t) = total {
                b = b.total(ms(t));
            }
            if let Some(t) = timeout {
                b = b.attempt_timeout(ms(t));
            }
            b.build().unwrap()
        },
    )
}

proptest! {
    #[test]
    fn g12_a_refused_input_changes_nothing(policy in any_policy(), ops in prop::collection::vec(any_op(), 1..60), seed in any::<u64>()) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut retry = Retry::<u32>::new();
        for op in ops {
            let before = retry;
            let rng_before = r.clone();
            let refused = match op {
                Op::Start(t) => retry.handle_start(&policy, at(t)).is_err(),
                Op::Success(t, a) => retry.handle_success(at(t), a).is_err(),
                Op::Failure(t, a, k) => retry.handle_failure(&policy, at(t), a, failure_of(k, a), &mut r).is_err(),
                Op::Timeout(t) => { retry.handle_timeout(&policy, at(t), &mut r); false }
                Op::Cancel(t) => retry.handle_cancel(at(t)).is_err(),
                Op::Reject(t) => retry.handle_rejected(at(t)).is_err(),
            };
            if refused {
                prop_assert_eq!(retry, before, "{:?} was refused but changed the state", op);
                prop_assert_eq!(&r, &rng_before, "a refused input drew randomness");
            }
            while retry.poll_action().is_some() {}
        }
    }

    #[test]
    fn r3_limits_are_counted_exactly(
        policy in any_policy(),
        durations in prop::collection::vec(0..400u64, 1..8),
        succeed_at in 1..10u32,
        seed in any::<u64>(),
    ) {
        // Attempts take the given durations and fail retryably, except attempt `succeed_at`.
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut retry = Retry::<u32>::new();
        let mut now = at(0);
        retry.handle_start(&policy, now).unwrap();
        let limit = policy.max_attempts().unwrap();
        let budget_end = policy.total().map(|t| at(0).saturating_add(t));
        let mut started: Vec<(u32, Instant)> = Vec::new();
        let mut sleeps: Vec<Instant> = Vec::new();
        let result = loop {
            match retry.poll_action() {
                Some(Action::Start { attempt, deadline }) => {
                    started.push((attempt, now));
                    if let Some(end) = budget_end { prop_assert!(now <= end, "attempt {} started past the budget", attempt); }
                    let took = ms(durations[(attempt as usize - 1) % durations.len()]);
                    let finish_at = now.saturating_add(took);
                    if deadline.is_some_and(|d| d <= finish_at) {
                        now = deadline.unwrap();
                        retry.handle_timeout(&policy, now, &mut r);
                    } else {
                        now = finish_at;
                        if attempt == succeed_at {
                            retry.handle_success(now, attempt).unwrap();
                        } else {
                            retry.handle_failure(&policy, now, attempt, Failure::retryable(attempt), &mut r).unwrap();
                        }
                    }
                }
                Some(Action::Sleep { until, .. }) => {
                    if let Some(end) = budget_end { prop_assert!(until <= end, "a sleep ends past the budget"); }
                    sleeps.push(until);
                }
                Some(Action::Abandon { .. }) => {}
                Some(Action::Finish { outcome, stats }) => break (outcome, stats),
                None => {
                    now = retry.poll_timeout().unwrap();
                    retry.handle_timeout(&policy, now, &mut r);
                }
            }
        };
        let (outcome, stats) = result;
        let numbers: Vec<u32> = started.iter().map(|s| s.0).collect();
        prop_assert_eq!(numbers, (1..=stats.attempts).collect::<Vec<_>>());
        prop_assert!(stats.attempts <= limit, "{} attempts over a limit of {}", stats.attempts, limit);
        match outcome.kind() {
            OutcomeKind::Exhausted => prop_assert_eq!(stats.attempts, limit, "exhausted before the limit"),
            OutcomeKind::Succeeded => prop_assert_eq!(stats.attempts, succeed_at),
            OutcomeKind::OutOfTime => prop_assert!(budget_end.is_some()),
            other => prop_assert!(false, "unexpected outcome {:?}", other),
        }
        prop_assert_eq!(sleeps.len() as u32, stats.attempts - 1);
    }
}
