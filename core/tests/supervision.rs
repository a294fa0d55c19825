//! Rules S1–S6 on the supervision machine, and G12 (a refused input changes nothing).

mod common;
use common::drain;

use core::time::Duration;

use persevere::{
    Backoff, DEFAULT_MAX_HINT, Failure, FailureClass, FailureKind, Hint, Instant, Jitter, LastFailure, PolicyError,
    Restart, Setting, Supervision, SupervisionAction, SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder,
    SupervisionStatus, TaskDefaults, TaskOutcome, TaskOutcomeKind,
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

fn defaults() -> TaskDefaults {
    TaskDefaults::new()
}

/// Defaults with a constant 100 ms backoff, so that times are exact.
fn flat() -> TaskDefaults {
    TaskDefaults { backoff: Backoff::constant(ms(100)).build().unwrap(), ..TaskDefaults::new() }
}

/// What the task does on one attempt.
#[derive(Clone, Copy, Debug)]
enum Step {
    Succeed(u64),
    Fail(u64, Failure<u32>),
    /// Runs past its deadline; dropping it panics or not.
    Hang {
        drop_panics: bool,
    },
}

/// Drives a task to its end (or cancels it after `max_attempts` starts) and returns every event
/// with the time it was drained at.
fn drive(
    policy: &SupervisionPolicy,
    mut script: impl FnMut(u64) -> Step,
    max_attempts: u64,
) -> Vec<(Instant, SupervisionAction<u32>)> {
    let mut r = rng();
    let mut task = Supervision::<u32>::new();
    let mut now = at(1_000);
    let mut trace = Vec::new();
    let mut drop_panic = None;
    task.handle_start(policy, now).unwrap();
    for _ in 0..100_000 {
        let events: Vec<_> = core::iter::from_fn(|| task.poll_action()).collect();
        let last = *events.last().expect("every input yields an event");
        trace.extend(events.into_iter().map(|e| (now, e)));
        match last {
            SupervisionAction::TaskFinished { .. } => return trace,
            SupervisionAction::AttemptStarting { attempt, deadline } => {
                if attempt > max_attempts {
                    task.handle_cancel(now).unwrap();
                    continue;
                }
                match script(attempt) {
                    Step::Succeed(d) => {
                        now = now.saturating_add(ms(d));
                        task.handle_success(policy, now, attempt).unwrap();
                    }
                    Step::Fail(d, failure) => {
                        now = now.saturating_add(ms(d));
                        task.handle_failure(policy, now, attempt, failure, &mut r).unwrap();
                    }
                    Step::Hang { drop_panics } => {
                        now = deadline.expect("a hanging attempt needs a timeout");
                        drop_panic = drop_panics.then_some(attempt as u32);
                        task.handle_timeout(policy, now);
                    }
                }
            }
            SupervisionAction::AttemptTimedOut { attempt } => {
                task.handle_abandoned(policy, now, attempt, drop_panic.take(), &mut r).unwrap();
            }
            SupervisionAction::BackoffScheduled { until, .. } => {
                assert_eq!(task.poll_timeout(), Some(until));
                now = until;
                task.handle_timeout(policy, now);
            }
            other => panic!("a batch cannot end with {other:?}"),
        }
    }
    panic!("did not finish");
}

fn starts(trace: &[(Instant, SupervisionAction<u32>)]) -> Vec<Instant> {
    trace.iter().filter(|(_, e)| matches!(e, SupervisionAction::AttemptStarting { .. })).map(|(t, _)| *t).collect()
}

fn outcome(trace: &[(Instant, SupervisionAction<u32>)]) -> TaskOutcome<u32> {
    match trace.last() {
        Some((_, SupervisionAction::TaskFinished { outcome, .. })) => *outcome,
        other => panic!("no TaskFinished: {other:?}"),
    }
}

fn count(trace: &[(Instant, SupervisionAction<u32>)], pred: impl Fn(&SupervisionAction<u32>) -> bool) -> usize {
    trace.iter().filter(|(_, e)| pred(e)).count()
}

fn failed(trace: &[(Instant, SupervisionAction<u32>)]) -> usize {
    count(trace, |e| matches!(e, SupervisionAction::AttemptFailed { .. }))
}

fn lf(class: FailureClass, error: u32) -> LastFailure<u32> {
    LastFailure { class, error: Some(error) }
}

/// S6: the event grammar. Per attempt: Starting, exactly one end event, then BackoffScheduled
/// if another attempt follows; one TaskFinished, last.
fn check_grammar(trace: &[(Instant, SupervisionAction<u32>)]) {
    #[derive(PartialEq, Debug)]
    enum At {
        Begin,
        Running(u64),
        Ended(u64),
        Scheduled(u64),
        Done,
    }
    let mut at = At::Begin;
    for (_, event) in trace {
        at = match (at, *event) {
            (At::Begin, SupervisionAction::AttemptStarting { attempt: 1, .. }) => At::Running(1),
            (At::Scheduled(n), SupervisionAction::AttemptStarting { attempt, .. }) if attempt == n => At::Running(n),
            (
                At::Running(n),
                SupervisionAction::AttemptSucceeded { attempt }
                | SupervisionAction::AttemptFailed { attempt, .. }
                | SupervisionAction::AttemptTimedOut { attempt }
                | SupervisionAction::AttemptCanceled { attempt },
            ) if attempt == n => At::Ended(n),
            (At::Ended(n), SupervisionAction::BackoffScheduled { next_attempt, .. }) if next_attempt == n + 1 => {
                At::Scheduled(n + 1)
            }
            (At::Ended(_) | At::Scheduled(_) | At::Begin, SupervisionAction::TaskFinished { .. }) => At::Done,
            (at, event) => panic!("{event:?} after {at:?} breaks S6"),
        };
    }
    assert_eq!(at, At::Done, "the trace must end with TaskFinished");
}

#[test]
fn s1_once_stops_after_a_success_and_after_a_failure() {
    let p = SupervisionPolicy::once().build(&defaults()).unwrap();
    let trace = drive(&p, |_| Step::Succeed(5), 10);
    assert_eq!(outcome(&trace), TaskOutcome::Completed);
    assert_eq!(starts(&trace).len(), 1);
    let trace = drive(&p, |a| Step::Fail(5, Failure::retryable(a as u32)), 10);
    assert_eq!(outcome(&trace), TaskOutcome::Failed { last_failure: lf(FailureClass::Retryable, 1) });
    assert_eq!(starts(&trace).len(), 1);
    check_grammar(&trace);
}

#[test]
fn s1_restartable_stops_after_a_success_and_retries_a_failure() {
    let p = SupervisionPolicy::restartable().build(&flat()).unwrap();
    let trace = drive(&p, |a| if a < 4 { Step::Fail(1, Failure::retryable(0)) } else { Step::Succeed(1) }, 10);
    assert_eq!(outcome(&trace), TaskOutcome::Completed);
    assert_eq!(starts(&trace).len(), 4);
    check_grammar(&trace);
}

#[test]
fn s1_periodic_repeats_after_a_success_and_retries_a_failure() {
    let p = SupervisionPolicy::periodic(ms(50)).build(&flat()).unwrap();
    let trace = drive(&p, |a| if a % 3 == 0 { Step::Fail(1, Failure::retryable(0)) } else { Step::Succeed(1) }, 12);
    assert_eq!(starts(&trace).len(), 13, "it only stops when the driver cancels its 13th start");
    // Attempt 12 failed; the cancel carries it as the last failure before the cancel.
    assert_eq!(outcome(&trace), TaskOutcome::Canceled { last_failure: Some(lf(FailureClass::Retryable, 0)) });
    assert_eq!(failed(&trace), 4);
    check_grammar(&trace);
}

#[test]
fn s1_from_defaults_inherits_everything() {
    let d = TaskDefaults {
        restart: Restart::Periodic { interval: ms(7) },
        backoff: Backoff::constant(ms(3)).build().unwrap(),
        attempt_timeout: Some(ms(9)),
        max_retries: Some(2),
        min_spacing: ms(4),
        max_hint: ms(11),
        restart_after_hint: true,
    };
    let p = SupervisionPolicy::from_defaults().build(&d).unwrap();
    assert_eq!(p.restart(), Restart::Periodic { interval: ms(7) });
    assert_eq!(p.backoff(), &d.backoff);
    assert_eq!(p.attempt_timeout(), Some(ms(9)));
    assert_eq!(p.max_retries(), Some(2));
    assert_eq!(p.min_spacing(), ms(4));
    assert_eq!(p.max_hint(), ms(11));
    assert!(p.restarts_after_hint());
}

#[test]
fn s1_explicit_settings_override_defaults() {
    let d = TaskDefaults { attempt_timeout: Some(ms(9)), max_retries: Some(2), ..flat() };
    let own = Backoff::constant(ms(1)).build().unwrap();
    let d = TaskDefaults { max_hint: ms(11), restart_after_hint: true, ..d };
    let p = SupervisionPolicy::once().backoff(own).attempt_timeout(ms(20)).max_retries(5).min_spacing(ms(2));
    let p = p.max_hint(ms(3)).restart_after_hint(false).build(&d).unwrap();
    assert_eq!(p.restart(), Restart::Once);
    assert_eq!(p.backoff(), &own);
    assert_eq!(p.attempt_timeout(), Some(ms(20)));
    assert_eq!(p.max_retries(), Some(5));
    assert_eq!(p.min_spacing(), ms(2));
    assert_eq!(p.max_hint(), ms(3));
    assert!(!p.restarts_after_hint());
}

#[test]
fn s1_an_explicit_none_switches_off_an_inherited_timeout_and_limit() {
    let d = TaskDefaults { attempt_timeout: Some(ms(9)), max_retries: Some(2), ..flat() };
    let p = SupervisionPolicy::restartable().no_attempt_timeout().unlimited_retries().build(&d).unwrap();
    assert_eq!(p.attempt_timeout(), None);
    assert_eq!(p.max_retries(), None);
    // Off really is off: 20 failures in a row are all retried, none is timed out.
    let trace = drive(&p, |_| Step::Fail(50, Failure::retryable(0)), 20);
    assert_eq!(failed(&trace), 20);
    assert_eq!(count(&trace, |e| matches!(e, SupervisionAction::AttemptTimedOut { .. })), 0);
    // Off for the restart mode is "once"; off for the backoff restarts at once (min_spacing apart).
    let builder = SupervisionPolicyBuilder { restart: Setting::Off, ..SupervisionPolicy::from_defaults() };
    assert_eq!(builder.build(&d).unwrap().restart(), Restart::Once);
    // Off for max_hint honours any hint (B6); off for restart_after_hint is "no".
    let hinted = TaskDefaults { max_hint: ms(11), restart_after_hint: true, ..d };
    let builder = SupervisionPolicyBuilder {
        max_hint: Setting::Off,
        restart_after_hint: Setting::Off,
        ..SupervisionPolicy::restartable()
    };
    let p = builder.build(&hinted).unwrap();
    assert_eq!((p.max_hint(), p.restarts_after_hint()), (Duration::MAX, false));
    let p = SupervisionPolicy::restartable().no_backoff().unlimited_retries().build(&d).unwrap();
    let trace = drive(&p, |_| Step::Fail(0, Failure::retryable(0)), 3);
    assert_eq!(starts(&trace), vec![at(1_000), at(1_001), at(1_002), at(1_003)]);
}

#[test]
fn s2_defaults_are_200ms_x2_cap_30s_equal_jitter_no_timeout_unlimited_retries() {
    let expected = Backoff::exponential(ms(200), 2.0).max_delay(Duration::from_secs(30)).jitter(Jitter::Equal);
    let d = TaskDefaults::default();
    assert_eq!(d.backoff, expected.build().unwrap());
    assert_eq!(d.restart, Restart::Restartable, "restart on failure");
    assert_eq!((d.attempt_timeout, d.max_retries, d.min_spacing), (None, None, ms(1)));
    assert_eq!((d.max_hint, d.restart_after_hint), (DEFAULT_MAX_HINT, false), "hints up to 5 min (B6)");
    assert_eq!(DEFAULT_MAX_HINT, Duration::from_secs(300));
    let p = SupervisionPolicy::from_defaults().build(&d).unwrap();
    let trace = drive(&p, |_| Step::Fail(0, Failure::retryable(0)), 40);
    assert_eq!(failed(&trace), 40, "unlimited retries");
    let mut n = 0;
    for (_, e) in &trace {
        if let SupervisionAction::BackoffScheduled { delay, .. } = e {
            n += 1;
            let envelope = d.backoff.envelope(n);
            assert!(*delay >= envelope / 2 && *delay <= envelope, "delay {n}: {delay:?} vs {envelope:?}");
        }
    }
    assert_eq!(d.backoff.envelope(40), Duration::from_secs(30));
}

#[test]
fn s3_a_limit_of_three_gives_exactly_four_failed_attempts() {
    let p = SupervisionPolicy::restartable().max_retries(3).build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Fail(1, Failure::retryable(a as u32)), 100);
    assert_eq!(failed(&trace), 4);
    assert_eq!(starts(&trace).len(), 4);
    assert_eq!(outcome(&trace), TaskOutcome::Failed { last_failure: lf(FailureClass::Retryable, 4) });
    check_grammar(&trace);
}

