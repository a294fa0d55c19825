//! The blocking retry drives the same loop as `retry`: the same options, the same decisions,
//! the same statistics; on virtual time (sleeps jump the clock) and once on real time.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::Virtual;
use persevere::{Backoff, FailureClass, FailureKind, Hint, Instant, Jitter, OutcomeKind, RetryPolicy};
use persevere_driver::RetryGate;
use persevere_driver::blocking::{self, retry_on};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(backoff: Backoff, attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(backoff).max_attempts(attempts).build().unwrap()
}

#[test]
fn r1_a_blocking_retry_calls_until_success_and_sleeps_the_schedule_between_calls() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 4);
    let calls = Cell::new(0);
    let done = retry_on(&rt, &p, || {
        calls.set(calls.get() + 1);
        if calls.get() < 3 { Err("busy") } else { Ok(calls.get()) }
    })
    .wait();
    assert_eq!(done.result, Ok(3));
    assert_eq!((done.stats.attempts, done.stats.slept), (3, ms(20)));
    assert_eq!(rt.now.get(), 20_000_000, "two sleeps of 10 ms on the virtual clock");

    // Every call fails: the policy's limit ends it, with the last error.
    let done = retry_on(&rt, &p, || Err::<(), _>("down")).wait();
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Exhausted, Some("down")));
    assert_eq!(done.stats.attempts, 4);
}

#[test]
fn r2_a_blocking_retry_classifies_hints_and_stops_on_fatal_errors() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 5);
    let calls = Cell::new(0);
    let done = retry_on(&rt, &p, || {
        calls.set(calls.get() + 1);
        match calls.get() {
            1 => Err("slow down"),
            2 => Err("retry"),
            _ => Err::<(), _>("invalid"),
        }
    })
    .classify(|e| match *e {
        "slow down" => FailureKind::Hinted(Hint::After(Duration::from_secs(2))),
        "retry" => FailureKind::Retryable,
        _ => FailureKind::Fatal,
    })
    .wait();
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.class), (OutcomeKind::Fatal, Some(FailureClass::Fatal)));
    assert_eq!(done.stats.attempts, 3);
    assert_eq!(done.stats.slept, Duration::from_secs(2) + ms(10), "the hint in full, then the schedule");
}

/// A gate that refuses every retry.
struct Closed;

impl RetryGate for Closed {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        None
    }
}

#[test]
fn u4_a_gate_refuses_a_blocking_retry() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 5);
    let done = retry_on(&rt, &p, || Err::<(), _>("down")).gate(Closed).wait();
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Rejected);
    assert_eq!(done.stats.attempts, 1);
}

#[test]
fn r4_a_panicking_call_is_a_panicked_failure_and_retried() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(1)).build().unwrap(), 3);
    let calls = Cell::new(0);
    let mut classes = Vec::new();
    let done = retry_on(&rt, &p, || {
        calls.set(calls.get() + 1);
        assert_ne!(calls.get(), 1, "the first call panics");
        Ok::<_, ()>(calls.get())
    })
    .notify(|e| classes.push(e.class))
    .wait();
    assert_eq!(done.result, Ok(2));
    assert_eq!(classes, [FailureClass::Panicked]);
}

#[test]
fn g0_a_seeded_blocking_retry_draws_the_same_delays() {
    let backoff = Backoff::exponential(ms(10), 2.0).jitter(Jitter::Full).build().unwrap();
    let p = policy(backoff, 6);
    let delays = |seed| {
        let mut delays = Vec::new();
        let rt = Virtual::default();
        let _ = retry_on(&rt, &p, || Err::<(), _>(())).seed(seed).notify(|e| delays.push(e.delay)).wait();
        delays
    };
    assert_eq!(delays(42), delays(42));
    assert_ne!(delays(42), delays(43));
    assert_eq!(delays(42).len(), 5);
}

#[test]
fn r3_a_blocking_retry_keeps_to_its_total_budget_between_calls() {
    let rt = Virtual::default();
    let p = RetryPolicy::builder(Backoff::constant(ms(30)).build().unwrap())
        .max_attempts(10)
        .total(ms(100))
        .build()
        .unwrap();
    // Each call takes 20 ms of the virtual clock.
    let done = retry_on(&rt, &p, || {
        rt.advance(ms(20));
        Err::<(), _>("down")
    })
    .wait();
    let gave_up = done.result.unwrap_err();
    assert_eq!(gave_up.outcome, OutcomeKind::OutOfTime);
    // Calls start at 0, 50 and 100 ms (the budget's last instant, not past it); the next would
    // start at 150 ms, past it. A running call is never cut short: the third ends at 120 ms.
    assert_eq!(done.stats.attempts, 3);
    assert_eq!(done.stats.elapsed, Some(ms(120)));
}

#[test]
fn r5_a_blocking_retry_on_real_time_sleeps_between_calls() {
    let p = policy(Backoff::constant(ms(20)).build().unwrap(), 3);
    let started = std::time::Instant::now();
    let mut calls = 0;
    let done = blocking::retry(&p, || {
        calls += 1;
        if calls < 3 { Err("busy") } else { Ok(calls) }
    })
    .wait();
    assert_eq!(done.result, Ok(3));
    assert!(done.stats.slept >= ms(40), "{:?}", done.stats);
    assert!(started.elapsed() >= ms(40), "the thread slept");
}
