//! Delivery scenarios: one real [`persevere::Deliveries`] table whose tasks are handed to
//! several simulated workers that start, heartbeat (with checkpoints), complete, fail, crash,
//! disconnect, decline, close cleanly before starting, go silent, or never get the hand-out
//! (a failed send), while the server fails over and, in `Async` mode, start writes are lost and
//! roll back. Every task is held to the delivery model the fuzz target shares
//! (`model::delivery`: every input it accepts, every action, its state after every
//! step), and to the guarantees checked as the steps come (G1, G2, G10–G13).

use std::time::Duration;

use std::collections::VecDeque;

use persevere::{
    AttemptProgress, Deliveries, Delivery, DeliveryAction, DeliveryError, DeliveryPolicy, DeliveryStatus, Durability,
    Failure, FailureClass, FailureKind, FailurePolicy, FreeReturn, Hint, IdempotencyKey, Instant, Interruption,
    OutcomeKind, RetryPolicy, Terminal, TerminalKind,
};

use crate::model::delivery::{DeliveryModel, waits};
use crate::world::{Summary, Violation, World, clamp_hint, delay_bounds, draw_backoff};

/// Task ids, task types, worker ids, checkpoints, errors and recovery routes.
type Table = Deliveries<u32, u8, u16, u32, u32, u8>;
type Task = Delivery<u32, u16, u32, u32, u8>;
type Policy = DeliveryPolicy<u8>;
type Act = DeliveryAction<u32, u16, u32, u32, u8>;

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
    /// The task types it told the table it declines (D3: the table avoids it for them).
    declined_told: u8,
    job: Option<Job>,
    /// When an idle worker next asks for work, or a crashed one is back.
    at: Instant,
}

/// What the simulator knows about one task: its model, and what the guarantees remember.
#[derive(Clone, Debug, Default)]
struct Track {
    /// What the task must be (from its insert on).
    model: Option<DeliveryModel<u32, u16, u32, u32, u8>>,
    /// The actions the model expects of the task this step, and those the table emitted.
    expected: VecDeque<Act>,
    got: VecDeque<Act>,
    inserted: bool,
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
    /// The latest failure reported with a `Retry-After` hint: when it was fed, and the hint.
    hinted: Option<(Instant, Duration)>,
}

impl Track {
    /// The model of a task the table holds (so inserted).
    fn model(&mut self) -> &mut DeliveryModel<u32, u16, u32, u32, u8> {
        self.model.as_mut().expect("a task in the table has a model")
    }

    /// Feeds the model the input the table answered with `got`: both must answer alike. The
    /// actions the model expects then are queued, to be compared with the table's.
    fn fed(
        &mut self,
        world: &World,
        i: usize,
        what: &str,
        got: Result<(), DeliveryError>,
        answer: Result<(), DeliveryError>,
    ) -> Result<(), Violation> {
        if got != answer {
            return Err(
                world.violation("model", format!("task {i}: {what} was answered {got:?}, the model {answer:?}"))
            );
        }
        let actions = self.model().drain();
        self.expected.extend(actions);
        Ok(())
    }
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
    let mut tracks: Vec<Track> = vec![Track::default(); n];
    let mut workers: Vec<Worker> = scenario
        .workers
        .iter()
        .map(|&declines| Worker {
            declines,
            declined_told: 0,
            job: None,
            at: Instant::from_nanos(world.between(0, scenario.poll_ns)),
        })
        .collect();
    let mut before: Vec<Option<Fp>> = vec![None; n];
    let mut causes: Vec<Cause> = vec![Cause::None; n];

