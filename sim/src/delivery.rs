//! Delivery scenarios: one real [`persevere::Deliveries`] table whose tasks are handed to
//! several simulated workers that start, heartbeat (with checkpoints), complete, fail, crash,
//! disconnect, decline, close cleanly before starting, go silent, or never get the hand-out
//! (a failed send), while the server fails over and, in `Async` mode, start writes are lost and
//! roll back. Every task is checked before and after every step (G1, G2, G4, G10–G13, D1–D9).

use std::time::Duration;

use persevere::{
    AttemptProgress, Deliveries, Delivery, DeliveryAction, DeliveryError, DeliveryPolicy, DeliveryStatus, Durability,
    Failure, FailureClass, FailureKind, FailurePolicy, FreeReturn, Hint, Instant, Interruption, OutcomeKind,
    RetryPolicy, Stats, Terminal, TerminalKind,
};

use crate::world::{Summary, Violation, World, clamp_hint, delay_bounds, draw_backoff};

/// Task ids, task types, worker ids, checkpoints, errors and recovery routes.
type Table = Deliveries<u32, u8, u16, u32, u32, u8>;
type Task = Delivery<u32, u16, u32, u32, u8>;
type Policy = DeliveryPolicy<u8>;

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryBug {
    /// In `Sync` mode the dispatcher also sends a hand-out to a second worker.
    SecondWorker,
    /// A decline is reported as a disconnect: a free return consumes a retry.
    DeclineAsDisconnect,
    /// A completed task is dropped from the table.
    LoseCompleted,
    /// A worker's hint past `max_hint` is shortened to it before it is fed (the rule before
    /// issue 12; B6 now ends retries with `Deferred` and the hinted instant instead).
    ClampHint,
}

/// The drawn configuration of one delivery scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct DeliveryScenario {
    /// The policy every task shares.
    pub policy: Policy,
    /// Each task's type and the instant it is inserted.
    pub tasks: Vec<(u8, Instant)>,
    /// Each worker's declined task types, as a bit set (worker 0 declines none).
    pub workers: Vec<u8>,
    /// Per-mille chances, before the horizon: a failed send, a clean close before the start,
    /// a silent worker, a crash, a disconnect, a failed attempt, a late start, a lost heartbeat.
    pub faults: [u64; 8],
    /// Per-mille chance, per worker poll, of a server failover (before the horizon).
    pub failover_rate: u64,
    /// Per-mille chance that an `Async` start is never confirmed durable (before the horizon).
    pub unpersisted_rate: u64,
    /// Per-mille chance that a step first feeds a wrong report (G12).
    pub misuse_rate: u64,
    /// Per-mille chance that a step reports a stale clock.
    pub stall_rate: u64,
    /// Longest attempt, in nanoseconds.
    pub run_ns: u64,
    /// Longest pause between an idle worker's polls, in nanoseconds.
    pub poll_ns: u64,
    /// Longest restart of a crashed worker, in nanoseconds.
    pub restart_ns: u64,
    /// Longest hinted delay, in nanoseconds.
    pub hint_ns: u64,
    /// After this instant workers behave and the server stays up.
    pub horizon: Instant,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const SEND_FAILS: usize = 0;
const CLOSES: usize = 1;
const SILENT: usize = 2;
const CRASHES: usize = 3;
const DISCONNECTS: usize = 4;
const FAILS: usize = 5;
const LATE_START: usize = 6;
const LOST_HEARTBEAT: usize = 7;

impl DeliveryScenario {
    /// Draws a scenario from the world's RNG.
    pub fn draw(world: &mut World) -> Self {
        let mut retry = RetryPolicy::builder(draw_backoff(world, 100, 2_000));
        retry = match world.between(0, 1) {
            0 => retry.max_attempts(world.between(1, 6) as u32),
            _ => retry.max_retries(world.between(0, 5) as u32),
        };
        if world.chance(200) {
            retry = retry.total(ms(world.between(100, 20_000)));
        }
        if world.chance(300) {
            retry = retry.max_hint(ms(world.between(1, 2_000)));
        }
        let retry = retry.build().expect("drawn retry policies are valid");
        let on_failure = match world.between(0, 2) {
            0 => FailurePolicy::Fail,
            1 => FailurePolicy::Proceed,
            _ => FailurePolicy::Divert(7),
        };
        let policy = DeliveryPolicy::builder(retry)
            .max_redeliveries(world.between(0, 5) as u32)
            .durability(if world.chance(500) { Durability::Sync } else { Durability::Async })
            .start_timeout(ms(world.between(10, 1_500)))
            .heartbeat_timeout(ms(world.between(10, 1_500)))
            .on_failure(on_failure)
            .build()
            .expect("drawn delivery policies are valid");
        let types = world.between(1, 4) as u8;
        let tasks = (0..world.between(1, 14))
            .map(|_| (world.between(0, u64::from(types) - 1) as u8, Instant::from_millis(world.between(0, 2_000))))
            .collect();
        let workers = (0..world.between(1, 5)).map(|w| if w == 0 { 0 } else { world.between(0, 15) as u8 }).collect();
        let mut faults = [0; 8];
        for f in &mut faults {
            *f = world.between(0, 120);
        }
        DeliveryScenario {
            policy,
            tasks,
            workers,
            faults,
            failover_rate: world.between(0, 20),
            unpersisted_rate: world.between(0, 300),
            misuse_rate: world.between(0, 100),
            stall_rate: world.between(0, 100),
            run_ns: ms(world.between(0, 800)).as_nanos() as u64,
            poll_ns: ms(world.between(1, 300)).as_nanos() as u64,
            restart_ns: ms(world.between(0, 2_000)).as_nanos() as u64,
            hint_ns: ms(world.between(0, 2_000)).as_nanos() as u64,
            horizon: Instant::from_millis(world.between(0, 10_000)),
        }
    }
}

