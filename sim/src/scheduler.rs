//! The real [`Scheduler`] of `persevere-driver` on the simulator's many-task executor
//! ([`crate::tasks`]): every-flows with drawn intervals, or cron flows ticking every second
//! for at least 5 s, with drawn trip policies; runs that succeed, fail (retryable, fatal,
//! do-not-retry, canceled, throttled), push back with a short hint, panic or hang, and take
//! drawn times; an operator that triggers and resets flows and stalls the executor, then stops
//! the scheduler.
//!
//! Checked as each run starts: runs of one flow never overlap (F3), no run of a tripped flow is
//! dispatched (F10, G5), a run dispatched by the schedule starts no earlier than the previous
//! run's end plus the interval (F5, G6), the flow's machine is running it and, unless it was
//! triggered, its backoff window is over (F3, F5, F6), a cron run starts at its tick or at the
//! end of a stall that held it, never at a replayed tick (F6, G6). Checked as the operator
//! acts: every trip and reset told to the listeners matches the flow's status. After the run:
//! runs that hang are dropped as the executor shuts down, each drop a clean cancel (F4: the
//! flow is `Idle`, its streak as it was, or zero after a reset); the scheduler stops with
//! nothing in flight and every task ends (G13). And determinism (G0).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use persevere::{FailureKind, FlowPolicy, FlowStatusKind, Hint, Instant};
use persevere_driver::{Fault, FlowChange, Runtime, Scheduler, SchedulerHandle, Spawn};

use crate::driven::{INJECTED_PANIC, silence_injected_panics};
use crate::tasks::{Stop, Tasks, lock};
use crate::world::{Summary, Violation, World};

type Handle = SchedulerHandle<Tasks, Tasks, u32, u32>;

/// One flow, as the runs and the listener see it.
#[derive(Default)]
struct Seen {
    /// The every-flow's interval; zero for a cron flow (ticking every second).
    interval: Duration,
    running: u32,
    /// Heard tripped and not yet reset.
    tripped: bool,
    /// The last run's end, in virtual ns.
    last_end: Option<u64>,
    /// A trigger was accepted and its run has not started yet.
    triggered: bool,
    /// A run of the flow hangs; the streak when it started, and whether a reset was heard since.
    hung: Option<(u32, bool)>,
}

#[derive(Default)]
struct Log {
    flows: BTreeMap<u32, Seen>,
    /// The first broken rule, with what broke it.
    broken: Option<(&'static str, String)>,
    runs: u64,
    /// Checks made as runs started and as the operator looked.
    checked: u64,
    trips: u64,
    resets: u64,
    done: bool,
    /// When the scheduler started (its cron ticks fall on whole seconds after it), in virtual ns.
    started: u64,
    /// The instants executor stalls ended at, in virtual ns: a timer due during a stall fires
    /// then, so a tick that fell in it is dispatched late.
    stall_ends: Vec<u64>,
}

impl Log {
    fn breaks(&mut self, rule: &'static str, why: impl FnOnce() -> String) {
        if self.broken.is_none() {
            self.broken = Some((rule, why()));
        }
    }
}

/// The error code of a run that hangs.
const HANG: u32 = u32::MAX - 1;

/// The classes the runs' error codes stand for.
fn classify(code: &u32) -> FailureKind {
    match code % 8 {
        0..=2 => FailureKind::Retryable,
        3 => FailureKind::Fatal,
        4 => FailureKind::Hinted(Hint::DoNotRetry),
        5 => FailureKind::Canceled,
        6 => FailureKind::Throttled,
        _ => FailureKind::Hinted(Hint::After(Duration::from_millis(u64::from(*code % 90)))),
    }
}

/// Ends a run in the log, whether it returned, panicked or was dropped.
struct Running {
    log: Arc<Mutex<Log>>,
    rt: Tasks,
    id: u32,
}

impl Drop for Running {
    fn drop(&mut self) {
        let now = self.rt.now().as_nanos();
        let mut log = lock(&self.log);
        if let Some(seen) = log.flows.get_mut(&self.id) {
            seen.running -= 1;
            seen.last_end = Some(now);
        }
    }
}

/// A defect injected into what the run observes, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulerBug {
    /// The listener misses every reset: the flows it thinks tripped run again.
    LostReset,
    /// In the driver ([`Fault::DispatchWhileTripped`]): a trigger of a tripped flow dispatches
    /// a run.
    DispatchWhileTripped,
    /// In the driver ([`Fault::ReplaySkippedTick`]): a cron tick skipped in a backoff window is
    /// replayed when the window ends.
    ReplaySkippedTick,
}

