//! Flow scenarios: many recurring flows in one real [`persevere::Flows`] registry, on `every`
//! and cron schedules (cron as "a tick is due at t", the ticks drawn by the simulator), with
//! run outcomes drawn with faults (failures of every class: transient, timeouts, panics,
//! fatal, canceled, `Retry-After` hints within and past `max_hint`, do-not-retry), and
//! operator triggers, resets and clean cancels at random, checked against a reference model
//! after every input (G1, G3–G6, G11–G13, F3–F10).

use std::time::Duration;

use persevere::{
    Failure, FailureKind, FlowAction, FlowError, FlowPolicy, FlowStatus, FlowStatusKind, Flows, Hint, Instant,
    SkipReason, TripReason,
};

use crate::model::backoff::{Place, delay_bounds};
use crate::model::flow::FlowModel;
use crate::world::{Summary, Violation, World, clamp_hint, draw_backoff, draw_failure, draw_fault_weights};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowBug {
    /// A registry that forgets the trip when a tripped flow is triggered, and dispatches it.
    DispatchWhileTripped,
    /// A driver that replays a skipped cron tick once the backoff window has ended.
    ReplaySkippedTick,
    /// A driver that reports a fatal run failure as a transient one (the flow backs off and
    /// runs again instead of tripping).
    RetryFatal,
    /// A driver that shortens a hint to `max_hint` before feeding it (the rule before issue 12;
    /// B6 and F3 now trip the flow with the hinted instant instead).
    ClampHint,
}

/// One flow of a scenario.
#[derive(Clone, Copy, Debug)]
pub struct FlowSpec {
    /// `Some(interval)` for an every-flow, `None` for a cron flow.
    pub every: Option<Duration>,
    /// A cron flow's tick period.
    pub period: Duration,
    /// When the flow is created (an every-flow is first dispatched then).
    pub created: Instant,
}

/// The drawn configuration of one flow scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct FlowScenario {
    /// The policy every flow shares.
    pub policy: FlowPolicy,
    /// The flows, keyed by their index.
    pub flows: Vec<FlowSpec>,
    /// Per-mille chance that a run fails (before the fault horizon).
    pub failure_rate: u64,
    /// Relative weights of each failure class of a failed run, for [`draw_failure`].
    pub fault_weights: crate::world::FaultWeights,
    /// Longest `Retry-After` hint a failed run carries, in nanoseconds.
    pub hint_ns: u64,
    /// Per-mille chance that a run is canceled cleanly (before the fault horizon).
    pub cancel_rate: u64,
    /// Per-mille chance that an operator action is a trigger (else a reset).
    pub trigger_share: u64,
    /// Longest pause between two operator actions, in nanoseconds.
    pub operator_gap_ns: u64,
    /// Per-mille chance that a step reports a stale clock.
    pub stall_rate: u64,
    /// Per-mille chance that a step first feeds a wrong input (G12).
    pub misuse_rate: u64,
    /// Longest run, in nanoseconds.
    pub run_ns: u64,
    /// After this instant every run succeeds.
    pub horizon: Instant,
    /// No dispatch, tick or operator action from this instant on; runs in flight finish.
    pub end: Instant,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl FlowScenario {
    /// Draws a scenario from the world's RNG.
    pub fn draw(world: &mut World) -> Self {
        let mut builder = FlowPolicy::builder();
        if world.chance(800) {
            builder = builder.backoff(draw_backoff(world, 200, 3_000));
        }
        if world.chance(700) {
            builder = builder.with_trip(world.between(1, 5) as u32);
        }
        if world.chance(500) {
            // B6: hints past it trip the flow (`TripReason::Deferred`).
            builder = builder.max_hint(ms(world.between(1, 3_000)));
        }
        builder = builder.restart_after_hint(world.chance(400));
        let policy = builder.build().expect("drawn flow policies are valid");
        let count = world.between(1, 12);
        let cron_share = world.between(0, 1000);
        let flows = (0..count)
            .map(|_| {
                let cron = world.chance(cron_share);
                FlowSpec {
                    every: (!cron).then(|| ms(world.between(20, 3_000))),
                    period: ms(world.between(20, 2_000)),
                    created: Instant::from_millis(world.between(0, 1_000)),
                }
            })
            .collect();
        let horizon = Instant::from_millis(world.between(0, 10_000));
        FlowScenario {
            policy,
            flows,
            failure_rate: world.between(0, 1000),
            fault_weights: draw_fault_weights(world),
            hint_ns: ms(world.between(0, 4_000)).as_nanos() as u64,
            cancel_rate: world.between(0, 100),
            trigger_share: world.between(0, 1000),
            operator_gap_ns: ms(world.between(50, 5_000)).as_nanos() as u64,
            stall_rate: world.between(0, 100),
            misuse_rate: world.between(0, 100),
            run_ns: ms(world.between(0, 800)).as_nanos() as u64,
            horizon,
            end: horizon.saturating_add(ms(world.between(0, 6_000))),
        }
    }
}

