//! The shared adapter breaker and budget (K1–K5, U1–U4) on a virtual clock.

use std::future::{Future, pending};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{
    Backoff, BreakerError, BreakerPolicy, BreakerState, BreakerStatus, CallOutcome, FailureClass, FailureKind, Hint,
    Instant, OutcomeKind, RatioBudgetPolicy, RetryPolicy, TokenBucketPolicy,
};
use persevere_driver::{Breaker, Budget, CallError, RetryGate, retry};

mod common;
use common::Virtual;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(trip_after: u32) -> BreakerPolicy {
    BreakerPolicy::builder(Backoff::constant(ms(100)).build().unwrap())
        .consecutive_failures(trip_after)
        .half_open_permits(1)
        .build()
        .unwrap()
}

#[test]
fn k1_the_breaker_opens_after_the_streak_rejects_then_probes_and_closes() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(2));
    for _ in 0..2 {
        assert_eq!(block_on(breaker.call(async { Err::<(), _>("down") })), Err(CallError::Failed("down")));
    }
    assert!(matches!(breaker.status(), BreakerStatus::Open { .. }));
    let rejected = block_on(breaker.call(async { Ok::<_, &str>(1) }));
    assert_eq!(rejected, Err(CallError::Rejected { retry_after: Some(ms(100)) }), "K3: retry_after until half-open");
    rt.advance(ms(100));
    assert_eq!(block_on(breaker.call(async { Ok::<_, &str>(2) })), Ok(2), "a probe is admitted and succeeds");
    assert_eq!(breaker.status(), BreakerStatus::Closed);
}

#[test]
fn k1_the_clean_closed_path_reads_no_clock() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(3));
    let reads = rt.reads.get();
    for i in 0..100 {
        assert_eq!(block_on(breaker.call(async move { Ok::<_, ()>(i) })), Ok(i));
    }
    assert_eq!(rt.reads.get(), reads, "no lock, no clock on a clean closed breaker");
    // A failure takes the counted path; the next success resets the streak.
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    assert!(rt.reads.get() > reads);
    let _ = block_on(breaker.call(async { Ok::<_, ()>(()) }));
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    assert_eq!(breaker.status(), BreakerStatus::Closed, "2 failures after a success do not trip a limit of 3");
}

/// Calls in flight hold permits while the breaker counts every call (a rate rule); each is
/// recorded when it completes and released when it is dropped, so the count returns to 0.
#[test]
fn k4_outstanding_permits_are_the_calls_in_flight_and_return_to_zero() {
    let rt = Virtual::default();
    let rated = BreakerPolicy::builder(Backoff::constant(ms(100)).build().unwrap()).failure_rate(0.5).build().unwrap();
    let breaker = Breaker::with_runtime(rt.clone(), rated);
    let mut cx = Context::from_waker(Waker::noop());
    let mut dropped = Box::pin(breaker.call(pending::<Result<(), ()>>()));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut finishing = Box::pin(breaker.call(async move {
        futures_lite::future::yield_now().await;
        rx.try_recv().map_err(|_| ())
    }));
    assert!(dropped.as_mut().poll(&mut cx).is_pending());
    assert!(finishing.as_mut().poll(&mut cx).is_pending());
    assert_eq!(breaker.outstanding_permits(), 2, "two calls admitted and running");
    tx.send(()).unwrap();
    assert_eq!(finishing.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(())));
    assert_eq!(breaker.outstanding_permits(), 1, "the finished call recorded its permit");
    drop(dropped);
    assert_eq!(breaker.outstanding_permits(), 0, "the dropped call released its permit");

    // On the clean path (no rate rule, no streak) a call holds no permit.
    let clean = Breaker::with_runtime(rt, policy(3));
    let mut running = Box::pin(clean.call(pending::<Result<(), ()>>()));
    assert!(running.as_mut().poll(&mut cx).is_pending());
    assert_eq!(clean.outstanding_permits(), 0);
}