/// What a worker reports next about the attempt it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Report {
    Persisted,
    Started,
    Heartbeat(u32),
    Completed,
    Failed(FailureKind),
    Returned(FreeReturn),
    Disconnected,
    Crashed,
}

/// A worker's job: one attempt of one task, and its plan.
#[derive(Clone, Debug)]
struct Job {
    task: u32,
    attempt: u64,
    plan: Vec<(Instant, Report)>,
    next: usize,
}

/// One simulated worker.
#[derive(Clone, Debug)]
struct Worker {
    declines: u8,
    job: Option<Job>,
    /// When an idle worker next asks for work, or a crashed one is back.
    at: Instant,
}

/// What the simulator knows about one task.
#[derive(Clone, Debug, Default)]
struct Model {
    inserted: bool,
    /// When the table was told it was inserted: its embedded retry's first start (R5).
    inserted_at: Instant,
    /// Some hand-out reached a worker (D5).
    received: bool,
    /// Attempt numbers whose worker may have run them: `(attempt, worker)`.
    may_run: Vec<(u64, u16)>,
    /// Attempts rolled back (`Async`): their number may reach a second worker.
    rolled_back: Vec<u64>,
    /// Attempts retired by a failure or an interruption: never handed out again (D2).
    retired: Vec<u64>,
    finishes: u32,
    terminal: Option<TerminalKind>,
    /// The last checkpoint stored (D7), and the one the attempt out was handed out with.
    checkpoint: Option<u32>,
    snapshot: Option<u32>,
}

/// A task as the before/after check sees it: small, so every task is compared at every step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fp {
    state: St,
    retries_used: u64,
    redeliveries: u32,
    progress: AttemptProgress,
    checkpoint: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Pending { attempt: u64, not_before: Option<Instant> },
    Out { attempt: u64, worker: u16, started: bool, durable: bool, deadline: Instant },
    Done(TerminalKind),
}

impl Fp {
    fn of(task: &Task) -> Fp {
        let state = match *task.status() {
            DeliveryStatus::Pending { attempt, not_before } => St::Pending { attempt, not_before },
            DeliveryStatus::HandedOut { attempt, worker, deadline, durable } => {
                St::Out { attempt, worker, started: false, durable, deadline }
            }
            DeliveryStatus::Running { attempt, worker, heartbeat_deadline, durable } => {
                St::Out { attempt, worker, started: true, durable, deadline: heartbeat_deadline }
            }
            DeliveryStatus::Done(ref terminal) => St::Done(terminal.kind()),
        };
        Fp {
            state,
            retries_used: task.retries_used(),
            redeliveries: task.redeliveries(),
            progress: task.attempt_progress(),
            checkpoint: task.checkpoint().copied(),
        }
    }

    /// Where its attempt is out: `(attempt, worker, started, durable)`.
    fn out(&self) -> Option<(u64, u16, bool, bool)> {
        match self.state {
            St::Out { attempt, worker, started, durable, .. } => Some((attempt, worker, started, durable)),
            _ => None,
        }
    }
}

/// What a step did to a task, for the before/after check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    None,
    HandOut,
    /// A start, heartbeat or persist: the attempt stays out.
    Progress,
    Completed,
    /// A failure or an interruption: consumes a retry.
    Consumes,
    /// A free return: consumes none.
    Free,
    /// An `Async` rollback: consumes none.
    Rollback,
    /// A retry delay ended.
    Ready,
}