/// One flow: where the scenario stands with it, and the reference model of the flow.
#[derive(Clone, Debug)]
struct Model {
    spec: FlowSpec,
    /// Runs dispatched, as seen (G11).
    runs: u64,
    /// Reports accepted (one per run, G11).
    outcomes: u64,
    /// The run in flight and when it ends.
    running: Option<(u64, Instant)>,
    /// The schedule's place and previous delay before the last failure, which bound the
    /// window a failure then opens (G1).
    schedule: Place,
    /// The latest cron tick fed, and the next one due.
    last_tick: Option<Instant>,
    next_tick: Instant,
    /// A skipped tick a buggy driver replays at this instant.
    replay: Option<(Instant, Instant)>,
    /// The reference model: what the flow must show and tell after every input.
    flow: FlowModel<u32>,
}

impl Model {
    fn new(spec: FlowSpec) -> Self {
        Model {
            spec,
            runs: 0,
            outcomes: 0,
            running: None,
            schedule: Place::default(),
            last_tick: None,
            next_tick: spec.created.saturating_add(spec.period),
            replay: None,
            flow: FlowModel::new(spec.created, spec.every),
        }
    }

    /// The action the model made for the input just fed (taken: the registry hands each
    /// action over at once).
    fn made(&mut self) -> Option<FlowAction> {
        self.flow.pending.take()
    }
}

/// What the step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Timeout,
    Tick(usize),
    Replay(usize),
    RunEnds(usize),
    Operator,
}