#[test]
fn k4_a_dropped_probe_releases_its_permit() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(1));
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    rt.advance(ms(100));
    {
        // The probe is admitted, then dropped before it completes.
        let mut probe = pin!(breaker.call(pending::<Result<(), ()>>()));
        assert!(probe.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
        assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 1 });
        assert!(matches!(block_on(breaker.call(async { Ok::<_, ()>(()) })), Err(CallError::Rejected { .. })));
    }
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 }, "the permit came back uncounted");
    assert_eq!(block_on(breaker.call(async { Ok::<_, ()>(7) })), Ok(7));
}

#[test]
fn k5_a_rejected_call_is_never_polled_and_a_finished_call_cannot_be_polled_again() {
    let breaker = Breaker::with_runtime(Virtual::default(), policy(1));
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    let mut ran = false;
    let rejected = block_on(breaker.call(async {
        ran = true;
        Ok::<_, ()>(())
    }));
    assert!(matches!(rejected, Err(CallError::Rejected { .. })));
    assert!(!ran, "an open breaker drops the call unpolled");

    let mut call = pin!(breaker.call(async { Ok::<_, ()>(()) }));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(call.as_mut().poll(&mut cx).is_ready());
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(&mut cx)));
    let message = again.unwrap_err().downcast::<&str>().map(|m| *m).unwrap_or_default();
    assert_eq!(message, "`BreakerCall` polled after it completed");
}

#[test]
fn k4_a_probe_whose_classifier_panics_releases_its_permit_and_an_unpolled_call_takes_none() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(1));
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    rt.advance(ms(100));
    // Created and dropped without a poll: no admission was asked for.
    drop(breaker.call(async { Ok::<_, ()>(()) }));
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 });

    let probe = breaker.call_classified(async { Ok::<_, ()>(()) }, |_| -> CallOutcome { panic!("classifier bug") });
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(probe)));
    assert!(caught.is_err());
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 }, "the probe's permit came back");
    assert_eq!(block_on(breaker.call(async { Ok::<_, ()>(7) })), Ok(7), "and the next probe is admitted");
}

#[test]
fn k1_isolate_disable_and_reset_by_hand() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt, policy(1));
    breaker.isolate();
    assert_eq!(block_on(breaker.call(async { Ok::<_, ()>(()) })), Err(CallError::Rejected { retry_after: None }));
    breaker.disable();
    for _ in 0..5 {
        let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    }
    assert_eq!(breaker.status(), BreakerStatus::Disabled, "disabled counts nothing");
    breaker.reset();
    assert_eq!(breaker.status(), BreakerStatus::Closed);
}

#[test]
fn k1_open_half_open_and_metrics_only_by_hand_with_refusals() {
    let breaker = Breaker::with_runtime(Virtual::default(), policy(3));
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = heard.clone();
    breaker.on_transition(move |t| log.lock().unwrap().push(t.to.state()));
    let refused = breaker.half_open().unwrap_err();
    assert!(
        matches!(
            refused,
            BreakerError::IllegalTransition { from: BreakerState::Closed, to: BreakerState::HalfOpen, .. }
        ),
        "{refused}"
    );
    breaker.open().unwrap();
    assert!(matches!(
        block_on(breaker.call(async { Ok::<_, ()>(()) })),
        Err(CallError::Rejected { retry_after: Some(_) })
    ));
    assert!(matches!(breaker.open(), Err(BreakerError::IllegalTransition { from: BreakerState::Open, .. })));
    breaker.half_open().unwrap();
    assert_eq!(block_on(breaker.call(async { Ok::<_, ()>(()) })), Ok(()), "a probe goes through at once");
    assert_eq!(breaker.status(), BreakerStatus::Closed, "and closes it");

    breaker.metrics_only();
    for _ in 0..5 {
        let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    }
    assert_eq!(breaker.status(), BreakerStatus::MetricsOnly, "counted, never tripped");
    assert_eq!(breaker.window_counts().map(|c| c.consecutive_failures), Some(5));
    assert!(matches!(breaker.open(), Err(BreakerError::IllegalTransition { from: BreakerState::MetricsOnly, .. })));
    breaker.reset();
    use BreakerState::*;
    assert_eq!(*heard.lock().unwrap(), [Open, HalfOpen, Closed, MetricsOnly, Closed], "refusals are not transitions");
}