#[test]
fn s3_zero_max_retries_is_a_configuration_error_set_or_inherited() {
    let zero = Err(PolicyError::Zero {
        setting: "max_retries",
        why: "it counts retries after the first failure; use SupervisionPolicy::once() for no retries",
    });
    assert_eq!(SupervisionPolicy::restartable().max_retries(0).build(&defaults()), zero);
    let d = TaskDefaults { max_retries: Some(0), ..defaults() };
    assert_eq!(SupervisionPolicy::restartable().build(&d), zero);
    assert!(SupervisionPolicy::restartable().unlimited_retries().build(&d).is_ok(), "off wins over the bad default");
    assert!(matches!(
        SupervisionPolicy::restartable().attempt_timeout(Duration::ZERO).build(&d),
        Err(PolicyError::Zero { setting: "max_retries" | "attempt_timeout", .. })
    ));
}

#[test]
fn s3_a_success_resets_the_count() {
    // Limit 3 (4 failures in a row). Three failures, a success, three failures, a success:
    // 12 failures in all, never 4 in a row, so it never finishes Failed.
    let p = SupervisionPolicy::periodic(ms(10)).max_retries(3).build(&flat()).unwrap();
    let trace = drive(&p, |a| if a % 4 == 0 { Step::Succeed(1) } else { Step::Fail(1, Failure::retryable(0)) }, 16);
    assert_eq!(failed(&trace), 12);
    assert_eq!(outcome(&trace).kind(), TaskOutcomeKind::Canceled);
    // The same task without the successes fails on the third failure.
    let trace = drive(&p, |_| Step::Fail(1, Failure::retryable(0)), 16);
    assert_eq!(failed(&trace), 4);
    assert_eq!(outcome(&trace).kind(), TaskOutcomeKind::Failed);
}

