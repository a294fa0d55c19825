//! Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a state driven
//! under another policy than the one it was made under follows the new one (or is rebuilt, as the
//! type documents), and a state no sequence of inputs could make is refused when it loads. The
//! per-machine serde tests (`serde.rs`, `breaker.rs`, `budget.rs`, `flow.rs`, `delivery.rs`) hold
//! the rest.

mod common;
use common::drain;

use core::time::Duration;

use persevere::{
    Backoff, Failure, Instant, Outcome, Retry, RetryAction, RetryPolicy, Supervision, SupervisionAction,
    SupervisionPolicy, TaskDefaults, TaskOutcome,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn retry_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(ms(10)).build().unwrap()).max_attempts(max_attempts).build().unwrap()
}

/// A retry that has failed `failures` times under `policy` and sleeps before the next attempt.
fn sleeping_after(policy: &RetryPolicy, failures: u64, rng: &mut ChaCha8Rng) -> (Retry<u32>, Instant) {
    let mut retry = Retry::new();
    let mut now = at(0);
    retry.handle_start(policy, now).unwrap();
    drain(&mut retry);
    for attempt in 1..=failures {
        retry.handle_failure(policy, now, attempt, Failure::retryable(7), rng).unwrap();
        drain(&mut retry);
        now = retry.poll_timeout().unwrap();
        if attempt < failures {
            retry.handle_timeout(policy, now, rng);
            drain(&mut retry);
        }
    }
    (retry, now)
}

#[test]
fn r3_a_retry_woken_under_a_stricter_attempt_limit_finishes_exhausted_instead_of_starting() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (mut retry, until) = sleeping_after(&retry_policy(10), 5, &mut rng);
    // Persisted, then driven under a policy that allows three attempts: a sixth never starts.
    retry.handle_timeout(&retry_policy(3), until, &mut rng);
    let trace = drain(&mut retry);
    assert!(!trace.iter().any(|a| matches!(a, RetryAction::Start { .. })), "{trace:?}");
    assert!(
        matches!(trace.last(), Some(RetryAction::Finish { outcome: Outcome::Exhausted { .. }, stats }) if stats.attempts == 5),
        "{trace:?}"
    );
    // Under its own policy the same state starts attempt 6.
    let (mut retry, until) = sleeping_after(&retry_policy(10), 5, &mut rng);
    retry.handle_timeout(&retry_policy(10), until, &mut rng);
    assert_eq!(drain(&mut retry), vec![RetryAction::Start { attempt: 6, deadline: None }]);
}

#[test]
fn r3_a_wake_up_after_the_total_budget_starts_no_attempt() {
    let policy = RetryPolicy::builder(Backoff::constant(ms(50)).build().unwrap()).total(ms(100)).build().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy, at(0)).unwrap();
    drain(&mut retry);
    retry.handle_failure(&policy, at(0), 1, Failure::retryable(1), &mut rng).unwrap();
    assert!(matches!(drain(&mut retry)[..], [RetryAction::Sleep { until, .. }] if until == at(50)));
    // The sleep ended within the budget, but the driver woke late, past it.
    retry.handle_timeout(&policy, at(200), &mut rng);
    let trace = drain(&mut retry);
    assert!(
        matches!(trace[..], [RetryAction::Finish { outcome: Outcome::OutOfTime { .. }, stats }] if stats.slept == ms(200)),
        "{trace:?}"
    );
}

fn task_drain<E>(task: &mut Supervision<E>) -> Vec<SupervisionAction<E>> {
    core::iter::from_fn(|| task.poll_action()).collect()
}

#[test]
fn s1_a_task_waiting_to_repeat_driven_under_a_policy_that_does_not_repeat_completes() {
    let defaults = TaskDefaults::new();
    let periodic = SupervisionPolicy::periodic(ms(100)).build(&defaults).unwrap();
    let once = SupervisionPolicy::once().build(&defaults).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&periodic, at(0)).unwrap();
    task_drain(&mut task);
    task.handle_success(&periodic, at(5), 1).unwrap();
    task_drain(&mut task);
    let until = task.poll_timeout().unwrap();
    task.handle_timeout(&once, until);
    assert_eq!(
        task_drain(&mut task),
        vec![SupervisionAction::TaskFinished { outcome: TaskOutcome::Completed, attempts: 1 }]
    );
}

#[test]
fn s3_a_task_waiting_to_retry_past_a_stricter_limit_fails() {
    let defaults = TaskDefaults::new();
    let lenient = SupervisionPolicy::restartable().max_retries(10).build(&defaults).unwrap();
    let strict = SupervisionPolicy::restartable().max_retries(1).build(&defaults).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut task = Supervision::<u32>::new();
    let mut now = at(0);
    task.handle_start(&lenient, now).unwrap();
    task_drain(&mut task);
    for attempt in 1..=3 {
        task.handle_failure(&lenient, now, attempt, Failure::retryable(9), &mut rng).unwrap();
        task_drain(&mut task);
        now = task.poll_timeout().unwrap();
        if attempt < 3 {
            task.handle_timeout(&lenient, now);
            task_drain(&mut task);
        }
    }
    // Three failures in a row: one retry is all the strict policy allows, so no fourth attempt.
    task.handle_timeout(&strict, now);
    let trace = task_drain(&mut task);
    assert!(
        matches!(trace[..], [SupervisionAction::TaskFinished { outcome: TaskOutcome::Failed { .. }, attempts: 3 }]),
        "{trace:?}"
    );
}