/// Runs the delivery scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<DeliveryBug>) -> Result<Summary, Violation> {
    let mut world = World::new("delivery", seed);
    let scenario = DeliveryScenario::draw(&mut world);
    let policy = &scenario.policy;
    let n = scenario.tasks.len();
    let mut table = Table::new();
    let mut models: Vec<Model> = vec![Model::default(); n];
    let mut workers: Vec<Worker> = scenario
        .workers
        .iter()
        .map(|&declines| Worker { declines, job: None, at: Instant::from_nanos(world.between(0, scenario.poll_ns)) })
        .collect();
    let mut before: Vec<Option<Fp>> = vec![None; n];
    let mut causes: Vec<Cause> = vec![Cause::None; n];

    for _ in 0..300_000u32 {
        // The next thing due: an insert, a worker's report or poll, the table's timeout.
        let mut next: Option<(Instant, usize)> = None;
        const TIMEOUT: usize = usize::MAX;
        const INSERT: usize = 1 << 20;
        for (i, (_, at)) in scenario.tasks.iter().enumerate() {
            if !models[i].inserted && next.is_none_or(|(best, _)| *at < best) {
                next = Some((*at, INSERT + i));
            }
        }
        for (w, worker) in workers.iter().enumerate() {
            let at = worker.job.as_ref().map_or(worker.at, |j| j.plan.get(j.next).map_or(worker.at, |p| p.0));
            if next.is_none_or(|(best, _)| at < best) {
                next = Some((at, w));
            }
        }
        if let Some(at) = table.poll_timeout()
            && next.is_none_or(|(best, _)| at < best)
        {
            next = Some((at, TIMEOUT));
        }
        if models.iter().all(|m| m.inserted && m.terminal.is_some()) {
            // The end: every task reached exactly one terminal state (G11, D9).
            for (i, m) in models.iter().enumerate() {
                world.check("G11", m.finishes == 1, || format!("task {i} finished {} times", m.finishes))?;
            }
            return Ok(world.summary());
        }
        let Some((due, what)) = next else {
            return Err(world.violation("G13", "tasks are unfinished and nothing is due".into()));
        };
        // Stalled clocks are faults too: past the horizon the clock is read on time.
        let reported = world.step_to(due, scenario.stall_rate, scenario.horizon);
        before.fill(None);
        for (id, _, task) in table.iter() {
            before[*id as usize] = Some(Fp::of(task));
        }
        causes.fill(Cause::None);
        if world.chance(scenario.misuse_rate) {
            misuse(&mut world, policy, &mut table, &models, reported)?;
        }
        let faulty = world.now < scenario.horizon;
        if what == TIMEOUT {
            world.record(u32::MAX, "table timeout", reported.as_nanos(), 0);
            for (i, b) in before.iter().enumerate() {
                causes[i] = match b.map(|b| b.state) {
                    Some(St::Pending { not_before: Some(t), .. }) if t <= reported => Cause::Ready,
                    Some(St::Out { deadline, .. }) if deadline <= reported => Cause::Consumes,
                    _ => Cause::None,
                };
            }
            table.handle_timeout(policy, reported, world.rng());
            if world.chance(scenario.misuse_rate) {
                // A second timeout at the same time changes nothing.
                let once = table.clone();
                table.handle_timeout(policy, reported, world.rng());
                world.check("§3", table == once, || {
                    "a repeated timeout changed the table (handle_timeout twice must do nothing)".into()
                })?;
            }
        } else if what >= INSERT {
            let i = what - INSERT;
            let (ty, _) = scenario.tasks[i];
            world.record(i as u32, "insert", u64::from(ty), 0);
            table
                .insert(policy, reported, i as u32, ty, 1_000 + i as u64)
                .map_err(|e| world.violation("G12", format!("task {i}: insert refused: {e}")))?;
            models[i].inserted = true;
            models[i].inserted_at = reported;
        } else {
            let w = what;
            if workers[w].job.is_none() {
                workers[w].at = world.now.saturating_add(Duration::from_nanos(world.between(1, scenario.poll_ns)));
                if faulty && world.chance(scenario.failover_rate) {
                    world.record(u32::MAX, "server failover", 0, 0);
                    for (i, b) in before.iter().enumerate() {
                        causes[i] = match b.and_then(|b| b.out()) {
                            Some((_, _, _, true)) => Cause::Consumes,
                            Some((_, _, _, false)) => Cause::Rollback,
                            None => Cause::None,
                        };
                    }
                    table.handle_failover(policy, reported, world.rng());
                } else if let Some(id) = table.hand_out_next(policy, reported, &(w as u16)) {
                    world.record(id, "hand out to", w as u64, 0);
                    causes[id as usize] = Cause::HandOut;
                }
            } else {
                report(
                    &mut world,
                    &scenario,
                    bug,
                    &mut table,
                    &mut workers,
                    &mut models,
                    &before,
                    &mut causes,
                    w,
                    reported,
                )?;
            }
        }
        drain(&mut world, &scenario, bug, &mut table, &mut workers, &mut models, reported)?;
        let mut seen = 0;
        for (id, _, task) in table.iter() {
            let i = *id as usize;
            seen += usize::from(before[i].is_some());
            check_task(&mut world, &scenario, task, &mut models[i], i, before[i], causes[i])?;
        }
        let held = before.iter().filter(|b| b.is_some()).count();
        world.check("G11", seen == held, || format!("{} tasks were lost from the table", held - seen))?;
        let counts = table.counts();
        let done = models.iter().filter(|m| m.terminal == Some(TerminalKind::Completed)).count();
        let inserted = models.iter().filter(|m| m.inserted).count();
        world.check("G11", counts.total() == inserted && counts.completed == done, || {
            format!("{counts:?} for {inserted} tasks, {done} completed")
        })?;
    }
    Err(world.violation("G13", "the scenario did not finish within 300000 steps".into()))
}

