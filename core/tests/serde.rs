//! With the `serde` feature, policies and states round-trip as plain data, a persisted policy
//! is validated again when loaded, and so is a persisted state: one that no sequence of inputs
//! could have made is refused.
#![cfg(feature = "serde")]

use std::time::Duration;

use persevere::{Backoff, DEFAULT_MAX_HINT, Failure, Instant, Jitter, PolicyError, Retry, RetryAction, RetryPolicy};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde_json::{Value, json};

fn policy() -> RetryPolicy {
    RetryPolicy::builder(Backoff::exponential(Duration::from_millis(10), 2.0).jitter(Jitter::Full).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap()
}

#[test]
fn a_retry_in_flight_round_trips_and_continues_identically() {
    let policy = policy();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy, Instant::ZERO).unwrap();
    while retry.poll_action().is_some() {}
    retry.handle_failure(&policy, Instant::from_millis(3), 1, Failure::retryable(17), &mut rng).unwrap();

    // Persisted with its sleep still to be drained.
    let json = serde_json::to_string(&retry).unwrap();
    let mut restored: Retry<u32> = serde_json::from_str(&json).unwrap();
    assert_eq!(restored, retry);
    let policy_json = serde_json::to_string(&policy).unwrap();
    assert_eq!(serde_json::from_str::<RetryPolicy>(&policy_json).unwrap(), policy);
    let sleep = retry.poll_action();
    assert!(matches!(sleep, Some(RetryAction::Sleep { next_attempt: 2, .. })), "{sleep:?}");
    assert_eq!(restored.poll_action(), sleep);

    // And both continue identically to the end.
    let (mut a, mut b) = (rng.clone(), rng);
    let until = retry.poll_timeout().unwrap();
    retry.handle_timeout(&policy, until, &mut a);
    restored.handle_timeout(&policy, until, &mut b);
    for t in [&mut retry, &mut restored] {
        assert_eq!(t.poll_action(), Some(RetryAction::Start { attempt: 2, deadline: None }));
        t.handle_success(until, 2).unwrap();
    }
    assert_eq!(restored.poll_action(), retry.poll_action());
    assert_eq!(restored, retry);
}

#[test]
fn an_invalid_persisted_policy_is_refused_on_load() {
    let policy = Backoff::exponential(Duration::from_millis(10), 2.0).build().unwrap();
    let json = serde_json::to_string(&policy).unwrap().replace("2.0", "0.5");
    let err = serde_json::from_str::<Backoff>(&json).unwrap_err().to_string();
    assert!(err.contains("multiplier"), "{err}");
}

/// R3 and B6 on load: a persisted retry policy goes through the builder again.
#[test]
fn a_persisted_retry_policy_is_validated_again_on_load() {
    let mut v = serde_json::to_value(policy()).unwrap();
    // Without a limit, and without `unbounded`, it is refused (R3).
    v["max_attempts"] = Value::Null;
    let err = serde_json::from_value::<RetryPolicy>(v.clone()).unwrap_err().to_string();
    assert!(err.contains(&PolicyError::Unbounded.to_string()), "{err}");
    // Unbounded on purpose, it loads.
    v["unbounded"] = json!(true);
    assert!(serde_json::from_value::<RetryPolicy>(v.clone()).unwrap().is_unbounded());
    // A zero `max_hint` is refused.
    v["max_hint"] = serde_json::to_value(Duration::ZERO).unwrap();
    let err = serde_json::from_value::<RetryPolicy>(v).unwrap_err().to_string();
    assert!(err.contains("max_hint"), "{err}");

    // A policy persisted before `max_hint`, `restart_after_hint` and `unbounded` existed
    // loads with their defaults.
    let mut old = serde_json::to_value(policy()).unwrap();
    for key in ["max_hint", "restart_after_hint", "unbounded"] {
        old.as_object_mut().unwrap().remove(key).unwrap();
    }
    let loaded = serde_json::from_value::<RetryPolicy>(old).unwrap();
    assert_eq!(loaded, policy());
    assert_eq!(loaded.max_hint(), DEFAULT_MAX_HINT);

    // `max_hint(Duration::MAX)` ("any hint") round-trips.
    let any_hint = RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build().unwrap())
        .max_attempts(2)
        .max_hint(Duration::MAX)
        .build()
        .unwrap();
    let loaded = serde_json::from_str::<RetryPolicy>(&serde_json::to_string(&any_hint).unwrap()).unwrap();
    assert_eq!(loaded, any_hint);
    assert_eq!(loaded.max_hint(), Duration::MAX);

    // Before the default, `max_hint` was optional and a policy without one saved
    // `"max_hint": null`, meaning "honour any hint": it keeps that meaning.
    let mut old = serde_json::to_value(policy()).unwrap();
    old["max_hint"] = Value::Null;
    assert_eq!(serde_json::from_value::<RetryPolicy>(old).unwrap().max_hint(), Duration::MAX);
}

