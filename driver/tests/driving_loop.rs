//! The driving loop on a counting virtual clock: what it reads, when it sleeps, what it reports.

use std::cell::Cell;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{Backoff, FailureClass, FailureKind, Hint, Instant, OutcomeKind, RetryPolicy};
use persevere_driver::{RetryGate, retry};

mod common;
use common::{PanicsOnSuccess, Virtual, poll_once_catching};

fn policy(backoff: Backoff, attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(backoff).max_attempts(attempts).build().unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn r5_the_success_path_reads_no_clock_and_sleeps_never() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 3);
    let done = block_on(retry(&rt, &p, || async { Ok::<_, ()>(5) }));
    assert_eq!(done.result, Ok(5));
    assert_eq!((done.stats.attempts, done.stats.elapsed), (1, None));
    assert_eq!((rt.reads.get(), rt.sleeps.get()), (0, 0));
}

#[test]
fn a_policy_with_a_deadline_reads_the_clock_and_reports_elapsed() {
    let rt = Virtual::default();
    let p = RetryPolicy::builder(Backoff::constant(ms(10)).build().unwrap()).total(ms(100)).build().unwrap();
    let clock = rt.clone();
    let done = block_on(retry(&rt, &p, move || {
        clock.advance(ms(4));
        async { Ok::<_, ()>(()) }
    }));
    assert_eq!(done.stats.elapsed, Some(ms(4)));
    assert!(rt.reads.get() >= 1);
}

#[test]
fn r6_delays_are_slept_on_the_runtime_clock_and_notified() {
    let rt = Virtual::default();
    let p = policy(Backoff::exponential(ms(100), 2.0).build().unwrap(), 4);
    let mut seen = Vec::new();
    let done = block_on(
        retry(&rt, &p, || async { Err::<(), _>("busy") })
            .notify(|e| seen.push((e.next_attempt, e.delay, e.error.copied()))),
    );
    assert_eq!(seen, vec![(2, ms(100), Some("busy")), (3, ms(200), Some("busy")), (4, ms(400), Some("busy"))]);
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.class, gave_up.error),
        (OutcomeKind::Exhausted, Some(FailureClass::Retryable), Some("busy"))
    );
    assert_eq!(done.stats.slept, ms(700));
    assert_eq!(rt.now.get(), ms(700).as_nanos() as u64);
    assert_eq!(rt.sleeps.get(), 3);
}

#[test]
fn r2_a_classifier_stops_on_fatal_errors_and_honours_hints() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 5);
    let mut calls = 0;
    let done = block_on(
        retry(&rt, &p, || {
            calls += 1;
            let n = calls;
            async move { Err::<(), u32>(n) }
        })
        .classify(|e| match e {
            1 => FailureKind::Hinted(Hint::After(ms(250))),
            _ => FailureKind::Fatal,
        }),
    );
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Fatal, Some(2)));
    assert_eq!(done.stats.slept, ms(250), "the hint, not the schedule");
    assert_eq!(done.stats.attempts, 2);
}

#[test]
fn s4_a_panicking_attempt_is_caught_and_retried() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(1)).build().unwrap(), 3);
    let mut calls = 0;
    let done = block_on(retry(&rt, &p, || {
        calls += 1;
        let n = calls;
        async move {
            if n == 1 {
                panic!("attempt 1 explodes");
            }
            Ok::<_, ()>(n)
        }
    }));
    assert_eq!(done.result, Ok(2));
    assert_eq!(done.stats.attempts, 2);
}

#[test]
fn a_panic_while_creating_an_attempt_is_caught_too() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(1)).build().unwrap(), 2);
    let done = block_on(retry(&rt, &p, || -> Ready<Result<(), ()>> { panic!("no future for you") }));
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.class, gave_up.error),
        (OutcomeKind::Exhausted, Some(FailureClass::Panicked), None)
    );
    assert_eq!(done.stats.attempts, 2);
}

/// Pending forever; records its drop.
struct Hang(Rc<Cell<u32>>);