#[test]
fn s3_successful_repeats_are_never_limited() {
    let p = SupervisionPolicy::periodic(Duration::ZERO).max_retries(1).build(&flat()).unwrap();
    let trace = drive(&p, |_| Step::Succeed(0), 500);
    assert_eq!(count(&trace, |e| matches!(e, SupervisionAction::AttemptSucceeded { .. })), 500);
}

#[test]
fn s4_fatal_and_do_not_retry_finish_fatal() {
    let p = SupervisionPolicy::restartable().build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Fail(1, Failure::fatal(a as u32)), 10);
    assert_eq!(outcome(&trace), TaskOutcome::Fatal { failure: lf(FailureClass::Fatal, 1) });
    assert_eq!(starts(&trace).len(), 1);
    let trace = drive(&p, |a| Step::Fail(1, Failure::do_not_retry(a as u32)), 10);
    assert_eq!(outcome(&trace), TaskOutcome::Fatal { failure: lf(FailureClass::DoNotRetry, 1) });
    check_grammar(&trace);
}

#[test]
fn s4_canceled_finishes_canceled_with_an_attempt_canceled_event() {
    let p = SupervisionPolicy::periodic(ms(1)).build(&flat()).unwrap();
    let trace = drive(&p, |a| if a < 3 { Step::Succeed(1) } else { Step::Fail(1, Failure::canceled(7)) }, 10);
    assert_eq!(outcome(&trace), TaskOutcome::Canceled { last_failure: Some(lf(FailureClass::Canceled, 7)) });
    assert!(trace.iter().any(|(_, e)| *e == SupervisionAction::AttemptCanceled { attempt: 3 }));
    check_grammar(&trace);
}

#[test]
fn s4_a_retryable_failure_that_is_not_retried_finishes_failed() {
    let p = SupervisionPolicy::restartable().max_retries(1).build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Fail(1, Failure::panicked(a as u32)), 10);
    assert_eq!(outcome(&trace), TaskOutcome::Failed { last_failure: lf(FailureClass::Panicked, 2) });
    assert_eq!(starts(&trace).len(), 2, "a panic caught while running is retried");
}

#[test]
fn s4_a_configured_timeout_is_attempt_timed_out_and_a_retryable_timeout() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let trace = drive(&p, |a| if a < 3 { Step::Hang { drop_panics: false } } else { Step::Succeed(1) }, 10);
    assert_eq!(count(&trace, |e| matches!(e, SupervisionAction::AttemptTimedOut { .. })), 2);
    assert_eq!(failed(&trace), 0);
    assert_eq!(outcome(&trace), TaskOutcome::Completed);
    // Attempt 1 starts at 1000 with deadline 1030, times out, and backs off 100 ms.
    assert_eq!(trace[0], (at(1_000), SupervisionAction::AttemptStarting { attempt: 1, deadline: Some(at(1_030)) }));
    assert_eq!(trace[1], (at(1_030), SupervisionAction::AttemptTimedOut { attempt: 1 }));
    assert_eq!(
        trace[2],
        (at(1_030), SupervisionAction::BackoffScheduled { next_attempt: 2, delay: ms(100), until: at(1_130) })
    );
    check_grammar(&trace);
}