#[cfg(feature = "serde")]
mod on_load {
    use serde_json::{Value, json};

    use super::*;

    fn refused<T: serde::de::DeserializeOwned + core::fmt::Debug>(state: Value, what: &str, why: &str) {
        let error = serde_json::from_value::<T>(state).expect_err(why).to_string();
        assert!(error.contains(what), "{why}: {error}");
    }

    /// Found in review: each loaded, then drained actions no transition could make.
    #[test]
    fn pending_actions_must_be_ones_an_input_leaves_in_that_phase() {
        let policy = retry_policy(3);
        let mut retry = Retry::<u32>::new();
        retry.handle_start(&policy, at(0)).unwrap();
        let running = serde_json::to_value(retry).unwrap();
        serde_json::from_value::<Retry<u32>>(running.clone()).unwrap();

        let mut s = running.clone();
        s["engine"]["pending"] = json!(1 | 4);
        refused::<Retry<u32>>(s, "invalid state of a Retry", "an attempt's end pending beside its own start");

        let mut s = running;
        s["engine"]["phase"] = json!({ "Finished": "Succeeded" });
        s["engine"]["attempt"] = json!(0);
        s["engine"]["pending"] = json!(8);
        refused::<Retry<u32>>(s, "invalid state of a Retry", "a success without any attempt");
    }

    #[test]
    fn a_supervised_attempts_end_to_report_must_fit_what_followed_it() {
        let defaults = TaskDefaults::new();
        let policy = SupervisionPolicy::restartable().attempt_timeout(ms(10)).build(&defaults).unwrap();
        let mut task = Supervision::<u32>::new();
        task.handle_start(&policy, at(0)).unwrap();
        task_drain(&mut task);
        task.handle_timeout(&policy, at(10)); // AttemptTimedOut waits to be drained
        let timed_out = serde_json::to_value(task).unwrap();
        serde_json::from_value::<Supervision<u32>>(timed_out.clone()).unwrap();
        let mut s = timed_out;
        s["ended"] = json!("Succeeded");
        refused::<Supervision<u32>>(s, "invalid state of a Supervision", "a timed-out attempt reported as a success");
    }
}

#[cfg(feature = "serde")]
#[test]
fn r1_a_loaded_retry_at_the_last_attempt_number_never_hands_it_out_again() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let unlimited = retry_policy(u32::MAX);
    let (retry, until) = sleeping_after(&unlimited, 1, &mut rng);
    // A state whose attempt number has reached `u64::MAX` (edited, or after 2^64 attempts):
    // there is no new number for another attempt.
    let mut json: serde_json::Value = serde_json::to_value(retry).unwrap();
    json["engine"]["attempt"] = serde_json::Value::from(u64::MAX);
    let mut retry: Retry<u32> = serde_json::from_value(json).expect("a sleeping retry at any attempt number loads");
    retry.handle_timeout(&unlimited, until, &mut rng);
    let trace = drain(&mut retry);
    assert!(!trace.iter().any(|a| matches!(a, RetryAction::Start { .. })), "{trace:?}");
    assert!(matches!(trace.last(), Some(RetryAction::Finish { outcome: Outcome::Exhausted { .. }, .. })), "{trace:?}");
}

/// Found by the `supervision_state` fuzz target: a periodic task waiting to repeat after a
/// success at the last attempt number (`u64::MAX`: edited, or after 2^64 attempts) has no number
/// for a repeat. It finished `Failed` with no failure to report (so `TaskFinished` said
/// `Canceled`, and the state it left was refused when it loaded again); nothing failed, so it
/// completes.
#[cfg(feature = "serde")]
#[test]
fn s4_a_loaded_periodic_task_with_no_attempt_number_left_to_repeat_completes() {
    let defaults = TaskDefaults::new();
    let periodic = SupervisionPolicy::periodic(ms(100)).build(&defaults).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&periodic, at(0)).unwrap();
    task_drain(&mut task);
    task.handle_success(&periodic, at(5), 1).unwrap();
    task_drain(&mut task);
    let until = task.poll_timeout().unwrap();
    let mut json: serde_json::Value = serde_json::to_value(task).unwrap();
    json["engine"]["attempt"] = serde_json::Value::from(u64::MAX);
    let mut task: Supervision<u32> =
        serde_json::from_value(json).expect("a task waiting to repeat at any attempt number loads");
    task.handle_timeout(&periodic, until);
    let reloaded = serde_json::to_value(task).unwrap();
    assert_eq!(
        task_drain(&mut task),
        vec![SupervisionAction::TaskFinished { outcome: TaskOutcome::Completed, attempts: u64::MAX }]
    );
    assert_eq!(task.last_failure(), None);
    let reloaded: Supervision<u32> =
        serde_json::from_value(reloaded).expect("the state the wake-up left loads again, its outcome undrained");
    assert_eq!(reloaded.status(), persevere::SupervisionStatus::Finished(persevere::TaskOutcomeKind::Completed));
}
