//! The hedging driver on a virtual clock: what a first attempt that answers at once costs, and
//! panics as failures.

use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{FailureClass, HedgePolicy, OutcomeKind};
use persevere_driver::hedge;

mod common;
use common::{PanicsOnSuccess, Virtual, poll_once_catching};

#[test]
fn x5_a_first_attempt_that_answers_at_once_reads_no_clock_and_makes_no_timer() {
    let rt = Virtual::default();
    let policy = HedgePolicy::builder(3, Duration::from_millis(100)).build().unwrap();
    let done = block_on(hedge(rt.clone(), &policy, || async { Ok::<_, ()>(5) }));
    assert_eq!(done.result, Ok(5));
    assert_eq!((done.stats.started, done.stats.canceled, done.stats.winner), (1, 0, Some(1)));
    assert_eq!(done.stats.elapsed, Duration::ZERO);
    assert_eq!((rt.reads.get(), rt.sleeps.get()), (0, 0));
}

#[test]
fn x3_a_panicking_attempt_is_a_non_fatal_failure_and_the_next_hedge_starts_at_once() {
    let rt = Virtual::default();
    let policy = HedgePolicy::builder(2, Duration::from_millis(100)).build().unwrap();
    let mut calls = 0;
    let done = block_on(hedge(rt.clone(), &policy, || {
        calls += 1;
        let first = calls == 1;
        async move {
            if first {
                panic!("attempt 1 panics");
            }
            Ok::<_, &str>(calls)
        }
    }));
    assert_eq!(done.result, Ok(2));
    assert_eq!(rt.sleeps.get(), 0, "no wait for the delay after a failure");

    // Both panic: exhausted, the class says so and there is no error value.
    let done = block_on(hedge(rt.clone(), &policy, || async { panic!("always") as Result<(), ()> }));
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.class, gave_up.error),
        (OutcomeKind::Exhausted, Some(FailureClass::Panicked), None)
    );
    assert_eq!(done.stats.started, 2);
}

/// Found in review: with two attempts whose creation panicked in one drain, only the first was
/// reported; the second stayed in flight with no future, and the hedge never finished.
#[test]
fn x5_every_attempt_whose_creation_panics_is_reported_and_the_hedge_finishes() {
    use std::task::{Context, Poll};

    let rt = Virtual::default();
    let policy = HedgePolicy::builder(3, Duration::ZERO).build().unwrap();
    let mut calls = 0;
    let mut future = Box::pin(hedge(rt.clone(), &policy, || {
        calls += 1;
        assert!(calls > 2, "creating attempt {calls} panics");
        async { Err::<(), _>("no") }
    }));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let done = (0..10).find_map(|_| match future.as_mut().poll(&mut cx) {
        Poll::Ready(done) => Some(done),
        Poll::Pending => None,
    });
    let done = done.expect("the hedge finishes");
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Exhausted, Some("no")));
    assert_eq!(done.stats.started, 3);
}

#[test]
fn a_win_whose_gate_panics_is_over_and_starts_no_other_hedge() {
    let rt = Virtual::default();
    // Attempt 1 never answers, attempt 2 wins at 10 ms, and attempt 3 would start at 20 ms.
    let policy = every_10_ms();
    let calls = std::cell::Cell::new(0);
    let mut future = Box::pin(
        hedge(rt, &policy, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n == 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, ()>(n)
            }
        })
        .gate(PanicsOnSuccess),
    );
    let mut poll = || poll_once_catching(future.as_mut());
    assert_eq!(poll(), Err("the gate's on_success panics".to_owned()));
    assert_eq!(calls.get(), 2, "attempt 2 won before attempt 3 was due");
    // Polled again, as a caller that caught the panic might: the hedge is over, and says so.
    assert_eq!(poll(), Err(OVER.to_owned()));
    assert_eq!(calls.get(), 2, "no attempt after the win");
}

#[test]
fn a_classifier_that_panics_leaves_a_hedge_that_says_so_and_starts_nothing_more() {
    let rt = Virtual::default();
    let policy = every_10_ms();
    let calls = std::cell::Cell::new(0);
    let mut future = Box::pin(
        hedge(rt, &policy, || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>("no") }
        })
        .classify(|_| -> persevere::FailureKind { panic!("the classifier panics") }),
    );
    let mut poll = || poll_once_catching(future.as_mut());
    assert_eq!(poll(), Err("the classifier panics".to_owned()));
    assert_eq!(poll(), Err(OVER.to_owned()));
    assert_eq!(calls.get(), 1, "no hedge after the panic");
}

/// What a hedge polled again after it ended, or after a panic in code it called, panics with.
const OVER: &str = "`HedgeFuture` polled after it completed, or after a panic in code it called";

/// Three attempts, a hedge every 10 ms (virtual: a sleep jumps the clock).
fn every_10_ms() -> HedgePolicy {
    HedgePolicy::builder(3, Duration::from_millis(10)).build().unwrap()
}