/// A worker's next report, fed to the table: accepted exactly when the attempt is out to
/// that worker (and, for a start or a free return, not started yet).
#[allow(clippy::too_many_arguments)]
fn report(
    world: &mut World,
    scenario: &DeliveryScenario,
    bug: Option<DeliveryBug>,
    table: &mut Table,
    workers: &mut [Worker],
    models: &mut [Model],
    before: &[Option<Fp>],
    causes: &mut [Cause],
    w: usize,
    now: Instant,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let job = workers[w].job.as_mut().expect("a worker with a job");
    let (at, what) = job.plan[job.next];
    job.next += 1;
    let (task, attempt) = (job.task, job.attempt);
    let finished = job.next >= job.plan.len();
    let i = task as usize;
    let worker = w as u16;
    world.record(task, "report", attempt, at.as_nanos());
    let Some(b) = before[i] else {
        return Err(world.violation("G11", format!("task {i} was lost from the table")));
    };
    let holds = b.out().filter(|o| o.0 == attempt && o.1 == worker);
    if finished || what == Report::Crashed {
        workers[w].job = None;
        workers[w].at = at.saturating_add(Duration::from_nanos(world.between(1, scenario.poll_ns)));
    }
    let (accepted, expected, cause) = match what {
        Report::Persisted => {
            let ok = table.handle_persisted(policy, now, &task, attempt).is_ok();
            (ok, b.out().is_some_and(|o| o.0 == attempt), Cause::Progress)
        }
        Report::Started => {
            let ok = table.handle_started(policy, now, &task, attempt, &worker).is_ok();
            (ok, holds.is_some_and(|o| !o.2), Cause::Progress)
        }
        Report::Heartbeat(checkpoint) => {
            let ok = table.handle_heartbeat(policy, now, &task, attempt, &worker, Some(checkpoint)).is_ok();
            (ok, holds.is_some(), Cause::Progress)
        }
        Report::Completed => {
            let ok = table.handle_completed(policy, now, &task, attempt, &worker).is_ok();
            (ok, holds.is_some(), Cause::Completed)
        }
        Report::Failed(kind) => {
            let fed = match bug {
                Some(DeliveryBug::ClampHint) => clamp_hint(kind, now, policy.retry().max_hint()),
                _ => kind,
            };
            let failure = Failure::new(fed, attempt as u32);
            let stats = table.get(&task).map(Delivery::stats);
            let ok = table.handle_failed(policy, now, &task, attempt, &worker, failure, world.rng()).is_ok();
            if let (true, FailureKind::Hinted(Hint::After(hint)), Some(stats)) = (ok, kind, stats) {
                check_hint(world, scenario, &models[i], i, table.get(&task), stats, hint)?;
            }
            (ok, holds.is_some(), Cause::Consumes)
        }
        Report::Returned(reason) => {
            let ok = if reason == FreeReturn::Declined && bug == Some(DeliveryBug::DeclineAsDisconnect) {
                let r = world.rng();
                table.handle_interrupted(policy, now, &task, attempt, &worker, Interruption::Disconnected, r).is_ok()
            } else {
                table.handle_returned(policy, now, &task, attempt, &worker, reason).is_ok()
            };
            (ok, holds.is_some_and(|o| !o.2), Cause::Free)
        }
        Report::Disconnected => {
            let r = world.rng();
            let ok =
                table.handle_interrupted(policy, now, &task, attempt, &worker, Interruption::Disconnected, r).is_ok();
            (ok, holds.is_some(), Cause::Consumes)
        }
        Report::Crashed => {
            // Every attempt this worker holds is interrupted.
            for (j, b) in before.iter().enumerate() {
                if b.and_then(|b| b.out()).is_some_and(|o| o.1 == worker) {
                    causes[j] = Cause::Consumes;
                }
            }
            let expected = causes.iter().filter(|c| **c == Cause::Consumes).count();
            let lost = table.handle_worker_lost(policy, now, &worker, Interruption::WorkerCrashed, world.rng());
            workers[w].at = at.saturating_add(Duration::from_nanos(world.between(1, scenario.restart_ns.max(1))));
            world.record(u32::MAX, "worker crashed", w as u64, lost as u64);
            return world.check("D2", lost == expected, || {
                format!("worker {w} crashed holding {expected} attempts; {lost} were interrupted")
            });
        }
    };
    world.record(task, if accepted { "report accepted" } else { "report refused" }, attempt, 0);
    world.check("G12", accepted == expected, || {
        format!(
            "task {i}: {what:?} for attempt {attempt} from worker {w} was {}",
            if accepted { "accepted" } else { "refused" }
        )
    })?;
    if accepted {
        if let Report::Heartbeat(checkpoint) = what {
            models[i].checkpoint = Some(checkpoint);
        }
        causes[i] = cause;
        if cause != Cause::Progress {
            // The attempt is over for this worker.
            workers[w].job = None;
        }
    } else {
        let after = table.get(&task).map(Fp::of);
        world.check("G12", after == Some(b), || format!("task {i}: a refused report changed it"))?;
    }
    Ok(())
}

