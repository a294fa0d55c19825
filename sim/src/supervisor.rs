//! The real [`Supervisor`] of `persevere-driver` on the simulator's many-task executor
//! ([`crate::tasks`]): drawn task specs; attempts that succeed, fail (retryable, fatal,
//! canceled, do-not-retry, throttled, timeout, a short hint), panic (while created or while
//! polled), hang or run long; an operator that cancels, removes and
//! adds tasks and stalls the executor (virtual time jumps and timers fire late), then shuts
//! everything down with a drawn time limit; an event channel small enough to overflow, read
//! slowly.
//!
//! Checked after the run: S6 (each task's events form the lifecycle grammar, attempts numbered
//! from 1, one `TaskFinished`, last; with S1, S3, S5 and B6 where the stream shows them: the
//! one grammar of [`crate::model::supervision`], which the fuzz target holds the core to), S4 (a timeout only where one is configured; the exit a
//! handle resolves to is the `TaskFinished` outcome and count), the shutdown report (exactly the
//! tasks that ended after the shutdown began and before it returned, each in the list its exit
//! names, and every task still supervised when it began among them), the event channel (what
//! was received plus what was dropped is what was emitted), liveness (G13: every task ends),
//! exactly one end per task (G11), every attempt that ran announced by the machine (none after
//! a final `Fatal` or `Canceled`: G4), and determinism (G0: the trace of a seed is the same
//! every run).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use persevere::TaskOutcomeKind;
use persevere::{Backoff, FailureKind, Hint, SupervisionAction, SupervisionPolicy, TaskDefaults};
use persevere_driver::{
    Fault, Runtime, ShutdownReport, Spawn, Supervisor, SupervisorBuilder, SupervisorEvent, TaskExit, TaskSpec,
};

use crate::driven::{INJECTED_PANIC, silence_injected_panics};
use crate::model::supervision::Grammar;
use crate::tasks::{Stop, Tasks, lock};
use crate::world::{Summary, Violation, World};

type Sup = Supervisor<Tasks, Tasks, u32, u32>;

/// What the run saw, shared by the listener, the waiters and the operator.
#[derive(Default)]
struct Log {
    /// Every event, as the listener heard it (a listener hears them all; the channel may drop).
    events: Vec<SupervisorEvent<u32, u32>>,
    exits: BTreeMap<u32, TaskExit<u32>>,
    /// Tasks added, with whether each has an attempt timeout.
    added: BTreeMap<u32, bool>,
    /// Attempts each task's closure created (a panic while creating one included).
    created: BTreeMap<u32, u64>,
    /// Each task's policy, as the supervisor builds it from its spec.
    policies: BTreeMap<u32, SupervisionPolicy>,
    removed: Vec<u32>,
    /// `events.len()` when the shutdown began and when it returned.
    shutdown: Option<(usize, usize)>,
    report: Option<ShutdownReport<u32>>,
    /// Events the slow reader took from the channel.
    received: u64,
    /// The operator is done (the shutdown returned).
    done: bool,
    /// The first add that was refused (none should be).
    refused: Option<String>,
}

/// What an attempt does.
#[derive(Clone, Copy, Debug)]
enum Act {
    Succeed,
    /// Fails with this error code (see [`classify`]).
    Fail(u32),
    Panic,
    Hang,
}

/// The classes the attempts' error codes stand for.
fn classify(code: &u32) -> FailureKind {
    match code % 8 {
        0 | 1 => FailureKind::Retryable,
        2 => FailureKind::Fatal,
        3 => FailureKind::Canceled,
        4 => FailureKind::Hinted(Hint::DoNotRetry),
        5 => FailureKind::Throttled,
        6 => FailureKind::Timeout,
        _ => FailureKind::Hinted(Hint::After(Duration::from_millis(u64::from(*code % 40)))),
    }
}

fn draw_spec(world: &mut World) -> (TaskSpec, bool) {
    let mut spec = match world.between(0, 3) {
        0 => TaskSpec::once(),
        1 => TaskSpec::restartable(),
        2 => TaskSpec::periodic(Duration::from_millis(world.between(0, 40))),
        _ => TaskSpec::from_defaults(),
    };
    if world.chance(500) {
        spec = spec.max_retries(world.between(1, 4) as u32);
    }
    spec = match world.between(0, 2) {
        0 => spec.no_backoff(),
        1 => spec.backoff(Backoff::constant(Duration::from_millis(world.between(0, 30))).build().unwrap()),
        _ => spec.backoff(
            Backoff::exponential(Duration::from_millis(world.between(1, 10)), 2.0)
                .max_delay(Duration::from_millis(world.between(10, 80)))
                .build()
                .unwrap(),
        ),
    };
    let timed = world.chance(400);
    if timed {
        spec = spec.attempt_timeout(Duration::from_millis(world.between(1, 60)));
    }
    (spec, timed)
}