#[test]
fn k2_a_classifier_can_ignore_errors_that_say_nothing_about_the_dependency() {
    let breaker = Breaker::with_runtime(Virtual::default(), policy(1));
    let r = block_on(breaker.call_classified(async { Err::<(), _>("bad request") }, |_| CallOutcome::Ignored));
    assert_eq!(r, Err(CallError::Failed("bad request")));
    assert_eq!(breaker.status(), BreakerStatus::Closed);
}

#[test]
fn u4_an_open_breaker_vetoes_retries() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(1));
    let p = RetryPolicy::builder(Backoff::constant(ms(10)).build().unwrap()).max_attempts(5).build().unwrap();
    let b = breaker.clone();
    let done = block_on(retry(&rt, &p, || b.call(async { Err::<(), _>("down") })).gate(breaker.clone()));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Rejected);
    assert_eq!(done.stats.attempts, 1, "the first failure opened the breaker; no retry into it");
}

#[test]
fn u1_a_shared_token_bucket_ends_operations_rejected_once_spent() {
    let rt = Virtual::default();
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::builder(20).costs(5, 5, 5).build().unwrap());
    let p = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(10).build().unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let done = block_on(retry(&rt, &p, || async { Err::<(), _>(()) }).gate(budget.clone()));
        outcomes.push((done.result.unwrap_err().outcome, done.stats.attempts));
    }
    // 20 tokens at 5 a retry: 4 retries in all, then every retry is refused.
    assert_eq!(outcomes, vec![(OutcomeKind::Rejected, 5), (OutcomeKind::Rejected, 1), (OutcomeKind::Rejected, 1)]);
}

#[test]
fn u2_a_ratio_budget_counts_requests_and_grants_its_ratio() {
    let rt = Virtual::default();
    let budget = Budget::ratio(rt.clone(), RatioBudgetPolicy::builder(0.5).min_retries_per_sec(0).build().unwrap());
    for _ in 0..4 {
        budget.on_request(Some(Instant::ZERO));
    }
    let granted =
        (0..10).filter(|_| budget.allow_retry(Some(Instant::ZERO), FailureClass::Retryable).is_some()).count();
    assert_eq!(granted, 2, "50% of 4 requests");
    budget.on_request(None); // the fast path: the budget reads its own clock
    assert!(rt.reads.get() >= 1);
}

/// Polls `call` once, so that it asks for admission and its call is in flight.
fn admit<F: Future>(call: std::pin::Pin<&mut F>) {
    assert!(call.poll(&mut Context::from_waker(Waker::noop())).is_pending(), "the call is in flight");
}

#[test]
fn k2_a_success_admitted_on_the_clean_path_still_resets_a_streak_recorded_while_it_ran() {
    // A is admitted while the breaker is clean; B fails while A runs; then A succeeds. As the
    // machine orders them (B's failure, then A's success, both in the same closed state), the
    // streak is back at zero: two more failures must not trip a limit of 3.
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(3));
    let (tx, rx) = async_channel::bounded::<()>(1);
    let mut a = pin!(breaker.call(async move { rx.recv().await.map_err(|_| ()) }));
    admit(a.as_mut());
    assert_eq!(block_on(breaker.call(async { Err::<(), _>(()) })), Err(CallError::Failed(())));
    tx.try_send(()).unwrap();
    assert_eq!(block_on(a), Ok(()));
    for _ in 0..2 {
        let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    }
    assert_eq!(breaker.status(), BreakerStatus::Closed, "A's success was recorded after B's failure");
}

