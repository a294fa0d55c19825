//! The adapter's futures are `Send` whenever the user's are, so they can be spawned on tokio's
//! multi-threaded runtime: `retry` (with its hooks) and `Breaker::call` (both classifiers).

use std::time::Duration;

use persevere::{Backoff, BreakerPolicy, CallOutcome, RetryPolicy};
use persevere_tokio::{Breaker, CallError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_and_breaker_calls_run_inside_spawned_tasks() {
    let policy =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(3).build().unwrap();
    let breaker = Breaker::new(
        BreakerPolicy::builder(Backoff::constant(Duration::from_secs(1)).build().unwrap())
            .consecutive_failures(2)
            .build()
            .unwrap(),
    );

    let task = tokio::spawn({
        let breaker = breaker.clone();
        async move {
            let mut calls = 0;
            let retried = persevere_tokio::retry(&policy, || {
                calls += 1;
                let fail = calls < 3;
                async move { if fail { Err("busy") } else { Ok(calls) } }
            })
            .notify(|_: &persevere_tokio::RetryEvent<'_, &str>| {})
            .await;
            let called = breaker.call(async { Ok::<_, &str>(1) }).await;
            let ignored =
                breaker.call_classified(async { Err::<u32, _>("bad request") }, |_| CallOutcome::Ignored).await;
            (retried.result, called, ignored)
        }
    });
    let (retried, called, ignored) = task.await.unwrap();
    assert_eq!(retried, Ok(3));
    assert_eq!(called, Ok(1));
    assert_eq!(ignored, Err(CallError::Failed("bad request")));
    assert_eq!(breaker.status(), persevere::BreakerStatus::Closed);
}