/// Runs the flow scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<FlowBug>) -> Result<Summary, Violation> {
    let mut world = World::new("flow", seed);
    let scenario = FlowScenario::draw(&mut world);
    let policy = &scenario.policy;
    let n = scenario.flows.len();
    let mut flows: Flows<u32, u32> = Flows::new();
    let mut models: Vec<Model> = scenario.flows.iter().map(|s| Model::new(*s)).collect();
    for (i, spec) in scenario.flows.iter().enumerate() {
        let flow = match spec.every {
            Some(interval) => persevere::Flow::every(spec.created, interval),
            None => persevere::Flow::cron(spec.created),
        };
        flows.insert(i as u32, flow).map_err(|_| world.violation("G12", format!("flow {i}: insert refused")))?;
    }
    let mut registry_now = Instant::ZERO;
    let mut operator_at = Instant::from_nanos(world.between(0, scenario.operator_gap_ns));

    for _ in 0..200_000u32 {
        let open = |t: Instant| t < scenario.end;
        let mut next: Option<(Instant, Step)> = None;
        let mut consider = |t: Instant, step: Step| {
            if next.is_none_or(|(best, _)| t < best) {
                next = Some((t, step));
            }
        };
        if let Some(t) = flows.poll_timeout().filter(|t| open(*t)) {
            consider(t, Step::Timeout);
        }
        for (i, m) in models.iter().enumerate() {
            if let Some((_, end)) = m.running {
                consider(end, Step::RunEnds(i));
            }
            if m.spec.every.is_none() && open(m.next_tick) {
                consider(m.next_tick, Step::Tick(i));
            }
            if let Some((at, _)) = m.replay.filter(|(at, _)| open(*at)) {
                consider(at, Step::Replay(i));
            }
        }
        if open(operator_at) {
            consider(operator_at, Step::Operator);
        }
        let Some((due, step)) = next else {
            // The end: every run dispatched was reported exactly once (G11).
            for (i, m) in models.iter().enumerate() {
                world.check("G11", m.outcomes == m.runs && m.running.is_none(), || {
                    format!("flow {i}: {} runs, {} outcomes", m.runs, m.outcomes)
                })?;
            }
            return Ok(world.summary());
        };
        let reported = world.step_to(due, scenario.stall_rate, Instant::MAX);
        if world.chance(scenario.misuse_rate) {
            misuse(&mut world, policy, &mut flows, &models, reported)?;
        }
        match step {
            Step::Timeout => {
                registry_now = registry_now.later(reported);
                world.record(u32::MAX, "registry timeout", registry_now.as_nanos(), 0);
                let dues: Vec<Option<Instant>> = models.iter().map(|m| m.flow.due()).collect();
                let was: Vec<FlowStatusKind> = models.iter().map(|m| m.flow.kind()).collect();
                flows.handle_timeout(reported);
                // The registry hands the timeout to each flow due by its own clock.
                for m in models.iter_mut().filter(|m| m.flow.due().is_some_and(|d| d <= registry_now)) {
                    m.flow.timeout(registry_now);
                }
                while let Some((id, action)) = flows.poll_action() {
                    world.steps += 1;
                    let i = id as usize;
                    let FlowAction::Dispatch { run } = action else {
                        return Err(world.violation("F6", format!("flow {i}: {action:?} from a timeout")));
                    };
                    let m = &mut models[i];
                    world.record(id, "dispatch (due)", run, 0);
                    world.check("G6", m.spec.every.is_some(), || format!("cron flow {i} dispatched by time"))?;
                    let due = dues[i];
                    world.check("G6", due.is_some_and(|d| d <= registry_now), || {
                        format!("flow {i} dispatched at {registry_now:?}, due {due:?}")
                    })?;
                    let now = m.flow.last_now;
                    dispatched(&mut world, &scenario, i, m, run, now, was[i])?;
                    let made = m.made();
                    world.check("model", made == Some(action), || {
                        format!("flow {i}: dispatched {action:?}, the model makes {made:?}")
                    })?;
                }
                // G13: nothing due is left undispatched.
                for (i, m) in models.iter_mut().enumerate() {
                    let made = m.made();
                    world.check("G13", made.is_none(), || {
                        format!("flow {i} due at {:?} was not dispatched at {registry_now:?}", dues[i])
                    })?;
                }
            }
            Step::Tick(i) | Step::Replay(i) => {
                let m = &mut models[i];
                let tick = if step == Step::Tick(i) {
                    let tick = m.next_tick;
                    m.next_tick = tick.saturating_add(m.spec.period);
                    tick
                } else {
                    m.replay.take().map_or(m.next_tick, |(_, tick)| tick)
                };
                world.record(i as u32, "tick due", tick.as_nanos(), 0);
                world.check("G6", m.last_tick.is_none_or(|last| tick > last), || {
                    format!("flow {i}: tick {tick:?} replayed after {:?}", m.last_tick)
                })?;
                m.last_tick = Some(tick);
                let was = m.flow.kind();
                let action = flows
                    .handle_tick(reported, &(i as u32), tick)
                    .map_err(|e| world.violation("G12", format!("flow {i}: tick refused: {e}")))?;
                let answer = m.flow.tick(reported, tick);
                world.accepted("a flow's input", answer)?;
                let expected = m.made();
                let rule = match expected {
                    Some(FlowAction::TickSkipped { reason: SkipReason::Tripped, .. }) => "G5",
                    Some(FlowAction::TickSkipped { reason: SkipReason::InBackoff { .. }, .. }) => "G6",
                    _ => "F6",
                };
                world.check(rule, expected == Some(action), || {
                    format!("flow {i}: tick {tick:?} gave {action:?}, the model makes {expected:?}")
                })?;
                match action {
                    FlowAction::TickSkipped { reason, .. } => {
                        world.record(i as u32, "tick skipped", tick.as_nanos(), 0);
                        if let (SkipReason::InBackoff { until }, Some(FlowBug::ReplaySkippedTick)) = (reason, bug) {
                            m.replay = Some((until, tick));
                        }
                    }
                    FlowAction::Dispatch { run } => {
                        world.record(i as u32, "dispatch (tick)", run, tick.as_nanos());
                        let now = m.flow.last_now;
                        dispatched(&mut world, &scenario, i, m, run, now, was)?;
                    }
                    _ => {}
                }
            }
            Step::RunEnds(i) => {
                let m = &mut models[i];
                let Some((run, _)) = m.running.take() else { unreachable!("a run end is due only while running") };
                let id = i as u32;
                let now = m.flow.last_now.later(reported);
                m.outcomes += 1;
                let faulty = world.now < scenario.horizon;
                let made = if faulty && world.chance(scenario.cancel_rate) {
                    world.record(id, "run canceled", run, 0);
                    flows.handle_cancel(reported, &id).map_err(|e| world.violation("G12", format!("{e}")))?;
                    // F4: idle, the streak and the window unchanged.
                    let answer = m.flow.cancel(reported);
                    world.accepted("a flow's input", answer)?;
                    None
                } else if faulty && world.chance(scenario.failure_rate) {
                    let (kind, hinted) = draw_failure(&mut world, &scenario.fault_weights, scenario.hint_ns, now);
                    world.record(id, "run fails", run, kind.class() as u64);
                    let error = run as u32;
                    let fed = match (bug, kind) {
                        (Some(FlowBug::RetryFatal), FailureKind::Fatal) => FailureKind::Retryable,
                        (Some(FlowBug::ClampHint), kind) => clamp_hint(kind, now, policy.max_hint()),
                        _ => kind,
                    };
                    m.schedule = m.flow.schedule;
                    let made = flows
                        .handle_failure(policy, reported, &id, Failure::new(fed, error), world.rng())
                        .map_err(|r| world.violation("G12", format!("flow {i}: a failure refused: {}", r.error)))?;
                    let status = flows.info(&id).map(|info| info.status.cloned());
                    failed(&mut world, policy, i, m, (kind, hinted), now, status)?;
                    // The model is told what was drawn, not what the driver fed.
                    let window = match status {
                        Some(FlowStatus::Backoff { until, .. }) => Some(until),
                        _ => None,
                    };
                    let answer = m.flow.failure(policy, reported, Failure::new(kind, error), window);
                    world.accepted("a flow's input", answer)?;
                    made
                } else {
                    world.record(id, "run succeeds", run, 0);
                    flows.handle_success(reported, &id).map_err(|e| world.violation("G12", format!("{e}")))?;
                    let answer = m.flow.success(reported);
                    world.accepted("a flow's input", answer)?;
                    None
                };
                // O1: a trip is told, with the streak, and nothing else is.
                let expected = m.made();
                world.check("O1", made == expected, || {
                    format!("flow {i}: the run's end made {made:?}, the model makes {expected:?}")
                })?;
                if world.now >= scenario.horizon
                    && let Some(due) = m.flow.due()
                {
                    // G13: past the horizon an every-flow comes round within its bound.
                    let cap = delay_bounds(policy.backoff(), u32::MAX, u64::MAX).1;
                    let bound = now.saturating_add(m.spec.every.unwrap_or_default().max(Duration::from_nanos(cap)));
                    world.check("G13", due <= bound, || format!("flow {i}: next due {due:?} past {bound:?}"))?;
                }
            }
            Step::Operator => {
                operator_at =
                    world.now.saturating_add(Duration::from_nanos(world.between(1, scenario.operator_gap_ns)));
                let i = world.between(0, n as u64 - 1) as usize;
                let id = i as u32;
                let m = &mut models[i];
                let was = m.flow.kind();
                if world.chance(scenario.trigger_share) {
                    world.record(id, "operator triggers", m.flow.streak.into(), 0);
                    let before = flows.clone();
                    let result = flows.trigger(reported, &id);
                    let result = match (result, bug) {
                        (Err(FlowError::Tripped { .. }), Some(FlowBug::DispatchWhileTripped)) => {
                            // The defect: the trip is forgotten and the flow dispatched anyway.
                            let _ = flows.reset_flow(reported, &id);
                            flows.trigger(reported, &id)
                        }
                        (result, _) => result,
                    };
                    match (result, was) {
                        (Err(FlowError::Tripped { .. } | FlowError::Running), _) => {
                            world
                                .check("G12", flows == before, || format!("flow {i}: a refused trigger changed it"))?;
                        }
                        (Ok(FlowAction::Dispatch { run }), status) => {
                            world.record(id, "dispatch (trigger)", run, 0);
                            world.check("G5", status != FlowStatusKind::Tripped, || {
                                format!("flow {i}: a tripped flow was dispatched by a trigger")
                            })?;
                            let now = m.flow.last_now.later(reported);
                            dispatched(&mut world, &scenario, i, m, run, now, was)?;
                        }
                        (result, status) => {
                            return Err(
                                world.violation("F7", format!("flow {i}: trigger while {status:?}: {result:?}"))
                            );
                        }
                    }
                    let expected = m.flow.trigger(reported).map(|()| m.made());
                    world.check("F7", result.map(Some) == expected, || {
                        format!("flow {i}: a trigger while {was:?} gave {result:?}, the model {expected:?}")
                    })?;
                } else {
                    world.record(id, "operator resets", m.flow.streak.into(), 0);
                    let made = flows.reset_flow(reported, &id).map_err(|e| world.violation("G12", format!("{e}")))?;
                    let answer = m.flow.reset(reported);
                    world.accepted("a flow's input", answer)?;
                    // O1: a reset that clears a streak is told, with the streak; one of a flow with none is not.
                    let expected = m.made();
                    world.check("O1", made == expected, || {
                        format!("flow {i}: a reset made {made:?}, the model makes {expected:?}")
                    })?;
                }
            }
        }
        check_registry(&mut world, &flows, &models)?;
    }
    Err(world.violation("G13", "the scenario did not finish within 200000 steps".into()))
}

