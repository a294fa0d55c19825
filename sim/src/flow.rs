//! Flow scenarios: many recurring flows in one real [`persevere::Flows`] registry, on `every`
//! and cron schedules (cron as "a tick is due at t", the ticks drawn by the simulator), with
//! run outcomes drawn with faults, and operator triggers, resets and clean cancels at random,
//! checked against a reference model after every input (G1, G3, G5, G6, G11–G13, F3–F10).

use std::time::Duration;

use persevere::{FlowAction, FlowError, FlowPolicy, FlowStatusKind, Flows, Instant, SkipReason};

use crate::world::{Summary, Violation, World, delay_bounds, draw_backoff};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowBug {
    /// A registry that forgets the trip when a tripped flow is triggered, and dispatches it.
    DispatchWhileTripped,
    /// A driver that replays a skipped cron tick once the backoff window has ended.
    ReplaySkippedTick,
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

/// The reference model of one flow.
#[derive(Clone, Debug)]
struct Model {
    spec: FlowSpec,
    status: FlowStatusKind,
    streak: u32,
    next_eligible: Option<Instant>,
    run_count: u64,
    /// Reports accepted (one per run, G11).
    outcomes: u64,
    /// An every-flow's last run end plus its interval (its creation before the first run).
    interval_due: Instant,
    /// The run in flight and when it ends.
    running: Option<(u64, Instant)>,
    previous_delay: u64,
    last_now: Instant,
    /// The latest cron tick fed, and the next one due.
    last_tick: Option<Instant>,
    next_tick: Instant,
    /// A skipped tick a buggy driver replays at this instant.
    replay: Option<(Instant, Instant)>,
}

impl Model {
    fn new(spec: FlowSpec) -> Self {
        Model {
            spec,
            status: FlowStatusKind::Idle,
            streak: 0,
            next_eligible: None,
            run_count: 0,
            outcomes: 0,
            interval_due: spec.created,
            running: None,
            previous_delay: 0,
            last_now: spec.created,
            last_tick: None,
            next_tick: spec.created.saturating_add(spec.period),
            replay: None,
        }
    }

    /// When an every-flow is due (F5): `max(run_end + interval, next_eligible)`.
    fn due(&self) -> Option<Instant> {
        match (self.spec.every, self.status) {
            (None, _) | (_, FlowStatusKind::Running | FlowStatusKind::Tripped) => None,
            (Some(_), _) => Some(self.next_eligible.map_or(self.interval_due, |u| u.later(self.interval_due))),
        }
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
                world.check("G11", m.outcomes == m.run_count && m.running.is_none(), || {
                    format!("flow {i}: {} runs, {} outcomes", m.run_count, m.outcomes)
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
                flows.handle_timeout(reported);
                while let Some((id, action)) = flows.poll_action() {
                    world.steps += 1;
                    let i = id as usize;
                    let FlowAction::Dispatch { run } = action else {
                        return Err(world.violation("F6", format!("flow {i}: {action:?} from a timeout")));
                    };
                    let m = &mut models[i];
                    world.record(id, "dispatch (due)", run, 0);
                    world.check("G6", m.spec.every.is_some(), || format!("cron flow {i} dispatched by time"))?;
                    let due = m.due();
                    world.check("G6", due.is_some_and(|d| d <= registry_now), || {
                        format!("flow {i} dispatched at {registry_now:?}, due {due:?}")
                    })?;
                    m.last_now = m.last_now.later(registry_now);
                    let now = m.last_now;
                    dispatched(&mut world, &scenario, i, m, run, now)?;
                }
                // G13: nothing due is left undispatched.
                let left = flows.poll_timeout();
                world.check("G13", left.is_none_or(|t| t > registry_now), || {
                    format!("a flow due at {left:?} was not dispatched at {registry_now:?}")
                })?;
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
                let action = flows
                    .handle_tick(&(i as u32), reported, tick)
                    .map_err(|e| world.violation("G12", format!("flow {i}: tick refused: {e}")))?;
                m.last_now = m.last_now.later(reported);
                let now = m.last_now;
                let expected = match (m.status, m.next_eligible) {
                    (FlowStatusKind::Running, _) => Some(SkipReason::Running),
                    (FlowStatusKind::Tripped, _) => Some(SkipReason::Tripped),
                    (_, Some(until)) if tick < until => Some(SkipReason::InBackoff { until }),
                    _ => None,
                };
                let ok = match (action, expected) {
                    (FlowAction::TickSkipped { tick: t, reason }, Some(e)) => t == tick && reason == e,
                    (FlowAction::Dispatch { .. }, None) => true,
                    _ => false,
                };
                let rule = match expected {
                    Some(SkipReason::Tripped) => "G5",
                    Some(SkipReason::InBackoff { .. }) => "G6",
                    _ => "F6",
                };
                world.check(rule, ok, || {
                    format!("flow {i}: tick {tick:?} gave {action:?}, expected a skip for {expected:?}")
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
                        dispatched(&mut world, &scenario, i, m, run, now)?;
                    }
                    _ => {}
                }
            }
            Step::RunEnds(i) => {
                let m = &mut models[i];
                let Some((run, _)) = m.running.take() else { unreachable!("a run end is due only while running") };
                let id = i as u32;
                let now = m.last_now.later(reported);
                m.last_now = now;
                m.outcomes += 1;
                if let Some(interval) = m.spec.every {
                    m.interval_due = now.saturating_add(interval);
                }
                let faulty = world.now < scenario.horizon;
                if faulty && world.chance(scenario.cancel_rate) {
                    world.record(id, "run canceled", run, 0);
                    flows.handle_cancel(&id, reported).map_err(|e| world.violation("G12", format!("{e}")))?;
                    m.status = FlowStatusKind::Idle;
                } else if faulty && world.chance(scenario.failure_rate) {
                    world.record(id, "run fails", run, 0);
                    flows
                        .handle_failure(policy, &id, reported, run as u32, world.rng())
                        .map_err(|e| world.violation("G12", format!("{e}")))?;
                    m.streak += 1;
                    if policy.trip_after().is_some_and(|limit| m.streak >= limit) {
                        m.status = FlowStatusKind::Tripped;
                        m.next_eligible = None;
                    } else {
                        m.status = FlowStatusKind::Backoff;
                        let until = flows.get(&id).and_then(persevere::Flow::next_eligible).unwrap_or(Instant::ZERO);
                        let delay = until.saturating_duration_since(now).as_nanos() as u64;
                        let (lo, hi) = delay_bounds(policy.backoff(), m.streak, m.previous_delay);
                        world.check("G1", until >= now && (lo..=hi).contains(&delay), || {
                            format!("flow {i}: window until {until:?} from {now:?}: {delay} ns outside [{lo}, {hi}]")
                        })?;
                        m.previous_delay = delay;
                        m.next_eligible = Some(until);
                    }
                } else {
                    world.record(id, "run succeeds", run, 0);
                    flows.handle_success(&id, reported).map_err(|e| world.violation("G12", format!("{e}")))?;
                    m.status = FlowStatusKind::Completed;
                    m.streak = 0;
                    m.previous_delay = 0;
                    m.next_eligible = None;
                }
                if world.now >= scenario.horizon
                    && let Some(due) = m.due()
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
                if world.chance(scenario.trigger_share) {
                    world.record(id, "operator triggers", m.streak.into(), 0);
                    let before = flows.clone();
                    let result = flows.trigger(&id, reported);
                    let result = match (result, bug) {
                        (Err(FlowError::Tripped { .. }), Some(FlowBug::DispatchWhileTripped)) => {
                            // The defect: the trip is forgotten and the flow dispatched anyway.
                            let _ = flows.reset_flow(&id, reported);
                            flows.trigger(&id, reported)
                        }
                        (result, _) => result,
                    };
                    match (result, m.status) {
                        (Err(FlowError::Tripped { streak }), FlowStatusKind::Tripped) => {
                            world.check("G5", streak == m.streak, || format!("flow {i}: trip streak {streak}"))?;
                            world
                                .check("G12", flows == before, || format!("flow {i}: a refused trigger changed it"))?;
                        }
                        (Err(FlowError::Running), FlowStatusKind::Running) => {
                            world
                                .check("G12", flows == before, || format!("flow {i}: a refused trigger changed it"))?;
                        }
                        (Ok(FlowAction::Dispatch { run }), status) => {
                            world.record(id, "dispatch (trigger)", run, 0);
                            world.check("G5", status != FlowStatusKind::Tripped, || {
                                format!("flow {i}: a tripped flow was dispatched by a trigger")
                            })?;
                            m.last_now = m.last_now.later(reported);
                            let now = m.last_now;
                            dispatched(&mut world, &scenario, i, m, run, now)?;
                        }
                        (result, status) => {
                            return Err(
                                world.violation("F7", format!("flow {i}: trigger while {status:?}: {result:?}"))
                            );
                        }
                    }
                } else {
                    world.record(id, "operator resets", m.streak.into(), 0);
                    flows.reset_flow(&id, reported).map_err(|e| world.violation("G12", format!("{e}")))?;
                    m.last_now = m.last_now.later(reported);
                    m.streak = 0;
                    m.previous_delay = 0;
                    m.next_eligible = None;
                    if m.status != FlowStatusKind::Running {
                        m.status = FlowStatusKind::Idle;
                    }
                }
            }
        }
        check_registry(&mut world, &flows, &models)?;
    }
    Err(world.violation("G13", "the scenario did not finish within 200000 steps".into()))
}

/// A dispatch of run `run`: never while tripped (G5), never overlapping (G3), numbered in order.
fn dispatched(
    world: &mut World,
    scenario: &FlowScenario,
    i: usize,
    m: &mut Model,
    run: u64,
    now: Instant,
) -> Result<(), Violation> {
    world
        .check("G5", m.status != FlowStatusKind::Tripped, || format!("flow {i}: run {run} dispatched while tripped"))?;
    world.check("G3", m.running.is_none(), || format!("flow {i}: run {run} dispatched while a run is in flight"))?;
    world.check("G11", run == m.run_count + 1, || format!("flow {i}: run {run} after {}", m.run_count))?;
    m.run_count = run;
    m.status = FlowStatusKind::Running;
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
        let ok = info.failure_streak == m.streak
            && info.next_eligible == m.next_eligible
            && info.run_count == m.run_count
            && info.status.kind() == m.status;
        world.check("F3", ok, || {
            format!(
                "flow {i}: shows streak {}, next_eligible {:?}, runs {}, {:?}; the model says {}, {:?}, {}, {:?}",
                info.failure_streak,
                info.next_eligible,
                info.run_count,
                info.status.kind(),
                m.streak,
                m.next_eligible,
                m.run_count,
                m.status
            )
        })?;
        if let Some(due) = m.due() {
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
    let id = i as u32;
    let unknown = (n + world.between(0, 3)) as u32;
    let refused = match world.between(0, 5) {
        0 if m.status != FlowStatusKind::Running => {
            flows.handle_success(&id, now) == Err(FlowError::NotRunning(m.status))
        }
        1 if m.status != FlowStatusKind::Running => {
            flows.handle_failure(policy, &id, now, 99, world.rng()).is_err_and(|r| r.last_error == 99)
        }
        2 if m.status != FlowStatusKind::Running => flows.handle_cancel(&id, now).is_err(),
        3 if m.spec.every.is_some() => flows.handle_tick(&id, now, now) == Err(FlowError::NotCron),
        4 => flows.reset_flow(&unknown, now) == Err(FlowError::UnknownId),
        _ => flows.trigger(&unknown, now) == Err(FlowError::UnknownId),
    };
    world.record(id, "misuse fed", u64::from(unknown), 0);
    world.check("G12", refused, || format!("flow {i}: a wrong input was accepted"))?;
    world.check("G12", *flows == before, || format!("flow {i}: a refused input changed the registry"))
}
