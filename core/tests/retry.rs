//! Rules R1–R6 and B6 on the retry machine, and G12 (a refused input changes nothing).

mod common;
use common::drain;

use core::time::Duration;

use persevere::{
    Backoff, DEFAULT_MAX_HINT, Failure, FailureClass, FailureKind, Hint, Instant, Jitter, LastFailure, Outcome,
    OutcomeKind, PolicyError, Retry, RetryAction, RetryError, RetryPolicy, RetryStatus, Stats,
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

fn lf(class: FailureClass, error: u64) -> LastFailure<u64> {
    LastFailure { class, error: Some(error) }
}

/// Fails every attempt with `failure(attempt)`, sleeping exactly as told, and returns the
/// whole action trace.
fn run_failing(policy: &RetryPolicy, failure: impl Fn(u64) -> Failure<u64>) -> (Vec<RetryAction<u64>>, Instant) {
    let mut r = rng();
    let mut retry = Retry::new();
    let mut now = at(0);
    let mut trace = Vec::new();
    retry.handle_start(policy, now).unwrap();
    for _ in 0..1_000 {
        let actions = drain(&mut retry);
        let mut started = None;
        for a in &actions {
            if let RetryAction::Start { attempt, .. } = a {
                started = Some(*attempt);
            }
        }
        let finished = actions.iter().any(|a| matches!(a, RetryAction::Finish { .. }));
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

fn finish(trace: &[RetryAction<u64>]) -> (Outcome<u64>, Stats) {
    match trace.last() {
        Some(RetryAction::Finish { outcome, stats }) => (*outcome, *stats),
        other => panic!("no finish: {other:?}"),
    }
}

fn starts(trace: &[RetryAction<u64>]) -> Vec<u64> {
    trace
        .iter()
        .filter_map(|a| if let RetryAction::Start { attempt, .. } = a { Some(*attempt) } else { None })
        .collect()
}

fn sleeps(trace: &[RetryAction<u64>]) -> Vec<Duration> {
    trace.iter().filter_map(|a| if let RetryAction::Sleep { delay, .. } = a { Some(*delay) } else { None }).collect()
}

#[test]
fn r1_attempts_are_numbered_from_one_and_never_overlap() {
    let p = policy(|b| b.max_attempts(4));
    let (trace, _) = run_failing(&p, Failure::retryable);
    assert_eq!(starts(&trace), vec![1, 2, 3, 4]);
    // Between two starts there is always a sleep: a start never follows a start.
    for pair in trace.windows(2) {
        assert!(!matches!(pair, [RetryAction::Start { .. }, RetryAction::Start { .. }]), "{pair:?}");
    }
}

#[test]
fn r1_a_second_result_for_the_same_attempt_is_refused() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(1), 1, Failure::retryable(1), &mut r).unwrap();
    drain(&mut retry);
    let err = retry.handle_failure(&p, at(2), 1, Failure::retryable(9), &mut r).unwrap_err();
    assert_eq!(err.error, RetryError::NoAttemptRunning);
    assert_eq!(err.input, Failure::retryable(9), "the refused failure is handed back");
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
        assert!(!trace.iter().any(|a| matches!(a, RetryAction::Sleep { .. })));
    }
}