/// G1, G4: what a failed run left (`status`), against the failure the run reported (`kind`,
/// with its hinted delay from `now`): `Fatal` and `DoNotRetry` trip the flow at once, never
/// retried (G4); a hint is never shortened: past `max_hint` it trips the flow with the hinted
/// instant, within it the window is the hint exactly (G1); a scheduled window lies within the
/// schedule's bounds where it stood before the failure (G1). The model checks the rest.
fn failed(
    world: &mut World,
    policy: &FlowPolicy,
    i: usize,
    m: &Model,
    (kind, hinted): (FailureKind, Option<u64>),
    now: Instant,
    status: Option<FlowStatus<u32>>,
) -> Result<(), Violation> {
    let trip = match kind {
        FailureKind::Fatal => Some(TripReason::Fatal),
        FailureKind::Hinted(Hint::DoNotRetry) => Some(TripReason::DoNotRetry),
        _ => None,
    };
    if let Some(reason) = trip {
        let tripped = matches!(status, Some(FlowStatus::Tripped { reason: r, .. }) if r == reason);
        return world.check("G4", tripped, || format!("flow {i}: a {kind:?} failure left {status:?}"));
    }
    let Some(FlowStatus::Backoff { until, .. }) = status else { return Ok(()) };
    match hinted {
        Some(d) => {
            // B6: the window is the hint, exactly, and only within max_hint.
            let expected = now.saturating_add(Duration::from_nanos(d));
            world.check("G1", until == expected && u128::from(d) <= policy.max_hint().as_nanos(), || {
                format!("flow {i}: a hint of {d} ns at {now:?} set the window to {until:?}, not {expected:?}")
            })
        }
        None => {
            let delay = until.saturating_duration_since(now).as_nanos() as u64;
            let (lo, hi) = m.schedule.next_bounds(policy.backoff());
            world.check("G1", until >= now && (lo..=hi).contains(&delay), || {
                format!("flow {i}: window until {until:?} from {now:?}: {delay} ns outside [{lo}, {hi}]")
            })
        }
    }
}

