//! Scenarios shared by the cross-adapter tests: each runs on any [`Runtime`] and returns a
//! decision trace (what was decided, never how long the executor took), so that the traces of
//! tokio, smol and async-std's executor can be compared for equality.
#![deny(missing_docs)]

/// The README's examples, compiled and run as doctests (`cargo test -p persevere-tests --doc`),
/// so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod readme {}

/// The guide's examples (`docs/guide.md`), compiled and run the same way.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
mod guide {}

use std::time::Duration;

use persevere::{Backoff, FailureKind, Hint, Jitter, RetryPolicy};
use persevere_driver::{Runtime, retry};

/// An attempt that never completes and panics when it is dropped (a task's attempt whose drop
/// panics at its timeout), shared by the supervisor tests and the soak.
#[derive(Debug)]
pub struct PanicOnDrop;

impl PanicOnDrop {
    /// The message its drop panics with.
    pub const MESSAGE: &'static str = "dropping the attempt panicked";
}

impl std::future::Future for PanicOnDrop {
    type Output = Result<(), String>;

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::task::Poll::Pending
    }
}

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("{}", PanicOnDrop::MESSAGE);
    }
}

/// One decision of a retried operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A retry was scheduled.
    Retry {
        /// The attempt that starts next.
        next_attempt: u64,
        /// The chosen delay.
        delay: Duration,
        /// The failed attempt's error.
        error: Option<String>,
    },
    /// The operation ended.
    Outcome {
        /// `Ok(value)` or the outcome's name.
        result: Result<u32, String>,
        /// Attempts started.
        attempts: u64,
    },
}

/// The scripted scenario: exponential backoff from 2 ms with full jitter and a fixed seed; the
/// operation fails with a transient error, then a `Retry-After` of 3 ms, then a transient error,
/// and succeeds on attempt 4. A second operation always fails until it is exhausted; a third
/// fails fatally on its second attempt.
pub async fn scripted<Rt: Runtime>(runtime: impl Fn() -> Rt) -> Vec<Decision> {
    let backoff = Backoff::exponential(Duration::from_millis(2), 2.0)
        .max_delay(Duration::from_millis(20))
        .jitter(Jitter::Full)
        .build()
        .expect("a valid backoff");
    let policy = RetryPolicy::builder(backoff).max_attempts(5).build().expect("a valid policy");
    let mut trace = Vec::new();

    for script in [&["busy", "retry-after", "busy", "ok"][..], &["busy"; 5][..], &["busy", "fatal"][..]] {
        let mut calls = 0;
        let done = retry(runtime(), &policy, || {
            calls += 1;
            let step = script[(calls - 1).min(script.len() - 1)];
            let attempt = calls as u32;
            async move { if step == "ok" { Ok(attempt) } else { Err(step) } }
        })
        .seed(2026)
        .classify(|e| match *e {
            "retry-after" => FailureKind::Hinted(Hint::After(Duration::from_millis(3))),
            "fatal" => FailureKind::Fatal,
            _ => FailureKind::Retryable,
        })
        .notify(|e| {
            trace.push(Decision::Retry {
                next_attempt: e.next_attempt,
                delay: e.delay,
                error: e.error.map(|s| s.to_string()),
            })
        })
        .await;
        trace.push(Decision::Outcome {
            result: done.result.map_err(|g| format!("{:?}: {:?}", g.outcome, g.error)),
            attempts: done.stats.attempts,
        });
    }
    trace
}
