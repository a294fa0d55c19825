//! Retry scenarios: several operations interleaved on virtual time, each a real
//! [`persevere::Retry`] machine, with drawn policies and faults, checked against a reference
//! model after every step (G1–G4, G7, G11–G13, R3–R6, B6).
//!
//! The model follows the one failure decision (issue 12): the failure's class, then the attempt
//! limit, then a hint (never shortened: past `max_hint` or past the total budget it ends the
//! operation `Deferred` at the hinted instant) or the schedule (past the budget: `OutOfTime`).
//! Every failure but a cancel counts into the streak; a hinted delay under
//! `restart_after_hint` restarts only the schedule's place. Between an input and the drain of
//! its actions the driver sometimes feeds a timeout and a cancel: the first must do nothing,
//! the second be refused (the drain rule).

use std::collections::VecDeque;
use std::time::Duration;

use persevere::{
    Failure, FailureClass, FailureKind, Instant, OutcomeKind, Retry, RetryAction, RetryError, RetryPolicy, TokenBucket,
    TokenBucketPolicy,
};

use crate::model::backoff::Place;
use crate::model::retry::{RetryModel, waits};
use crate::world::{Summary, Violation, World, clamp_hint, draw_backoff, draw_failure, draw_fault_weights};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryBug {
    /// The driver feeds a fatal failure to the machine as retryable: fatal errors get retried.
    RetryFatal,
    /// One nanosecond is added to every scheduled delay that reaches the cap.
    DelayPastCap,
    /// The driver starts one attempt more than the machine allowed, after an exhaustion.
    ExtraAttempt,
    /// The driver shortens a hint to `max_hint` before feeding it (the rule before issue 12;
    /// B6 now defers the operation instead).
    ClampHint,
}

/// The drawn configuration of one retry scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct RetryScenario {
    /// The policy every operation shares.
    pub policy: RetryPolicy,
    /// How many operations run at once.
    pub operations: u32,
    /// Per-mille chances of each failure class, for [`draw_failure`].
    pub fault_weights: crate::world::FaultWeights,
    /// Per-mille chance that an attempt fails at all (before the fault horizon).
    pub failure_rate: u64,
    /// Per-mille chance that an attempt hangs (only drawn with an attempt timeout).
    pub hang_rate: u64,
    /// Per-mille chance that a step reports a stale clock (time going backwards).
    pub stall_rate: u64,
    /// Per-mille chance that a step first feeds a wrong input (G12).
    pub misuse_rate: u64,
    /// Per-mille chance that the driver cancels an operation at a step (also before it starts).
    pub cancel_rate: u64,
    /// Longest attempt, in nanoseconds.
    pub attempt_ns: u64,
    /// Longest hinted delay, in nanoseconds.
    pub hint_ns: u64,
    /// After this instant every attempt succeeds quickly (for G13).
    pub horizon: Instant,
    /// A shared token bucket consulted before each retry (U4, G9), if drawn.
    pub budget: Option<TokenBucketPolicy>,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl RetryScenario {
    /// Draws a scenario from the world's RNG.
    pub fn draw(world: &mut World) -> Self {
        let backoff = draw_backoff(world, 200, 5_000);
        let mut policy = RetryPolicy::builder(backoff);
        // R3: every policy has a limit, or says it has none on purpose.
        let limit = world.between(0, 4);
        policy = match limit {
            0 => policy.max_attempts(world.between(1, 8) as u32),
            1 => policy.max_retries(world.between(0, 7) as u32),
            2 => policy.max_attempts(world.between(1, 40) as u32),
            3 => policy.total(ms(world.between(1, 20_000))),
            _ => policy.unbounded(),
        };
        if limit < 3 && world.chance(400) {
            policy = policy.total(ms(world.between(1, 20_000)));
        }
        if world.chance(400) {
            policy = policy.attempt_timeout(ms(world.between(1, 2_000)));
        }
        if world.chance(300) {
            policy = policy.max_hint(ms(world.between(1, 3_000)));
        } else if world.chance(100) {
            policy = policy.max_hint(Duration::MAX);
        }
        policy = policy.restart_after_hint(world.chance(500));
        if world.chance(300) {
            policy = policy.throttling_backoff(draw_backoff(world, 200, 5_000));
        }
        let policy = policy.build().expect("drawn policies are valid");
        let fault_weights = draw_fault_weights(world);
        let budget = world.chance(300).then(|| {
            // Costs never exceed the capacity (a policy error otherwise).
            TokenBucketPolicy::builder(world.between(10, 50) as u32)
                .costs(world.between(1, 10) as u32, world.between(1, 5) as u32, world.between(1, 10) as u32)
                .build()
                .expect("drawn budgets are valid")
        });
        RetryScenario {
            hang_rate: if policy.attempt_timeout().is_some() { world.between(0, 200) } else { 0 },
            policy,
            operations: world.between(1, 12) as u32,
            fault_weights,
            failure_rate: world.between(0, 1000),
            stall_rate: world.between(0, 100),
            misuse_rate: world.between(0, 150),
            cancel_rate: world.between(0, 8),
            attempt_ns: ms(world.between(0, 500)).as_nanos() as u64,
            hint_ns: ms(world.between(0, 4_000)).as_nanos() as u64,
            horizon: Instant::from_millis(world.between(0, 60_000)),
            budget,
        }
    }
}

