//! Supervision scenarios: several supervised tasks interleaved on virtual time, each a real
//! [`persevere::Supervision`] machine with its own drawn policy (`once`, `restartable`,
//! `periodic`, `from_defaults`, settings inherited, switched off or overridden), attempt
//! failures of every class, attempt timeouts, panics while dropping a timed-out attempt,
//! driver cancels and stalled clocks, checked against a reference model after every event
//! (G1–G4, G6, G7, G11–G13, S1, S3–S6, B6).
//!
//! The model follows the one failure decision (issue 12): the failure's class, then the limit
//! (`once`, or a streak past `max_retries`), then a hint (never shortened; past `max_hint` the
//! task finishes `Deferred` at the hinted instant) or the backoff. Every decided failure counts
//! into the streak; a hinted delay under `restart_after_hint` restarts only the backoff's
//! place. Between an input and the drain of its events the driver sometimes feeds a timeout
//! and a cancel: the first must do nothing, the second be refused (the drain rule).

use std::time::Duration;

use persevere::{
    Failure, FailureClass, FailureKind, Instant, Restart, Setting, Supervision, SupervisionAction, SupervisionError,
    SupervisionPolicy, SupervisionPolicyBuilder, TaskDefaults, TaskOutcome, TaskOutcomeKind,
};

use crate::model::backoff::{Place, delay_bounds};
use crate::model::supervision::{Grammar, Phase, Resolved, SupervisionModel, waits};
use crate::world::{Summary, Violation, World, clamp_hint, draw_backoff, draw_failure, draw_fault_weights};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SupervisionBug {
    /// The driver feeds a fatal failure to the machine as retryable: fatal errors get retried.
    RetryFatal,
    /// A periodic task's interval is measured from the successful attempt's start, not its end.
    IntervalFromStart,
    /// The driver delivers a task's `TaskFinished` twice.
    DoubleFinish,
    /// The driver shortens a hint to `max_hint` before feeding it (the rule before issue 12;
    /// B6 now finishes the task `Deferred` instead).
    ClampHint,
}

/// The drawn configuration of one supervision scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct SupervisionScenario {
    /// The supervisor-wide defaults.
    pub defaults: TaskDefaults,
    /// Each task's own settings, and the policy they resolve to.
    pub tasks: Vec<(SupervisionPolicyBuilder, SupervisionPolicy)>,
    /// Relative weights of each failure class, for [`draw_failure`].
    pub fault_weights: crate::world::FaultWeights,
    /// Per-mille chance that an attempt fails (before the fault horizon).
    pub failure_rate: u64,
    /// Per-mille chance that an attempt hangs past its timeout (only with a timeout).
    pub hang_rate: u64,
    /// Per-mille chance that dropping a timed-out attempt panics.
    pub panic_rate: u64,
    /// Per-mille chance that a step reports a stale clock.
    pub stall_rate: u64,
    /// Per-mille chance that a step first feeds a wrong input (G12).
    pub misuse_rate: u64,
    /// Per-mille chance that the driver cancels a task at a step.
    pub cancel_rate: u64,
    /// Longest attempt, in nanoseconds.
    pub attempt_ns: u64,
    /// Longest drop of a timed-out attempt, in nanoseconds.
    pub drop_ns: u64,
    /// Longest hinted delay, in nanoseconds.
    pub hint_ns: u64,
    /// After this instant every attempt succeeds in time and nothing panics (G13).
    pub horizon: Instant,
    /// Successful repeats after the horizon before the driver cancels a periodic task.
    pub periodic_runs: u32,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn draw_restart(world: &mut World) -> Restart {
    match world.between(0, 2) {
        0 => Restart::Once,
        1 => Restart::Restartable,
        _ => Restart::Periodic { interval: ms(world.between(0, 3_000)) },
    }
}

fn draw_setting<T>(world: &mut World, value: impl FnOnce(&mut World) -> T) -> Setting<T> {
    match world.between(0, 2) {
        0 => Setting::Inherit,
        1 => Setting::Off,
        _ => Setting::Set(value(world)),
    }
}