/// Runs the scheduler scenario of `seed`.
pub fn run(seed: u64) -> Result<Summary, Violation> {
    run_with(seed, None)
}

/// Runs the scheduler scenario of `seed`, with `bug` injected.
pub fn run_with(seed: u64, bug: Option<SchedulerBug>) -> Result<Summary, Violation> {
    silence_injected_panics();
    let mut first = World::new("scheduler", seed);
    let count = first.between(1, 5) as u32;
    let operations = first.between(0, 12);
    let rt = Tasks::new(seed);
    let log: Arc<Mutex<Log>> = Arc::default();
    let mut scheduler: Scheduler<Tasks, Tasks, u32, u32> = Scheduler::with(rt.clone(), rt.clone());
    scheduler.seed(seed);
    match bug {
        Some(SchedulerBug::DispatchWhileTripped) => {
            scheduler.inject_fault(Fault::DispatchWhileTripped);
        }
        Some(SchedulerBug::ReplaySkippedTick) => {
            scheduler.inject_fault(Fault::ReplaySkippedTick);
        }
        _ => {}
    }
    // Cron ticks fall on whole seconds of this wall clock, so on whole seconds after the start.
    scheduler.wall_clock_at_start(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let mut plans = Vec::new();
    // A third of the scenarios schedule cron flows (ticking every second, with windows often
    // long enough to cover a tick, run for at least 5 s); the others every-flows.
    let cron = first.chance(330);
    for id in 0..count {
        let interval = if cron { Duration::ZERO } else { Duration::from_millis(first.between(1, 100)) };
        let trip = first.between(1, 4) as u32;
        let backoff = if cron {
            crate::world::draw_backoff(&mut first, 1_500, 3_000)
        } else {
            crate::world::draw_backoff(&mut first, 5, 200)
        };
        let policy = FlowPolicy::builder().backoff(backoff).with_trip(trip).build().unwrap();
        plans.push((id, interval, policy));
        lock(&log).flows.insert(id, Seen { interval, ..Seen::default() });
    }
    let world = Arc::new(Mutex::new(first));
    // The handle, for the runs to ask the scheduler about their flow (set before any run).
    let cell: Arc<OnceLock<Handle>> = Arc::default();
    for (id, interval, policy) in plans {
        let (world, log, job_rt, cell) = (world.clone(), log.clone(), rt.clone(), cell.clone());
        let job = move || {
            // What the scheduler says of this flow as its run starts.
            let info = cell.get().map(|handle| handle.status(&id));
            let (took, outcome, now) = {
                let mut w = lock(&world);
                w.steps += 1;
                let took = Duration::from_millis(w.between(0, 60));
                let outcome = match w.between(0, 99) {
                    0..=49 => Ok(()),
                    50..=89 => Err(w.between(0, 1_000) as u32),
                    90..=95 => Err(u32::MAX),
                    _ => Err(HANG),
                };
                let now = job_rt.now();
                w.record(id, "run starts", now.as_nanos(), 0);
                (took, outcome, now)
            };
            {
                let mut log = lock(&log);
                log.runs += 1;
                log.checked += 3;
                let seen = log.flows.get_mut(&id).expect("a flow of the scenario");
                let (running, tripped, triggered) = (seen.running, seen.tripped, seen.triggered);
                let cron = seen.interval.is_zero();
                let early =
                    seen.last_end.map(|end| end + seen.interval.as_nanos() as u64).filter(|due| now.as_nanos() < *due);
                seen.running += 1;
                seen.triggered = false;
                if running > 0 {
                    log.breaks("F3", || format!("flow {id}: a run started at {now:?} while another ran"));
                }
                if tripped {
                    log.breaks("G5", || format!("flow {id}: a run started at {now:?} while the flow was tripped"));
                }
                if let Some(due) = early
                    && !triggered
                {
                    log.breaks("G6", || format!("flow {id}: a scheduled run started at {now:?}, before {due} ns"));
                }
                // After G5 and G6, which name a defect better. F3: the run is one the flow's
                // machine dispatched, so the flow is running; F5 and F6: one not triggered
                // starts after its backoff window.
                match &info {
                    Some(Ok(info)) if info.status.kind() != FlowStatusKind::Running => {
                        let status = info.status.kind();
                        log.breaks("F3", || format!("flow {id}: a run started at {now:?}, the flow is {status:?}"));
                    }
                    Some(Ok(info)) if !triggered && info.next_eligible.is_some_and(|until| until > now) => {
                        let until = info.next_eligible;
                        log.breaks("G6", || {
                            format!("flow {id}: a run started at {now:?}, inside its window to {until:?}")
                        });
                    }
                    Some(Err(error)) => {
                        let error = error.to_string();
                        log.breaks("F9", || format!("flow {id}: no status as its run started: {error}"));
                    }
                    _ => {}
                }
                // F6: a cron run starts at its tick, or late when a stall held the timer;
                // a skipped tick is never replayed (it would start between ticks).
                let since = now.as_nanos().saturating_sub(log.started);
                if cron && !triggered && since % 1_000_000_000 != 0 && !log.stall_ends.contains(&now.as_nanos()) {
                    log.breaks("G6", || format!("flow {id}: a cron run started at {now:?}, on no tick"));
                }
            }
            let guard = Running { log: log.clone(), rt: job_rt.clone(), id };
            let rt = job_rt.clone();
            if outcome == Err(HANG) {
                let streak = info.as_ref().and_then(|i| i.as_ref().ok()).map_or(0, |i| i.failure_streak);
                if let Some(seen) = lock(&log).flows.get_mut(&id) {
                    seen.hung = Some((streak, false));
                }
            }
            async move {
                rt.sleep_until(now.saturating_add(took)).await;
                if outcome == Err(HANG) {
                    // Never ends: dropped when the executor shuts down (the guard with it).
                    std::future::pending::<()>().await;
                }
                drop(guard);
                match outcome {
                    Err(u32::MAX) => std::panic::panic_any(INJECTED_PANIC),
                    other => other,
                }
            }
        };
        if interval.is_zero() {
            scheduler.cron(id, "* * * * * *", job).unwrap();
        } else {
            scheduler.every(id, interval, job).unwrap();
        }
        scheduler.classify(&id, classify).unwrap();
        scheduler.set_backoff(&id, policy).unwrap();
    }
    lock(&log).started = rt.now().as_nanos();
    let handle: Handle = scheduler.start();
    let _ = cell.set(handle.clone());
    {
        let (log, world) = (log.clone(), world.clone());
        handle.on_transition(move |t| {
            let mut w = lock(&world);
            w.steps += 1;
            let mut log = lock(&log);
            let seen = log.flows.get_mut(&t.flow).expect("a flow of the scenario");
            match t.change {
                FlowChange::Tripped { streak, .. } => {
                    w.record(t.flow, "flow tripped", u64::from(streak), t.at.as_nanos());
                    let again = seen.tripped;
                    seen.tripped = true;
                    log.trips += 1;
                    if again {
                        log.breaks("F10", || format!("flow {}: tripped twice with no reset between", t.flow));
                    }
                }
                FlowChange::Reset if bug == Some(SchedulerBug::LostReset) => {}
                FlowChange::Reset => {
                    w.record(t.flow, "flow reset", 0, t.at.as_nanos());
                    seen.tripped = false;
                    log.resets += 1;
                }
                _ => {}
            }
        });
    }
    // The operator.
    {
        let (handle, log, world, op_rt) = (handle.clone(), log.clone(), world.clone(), rt.clone());
        rt.spawn(async move {
            for _ in 0..operations {
                let (gap, choice, id) = {
                    let mut w = lock(&world);
                    (
                        Duration::from_millis(w.between(0, 150)),
                        w.between(0, 2),
                        w.between(0, u64::from(count - 1)) as u32,
                    )
                };
                op_rt.sleep_until(op_rt.now().saturating_add(gap)).await;
                match choice {
                    0 => {
                        lock(&world).record(id, "operator triggers", 0, 0);
                        if handle.trigger(&id).is_ok() {
                            let mut log = lock(&log);
                            if let Some(seen) = log.flows.get_mut(&id) {
                                seen.triggered = true;
                            }
                        }
                    }
                    1 => {
                        lock(&world).record(id, "operator resets", 0, 0);
                        if handle.reset_flow(&id).is_ok()
                            && let Some((_, reset)) = lock(&log).flows.get_mut(&id).and_then(|s| s.hung.as_mut())
                        {
                            // The streak of a flow whose run hangs is zero from here.
                            *reset = true;
                        }
                    }
                    _ => {
                        let by = Duration::from_millis(lock(&world).between(1, 300));
                        lock(&world).record(0, "executor stalls", by.as_millis() as u64, 0);
                        op_rt.jump(by);
                        lock(&log).stall_ends.push(op_rt.now().as_nanos());
                    }
                }
                // What the listener heard agrees with the flows' status.
                let tripped: Vec<(u32, bool)> = lock(&log).flows.iter().map(|(id, s)| (*id, s.tripped)).collect();
                for (id, heard) in tripped {
                    lock(&log).checked += 1;
                    let status = handle.status(&id).map(|info| info.status.kind());
                    if (status == Ok(FlowStatusKind::Tripped)) != heard {
                        lock(&log)
                            .breaks("F10", || format!("flow {id} is {status:?}, the listener heard tripped: {heard}"));
                    }
                }
            }
            if cron {
                let until = Instant::from_nanos(lock(&log).started).saturating_add(Duration::from_secs(5));
                op_rt.sleep_until(until).await;
            }
            handle.stop();
        });
    }
    let stop = rt.run(2_000_000);
    // Only runs that hang are left: the executor shuts down and drops them, and each drop is
    // a clean cancel (F4).
    let dropped = if stop == Stop::Stuck { rt.drop_unfinished() } else { 0 };
    {
        let (handle, log) = (handle.clone(), log.clone());
        rt.spawn(async move {
            handle.wait().await;
            lock(&log).done = true;
        });
    }
    let after = rt.run(2_000_000);
    let mut world = lock(&world);
    // Exactly the runs drawn to hang were left (one per flow at most: a hung flow runs on), and
    // nothing else: a task stuck for any other reason is a liveness defect.
    let hanging = lock(&log).flows.values().filter(|s| s.hung.is_some()).count();
    world.check("G13", stop == if hanging == 0 { Stop::Done } else { Stop::Stuck } && dropped == hanging, || {
        format!("the run stopped {stop:?} with {dropped} tasks left, {hanging} runs drawn to hang")
    })?;
    world.check("G13", after == Stop::Done, || format!("after the shutdown the run stopped {after:?}"))?;
    let mut log = lock(&log);
    world.check("G13", log.done, || "the scheduler never stopped with nothing in flight".into())?;
    let hung: Vec<(u32, (u32, bool))> = log.flows.iter().filter_map(|(id, s)| s.hung.map(|h| (*id, h))).collect();
    for (id, (streak, reset)) in hung {
        log.checked += 1;
        let info = handle.status(&id);
        let expected = if reset { 0 } else { streak };
        let ok = info.as_ref().is_ok_and(|i| i.status.kind() == FlowStatusKind::Idle && i.failure_streak == expected);
        if !ok {
            let info = info.map(|i| (i.status.kind(), i.failure_streak));
            log.breaks("F4", || {
                format!("flow {id}: its hung run was dropped; it is {info:?}, expected Idle with streak {expected}")
            });
        }
    }
    if let Some((rule, why)) = &log.broken {
        return Err(world.violation(rule, why.clone()));
    }
    world.checks += log.checked;
    Ok(world.summary())
}