/// Adds task `id` with a drawn spec; its attempts draw what they do from the world.
fn add(sup: &Sup, rt: &Tasks, world: &Arc<Mutex<World>>, log: &Arc<Mutex<Log>>, id: u32) {
    let (spec, timed) = draw_spec(&mut lock(world));
    // The supervisor's defaults are `TaskDefaults::default()`; the specs drawn are valid.
    let policy = spec.build(&TaskDefaults::default()).expect("a drawn spec builds");
    let attempt = {
        let (world, rt, log_of_attempts) = (world.clone(), rt.clone(), log.clone());
        move || {
            let (took, act, panics_now) = {
                let mut w = lock(&world);
                w.steps += 1;
                let took = Duration::from_millis(w.between(0, 50));
                let act = match w.between(0, 99) {
                    0..=39 => Act::Succeed,
                    40..=74 => Act::Fail(w.between(0, 1_000) as u32),
                    75..=84 => Act::Hang,
                    _ => Act::Panic,
                };
                let panics_now = w.chance(30);
                w.record(id, "attempt created", took.as_millis() as u64, 0);
                (took, act, panics_now)
            };
            *lock(&log_of_attempts).created.entry(id).or_default() += 1;
            if panics_now {
                std::panic::panic_any(INJECTED_PANIC);
            }
            let rt = rt.clone();
            async move {
                let until = rt.now().saturating_add(took);
                rt.sleep_until(until).await;
                match act {
                    Act::Succeed => Ok(()),
                    Act::Fail(code) => Err(code),
                    Act::Panic => std::panic::panic_any(INJECTED_PANIC),
                    Act::Hang => std::future::pending().await,
                }
            }
        }
    };
    // Tasks are added only before the shutdown, with fresh ids and valid specs.
    let handle = match sup.add_classified(id, spec, classify, attempt) {
        Ok(handle) => handle,
        Err(error) => {
            lock(log).refused.get_or_insert(format!("task {id} was refused: {error}"));
            return;
        }
    };
    let mut log_of_adds = lock(log);
    log_of_adds.added.insert(id, timed);
    log_of_adds.policies.insert(id, policy);
    drop(log_of_adds);
    let log = log.clone();
    rt.spawn(async move {
        let exit = handle.await;
        lock(&log).exits.insert(id, exit);
    });
}

/// A defect injected into the supervisor or into what the run observes, to prove the checks
/// catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SupervisorBug {
    /// Every `TaskFinished` is heard twice (a second end of the same task).
    SecondFinish,
    /// The shutdown report forgets the first task it aborted.
    ForgottenAbort,
    /// In the driver ([`Fault::RestartAfterFatal`]): a task finished `Fatal` runs one more
    /// attempt.
    RestartAfterFatal,
    /// In the driver ([`Fault::DropTaskFinished`]): no `TaskFinished` is emitted.
    DroppedFinish,
}

/// Runs the supervisor scenario of `seed`.
pub fn run(seed: u64) -> Result<Summary, Violation> {
    run_with(seed, None)
}