/// A dispatch of run `run` at `now`, the flow having been `was` before the input: never
/// while tripped (G5), never overlapping (G3), numbered in order (G11).
fn dispatched(
    world: &mut World,
    scenario: &FlowScenario,
    i: usize,
    m: &mut Model,
    run: u64,
    now: Instant,
    was: FlowStatusKind,
) -> Result<(), Violation> {
    world.check("G5", was != FlowStatusKind::Tripped, || format!("flow {i}: run {run} dispatched while tripped"))?;
    world.check("G3", m.running.is_none(), || format!("flow {i}: run {run} dispatched while a run is in flight"))?;
    world.check("G11", run == m.runs + 1, || format!("flow {i}: run {run} after {}", m.runs))?;
    m.runs = run;
    m.running = Some((run, now.saturating_add(Duration::from_nanos(world.between(0, scenario.run_ns)))));
    Ok(())
}

/// F3, F5, F9: every flow shows exactly what the model says, and the registry's next due time is
/// the earliest every-flow's `max(run_end + interval, next_eligible)`.
fn check_registry(world: &mut World, flows: &Flows<u32, u32>, models: &[Model]) -> Result<(), Violation> {
    let mut earliest: Option<Instant> = None;
    for (i, m) in models.iter().enumerate() {
        let Some(info) = flows.info(&(i as u32)) else {
            return Err(world.violation("G11", format!("flow {i} was lost")));
        };
        let status = info.status.cloned();
        let f = &m.flow;
        let ok = info.failure_streak == f.streak
            && info.next_eligible == f.next_eligible
            && info.run_count == f.run_count
            && status == f.status();
        world.check("F3", ok, || {
            format!(
                "flow {i}: shows streak {}, next_eligible {:?}, runs {}, {status:?}; the model says {}, {:?}, {}, {:?}",
                info.failure_streak,
                info.next_eligible,
                info.run_count,
                f.streak,
                f.next_eligible,
                f.run_count,
                f.status()
            )
        })?;
        // Time never runs backwards inside a flow: it holds the latest `now` it accepted.
        let now = flows.get(&(i as u32)).map(persevere::Flow::now);
        world.check("§3", now == Some(f.last_now), || {
            format!("flow {i}: holds now {now:?}, the model {:?}", f.last_now)
        })?;
        if let Some(due) = f.due() {
            earliest = Some(earliest.map_or(due, |e| e.earlier(due)));
        }
    }
    let timeout = flows.poll_timeout();
    world.check("F5", timeout == earliest, || format!("the registry is due at {timeout:?}, the model at {earliest:?}"))
}