/// A started retry, its attempt 1 failed and its sleep drained, as JSON.
fn a_sleeping_retry() -> Value {
    let policy = policy();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy, Instant::from_millis(5)).unwrap();
    while retry.poll_action().is_some() {}
    retry.handle_failure(&policy, Instant::from_millis(8), 1, Failure::retryable(17), &mut rng).unwrap();
    while retry.poll_action().is_some() {}
    serde_json::to_value(retry).unwrap()
}

/// A started retry whose attempt 1 runs, its start not drained yet, as JSON.
fn a_running_retry() -> Value {
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy(), Instant::from_millis(5)).unwrap();
    serde_json::to_value(retry).unwrap()
}

/// Loads `state` and expects it refused for `why`.
fn refused(state: Value, why: &str) {
    let err = match serde_json::from_value::<Retry<u32>>(state.clone()) {
        Ok(loaded) => panic!("{why}: loaded {loaded:?} from {state}"),
        Err(err) => err.to_string(),
    };
    // Refused by the retry, or by the backoff state it holds.
    assert!(
        err.contains("invalid state of a Retry") || err.contains("invalid state of a BackoffState"),
        "{why}: {err}"
    );
}

#[test]
fn a_deserialized_retry_that_no_transition_could_have_made_is_refused() {
    // The untouched states load (so each refusal below is the edit's doing).
    for state in [a_running_retry(), a_sleeping_retry(), serde_json::to_value(Retry::<u32>::new()).unwrap()] {
        serde_json::from_value::<Retry<u32>>(state).unwrap();
    }

    let mut s = a_running_retry();
    s["engine"]["attempt"] = json!(0);
    refused(s, "a running operation at attempt 0");

    let mut s = a_sleeping_retry();
    s["engine"]["attempt"] = json!(0);
    refused(s, "a sleeping operation at attempt 0");

    let mut s = a_running_retry();
    s["engine"]["pending"] = json!(16);
    refused(s, "an unknown pending bit");

    let mut s = a_running_retry();
    s["engine"]["pending"] = json!(4 | 128);
    refused(s, "an unknown pending bit beside a known one");

    let mut s = a_running_retry();
    s["engine"]["pending"] = json!(2);
    refused(s, "a pending sleep while an attempt runs");

    let mut s = a_sleeping_retry();
    s["engine"]["pending"] = json!(8);
    refused(s, "a pending finish while sleeping");

    let mut s = serde_json::to_value(Retry::<u32>::new()).unwrap();
    s["engine"]["pending"] = json!(4);
    refused(s, "a pending start before the start");

    let mut s = serde_json::to_value(Retry::<u32>::new()).unwrap();
    s["engine"]["attempt"] = json!(3);
    refused(s, "an operation that has not started at attempt 3");

    let mut s = a_sleeping_retry();
    s["engine"]["backoff"]["restarted_at"] = json!(2);
    refused(s, "a schedule restarted after more failures than the streak has");

    let mut s = a_sleeping_retry();
    s["first_start"] = json!(Instant::from_millis(9).as_nanos());
    refused(s, "a first attempt that started after the latest accepted instant");

    let mut s = a_sleeping_retry();
    s["slept_ns"] = json!(Duration::from_millis(4).as_nanos() as u64);
    refused(s, "more time asleep than has passed");

    let mut s = a_sleeping_retry();
    s["engine"]["phase"] = json!({ "Finished": "Exhausted" });
    s["engine"]["pending"] = json!(8);
    s["engine"]["last_failure"] = Value::Null;
    refused(s, "an exhausted outcome still to report, without its failure");

    // Found by the `retry_state` fuzz target: both would later answer wrongly (a streak longer
    // than the attempts exhausts the limit early; a rejected wait without a failure reported a
    // made-up outcome).
    let mut s = a_running_retry();
    s["engine"]["backoff"]["failures"] = json!(1);
    refused(s, "a running first attempt with a failure already counted");

    let mut s = a_sleeping_retry();
    s["engine"]["last_failure"] = Value::Null;
    refused(s, "a retry that waits without a failure");
}

/// A state persisted while the outcome still waits to be drained finishes identically.
#[test]
fn a_finished_retry_round_trips_with_its_outcome_still_to_drain() {
    let policy = policy();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy, Instant::ZERO).unwrap();
    while retry.poll_action().is_some() {}
    retry
        .handle_failure(
            &policy,
            Instant::from_millis(1),
            1,
            Failure::retry_after(Duration::from_secs(3_600), 4),
            &mut rng,
        )
        .unwrap();
    let mut restored: Retry<u32> = serde_json::from_str(&serde_json::to_string(&retry).unwrap()).unwrap();
    assert_eq!(restored, retry);
    let finish = retry.poll_action();
    assert!(matches!(finish, Some(RetryAction::Finish { outcome: persevere::Outcome::Deferred { .. }, .. })));
    assert_eq!(restored.poll_action(), finish);
}