/// Runs the supervisor scenario of `seed`, with `bug` injected.
pub fn run_with(seed: u64, bug: Option<SupervisorBug>) -> Result<Summary, Violation> {
    silence_injected_panics();
    let mut first = World::new("supervisor", seed);
    let tasks_at_start = first.between(1, 6) as u32;
    let capacity = first.between(1, 8) as usize;
    let operations = first.between(0, 10);
    let limit = Duration::from_millis(first.between(0, 100));
    let world = Arc::new(Mutex::new(first));
    let log: Arc<Mutex<Log>> = Arc::default();
    let rt = Tasks::new(seed);
    let mut builder =
        SupervisorBuilder::with(TaskDefaults::default(), rt.clone(), rt.clone()).event_capacity(capacity).seed(seed);
    match bug {
        Some(SupervisorBug::RestartAfterFatal) => builder = builder.inject_fault(Fault::RestartAfterFatal),
        Some(SupervisorBug::DroppedFinish) => builder = builder.inject_fault(Fault::DropTaskFinished),
        _ => {}
    }
    let sup: Sup = builder.build();
    {
        let (log, world) = (log.clone(), world.clone());
        sup.on_event(move |event| {
            let what = match event.event {
                SupervisionAction::AttemptStarting { .. } => "attempt starting",
                SupervisionAction::AttemptSucceeded { .. } => "attempt succeeded",
                SupervisionAction::AttemptFailed { .. } => "attempt failed",
                SupervisionAction::AttemptTimedOut { .. } => "attempt timed out",
                SupervisionAction::AttemptCanceled { .. } => "attempt canceled",
                SupervisionAction::BackoffScheduled { .. } => "backoff scheduled",
                SupervisionAction::TaskFinished { .. } => "task finished",
            };
            // Each event is an output drained from the task's core machine: a core event.
            let mut w = lock(&world);
            w.steps += 1;
            w.record(event.id, what, event.at.as_nanos(), 0);
            drop(w);
            let mut log = lock(&log);
            log.events.push(event.clone());
            if bug == Some(SupervisorBug::SecondFinish) && what == "task finished" {
                log.events.push(event.clone());
            }
        });
    }
    for id in 0..tasks_at_start {
        add(&sup, &rt, &world, &log, id);
    }
    // The slow reader of the bounded channel.
    {
        let (events, log, world, reader) = (sup.events(), log.clone(), world.clone(), rt.clone());
        rt.spawn(async move {
            loop {
                while events.try_recv().is_some() {
                    lock(&log).received += 1;
                }
                if lock(&log).done {
                    return;
                }
                let gap = Duration::from_millis(lock(&world).between(1, 40));
                reader.sleep_until(reader.now().saturating_add(gap)).await;
            }
        });
    }
    // The operator.
    {
        let (sup, log, world, op_rt) = (sup.clone(), log.clone(), world.clone(), rt.clone());
        rt.spawn(async move {
            let mut next_id = tasks_at_start;
            for _ in 0..operations {
                let (gap, choice, target) = {
                    let mut w = lock(&world);
                    (Duration::from_millis(w.between(0, 80)), w.between(0, 3), w.between(0, u64::from(next_id)) as u32)
                };
                op_rt.sleep_until(op_rt.now().saturating_add(gap)).await;
                match choice {
                    0 => {
                        lock(&world).record(target, "operator cancels", 0, 0);
                        let _ = sup.cancel(&target);
                    }
                    1 => {
                        lock(&world).record(target, "operator removes", 0, 0);
                        if sup.remove(&target).is_ok() {
                            lock(&log).removed.push(target);
                        }
                    }
                    2 => {
                        lock(&world).record(next_id, "operator adds", 0, 0);
                        add(&sup, &op_rt, &world, &log, next_id);
                        next_id += 1;
                    }
                    _ => {
                        let stall = Duration::from_millis(lock(&world).between(1, 200));
                        lock(&world).record(0, "clock jumps", stall.as_millis() as u64, 0);
                        op_rt.jump(stall);
                    }
                }
            }
            let began = lock(&log).events.len();
            let report = sup.shutdown(limit).await;
            let mut log = lock(&log);
            log.shutdown = Some((began, log.events.len()));
            let mut report = report;
            if bug == Some(SupervisorBug::ForgottenAbort) && !report.aborted.is_empty() {
                report.aborted.remove(0);
            }
            log.report = Some(report);
            log.done = true;
        });
    }
    let stop = rt.run(2_000_000);
    // The listener (held by the supervisor) and the attempts still hold the world: lock it.
    let mut world = lock(&world);
    world.check("G13", stop == Stop::Done, || format!("the run stopped {stop:?}: a task never ended"))?;
    let received = {
        let events = sup.events();
        let mut n = 0;
        while events.try_recv().is_some() {
            n += 1;
        }
        n
    };
    let log = lock(&log);
    check(&mut world, &sup, &log, received)?;
    Ok(world.summary())
}