/// Drains the table's actions: hand-outs go to their workers (G10), revokes free them,
/// and each task finishes exactly once (G11).
fn drain(
    world: &mut World,
    scenario: &DeliveryScenario,
    bug: Option<DeliveryBug>,
    table: &mut Table,
    workers: &mut [Worker],
    models: &mut [Model],
    now: Instant,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    // One queue for every task, in the order the actions were made: a task's `Finish` is its
    // last action (D9).
    while let Some((task, action)) = table.poll_action() {
        world.steps += 1;
        let i = task as usize;
        let finished = models[i].terminal;
        world.check("D9", finished.is_none() || matches!(action, DeliveryAction::Finish(_)), || {
            format!("task {i}: {action:?} after it finished ({finished:?})")
        })?;
        match action {
            DeliveryAction::Ready { attempt } => {
                world.record(task, "ready", attempt, 0);
            }
            DeliveryAction::Revoke { worker, attempt, reason } => {
                world.record(task, "revoke", attempt, u64::from(worker));
                let w = &mut workers[usize::from(worker)];
                if w.job.as_ref().is_some_and(|j| j.task == task && j.attempt == attempt) {
                    w.job = None;
                    w.at = world.now;
                }
                world.check(
                    "D2",
                    matches!(reason, Interruption::LeaseExpired | Interruption::HeartbeatMissed),
                    || format!("task {i}: revoked for {reason:?}"),
                )?;
            }
            DeliveryAction::HandOut(h) => {
                world.record(task, "hand-out sent", h.attempt, u64::from(h.worker));
                let m = &mut models[i];
                receive(world, scenario, m, i, h.attempt, h.worker)?;
                world.check("D7", h.checkpoint == m.checkpoint, || {
                    format!(
                        "task {i}: handed out with checkpoint {:?}, the last stored is {:?}",
                        h.checkpoint, m.checkpoint
                    )
                })?;
                m.snapshot = m.checkpoint;
                world.check("D10", h.key.task == task && h.key.step_execution == 1_000 + u64::from(task), || {
                    format!("task {i}: idempotency key {:?}", h.key)
                })?;
                if bug == Some(DeliveryBug::SecondWorker)
                    && policy.durability() == Durability::Sync
                    && workers.len() > 1
                {
                    // The defect: the same attempt is also sent to another worker.
                    let other = (h.worker + 1) % workers.len() as u16;
                    receive(world, scenario, m, i, h.attempt, other)?;
                }
                let faulty = world.now < scenario.horizon;
                let w = usize::from(h.worker);
                let plan = plan(world, scenario, workers[w].declines, task, h.attempt, faulty, now);
                if plan.first().is_some_and(|p| p.1 != Report::Returned(FreeReturn::SendFailed)) {
                    m.received = true;
                } else {
                    // The send failed: no worker got it.
                    m.may_run.pop();
                }
                workers[w].job = Some(Job { task, attempt: h.attempt, plan, next: 0 });
            }
            DeliveryAction::Finish(terminal) => {
                world.record(task, "finish", u64::from(task), terminal.kind() as u64);
                let m = &mut models[i];
                m.finishes += 1;
                world.check("G11", m.finishes == 1, || format!("task {i}: a second Finish"))?;
                m.terminal = Some(terminal.kind());
                check_terminal(world, scenario, m, i, &terminal)?;
                if bug == Some(DeliveryBug::LoseCompleted) && terminal.kind() == TerminalKind::Completed {
                    table.remove(&task);
                }
            }
        }
    }
    Ok(())
}

/// G10: in `Sync` mode an attempt number reaches at most one worker that may run it; a
/// retired number never reaches one again.
fn receive(
    world: &mut World,
    scenario: &DeliveryScenario,
    m: &mut Model,
    i: usize,
    attempt: u64,
    worker: u16,
) -> Result<(), Violation> {
    world.check("G10", !m.retired.contains(&attempt), || {
        format!("task {i}: retired attempt {attempt} handed out again")
    })?;
    let holder = m.may_run.iter().find(|r| r.0 == attempt).map(|r| r.1);
    let allowed = scenario.policy.durability() == Durability::Async && m.rolled_back.contains(&attempt);
    world.check("G10", holder.is_none() || allowed, || {
        format!("task {i}: attempt {attempt} reaches worker {worker}, but worker {holder:?} may have run it")
    })?;
    m.may_run.push((attempt, worker));
    Ok(())
}

/// What the worker that received a hand-out will report, and when.
fn plan(
    world: &mut World,
    scenario: &DeliveryScenario,
    declines: u8,
    task: u32,
    attempt: u64,
    faulty: bool,
    now: Instant,
) -> Vec<(Instant, Report)> {
    let policy = &scenario.policy;
    let f = scenario.faults;
    let chance = |world: &mut World, fault: usize| faulty && world.chance(f[fault]);
    let soon = |world: &mut World, limit: Duration| {
        now.saturating_add(Duration::from_nanos(world.between(0, limit.as_nanos() as u64 - 1)))
    };
    let start_by = policy.start_timeout();
    let beat = policy.heartbeat_timeout();
    let mut plan = Vec::with_capacity(6);
    if chance(world, SEND_FAILS) {
        plan.push((now, Report::Returned(FreeReturn::SendFailed)));
        return plan;
    }
    if policy.durability() == Durability::Async && !(faulty && world.chance(scenario.unpersisted_rate)) {
        plan.push((soon(world, start_by), Report::Persisted));
    }
    let ty = scenario.tasks[task as usize].0;
    if declines & (1 << ty) != 0 {
        plan.push((soon(world, start_by), Report::Returned(FreeReturn::Declined)));
    } else if chance(world, CLOSES) {
        plan.push((soon(world, start_by), Report::Returned(FreeReturn::ClosedBeforeStart)));
    } else if chance(world, SILENT) {
        // The worker goes quiet: the lease expires long before it says anything again.
        plan.push((now.saturating_add(start_by * 3), Report::Returned(FreeReturn::ClosedBeforeStart)));
    } else {
        let late = chance(world, LATE_START);
        let mut t = if late { soon(world, start_by * 2) } else { soon(world, start_by) };
        plan.push((t, Report::Started));
        let end = t.saturating_add(Duration::from_nanos(world.between(0, scenario.run_ns)));
        let mut checkpoint = (attempt as u32).wrapping_mul(100);
        loop {
            let lost = chance(world, LOST_HEARTBEAT);
            let gap = if lost { beat * 2 } else { beat };
            let next = t.saturating_add(Duration::from_nanos(world.between(1, gap.as_nanos() as u64 - 1).max(1)));
            if next >= end {
                break;
            }
            t = next;
            checkpoint += 1;
            plan.push((t, Report::Heartbeat(checkpoint)));
        }
        let last = if chance(world, CRASHES) {
            Report::Crashed
        } else if chance(world, DISCONNECTS) {
            Report::Disconnected
        } else if chance(world, FAILS) {
            Report::Failed(match world.between(0, 5) {
                0 => FailureKind::Fatal,
                1 => FailureKind::Canceled,
                2 => FailureKind::Hinted(Hint::DoNotRetry),
                3 => FailureKind::Hinted(Hint::After(Duration::from_nanos(world.between(0, scenario.hint_ns)))),
                4 => FailureKind::Timeout,
                _ => FailureKind::Retryable,
            })
        } else {
            Report::Completed
        };
        plan.push((end.later(t), last));
    }
    plan.sort_by_key(|p| p.0);
    plan
}