    for _ in 0..300_000u32 {
        // The next thing due: an insert, a worker's report or poll, the table's timeout.
        let mut next: Option<(Instant, usize)> = None;
        const TIMEOUT: usize = usize::MAX;
        const INSERT: usize = 1 << 20;
        for (i, (_, at)) in scenario.tasks.iter().enumerate() {
            if !tracks[i].inserted && next.is_none_or(|(best, _)| *at < best) {
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
        if tracks.iter().all(|m| m.inserted && m.terminal.is_some()) {
            // The end: every task reached exactly one terminal state (G11, D9).
            for (i, m) in tracks.iter().enumerate() {
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
            misuse(&mut world, policy, &mut table, &tracks, reported)?;
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
            for (id, _, task) in table.iter() {
                let m = &mut tracks[*id as usize];
                m.model().timeout(policy, reported, waits(task));
                m.fed(&world, *id as usize, "a timeout", Ok(()), Ok(()))?;
            }
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
            let m = &mut tracks[i];
            m.inserted = true;
            m.model = Some(DeliveryModel::new(
                policy,
                reported,
                IdempotencyKey { task: i as u32, step_execution: 1_000 + i as u64 },
            ));
            m.fed(&world, i, "the insert", Ok(()), Ok(()))?;
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
                    for (id, _, task) in table.iter() {
                        let m = &mut tracks[*id as usize];
                        let answer = m.model().failover(policy, reported, waits(task));
                        m.fed(&world, *id as usize, "a failover", Ok(()), answer)?;
                    }
                } else {
                    // The ready task with the lowest id whose type this worker has not declined.
                    let chosen = table.hand_out_next(policy, reported, &(w as u16));
                    let expected = tracks.iter().enumerate().position(|(i, m)| {
                        workers[w].declined_told & (1 << scenario.tasks[i].0) == 0
                            && m.model.as_ref().is_some_and(|m| m.check_hand_out(reported, w as u16).is_ok())
                    });
                    world.check("D1", chosen.map(|id| id as usize) == expected, || {
                        format!("worker {w} was handed task {chosen:?}, the model hands it {expected:?}")
                    })?;
                    if let Some(id) = chosen {
                        world.record(id, "hand out to", w as u64, 0);
                        causes[id as usize] = Cause::HandOut;
                        let m = &mut tracks[id as usize];
                        let answer = m.model().hand_out(policy, reported, w as u16);
                        m.fed(&world, id as usize, "a hand-out", Ok(()), answer)?;
                    }
                }
            } else {
                report(
                    &mut world,
                    &scenario,
                    bug,
                    &mut table,
                    &mut workers,
                    &mut tracks,
                    &before,
                    &mut causes,
                    w,
                    reported,
                )?;
            }
        }
        drain(&mut world, &scenario, bug, &mut table, &mut workers, &mut tracks, reported)?;
        let mut seen = 0;
        for (id, _, task) in table.iter() {
            let i = *id as usize;
            seen += usize::from(before[i].is_some());
            let m = &mut tracks[i];
            check_task(&mut world, &scenario, task, m, i, before[i], causes[i])?;
            // The model: every action of this step, then the state.
            world.check("model", m.got == m.expected, || {
                format!("task {i}: actions {:?}, the model expects {:?}", m.got, m.expected)
            })?;
            m.got.clear();
            m.expected.clear();
            if let Some(model) = &m.model {
                model.check(&mut world, task, (0..workers.len() as u16).chain([u16::MAX]))?;
            }
        }
        let held = before.iter().filter(|b| b.is_some()).count();
        world.check("G11", seen == held, || format!("{} tasks were lost from the table", held - seen))?;
        let counts = table.counts();
        let done = tracks.iter().filter(|m| m.terminal == Some(TerminalKind::Completed)).count();
        let inserted = tracks.iter().filter(|m| m.inserted).count();
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
    tracks: &mut [Track],
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
    let model = tracks[i].model();
    // What the table answered, what the model answers, whether the attempt is out to this
    // worker as the report needs (G12), and what the report does.
    let (got, answer, expected, cause) = match what {
        Report::Persisted => {
            let got = table.handle_persisted(now, &task, attempt);
            (got, model.persisted(now, attempt), b.out().is_some_and(|o| o.0 == attempt), Cause::Progress)
        }
        Report::Started => {
            let got = table.handle_started(policy, now, &task, attempt, &worker);
            (got, model.started(policy, now, attempt, worker), holds.is_some_and(|o| !o.2), Cause::Progress)
        }
        Report::Heartbeat(checkpoint) => {
            let got =
                table.handle_heartbeat(policy, now, &task, attempt, &worker, Some(checkpoint)).map_err(|r| r.error);
            let answer = model.heartbeat(policy, now, attempt, worker, Some(checkpoint));
            (got, answer, holds.is_some(), Cause::Progress)
        }
        Report::Completed => {
            let got = table.handle_success(now, &task, attempt, &worker);
            (got, model.completed(now, attempt, worker), holds.is_some(), Cause::Completed)
        }
        Report::Failed(kind) => {
            let fed = match bug {
                Some(DeliveryBug::ClampHint) => clamp_hint(kind, now, policy.retry().max_hint()),
                _ => kind,
            };
            let slept = table.get(&task).map(|t| t.stats().slept);
            let got = table.handle_failure(
                policy,
                now,
                &task,
                attempt,
                &worker,
                Failure::new(fed, attempt as u32),
                world.rng(),
            );
            let after = table.get(&task);
            let failure = Failure::new(kind, attempt as u32);
            let answer = model.failed(policy, now, attempt, worker, failure, after.and_then(waits));
            if let (Ok(()), FailureKind::Hinted(Hint::After(hint)), Some(slept), Some(after)) =
                (got, kind, slept, after)
                && let DeliveryStatus::Pending { .. } = after.status()
            {
                // G1: a hint that is waited is waited in full, never shortened.
                let waited = after.stats().slept.saturating_sub(slept);
                world.check("G1", waited >= hint, || format!("task {i}: a hint of {hint:?} was waited {waited:?}"))?;
            }
            if got.is_ok() {
                tracks[i].hinted = match kind {
                    FailureKind::Hinted(Hint::After(hint)) => Some((now, hint)),
                    _ => None,
                };
            }
            (got.map_err(|r| r.error), answer, holds.is_some(), Cause::Consumes)
        }
        Report::Returned(reason) => {
            let got = if reason == FreeReturn::Declined && bug == Some(DeliveryBug::DeclineAsDisconnect) {
                let r = world.rng();
                table.handle_interrupted(policy, now, &task, attempt, &worker, Interruption::Disconnected, r)
            } else {
                table.handle_returned(policy, now, &task, attempt, &worker, reason)
            };
            let answer = model.returned(policy, now, attempt, worker, reason);
            (got, answer, holds.is_some_and(|o| !o.2), Cause::Free)
        }
        Report::Disconnected => {
            let reason = Interruption::Disconnected;
            let got = table.handle_interrupted(policy, now, &task, attempt, &worker, reason, world.rng());
            let observed = table.get(&task).and_then(waits);
            let answer = model.interrupted(policy, now, attempt, worker, reason, observed);
            (got, answer, holds.is_some(), Cause::Consumes)
        }
        Report::Crashed => {
            // Every attempt this worker holds is interrupted.
            let mut held = Vec::new();
            for (j, b) in before.iter().enumerate() {
                if let Some(out) = b.and_then(|b| b.out()).filter(|o| o.1 == worker) {
                    causes[j] = Cause::Consumes;
                    held.push((j, out.0));
                }
            }
            let reason = Interruption::WorkerCrashed;
            let lost = table.handle_worker_lost(policy, now, &worker, reason, world.rng());
            workers[w].at = at.saturating_add(Duration::from_nanos(world.between(1, scenario.restart_ns.max(1))));
            world.record(u32::MAX, "worker crashed", w as u64, lost as u64);
            world.check("D2", lost == held.len(), || {
                format!("worker {w} crashed holding {} attempts; {lost} were interrupted", held.len())
            })?;
            for (j, attempt) in held {
                let observed = table.get(&(j as u32)).and_then(waits);
                let m = &mut tracks[j];
                let answer = m.model().interrupted(policy, now, attempt, worker, reason, observed);
                m.fed(world, j, "a crash", Ok(()), answer)?;
            }
            return Ok(());
        }
    };
    let accepted = got.is_ok();
    world.record(task, if accepted { "report accepted" } else { "report refused" }, attempt, 0);
    world.check("G12", accepted == expected, || {
        format!(
            "task {i}: {what:?} for attempt {attempt} from worker {w} was {}",
            if accepted { "accepted" } else { "refused" }
        )
    })?;
    if accepted {
        causes[i] = cause;
        if what == Report::Returned(FreeReturn::Declined) {
            workers[w].declined_told |= 1 << scenario.tasks[i].0;
        }
        if cause != Cause::Progress {
            // The attempt is over for this worker.
            workers[w].job = None;
        }
    } else {
        let after = table.get(&task).map(Fp::of);
        world.check("G12", after == Some(b), || format!("task {i}: a refused report changed it"))?;
    }
    tracks[i].fed(world, i, &format!("{what:?}"), got, answer)
}

/// Drains the table's actions: hand-outs go to their workers (G10), revokes free them,
/// and each task finishes exactly once (G11).
fn drain(
    world: &mut World,
    scenario: &DeliveryScenario,
    bug: Option<DeliveryBug>,
    table: &mut Table,
    workers: &mut [Worker],
    tracks: &mut [Track],
    now: Instant,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    // One queue for every task, in the order the actions were made: a task's `Finish` is its
    // last action (D9).
    while let Some((task, action)) = table.poll_action() {
        world.steps += 1;
        let i = task as usize;
        let finished = tracks[i].terminal;
        world.check("D9", finished.is_none() || matches!(action, DeliveryAction::Finish(_)), || {
            format!("task {i}: {action:?} after it finished ({finished:?})")
        })?;
        tracks[i].got.push_back(action);
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
                let m = &mut tracks[i];
                receive(world, scenario, m, i, h.attempt, h.worker)?;
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
                let m = &mut tracks[i];
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
    m: &mut Track,
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

/// The guarantees of one step for one task, from before and after it (G1, G2, G10, G11): what
/// a step may consume, given what the family fed (`cause`). The model decides the rest.
#[allow(clippy::too_many_arguments)]
fn check_task(
    world: &mut World,
    scenario: &DeliveryScenario,
    task: &Task,
    m: &mut Track,
    i: usize,
    before: Option<Fp>,
    cause: Cause,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let Some(b) = before else { return Ok(()) };
    let a = Fp::of(task);
    if b == a {
        return Ok(());
    }
    let consumed = a.retries_used.wrapping_sub(b.retries_used);
    let was = b.out();
    match (b.state, a.state) {
        (St::Done(_), _) => {
            return Err(world.violation("G11", format!("task {i}: a terminal state changed to {:?}", task.status())));
        }
        (_, St::Done(TerminalKind::DeadLettered)) => {
            // Only a free return past the cap dead-letters, and it consumes no retry.
            world.check("G10", cause == Cause::Free && consumed == 0, || {
                format!("task {i}: dead-lettered by {cause:?}, {consumed} retries consumed")
            })?;
        }
        (_, St::Done(TerminalKind::Completed)) => {}
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
                    world.check("G10", attempt == old && consumed == 0, || {
                        format!("task {i}: a free return of attempt {old} left {attempt}, {consumed} retries consumed")
                    })?;
                    m.may_run.retain(|r| *r != (old, worker));
                }
                Cause::Rollback => {
                    world.check("G10", attempt == old && consumed == 0 && !durable, || {
                        format!("task {i}: a rollback of attempt {old} left {attempt}, {consumed} retries consumed")
                    })?;
                    m.rolled_back.push(old);
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
        _ => {}
    }
    // A started attempt makes progress NotCompleted; Async always is (the terminal state's
    // progress is checked against every hand-out that reached a worker).
    if a.progress == AttemptProgress::NotStarted {
        let running = matches!(a.state, St::Out { started: true, .. });
        world.check("G10", !running && policy.durability() == Durability::Sync, || {
            format!("task {i}: progress NotStarted while {:?} in {:?} mode", a.state, policy.durability())
        })?;
    }
    Ok(())
}

/// The guarantees of a terminal state (G1, G2, G4, G10, G13); the model decides which one it is.
fn check_terminal(
    world: &mut World,
    scenario: &DeliveryScenario,
    m: &Track,
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
        // How retries ended fits the last failure and the policy: a limit used exactly (G2), a
        // class that ends retries (G4), a hint deferred to no earlier than it asked (G1).
        let class = error.last_failure.class;
        let retry = policy.retry();
        let hinted = m.hinted.filter(|_| class == FailureClass::RetryAfter);
        let ok = match error.ended {
            OutcomeKind::Exhausted => {
                class.is_retryable() && Some(error.stats.attempts) == retry.max_attempts().map(u64::from)
            }
            OutcomeKind::Fatal => !class.is_retryable(),
            OutcomeKind::Canceled => class == FailureClass::Canceled,
            OutcomeKind::OutOfTime => retry.total().is_some(),
            OutcomeKind::Deferred => {
                hinted.zip(error.retry_at).is_some_and(|((at, hint), retry_at)| retry_at >= at.saturating_add(hint))
            }
            _ => false,
        } && (error.retry_at.is_some() == (error.ended == OutcomeKind::Deferred));
        let rule = match error.ended {
            OutcomeKind::Exhausted => "G2",
            OutcomeKind::Deferred => "G1",
            _ => "G4",
        };
        world.check(rule, ok, || {
            format!(
                "task {i}: retries ended {:?} after {class:?} (hint {hinted:?}), retry_at {:?}, {:?}",
                error.ended, error.retry_at, error.stats
            )
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
    tracks: &[Track],
    now: Instant,
) -> Result<(), Violation> {
    let n = tracks.len() as u32;
    let before = table.clone();
    let task = world.between(0, u64::from(n) - 1) as u32;
    let current = table.get(&task).map(|d| (d.attempt(), Fp::of(d).out()));
    // The model answers each wrong report too (on a copy: a refusal changes nothing). The table
    // drains every task into its own queue, so it never refuses as undrained.
    let mut model = tracks[task as usize].model.clone();
    let (got, answer) = match (world.between(0, 3), current, model.as_mut()) {
        (0, Some((_, Some((attempt, worker, _, _)))), Some(model)) => {
            // The right attempt from the wrong worker.
            let wrong = worker.wrapping_add(1);
            (table.handle_success(now, &task, attempt, &wrong), model.completed(now, attempt, wrong))
        }
        (1, Some((attempt, _)), Some(model)) => {
            // An attempt that is not out.
            let r = world.rng();
            let failure = Failure::retryable(0);
            let got = table.handle_failure(policy, now, &task, attempt + 1, &0, failure, r);
            world.check("G12", got.as_ref().is_err_and(|r| r.input == failure), || {
                format!("task {task}: a wrong failure was not handed back: {got:?}")
            })?;
            (got.map_err(|r| r.error), model.failed(policy, now, attempt + 1, 0, failure, None))
        }
        (2, Some((_, Some((attempt, worker, true, _)))), Some(model)) => {
            // A free return of a started attempt.
            let reason = FreeReturn::Declined;
            let got = table.handle_returned(policy, now, &task, attempt, &worker, reason);
            (got, model.returned(policy, now, attempt, worker, reason))
        }
        _ => (table.handle_started(policy, now, &(n + 1), 1, &0), Err(DeliveryError::UnknownTask)),
    };
    let refused = got.is_err();
    world.record(task, "misuse fed", 0, 0);
    world.check("G12", refused, || format!("task {task}: a wrong report was accepted"))?;
    world.check("model", got == answer, || {
        format!("task {task}: a wrong report was answered {got:?}, the model {answer:?}")
    })?;
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