impl SupervisionScenario {
    /// Draws a scenario from the world's RNG.
    pub fn draw(world: &mut World) -> Self {
        let defaults = TaskDefaults {
            restart: draw_restart(world),
            backoff: if world.chance(200) { TaskDefaults::new().backoff } else { draw_backoff(world, 200, 3_000) },
            attempt_timeout: world.chance(400).then(|| ms(world.between(1, 2_000))),
            max_retries: world.chance(500).then(|| world.between(1, 6) as u32),
            min_spacing: ms(world.pick(&[0, 1, 1, 5, 20])),
            max_hint: match world.between(0, 3) {
                0 => ms(world.between(1, 3_000)),
                1 => Duration::MAX,
                _ => TaskDefaults::new().max_hint,
            },
            restart_after_hint: world.chance(300),
        };
        let count = world.between(1, 10);
        let tasks = (0..count)
            .map(|_| {
                let mut builder = match world.between(0, 3) {
                    0 => SupervisionPolicy::once(),
                    1 => SupervisionPolicy::restartable(),
                    2 => SupervisionPolicy::periodic(ms(world.between(0, 3_000))),
                    _ => SupervisionPolicy::from_defaults(),
                };
                if world.chance(500) {
                    builder.backoff = draw_setting(world, |w| draw_backoff(w, 200, 3_000));
                }
                if world.chance(500) {
                    builder.attempt_timeout = draw_setting(world, |w| ms(w.between(1, 2_000)));
                }
                if world.chance(500) {
                    builder.max_retries = draw_setting(world, |w| w.between(1, 6) as u32);
                }
                if world.chance(300) {
                    builder.min_spacing = draw_setting(world, |w| ms(w.between(0, 30)));
                }
                if world.chance(300) {
                    builder.max_hint = draw_setting(world, |w| ms(w.between(1, 3_000)));
                }
                if world.chance(300) {
                    builder.restart_after_hint = draw_setting(world, |w| w.chance(500));
                }
                let policy = builder.build(&defaults).expect("drawn policies are valid");
                (builder, policy)
            })
            .collect();
        let fault_weights = draw_fault_weights(world);
        SupervisionScenario {
            defaults,
            tasks,
            fault_weights,
            failure_rate: world.between(0, 1000),
            hang_rate: world.between(0, 250),
            panic_rate: world.between(0, 300),
            stall_rate: world.between(0, 100),
            misuse_rate: world.between(0, 150),
            cancel_rate: world.between(0, 6),
            attempt_ns: ms(world.between(0, 500)).as_nanos() as u64,
            drop_ns: ms(world.between(0, 50)).as_nanos() as u64,
            hint_ns: ms(world.between(0, 4_000)).as_nanos() as u64,
            horizon: Instant::from_millis(world.between(0, 40_000)),
            periodic_runs: world.between(1, 4) as u32,
        }
    }
}

/// How the latest attempt ended, as the scenario drew it (the driver may feed the machine
/// something else: an injected bug).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Succeeded,
    /// A failure of this class, with its hinted delay in ns.
    Failed(FailureClass, Option<u64>),
    /// Timed out and dropped cleanly.
    TimedOut,
    /// Dropping it panicked.
    Panicked,
    /// Canceled by the driver while it ran.
    Canceled,
}

/// One task: where the scenario stands with it, its event grammar, and the reference model of
/// its machine.
#[derive(Clone, Debug)]
struct Model {
    finished: bool,
    /// The running attempt and when it reports (`None`: it hangs).
    running: Option<(u64, Option<Instant>)>,
    deadline: Option<Instant>,
    /// When the driver reports the drop of a timed-out attempt.
    abandon_at: Option<Instant>,
    /// Attempts the drains have seen start.
    attempts: u64,
    first_start: Instant,
    end: Option<End>,
    /// The backoff's place and previous delay before the last input, which bound the delay a
    /// failure then schedules (G1).
    schedule: Place,
    /// The wait scheduled by the latest `BackoffScheduled`.
    until: Option<Instant>,
    driver_canceled: bool,
    /// The machine's own wake-up time.
    wake: Option<Instant>,
    successes_after_horizon: u32,
    /// S5, S6: the event stream's grammar.
    grammar: Grammar,
    /// The reference model: every event the machine must tell, in order.
    machine: SupervisionModel<u64>,
    /// The events the model predicts for the input being drained.
    expected: Vec<SupervisionAction<u64>>,
}