/// One operation: where the scenario stands with it, and the reference model of its machine.
#[derive(Clone, Debug)]
struct Model {
    started: bool,
    finished: bool,
    /// The attempt running, when it reports (`None`: it hangs), and its deadline.
    running: Option<(u64, Option<Instant>, Option<Instant>)>,
    /// Attempts the drains have seen started.
    attempts: u64,
    /// The last failure the scenario drew: class, and the hint's delay (ns) if hinted. (The
    /// driver may feed the machine something else: an injected bug.)
    last: Option<(FailureClass, Option<u64>)>,
    /// The schedule's place and previous delay before the last input, which bound the delay
    /// a failure then schedules (G1).
    schedule: Place,
    canceled: bool,
    /// When the machine asked to be woken.
    wake: Option<Instant>,
    /// The reference model: every action the machine must emit, in order.
    machine: RetryModel<u64>,
    /// The actions the model predicts that the drain has not seen yet.
    expected: VecDeque<RetryAction<u64>>,
}

impl Model {
    fn new() -> Self {
        Model {
            started: false,
            finished: false,
            running: None,
            attempts: 0,
            last: None,
            schedule: Place::default(),
            canceled: false,
            wake: None,
            machine: RetryModel::new(),
            expected: VecDeque::new(),
        }
    }

    /// Takes what the model answers to an input the machine accepted: the actions to expect.
    fn expect(
        &mut self,
        world: &mut World,
        what: &str,
        answer: Result<Vec<RetryAction<u64>>, RetryError>,
    ) -> Result<(), Violation> {
        self.expected.extend(world.accepted(what, answer)?);
        Ok(())
    }

    /// Notes where the schedule stands, before an input that may schedule a delay.
    fn before_failure(&mut self) {
        self.schedule = self.machine.schedule;
    }
}

