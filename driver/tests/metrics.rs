//! With the `metrics` feature, a scripted scenario gives exactly the documented figures (O2):
//! attempts, retries, refusals, outcomes, delays, breaker transitions and budget refusals.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::time::Duration;

use futures_lite::future::block_on;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use persevere::{Backoff, FailureClass, Instant, RetryPolicy};
use persevere_driver::{RetryGate, retry};

mod common;
use common::Virtual;

/// A gate that refuses every retry.
struct Refuse;

impl RetryGate for Refuse {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        None
    }
}

/// Each metric as `name{label=value,…}`, with its counter value or its histogram's samples.
fn figures(recorder: &DebuggingRecorder) -> BTreeMap<String, String> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => n.to_string(),
                DebugValue::Histogram(samples) => {
                    format!("{:?}", samples.iter().map(|s| s.into_inner()).collect::<Vec<_>>())
                }
                DebugValue::Gauge(g) => g.into_inner().to_string(),
            };
            (name, value)
        })
        .collect()
}

#[test]
fn o2_a_scripted_scenario_gives_exactly_the_documented_metrics() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = Virtual::default();
        let policy = |attempts| {
            RetryPolicy::builder(Backoff::constant(Duration::from_millis(250)).build().unwrap())
                .max_attempts(attempts)
                .build()
                .unwrap()
        };
        // Two failures, then a success: 3 attempts, 2 retries of 250 ms.
        let mut calls = 0;
        let done = block_on(retry(&rt, policy(5), || {
            calls += 1;
            let fail = calls < 3;
            async move { if fail { Err("busy") } else { Ok(()) } }
        }));
        assert!(done.result.is_ok());
        // Always failing, two attempts: exhausted after 1 retry.
        let _ = block_on(retry(&rt, policy(2), || async { Err::<(), _>("down") }));
        // A first-attempt success.
        let _ = block_on(retry(&rt, policy(2), || async { Ok::<_, ()>(()) }));
        // A refused retry.
        let _ = block_on(retry(&rt, policy(3), || async { Err::<(), _>("down") }).gate(Refuse));

        common::breaker_and_budget_scenario(&rt);
    });
    let expected: BTreeMap<String, String> = [
        ("persevere_attempts_total{}", "7"),
        ("persevere_retries_total{}", "3"),
        ("persevere_retries_refused_total{}", "1"),
        ("persevere_retry_delay_seconds{}", "[0.25, 0.25, 0.25]"),
        ("persevere_operations_total{outcome=succeeded}", "2"),
        ("persevere_operations_total{outcome=exhausted}", "1"),
        ("persevere_operations_total{outcome=rejected}", "1"),
        ("persevere_breaker_transitions_total{to=open}", "1"),
        ("persevere_breaker_transitions_total{to=half_open}", "1"),
        ("persevere_breaker_transitions_total{to=closed}", "1"),
        ("persevere_budget_refusals_total{budget=ratio}", "1"),
        ("persevere_budget_transitions_total{budget=ratio,to=exhausted}", "1"),
        ("persevere_budget_transitions_total{budget=ratio,to=recovered}", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(figures(&recorder), expected);
}
