//! The real driving loop ([`persevere_driver::retry`]) on the simulator's virtual-time executor:
//! drawn policies and faults (errors of every class, hangs past the attempt deadline, panics),
//! checked through the loop's own hooks and its result (G1–G4, G11, R5, B6).
//!
//! The loop's jitter RNG is seeded at its first draw, and a policy without a budget or an
//! attempt timeout runs on its own timeline (machine time from zero, moved only by sleeps):
//! neither changes what is checked, and a seed still gives one trace (G0).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Once;
use std::time::Duration;

use persevere::{FailureClass, FailureKind, Hint, OutcomeKind};
use persevere_driver::{RetryEvent, retry};

use crate::executor::{SimRuntime, block_on};
use crate::retry::RetryScenario;
use crate::world::{Summary, Violation, World};

/// The payload of the panics the simulator injects; the panic hook stays quiet about them.
pub const INJECTED_PANIC: &str = "sim: injected panic";

pub(crate) fn silence_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&INJECTED_PANIC) {
                previous(info);
            }
        }));
    });
}

/// Runs the driven retry scenario of `seed`: its operations one after another through the real
/// driving loop.
pub fn run(seed: u64) -> Result<Summary, Violation> {
    silence_injected_panics();
    let mut world = World::new("driven", seed);
    let scenario = RetryScenario::draw(&mut world);
    let policy = scenario.policy;
    let limit = policy.max_attempts().map_or(u64::MAX, u64::from);
    let world = Rc::new(RefCell::new(world));
    let rt = SimRuntime::new(seed);
    for op in 0..scenario.operations {
        let running = Rc::new(Cell::new(false));
        let overlapped = Rc::new(Cell::new(false));
        let calls = Rc::new(Cell::new(0u64));
        let last_class: Rc<Cell<Option<FailureClass>>> = Rc::default();
        // The last hint classified, and the time the loop reported asleep.
        let last_hint: Rc<Cell<Option<Duration>>> = Rc::default();
        let slept = Rc::new(Cell::new(Duration::ZERO));
        let measure = world.borrow_mut().chance(300);
        let op_start = rt.peek();
        let violation: Rc<RefCell<Option<Violation>>> = Rc::default();
        let attempt = {
            let (world, rt, running, overlapped, calls) =
                (world.clone(), rt.clone(), running.clone(), overlapped.clone(), calls.clone());
            let scenario = scenario.clone();
            move || {
                if running.get() {
                    overlapped.set(true);
                }
                calls.set(calls.get() + 1);
                let mut w = world.borrow_mut();
                w.steps += 1;
                let now = rt.peek();
                let past_horizon = now >= scenario.horizon;
                let fails = !past_horizon && w.chance(scenario.failure_rate);
                let hangs = fails && w.chance(scenario.hang_rate);
                let panics = fails && !hangs && w.chance(100);
                let took = Duration::from_nanos(w.between(0, scenario.attempt_ns));
                let code = w.between(0, 6) as u8;
                w.record(op, "attempt", calls.get(), took.as_nanos() as u64);
                drop(w);
                let guard = RunningGuard::new(running.clone());
                let sleep = rt.sleep(now.saturating_add(took));
                async move {
                    let _guard = guard;
                    if hangs {
                        std::future::pending::<()>().await;
                    }
                    sleep.await;
                    if panics {
                        std::panic::panic_any(INJECTED_PANIC);
                    }
                    if fails { Err(code) } else { Ok(op) }
                }
            }
        };
        let classify = {
            let (world, last_class, last_hint) = (world.clone(), last_class.clone(), last_hint.clone());
            let hint_ns = scenario.hint_ns;
            move |code: &u8| {
                let kind = match code {
                    0 => FailureKind::Fatal,
                    1 => {
                        let hint = Duration::from_nanos(world.borrow_mut().between(0, hint_ns));
                        last_hint.set(Some(hint));
                        FailureKind::Hinted(Hint::After(hint))
                    }
                    2 => FailureKind::Hinted(Hint::DoNotRetry),
                    3 => FailureKind::Timeout,
                    _ => FailureKind::Retryable,
                };
                last_class.set(Some(kind.class()));
                kind
            }
        };
        let notify = {
            let (world, violation, last_class, last_hint, slept) =
                (world.clone(), violation.clone(), last_class.clone(), last_hint.clone(), slept.clone());
            let backoff = *policy.backoff();
            let max_hint = policy.max_hint();
            move |event: &RetryEvent<'_, u8>| {
                let mut w = world.borrow_mut();
                w.record(op, "retry scheduled", event.next_attempt, event.delay.as_nanos() as u64);
                slept.set(slept.get() + event.delay);
                let class = event.class;
                let hinted = class == FailureClass::RetryAfter;
                // B6: a hint is waited in full, never shortened, and only within max_hint.
                let hint_kept = !hinted || (last_hint.get() == Some(event.delay) && event.delay <= max_hint);
                let checks = [
                    w.check("G1", hint_kept, || {
                        format!(
                            "hinted delay {:?}, the hint asked {:?} (max_hint {max_hint:?})",
                            event.delay,
                            last_hint.get()
                        )
                    }),
                    w.check("G4", class.is_retryable(), || format!("a {class:?} failure is retried")),
                    w.check("G2", event.next_attempt <= limit, || {
                        format!("attempt {} over {limit}", event.next_attempt)
                    }),
                    w.check("G1", hinted || event.delay <= backoff.max_delay(), || {
                        format!("delay {:?} over the cap", event.delay)
                    }),
                    w.check("G1", hinted || event.delay >= backoff.min_delay(), || {
                        format!("delay {:?} under the floor", event.delay)
                    }),
                    w.check(
                        "G4",
                        last_class.get().is_none_or(|c| {
                            c == class || class == FailureClass::Panicked || class == FailureClass::Timeout
                        }),
                        || "the event's class is not the classified one".into(),
                    ),
                ];
                if let Some(Err(v)) = checks.into_iter().find(Result::is_err) {
                    violation.borrow_mut().get_or_insert(v);
                }
                last_class.set(None);
            }
        };
        let future = retry(&rt, &policy, attempt).seed(seed ^ u64::from(op)).classify(classify).notify(notify);
        let future = if measure { future.measure_elapsed() } else { future };
        let Some(done) = block_on(&rt, future, 100_000) else {
            return Err(world.borrow().violation("G13", format!("operation {op} never finished")));
        };
        if let Some(v) = violation.borrow_mut().take() {
            return Err(v);
        }
        let mut w = world.borrow_mut();
        w.record(op, "outcome", done.stats.attempts, done.result.as_ref().map_or_else(|g| g.outcome as u64, |_| 99));
        w.check("G3", !overlapped.get(), || format!("operation {op}: attempts overlapped"))?;
        w.check("G3", !running.get(), || format!("operation {op}: an attempt outlived its operation"))?;
        w.check("R5", done.stats.attempts == calls.get(), || {
            format!("stats say {} attempts, {} were made", done.stats.attempts, calls.get())
        })?;
        w.check("G2", done.stats.attempts <= limit, || format!("{} attempts over {limit}", done.stats.attempts))?;
        w.check("R5", done.stats.slept == slept.get(), || {
            format!("stats say {:?} asleep, the retries scheduled {:?}", done.stats.slept, slept.get())
        })?;
        // R5: the elapsed time is known exactly when the clock was read at the first start (a
        // budget, a deadline, or asked for), and then it is the virtual time the operation took.
        let timed = policy.needs_clock() || measure;
        let elapsed = timed.then(|| rt.peek().saturating_duration_since(op_start));
        w.check("R5", done.stats.elapsed == elapsed, || {
            format!("stats say {:?} elapsed, expected {elapsed:?}", done.stats.elapsed)
        })?;
        if let Err(gave_up) = &done.result {
            let hint = last_hint.get();
            match gave_up.outcome {
                OutcomeKind::Deferred => {
                    // B6: the limit first; then a hint past max_hint or past the budget ends
                    // the operation at once, and the caller learns when to come back.
                    w.check("G2", done.stats.attempts < limit, || "deferred by the last allowed attempt".into())?;
                    w.check(
                        "B6",
                        gave_up.class == Some(FailureClass::RetryAfter) && gave_up.retry_after() == hint,
                        || {
                            format!(
                                "deferred after {:?}, retry after {:?}, the hint was {hint:?}",
                                gave_up.class,
                                gave_up.retry_after()
                            )
                        },
                    )?;
                    let hint = hint.unwrap_or(Duration::ZERO);
                    let past_budget = policy.total().zip(done.stats.elapsed).is_some_and(|(t, e)| e + hint > t);
                    w.check("B6", hint > policy.max_hint() || past_budget, || {
                        format!("a hint of {hint:?} within max_hint and the budget deferred the operation")
                    })?;
                }
                OutcomeKind::OutOfTime => {
                    w.check("B6", gave_up.class != Some(FailureClass::RetryAfter), || {
                        "a hinted failure ended out of time, not deferred".into()
                    })?;
                }
                _ => {}
            }
            if gave_up.outcome != OutcomeKind::Deferred {
                w.check("B6", gave_up.retry_after().is_none(), || format!("{gave_up:?} carries a retry_after"))?;
            }
            if gave_up.outcome == OutcomeKind::Exhausted {
                w.check("G2", done.stats.attempts == limit, || {
                    format!("exhausted after {} of {limit}", done.stats.attempts)
                })?;
            }
            if gave_up.outcome == OutcomeKind::Fatal {
                w.check("G4", matches!(gave_up.class, Some(FailureClass::Fatal | FailureClass::DoNotRetry)), || {
                    format!("fatal after {:?}", gave_up.class)
                })?;
            }
        }
        w.now = rt.peek();
    }
    let summary = world.borrow().summary();
    Ok(summary)
}

/// Marks an attempt as running until it completes or is dropped.
struct RunningGuard(Rc<Cell<bool>>);

impl RunningGuard {
    fn new(flag: Rc<Cell<bool>>) -> Self {
        flag.set(true);
        RunningGuard(flag)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