/// Runs the retry scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<RetryBug>) -> Result<Summary, Violation> {
    let mut world = World::new("retry", seed);
    let scenario = RetryScenario::draw(&mut world);
    let policy = scenario.policy;
    let n = scenario.operations as usize;
    let mut machines: Vec<Retry<u64>> = vec![Retry::new(); n];
    let mut models: Vec<Model> = vec![Model::new(); n];
    let mut budget = scenario.budget.as_ref().map(TokenBucket::new);
    let limit = policy.max_attempts().map_or(u64::MAX, u64::from);
    // Operations start at staggered instants.
    let mut starts: Vec<Instant> = (0..n).map(|_| Instant::from_millis(world.between(0, 1_000))).collect();

    for _ in 0..200_000u32 {
        // The next thing due: a start, an attempt's report, or a machine's timeout.
        let mut next: Option<(Instant, usize)> = None;
        for i in 0..n {
            let m = &models[i];
            let due = if !m.started {
                Some(starts[i])
            } else if m.finished {
                None
            } else {
                let report = m.running.and_then(|(_, at, _)| at);
                match (report, m.wake) {
                    (Some(r), Some(w)) => Some(r.min(w)),
                    (r, w) => r.or(w),
                }
            };
            if let Some(t) = due
                && next.is_none_or(|(best, _)| t < best)
            {
                next = Some((t, i));
            }
        }
        let Some((due, i)) = next else {
            // Everything finished: G11 and G13 hold for every operation.
            for (i, m) in models.iter().enumerate() {
                world.check("G11", m.finished, || format!("operation {i} never finished"))?;
            }
            return Ok(world.summary());
        };
        let reported = world.step_to(due, scenario.stall_rate, Instant::MAX);
        if world.chance(scenario.misuse_rate) {
            misuse(&mut world, i as u32, &policy, &mut machines[i], &models[i], reported)?;
        }
        let (machine, model) = (&mut machines[i], &mut models[i]);
        if !model.started && world.chance(scenario.cancel_rate) {
            // Canceled before it started: no attempt, no time.
            machine.handle_cancel(reported).map_err(|e| world.violation("G12", format!("cancel refused: {e}")))?;
            model.started = true;
            model.canceled = true;
            let answer = model.machine.cancel(reported);
            model.expect(&mut world, "a cancel", answer)?;
            world.record(i as u32, "driver cancels before the start", 0, 0);
            starts[i] = Instant::MAX;
        } else if !model.started {
            machine
                .handle_start(&policy, reported)
                .map_err(|e| world.violation("G12", format!("start refused: {e}")))?;
            model.started = true;
            let answer = model.machine.start(&policy, reported);
            model.expect(&mut world, "the start", answer)?;
            world.record(i as u32, "start", 0, 0);
            starts[i] = Instant::MAX;
        } else if world.chance(scenario.cancel_rate) {
            machine.handle_cancel(reported).map_err(|e| world.violation("G12", format!("cancel refused: {e}")))?;
            model.canceled = true;
            let answer = model.machine.cancel(reported);
            model.expect(&mut world, "a cancel", answer)?;
            world.record(i as u32, "driver cancels", 0, 0);
        } else if let Some((attempt, Some(report_at), _)) = model.running.filter(|(_, at, _)| *at == Some(due)) {
            let eff = model.machine.last_now.later(reported);
            model.running = None;
            let past_horizon = world.now >= scenario.horizon;
            if past_horizon || !world.chance(scenario.failure_rate) {
                machine
                    .handle_success(reported, attempt)
                    .map_err(|e| world.violation("G12", format!("success refused: {e}")))?;
                let answer = model.machine.success(reported, attempt);
                model.expect(&mut world, "a success", answer)?;
                world.record(i as u32, "attempt succeeds", attempt, report_at.as_nanos());
            } else {
                let (kind, hint_ns) = draw_failure(&mut world, &scenario.fault_weights, scenario.hint_ns, eff);
                let class = kind.class();
                let fed = match bug {
                    Some(RetryBug::RetryFatal) if class == FailureClass::Fatal => FailureKind::Retryable,
                    Some(RetryBug::ClampHint) => clamp_hint(kind, eff, policy.max_hint()),
                    _ => kind,
                };
                world.record(i as u32, "attempt fails", attempt, class as u64);
                model.last = Some((class, hint_ns));
                model.before_failure();
                machine
                    .handle_failure(&policy, reported, attempt, Failure::new(fed, attempt), world.rng())
                    .map_err(|e| world.violation("G12", format!("failure refused: {e}")))?;
                // The model is told what was drawn, not what the driver fed.
                let answer =
                    model.machine.failure(&policy, reported, attempt, Failure::new(kind, attempt), waits(machine));
                model.expect(&mut world, "a failure", answer)?;
            }
        } else {
            // The machine's own timeout: an attempt's deadline or the end of a sleep; an
            // early one does nothing.
            if let Some((_, _, Some(deadline))) = model.running
                && model.machine.last_now.later(reported) >= deadline
            {
                model.last = Some((FailureClass::Timeout, None));
            }
            model.before_failure();
            world.record(i as u32, "timeout", model.machine.last_now.later(reported).as_nanos(), 0);
            machine.handle_timeout(&policy, reported, world.rng());
            let actions = model.machine.timeout(&policy, reported, waits(machine));
            model.expected.extend(actions);
        }
        let step = Step { limit, bug, subject: i as u32 };
        drain(&mut world, &scenario, &policy, step, budget.as_mut(), &mut machines[i], &mut models[i])?;
    }
    Err(world.violation("G13", "the scenario did not finish within 200000 steps".into()))
}

