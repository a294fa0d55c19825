//! The real hedging driver ([`persevere_driver::hedge`]) on the simulator's virtual-time
//! executor: drawn policies, attempts that answer late, fail in every class, push back, hang or
//! panic, and sometimes a token bucket that gates the hedges; checked against what the attempts
//! themselves saw (X1–X5, G0).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use persevere::{FailureKind, HedgePolicy, Hint, OutcomeKind, TokenBucketPolicy};
use persevere_driver::{Budget, hedge};

use crate::driven::INJECTED_PANIC;
use crate::executor::{SimRuntime, block_on};
use crate::world::{Summary, Violation, World};

/// What the attempts of one operation saw.
#[derive(Default)]
struct Seen {
    /// Attempts created, in order.
    created: u64,
    running: u64,
    most_running: u64,
    /// Attempts dropped before they answered.
    dropped: u64,
    /// (attempt, virtual ns) of each success, in the order they answered.
    successes: Vec<(u64, u64)>,
    /// The first fatal failure's virtual ns, if one answered.
    first_fatal: Option<u64>,
    /// Attempts that hang (never answer) and still run.
    hanging: u64,
}

/// Counts an attempt as running until it answers or is dropped.
struct Guard {
    seen: Rc<RefCell<Seen>>,
    answered: bool,
    hangs: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut seen = self.seen.borrow_mut();
        seen.running -= 1;
        seen.hanging -= u64::from(self.hangs);
        if !self.answered {
            seen.dropped += 1;
        }
    }
}

