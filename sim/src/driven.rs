//! The real driving loop ([`persevere_driver::retry`]) on the simulator's virtual-time executor:
//! drawn policies and faults (errors of every class, hangs past the attempt deadline, panics),
//! checked through the loop's own hooks (G1–G4, G11).

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

fn silence_injected_panics() {
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
    let limit = policy.max_attempts().unwrap_or(u32::MAX);
    let world = Rc::new(RefCell::new(world));
    let rt = SimRuntime::new(seed);
    for op in 0..scenario.operations {
        let running = Rc::new(Cell::new(false));
        let overlapped = Rc::new(Cell::new(false));
        let calls = Rc::new(Cell::new(0u32));
        let last_class: Rc<Cell<Option<FailureClass>>> = Rc::default();
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
                w.record(op, "attempt", u64::from(calls.get()), took.as_nanos() as u64);
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
            let (world, last_class) = (world.clone(), last_class.clone());
            let hint_ns = scenario.hint_ns;
            move |code: &u8| {
                let kind = match code {
                    0 => FailureKind::Fatal,
                    1 => FailureKind::Hinted(Hint::After(Duration::from_nanos(world.borrow_mut().between(0, hint_ns)))),
                    2 => FailureKind::Hinted(Hint::DoNotRetry),
                    3 => FailureKind::Timeout,
                    _ => FailureKind::Retryable,
                };
                last_class.set(Some(kind.class()));
                kind
            }
        };
        let notify = {
            let (world, violation, last_class) = (world.clone(), violation.clone(), last_class.clone());
            let backoff = *policy.backoff();
            move |event: &RetryEvent<'_, u8>| {
                let mut w = world.borrow_mut();
                w.record(op, "retry scheduled", u64::from(event.next_attempt), event.delay.as_nanos() as u64);
                let class = event.class;
                let hinted = class == FailureClass::RetryAfter;
                let checks = [
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
        let Some(done) = block_on(&rt, future, 100_000) else {
            return Err(world.borrow().violation("G13", format!("operation {op} never finished")));
        };
        if let Some(v) = violation.borrow_mut().take() {
            return Err(v);
        }
        let mut w = world.borrow_mut();
        w.record(
            op,
            "outcome",
            u64::from(done.stats.attempts),
            done.result.as_ref().map_or_else(|g| g.outcome as u64, |_| 99),
        );
        w.check("G3", !overlapped.get(), || format!("operation {op}: attempts overlapped"))?;
        w.check("G3", !running.get(), || format!("operation {op}: an attempt outlived its operation"))?;
        w.check("R5", done.stats.attempts == calls.get(), || {
            format!("stats say {} attempts, {} were made", done.stats.attempts, calls.get())
        })?;
        w.check("G2", done.stats.attempts <= limit, || format!("{} attempts over {limit}", done.stats.attempts))?;
        if let Err(gave_up) = &done.result {
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