/// Feeds a wrong input and checks it is refused without any change (G12).
fn misuse(
    world: &mut World,
    subject: u32,
    policy: &RetryPolicy,
    machine: &mut Retry<u64>,
    model: &Model,
    now: Instant,
) -> Result<(), Violation> {
    let before = *machine;
    let running = model.running.map(|r| r.0);
    let wrong = running.map_or(model.attempts.wrapping_add(1), |a| a.wrapping_add(world.between(1, 3)));
    let refused = match world.between(0, 3) {
        0 => machine.handle_success(now, wrong).is_err(),
        1 => machine.handle_failure(policy, now, wrong, Failure::retryable(0), world.rng()).is_err(),
        2 if model.started => machine.handle_start(policy, now).is_err(),
        _ if running.is_some() || model.finished => machine.handle_rejected(now).is_err(),
        // Nothing wrong to feed in this state (a sleeping machine may be rejected).
        _ => return Ok(()),
    };
    world.record(subject, "misuse fed", wrong, 0);
    world.check("G12", refused, || "a wrong input was accepted".into())?;
    world.check("G12", *machine == before, || "a refused input changed the state".into())
}

/// What the step that fed an input knows, for the drain after it.
#[derive(Clone, Copy)]
struct Step {
    limit: u64,
    bug: Option<RetryBug>,
    subject: u32,
}

