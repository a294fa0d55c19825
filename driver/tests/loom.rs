//! Model-checked interleavings of the shared [`Breaker`] and [`Budget`] (K2, K4, U4;
//! `docs/ARCHITECTURE.md`, *Testing*): loom runs each scenario under every interleaving of their
//! lock and atomics (up to a preemption bound) and fails if any breaks an assertion.
//!
//! Built only with the `persevere_loom` cfg, which swaps the driver's lock and atomics for
//! loom's (a plain `cargo test` skips this file):
//!
//! ```sh
//! RUSTFLAGS="--cfg persevere_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p persevere-driver --release --lib --test loom
//! ```
#![cfg(persevere_loom)]

use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::thread;
use persevere::{Backoff, BreakerPolicy, BreakerStatus, FailureClass, Instant, RatioBudgetPolicy, TokenBucketPolicy};
use persevere_driver::{Breaker, Budget, CallError, RetryGate, Runtime};

/// A clock the test moves by hand, shared by every thread.
#[derive(Clone)]
struct Clock(Arc<AtomicU64>);

impl Clock {
    fn new() -> Self {
        Clock(Arc::new(AtomicU64::new(0)))
    }

    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Runtime for Clock {
    type Sleep = Ready<()>;

    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.load(Ordering::SeqCst))
    }

    fn sleep_until(&self, _: Instant) -> Ready<()> {
        ready(())
    }

    fn entropy(&self) -> u64 {
        7
    }
}

/// Polls `future` to completion on this loom thread, yielding to the others while it is
/// pending (loom explores what runs in between).
fn run<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::yield_now();
    }
}

/// A call that completes with `outcome` once `go` is set.
async fn after(go: Arc<AtomicBool>, outcome: Result<(), &'static str>) -> Result<(), &'static str> {
    std::future::poll_fn(|_| if go.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }).await;
    outcome
}

const OPEN: Duration = Duration::from_millis(100);

fn breaker(clock: &Clock, trip_after: u32, permits: u32) -> Breaker<Clock> {
    let policy = BreakerPolicy::builder(Backoff::constant(OPEN).build().unwrap())
        .consecutive_failures(trip_after)
        .half_open_permits(permits)
        .build()
        .unwrap();
    Breaker::with_runtime(clock.clone(), policy)
}

/// A model with at most `bound` preemptions per execution (the scenarios are small; the bound
/// keeps the larger ones to seconds).
fn model(bound: usize, scenario: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(bound);
    builder.check(scenario);
}

#[test]
fn k2_a_success_is_recorded_after_a_failure_that_ended_before_it() {
    // A starts (admitted on the clean path, or with a permit if B's failure came first); B
    // fails; only then does A succeed. Whatever the interleaving, A's success comes after B's
    // failure and ends the streak: two more failures do not trip a limit of 3. (With the
    // clean path's success dropped unconditionally, as before this test, the streak stayed at
    // one and they did.)
    model(3, || {
        let clock = Clock::new();
        let breaker = breaker(&clock, 3, 1);
        let go = Arc::new(AtomicBool::new(false));
        let a = {
            let (breaker, go) = (breaker.clone(), go.clone());
            thread::spawn(move || run(breaker.call(after(go, Ok(())))))
        };
        let b = {
            let (breaker, go) = (breaker.clone(), go.clone());
            thread::spawn(move || {
                let failed = run(breaker.call(ready(Err::<(), _>("down"))));
                go.store(true, Ordering::Release);
                failed
            })
        };
        assert_eq!(b.join().unwrap(), Err(CallError::Failed("down")));
        assert_eq!(a.join().unwrap(), Ok(()));
        for _ in 0..2 {
            let _ = run(breaker.call(ready(Err::<(), _>("down"))));
        }
        assert_eq!(breaker.status(), BreakerStatus::Closed);
    });
}

#[test]
fn k1_a_breaker_opened_while_another_thread_looked_at_it_admits_nothing() {
    // A failure trips a limit of 1 while another thread reads the status (as a retry gate
    // does). Both go through the lock, and the lock-free admission flag must end up agreeing
    // with the machine: the next call is rejected, not admitted on a clean path that the
    // reader's view of the closed breaker left behind.
    model(3, || {
        let clock = Clock::new();
        let breaker = breaker(&clock, 1, 1);
        let reader = {
            let breaker = breaker.clone();
            thread::spawn(move || breaker.status())
        };
        let caller = {
            let breaker = breaker.clone();
            thread::spawn(move || run(breaker.call(ready(Err::<(), _>("down")))))
        };
        let seen = reader.join().unwrap();
        assert!(matches!(seen, BreakerStatus::Closed | BreakerStatus::Open { .. }), "{seen:?}");
        assert_eq!(caller.join().unwrap(), Err(CallError::Failed("down")));
        let next = run(breaker.call(ready(Ok::<_, &str>(()))));
        assert!(matches!(next, Err(CallError::Rejected { .. })), "an open breaker admitted a call: {next:?}");
    });
}