impl Future for Hang {
    type Output = Result<(), ()>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Pending
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

#[test]
fn r3_an_attempt_past_its_deadline_is_dropped_and_counts_as_a_timeout() {
    let rt = Virtual::default();
    let dropped = Rc::new(Cell::new(0));
    let p = RetryPolicy::builder(Backoff::constant(ms(5)).build().unwrap())
        .max_attempts(3)
        .attempt_timeout(ms(20))
        .build()
        .unwrap();
    let d = dropped.clone();
    let done = block_on(retry(&rt, &p, move || Hang(d.clone())));
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.class), (OutcomeKind::Exhausted, Some(FailureClass::Timeout)));
    assert_eq!(dropped.get(), 3, "each timed-out attempt was dropped");
    assert_eq!(done.stats.elapsed, Some(ms(3 * 20 + 2 * 5)));
}

#[test]
fn cancel_on_stops_a_hanging_attempt_and_reports_canceled() {
    let rt = Virtual::default();
    let dropped = Rc::new(Cell::new(0));
    let p = policy(Backoff::constant(ms(5)).build().unwrap(), 3);
    let d = dropped.clone();
    let done = block_on(retry(&rt, &p, move || Hang(d.clone())).cancel_on(ready(())));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Canceled);
    assert_eq!(done.stats.attempts, 1);
    assert_eq!(dropped.get(), 1);
}

struct Refuse(Cell<u32>);

impl RetryGate for Refuse {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        self.0.set(self.0.get() + 1);
        (self.0.get() < 2).then_some(())
    }
}

/// A gate that counts the retries it granted that are still in flight: each ticket releases
/// its retry when dropped, as a concurrency budget (Envoy's) must.
#[derive(Default)]
struct InFlight {
    granted: Cell<u32>,
    in_flight: Rc<Cell<i32>>,
    most_in_flight: Cell<i32>,
    handed_back: Cell<u32>,
}

struct Slot(Rc<Cell<i32>>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl RetryGate for InFlight {
    type Ticket = Slot;
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<Slot> {
        self.granted.set(self.granted.get() + 1);
        self.in_flight.set(self.in_flight.get() + 1);
        self.most_in_flight.set(self.most_in_flight.get().max(self.in_flight.get()));
        Some(Slot(self.in_flight.clone()))
    }
    fn on_success(&self, ticket: Option<Slot>) {
        if ticket.is_some() {
            self.handed_back.set(self.handed_back.get() + 1);
        }
    }
}

/// A runtime whose sleeps never end.
struct Asleep;

impl persevere_driver::Runtime for Asleep {
    type Sleep = std::future::Pending<()>;
    fn now(&self) -> Instant {
        Instant::ZERO
    }
    fn sleep_until(&self, _: Instant) -> Self::Sleep {
        std::future::pending()
    }
}

#[test]
fn u4_a_retrys_ticket_is_released_once_when_its_attempt_ends_succeeds_or_is_dropped() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(1)).build().unwrap(), 3);
    // Two retries that fail, then the limit: each ticket is released when its attempt fails.
    let gate = InFlight::default();
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>("no") }).gate(&gate));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Exhausted);
    assert_eq!((gate.granted.get(), gate.in_flight.get(), gate.handed_back.get()), (2, 0, 0));
    assert_eq!(gate.most_in_flight.get(), 1, "the first retry's ticket went when its attempt failed");
    // A retry that succeeds hands its ticket back to the gate.
    let gate = InFlight::default();
    let mut calls = 0;
    let done = block_on(
        retry(&rt, &p, || {
            calls += 1;
            let fail = calls < 3;
            async move { if fail { Err("no") } else { Ok(()) } }
        })
        .gate(&gate),
    );
    assert_eq!(done.result, Ok(()));
    assert_eq!((gate.granted.get(), gate.in_flight.get(), gate.handed_back.get()), (2, 0, 1));
    // An operation dropped while it waits for its retry releases the ticket with it.
    let gate = InFlight::default();
    let mut future = Box::pin(retry(Asleep, &p, || async { Err::<(), _>("no") }).gate(&gate));
    let waker = std::task::Waker::noop();
    assert!(future.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
    assert_eq!((gate.granted.get(), gate.in_flight.get()), (1, 1), "the retry waits, holding its ticket");
    drop(future);
    assert_eq!(gate.in_flight.get(), 0);
    // And one canceled while it waits releases it when it finishes, before it is dropped.
    let gate = InFlight::default();
    let armed = Cell::new(false);
    let signal = std::future::poll_fn(|_| if armed.get() { Poll::Ready(()) } else { Poll::Pending });
    let mut future = Box::pin(retry(Asleep, &p, || async { Err::<(), _>("no") }).gate(&gate).cancel_on(signal));
    assert!(future.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
    assert_eq!(gate.in_flight.get(), 1);
    armed.set(true);
    let Poll::Ready(done) = future.as_mut().poll(&mut Context::from_waker(waker)) else { panic!("canceled") };
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Canceled);
    assert_eq!(gate.in_flight.get(), 0, "released as the operation finished");
}