impl Model {
    fn new() -> Self {
        Model {
            finished: false,
            running: None,
            deadline: None,
            abandon_at: None,
            attempts: 0,
            first_start: Instant::ZERO,
            end: None,
            schedule: Place::default(),
            until: None,
            driver_canceled: false,
            wake: None,
            successes_after_horizon: 0,
            grammar: Grammar::default(),
            machine: SupervisionModel::new(),
            expected: Vec::new(),
        }
    }

    fn due(&self) -> Option<Instant> {
        [self.running.and_then(|r| r.1), self.wake, self.abandon_at].into_iter().flatten().min()
    }

    /// Takes what the model answers to an input the machine accepted: the events to expect.
    fn expect(
        &mut self,
        world: &mut World,
        what: &str,
        answer: Result<Vec<SupervisionAction<u64>>, SupervisionError>,
    ) -> Result<(), Violation> {
        self.expected = world.accepted(what, answer)?;
        Ok(())
    }

    /// Notes where the backoff stands, before an input that may schedule a delay.
    fn before_failure(&mut self) {
        self.schedule = self.machine.schedule;
    }
}

/// Runs the supervision scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<SupervisionBug>) -> Result<Summary, Violation> {
    let mut world = World::new("supervision", seed);
    let scenario = SupervisionScenario::draw(&mut world);
    let n = scenario.tasks.len();
    for (builder, policy) in &scenario.tasks {
        // S1: explicit settings win over the defaults, `Off` switches an inherited one off.
        Resolved::new(builder, &scenario.defaults).check(&mut world, policy)?;
    }
    let mut machines: Vec<Supervision<u64>> = vec![Supervision::new(); n];
    let mut models: Vec<Model> = vec![Model::new(); n];
    let mut starts: Vec<Option<Instant>> =
        (0..n).map(|_| Some(Instant::from_millis(world.between(0, 1_000)))).collect();

    for _ in 0..200_000u32 {
        let mut next: Option<(Instant, usize)> = None;
        for i in 0..n {
            let due = if let Some(start) = starts[i] {
                Some(start)
            } else if models[i].finished {
                None
            } else if periodic_done(&scenario, i, &models[i]) {
                // The driver stops a periodic task that has shown it runs on time.
                Some(models[i].machine.last_now.later(world.now))
            } else {
                models[i].due()
            };
            if let Some(t) = due
                && next.is_none_or(|(best, _)| t < best)
            {
                next = Some((t, i));
            }
        }
        let Some((due, i)) = next else {
            for (i, m) in models.iter().enumerate() {
                world.check("G11", m.finished && m.grammar.finished(), || format!("task {i} never finished"))?;
            }
            return Ok(world.summary());
        };
        let reported = world.step_to(due, scenario.stall_rate, Instant::MAX);
        let policy = &scenario.tasks[i].1;
        if world.chance(scenario.misuse_rate) {
            // Any started task, finished ones included, refuses a wrong input.
            let j = world.between(0, n as u64 - 1) as usize;
            if starts[j].is_none() {
                let policy = &scenario.tasks[j].1;
                misuse(&mut world, policy, &mut machines[j], &models[j], reported)?;
            }
        }
        let (machine, model) = (&mut machines[i], &mut models[i]);
        let eff = model.machine.last_now.later(reported);
        if starts[i].is_some() {
            starts[i] = None;
            world.record(i as u32, "start task", 0, 0);
            machine
                .handle_start(policy, reported)
                .map_err(|e| world.violation("G12", format!("start refused: {e}")))?;
            model.first_start = eff;
            let answer = model.machine.start(policy, reported);
            model.expect(&mut world, "the start", answer)?;
        } else if periodic_done(&scenario, i, model) || world.chance(scenario.cancel_rate) {
            world.record(i as u32, "driver cancels", 0, 0);
            machine.handle_cancel(reported).map_err(|e| world.violation("G12", format!("cancel refused: {e}")))?;
            model.driver_canceled = true;
            if model.running.take().is_some() {
                model.end = Some(End::Canceled);
            }
            let answer = model.machine.cancel(reported);
            model.expect(&mut world, "a cancel", answer)?;
        } else if let Some((attempt, Some(report_at))) = model.running.filter(|r| r.1 == Some(due)) {
            model.running = None;
            if world.now >= scenario.horizon || !world.chance(scenario.failure_rate) {
                world.record(i as u32, "attempt succeeds", attempt, report_at.as_nanos());
                model.end = Some(End::Succeeded);
                machine
                    .handle_success(policy, reported, attempt)
                    .map_err(|e| world.violation("G12", format!("success refused: {e}")))?;
                let answer = model.machine.success(policy, reported, attempt);
                model.expect(&mut world, "a success", answer)?;
            } else {
                let (kind, hint) = draw_failure(&mut world, &scenario.fault_weights, scenario.hint_ns, eff);
                let class = kind.class();
                world.record(i as u32, "attempt fails", attempt, class as u64);
                model.end = Some(End::Failed(class, hint));
                let fed = match bug {
                    Some(SupervisionBug::RetryFatal) if class == FailureClass::Fatal => FailureKind::Retryable,
                    Some(SupervisionBug::ClampHint) => clamp_hint(kind, eff, policy.max_hint()),
                    _ => kind,
                };
                model.before_failure();
                machine
                    .handle_failure(policy, reported, attempt, Failure::new(fed, attempt), world.rng())
                    .map_err(|e| world.violation("G12", format!("failure refused: {e}")))?;
                // The model is told what was drawn, not what the driver fed.
                let drawn = Failure::new(kind, attempt);
                let answer = model.machine.failure(policy, reported, attempt, drawn, waits(machine));
                model.expect(&mut world, "a failure", answer)?;
            }
        } else if model.abandon_at == Some(due) {
            model.abandon_at = None;
            let panics = world.now < scenario.horizon && world.chance(scenario.panic_rate);
            world.record(i as u32, "attempt dropped", model.attempts, u64::from(panics));
            model.end = Some(if panics { End::Panicked } else { End::TimedOut });
            model.before_failure();
            machine
                .handle_abandoned(policy, reported, model.attempts, panics.then_some(7), world.rng())
                .map_err(|e| world.violation("G12", format!("drop refused: {e}")))?;
            let answer = model.machine.abandoned(policy, reported, model.attempts, panics.then_some(7), waits(machine));
            model.expect(&mut world, "the drop", answer)?;
        } else {
            world.record(i as u32, "timeout", eff.as_nanos(), 0);
            machine.handle_timeout(policy, reported);
            model.expected = model.machine.timeout(policy, reported);
        }
        drain(&mut world, &scenario, bug, i, machine, model)?;
    }
    Err(world.violation("G13", "the scenario did not finish within 200000 steps".into()))
}

