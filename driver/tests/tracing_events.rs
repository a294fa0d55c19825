//! With the `tracing` feature, the loop emits one event per attempt, scheduled retry and outcome.
#![cfg(feature = "tracing")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{Backoff, RetryPolicy};
use persevere_driver::retry;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

mod common;
use common::Virtual;

/// Counts the events whose target is `persevere`.
struct Count(Arc<AtomicUsize>);

impl Subscriber for Count {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() == "persevere" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn each_attempt_retry_and_outcome_is_an_event() {
    let count = Arc::new(AtomicUsize::new(0));
    let p = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    tracing::subscriber::with_default(Count(count.clone()), || {
        let _ = block_on(retry(Virtual::default(), &p, || async { Err::<(), _>("no") }));
    });
    // 3 × (attempt starting + attempt failed) + 2 retries scheduled + 1 outcome.
    assert_eq!(count.load(Ordering::SeqCst), 9);
}