#[test]
fn r2_timeouts_panics_and_retry_after_are_retried() {
    let p = policy(|b| b.max_attempts(3));
    for failure in [Failure::timeout as fn(u64) -> Failure<u64>, Failure::panicked, Failure::retryable] {
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
fn r2_a_throttled_failure_is_retried_by_the_schedule_and_counts_as_throttling() {
    let p = policy(|b| b.max_attempts(3));
    let (trace, end) = run_failing(&p, Failure::throttled);
    assert_eq!(starts(&trace), vec![1, 2, 3]);
    assert_eq!(end, at(200), "two scheduled sleeps of 100 ms: no hint");
    assert_eq!(finish(&trace).0, Outcome::Exhausted { last_failure: lf(FailureClass::Throttled, 3) });
    assert!(FailureClass::Throttled.is_retryable());
    assert_eq!(FailureKind::Throttled.class(), FailureClass::Throttled);
    // A budget charges it as throttling, as it does a hinted failure.
    assert_eq!(persevere::RetryClass::from(FailureClass::Throttled), persevere::RetryClass::Throttling);
}

#[test]
fn r2_a_throttled_failure_waits_on_the_throttling_schedule_along_the_same_streak() {
    let exponential = |base| Backoff::exponential(ms(base), 2.0).build().unwrap();
    let p =
        RetryPolicy::builder(exponential(100)).max_attempts(5).throttling_backoff(exponential(1_000)).build().unwrap();
    assert_eq!(p.throttling_backoff(), Some(&exponential(1_000)));
    // Retryable, throttled, retryable, throttled: the n-th failure waits the n-th delay of its
    // class's schedule.
    let kinds = [FailureKind::Retryable, FailureKind::Throttled, FailureKind::Retryable, FailureKind::Throttled];
    let (mut retry, mut r, mut now) = (Retry::<u64>::new(), rng(), at(0));
    retry.handle_start(&p, now).unwrap();
    let mut slept = Vec::new();
    for (i, kind) in kinds.into_iter().enumerate() {
        let attempt = i as u64 + 1;
        assert!(matches!(retry.poll_action(), Some(RetryAction::Start { .. })));
        retry.handle_failure(&p, now, attempt, Failure::new(kind, attempt), &mut r).unwrap();
        let Some(RetryAction::Sleep { delay, until, .. }) = retry.poll_action() else { panic!("a sleep") };
        slept.push(delay);
        now = until;
        retry.handle_timeout(&p, now, &mut r);
    }
    assert_eq!(slept, [ms(100), ms(2_000), ms(400), ms(8_000)]);
    // Without one, a throttled failure waits on the policy's schedule.
    assert_eq!(policy(|b| b.max_attempts(2)).throttling_backoff(), None);
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
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 1, deadline: None }]);
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
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(5)).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 1, deadline: Some(at(35)) }]);
    assert_eq!(retry.poll_timeout(), Some(at(35)));
    retry.handle_timeout(&p, at(34), &mut r);
    assert!(drain(&mut retry).is_empty(), "early: nothing happens");
    retry.handle_timeout(&p, at(35), &mut r);
    assert_eq!(
        drain(&mut retry),
        vec![
            RetryAction::Abandon { attempt: 1 },
            RetryAction::Sleep { next_attempt: 2, delay: ms(100), until: at(135) }
        ]
    );
    assert_eq!(retry.last_failure(), Some(&LastFailure { class: FailureClass::Timeout, error: None }));
    assert_eq!(
        retry.handle_success(at(36), 1),
        Err(RetryError::NoAttemptRunning),
        "a late result of the abandoned attempt is refused"
    );
    retry.handle_timeout(&p, at(135), &mut r);
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 2, deadline: Some(at(165)) }]);
    retry.handle_timeout(&p, at(165), &mut r);
    let trace = drain(&mut retry);
    assert_eq!(trace[0], RetryAction::Abandon { attempt: 2 });
    assert_eq!(
        finish(&trace).0,
        Outcome::Exhausted { last_failure: LastFailure { class: FailureClass::Timeout, error: None } }
    );
}

/// R3 (revised in issue 12): a policy must have a limit, or say on purpose that it has none.
#[test]
fn r3_a_policy_without_any_limit_is_refused_unless_unbounded() {
    let b = Backoff::constant(ms(1)).build().unwrap();
    // No attempt limit and no total budget: refused.
    assert_eq!(RetryPolicy::builder(b).build(), Err(PolicyError::Unbounded));
    // An attempt timeout and a hint limit are no limit on the operation.
    assert_eq!(RetryPolicy::builder(b).attempt_timeout(ms(10)).max_hint(ms(10)).build(), Err(PolicyError::Unbounded));
    // `total(Duration::MAX)` means "no budget", so alone it is no limit either.
    assert_eq!(RetryPolicy::builder(b).total(Duration::MAX).build(), Err(PolicyError::Unbounded));
    let message = PolicyError::Unbounded.to_string();
    assert!(message.contains("unbounded()") && message.contains("max_attempts"), "{message}");

    // `.unbounded()` builds, alone or with a budget of Duration::MAX (which is no budget).
    let unbounded = RetryPolicy::builder(b).unbounded().build().unwrap();
    assert!(unbounded.is_unbounded());
    assert_eq!((unbounded.max_attempts(), unbounded.total()), (None, None));
    assert_eq!(RetryPolicy::builder(b).unbounded().total(Duration::MAX).build(), Ok(unbounded));
    // Each limit alone builds and is not unbounded.
    for limited in [
        RetryPolicy::builder(b).max_attempts(3),
        RetryPolicy::builder(b).max_retries(0),
        RetryPolicy::builder(b).total(ms(500)),
    ] {
        assert!(!limited.build().unwrap().is_unbounded(), "{limited:?}");
    }

    // `.unbounded()` beside a limit is a conflict, whichever limit.
    for conflicting in [
        RetryPolicy::builder(b).unbounded().max_attempts(3),
        RetryPolicy::builder(b).unbounded().max_retries(2),
        RetryPolicy::builder(b).unbounded().total(ms(500)),
    ] {
        assert!(
            matches!(conflicting.build(), Err(PolicyError::Conflict { setting: "unbounded()", .. })),
            "{conflicting:?} gave {:?}",
            conflicting.build()
        );
    }

    // An unbounded policy keeps retrying past any count a limit would have stopped at, and
    // still stops on a fatal failure.
    let (trace, _) = run_failing(&unbounded, |a| if a == 50 { Failure::fatal(a) } else { Failure::retryable(a) });
    assert_eq!(starts(&trace), (1..=50).collect::<Vec<_>>());
    assert_eq!(finish(&trace).0, Outcome::Fatal { failure: lf(FailureClass::Fatal, 50) });
}