/// Whether the driver is done with a periodic task: it has run on time often enough after
/// the horizon.
fn periodic_done(scenario: &SupervisionScenario, i: usize, model: &Model) -> bool {
    matches!(scenario.tasks[i].1.restart(), Restart::Periodic { .. })
        && !model.finished
        && model.successes_after_horizon >= scenario.periodic_runs
}

/// Feeds a wrong input and checks it is refused without any change (G12).
fn misuse(
    world: &mut World,
    policy: &SupervisionPolicy,
    machine: &mut Supervision<u64>,
    model: &Model,
    now: Instant,
) -> Result<(), Violation> {
    let before = *machine;
    let running = model.running.map(|r| r.0);
    let wrong = running.map_or(model.attempts.wrapping_add(world.between(0, 2)), |a| a + world.between(1, 3));
    let refused = match world.between(0, 5) {
        0 => machine.handle_success(policy, now, wrong).is_err(),
        1 => machine.handle_failure(policy, now, wrong, Failure::retryable(0), world.rng()).is_err(),
        2 if model.abandon_at.is_some() => {
            machine.handle_abandoned(policy, now, model.attempts + 1, None, world.rng()).is_err()
        }
        2 => machine.handle_abandoned(policy, now, wrong, Some(1), world.rng()).is_err(),
        3 if model.finished => machine.handle_cancel(now).is_err(),
        // Early is before the wake-up time, at the latest time the machine has seen.
        4 if machine.poll_timeout().is_none_or(|t| t > model.machine.last_now.later(now)) => {
            // A spurious, early timeout changes nothing (and is no error).
            machine.handle_timeout(policy, now);
            world.record(0, "spurious timeout", now.as_nanos(), 0);
            return world.check("§3", *machine == before, || {
                format!("an early timeout at {now:?} changed {before:?} to {machine:?}")
            });
        }
        _ => machine.handle_start(policy, now).is_err(),
    };
    world.record(0, "misuse fed", wrong, 0);
    world.check("G12", refused, || "a wrong input was accepted".into())?;
    world.check("G12", *machine == before, || "a refused input changed the state".into())
}