#[test]
fn u4_a_gate_refusal_ends_the_operation_rejected() {
    let rt = Virtual::default();
    let gate = Refuse(Cell::new(0));
    let p = policy(Backoff::constant(ms(5)).build().unwrap(), 10);
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>("no") }).gate(&gate));
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Rejected, Some("no")));
    assert_eq!(done.stats.attempts, 2, "one retry granted, the second refused");
}

#[test]
fn the_same_seed_gives_the_same_delays() {
    let delays = |seed| {
        let rt = Virtual::default();
        let p = policy(Backoff::exponential(ms(10), 2.0).jitter(persevere::Jitter::Full).build().unwrap(), 6);
        let mut seen = Vec::new();
        let _ = block_on(retry(&rt, &p, || async { Err::<(), ()>(()) }).seed(seed).notify(|e| seen.push(e.delay)));
        seen
    };
    assert_eq!(delays(1), delays(1));
    assert_ne!(delays(1), delays(2));
}

#[test]
fn r5_zero_delay_failures_read_no_clock_and_seed_no_rng() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(Duration::ZERO).build().unwrap(), 5);
    let mut calls = 0;
    let done = block_on(retry(&rt, &p, || {
        calls += 1;
        let n = calls;
        async move { if n < 4 { Err(n) } else { Ok(n) } }
    }));
    assert_eq!(done.result, Ok(4));
    assert_eq!((done.stats.attempts, done.stats.slept, done.stats.elapsed), (4, Duration::ZERO, None));
    assert_eq!((rt.reads.get(), rt.sleeps.get()), (0, 0), "no clock read and no timer for zero delays");
    assert_eq!(rt.entropies.get(), 0, "a schedule without jitter draws nothing, so no RNG is seeded");
}

#[test]
fn r5_a_clock_free_policy_measures_each_sleep_as_it_really_took() {
    // Timers here fire 3 ms late; the policy has no budget or deadline, so the clock is read
    // only around the sleeps, and `slept` is what they really took.
    let rt = Virtual::default();
    rt.lateness.set(ms(3).as_nanos() as u64);
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 3);
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>("busy") }));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Exhausted);
    assert_eq!(done.stats.slept, ms(26), "two sleeps of 10 ms that each took 13 ms");
    assert_eq!(done.stats.elapsed, None, "the first start was not timed");
    assert_eq!((rt.sleeps.get(), rt.reads.get()), (2, 4), "one read as each sleep begins and one as it ends");
}

#[test]
fn the_jitter_rng_is_seeded_at_the_first_draw_from_the_runtime_or_the_seed() {
    let rt = Virtual::default();
    let jittered = policy(Backoff::constant(ms(10)).jitter(persevere::Jitter::Full).build().unwrap(), 3);
    let _ = block_on(retry(&rt, &jittered, || async { Err::<(), _>(()) }));
    assert_eq!(rt.entropies.get(), 1, "seeded once, at the first jittered delay");
    let _ = block_on(retry(&rt, &jittered, || async { Err::<(), _>(()) }).seed(3));
    assert_eq!(rt.entropies.get(), 1, "an explicit seed needs no entropy");
}

#[test]
fn b6_a_hint_past_max_hint_gives_up_deferred_with_the_time_to_come_back() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 5);
    let done = block_on(
        retry(&rt, &p, || async { Err::<(), _>("429") })
            .classify(|_| FailureKind::Hinted(Hint::After(Duration::from_secs(600)))),
    );
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.class, gave_up.retry_after(), gave_up.error),
        (OutcomeKind::Deferred, Some(FailureClass::RetryAfter), Some(Duration::from_secs(600)), Some("429"))
    );
    assert_eq!((done.stats.attempts, done.stats.slept, rt.sleeps.get()), (1, Duration::ZERO, 0), "no sleep at all");
    assert_eq!(
        gave_up.to_string(),
        "gave up: the other side asked to be retried later than the policy waits (retry after 600s); last error: 429"
    );
}

