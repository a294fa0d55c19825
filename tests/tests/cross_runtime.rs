//! The same scenarios on tokio (paused time), smol and async-std's executor: identical decision
//! traces, and cancellation, timeouts and panics handled alike on each.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use persevere::{Backoff, FailureClass, OutcomeKind, RetryPolicy};
use persevere_smol::SmolRuntime;
use persevere_tests::{Decision, scripted};
use persevere_tokio::TokioRuntime;

fn tokio_paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

#[test]
fn the_scripted_scenario_decides_identically_on_every_runtime() {
    let on_tokio = tokio_paused().block_on(scripted(TokioRuntime::new));
    let on_smol = smol::block_on(scripted(SmolRuntime::new));
    let on_async_std = async_std::task::block_on(scripted(SmolRuntime::new));
    assert_eq!(on_tokio, on_smol);
    assert_eq!(on_tokio, on_async_std);
    // And the trace is the one the script asks for.
    let outcomes: Vec<_> = on_tokio.iter().filter(|d| matches!(d, Decision::Outcome { .. })).cloned().collect();
    assert_eq!(
        outcomes,
        vec![
            Decision::Outcome { result: Ok(4), attempts: 4 },
            Decision::Outcome { result: Err("Exhausted: Some(\"busy\")".into()), attempts: 5 },
            Decision::Outcome { result: Err("Fatal: Some(\"fatal\")".into()), attempts: 2 },
        ]
    );
    assert!(on_tokio.contains(&Decision::Retry {
        next_attempt: 3,
        delay: Duration::from_millis(3),
        error: Some("retry-after".into())
    }));
}

fn policy(delay_ms: u64, attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(Duration::from_millis(delay_ms)).build().unwrap())
        .max_attempts(attempts)
        .build()
        .unwrap()
}

/// Never completes; counts its drops.
struct Hang(Arc<AtomicU32>);

impl Future for Hang {
    type Output = Result<(), &'static str>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Pending
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

macro_rules! on_every_runtime {
    ($name:ident, |$retry:ident, $sleep:ident| $body:block) => {
        mod $name {
            use super::*;

            #[test]
            fn on_tokio() {
                tokio_paused().block_on(async {
                    #[allow(unused)]
                    type Rt = TokioRuntime;
                    #[allow(unused_imports)]
                    use persevere_tokio::retry as $retry;
                    #[allow(unused)]
                    let $sleep = |d| tokio::time::sleep(d);
                    $body
                })
            }

            #[test]
            fn on_smol() {
                smol::block_on(async {
                    #[allow(unused)]
                    type Rt = SmolRuntime;
                    #[allow(unused_imports)]
                    use persevere_smol::retry as $retry;
                    #[allow(unused)]
                    let $sleep = |d| async move {
                        smol::Timer::after(d).await;
                    };
                    $body
                })
            }

            #[test]
            fn on_async_std() {
                async_std::task::block_on(async {
                    #[allow(unused)]
                    type Rt = SmolRuntime;
                    #[allow(unused_imports)]
                    use persevere_smol::retry as $retry;
                    #[allow(unused)]
                    let $sleep = |d| async_std::task::sleep(d);
                    $body
                })
            }
        }
    };
}

on_every_runtime!(attempt_timeouts_drop_the_attempt, |retry, sleep| {
    let drops = Arc::new(AtomicU32::new(0));
    let p = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build().unwrap())
        .max_attempts(2)
        .attempt_timeout(Duration::from_millis(15))
        .build()
        .unwrap();
    let d = drops.clone();
    let done = retry(&p, move || Hang(d.clone())).await;
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.class), (OutcomeKind::Exhausted, Some(FailureClass::Timeout)));
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    assert!(done.stats.elapsed.unwrap() >= Duration::from_millis(31));
});

on_every_runtime!(cancel_on_stops_a_sleep_promptly, |retry, sleep| {
    let p = policy(60_000, 3);
    let done = retry(&p, || async { Err::<(), _>("down") }).cancel_on(sleep(Duration::from_millis(20))).await;
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Canceled, Some("down")));
    assert_eq!(done.stats.attempts, 1);
});

on_every_runtime!(dropping_the_retry_drops_the_attempt, |retry, sleep| {
    let drops = Arc::new(AtomicU32::new(0));
    let p = policy(1, 3);
    let d = drops.clone();
    let mut fut = Box::pin(retry(&p, move || Hang(d.clone())));
    // Poll it once so the attempt exists, then drop it.
    let waker = std::task::Waker::noop();
    assert!(fut.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(fut);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
});

on_every_runtime!(a_panic_in_an_attempt_is_caught_and_retried, |retry, sleep| {
    let calls = Rc::new(Cell::new(0));
    let p = policy(1, 3);
    let c = calls.clone();
    let done = retry(&p, move || {
        c.set(c.get() + 1);
        let n = c.get();
        async move {
            if n == 1 {
                panic!("first attempt panics");
            }
            Ok::<_, ()>(n)
        }
    })
    .await;
    assert_eq!(done.result, Ok(2));
    assert_eq!(done.stats.attempts, 2);
});

on_every_runtime!(the_breaker_opens_rejects_and_recovers, |retry, sleep| {
    let policy = persevere::BreakerPolicy::builder(Backoff::constant(Duration::from_millis(30)).build().unwrap())
        .consecutive_failures(2)
        .build()
        .unwrap();
    let breaker = persevere_driver::Breaker::<Rt>::new(policy);
    for _ in 0..2 {
        assert!(breaker.call(async { Err::<(), _>("down") }).await.is_err());
    }
    match breaker.call(async { Ok::<_, &str>(()) }).await {
        Err(persevere_driver::CallError::Rejected { retry_after }) => {
            assert!(retry_after.unwrap() <= Duration::from_millis(30))
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    sleep(Duration::from_millis(31)).await;
    assert_eq!(breaker.call(async { Ok::<_, &str>(5) }).await, Ok(5));
    assert_eq!(breaker.status(), persevere::BreakerStatus::Closed);
});