/// Feeds a wrong input and checks it is refused without any change (G12).
fn misuse(
    world: &mut World,
    policy: &FlowPolicy,
    flows: &mut Flows<u32, u32>,
    models: &[Model],
    now: Instant,
) -> Result<(), Violation> {
    let n = models.len() as u64;
    let before = flows.clone();
    let i = world.between(0, n - 1) as usize;
    let m = &models[i];
    let status = m.flow.kind();
    let id = i as u32;
    let unknown = (n + world.between(0, 3)) as u32;
    let refused = match world.between(0, 6) {
        0 if status != FlowStatusKind::Running => flows.handle_success(now, &id) == Err(FlowError::NotRunning(status)),
        1 if status != FlowStatusKind::Running => {
            let failure = Failure::fatal(99);
            flows
                .handle_failure(policy, now, &id, failure, world.rng())
                .is_err_and(|r| r.error == FlowError::NotRunning(status) && r.input == failure)
        }
        2 if status != FlowStatusKind::Running => flows.handle_cancel(now, &id) == Err(FlowError::NotRunning(status)),
        3 if m.spec.every.is_some() => flows.handle_tick(now, &id, now) == Err(FlowError::NotCron),
        4 => flows.reset_flow(now, &unknown) == Err(FlowError::UnknownId),
        5 => {
            let failure = Failure::retryable(98);
            flows
                .handle_failure(policy, now, &unknown, failure, world.rng())
                .is_err_and(|r| r.error == FlowError::UnknownId && r.input == failure)
        }
        _ => flows.trigger(now, &unknown) == Err(FlowError::UnknownId),
    };
    world.record(id, "misuse fed", u64::from(unknown), 0);
    world.check("G12", refused, || format!("flow {i}: a wrong input was accepted"))?;
    world.check("G12", *flows == before, || format!("flow {i}: a refused input changed the registry"))
}

#[cfg(test)]
mod tests {
    use super::{FlowBug, run};

    /// Runs seeds with `bug` until it is caught; returns the violated rule.
    fn caught(bug: FlowBug) -> &'static str {
        (0..5_000)
            .find_map(|seed| run(seed, Some(bug)).err())
            .unwrap_or_else(|| panic!("{bug:?} was never caught"))
            .rule
    }

    #[test]
    fn f3_an_injected_retry_of_a_fatal_run_is_caught_as_g4() {
        // F3: a run that failed `Fatal` trips the flow at once (`TripReason::Fatal`).
        assert_eq!(caught(FlowBug::RetryFatal), "G4");
    }

    #[test]
    fn f3_an_injected_shortened_hint_is_caught_as_g1() {
        // F3, B6: a hint past `max_hint` trips the flow with the hinted instant; shortened to
        // `max_hint` (the rule before issue 12) the flow would back off instead.
        assert_eq!(caught(FlowBug::ClampHint), "G1");
    }
}