/// The drain rule: while events wait to be drained, a timeout (even at the end of time) does
/// nothing and a cancel is refused, both without any change (G12). Returns the cancel's error.
fn probe(
    world: &mut World,
    subject: u32,
    policy: &SupervisionPolicy,
    machine: &mut Supervision<u64>,
) -> Result<SupervisionError, Violation> {
    let before = *machine;
    machine.handle_timeout(policy, Instant::MAX);
    world.record(subject, "timeout while undrained", 0, 0);
    world.check("G12", *machine == before, || "a timeout acted while events waited to be drained".into())?;
    let refused = machine.handle_cancel(Instant::MAX);
    world.record(subject, "cancel while undrained", 0, 0);
    world.check("G12", *machine == before, || format!("a cancel while undrained ({refused:?}) changed the state"))?;
    refused
        .err()
        .ok_or_else(|| world.violation("G12", "a cancel was accepted while events waited to be drained".into()))
}

/// Drains the machine's events: checks the guarantees each must meet and the event grammar
/// as it comes, then that the events are the very ones the model predicts.
fn drain(
    world: &mut World,
    scenario: &SupervisionScenario,
    bug: Option<SupervisionBug>,
    i: usize,
    machine: &mut Supervision<u64>,
    model: &mut Model,
) -> Result<(), Violation> {
    let policy = &scenario.tasks[i].1;
    let subject = i as u32;
    let eff = model.machine.last_now;
    let expects = !model.expected.is_empty();
    let probed = if expects && world.chance(scenario.misuse_rate) {
        Some(probe(world, subject, policy, machine)?)
    } else {
        None
    };
    let mut finished_as = None;
    let mut got = Vec::new();
    while let Some(event) = machine.poll_action() {
        world.steps += 1;
        match event {
            SupervisionAction::AttemptStarting { attempt, deadline } => {
                world.record(subject, "attempt starting", attempt, deadline.map_or(0, Instant::as_nanos));
                world.check("G3", model.running.is_none() && model.abandon_at.is_none(), || {
                    format!("task {i}: attempt {attempt} starts while another runs")
                })?;
                world.check("G2", attempt == model.attempts + 1, || {
                    format!("task {i}: attempt {attempt} after {}", model.attempts)
                })?;
                if model.attempts > 0 {
                    let until = model.until.unwrap_or(Instant::MAX);
                    world.check("G6", eff >= until, || format!("task {i}: started at {eff:?} before {until:?}"))?;
                }
                model.attempts = attempt;
                model.deadline = deadline;
                model.until = None;
                let faulty = world.now < scenario.horizon;
                let hang = faulty && deadline.is_some() && world.chance(scenario.hang_rate);
                let longest = match policy.attempt_timeout() {
                    Some(t) if !faulty => scenario.attempt_ns.min((t.as_nanos() as u64).saturating_sub(1)),
                    _ => scenario.attempt_ns,
                };
                let report = (!hang).then(|| eff.saturating_add(Duration::from_nanos(world.between(0, longest))));
                model.running = Some((attempt, report));
            }
            SupervisionAction::AttemptSucceeded { attempt } => {
                world.record(subject, "attempt succeeded", attempt, 0);
                if world.now >= scenario.horizon {
                    model.successes_after_horizon += 1;
                }
            }
            SupervisionAction::AttemptFailed { attempt, class } => {
                world.record(subject, "attempt failed", attempt, class as u64);
            }
            SupervisionAction::AttemptTimedOut { attempt } => {
                world.record(subject, "attempt timed out", attempt, 0);
                let deadline = model.deadline.unwrap_or(Instant::MAX);
                world.check("G7", attempt == model.attempts && eff >= deadline, || {
                    format!("task {i}: attempt {attempt} timed out at {eff:?}, before its deadline {deadline:?}")
                })?;
                model.running = None;
                model.abandon_at = Some(eff.saturating_add(Duration::from_nanos(world.between(0, scenario.drop_ns))));
            }
            SupervisionAction::AttemptCanceled { attempt } => {
                world.record(subject, "attempt canceled", attempt, 0);
            }
            SupervisionAction::BackoffScheduled { next_attempt, delay, until } => {
                world.record(subject, "backoff scheduled", next_attempt, delay.as_nanos() as u64);
                let until = if bug == Some(SupervisionBug::IntervalFromStart) && model.end == Some(End::Succeeded) {
                    until.saturating_sub(eff.saturating_duration_since(model.machine.last_start))
                } else {
                    until
                };
                check_wait(world, policy, i, model, until, eff)?;
                model.until = Some(until);
            }
            SupervisionAction::TaskFinished { ref outcome, attempts } => {
                world.record(subject, "task finished", attempts, outcome.kind() as u64);
                finished_as = Some(outcome.kind());
                model.finished = true;
                check_outcome(world, scenario, i, model, outcome, eff)?;
                model.running = None;
                model.abandon_at = None;
            }
        }
        model.grammar.event(world, policy, eff, &event)?;
        if bug == Some(SupervisionBug::DoubleFinish) && matches!(event, SupervisionAction::TaskFinished { .. }) {
            model.grammar.event(world, policy, eff, &event)?;
        }
        got.push(event);
    }
    world.check("model", got == model.expected, || {
        format!("task {i}: events {got:?}, the model expects {:?}", model.expected)
    })?;
    model.expected.clear();
    if let Some(refused) = probed {
        // Validity errors come first: a cancel is refused as finished exactly when this input
        // finished the task, and as undrained otherwise.
        let expected = finished_as.map_or(SupervisionError::Undrained, SupervisionError::Finished);
        world.check("G12", refused == expected, || {
            format!("task {i}: a cancel while undrained: {refused:?}, expected {expected:?}")
        })?;
    }
    world.check("S3", machine.streak() == model.machine.failures, || {
        format!("task {i}: {} failures, the model counts {}", machine.streak(), model.machine.failures)
    })?;
    model.wake = machine.poll_timeout();
    if !model.finished {
        let expected = match model.machine.phase {
            Phase::Running { deadline } => deadline,
            Phase::Waiting { until } => Some(until),
            _ => None,
        };
        let wake = model.wake;
        let bugged = bug == Some(SupervisionBug::IntervalFromStart);
        world.check("S5", wake == expected || bugged, || {
            format!("task {i}: wakes at {wake:?}, expected {expected:?}")
        })?;
    }
    Ok(())
}

