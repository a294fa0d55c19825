//! Hedged requests through the driver (X1–X5): on tokio with paused time, where every instant is
//! exact, and on smol with real time.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use persevere::{FailureClass, FailureKind, HedgePolicy, OutcomeKind, TokenBucketPolicy};
use persevere_tokio::{Budget, TokioRuntime};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn tokio_paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

/// What the attempts saw: when each started (ms since the test began), how many ran at once at
/// most, and which were dropped before they answered.
#[derive(Clone, Default)]
struct Log {
    starts: Rc<RefCell<Vec<u64>>>,
    running: Rc<Cell<u32>>,
    most: Rc<Cell<u32>>,
    dropped: Rc<RefCell<Vec<u64>>>,
}

/// Counts an attempt as running until it answers or is dropped.
struct Running {
    log: Log,
    attempt: u64,
    answered: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.log.running.set(self.log.running.get() - 1);
        if !self.answered {
            self.log.dropped.borrow_mut().push(self.attempt);
        }
    }
}

/// An operation whose attempt `k` takes `script[k - 1].0` and then returns `script[k - 1].1`.
fn scripted(
    log: &Log,
    t0: tokio::time::Instant,
    script: Vec<(u64, Result<u64, &'static str>)>,
) -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, &'static str>>>> {
    let log = log.clone();
    let mut next = 0usize;
    move || {
        let (took, result) = script[next];
        next += 1;
        let attempt = next as u64;
        log.starts.borrow_mut().push(t0.elapsed().as_millis() as u64);
        log.running.set(log.running.get() + 1);
        log.most.set(log.most.get().max(log.running.get()));
        let guard = Running { log: log.clone(), attempt, answered: false };
        Box::pin(async move {
            // Moved in whole (a field assignment alone would capture only the field).
            let mut guard = guard;
            tokio::time::sleep(ms(took)).await;
            guard.answered = true;
            result
        })
    }
}

#[test]
fn x1_x2_a_slow_first_attempt_is_hedged_after_the_delay_and_the_hedge_wins() {
    tokio_paused().block_on(async {
        let policy = HedgePolicy::builder(3, ms(100)).build().unwrap();
        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done =
            persevere_tokio::hedge(&policy, scripted(&log, t0, vec![(1_000, Ok(1)), (10, Ok(2)), (1, Ok(3))])).await;
        assert_eq!(done.result, Ok(2));
        assert_eq!((done.stats.started, done.stats.canceled, done.stats.winner), (2, 1, Some(2)));
        assert_eq!(done.stats.elapsed, ms(110));
        assert_eq!(*log.starts.borrow(), [0, 100], "the hedge 100 ms after the first; no third");
        assert_eq!(*log.dropped.borrow(), [1], "the loser is dropped (canceled) before the result returns");
        assert_eq!(log.running.get(), 0);
        assert_eq!(t0.elapsed(), ms(110));
    });
}

#[test]
fn x1_never_more_than_max_attempts_and_the_first_to_answer_wins() {
    tokio_paused().block_on(async {
        let policy = HedgePolicy::builder(3, ms(100)).build().unwrap();
        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done = persevere_tokio::hedge(
            &policy,
            scripted(&log, t0, vec![(1_000, Ok(1)), (1_000, Ok(2)), (1_000, Ok(3)), (0, Ok(4))]),
        )
        .await;
        assert_eq!(done.result, Ok(1), "attempt 1 answers first, at 1 000 ms");
        assert_eq!(*log.starts.borrow(), [0, 100, 200]);
        assert_eq!(log.most.get(), 3);
        assert_eq!(*log.dropped.borrow(), [2, 3]);
        assert_eq!((done.stats.started, done.stats.canceled, done.stats.elapsed), (3, 2, ms(1_000)));
    });
}

#[test]
fn x3_a_fatal_failure_ends_at_once_and_a_non_fatal_one_starts_the_next_hedge_at_once() {
    tokio_paused().block_on(async {
        let policy = HedgePolicy::builder(3, ms(100)).build().unwrap();
        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done = persevere_tokio::hedge(&policy, scripted(&log, t0, vec![(1_000, Ok(1)), (50, Err("invalid"))]))
            .classify(|_| FailureKind::Fatal)
            .await;
        let gave_up = done.result.unwrap_err();
        assert_eq!(
            (gave_up.outcome, gave_up.class, gave_up.error),
            (OutcomeKind::Fatal, Some(FailureClass::Fatal), Some("invalid"))
        );
        assert_eq!(*log.dropped.borrow(), [1]);
        assert_eq!(t0.elapsed(), ms(150));

        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done =
            persevere_tokio::hedge(&policy, scripted(&log, t0, vec![(10, Err("busy")), (20, Err("busy")), (5, Ok(3))]))
                .await;
        assert_eq!(done.result, Ok(3));
        assert_eq!(*log.starts.borrow(), [0, 10, 30], "each failure starts the next at once");
        assert_eq!((done.stats.started, done.stats.canceled), (3, 0));

        // Every attempt failing: exhausted, with the last error.
        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done =
            persevere_tokio::hedge(&policy, scripted(&log, t0, vec![(10, Err("a")), (10, Err("b")), (10, Err("c"))]))
                .await;
        let gave_up = done.result.unwrap_err();
        assert_eq!((gave_up.outcome, gave_up.error), (OutcomeKind::Exhausted, Some("c")));
    });
}

#[test]
fn x4_a_budget_that_refuses_stops_the_hedges_and_the_first_attempt_carries_on() {
    tokio_paused().block_on(async {
        let policy = HedgePolicy::builder(3, ms(100)).build().unwrap();
        // One token, and a hedge may not leave the bucket empty: refused.
        let budget = Budget::tokens(
            TokioRuntime::new(),
            TokenBucketPolicy::builder(1).costs(1, 1, 1).refuse_at_or_below(0).build().unwrap(),
        );
        assert!(budget.balance_milli() == Some(1_000));
        let log = Log::default();
        let t0 = tokio::time::Instant::now();
        let done = persevere_tokio::hedge(&policy, scripted(&log, t0, vec![(300, Ok(1)), (1, Ok(2)), (1, Ok(3))]))
            .gate(budget.clone())
            .await;
        assert_eq!(done.result, Ok(1));
        assert_eq!(*log.starts.borrow(), [0], "no hedge started");
        assert_eq!((done.stats.started, done.stats.winner), (1, Some(1)));
    });
}

#[test]
fn x2_on_smol_with_real_time_the_hedge_wins_and_the_slow_attempt_is_dropped() {
    smol::block_on(async {
        let policy = HedgePolicy::builder(2, ms(20)).build().unwrap();
        let dropped = Rc::new(Cell::new(false));
        let mut calls = 0;
        let seen = dropped.clone();
        let started = std::time::Instant::now();
        let done = persevere_smol::hedge(&policy, || {
            calls += 1;
            let (took, value) = if calls == 1 { (ms(2_000), 1) } else { (ms(5), 2) };
            let guard = DropFlag(seen.clone());
            async move {
                let guard = guard;
                smol::Timer::after(took).await;
                std::mem::forget(guard);
                Ok::<_, ()>(value)
            }
        })
        .await;
        assert_eq!(done.result, Ok(2));
        assert!(dropped.get(), "the slow first attempt was dropped");
        assert!(started.elapsed() >= ms(25) && started.elapsed() < ms(1_500), "{:?}", started.elapsed());
        assert_eq!((done.stats.started, done.stats.canceled, done.stats.winner), (2, 1, Some(2)));
    });
}

/// Set when dropped (an attempt that answers forgets it).
struct DropFlag(Rc<Cell<bool>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.set(true);
    }
}