/// Drains the machine's actions, checks the guarantees each must meet, and then that it is
/// the very action the model predicts.
fn drain(
    world: &mut World,
    scenario: &RetryScenario,
    policy: &RetryPolicy,
    step: Step,
    mut budget: Option<&mut TokenBucket>,
    machine: &mut Retry<u64>,
    model: &mut Model,
) -> Result<(), Violation> {
    let Step { limit, bug, subject } = step;
    let eff = model.machine.last_now;
    let expects = !model.expected.is_empty();
    let budget_end = policy.total().map(|t| model.machine.first_start.saturating_add(t));
    world.check("R6", machine.has_actions() == expects, || {
        format!("has_actions() is {}, the model expects {:?}", machine.has_actions(), model.expected)
    })?;
    let probed =
        if expects && world.chance(scenario.misuse_rate) { probe(world, subject, policy, machine)? } else { None };
    // The outcome the input itself made (not a rejection fed during this drain).
    let mut finished_as = None;
    let mut rejected_here = false;
    while let Some(action) = machine.poll_action() {
        world.steps += 1;
        match action {
            RetryAction::Start { attempt, deadline } => {
                world.record(subject, "start attempt", attempt, deadline.map_or(0, |d| d.as_nanos()));
                world
                    .check("G3", model.running.is_none(), || format!("attempt {attempt} started while another runs"))?;
                world.check("G2", attempt == model.attempts + 1, || {
                    format!("attempt {attempt} after {}", model.attempts)
                })?;
                world.check("G2", attempt <= limit, || format!("attempt {attempt} over the limit {limit}"))?;
                if let Some(end) = budget_end {
                    world.check("G7", eff <= end, || format!("attempt {attempt} started past the total budget"))?;
                }
                model.attempts = attempt;
                let faulty = world.now < scenario.horizon;
                let hang = world.chance(scenario.hang_rate) && faulty;
                // Past the fault horizon attempts also finish within their deadline.
                let longest = match policy.attempt_timeout() {
                    Some(t) if !faulty => scenario.attempt_ns.min((t.as_nanos() as u64).saturating_sub(1)),
                    _ => scenario.attempt_ns,
                };
                let report = (!hang).then(|| eff.saturating_add(Duration::from_nanos(world.between(0, longest))));
                // An attempt that reports after its deadline is timed out first.
                model.running = Some((attempt, report, deadline));
            }
            RetryAction::Abandon { attempt } => {
                world.record(subject, "abandon", attempt, 0);
                let ok = matches!(model.running, Some((a, _, Some(d))) if a == attempt && d <= eff) || model.canceled;
                world.check("G7", ok, || format!("attempt {attempt} was cut before its own deadline"))?;
                model.running = None;
            }
            RetryAction::Sleep { next_attempt, delay, until } => {
                world.record(subject, "sleep", next_attempt, delay.as_nanos() as u64);
                let (class, hint) = model.last.unwrap_or((FailureClass::Retryable, None));
                world.check("G4", class.is_retryable(), || format!("a {class:?} failure is retried"))?;
                world.check("G2", model.attempts < limit, || {
                    format!("a retry after {} of {limit} attempts", model.attempts)
                })?;
                if let Some(end) = budget_end {
                    world.check("G7", until <= end, || format!("the sleep ends {until:?}, past the budget {end:?}"))?;
                }
                let delay_ns = delay.as_nanos() as u64;
                let delay_ns = if bug == Some(RetryBug::DelayPastCap) && delay == schedule_of(policy, class).max_delay()
                {
                    delay_ns + 1
                } else {
                    delay_ns
                };
                check_delay(world, policy, model, class, hint, delay_ns)?;
                model.wake = Some(until);
            }
            RetryAction::Finish { outcome, stats } => {
                world.record(subject, "finish", stats.attempts, outcome.kind() as u64);
                world.check("G11", !model.finished, || "a second outcome".into())?;
                if !rejected_here {
                    finished_as = Some(outcome.kind());
                }
                model.finished = true;
                model.running = None;
                model.wake = None;
                // G4: a failure that must not be retried ends the operation as fatal, also on
                // the last allowed attempt (the model checks the rest of the outcome exactly).
                if let Some((class @ (FailureClass::Fatal | FailureClass::DoNotRetry), _)) = model.last
                    && !rejected_here
                {
                    world.check("G4", outcome.kind() == OutcomeKind::Fatal, || {
                        format!("outcome {:?} after a {class:?} failure", outcome.kind())
                    })?;
                }
                if bug == Some(RetryBug::ExtraAttempt) && outcome.kind() == OutcomeKind::Exhausted {
                    model.attempts += 1;
                    world.check("G2", model.attempts <= limit, || {
                        format!("{} attempts started under a limit of {limit}", model.attempts)
                    })?;
                }
                if outcome.kind() == OutcomeKind::Succeeded
                    && let Some(bucket) = budget.as_deref_mut()
                {
                    bucket.record_success(scenario.budget.as_ref().expect("a bucket has a policy"), None);
                }
                // G13: once faults stop, an operation finishes within a bound from its policy: a
                // report already drawn, a hang cut at its deadline, one longest sleep (a hint is
                // waited only up to max_hint), one attempt.
                let longest_sleep =
                    longest_delay(policy).max(policy.max_hint().min(Duration::from_nanos(scenario.hint_ns)));
                let attempt = Duration::from_nanos(scenario.attempt_ns);
                let bound = scenario
                    .horizon
                    .later(model.machine.first_start)
                    .saturating_add(attempt)
                    .saturating_add(policy.attempt_timeout().unwrap_or(Duration::ZERO))
                    .saturating_add(longest_sleep)
                    .saturating_add(attempt);
                world
                    .check("G13", eff <= bound, || format!("finished at {eff:?}, past the liveness bound {bound:?}"))?;
            }
        }
        let want = model.expected.pop_front();
        world.check("model", want.as_ref() == Some(&action), || {
            format!("action {action:?}, the model expects {want:?}")
        })?;
        // The shared budget decides whether a retry may happen (U4); a refusal is fed once the
        // sleep is drained.
        if let RetryAction::Sleep { .. } = action
            && let (Some(bucket), Some(budget_policy)) = (budget.as_deref_mut(), scenario.budget.as_ref())
        {
            let class = model.last.map_or(FailureClass::Retryable, |l| l.0);
            if bucket.try_acquire(budget_policy, persevere::RetryClass::from(class)).is_err() {
                world.record(subject, "budget refuses", 0, bucket.balance_milli());
                machine.handle_rejected(eff).map_err(|e| world.violation("G12", format!("rejection refused: {e}")))?;
                let answer = model.machine.rejected(eff);
                model.expect(world, "a rejection", answer)?;
                rejected_here = true;
            }
        }
    }
    world.check("model", model.expected.is_empty(), || {
        format!("the drain ended, the model still expects {:?}", model.expected)
    })?;
    if let Some(refused) = probed {
        // Validity errors come first: a cancel is refused as finished exactly when this input
        // finished the operation, and as undrained otherwise.
        let expected = finished_as.map_or(RetryError::Undrained, RetryError::Finished);
        world.check("G12", refused == expected, || {
            format!("a cancel while undrained: {refused:?}, expected {expected:?}")
        })?;
    }
    world.check("R4", machine.streak() == model.machine.failures, || {
        format!("streak {}, the model counts {}", machine.streak(), model.machine.failures)
    })?;
    if !model.finished {
        model.wake = machine.poll_timeout().filter(|_| model.running.is_none_or(|(_, _, d)| d.is_some()));
        if let Some((_, _, Some(deadline))) = model.running {
            model.wake = Some(deadline);
        }
    }
    Ok(())
}