/// Runs the hedging scenario of `seed`: its operations one after another through the real driver.
pub fn run(seed: u64) -> Result<Summary, Violation> {
    crate::driven::silence_injected_panics();
    let mut world = World::new("hedge", seed);
    let max = world.between(1, 7) as u32;
    let delay = Duration::from_millis(world.between(0, 200));
    let next_on_failure = world.chance(700);
    let max_hint = Duration::from_millis(world.between(1, 2_000));
    let policy = HedgePolicy::builder(max, delay).next_on_failure(next_on_failure).max_hint(max_hint).build().unwrap();
    let slowest_ms = world.between(1, 1_000);
    let failure_rate = world.between(0, 1_000);
    let gated = world.chance(400);
    let operations = world.between(1, 20) as u32;
    let world = Rc::new(RefCell::new(world));
    let rt = SimRuntime::new(seed);
    let budget = Budget::tokens(rt.clone(), TokenBucketPolicy::grpc(4, 0.5).unwrap());
    for op in 0..operations {
        let seen: Rc<RefCell<Seen>> = Rc::default();
        let start = rt.peek();
        let attempt = {
            let (world, rt, seen) = (world.clone(), rt.clone(), seen.clone());
            move || {
                let mut w = world.borrow_mut();
                w.steps += 1;
                let took = Duration::from_millis(w.between(0, slowest_ms));
                let fails = w.chance(failure_rate);
                let hangs = w.chance(50);
                let panics = fails && w.chance(50);
                let code = w.between(0, 6) as u8;
                let hint_ms = w.between(0, 1_500);
                let unborn = w.chance(30);
                let attempt = {
                    let mut s = seen.borrow_mut();
                    s.created += 1;
                    if unborn {
                        drop(s);
                        drop(w);
                        // Creating the attempt panics: the driver counts it a panicked failure.
                        std::panic::panic_any(INJECTED_PANIC);
                    }
                    s.running += 1;
                    s.hanging += u64::from(hangs);
                    s.most_running = s.most_running.max(s.running);
                    s.created
                };
                w.record(op, "attempt", attempt, took.as_nanos() as u64);
                drop(w);
                let guard = Guard { seen: seen.clone(), answered: false, hangs };
                let sleep = rt.sleep(rt.peek().saturating_add(took));
                let rt = rt.clone();
                async move {
                    let mut guard = guard;
                    if hangs {
                        std::future::pending::<()>().await;
                    }
                    sleep.await;
                    guard.answered = true;
                    let now = rt.peek().as_nanos();
                    if panics {
                        std::panic::panic_any(INJECTED_PANIC);
                    }
                    if !fails {
                        guard.seen.borrow_mut().successes.push((attempt, now));
                        return Ok(attempt);
                    }
                    if code == 0 {
                        let mut s = guard.seen.borrow_mut();
                        s.first_fatal.get_or_insert(now);
                    }
                    Err((code, hint_ms))
                }
            }
        };
        let classify = |&(code, hint_ms): &(u8, u64)| match code {
            0 => FailureKind::Fatal,
            1 => FailureKind::Hinted(Hint::After(Duration::from_millis(hint_ms))),
            2 => FailureKind::Hinted(Hint::DoNotRetry),
            3 => FailureKind::Throttled,
            _ => FailureKind::Retryable,
        };
        let future = hedge(&rt, &policy, attempt).classify(classify);
        // Run with the future kept alive past `block_on`, so that a stall can be told from the
        // attempts still holding it (which dropping the future would end).
        let (done, hanging) = if gated {
            let mut future = Box::pin(future.gate(&budget));
            let done = block_on(&rt, future.as_mut(), 100_000);
            (done, seen.borrow().hanging)
        } else {
            let mut future = Box::pin(future);
            let done = block_on(&rt, future.as_mut(), 100_000);
            (done, seen.borrow().hanging)
        };
        let mut w = world.borrow_mut();
        let Some(done) = done else {
            // Attempts may hang, which is the caller's to bound (a timeout around the future);
            // but the hedge may only stop making progress while one of them still runs.
            let s = seen.borrow();
            w.record(op, "hung", hanging, 0);
            w.check("X1", s.created <= u64::from(max), || "more attempts than allowed".into())?;
            w.check("X5", hanging > 0, || "the hedge stalled with no attempt hanging".into())?;
            continue;
        };
        let s = seen.borrow();
        let outcome = done.result.as_ref().map_or_else(|g| g.outcome as u64, |_| 99);
        w.record(op, "outcome", done.stats.started, outcome);
        w.check("X1", s.created <= u64::from(max), || format!("{} attempts started, max {max}", s.created))?;
        w.check("X1", s.most_running <= u64::from(max), || format!("{} ran at once, max {max}", s.most_running))?;
        w.check("X2", s.running == 0, || format!("{} attempts outlived their operation", s.running))?;
        w.check("X5", done.stats.started == s.created, || {
            format!("stats say {} started, {} were", done.stats.started, s.created)
        })?;
        w.check("X5", done.stats.canceled == s.dropped, || {
            format!("stats say {} canceled, {} were dropped unanswered", done.stats.canceled, s.dropped)
        })?;
        let elapsed = rt.peek().saturating_duration_since(start);
        w.check("X5", done.stats.elapsed <= elapsed, || {
            format!("{:?} elapsed, stats {:?}", elapsed, done.stats.elapsed)
        })?;
        match &done.result {
            Ok(value) => {
                // X2: the first success is the outcome, and nothing fatal answered before it.
                let first = s.successes.first().copied();
                w.check("X2", first.map(|(a, _)| a) == Some(*value) && done.stats.winner == Some(*value), || {
                    format!("won by {value} ({:?}), the first success was {first:?}", done.stats.winner)
                })?;
                // X3: a fatal answer the driver saw would have ended the operation.
                w.check("X3", s.first_fatal.is_none(), || "a success won after a fatal failure answered".into())?;
            }
            Err(gave_up) => {
                w.check("X2", s.successes.is_empty(), || format!("gave up {:?} after a success", gave_up.outcome))?;
                w.check("X5", done.stats.winner.is_none(), || "a winner without a success".into())?;
                if s.first_fatal.is_some() {
                    w.check("X3", gave_up.outcome == OutcomeKind::Fatal, || {
                        format!("a fatal failure answered, the outcome is {:?}", gave_up.outcome)
                    })?;
                }
                if gave_up.outcome == OutcomeKind::Exhausted {
                    w.check("X1", s.created == u64::from(max), || {
                        format!("exhausted after {} of {max} attempts", s.created)
                    })?;
                }
                if gave_up.outcome == OutcomeKind::Rejected {
                    w.check("X4", gated, || "rejected without a budget".into())?;
                }
            }
        }
        w.now = rt.peek();
    }
    let summary = world.borrow().summary();
    Ok(summary)
}