#[test]
fn r4_a_success_resets_the_failure_streak() {
    let p = policy(|b| b.max_attempts(5));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(0), 1, Failure::retryable(1), &mut r).unwrap();
    drain(&mut retry);
    retry.handle_timeout(&p, at(100), &mut r);
    drain(&mut retry);
    retry.handle_failure(&p, at(100), 2, Failure::retryable(2), &mut r).unwrap();
    drain(&mut retry);
    assert_eq!(retry.streak(), 2);
    retry.handle_timeout(&p, at(200), &mut r);
    drain(&mut retry);
    retry.handle_success(at(200), 3).unwrap();
    assert_eq!(retry.streak(), 0);
    assert_eq!(retry.last_failure(), None);
}

#[test]
fn r5_the_outcome_carries_attempts_time_asleep_and_elapsed_time() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(1_000)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(1_040), 1, Failure::retryable(1), &mut r).unwrap();
    drain(&mut retry);
    retry.handle_timeout(&p, at(1_150), &mut r); // woke 10 ms late: slept 110 ms
    drain(&mut retry);
    retry.handle_failure(&p, at(1_170), 2, Failure::retryable(2), &mut r).unwrap();
    drain(&mut retry);
    retry.handle_timeout(&p, at(1_270), &mut r);
    drain(&mut retry);
    retry.handle_success(at(1_300), 3).unwrap();
    let (outcome, stats) = finish(&drain(&mut retry));
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(stats, Stats { attempts: 3, slept: ms(210), elapsed: Some(ms(300)) });
}

/// R5: the core always knows the elapsed time (only a driver that skipped the clock on its
/// success path reports `None`), whatever the outcome.
#[test]
fn r5_the_core_always_measures_the_elapsed_time() {
    let mut r = rng();
    // Every outcome that ends a started operation, with the elapsed time it must report.
    let p = policy(|b| b.max_attempts(2).total(ms(1_000)).max_hint(ms(500)));
    type Drive = fn(&mut Retry<u64>, &RetryPolicy, &mut ChaCha8Rng);
    let cases: [(OutcomeKind, Drive, Duration); 7] = [
        (OutcomeKind::Succeeded, |t, _, _| t.handle_success(at(1_030), 1).unwrap(), ms(30)),
        (OutcomeKind::Fatal, |t, p, r| t.handle_failure(p, at(1_040), 1, Failure::fatal(1), r).unwrap(), ms(40)),
        (OutcomeKind::Canceled, |t, _, _| t.handle_cancel(at(1_050)).unwrap(), ms(50)),
        (
            OutcomeKind::Deferred,
            |t, p, r| t.handle_failure(p, at(1_060), 1, Failure::retry_after(ms(501), 1), r).unwrap(),
            ms(60),
        ),
        (
            OutcomeKind::OutOfTime,
            |t, p, r| t.handle_failure(p, at(1_970), 1, Failure::retryable(1), r).unwrap(),
            ms(970),
        ),
        (
            OutcomeKind::Rejected,
            |t, p, r| {
                t.handle_failure(p, at(1_080), 1, Failure::retryable(1), r).unwrap();
                drain(t);
                t.handle_rejected(at(1_090)).unwrap();
            },
            ms(90),
        ),
        (
            OutcomeKind::Exhausted,
            |t, p, r| {
                t.handle_failure(p, at(1_000), 1, Failure::retryable(1), r).unwrap();
                drain(t);
                t.handle_timeout(p, at(1_100), r);
                drain(t);
                t.handle_failure(p, at(1_110), 2, Failure::retryable(2), r).unwrap();
            },
            ms(110),
        ),
    ];
    for (kind, drive, elapsed) in cases {
        let mut retry = Retry::<u64>::new();
        retry.handle_start(&p, at(1_000)).unwrap();
        drain(&mut retry);
        drive(&mut retry, &p, &mut r);
        let (outcome, stats) = finish(&drain(&mut retry));
        assert_eq!(outcome.kind(), kind);
        assert_eq!(stats.elapsed, Some(elapsed), "{kind:?}");
    }
    // While it runs, too.
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(7)).unwrap();
    assert_eq!(retry.stats(), Stats { attempts: 1, slept: Duration::ZERO, elapsed: Some(Duration::ZERO) });
}