#[test]
fn s4_a_timeout_returned_by_the_task_is_attempt_failed() {
    let p = SupervisionPolicy::once().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Fail(5, Failure::timeout(a as u32)), 10);
    assert_eq!(trace[1].1, SupervisionAction::AttemptFailed { attempt: 1, class: FailureClass::Timeout });
    assert_eq!(outcome(&trace), TaskOutcome::Failed { last_failure: lf(FailureClass::Timeout, 1) });
}

#[test]
fn s4_a_timed_out_attempt_that_is_not_retried_finishes_timed_out() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).max_retries(1).build(&flat()).unwrap();
    let trace = drive(&p, |_| Step::Hang { drop_panics: false }, 10);
    assert_eq!(outcome(&trace), TaskOutcome::TimedOut);
    assert_eq!(starts(&trace).len(), 2);
    check_grammar(&trace);
}

#[test]
fn s4_a_panic_while_dropping_a_timed_out_attempt_finishes_panicked_without_retry() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Hang { drop_panics: a == 2 }, 10);
    assert_eq!(outcome(&trace), TaskOutcome::Panicked { error: 2 });
    assert_eq!(starts(&trace).len(), 2);
    let tail: Vec<_> = trace.iter().rev().take(2).map(|(_, e)| *e).collect();
    assert_eq!(
        tail,
        vec![
            SupervisionAction::TaskFinished { outcome: TaskOutcome::Panicked { error: 2 }, attempts: 2 },
            SupervisionAction::AttemptTimedOut { attempt: 2 }
        ]
    );
    check_grammar(&trace);
}

#[test]
fn s4_a_retry_after_hint_sets_the_delay() {
    let p = SupervisionPolicy::restartable().max_retries(2).build(&flat()).unwrap();
    let trace = drive(&p, |a| Step::Fail(0, Failure::retry_after(ms(700), a as u32)), 10);
    assert_eq!(starts(&trace), vec![at(1_000), at(1_700), at(2_400)]);
}

#[test]
fn s4_a_hint_past_max_hint_finishes_the_task_deferred_with_the_hinted_instant() {
    // B6 as revised: a hint is never shortened to `max_hint`; one past it ends the task at once,
    // `Deferred` with the hinted instant, so that the caller can come back then.
    let p = SupervisionPolicy::restartable().max_hint(Duration::from_secs(1)).build(&flat()).unwrap();
    assert_eq!(p.max_hint(), Duration::from_secs(1));
    let mut r = rng();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&p, at(1_000)).unwrap();
    drain(&mut task);
    task.handle_failure(&p, at(1_005), 1, Failure::retry_after(ms(1_001), 7), &mut r).unwrap();
    let deferred = TaskOutcome::Deferred { retry_at: at(2_006), last_failure: lf(FailureClass::RetryAfter, 7) };
    assert_eq!(
        drain(&mut task),
        vec![
            SupervisionAction::AttemptFailed { attempt: 1, class: FailureClass::RetryAfter },
            SupervisionAction::TaskFinished { outcome: deferred, attempts: 1 },
        ]
    );
    assert_eq!(deferred.kind(), TaskOutcomeKind::Deferred);
    assert_eq!(task.status(), SupervisionStatus::Finished(TaskOutcomeKind::Deferred));
    assert_eq!(task.poll_timeout(), None, "nothing is timed: the caller comes back at retry_at");
    assert_eq!(task.streak(), 1, "the hinted failure is counted");
    // A hint of exactly max_hint is honoured, in full.
    let trace =
        drive(&p, |a| if a == 1 { Step::Fail(5, Failure::retry_after(ms(1_000), 1)) } else { Step::Succeed(1) }, 9);
    assert_eq!(starts(&trace), vec![at(1_000), at(2_005)]);
    assert_eq!(outcome(&trace), TaskOutcome::Completed);
    // The default max_hint is DEFAULT_MAX_HINT (5 min): a `Retry-After` date 301 s away defers.
    let p = SupervisionPolicy::restartable().build(&flat()).unwrap();
    assert_eq!(p.max_hint(), DEFAULT_MAX_HINT);
    let later = at(1_005 + 301_000);
    let trace = drive(&p, |a| Step::Fail(5, Failure::new(FailureKind::Hinted(Hint::At(later)), a as u32)), 9);
    assert_eq!(
        outcome(&trace),
        TaskOutcome::Deferred { retry_at: later, last_failure: lf(FailureClass::RetryAfter, 1) }
    );
    check_grammar(&trace);
    // With max_hint = Duration::MAX any hint is honoured: an hour is waited, not deferred.
    let p = SupervisionPolicy::restartable().max_hint(Duration::MAX).build(&flat()).unwrap();
    let hour = Duration::from_secs(3_600);
    let trace = drive(&p, |a| if a == 1 { Step::Fail(5, Failure::retry_after(hour, 1)) } else { Step::Succeed(1) }, 9);
    assert_eq!(starts(&trace), vec![at(1_000), at(1_005) + hour]);
    // A max_hint of zero has no meaning.
    assert!(matches!(
        SupervisionPolicy::restartable().max_hint(Duration::ZERO).build(&flat()),
        Err(PolicyError::Zero { setting: "max_hint", .. })
    ));
}