/// The before/after check of one task (D1–D6, G1, G2, G10, G11).
#[allow(clippy::too_many_arguments)]
fn check_task(
    world: &mut World,
    scenario: &DeliveryScenario,
    task: &Task,
    m: &mut Model,
    i: usize,
    before: Option<Fp>,
    cause: Cause,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let Some(b) = before else { return Ok(()) };
    let a = Fp::of(task);
    if b == a {
        return world.check("D1", matches!(cause, Cause::None | Cause::Progress), || {
            format!("task {i}: {cause:?} changed nothing")
        });
    }
    let consumed = a.retries_used.wrapping_sub(b.retries_used);
    let was = b.out();
    match (b.state, a.state) {
        (St::Done(_), _) => {
            return Err(world.violation("G11", format!("task {i}: a terminal state changed to {:?}", task.status())));
        }
        (St::Pending { attempt, .. }, St::Pending { attempt: now_attempt, not_before: None }) => {
            world.check("D1", cause == Cause::Ready && attempt == now_attempt && consumed == 0, || {
                format!("task {i}: ready for {now_attempt} after pending {attempt} by {cause:?}")
            })?;
        }
        (St::Pending { attempt, .. }, St::Out { attempt: out_attempt, started: false, .. }) => {
            world.check("D1", cause == Cause::HandOut && attempt == out_attempt && consumed == 0, || {
                format!("task {i}: attempt {attempt} pending, then {out_attempt} handed out by {cause:?}")
            })?;
        }
        (_, St::Done(TerminalKind::Completed)) => {
            let completed = match task.terminal() {
                Some(Terminal::Completed { attempt }) => Some(*attempt),
                _ => None,
            };
            world.check("D1", cause == Cause::Completed && was.map(|o| o.0) == completed && consumed == 0, || {
                format!("task {i}: completed attempt {completed:?} by {cause:?}")
            })?;
        }
        (_, St::Done(TerminalKind::DeadLettered)) => {
            // D4: only a free return past the cap dead-letters.
            world.check("G10", cause == Cause::Free && consumed == 0, || {
                format!("task {i}: dead-lettered by {cause:?}, {consumed} retries consumed")
            })?;
            let letter = match task.terminal() {
                Some(Terminal::DeadLettered(letter)) => letter.redeliveries,
                _ => u32::MAX,
            };
            let max = policy.max_redeliveries();
            world.check("D4", letter == max && b.redeliveries == max, || {
                format!("task {i}: dead-lettered after {letter} of {max} free returns")
            })?;
        }
        (_, St::Done(kind)) => {
            // Retries ended: the attempt that was out consumed the last retry there was.
            world.check("G10", cause == Cause::Consumes && consumed == 1, || {
                format!("task {i}: retries ended ({kind:?}) by {cause:?}, {consumed} retries consumed")
            })?;
            if let Some(o) = was {
                m.retired.push(o.0);
            }
        }
        (_, St::Pending { attempt, not_before }) if was.is_some() => {
            let (old, worker, _, durable) = was.expect("out");
            match cause {
                Cause::Free => {
                    world.check(
                        "G10",
                        attempt == old && consumed == 0 && a.redeliveries == b.redeliveries + 1,
                        || {
                            format!(
                                "task {i}: a free return of attempt {old} left {attempt}, {consumed} retries consumed"
                            )
                        },
                    )?;
                    world.check("D3", a.checkpoint == b.checkpoint, || {
                        format!("task {i}: a free return lost its input")
                    })?;
                    m.may_run.retain(|r| *r != (old, worker));
                }
                Cause::Rollback => {
                    world.check("G10", attempt == old && consumed == 0 && !durable, || {
                        format!("task {i}: a rollback of attempt {old} left {attempt}, {consumed} retries consumed")
                    })?;
                    world.check("D6", policy.durability() == Durability::Async, || {
                        format!("task {i}: a rollback in Sync mode")
                    })?;
                    m.rolled_back.push(old);
                    // D6, D7: what the rolled-back attempt stored is lost with it.
                    m.checkpoint = m.snapshot;
                }
                _ => {
                    world.check("G10", cause == Cause::Consumes && attempt == old + 1 && consumed == 1, || {
                        format!(
                            "task {i}: attempt {old} ended by {cause:?}: next {attempt}, {consumed} retries consumed"
                        )
                    })?;
                    m.retired.push(old);
                    let limit = policy.retry().max_attempts().map_or(u64::MAX, u64::from);
                    world.check("G2", attempt <= limit, || {
                        format!("task {i}: attempt {attempt} over the limit {limit}")
                    })?;
                }
            }
            if let Some(t) = not_before {
                // G1: the retry delay is bounded by the schedule's cap, or by a hint.
                let cap = delay_bounds(policy.retry().backoff(), u32::MAX, u64::MAX).1;
                let most = world.now.saturating_add(Duration::from_nanos(cap.max(scenario.hint_ns)));
                world.check("G1", t <= most, || format!("task {i}: retry delay until {t:?} past {most:?}"))?;
            }
        }
        (St::Out { .. }, St::Out { .. }) => {
            let same = a.out().map(|o| (o.0, o.1)) == was.map(|o| (o.0, o.1));
            world.check("D1", cause == Cause::Progress && consumed == 0 && same, || {
                format!("task {i}: {:?} became {:?} by {cause:?}", b.state, a.state)
            })?;
        }
        (from, to) => return Err(world.violation("D1", format!("task {i}: {from:?} became {to:?} by {cause:?}"))),
    }
    world.check("D7", a.checkpoint == m.checkpoint, || {
        format!("task {i}: stores checkpoint {:?}, the model {:?}", a.checkpoint, m.checkpoint)
    })?;
    // D5, D6: a started attempt makes progress NotCompleted; Async always is (the terminal
    // state's progress is checked against every hand-out that reached a worker).
    if a.progress == AttemptProgress::NotStarted {
        let running = matches!(a.state, St::Out { started: true, .. });
        world.check("G10", !running && policy.durability() == Durability::Sync, || {
            format!("task {i}: progress NotStarted while {:?} in {:?} mode", a.state, policy.durability())
        })?;
    }
    Ok(())
}