#[test]
fn r5_exactly_one_finish_is_emitted_and_everything_after_it_is_refused() {
    let p = policy(|b| b.max_attempts(1));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(0), 1, Failure::retryable(7), &mut r).unwrap();
    let trace = drain(&mut retry);
    assert_eq!(trace.iter().filter(|a| matches!(a, RetryAction::Finish { .. })).count(), 1);
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
    let mut retry = Retry::<u64>::new();
    assert_eq!(retry.poll_timeout(), None);
    retry.handle_start(&p, at(0)).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 1, deadline: None }]);
    retry.handle_failure(&p, at(20), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: ms(100), until: at(120) }]);
    assert_eq!(retry.poll_timeout(), Some(at(120)));
    assert_eq!(retry.status(), RetryStatus::Sleeping { next_attempt: 2, until: at(120) });
    retry.handle_timeout(&p, at(119), &mut r);
    assert_eq!(retry.poll_action(), None);
    retry.handle_timeout(&p, at(120), &mut r);
    retry.handle_timeout(&p, at(120), &mut r); // twice: nothing more
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 2, deadline: None }]);
    retry.handle_success(at(130), 2).unwrap();
    assert_eq!(finish(&drain(&mut retry)).0, Outcome::Succeeded);
}

#[test]
fn r6_a_zero_delay_schedules_a_sleep_that_is_already_due() {
    let p = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(2).build().unwrap();
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(7)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(7), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: Duration::ZERO, until: at(7) }]);
    assert_eq!(retry.poll_timeout(), Some(at(7)), "due now: the driver needs no timer");
}

/// The drain rule (issue 12): no action is ever dropped unseen, so an input that arrives
/// before the actions of an earlier one are drained is refused and changes nothing.
#[test]
fn r6_an_input_before_the_actions_are_drained_is_refused_and_changes_nothing() {
    let p = policy(|b| b.max_attempts(3).attempt_timeout(ms(50)));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    assert!(retry.has_actions());

    // Attempt 1's start is not drained yet: every input is refused, nothing changes.
    let before = retry;
    let rng_before = r.clone();
    let refused = retry.handle_failure(&p, at(10), 1, Failure::retryable(1), &mut r).unwrap_err();
    assert_eq!(refused.error, RetryError::Undrained);
    assert_eq!(refused.input, Failure::retryable(1), "the refused failure is handed back");
    assert_eq!(retry.handle_success(at(10), 1), Err(RetryError::Undrained));
    assert_eq!(retry.handle_cancel(at(10)), Err(RetryError::Undrained));
    // A validity error takes precedence over the drain rule.
    assert_eq!(retry.handle_start(&p, at(10)), Err(RetryError::AlreadyStarted));
    assert_eq!(retry.handle_success(at(10), 2), Err(RetryError::StaleAttempt { running: 1, got: 2 }));
    assert_eq!(retry.handle_rejected(at(10)), Err(RetryError::NothingToReject));
    // `handle_timeout` past the deadline does nothing while the start waits to be drained.
    retry.handle_timeout(&p, at(60), &mut r);
    assert_eq!(retry, before, "a refused input changed the state");
    assert_eq!(r, rng_before, "a refused input drew randomness");
    assert_eq!(retry.now(), at(0), "a refused input's `now` is not accepted");

    // Once drained, the same inputs are accepted, and the deadline is acted on.
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 1, deadline: Some(at(50)) }]);
    assert!(!retry.has_actions());
    retry.handle_timeout(&p, at(60), &mut r);
    assert_eq!(retry.now(), at(60));
    assert!(retry.has_actions());

    // The abandon and the sleep wait to be drained: the next timeout (even past the sleep's
    // end) does nothing, and a cancel is refused.
    let before = retry;
    let rng_before = r.clone();
    retry.handle_timeout(&p, at(10_000), &mut r);
    assert_eq!(retry.handle_cancel(at(10_000)), Err(RetryError::Undrained));
    assert_eq!(retry.handle_rejected(at(10_000)), Err(RetryError::Undrained));
    assert_eq!(retry, before);
    assert_eq!(r, rng_before);
    assert_eq!(
        drain(&mut retry),
        vec![
            RetryAction::Abandon { attempt: 1 },
            RetryAction::Sleep { next_attempt: 2, delay: ms(100), until: at(160) }
        ],
        "nothing was dropped or reported stale"
    );
    retry.handle_timeout(&p, at(160), &mut r);
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 2, deadline: Some(at(210)) }]);
    retry.handle_success(at(170), 2).unwrap();
    // The finish is pending: after the outcome, `Finished` takes precedence.
    assert_eq!(retry.handle_cancel(at(170)), Err(RetryError::Finished(OutcomeKind::Succeeded)));
    assert_eq!(finish(&drain(&mut retry)).0, Outcome::Succeeded);
}