#[test]
fn s5_a_hinted_delay_is_never_shortened_but_min_spacing_may_lengthen_it() {
    // B6: the hint replaces the backoff (100 ms here) for one delay, longer or shorter, and
    // nothing shortens it, not even the backoff's cap; S5: `min_spacing` can only lengthen it.
    let p = SupervisionPolicy::restartable().min_spacing(ms(500)).build(&flat()).unwrap();
    let trace = drive(
        &p,
        |a| match a {
            1 => Step::Fail(10, Failure::retry_after(ms(50), 1)),
            2 => Step::Fail(10, Failure::retry_after(ms(700), 2)),
            3 => Step::Fail(10, Failure::new(FailureKind::Hinted(Hint::At(at(0))), 3)), // in the past: now
            _ => Step::Succeed(1),
        },
        9,
    );
    let waits: Vec<_> = trace
        .iter()
        .filter_map(|(_, e)| match e {
            SupervisionAction::BackoffScheduled { delay, until, .. } => Some((*delay, *until)),
            _ => None,
        })
        .collect();
    assert_eq!(
        waits,
        vec![
            (ms(490), at(1_500)), // 50 ms hinted, lengthened to 500 ms after the start at 1000
            (ms(700), at(2_210)), // 700 ms hinted: longer than the spacing and the 100 ms cap
            (ms(490), at(2_710)), // "now", lengthened to the spacing
        ]
    );
    assert_eq!(outcome(&trace), TaskOutcome::Completed);
    check_grammar(&trace);
    // Without spacing, the hint is waited exactly, even when the backoff says more.
    let p = SupervisionPolicy::restartable().min_spacing(Duration::ZERO).build(&flat()).unwrap();
    let trace =
        drive(&p, |a| if a < 3 { Step::Fail(10, Failure::retry_after(ms(30), 0)) } else { Step::Succeed(1) }, 9);
    assert_eq!(starts(&trace), vec![at(1_000), at(1_040), at(1_080)]);
}

#[test]
fn b6_restart_after_hint_restarts_the_supervision_backoff_while_failures_keep_counting() {
    let backoff = Backoff::exponential(ms(100), 2.0).max_delay(ms(60_000)).jitter(Jitter::None).build().unwrap();
    let build = |restart: bool| {
        SupervisionPolicy::restartable()
            .backoff(backoff)
            .min_spacing(Duration::ZERO)
            .max_retries(4)
            .restart_after_hint(restart)
            .build(&defaults())
            .unwrap()
    };
    // Retryable, retryable, hinted 50 ms, retryable, retryable: the waits and the streak after
    // each failure.
    let run = |p: &SupervisionPolicy| {
        let mut r = rng();
        let mut task = Supervision::<u32>::new();
        let mut now = at(0);
        task.handle_start(p, now).unwrap();
        drain(&mut task);
        let mut seen = Vec::new();
        for attempt in 1..=5u64 {
            let failure = if attempt == 3 { Failure::retry_after(ms(50), 3) } else { Failure::retryable(0) };
            task.handle_failure(p, now, attempt, failure, &mut r).unwrap();
            let actions = drain(&mut task);
            let wait = actions.iter().find_map(|e| match e {
                SupervisionAction::BackoffScheduled { delay, .. } => Some(*delay),
                _ => None,
            });
            seen.push((wait, task.streak()));
            if let Some(until) = task.poll_timeout() {
                now = until;
                task.handle_timeout(p, now);
                drain(&mut task);
            }
        }
        (seen, task.status())
    };
    let restarting = build(true);
    assert!(restarting.restarts_after_hint());
    let (seen, status) = run(&restarting);
    assert_eq!(
        seen,
        vec![
            (Some(ms(100)), 1),
            (Some(ms(200)), 2),
            (Some(ms(50)), 3),
            (Some(ms(100)), 4), // the schedule started over after the hint...
            (None, 5),          // ...but the streak did not: 5 failures in a row end it (S3)
        ]
    );
    assert_eq!(status, SupervisionStatus::Finished(TaskOutcomeKind::Failed));
    let (seen, status) = run(&build(false));
    assert_eq!(
        seen,
        vec![(Some(ms(100)), 1), (Some(ms(200)), 2), (Some(ms(50)), 3), (Some(ms(800)), 4), (None, 5)],
        "without the restart the schedule keeps its place (the 4th delay is 800 ms)"
    );
    assert_eq!(status, SupervisionStatus::Finished(TaskOutcomeKind::Failed));
}

#[test]
fn s5_the_first_attempt_is_immediate() {
    let p = SupervisionPolicy::periodic(Duration::from_secs(3600)).build(&defaults()).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&p, at(42)).unwrap();
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptStarting { attempt: 1, deadline: None }));
    assert_eq!(task.status(), SupervisionStatus::Running { attempt: 1, deadline: None });
}

#[test]
fn s5_the_periodic_interval_runs_from_the_end_of_a_successful_attempt() {
    let p = SupervisionPolicy::periodic(ms(50)).build(&flat()).unwrap();
    // Attempts take 30 ms: fixed delay gives starts 80 ms apart (not 50: not wall-clock rate).
    let trace = drive(&p, |_| Step::Succeed(30), 4);
    assert_eq!(starts(&trace)[..4], [at(1_000), at(1_080), at(1_160), at(1_240)]);
}

#[test]
fn s5_periodic_starts_are_at_least_1ms_apart_with_a_zero_interval() {
    let p = SupervisionPolicy::periodic(Duration::ZERO).build(&defaults()).unwrap();
    let trace = drive(&p, |_| Step::Succeed(0), 50);
    let starts = starts(&trace);
    assert_eq!(starts.len(), 51, "50 attempts, and the 51st start that is canceled");
    for pair in starts.windows(2) {
        assert_eq!(pair[1].saturating_duration_since(pair[0]), ms(1));
    }
    // The same with attempts of 0.4 ms: the start, not the end, is what is spaced.
    let mut task = Supervision::<u32>::new();
    let mut now = Instant::from_micros(0);
    task.handle_start(&p, now).unwrap();
    task.poll_action();
    now = Instant::from_micros(400);
    task.handle_success(&p, now, 1).unwrap();
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptSucceeded { attempt: 1 }));
    assert_eq!(
        task.poll_action(),
        Some(SupervisionAction::BackoffScheduled { next_attempt: 2, delay: Duration::from_micros(600), until: at(1) })
    );
}

#[test]
fn s5_min_spacing_is_configurable() {
    let p = SupervisionPolicy::periodic(Duration::ZERO).min_spacing(ms(25)).build(&defaults()).unwrap();
    let trace = drive(&p, |_| Step::Succeed(10), 3);
    assert_eq!(starts(&trace)[..3], [at(1_000), at(1_025), at(1_050)]);
    let p = SupervisionPolicy::periodic(Duration::ZERO).min_spacing(Duration::ZERO).build(&defaults()).unwrap();
    let trace = drive(&p, |_| Step::Succeed(0), 3);
    assert_eq!(starts(&trace)[..3], [at(1_000), at(1_000), at(1_000)]);
}