/// The drain rule: while actions wait to be drained, a timeout (even at the end of time) does
/// nothing and a cancel is refused, both without any change (G12). Returns the cancel's error.
fn probe(
    world: &mut World,
    subject: u32,
    policy: &RetryPolicy,
    machine: &mut Retry<u64>,
) -> Result<Option<RetryError>, Violation> {
    let before = *machine;
    machine.handle_timeout(policy, Instant::MAX, world.rng());
    world.record(subject, "timeout while undrained", 0, 0);
    world.check("G12", *machine == before, || "a timeout acted while actions waited to be drained".into())?;
    let refused = machine.handle_cancel(Instant::MAX);
    world.record(subject, "cancel while undrained", 0, 0);
    world.check("G12", *machine == before, || format!("a cancel while undrained ({refused:?}) changed the state"))?;
    match refused {
        Ok(()) => Err(world.violation("G12", "a cancel was accepted while actions waited to be drained".into())),
        Err(error) => Ok(Some(error)),
    }
}

/// The schedule a failure of `class` waits on: the policy's throttling schedule for a
/// throttled failure if it has one, its backoff otherwise.
pub(crate) fn schedule_of(policy: &RetryPolicy, class: FailureClass) -> &persevere::Backoff {
    match policy.throttling_backoff() {
        Some(throttling) if class == FailureClass::Throttled => throttling,
        _ => policy.backoff(),
    }
}

/// The longest scheduled delay of either schedule.
fn longest_delay(policy: &RetryPolicy) -> Duration {
    policy.backoff().max_delay().max(policy.throttling_backoff().map_or(Duration::ZERO, |b| b.max_delay()))
}

/// G1, B6: a scheduled delay respects its schedule's bounds where the schedule stood before
/// the failure; a hinted one is the hint, in full, and within `max_hint`.
fn check_delay(
    world: &mut World,
    policy: &RetryPolicy,
    model: &Model,
    class: FailureClass,
    hint: Option<u64>,
    delay_ns: u64,
) -> Result<(), Violation> {
    if let Some(hinted) = hint {
        world.check("G1", delay_ns == hinted, || format!("hinted delay {delay_ns} ns, the hint asked {hinted} ns"))?;
        let max_hint = policy.max_hint();
        return world.check("G1", Duration::from_nanos(hinted) <= max_hint, || {
            format!("a hint of {hinted} ns waited past max_hint {max_hint:?}")
        });
    }
    let (lo, hi) = model.schedule.next_bounds(schedule_of(policy, class));
    let place = model.schedule.place + 1;
    world.check("G1", (lo..=hi).contains(&delay_ns), || {
        format!("delay {delay_ns} ns outside [{lo}, {hi}] ns at the schedule's place {place}")
    })
}
