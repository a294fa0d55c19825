//! With the `tracing` feature, the loop emits one event per attempt, scheduled retry and
//! outcome; the shared breaker one per transition and the budget one per refusal (O2).
#![cfg(feature = "tracing")]

use std::sync::Arc;
use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{Backoff, RetryPolicy};
use persevere_driver::retry;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

mod common;
use common::Virtual;

#[test]
fn each_attempt_retry_and_outcome_is_an_event() {
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let p = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    tracing::subscriber::with_default(Lines(lines.clone()), || {
        let _ = block_on(retry(Virtual::default(), &p, || async { Err::<(), _>("no") }));
    });
    // 3 × (attempt starting + attempt failed) + 2 retries scheduled + 1 outcome.
    let lines = lines.lock().unwrap();
    let messages: Vec<_> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("persevere: "))
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        messages,
        [
            "attempt starting",
            "attempt failed",
            "retry scheduled",
            "attempt starting",
            "attempt failed",
            "retry scheduled",
            "attempt starting",
            "attempt failed",
            "operation finished",
        ]
    );
}

/// Writes down each event as `target: message field=value …`.
struct Lines(Arc<std::sync::Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Lines {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(format!("{}: {}", event.metadata().target(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn o2_breaker_transitions_and_budget_refusals_are_events_with_stable_fields() {
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = Virtual::default();
    tracing::subscriber::with_default(Lines(lines.clone()), || {
        common::breaker_and_budget_scenario(&rt);
    });
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "persevere::breaker: breaker transition from=Closed to=Open { until: Instant(100000000) } reason=ConsecutiveFailures generation=1 open_for_ns=100000000",
            "persevere::breaker: breaker transition from=Open { until: Instant(100000000) } to=HalfOpen { permits: 0 } reason=OpenPeriodEnded generation=2 open_for_ns=0",
            "persevere::breaker: breaker transition from=HalfOpen { permits: 0 } to=Closed reason=ProbesSucceeded generation=3 open_for_ns=0",
            "persevere::budget: retry refused budget=\"ratio\" class=Retryable",
            "persevere::budget: budget exhausted budget=\"ratio\"",
            "persevere::budget: budget recovered budget=\"ratio\" refused=1",
        ]
    );
}

#[test]
fn o2_a_shed_call_and_a_limit_change_are_events_with_stable_fields() {
    use persevere::{LimitAlgorithm, LimiterPolicy};

    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = Virtual::default();
    let algorithm = LimitAlgorithm::Aimd { backoff_ratio: 0.5, timeout: Duration::from_millis(50) };
    let limiter = persevere_driver::Limiter::with_runtime(
        rt.clone(),
        LimiterPolicy::builder(algorithm).limits(1, 2, 2).build().unwrap(),
    );
    tracing::subscriber::with_default(Lines(lines.clone()), || {
        let held = limiter.try_acquire().unwrap();
        let _second = limiter.try_acquire().unwrap();
        assert!(limiter.try_acquire().is_err());
        held.dropped();
    });
    assert_eq!(
        *lines.lock().unwrap(),
        ["persevere::limiter: call shed limit=2 retry_after_ns=0", "persevere::limiter: limit changed from=2 to=1",]
    );
}