#[test]
fn s6_events_come_in_order_with_exactly_one_task_finished() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(40)).max_retries(5).build(&flat()).unwrap();
    let trace = drive(
        &p,
        |a| match a {
            1 => Step::Fail(3, Failure::retryable(1)),
            2 => Step::Hang { drop_panics: false },
            3 => Step::Fail(3, Failure::timeout(3)),
            _ => Step::Succeed(2),
        },
        10,
    );
    let kinds: Vec<_> = trace.iter().map(|(_, e)| core::mem::discriminant(e)).collect();
    let d = |e: SupervisionAction<u32>| core::mem::discriminant(&e);
    let b = SupervisionAction::BackoffScheduled { next_attempt: 0, delay: Duration::ZERO, until: at(0) };
    assert_eq!(
        kinds,
        vec![
            d(SupervisionAction::AttemptStarting { attempt: 1, deadline: None }),
            d(SupervisionAction::AttemptFailed { attempt: 1, class: FailureClass::Retryable }),
            d(b),
            d(SupervisionAction::AttemptStarting { attempt: 2, deadline: None }),
            d(SupervisionAction::AttemptTimedOut { attempt: 2 }),
            d(b),
            d(SupervisionAction::AttemptStarting { attempt: 3, deadline: None }),
            d(SupervisionAction::AttemptFailed { attempt: 3, class: FailureClass::Timeout }),
            d(b),
            d(SupervisionAction::AttemptStarting { attempt: 4, deadline: None }),
            d(SupervisionAction::AttemptSucceeded { attempt: 4 }),
            d(SupervisionAction::TaskFinished { outcome: TaskOutcome::Completed, attempts: 4 }),
        ]
    );
    check_grammar(&trace);
}

#[test]
fn s6_a_cancel_while_running_ends_the_attempt_then_the_task() {
    let p = SupervisionPolicy::restartable().build(&flat()).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&p, at(0)).unwrap();
    task.poll_action();
    task.handle_cancel(at(5)).unwrap();
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptCanceled { attempt: 1 }));
    assert_eq!(
        task.poll_action(),
        Some(SupervisionAction::TaskFinished { outcome: TaskOutcome::Canceled { last_failure: None }, attempts: 1 })
    );
    assert_eq!(task.poll_action(), None);
    assert_eq!(task.handle_cancel(at(6)), Err(SupervisionError::Finished(TaskOutcomeKind::Canceled)));
}

#[test]
fn s6_an_input_before_the_actions_are_drained_is_refused_and_changes_nothing() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let mut r = rng();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&p, at(0)).unwrap();
    // `AttemptStarting` waits to be drained: every input is refused, and the timeout past the
    // deadline does nothing.
    let before = task;
    let rng_before = r.clone();
    assert_eq!(task.handle_success(&p, at(1), 1), Err(SupervisionError::Undrained));
    let refused = task.handle_failure(&p, at(1), 1, Failure::retryable(9), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (SupervisionError::Undrained, Failure::retryable(9)));
    assert_eq!(task.handle_cancel(at(1)), Err(SupervisionError::Undrained));
    // A validity error takes precedence over `Undrained`.
    assert_eq!(task.handle_success(&p, at(1), 2), Err(SupervisionError::StaleAttempt { current: 1, got: 2 }));
    assert_eq!(task.handle_start(&p, at(1)), Err(SupervisionError::AlreadyStarted));
    let refused = task.handle_abandoned(&p, at(1), 1, None, &mut r).unwrap_err();
    assert_eq!(refused.error, SupervisionError::NothingAbandoned);
    task.handle_timeout(&p, at(500));
    assert_eq!(task, before, "nothing changed, not even the accepted now");
    assert_eq!(r, rng_before, "no randomness was drawn");
    assert_eq!(drain(&mut task), vec![SupervisionAction::AttemptStarting { attempt: 1, deadline: Some(at(30)) }]);
    // Drained: the same failure is accepted. It leaves two actions; draining one is not enough.
    task.handle_failure(&p, at(10), 1, Failure::retryable(9), &mut r).unwrap();
    assert_eq!(
        task.poll_action(),
        Some(SupervisionAction::AttemptFailed { attempt: 1, class: FailureClass::Retryable })
    );
    let before = task;
    task.handle_timeout(&p, at(110)); // the wait's end, with `BackoffScheduled` undrained
    assert_eq!(task.handle_cancel(at(110)), Err(SupervisionError::Undrained));
    assert_eq!(task, before);
    assert_eq!(
        drain(&mut task),
        vec![SupervisionAction::BackoffScheduled { next_attempt: 2, delay: ms(100), until: at(110) }]
    );
    task.handle_timeout(&p, at(110));
    assert_eq!(drain(&mut task), vec![SupervisionAction::AttemptStarting { attempt: 2, deadline: Some(at(140)) }]);
    // A timed-out attempt: the drop is refused until `AttemptTimedOut` is drained.
    task.handle_timeout(&p, at(140));
    let before = task;
    let refused = task.handle_abandoned(&p, at(141), 2, Some(5), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (SupervisionError::Undrained, Some(5)));
    assert_eq!(task, before);
    assert_eq!(drain(&mut task), vec![SupervisionAction::AttemptTimedOut { attempt: 2 }]);
    task.handle_abandoned(&p, at(141), 2, Some(5), &mut r).unwrap();
    assert_eq!(
        drain(&mut task),
        vec![SupervisionAction::TaskFinished { outcome: TaskOutcome::Panicked { error: 5 }, attempts: 2 }]
    );
}

#[test]
fn s_handle_timeout_early_or_twice_and_time_running_backwards_change_nothing() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let mut r = rng();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&p, at(100)).unwrap();
    task.poll_action();
    let before = task;
    task.handle_timeout(&p, at(129));
    assert_eq!(task, before, "early");
    task.handle_timeout(&p, at(130));
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptTimedOut { attempt: 1 }));
    assert_eq!(task.poll_action(), None);
    let after = task;
    task.handle_timeout(&p, at(500));
    assert_eq!(task, after, "twice");
    // A drop reported "before" the timeout is read as at the timeout.
    task.handle_abandoned(&p, at(10), 1, None, &mut r).unwrap();
    assert_eq!(
        task.poll_action(),
        Some(SupervisionAction::BackoffScheduled { next_attempt: 2, delay: ms(100), until: at(230) })
    );
}