#[test]
fn k4_a_failure_admitted_before_the_breaker_opened_does_not_take_a_later_probe() {
    // A is admitted while closed; B's failure opens the breaker; it turns half-open; then A
    // fails. A's outcome belongs to a state that is gone (a stale permit, K4): it must neither
    // take the probe nor reopen the breaker.
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(1));
    let (tx, rx) = async_channel::bounded::<()>(1);
    let mut a = pin!(breaker.call(async move {
        let _ = rx.recv().await;
        Err::<(), _>("late")
    }));
    admit(a.as_mut());
    let _ = block_on(breaker.call(async { Err::<(), _>("down") }));
    rt.advance(ms(100));
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 });
    tx.try_send(()).unwrap();
    assert_eq!(block_on(a), Err(CallError::Failed("late")));
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 }, "the stale failure is not counted");
    assert_eq!(block_on(breaker.call(async { Ok::<_, &str>(1) })), Ok(1), "the probe is still free");
    assert_eq!(breaker.status(), BreakerStatus::Closed);
}

#[test]
fn u4_a_breaker_and_a_budget_together_each_veto_retries() {
    let rt = Virtual::default();
    let p = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(10).build().unwrap();
    let tokens = |n| Budget::tokens(rt.clone(), TokenBucketPolicy::builder(n).costs(5, 5, 5).build().unwrap());

    // The budget refuses: 10 tokens at 5 a retry allow 2 retries, and the breaker (5 failures)
    // stays closed.
    let (breaker, budget) = (Breaker::with_runtime(rt.clone(), policy(5)), tokens(10));
    let gates = (breaker.clone(), budget.clone());
    let b = breaker.clone();
    let done = block_on(retry(&rt, &p, || b.call(async { Err::<(), _>("down") })).gate(&gates));
    assert_eq!((done.result.unwrap_err().outcome, done.stats.attempts), (OutcomeKind::Rejected, 3));
    assert_eq!(breaker.status(), BreakerStatus::Closed);

    // The breaker refuses: it opens on the first failure, before the budget is asked, so the
    // budget keeps its one retry.
    let (breaker, budget) = (Breaker::with_runtime(rt.clone(), policy(1)), tokens(5));
    let b = breaker.clone();
    let done = block_on(retry(&rt, &p, || b.call(async { Err::<(), _>("down") })).gate((&breaker, &budget)));
    assert_eq!((done.result.unwrap_err().outcome, done.stats.attempts), (OutcomeKind::Rejected, 1));
    assert!(budget.allow_retry(None, FailureClass::Retryable).is_some(), "the budget spent nothing");

    // In the other order the budget is asked first and spends its retry on one that the open
    // breaker then refuses: the order the docs of `RetryGate` warn about.
    let (breaker, budget) = (Breaker::with_runtime(rt.clone(), policy(1)), tokens(5));
    let b = breaker.clone();
    let done = block_on(retry(&rt, &p, || b.call(async { Err::<(), _>("down") })).gate((&budget, &breaker)));
    assert_eq!((done.result.unwrap_err().outcome, done.stats.attempts), (OutcomeKind::Rejected, 1));
    assert!(budget.allow_retry(None, FailureClass::Retryable).is_none(), "the budget spent its retry");
}