/// B6 (revised in issue 12; this test used to assert that the hint was clamped to
/// `max_hint`): a hint is never shortened, so one past `max_hint` ends the operation at once.
#[test]
fn b6_a_hint_past_max_hint_ends_the_operation_deferred_with_the_hinted_instant() {
    let p = policy(|b| b.max_attempts(2).max_hint(ms(1_000)));
    let (trace, end) = run_failing(&p, |a| Failure::retry_after(Duration::from_secs(3_600), a));
    assert_eq!(end, at(0), "no sleep at all");
    assert_eq!(starts(&trace), vec![1]);
    assert!(sleeps(&trace).is_empty(), "{trace:?}");
    let (outcome, stats) = finish(&trace);
    assert_eq!(outcome, Outcome::Deferred { retry_at: at(3_600_000), last_failure: lf(FailureClass::RetryAfter, 1) });
    assert_eq!(outcome.retry_at(), Some(at(3_600_000)));
    assert_eq!(outcome.last_failure(), Some(&lf(FailureClass::RetryAfter, 1)));
    assert_eq!(stats, Stats { attempts: 1, slept: Duration::ZERO, elapsed: Some(Duration::ZERO) });

    // The same for a hinted instant, and by the default `max_hint` of 5 minutes: the
    // outcome carries the very instant the other side named.
    let p = policy(|b| b.max_attempts(5));
    assert_eq!(p.max_hint(), DEFAULT_MAX_HINT);
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(2_000)).unwrap();
    drain(&mut retry);
    let later = at(2_000) + DEFAULT_MAX_HINT + Duration::from_nanos(1);
    retry.handle_failure(&p, at(2_000), 1, Failure::new(FailureKind::Hinted(Hint::At(later)), 4), &mut r).unwrap();
    assert_eq!(retry.status(), RetryStatus::Finished(OutcomeKind::Deferred));
    assert_eq!(
        drain(&mut retry),
        vec![RetryAction::Finish {
            outcome: Outcome::Deferred { retry_at: later, last_failure: lf(FailureClass::RetryAfter, 4) },
            stats: Stats { attempts: 1, slept: Duration::ZERO, elapsed: Some(Duration::ZERO) },
        }]
    );
    assert_eq!(retry.poll_timeout(), None, "nothing is left to time: the caller comes back at `retry_at`");
}

/// B6 (revised in issue 12; this test used to assert that the hint was clamped to the end of
/// the budget): a hint whose end is past the total budget ends the operation at once,
/// `Deferred` with the hinted instant, while a scheduled delay past it is still `OutOfTime`.
#[test]
fn b6_a_hint_past_the_total_budget_ends_deferred_not_shortened() {
    let p = policy(|b| b.max_attempts(2).total(ms(400)));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(150), 1, Failure::retry_after(ms(10_000), 1), &mut r).unwrap();
    assert_eq!(
        drain(&mut retry),
        vec![RetryAction::Finish {
            outcome: Outcome::Deferred { retry_at: at(10_150), last_failure: lf(FailureClass::RetryAfter, 1) },
            stats: Stats { attempts: 1, slept: Duration::ZERO, elapsed: Some(ms(150)) },
        }]
    );

    // One nanosecond past the budget is past it...
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    let just_past = ms(250) + Duration::from_nanos(1);
    retry.handle_failure(&p, at(150), 1, Failure::retry_after(just_past, 1), &mut r).unwrap();
    assert_eq!(finish(&drain(&mut retry)).0.retry_at(), Some(at(400) + Duration::from_nanos(1)));
    // ...and a hint ending exactly at the budget's end is waited in full.
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(150), 1, Failure::retry_after(ms(250), 1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: ms(250), until: at(400) }]);

    // A scheduled (not hinted) delay past the budget is `OutOfTime`, not `Deferred`.
    let p = policy(|b| b.max_attempts(2).total(ms(120)));
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(30), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(finish(&drain(&mut retry)).0, Outcome::OutOfTime { last_failure: lf(FailureClass::Retryable, 1) });
}