/// B6 in the embedded retry: an accepted failure of task `i` with a `Retry-After` of `hint`
/// (`stats` were the task's statistics before it). Unless the limit ended retries first, a hint
/// past `max_hint`, or one that ends past the total budget, ends retries at once with
/// `Deferred` and the hinted instant; any other is waited exactly (never shortened): the
/// retry delay is the hint, counted into the time slept, and the next attempt is not handed
/// out before it ends.
fn check_hint(
    world: &mut World,
    scenario: &DeliveryScenario,
    m: &Model,
    i: usize,
    task: Option<&Task>,
    stats: Stats,
    hint: Duration,
) -> Result<(), Violation> {
    let Some(task) = task else { return Ok(()) };
    let retry = scenario.policy.retry();
    let hint_ns = hint.as_nanos() as u64;
    // The failure was accepted at the task's latest time: its first start plus the elapsed time.
    let at = |stats: Stats| m.inserted_at.saturating_add(stats.elapsed.unwrap_or_default());
    match task.status() {
        DeliveryStatus::Done(terminal) => {
            let Some(error) = terminal.recovery_error() else { return Ok(()) };
            let budget_end = retry.total().map_or(Instant::MAX, |t| m.inserted_at.saturating_add(t));
            let (retry_at, deferred) = crate::model::hint::hinted(at(error.stats), hint, retry.max_hint(), budget_end);
            let limited = retry.max_attempts().is_some_and(|n| error.stats.attempts >= u64::from(n));
            let expected = if limited {
                Some(OutcomeKind::Exhausted)
            } else if deferred {
                Some(OutcomeKind::Deferred)
            } else {
                // A hint within max_hint and the budget is waited, not the end.
                None
            };
            let ok = Some(error.ended) == expected
                && (expected != Some(OutcomeKind::Deferred) || error.retry_at == Some(retry_at));
            world.check("G1", ok, || {
                format!(
                    "task {i}: a hint of {hint:?} (max_hint {:?}, budget end {budget_end:?}) ended retries {:?} \
                     with retry_at {:?}; expected {expected:?} at {retry_at:?}",
                    retry.max_hint(),
                    error.ended,
                    error.retry_at
                )
            })
        }
        DeliveryStatus::Pending { not_before, .. } => {
            let after = task.stats();
            let slept = after.slept.saturating_sub(stats.slept);
            let until = at(after);
            let budget_end = retry.total().map_or(Instant::MAX, |t| m.inserted_at.saturating_add(t));
            let ok = slept == hint && *not_before == (hint_ns > 0).then_some(until);
            world.check("G1", ok && hint <= retry.max_hint() && until <= budget_end, || {
                format!(
                    "task {i}: a hint of {hint:?} (max_hint {:?}, budget end {budget_end:?}) was waited {slept:?}, \
                     not before {not_before:?}",
                    retry.max_hint()
                )
            })
        }
        other => Err(world.violation("D1", format!("task {i}: a failure left {other:?}"))),
    }
}