#[test]
fn u4_gates_are_asked_in_order_and_each_hears_every_request_and_success() {
    use std::cell::RefCell;
    struct Log<'a>(&'static str, bool, &'a RefCell<Vec<String>>);
    impl RetryGate for Log<'_> {
        type Ticket = ();
        type Request = ();
        fn on_request(&self, _: Option<Instant>) {
            self.2.borrow_mut().push(format!("{}:request", self.0));
        }
        fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
            self.2.borrow_mut().push(format!("{}:ask", self.0));
            self.1.then_some(())
        }
        fn on_success(&self, _: Option<()>) {
            self.2.borrow_mut().push(format!("{}:success", self.0));
        }
    }
    let log = RefCell::new(Vec::new());
    let gates = (Log("a", true, &log), Log("b", true, &log), Log("c", false, &log), Log("d", true, &log));
    gates.on_request(None);
    assert!(gates.allow_retry(None, FailureClass::Retryable).is_none());
    gates.on_success(None);
    let expected = [
        "a:request",
        "b:request",
        "c:request",
        "d:request",
        "a:ask",
        "b:ask",
        "c:ask",
        "a:success",
        "b:success",
        "c:success",
        "d:success",
    ];
    assert_eq!(*log.borrow(), expected, "d is not asked after c refused");
    log.borrow_mut().clear();
    let pair = (Log("a", true, &log), Log("b", true, &log));
    assert!(pair.allow_retry(None, FailureClass::Retryable).is_some());
    let triple = (Log("a", true, &log), Log("b", true, &log), Log("c", true, &log));
    assert!(triple.allow_retry(None, FailureClass::Retryable).is_some());
}

#[test]
fn breaker_listeners_hear_each_transition_once_in_order() {
    let rt = Virtual::default();
    let breaker = Breaker::with_runtime(rt.clone(), policy(2));
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = heard.clone();
    breaker.on_transition(move |t| log.lock().unwrap().push(*t));
    // A second listener hears the same; a panicking one changes nothing for the others.
    let second = Arc::new(Mutex::new(0));
    let count = second.clone();
    breaker.on_transition(|_| panic!("a listener that panics"));
    breaker.on_transition(move |_| *count.lock().unwrap() += 1);

    for _ in 0..2 {
        let _ = block_on(breaker.call(async { Err::<(), _>("down") }));
    }
    let _ = block_on(breaker.call(async { Ok::<_, &str>(1) })); // rejected: no transition
    rt.advance(ms(100));
    assert_eq!(block_on(breaker.call(async { Ok::<_, &str>(2) })), Ok(2)); // probe, then closed
    for _ in 0..10 {
        assert_eq!(block_on(breaker.call(async { Ok::<_, &str>(3) })), Ok(3)); // clean path: nothing
    }
    breaker.isolate();
    breaker.reset();
    breaker.disable();
    breaker.reset();

    let heard = heard.lock().unwrap().clone();
    let kinds: Vec<_> = heard.iter().map(|t| (t.from, t.to)).collect();
    use BreakerStatus::*;
    assert_eq!(
        kinds,
        [
            (Closed, Open { until: Instant::from_millis(100) }),
            // The state entered, and the state left: the probe is not out yet, and back already.
            (Open { until: Instant::from_millis(100) }, HalfOpen { permits: 0 }),
            (HalfOpen { permits: 0 }, Closed),
            (Closed, Isolated),
            (Isolated, Closed),
            (Closed, Disabled),
            (Disabled, Closed),
        ]
    );
    assert_eq!(heard[0].at, Instant::ZERO);
    assert_eq!(heard[1].at, Instant::from_millis(100));
    assert!(heard.windows(2).all(|w| w[0].generation < w[1].generation), "{heard:?}");
    assert_eq!(*second.lock().unwrap(), 7);
}