#[test]
fn s_misuse_returns_typed_errors_and_hands_the_input_back() {
    let p = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&flat()).unwrap();
    let mut r = rng();
    let mut task = Supervision::<u32>::new();
    assert_eq!(task.handle_success(&p, at(0), 1), Err(SupervisionError::NotStarted));
    task.handle_start(&p, at(0)).unwrap();
    assert_eq!(task.handle_start(&p, at(0)), Err(SupervisionError::AlreadyStarted));
    let refused = task.handle_failure(&p, at(1), 2, Failure::retryable(9), &mut r).unwrap_err();
    assert_eq!(refused.error, SupervisionError::StaleAttempt { current: 1, got: 2 });
    assert_eq!(refused.input, Failure::retryable(9));
    let refused = task.handle_abandoned(&p, at(1), 1, Some(4), &mut r).unwrap_err();
    assert_eq!((refused.error, refused.input), (SupervisionError::NothingAbandoned, Some(4)));
    // The refusals above came while `AttemptStarting` waited to be drained: a validity error
    // takes precedence over `Undrained` (S6). Drain, so that the timeout below is acted on.
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptStarting { attempt: 1, deadline: Some(at(30)) }));
    assert_eq!(task.poll_action(), None);
    task.handle_timeout(&p, at(30));
    assert_eq!(task.handle_success(&p, at(31), 1), Err(SupervisionError::NoAttemptRunning), "it timed out");
    assert_eq!(task.status(), SupervisionStatus::Abandoning { attempt: 1 });
}

// ---------------------------------------------------------------- properties

fn any_policy() -> impl Strategy<Value = SupervisionPolicy> {
    (
        (0..3u8, 0..200u64, prop::option::of(1..6u32), prop::option::of(1..300u64), 0..5u64, 0..3u8),
        (0..3u8, any::<bool>()),
    )
        .prop_map(|((mode, interval, max_retries, timeout, spacing, jitter), (max_hint, restart_after_hint))| {
            let restart = match mode {
                0 => SupervisionPolicy::once(),
                1 => SupervisionPolicy::restartable(),
                _ => SupervisionPolicy::periodic(ms(interval)),
            };
            let jitter = [Jitter::None, Jitter::Full, Jitter::Equal][jitter as usize];
            let backoff = Backoff::exponential(ms(10), 2.0).max_delay(ms(500)).jitter(jitter).build().unwrap();
            let mut b = restart.backoff(backoff).min_spacing(ms(spacing)).restart_after_hint(restart_after_hint);
            b.max_retries = max_retries.map_or(Setting::Off, Setting::Set);
            b.attempt_timeout = timeout.map_or(Setting::Off, |t| Setting::Set(ms(t)));
            // Inherited (5 min), 200 ms (some hints of the scripts defer), or any.
            b.max_hint = [Setting::Inherit, Setting::Set(ms(200)), Setting::Off][max_hint as usize];
            b.build(&defaults()).unwrap()
        })
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..400u64).prop_map(Step::Succeed),
        4 => (0..400u64).prop_map(|d| Step::Fail(d, Failure::retryable(0))),
        1 => (0..400u64).prop_map(|d| Step::Fail(d, Failure::timeout(0))),
        1 => (0..400u64, 0..400u64).prop_map(|(d, h)| Step::Fail(d, Failure::retry_after(ms(h), 0))),
        1 => any::<bool>().prop_map(|p| Step::Hang { drop_panics: p }),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Start(u64),
    Success(u64, u64),
    Failure(u64, u64, u8),
    Abandoned(u64, u64, bool),
    Timeout(u64),
    Cancel(u64),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2_000u64).prop_map(Op::Start),
        (0..2_000u64, 0..4u64).prop_map(|(t, a)| Op::Success(t, a)),
        (0..2_000u64, 0..4u64, 0..8u8).prop_map(|(t, a, k)| Op::Failure(t, a, k)),
        (0..2_000u64, 0..4u64, any::<bool>()).prop_map(|(t, a, p)| Op::Abandoned(t, a, p)),
        (0..2_000u64).prop_map(Op::Timeout),
        (0..2_000u64).prop_map(Op::Cancel),
    ]
}

fn failure_of(k: u8) -> Failure<u32> {
    [
        Failure::retryable(1),
        Failure::fatal(2),
        Failure::canceled(3),
        Failure::timeout(4),
        Failure::panicked(5),
        Failure::retry_after(ms(50), 6),
        Failure::do_not_retry(7),
        Failure::retry_after(Duration::from_secs(3_600), 8), // past the default max_hint
    ][k as usize % 8]
}

/// Applies `op`; `Err` when it was refused (`handle_timeout` is never refused).
fn apply(
    task: &mut Supervision<u32>,
    policy: &SupervisionPolicy,
    op: Op,
    r: &mut ChaCha8Rng,
) -> Result<(), SupervisionError> {
    match op {
        Op::Start(t) => task.handle_start(policy, at(t)),
        Op::Success(t, a) => task.handle_success(policy, at(t), a),
        Op::Failure(t, a, k) => task.handle_failure(policy, at(t), a, failure_of(k), r).map_err(|e| e.error),
        Op::Abandoned(t, a, p) => task.handle_abandoned(policy, at(t), a, p.then_some(9), r).map_err(|e| e.error),
        Op::Timeout(t) => {
            task.handle_timeout(policy, at(t));
            Ok(())
        }
        Op::Cancel(t) => task.handle_cancel(at(t)),
    }
}

/// Runs a scripted task: real timing, arbitrary durations; stops it with a cancel after 30 starts.
fn run_script(policy: &SupervisionPolicy, steps: &[Step]) -> Vec<(Instant, SupervisionAction<u32>)> {
    let adjusted = |a: u64| match steps[(a as usize - 1) % steps.len()] {
        Step::Hang { .. } if policy.attempt_timeout().is_none() => Step::Succeed(1),
        step => step,
    };
    drive(policy, adjusted, 30)
}