/// B6: a hint within `max_hint` and the budget is waited exactly, neither shortened nor
/// capped by the schedule's `max_delay` (it is the other side's word, not the schedule's).
#[test]
fn b6_a_hint_within_max_hint_is_waited_in_full() {
    // The schedule's delays are 100 ms; the default `max_hint` is 5 minutes.
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(10), 1, Failure::retry_after(Duration::from_secs(240), 1), &mut r).unwrap();
    let until = at(10) + Duration::from_secs(240);
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: Duration::from_secs(240), until }]);
    retry.handle_timeout(&p, until - Duration::from_nanos(1), &mut r);
    assert!(drain(&mut retry).is_empty(), "not a nanosecond less");
    retry.handle_timeout(&p, until, &mut r);
    drain(&mut retry);
    // Exactly `max_hint` is within it.
    retry.handle_failure(&p, until, 2, Failure::retry_after(DEFAULT_MAX_HINT, 2), &mut r).unwrap();
    assert_eq!(
        drain(&mut retry),
        vec![RetryAction::Sleep { next_attempt: 3, delay: DEFAULT_MAX_HINT, until: until + DEFAULT_MAX_HINT }]
    );
    retry.handle_timeout(&p, until + DEFAULT_MAX_HINT, &mut r);
    drain(&mut retry);
    retry.handle_success(until + DEFAULT_MAX_HINT, 3).unwrap();
    let (outcome, stats) = finish(&drain(&mut retry));
    assert_eq!(outcome, Outcome::Succeeded);
    assert_eq!(stats.slept, Duration::from_secs(240) + DEFAULT_MAX_HINT);

    // `max_hint(Duration::MAX)` honours any hint in full: a day, here.
    let p = policy(|b| b.max_attempts(2).max_hint(Duration::MAX));
    assert_eq!(p.max_hint(), Duration::MAX);
    let day = Duration::from_secs(86_400);
    let (trace, end) = run_failing(&p, |a| Failure::retry_after(day, a));
    assert_eq!(sleeps(&trace), vec![day]);
    assert_eq!(end, at(0) + day);
    assert_eq!(finish(&trace).0.kind(), OutcomeKind::Exhausted);
}

#[test]
fn b6_a_hint_at_an_instant_waits_until_then_and_a_past_instant_means_now() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(100)).unwrap();
    drain(&mut retry);
    let hint = |t, e| Failure::new(FailureKind::Hinted(Hint::At(t)), e);
    retry.handle_failure(&p, at(100), 1, hint(at(175), 1), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: ms(75), until: at(175) }]);
    retry.handle_timeout(&p, at(175), &mut r);
    drain(&mut retry);
    retry.handle_failure(&p, at(180), 2, hint(at(3), 2), &mut r).unwrap();
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 3, delay: Duration::ZERO, until: at(180) }]);
}

#[test]
fn b6_restart_after_hint_is_a_policy_option() {
    let exponential = Backoff::exponential(ms(100), 2.0).build().unwrap();
    let run = |restart: bool| {
        let p = RetryPolicy::builder(exponential).max_attempts(4).restart_after_hint(restart).build().unwrap();
        assert_eq!(p.restarts_after_hint(), restart);
        run_failing(&p, |a| if a == 2 { Failure::retry_after(ms(5), a) } else { Failure::retryable(a) }).0
    };
    assert_eq!(sleeps(&run(false)), vec![ms(100), ms(5), ms(400)], "the hint counts as a step of the schedule");
    assert_eq!(sleeps(&run(true)), vec![ms(100), ms(5), ms(100)], "the schedule starts over after the hint");
    // Only the schedule starts over: the attempt limit counts every failure either way.
    for restart in [false, true] {
        let trace = run(restart);
        assert_eq!(starts(&trace), vec![1, 2, 3, 4]);
        assert_eq!(finish(&trace).0, Outcome::Exhausted { last_failure: lf(FailureClass::Retryable, 4) });
    }
}