/// O1 through the shared breaker: a probe that hangs past its lease, noticed only after the
/// reopening it caused has ended too, is two transitions (half-open → open → half-open). The
/// listeners once compared the status before and after each input, saw half-open both times,
/// and heard nothing.
#[test]
fn o1_listeners_hear_a_reopening_noticed_late_with_its_reasons() {
    let rt = Virtual::default();
    let policy = BreakerPolicy::builder(Backoff::constant(ms(100)).build().unwrap())
        .consecutive_failures(1)
        .probe_timeout(ms(500))
        .build()
        .unwrap();
    let breaker = Breaker::with_runtime(rt.clone(), policy);
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = heard.clone();
    breaker.on_transition(move |t| log.lock().unwrap().push((t.to.state(), t.at, t.reason)));
    let _ = block_on(breaker.call(async { Err::<(), _>("down") }));
    rt.advance(ms(100));
    let mut hung = pin!(breaker.call(pending::<Result<(), &str>>()));
    assert!(hung.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending(), "the probe is out");
    rt.advance(ms(5_000));
    assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 0 });
    use persevere::{BreakerReason as R, BreakerState as S};
    assert_eq!(
        *heard.lock().unwrap(),
        [
            (S::Open, Instant::ZERO, R::ConsecutiveFailures),
            (S::HalfOpen, Instant::from_millis(100), R::OpenPeriodEnded),
            (S::Open, Instant::from_millis(600), R::ProbeExpired),
            (S::HalfOpen, Instant::from_millis(5_100), R::OpenPeriodEnded),
        ]
    );
}

#[test]
fn u1_grpc_every_failed_attempt_is_charged_also_the_last_one() {
    let rt = Virtual::default();
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::grpc(10, 0.5).unwrap());
    let p = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(3).build().unwrap();
    // Three failed attempts cost three tokens: the two retried and the last, as gRPC's
    // RecordFailure runs before it checks the attempts left.
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>("unavailable") }).gate(&budget));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Exhausted);
    assert_eq!(budget.balance_milli(), Some(7_000));
    // A fatal failure is not a retryable status: not charged. A hint that says not to retry is.
    let fatal =
        block_on(retry(&rt, &p, || async { Err::<(), _>("invalid") }).classify(|_| FailureKind::Fatal).gate(&budget));
    assert_eq!(fatal.result.unwrap_err().outcome, OutcomeKind::Fatal);
    assert_eq!(budget.balance_milli(), Some(7_000));
    let pushback = block_on(
        retry(&rt, &p, || async { Err::<(), _>("pushback") })
            .classify(|_| FailureKind::Hinted(Hint::DoNotRetry))
            .gate(&budget),
    );
    assert_eq!(pushback.result.unwrap_err().class, Some(FailureClass::DoNotRetry));
    assert_eq!(budget.balance_milli(), Some(6_000));
    // A success adds token_ratio.
    assert!(block_on(retry(&rt, &p, || async { Ok::<_, ()>(()) }).gate(&budget)).result.is_ok());
    assert_eq!(budget.balance_milli(), Some(6_500));
    // A failure whose retry would run past the total budget is charged: no retry was asked for.
    let timed =
        RetryPolicy::builder(Backoff::constant(ms(30)).build().unwrap()).max_attempts(5).total(ms(50)).build().unwrap();
    let done = block_on(retry(&rt, &timed, || async { Err::<(), _>("unavailable") }).gate(&budget));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::OutOfTime);
    assert_eq!(done.stats.attempts, 2);
    assert_eq!(budget.balance_milli(), Some(4_500), "two failed attempts, two tokens");
    // A policy that does not charge final failures (AWS) is left alone by the last attempt.
    let aws = Budget::tokens(rt.clone(), TokenBucketPolicy::aws());
    let _ = block_on(retry(&rt, &p, || async { Err::<(), _>("down") }).gate(&aws));
    assert_eq!(aws.balance_milli(), Some(490_000), "two retries at 5 tokens, the last failure free");
}

#[test]
fn u1_grpc_a_budget_whose_policy_is_replaced_keeps_its_share_of_tokens() {
    let rt = Virtual::default();
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::grpc(10, 0.5).unwrap());
    let p = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(3).build().unwrap();
    let _ = block_on(retry(&rt, &p, || async { Err::<(), _>("unavailable") }).gate(&budget));
    assert_eq!(budget.balance_milli(), Some(7_000));
    let replaced = Budget::tokens_replacing(&budget, TokenBucketPolicy::grpc(100, 0.5).unwrap());
    assert_eq!(replaced.balance_milli(), Some(70_000), "7 of 10 is 70 of 100");
    let fresh =
        Budget::tokens_replacing(&Budget::ratio(rt.clone(), RatioBudgetPolicy::finagle()), TokenBucketPolicy::aws());
    assert_eq!(fresh.balance_milli(), Some(500_000), "not a token bucket before: full");
}