/// G1, G2, G4, G6: a wait after an attempt: its length, and whether there may be one at all.
fn check_wait(
    world: &mut World,
    policy: &SupervisionPolicy,
    i: usize,
    model: &Model,
    until: Instant,
    eff: Instant,
) -> Result<(), Violation> {
    let spaced = model.machine.last_start.saturating_add(policy.min_spacing());
    world.check("G6", until >= spaced, || format!("task {i}: next start {until:?} closer than min_spacing"))?;
    let hint = match model.end {
        Some(End::Succeeded) => {
            let Restart::Periodic { interval } = policy.restart() else {
                return Err(world.violation("S1", format!("task {i}: a non-periodic task repeats after a success")));
            };
            let expected = eff.saturating_add(interval).later(spaced);
            world.check("G6", until == expected, || {
                format!("task {i}: next periodic start {until:?}, expected {expected:?} (interval from the end)")
            })?;
            return world.check(
                "G13",
                until.saturating_duration_since(eff) <= interval.max(policy.min_spacing()),
                || format!("task {i}: periodic wait past its bound"),
            );
        }
        Some(End::Failed(class, hint)) => {
            world.check("G4", class.is_retryable(), || format!("task {i}: a {class:?} failure is retried"))?;
            hint
        }
        Some(End::TimedOut) => None,
        other => return Err(world.violation("G4", format!("task {i}: a retry after {other:?}"))),
    };
    world.check("G2", policy.restart() != Restart::Once, || format!("task {i}: a `once` task is retried"))?;
    let limit = policy.max_retries().unwrap_or(u32::MAX);
    let streak = model.machine.failures;
    world.check("G2", streak <= limit, || {
        format!("task {i}: failure {streak} of a streak retried under max_retries {limit}")
    })?;
    if let Some(hinted) = hint {
        // B6: the hint in full (spacing may only lengthen it), and only within max_hint.
        let expected = eff.saturating_add(Duration::from_nanos(hinted)).later(spaced);
        world.check("G1", until == expected, || {
            format!("task {i}: hinted wait until {until:?}, expected {expected:?}")
        })?;
        return world.check("G1", Duration::from_nanos(hinted) <= policy.max_hint(), || {
            format!("task {i}: a hint of {hinted} ns waited past max_hint {:?}", policy.max_hint())
        });
    }
    let (lo, hi) = model.schedule.next_bounds(policy.backoff());
    let place = model.schedule.place + 1;
    let d = until.saturating_duration_since(eff).as_nanos() as u64;
    if until > spaced {
        world.check("G1", (lo..=hi).contains(&d), || {
            format!("task {i}: delay {d} ns outside [{lo}, {hi}] at the backoff's place {place}")
        })
    } else {
        world.check("G1", eff.saturating_add(Duration::from_nanos(lo)) <= spaced, || {
            format!("task {i}: a wait of min_spacing, shorter than the least delay {lo} ns")
        })
    }
}