/// B6 (revised in issue 12): after a hint with `restart_after_hint`, the streak keeps
/// counting every consecutive failure (it used to drop to zero); only the schedule restarts.
#[test]
fn b6_restart_after_hint_keeps_the_streak_counting() {
    let p = policy(|b| b.max_attempts(5).restart_after_hint(true));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&p, at(0), 1, Failure::retryable(1), &mut r).unwrap();
    drain(&mut retry);
    assert_eq!(retry.streak(), 1);
    retry.handle_timeout(&p, at(100), &mut r);
    drain(&mut retry);
    retry.handle_failure(&p, at(100), 2, Failure::retry_after(ms(5), 2), &mut r).unwrap();
    drain(&mut retry);
    assert_eq!(retry.streak(), 2, "the hinted failure is counted");
    retry.handle_timeout(&p, at(105), &mut r);
    drain(&mut retry);
    retry.handle_failure(&p, at(105), 3, Failure::retryable(3), &mut r).unwrap();
    drain(&mut retry);
    assert_eq!(retry.streak(), 3);
}

#[test]
fn cancel_abandons_a_running_attempt_and_finishes_canceled() {
    let p = policy(|b| b.max_attempts(3));
    let mut r = rng();
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_cancel(at(5)).unwrap();
    let trace = drain(&mut retry);
    assert_eq!(trace[0], RetryAction::Abandon { attempt: 1 });
    assert_eq!(finish(&trace).0, Outcome::Canceled { last_failure: None });
    // Canceled while asleep: the last failure is kept, nothing to abandon.
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
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
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(0)).unwrap();
    drain(&mut retry);
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
    let mut retry = Retry::<u64>::new();
    retry.handle_start(&p, at(500)).unwrap();
    drain(&mut retry);
    // A failure reported with an earlier clock is read as happening at 500.
    retry.handle_failure(&p, at(100), 1, Failure::retryable(1), &mut r).unwrap();
    assert_eq!(retry.now(), at(500));
    assert_eq!(drain(&mut retry), vec![RetryAction::Sleep { next_attempt: 2, delay: ms(100), until: at(600) }]);
    retry.handle_timeout(&p, at(650), &mut r);
    drain(&mut retry);
    retry.handle_success(at(0), 2).unwrap();
    assert_eq!(retry.now(), at(650));
    let (_, stats) = finish(&drain(&mut retry));
    assert_eq!(stats.elapsed, Some(ms(150)));
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
    assert!(matches!(e(RetryPolicy::builder(b).max_attempts(1).attempt_timeout(Duration::ZERO)), Zero { .. }));
    assert!(matches!(e(RetryPolicy::builder(b).max_attempts(1).max_hint(Duration::ZERO)), Zero { .. }));
    assert!(matches!(e(RetryPolicy::builder(b)), Unbounded), "R3: a limit is required");
    // Durations too long for u64 nanoseconds mean "no limit" rather than an overflow error
    // (since issue 12 such a policy must say it is unbounded on purpose, R3).
    let unlimited =
        RetryPolicy::builder(b).total(Duration::MAX).attempt_timeout(Duration::MAX).unbounded().build().unwrap();
    assert_eq!(unlimited.max_attempts(), None);
    assert_eq!((unlimited.total(), unlimited.attempt_timeout()), (None, None));
    assert!(!unlimited.needs_clock());
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
    Success(u64, u64),
    Failure(u64, u64, u8),
    Timeout(u64),
    Cancel(u64),
    Reject(u64),
}

/// An input, and whether the driver drains the actions after it (mostly it does; when it
/// does not, the next input meets the drain rule).
fn any_op() -> impl Strategy<Value = (Op, bool)> {
    let op = prop_oneof![
        (0..2_000u64).prop_map(Op::Start),
        (0..2_000u64, 0..6u64).prop_map(|(t, a)| Op::Success(t, a)),
        (0..2_000u64, 0..6u64, 0..7u8).prop_map(|(t, a, k)| Op::Failure(t, a, k)),
        (0..2_000u64).prop_map(Op::Timeout),
        (0..2_000u64).prop_map(Op::Cancel),
        (0..2_000u64).prop_map(Op::Reject),
    ];
    (op, prop::bool::weighted(0.8))
}