#[test]
fn u1_aws_a_successful_retry_gets_its_cost_back_and_a_first_success_one_token() {
    let rt = Virtual::default();
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::aws());
    let p = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(3).build().unwrap();
    assert_eq!(budget.balance_milli(), Some(500_000));
    // Two retries that fail: 5 tokens each, gone.
    let done = block_on(retry(&rt, &p, || async { Err::<(), _>("down") }).gate(&budget));
    assert_eq!(done.result.unwrap_err().outcome, OutcomeKind::Exhausted);
    assert_eq!(budget.balance_milli(), Some(490_000));
    // A retry that succeeds gives its 5 tokens back (the grant travels from the retry to its
    // success), not the 1 token of a success without retry.
    let mut calls = 0;
    let done = block_on(
        retry(&rt, &p, || {
            calls += 1;
            let fail = calls == 1;
            async move { if fail { Err("busy") } else { Ok(()) } }
        })
        .gate(&budget),
    );
    assert_eq!((done.result, done.stats.attempts), (Ok(()), 2));
    assert_eq!(budget.balance_milli(), Some(490_000));
    // A first-attempt success adds 1 token.
    let done = block_on(retry(&rt, &p, || async { Ok::<_, ()>(()) }).gate(&budget));
    assert!(done.result.is_ok());
    assert_eq!(budget.balance_milli(), Some(491_000));
    // A ratio budget has no balance.
    assert_eq!(Budget::ratio(rt.clone(), RatioBudgetPolicy::finagle()).balance_milli(), None);
}

#[test]
fn u1_a_throttled_failure_is_charged_the_throttling_cost_without_a_hint() {
    let rt = Virtual::default();
    // Throttling costs 7 tokens, a transient failure 1, a timeout 2.
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::builder(100).costs(7, 1, 2).build().unwrap());
    let p = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(2).build().unwrap();
    let done = block_on(
        retry(&rt, &p, || async { Err::<(), _>("429") }).classify(|_| persevere::FailureKind::Throttled).gate(&budget),
    );
    assert_eq!(done.result.unwrap_err().class, Some(FailureClass::Throttled));
    assert_eq!(budget.balance_milli(), Some(93_000));
}

#[test]
fn a_breaker_listener_may_make_the_next_transition_itself() {
    use std::sync::{Arc, Mutex};

    /// A clock that stands still, shareable between threads (the listener holds a breaker).
    #[derive(Clone, Default)]
    struct Still;
    impl persevere_driver::Runtime for Still {
        type Sleep = std::future::Ready<()>;
        fn now(&self) -> Instant {
            Instant::ZERO
        }
        fn sleep_until(&self, _: Instant) -> Self::Sleep {
            std::future::ready(())
        }
    }

    // A listener that resets the breaker whenever it is isolated: the reset is a transition
    // heard by the same listeners, after the one being told (no lock is held while they run).
    let breaker = Breaker::with_runtime(Still, policy(2));
    let heard = Arc::new(Mutex::new(Vec::new()));
    let (log, resetter) = (heard.clone(), breaker.clone());
    breaker.on_transition(move |t| {
        log.lock().unwrap().push((t.from, t.to));
        if t.to == BreakerStatus::Isolated {
            resetter.reset();
        }
    });
    breaker.isolate();
    assert_eq!(breaker.status(), BreakerStatus::Closed);
    assert_eq!(
        *heard.lock().unwrap(),
        [(BreakerStatus::Closed, BreakerStatus::Isolated), (BreakerStatus::Isolated, BreakerStatus::Closed)]
    );
}