fn check(world: &mut World, sup: &Sup, log: &Log, late: u64) -> Result<(), Violation> {
    if let Some(refused) = &log.refused {
        return Err(world.violation("S1", refused.clone()));
    }
    // S6 (with S1, S3, S5 and B6 where the stream shows them) and S4, per task.
    let mut grammars: BTreeMap<u32, (Grammar, u64)> = BTreeMap::new();
    let mut finished_at: BTreeMap<u32, usize> = BTreeMap::new();
    for (index, SupervisorEvent { id, at, event }) in log.events.iter().enumerate() {
        let (grammar, last_at) = grammars.entry(*id).or_default();
        world.check("S6", at.as_nanos() >= *last_at, || format!("task {id}: an event at {at:?} after a later one"))?;
        *last_at = at.as_nanos();
        let Some(policy) = log.policies.get(id) else {
            return Err(world.violation("S6", format!("task {id}: {event:?}, but no such task was added")));
        };
        grammar.event(world, policy, *at, event)?;
        if let SupervisionAction::AttemptTimedOut { attempt } = event {
            let timed = log.added.get(id).copied().unwrap_or(false);
            world
                .check("S4", timed, || format!("task {id}: attempt {attempt} timed out with no timeout configured"))?;
        }
        if let SupervisionAction::TaskFinished { outcome, attempts } = event {
            finished_at.insert(*id, index);
            let exit = log.exits.get(id);
            world.check("S4", exit.is_some_and(|e| e.outcome == *outcome && e.attempts == *attempts), || {
                format!("task {id}: finished {outcome:?} after {attempts} attempts, its handle says {exit:?}")
            })?;
        }
    }
    for id in log.added.keys() {
        let finished = grammars.get(id).is_some_and(|(grammar, _)| grammar.finished());
        world.check("G11", finished, || format!("task {id} never finished"))?;
    }
    // Every attempt that ran is one the machine started: none after the task's end (G4 after a
    // final `Fatal` or `Canceled`), none unannounced.
    let mut started: BTreeMap<u32, u64> = BTreeMap::new();
    for SupervisorEvent { id, event, .. } in &log.events {
        if let SupervisionAction::AttemptStarting { .. } = event {
            *started.entry(*id).or_default() += 1;
        }
    }
    for id in log.added.keys() {
        let created = log.created.get(id).copied().unwrap_or(0);
        let announced = started.get(id).copied().unwrap_or(0);
        let outcome = log.exits.get(id).map(|e| e.outcome.kind());
        let rule =
            if matches!(outcome, Some(TaskOutcomeKind::Fatal | TaskOutcomeKind::Canceled)) { "G4" } else { "S6" };
        world.check(rule, created == announced, || {
            format!("task {id}: {created} attempts ran, {announced} started by the machine; it ended {outcome:?}")
        })?;
    }
    world.check("G11", log.exits.len() == log.added.len(), || {
        format!("{} tasks added, {} handles resolved", log.added.len(), log.exits.len())
    })?;

    // The shutdown report: exactly the tasks that ended while the shutdown ran, each in the
    // list its exit names; every task still supervised when it began ended by then.
    let (Some((began, returned)), Some(report)) = (log.shutdown, &log.report) else {
        return Err(world.violation("G13", "the shutdown never returned".into()));
    };
    let mut listed: BTreeMap<u32, bool> = BTreeMap::new();
    for (id, kind) in &report.completed {
        world.check("S4", listed.insert(*id, false).is_none(), || format!("task {id} listed twice"))?;
        let exit = log.exits.get(id);
        world.check("S4", exit.is_some_and(|e| !e.aborted && e.outcome.kind() == *kind), || {
            format!("task {id} listed as completed {kind:?}, its exit is {exit:?}")
        })?;
    }
    for id in &report.aborted {
        world.check("S4", listed.insert(*id, true).is_none(), || format!("task {id} listed twice"))?;
        let exit = log.exits.get(id);
        world.check("S4", exit.is_some_and(|e| e.aborted), || {
            format!("task {id} listed as aborted, its exit is {exit:?}")
        })?;
    }
    for (id, index) in &finished_at {
        let exit = log.exits.get(id);
        let aborted = exit.is_some_and(|e| e.aborted);
        world.check("S4", !aborted || listed.get(id) == Some(&true), || {
            format!("task {id} was aborted ({exit:?}) but the report does not list it so")
        })?;
        let during = (began..returned).contains(index);
        world.check("S4", during == listed.contains_key(id), || {
            format!("task {id} finished at event {index} (the shutdown ran from {began} to {returned}) but the report says {:?}", listed.get(id))
        })?;
        let supervised = !log.removed.contains(id);
        world.check("S4", !supervised || *index < returned, || {
            format!("task {id} was still supervised but finished after the shutdown returned")
        })?;
    }

    // The channel: what was read plus what was dropped is what was emitted.
    let emitted = log.events.len() as u64;
    let (read, dropped) = (log.received + late, sup.dropped_events());
    world.check("S6", read + dropped == emitted, || {
        format!("{read} events read and {dropped} dropped, {emitted} emitted")
    })?;
    let counts = sup.event_counts();
    world.check("S6", counts.task_finished == finished_at.len() as u64, || {
        format!("event counts {counts:?}, {} tasks finished", finished_at.len())
    })?;
    Ok(())
}
