//! With the `serde` feature, policies and states round-trip as plain data, and a persisted
//! policy is validated again when loaded.
#![cfg(feature = "serde")]

use std::time::Duration;

use persevere::{Backoff, Failure, Instant, Jitter, Retry, RetryPolicy};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

#[test]
fn a_retry_in_flight_round_trips_and_continues_identically() {
    let policy = RetryPolicy::builder(
        Backoff::exponential(Duration::from_millis(10), 2.0).jitter(Jitter::Full).build().unwrap(),
    )
    .max_attempts(5)
    .build()
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut retry = Retry::<u32>::new();
    retry.handle_start(&policy, Instant::ZERO).unwrap();
    while retry.poll_action().is_some() {}
    retry.handle_failure(&policy, Instant::from_millis(3), 1, Failure::retryable(17), &mut rng).unwrap();

    let json = serde_json::to_string(&retry).unwrap();
    let mut restored: Retry<u32> = serde_json::from_str(&json).unwrap();
    assert_eq!(restored, retry);
    let policy_json = serde_json::to_string(&policy).unwrap();
    assert_eq!(serde_json::from_str::<RetryPolicy>(&policy_json).unwrap(), policy);
    assert_eq!(restored.poll_action(), retry.poll_action());
}

#[test]
fn an_invalid_persisted_policy_is_refused_on_load() {
    let policy = Backoff::exponential(Duration::from_millis(10), 2.0).build().unwrap();
    let json = serde_json::to_string(&policy).unwrap().replace("2.0", "0.5");
    let err = serde_json::from_str::<Backoff>(&json).unwrap_err().to_string();
    assert!(err.contains("multiplier"), "{err}");
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
    assert!(serde_json::from_str::<FlowPolicy>(&bad).unwrap_err().to_string().contains("trip limit"));
    let mut flow = Flow::<String>::every(Instant::ZERO, Duration::from_secs(5));
    flow.handle_timeout(Instant::ZERO);
    flow.handle_failure(&flow_policy, Instant::from_millis(7), "down".into(), &mut rng).unwrap();
    let restored: Flow<String> = serde_json::from_str(&serde_json::to_string(&flow).unwrap()).unwrap();
    assert_eq!(restored, flow);
    assert_eq!(restored.info(), flow.info());
}