#[test]
fn b6_the_longest_hint_is_still_told_as_a_time_to_come_back() {
    // A hint of `Duration::MAX` from the start of the clock-free timeline: the time to come
    // back is the whole `u64` of nanoseconds, which must not read as "none".
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 3);
    let done = block_on(
        retry(&rt, &p, || async { Err::<(), _>("429") }).classify(|_| FailureKind::Hinted(Hint::After(Duration::MAX))),
    );
    let gave_up = done.result.unwrap_err();
    assert_eq!(gave_up.outcome, OutcomeKind::Deferred);
    assert_eq!(gave_up.retry_after(), Some(Duration::from_nanos(u64::MAX)));
}

#[test]
fn gave_up_explains_itself() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(Duration::ZERO).build().unwrap(), 2);
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>(std::io::Error::other("disk on fire")) }));
    let message = done.result.unwrap_err().to_string();
    assert_eq!(message, "gave up: attempt limit reached; last error: disk on fire");
}

/// An operation of its own type: fails `fail` times, then succeeds; panics while creating the
/// attempt numbered `panic_at`.
struct Scripted {
    attempts: u32,
    fail: u32,
    panic_at: u32,
}

impl persevere_driver::Operation for Scripted {
    type Future = Ready<Result<u32, &'static str>>;

    fn attempt(&mut self) -> Self::Future {
        self.attempts += 1;
        assert_ne!(self.attempts, self.panic_at, "creating this attempt panics");
        ready(if self.attempts <= self.fail { Err("busy") } else { Ok(self.attempts) })
    }
}

/// The retry of a `Scripted` on the virtual clock, with its type written out.
type ScriptedRetry<'a> = persevere_driver::RetryFuture<
    &'a Virtual,
    &'a RetryPolicy,
    Scripted,
    Ready<Result<u32, &'static str>>,
    &'static str,
>;

#[test]
fn r1_a_named_operation_is_asked_for_one_attempt_at_a_time_and_its_panics_are_caught() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(ms(10)).build().unwrap(), 4);
    let run: ScriptedRetry<'_> = retry(&rt, &p, Scripted { attempts: 0, fail: 2, panic_at: 0 });
    let done = block_on(run);
    assert_eq!((done.result, done.stats.attempts, done.stats.slept), (Ok(3), 3, ms(20)));

    // A panic while creating the second attempt is that attempt's failure (class Panicked).
    let mut classes = Vec::new();
    let done =
        block_on(retry(&rt, &p, Scripted { attempts: 0, fail: 9, panic_at: 2 }).notify(|e| classes.push(e.class)));
    assert_eq!(done.stats.attempts, 4);
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Exhausted);
    assert_eq!(classes, [FailureClass::Retryable, FailureClass::Panicked, FailureClass::Retryable]);
}

#[test]
fn u2_an_envoy_budget_counts_operations_and_retries_in_flight_and_each_ends_once_however_it_ends() {
    use persevere::ConcurrencyBudgetPolicy;
    use persevere_driver::Budget;

    // No share of the requests, a floor of one retry in flight.
    let budget =
        Budget::concurrency(Asleep, ConcurrencyBudgetPolicy::builder(0.0).min_retry_concurrency(1).build().unwrap());
    let p = policy(Backoff::constant(ms(1)).build().unwrap(), 3);
    let waker = std::task::Waker::noop();
    let counts = |b: &Budget<Asleep>| b.in_flight().map(|c| (c.requests(), c.retries())).unwrap();
    // A waits for its retry (sleeps never end here): one request, one retry in flight.
    let mut a = Box::pin(retry(Asleep, &p, || async { Err::<(), _>("no") }).gate(&budget));
    assert!(a.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
    assert_eq!(counts(&budget), (1, 1));
    // B's retry is refused (one in flight already): B ends rejected, and its request with it.
    let mut b = Box::pin(retry(Asleep, &p, || async { Err::<(), _>("no") }).gate(&budget));
    let Poll::Ready(done) = b.as_mut().poll(&mut Context::from_waker(waker)) else { panic!("rejected at once") };
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Rejected);
    assert_eq!(counts(&budget), (1, 1), "B ended before its future was dropped");
    drop(b);
    // A success on the first attempt: its request ended when it returned.
    let done = block_on(retry(Asleep, &p, || async { Ok::<_, ()>(()) }).gate(&budget));
    assert!(done.result.is_ok());
    assert_eq!(counts(&budget), (1, 1));
    // A dropped while it waits: its request and its retry end with it.
    drop(a);
    assert_eq!(counts(&budget), (0, 0));
    // A retry that succeeds gives its place back when its attempt ends.
    let rt = Virtual::default();
    let budget = Budget::concurrency(rt.clone(), ConcurrencyBudgetPolicy::envoy());
    let mut calls = 0;
    let done = block_on(
        retry(&rt, &p, || {
            calls += 1;
            let fail = calls < 3;
            async move { if fail { Err("no") } else { Ok(()) } }
        })
        .gate(&budget),
    );
    assert_eq!((done.result, done.stats.attempts), (Ok(()), 3));
    assert_eq!(budget.in_flight().map(|c| (c.requests(), c.retries())), Some((0, 0)));
}