/// The terminal state agrees with the policy and what happened (D4, D8, G2, G4, G10, G13).
fn check_terminal(
    world: &mut World,
    scenario: &DeliveryScenario,
    m: &Model,
    i: usize,
    terminal: &Terminal<u32, u8>,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let progress = match terminal {
        Terminal::DeadLettered(letter) => Some(letter.progress),
        _ => terminal.recovery_error().map(|e| e.progress),
    };
    if progress == Some(AttemptProgress::NotStarted) {
        world.check("G10", !m.received, || format!("task {i}: NotStarted, but a worker received it"))?;
    }
    if let Some(error) = terminal.recovery_error() {
        let expected = match policy.on_failure() {
            FailurePolicy::Fail => TerminalKind::Failed,
            FailurePolicy::Proceed => TerminalKind::Proceeded,
            FailurePolicy::Divert(_) => TerminalKind::Diverted,
        };
        let route = match terminal {
            Terminal::Diverted { route, .. } => Some(*route),
            _ => None,
        };
        world.check("D8", terminal.kind() == expected && route.is_none_or(|r| r == 7), || {
            format!("task {i}: {:?} under {:?}", terminal.kind(), policy.on_failure())
        })?;
        let class = error.last_failure.class;
        let ok = match error.ended {
            OutcomeKind::Exhausted => {
                class.is_retryable() && Some(error.stats.attempts) == policy.retry().max_attempts().map(u64::from)
            }
            OutcomeKind::Fatal => !class.is_retryable(),
            OutcomeKind::Canceled => class == FailureClass::Canceled,
            OutcomeKind::OutOfTime => policy.retry().total().is_some(),
            // B6: only a hint (past max_hint or the budget; see `check_hint`) defers a task.
            OutcomeKind::Deferred => class == FailureClass::RetryAfter && error.retry_at.is_some(),
            _ => false,
        } && (error.retry_at.is_some() == (error.ended == OutcomeKind::Deferred));
        let rule = match error.ended {
            OutcomeKind::Exhausted => "G2",
            OutcomeKind::Deferred => "G1",
            _ => "G4",
        };
        world.check(rule, ok, || {
            format!("task {i}: retries ended {:?} after {class:?}, {:?}", error.ended, error.stats)
        })?;
    }
    // G13: once faults stop, a task finishes within a bound computed from its policy and
    // the workload.
    let (_, inserted) = scenario.tasks[i];
    let cap = delay_bounds(policy.retry().backoff(), u32::MAX, u64::MAX).1;
    let sleep = Duration::from_nanos(cap.max(scenario.hint_ns));
    let round = policy.start_timeout() * 2
        + policy.heartbeat_timeout() * 2
        + Duration::from_nanos(scenario.run_ns + scenario.poll_ns + scenario.restart_ns);
    let bound = scenario
        .horizon
        .later(inserted)
        .saturating_add(sleep)
        // Tasks queue for the workers: one round per task ahead, per worker, and a few more.
        .saturating_add(round.saturating_mul((scenario.tasks.len() + scenario.workers.len()) as u32 + 3));
    let now = world.now;
    world.check("G13", now <= bound, || format!("task {i}: finished at {now:?}, past its liveness bound {bound:?}"))
}

/// Feeds a wrong report and checks the table refuses it and nothing changes (G12).
fn misuse(
    world: &mut World,
    policy: &Policy,
    table: &mut Table,
    models: &[Model],
    now: Instant,
) -> Result<(), Violation> {
    let n = models.len() as u32;
    let before = table.clone();
    let task = world.between(0, u64::from(n) - 1) as u32;
    let current = table.get(&task).map(|d| (d.attempt(), Fp::of(d).out()));
    // The table drains every task into its own queue, so it never refuses as undrained: each
    // refusal names the mistake.
    let refused = match (world.between(0, 3), current) {
        (0, Some((_, Some((attempt, worker, _, _))))) => {
            // The right attempt from the wrong worker.
            table.handle_completed(policy, now, &task, attempt, &worker.wrapping_add(1))
                == Err(DeliveryError::WrongWorker { attempt })
        }
        (1, Some((attempt, _))) => {
            // An attempt that is not out.
            let r = world.rng();
            let failure = Failure::retryable(0);
            table.handle_failed(policy, now, &task, attempt + 1, &0, failure, r).is_err_and(|r| {
                r.input == failure && matches!(r.error, DeliveryError::StaleAttempt { .. } | DeliveryError::Finished(_))
            })
        }
        (2, Some((_, Some((attempt, worker, true, _))))) => {
            // A free return of a started attempt.
            table.handle_returned(policy, now, &task, attempt, &worker, FreeReturn::Declined)
                == Err(DeliveryError::AlreadyStarted { attempt })
        }
        _ => table.handle_started(policy, now, &(n + 1), 1, &0) == Err(DeliveryError::UnknownTask),
    };
    world.record(task, "misuse fed", 0, 0);
    world.check("G12", refused, || format!("task {task}: a wrong report was accepted"))?;
    world.check("G12", *table == before, || format!("task {task}: a refused report changed the table"))
}

#[cfg(test)]
mod tests {
    use super::{DeliveryBug, run};

    #[test]
    fn b6_an_injected_shortened_worker_hint_is_caught_as_g1() {
        // B6 in the embedded retry: a hint past `max_hint` ends retries `Deferred` with the
        // hinted instant; shortened to `max_hint` (the rule before issue 12) the task would wait.
        let violation = (0..5_000)
            .find_map(|seed| run(seed, Some(DeliveryBug::ClampHint)).err())
            .unwrap_or_else(|| panic!("ClampHint was never caught"));
        assert_eq!(violation.rule, "G1", "{violation}");
    }
}