proptest! {
    /// G12, and the drain rule (S6): every op is applied to a drained task; when an accepted
    /// one leaves actions, `intruder` (if any) comes before they are drained and must be
    /// refused (or, a timeout, do nothing) without any change; then the actions are drained.
    #[test]
    fn g12_a_refused_input_changes_nothing(
        policy in any_policy(),
        ops in prop::collection::vec((any_op(), prop::option::of(any_op())), 1..60),
        seed in any::<u64>(),
    ) {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut task = Supervision::<u32>::new();
        for (op, intruder) in ops {
            let before = task;
            let rng_before = r.clone();
            if apply(&mut task, &policy, op, &mut r).is_err() {
                prop_assert_eq!(task, before, "{:?} was refused but changed the state", op);
                prop_assert_eq!(&r, &rng_before, "a refused input drew randomness");
            }
            let undrained = { let mut probe = task; probe.poll_action().is_some() };
            if let (Some(intruder), true) = (intruder, undrained) {
                let before = task;
                let rng_before = r.clone();
                let result = apply(&mut task, &policy, intruder, &mut r);
                prop_assert!(result.is_err() || matches!(intruder, Op::Timeout(_)), "{:?} was accepted undrained", intruder);
                prop_assert_eq!(task, before, "{:?} changed an undrained task", intruder);
                prop_assert_eq!(&r, &rng_before);
            }
            while task.poll_action().is_some() {}
        }
    }

    #[test]
    fn s3_limits_are_counted_exactly(policy in any_policy(), steps in prop::collection::vec(any_step(), 1..12)) {
        let trace = run_script(&policy, &steps);
        check_grammar(&trace);
        // Consecutive failed attempts (failed or timed out) never exceed max_retries + 1, and
        // a task finishes Failed/TimedOut by the limit exactly when they reach it.
        let mut streak = 0u32;
        let mut max_streak = 0u32;
        for (_, e) in &trace {
            match e {
                SupervisionAction::AttemptSucceeded { .. } => streak = 0,
                SupervisionAction::AttemptFailed { .. } | SupervisionAction::AttemptTimedOut { .. } => streak += 1,
                _ => {}
            }
            max_streak = max_streak.max(streak);
        }
        let kind = outcome(&trace).kind();
        if let Some(max) = policy.max_retries() {
            prop_assert!(max_streak <= max + 1, "{} failures in a row with max_retries {}", max_streak, max);
        }
        if matches!(kind, TaskOutcomeKind::Failed | TaskOutcomeKind::TimedOut) {
            match (policy.restart(), policy.max_retries()) {
                (Restart::Once, _) => prop_assert_eq!(streak, 1),
                (_, Some(max)) => prop_assert_eq!(streak, max + 1),
                (_, None) => prop_assert!(false, "unlimited retries finished {:?}", kind),
            }
        }
    }

    /// B6: a hinted delay is waited in full (only `min_spacing` may lengthen it), or, past
    /// `max_hint`, the task finishes `Deferred` at once with the hinted instant; a retry limit
    /// reached first finishes it `Failed`.
    #[test]
    fn b6_a_hinted_delay_is_never_shortened_and_one_past_max_hint_defers(policy in any_policy(), steps in prop::collection::vec(any_step(), 1..12)) {
        let trace = run_script(&policy, &steps);
        check_grammar(&trace);
        let mut last_start = at(0);
        for (i, (t, e)) in trace.iter().enumerate() {
            match *e {
                SupervisionAction::AttemptStarting { .. } => last_start = *t,
                SupervisionAction::AttemptFailed { attempt, class: FailureClass::RetryAfter } => {
                    let Step::Fail(_, Failure { kind: FailureKind::Hinted(Hint::After(hint)), .. }) =
                        steps[(attempt as usize - 1) % steps.len()]
                    else {
                        panic!("attempt {attempt} failed with a hint the script does not have");
                    };
                    match trace[i + 1].1 {
                        SupervisionAction::BackoffScheduled { delay, until, .. } => {
                            prop_assert!(hint <= policy.max_hint());
                            prop_assert!(delay >= hint, "the hint {:?} was shortened to {:?}", hint, delay);
                            prop_assert_eq!(until, (*t + hint).later(last_start + policy.min_spacing()));
                        }
                        SupervisionAction::TaskFinished { outcome: TaskOutcome::Deferred { retry_at, last_failure }, .. } => {
                            prop_assert!(hint > policy.max_hint(), "{:?} is within max_hint", hint);
                            prop_assert_eq!(retry_at, *t + hint);
                            prop_assert_eq!(last_failure, lf(FailureClass::RetryAfter, 0));
                        }
                        SupervisionAction::TaskFinished { outcome: TaskOutcome::Failed { .. }, .. } => {
                            prop_assert!(policy.restart() == Restart::Once || policy.max_retries().is_some());
                        }
                        other => prop_assert!(false, "a hinted failure was followed by {:?}", other),
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn s5_starts_respect_the_interval_and_min_spacing(policy in any_policy(), steps in prop::collection::vec(any_step(), 1..12)) {
        let trace = run_script(&policy, &steps);
        let mut last_start: Option<Instant> = None;
        let mut last_success_end: Option<Instant> = None;
        for (t, e) in &trace {
            match e {
                SupervisionAction::AttemptStarting { attempt, .. } => {
                    match last_start {
                        None => prop_assert_eq!((*attempt, *t), (1, at(1_000)), "the first attempt is immediate"),
                        Some(prev) => prop_assert!(t.saturating_duration_since(prev) >= policy.min_spacing()),
                    }
                    if let (Restart::Periodic { interval }, Some(end)) = (policy.restart(), last_success_end) {
                        prop_assert!(t.saturating_duration_since(end) >= interval, "fixed delay from the success's end");
                        prop_assert_eq!(*t, end.saturating_add(interval).later(last_start.unwrap().saturating_add(policy.min_spacing())));
                    }
                    last_start = Some(*t);
                    last_success_end = None;
                }
                SupervisionAction::AttemptSucceeded { .. } => last_success_end = Some(*t),
                _ => {}
            }
        }
    }
}