/// G4, G13: a failure that must not be retried ends the task as fatal (the model checks the
/// rest of the outcome exactly), and once faults stop a task finishes within a bound from its
/// policy.
fn check_outcome(
    world: &mut World,
    scenario: &SupervisionScenario,
    i: usize,
    model: &Model,
    outcome: &TaskOutcome<u64>,
    eff: Instant,
) -> Result<(), Violation> {
    let policy = &scenario.tasks[i].1;
    if let Some(End::Failed(class @ (FailureClass::Fatal | FailureClass::DoNotRetry), _)) = model.end {
        world.check("G4", outcome.kind() == TaskOutcomeKind::Fatal, || {
            format!("task {i}: outcome {outcome:?} after a {class:?} failure")
        })?;
    }
    // G13: once faults stop, a task finishes within a bound computed from its policy.
    let longest_delay = Duration::from_nanos(delay_bounds(policy.backoff(), u32::MAX, u64::MAX).1);
    // A hint is waited only up to max_hint (a longer one ends the task at once).
    let longest_sleep = longest_delay
        .max(Duration::from_nanos(scenario.hint_ns).min(policy.max_hint()))
        .max(policy.min_spacing())
        .saturating_add(policy.min_spacing());
    let attempt = Duration::from_nanos(scenario.attempt_ns);
    let mut bound = scenario
        .horizon
        .later(model.first_start)
        .saturating_add(attempt)
        .saturating_add(policy.attempt_timeout().unwrap_or(Duration::ZERO))
        .saturating_add(Duration::from_nanos(scenario.drop_ns))
        .saturating_add(longest_sleep)
        .saturating_add(attempt);
    if let Restart::Periodic { interval } = policy.restart() {
        let round = attempt.saturating_add(interval.max(policy.min_spacing()));
        bound = bound.saturating_add(round.saturating_mul(scenario.periodic_runs + 1));
    }
    world.check("G13", eff <= bound, || format!("task {i}: finished at {eff:?}, past the liveness bound {bound:?}"))
}