#[test]
fn k4_half_open_admits_no_more_probes_than_permits_under_concurrent_callers() {
    // Half-open with two permits; three callers whose calls fail. At most two are admitted,
    // and the first failed probe reopens the breaker (the other probe's record is then stale
    // and ignored, not lost into a later state).
    model(2, || {
        let clock = Clock::new();
        let breaker = breaker(&clock, 1, 2);
        let _ = run(breaker.call(ready(Err::<(), _>("down"))));
        clock.advance(OPEN);
        let admitted = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (breaker, admitted) = (breaker.clone(), admitted.clone());
                thread::spawn(move || {
                    let call = async {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        Err::<(), _>("still down")
                    };
                    run(breaker.call(call))
                })
            })
            .collect();
        for caller in callers {
            let result = caller.join().unwrap();
            assert!(matches!(result, Err(CallError::Failed(_) | CallError::Rejected { .. })));
        }
        let admitted = admitted.load(Ordering::SeqCst);
        assert!((1..=2).contains(&admitted), "{admitted} probes admitted with 2 permits");
        assert!(matches!(breaker.status(), BreakerStatus::Open { .. }), "a failed probe reopens");
    });
}

#[test]
fn k4_a_probe_dropped_while_others_ask_leaves_no_permit_behind() {
    // Half-open with one permit: one caller is admitted and dropped mid-call while another
    // asks. Whoever got the permit, none is leaked: once both are done, a probe is admitted
    // and closes the breaker (unless the other caller's probe already did).
    model(3, || {
        let clock = Clock::new();
        let breaker = breaker(&clock, 1, 1);
        let _ = run(breaker.call(ready(Err::<(), _>("down"))));
        clock.advance(OPEN);
        let dropper = {
            let breaker = breaker.clone();
            thread::spawn(move || {
                let mut call = pin!(breaker.call(std::future::pending::<Result<(), &str>>()));
                let polled = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                // Rejected, or admitted and now dropped uncounted.
                assert!(matches!(polled, Poll::Pending | Poll::Ready(Err(CallError::Rejected { .. }))));
            })
        };
        let asker = {
            let breaker = breaker.clone();
            thread::spawn(move || run(breaker.call(ready(Ok::<_, &str>(1)))))
        };
        dropper.join().unwrap();
        let asked = asker.join().unwrap();
        assert!(matches!(asked, Ok(1) | Err(CallError::Rejected { .. })));
        if asked.is_err() {
            assert_eq!(run(breaker.call(ready(Ok::<_, &str>(2)))), Ok(2), "the dropped probe's permit came back");
        }
        assert_eq!(breaker.status(), BreakerStatus::Closed);
    });
}

#[test]
fn u1_a_token_bucket_grants_exactly_what_it_holds_to_concurrent_retries() {
    // Ten tokens at five a retry: of three concurrent retries, exactly two are granted.
    model(3, || {
        let policy = TokenBucketPolicy::builder(10).costs(5, 5, 5).build().unwrap();
        let budget = Budget::tokens(Clock::new(), policy);
        let granted = Arc::new(AtomicUsize::new(0));
        let askers: Vec<_> = (0..3)
            .map(|_| {
                let (budget, granted) = (budget.clone(), granted.clone());
                thread::spawn(move || {
                    if budget.allow_retry(None, FailureClass::Retryable).is_some() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for asker in askers {
            asker.join().unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn u2_a_ratio_budget_counts_every_concurrent_request_and_retry() {
    // Two requests and two retries race, with a 50 % ratio and no minimum: each retry is
    // granted against the requests counted before it. Whatever the order, no count is lost:
    // once both requests are in, exactly one more retry fits (2 × 0.5 − retries granted).
    model(2, || {
        let policy = RatioBudgetPolicy::builder(0.5).min_retries_per_sec(0).build().unwrap();
        let budget = Budget::ratio(Clock::new(), policy);
        let granted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (budget, granted) = (budget.clone(), granted.clone());
                thread::spawn(move || {
                    budget.on_request(None);
                    if budget.allow_retry(None, FailureClass::Retryable).is_some() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let granted = granted.load(Ordering::SeqCst);
        assert!(granted <= 1, "{granted} retries granted on two requests at 50 %");
        let more = budget.allow_retry(None, FailureClass::Retryable).is_some();
        assert_eq!(granted + usize::from(more), 1, "every request and retry was counted");
    });
}

#[test]
fn o1_every_transition_made_by_concurrent_callers_is_heard_exactly_once() {
    // One thread's failure opens the breaker while another isolates and resets it by hand.
    // Each transition is told by the thread that made it, after the state's lock is released,
    // so they may be heard out of order, but every generation the breaker went through is
    // heard exactly once, as the change the core made, and the chain they form (put back in
    // order by generation) leads from closed to the state the breaker ends in.
    model(3, || {
        let clock = Clock::new();
        let breaker = breaker(&clock, 1, 1);
        let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = heard.clone();
        breaker.on_transition(move |t| log.lock().unwrap().push(*t));
        let caller = {
            let breaker = breaker.clone();
            thread::spawn(move || run(breaker.call(ready(Err::<(), _>("down")))))
        };
        breaker.isolate();
        breaker.reset();
        let _ = caller.join().unwrap();
        let end = breaker.status();
        let mut heard = heard.lock().unwrap().clone();
        heard.sort_by_key(|t| t.generation);
        let generations: Vec<u32> = heard.iter().map(|t| t.generation).collect();
        let last = generations.last().copied().unwrap_or(0);
        // A reset of a closed breaker is a new generation but no change of kind: not told.
        assert!(generations.windows(2).all(|w| w[0] < w[1]), "a generation heard twice: {heard:?}");
        assert!(last >= 2, "isolate and reset are always heard: {heard:?}");
        let mut state = BreakerStatus::Closed.state();
        for t in &heard {
            assert_eq!(t.from.state(), state, "a transition missing before {t:?}: {heard:?}");
            state = t.to.state();
        }
        assert_eq!(state, end.state(), "the last transition heard is not where the breaker is: {heard:?}");
    });
}