fn failure_of(kind: u8, attempt: u64) -> Failure<u64> {
    match kind {
        0 => Failure::retryable(attempt),
        1 => Failure::timeout(attempt),
        2 => Failure::fatal(attempt),
        3 => Failure::canceled(attempt),
        4 => Failure::retry_after(ms(attempt * 7), attempt),
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
    fn g12_a_refused_input_changes_nothing(
        policy in any_policy(),
        ops in prop::collection::vec(any_op(), 1..60),
        seed in any::<u64>(),
    ) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut retry = Retry::<u64>::new();
        for (op, then_drain) in ops {
            let before = retry;
            let rng_before = r.clone();
            let undrained = retry.has_actions();
            let result = match op {
                Op::Start(t) => retry.handle_start(&policy, at(t)),
                Op::Success(t, a) => retry.handle_success(at(t), a),
                Op::Failure(t, a, k) => {
                    retry.handle_failure(&policy, at(t), a, failure_of(k, a), &mut r).map_err(|refused| {
                        assert_eq!(refused.input, failure_of(k, a), "the refused failure is handed back");
                        refused.error
                    })
                }
                Op::Timeout(t) => {
                    retry.handle_timeout(&policy, at(t), &mut r);
                    if undrained {
                        prop_assert_eq!(retry, before, "a timeout with undrained actions changed the state");
                    }
                    Ok(())
                }
                Op::Cancel(t) => retry.handle_cancel(at(t)),
                Op::Reject(t) => retry.handle_rejected(at(t)),
            };
            if let Err(error) = result {
                prop_assert_eq!(retry, before, "{:?} was refused ({:?}) but changed the state", op, error);
                prop_assert_eq!(&r, &rng_before, "a refused input drew randomness");
                prop_assert!(
                    undrained || error != RetryError::Undrained,
                    "{:?} was refused as undrained with nothing to drain", op
                );
            } else if undrained && !matches!(op, Op::Timeout(_)) {
                prop_assert!(false, "{:?} was accepted while actions waited to be drained", op);
            }
            if then_drain {
                while retry.poll_action().is_some() {}
            }
        }
    }

    #[test]
    fn r3_limits_are_counted_exactly(
        policy in any_policy(),
        durations in prop::collection::vec(0..400u64, 1..8),
        succeed_at in 1..10u64,
        seed in any::<u64>(),
    ) {
        // Attempts take the given durations and fail retryably, except attempt `succeed_at`.
        // Each action is acted on as it is polled; an input comes only once the queue is
        // empty (a start is always the last action of its input), so the drain rule holds.
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut retry = Retry::<u64>::new();
        let mut now = at(0);
        retry.handle_start(&policy, now).unwrap();
        let limit = u64::from(policy.max_attempts().unwrap());
        let budget_end = policy.total().map(|t| at(0).saturating_add(t));
        let mut started: Vec<(u64, Instant)> = Vec::new();
        let mut sleeps: Vec<Instant> = Vec::new();
        let result = loop {
            match retry.poll_action() {
                Some(RetryAction::Start { attempt, deadline }) => {
                    prop_assert!(!retry.has_actions(), "a start is the last action of its input");
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
                Some(RetryAction::Sleep { until, .. }) => {
                    if let Some(end) = budget_end { prop_assert!(until <= end, "a sleep ends past the budget"); }
                    sleeps.push(until);
                }
                Some(RetryAction::Abandon { .. }) => {}
                Some(RetryAction::Finish { outcome, stats }) => break (outcome, stats),
                None => {
                    now = retry.poll_timeout().unwrap();
                    retry.handle_timeout(&policy, now, &mut r);
                }
            }
        };
        let (outcome, stats) = result;
        let numbers: Vec<u64> = started.iter().map(|s| s.0).collect();
        prop_assert_eq!(numbers, (1..=stats.attempts).collect::<Vec<_>>());
        prop_assert!(stats.attempts <= limit, "{} attempts over a limit of {}", stats.attempts, limit);
        prop_assert_eq!(stats.elapsed, Some(now.saturating_duration_since(at(0))));
        match outcome.kind() {
            OutcomeKind::Exhausted => prop_assert_eq!(stats.attempts, limit, "exhausted before the limit"),
            OutcomeKind::Succeeded => prop_assert_eq!(stats.attempts, succeed_at),
            OutcomeKind::OutOfTime => prop_assert!(budget_end.is_some()),
            other => prop_assert!(false, "unexpected outcome {:?}", other),
        }
        prop_assert_eq!(sleeps.len() as u64, stats.attempts - 1);
    }
}