/// Core bug (reported): `handle_cancel` before `handle_start` is accepted and finishes the
/// operation `Canceled` at attempt 0, but that state is refused when it loads ("a started
/// operation has no attempt"), so a reachable state cannot be persisted.
#[test]
fn a_retry_canceled_before_its_start_round_trips() {
    let mut retry = Retry::<u32>::new();
    retry.handle_cancel(Instant::from_secs(5)).unwrap();
    let loaded = serde_json::from_str::<Retry<u32>>(&serde_json::to_string(&retry).unwrap());
    assert_eq!(loaded.map_err(|e| e.to_string()), Ok(retry));
}

/// Core bug (reported): the engine's `Abandoning` phase is Supervision's; a `Retry` never
/// enters it, yet one loaded in it is accepted and then hangs (status `Running`, no timeout,
/// every result refused).
#[test]
fn a_retry_in_a_phase_only_supervision_has_is_refused() {
    let mut s = a_sleeping_retry();
    s["engine"]["phase"] = json!("Abandoning");
    refused(s, "a retry abandoning an attempt");
}

/// Core bug (reported): a streak longer than the attempts made is accepted, and then ends the
/// operation `Exhausted` long before its attempt limit (R3).
#[test]
fn a_retry_with_more_failures_than_attempts_is_refused() {
    let mut s = a_sleeping_retry();
    s["engine"]["backoff"]["failures"] = json!(100);
    refused(s, "100 failures in 1 attempt");
}

#[test]
fn a_supervised_task_and_a_flow_round_trip_and_continue_identically() {
    use persevere::{Flow, FlowPolicy, Supervision, SupervisionPolicy, TaskDefaults};

    let policy =
        SupervisionPolicy::periodic(Duration::from_secs(1)).max_retries(3).build(&TaskDefaults::new()).unwrap();
    let json = serde_json::to_string(&policy).unwrap();
    assert_eq!(serde_json::from_str::<SupervisionPolicy>(&json).unwrap(), policy);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut task = Supervision::<u32>::new();
    task.handle_start(&policy, Instant::ZERO).unwrap();
    while task.poll_action().is_some() {}
    task.handle_failure(&policy, Instant::from_millis(2), 1, Failure::retryable(5), &mut rng).unwrap();
    let mut restored: Supervision<u32> = serde_json::from_str(&serde_json::to_string(&task).unwrap()).unwrap();
    assert_eq!(restored, task);
    assert_eq!(restored.poll_action(), task.poll_action());

    let flow_policy = FlowPolicy::builder().with_trip(2).build().unwrap();
    let json = serde_json::to_string(&flow_policy).unwrap();
    assert_eq!(serde_json::from_str::<FlowPolicy>(&json).unwrap(), flow_policy);
    let bad = json.replace("\"trip_after\":2", "\"trip_after\":0");
    assert_ne!(bad, json);
    assert!(serde_json::from_str::<FlowPolicy>(&bad).unwrap_err().to_string().contains("trip limit"));
    let mut flow = Flow::<String>::every(Instant::ZERO, Duration::from_secs(5));
    flow.handle_timeout(Instant::ZERO);
    while flow.poll_action().is_some() {}
    flow.handle_failure(&flow_policy, Instant::from_millis(7), Failure::retryable("down".into()), &mut rng).unwrap();
    let restored: Flow<String> = serde_json::from_str(&serde_json::to_string(&flow).unwrap()).unwrap();
    assert_eq!(restored, flow);
    assert_eq!(restored.info(), flow.info());
}

#[test]
fn a_loaded_backoff_state_is_validated_as_the_machines_that_hold_one_are() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let backoff = Backoff::exponential(Duration::from_millis(10), 2.0).build().unwrap();
    let mut state = persevere::BackoffState::new();
    state.next_delay(&backoff, &mut rng);
    state.next_delay(&backoff, &mut rng);
    let json = serde_json::to_value(state).unwrap();
    let loaded: persevere::BackoffState = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(loaded, state, "round-trips");
    // A schedule that restarted after more failures than the streak has.
    let mut edited = json;
    edited["restarted_at"] = json!(3);
    let error = serde_json::from_value::<persevere::BackoffState>(edited).unwrap_err().to_string();
    assert!(error.contains("invalid state of a BackoffState"), "{error}");
}