#[test]
fn a_success_whose_gate_panics_is_over_and_never_runs_the_operation_again() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(Duration::ZERO).build().unwrap(), 3);
    // On the fast path (the first attempt succeeds) and in the loop (after one failure).
    for fail_first in [0, 1] {
        let calls = Cell::new(0);
        let mut future = Box::pin(
            retry(&rt, &p, || {
                calls.set(calls.get() + 1);
                let fail = calls.get() <= fail_first;
                async move { if fail { Err("no") } else { Ok(7) } }
            })
            .gate(PanicsOnSuccess),
        );
        let mut poll = || poll_once_catching(future.as_mut());
        assert_eq!(poll(), Err("the gate's on_success panics".to_owned()), "fail first {fail_first}");
        // Polled again, as a caller that caught the panic might: the operation is over, and
        // says so, rather than starting an attempt or waiting forever.
        assert_eq!(poll(), Err("`RetryFuture` polled after it completed".to_owned()), "fail first {fail_first}");
        assert_eq!(calls.get(), fail_first + 1, "no attempt after the success");
    }
}

#[test]
fn a_classifier_or_notify_that_panics_leaves_a_future_that_says_so_and_never_retries() {
    let rt = Virtual::default();
    let p = policy(Backoff::constant(Duration::ZERO).build().unwrap(), 3);
    let calls = Cell::new(0);
    let op = || {
        calls.set(calls.get() + 1);
        async { Err::<(), _>("no") }
    };
    let again =
        Err("`RetryFuture` polled again after a panic in code it called (classifier, notify, gate or runtime)"
            .to_owned());
    // A classifier that panics on the first attempt's error (the fast path).
    let mut future = Box::pin(retry(&rt, &p, op).classify(|_| -> FailureKind { panic!("the classifier panics") }));
    assert_eq!(poll_once_catching(future.as_mut()), Err("the classifier panics".to_owned()));
    assert_eq!(poll_once_catching(future.as_mut()), again);
    assert_eq!(calls.get(), 1, "the failed attempt was neither polled again nor retried");
    // A notify that panics as the first retry is scheduled (in the loop).
    calls.set(0);
    let mut future = Box::pin(retry(&rt, &p, op).notify(|_| panic!("the notify panics")));
    assert_eq!(poll_once_catching(future.as_mut()), Err("the notify panics".to_owned()));
    assert_eq!(poll_once_catching(future.as_mut()), again);
    assert_eq!(calls.get(), 1, "the retry never started");
    // A classifier that panics on the second attempt's error (in the loop).
    calls.set(0);
    let mut future = Box::pin(retry(&rt, &p, op).classify(|_| -> FailureKind {
        assert!(calls.get() < 2, "the classifier panics");
        FailureKind::Retryable
    }));
    assert_eq!(poll_once_catching(future.as_mut()), Err("the classifier panics".to_owned()));
    assert_eq!(poll_once_catching(future.as_mut()), again);
    assert_eq!(calls.get(), 2, "the second attempt was not retried");
    // A gate whose `allow_retry` panics.
    calls.set(0);
    let mut future = Box::pin(retry(&rt, &p, op).gate(PanicsOnAllow));
    assert_eq!(poll_once_catching(future.as_mut()), Err("the gate's allow_retry panics".to_owned()));
    assert_eq!(poll_once_catching(future.as_mut()), again);
    assert_eq!(calls.get(), 1, "the retry never started");
}

/// A gate whose `allow_retry` panics (a user's bug).
struct PanicsOnAllow;

impl RetryGate for PanicsOnAllow {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        panic!("the gate's allow_retry panics");
    }
}
