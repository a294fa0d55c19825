//! Retry scenarios: several operations interleaved on virtual time, each a real
//! [`persevere::Retry`] machine, with drawn policies and faults, checked against a reference
//! model after every step (G1–G4, G7, G11–G13).

use std::time::Duration;

use persevere::{
    Action, Failure, FailureClass, FailureKind, Instant, Jitter, Outcome, OutcomeKind, Retry, RetryPolicy, Schedule,
    TokenBucket, TokenBucketPolicy,
};

use crate::world::{Summary, Violation, World, draw_backoff, draw_failure, draw_fault_weights};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryBug {
    /// The driver feeds a fatal failure to the machine as retryable: fatal errors get retried.
    RetryFatal,
    /// One nanosecond is added to every scheduled delay that reaches the cap.
    DelayPastCap,
    /// The driver starts one attempt more than the machine allowed, after an exhaustion.
    ExtraAttempt,
}

/// The drawn configuration of one retry scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct RetryScenario {
    /// The policy every operation shares.
    pub policy: RetryPolicy,
    /// How many operations run at once.
    pub operations: u32,
    /// Per-mille chances of each failure class, for [`draw_failure`].
    pub fault_weights: [u64; 7],
    /// Per-mille chance that an attempt fails at all (before the fault horizon).
    pub failure_rate: u64,
    /// Per-mille chance that an attempt hangs (only drawn with an attempt timeout).
    pub hang_rate: u64,
    /// Per-mille chance that a step reports a stale clock (time going backwards).
    pub stall_rate: u64,
    /// Per-mille chance that a step first feeds a wrong input (G12).
    pub misuse_rate: u64,
    /// Per-mille chance that the driver cancels an operation at a step.
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
        policy = match world.between(0, 2) {
            0 => policy.max_attempts(world.between(1, 8) as u32),
            1 => policy.max_retries(world.between(0, 7) as u32),
            _ => policy.max_attempts(world.between(1, 40) as u32),
        };
        if world.chance(400) {
            policy = policy.total(ms(world.between(1, 20_000)));
        }
        if world.chance(400) {
            policy = policy.attempt_timeout(ms(world.between(1, 2_000)));
        }
        if world.chance(300) {
            policy = policy.max_hint(ms(world.between(1, 3_000)));
        }
        policy = policy.restart_after_hint(world.chance(500));
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

/// The reference model of one operation: what the machine must be doing.
#[derive(Clone, Debug, Default)]
struct Model {
    started: bool,
    finished: bool,
    /// The attempt running, when it reports (`None`: it hangs), and its deadline.
    running: Option<(u32, Option<Instant>, Option<Instant>)>,
    attempts: u32,
    first_start: Instant,
    last_now: Instant,
    /// The last failure fed: class, hint delay (ns) if hinted.
    last: Option<(FailureClass, Option<u64>)>,
    /// Consecutive failures counted by the schedule, and the last scheduled delay.
    streak: u32,
    previous_delay: u64,
    /// The retry budget's grant was refused for this operation.
    refused: bool,
    canceled: bool,
    /// The last attempt's result fed to the machine was a success.
    succeeded: bool,
    /// When the machine asked to be woken.
    wake: Option<Instant>,
}

/// Runs the retry scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<RetryBug>) -> Result<Summary, Violation> {
    let mut world = World::new("retry", seed);
    let scenario = RetryScenario::draw(&mut world);
    let policy = scenario.policy;
    let n = scenario.operations as usize;
    let mut machines: Vec<Retry<u32>> = vec![Retry::new(); n];
    let mut models: Vec<Model> = vec![Model::default(); n];
    let mut budget = scenario.budget.as_ref().map(TokenBucket::new);
    let limit = policy.max_attempts().unwrap_or(u32::MAX);
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
        if !model.started {
            machine
                .handle_start(&policy, reported)
                .map_err(|e| world.violation("G12", format!("start refused: {e}")))?;
            model.started = true;
            model.first_start = reported;
            model.last_now = reported;
            world.record(i as u32, "start", 0, 0);
            starts[i] = Instant::MAX;
        } else if model.started && world.chance(scenario.cancel_rate) {
            machine.handle_cancel(reported).map_err(|e| world.violation("G12", format!("cancel refused: {e}")))?;
            model.canceled = true;
            model.last_now = model.last_now.later(reported);
            world.record(i as u32, "driver cancels", 0, 0);
        } else if let Some((attempt, Some(report_at), _)) = model.running.filter(|(_, at, _)| *at == Some(due)) {
            let eff = model.last_now.later(reported);
            model.last_now = eff;
            model.running = None;
            let past_horizon = world.now >= scenario.horizon;
            if past_horizon || !world.chance(scenario.failure_rate) {
                model.succeeded = true;
                machine
                    .handle_success(reported, attempt)
                    .map_err(|e| world.violation("G12", format!("success refused: {e}")))?;
                model.streak = 0;
                world.record(i as u32, "attempt succeeds", u64::from(attempt), report_at.as_nanos());
            } else {
                let (kind, hint_ns) = draw_failure(&mut world, &scenario.fault_weights, scenario.hint_ns, eff);
                let class = kind.class();
                let fed = if bug == Some(RetryBug::RetryFatal) && class == FailureClass::Fatal {
                    FailureKind::Retryable
                } else {
                    kind
                };
                world.record(i as u32, "attempt fails", u64::from(attempt), class as u64);
                model.last = Some((class, hint_ns));
                machine
                    .handle_failure(&policy, reported, attempt, Failure::new(fed, attempt), world.rng())
                    .map_err(|e| world.violation("G12", format!("failure refused: {e}")))?;
            }
        } else {
            let eff = model.last_now.later(reported);
            // The machine's own timeout: an attempt's deadline or the end of a sleep.
            if let Some((_, _, Some(deadline))) = model.running
                && eff >= deadline
            {
                model.last = Some((FailureClass::Timeout, None));
            }
            world.record(i as u32, "timeout", eff.as_nanos(), 0);
            machine.handle_timeout(&policy, reported, world.rng());
        }
        drain(
            &mut world,
            &scenario,
            &policy,
            limit,
            bug,
            budget.as_mut(),
            i,
            &mut machines[i],
            &mut models[i],
            reported,
        )?;
    }
    Err(world.violation("G13", "the scenario did not finish within 200000 steps".into()))
}

/// Feeds a wrong input and checks it is refused without any change (G12).
fn misuse(
    world: &mut World,
    subject: u32,
    policy: &RetryPolicy,
    machine: &mut Retry<u32>,
    model: &Model,
    now: Instant,
) -> Result<(), Violation> {
    let before = *machine;
    let running = model.running.map(|r| r.0);
    let wrong = running.map_or(model.attempts.wrapping_add(1), |a| a.wrapping_add(world.between(1, 3) as u32));
    let refused = match world.between(0, 3) {
        0 => machine.handle_success(now, wrong).is_err(),
        1 => machine.handle_failure(policy, now, wrong, Failure::retryable(0), world.rng()).is_err(),
        2 if model.started => machine.handle_start(policy, now).is_err(),
        _ if running.is_some() || model.finished => machine.handle_rejected(now).is_err(),
        // Nothing wrong to feed in this state (a sleeping machine may be rejected).
        _ => return Ok(()),
    };
    world.record(subject, "misuse fed", u64::from(wrong), 0);
    world.check("G12", refused, || "a wrong input was accepted".into())?;
    world.check("G12", *machine == before, || "a refused input changed the state".into())
}

/// Drains the machine's actions and checks each against the model.
#[allow(clippy::too_many_arguments)]
fn drain(
    world: &mut World,
    scenario: &RetryScenario,
    policy: &RetryPolicy,
    limit: u32,
    bug: Option<RetryBug>,
    mut budget: Option<&mut TokenBucket>,
    i: usize,
    machine: &mut Retry<u32>,
    model: &mut Model,
    reported: Instant,
) -> Result<(), Violation> {
    let eff = model.last_now.later(reported);
    model.last_now = eff;
    let subject = i as u32;
    let budget_end = policy.total().map(|t| model.first_start.saturating_add(t));
    while let Some(action) = machine.poll_action() {
        world.steps += 1;
        match action {
            Action::Start { attempt, deadline } => {
                world.record(subject, "start attempt", u64::from(attempt), deadline.map_or(0, |d| d.as_nanos()));
                world
                    .check("G3", model.running.is_none(), || format!("attempt {attempt} started while another runs"))?;
                world.check("G2", attempt == model.attempts + 1, || {
                    format!("attempt {attempt} after {}", model.attempts)
                })?;
                world.check("G2", attempt <= limit, || format!("attempt {attempt} over the limit {limit}"))?;
                if let Some(end) = budget_end {
                    world.check("G7", eff <= end, || format!("attempt {attempt} started past the total budget"))?;
                }
                let expected = policy.attempt_timeout().map(|t| eff.saturating_add(t)).filter(|d| *d != Instant::MAX);
                world.check("R3", deadline == expected, || format!("deadline {deadline:?}, expected {expected:?}"))?;
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
            Action::Abandon { attempt } => {
                world.record(subject, "abandon", u64::from(attempt), 0);
                let ok = matches!(model.running, Some((a, _, Some(d))) if a == attempt && d <= eff) || model.canceled;
                world.check("G7", ok, || format!("attempt {attempt} was cut before its own deadline"))?;
                model.running = None;
            }
            Action::Sleep { next_attempt, delay, until } => {
                world.record(subject, "sleep", u64::from(next_attempt), delay.as_nanos() as u64);
                let (class, hint) = model.last.unwrap_or((FailureClass::Retryable, None));
                world.check("G4", class.is_retryable(), || format!("a {class:?} failure is retried"))?;
                world.check("G2", model.attempts < limit, || {
                    format!("a retry after {} of {limit} attempts", model.attempts)
                })?;
                world.check("R6", until == eff.saturating_add(delay), || {
                    "the sleep does not end at now + delay".into()
                })?;
                if let Some(end) = budget_end {
                    world.check("G7", until <= end, || format!("the sleep ends {until:?}, past the budget {end:?}"))?;
                }
                let delay_ns = delay.as_nanos() as u64;
                let delay_ns = if bug == Some(RetryBug::DelayPastCap) && delay == policy.backoff().max_delay() {
                    delay_ns + 1
                } else {
                    delay_ns
                };
                check_delay(world, policy, model, hint, delay_ns, eff, budget_end)?;
                model.wake = Some(until);
                // The shared budget decides whether this retry may happen (U4).
                if let (Some(bucket), Some(budget_policy)) = (budget.as_deref_mut(), scenario.budget.as_ref()) {
                    let retry_class = persevere::RetryClass::from(class);
                    if bucket.try_acquire(budget_policy, retry_class).is_err() {
                        world.record(subject, "budget refuses", 0, bucket.balance_milli());
                        machine
                            .handle_rejected(eff)
                            .map_err(|e| world.violation("G12", format!("rejection refused: {e}")))?;
                        model.refused = true;
                    }
                }
            }
            Action::Finish { outcome, stats } => {
                world.record(subject, "finish", stats.attempts.into(), outcome.kind() as u64);
                world.check("G11", !model.finished, || "a second outcome".into())?;
                model.finished = true;
                model.running = None;
                model.wake = None;
                world.check("R5", stats.attempts == model.attempts, || {
                    format!("stats say {} attempts, {} started", stats.attempts, model.attempts)
                })?;
                check_outcome(world, policy, model, limit, &outcome, budget_end, eff)?;
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
                // report already drawn, a hang cut at its deadline, one longest sleep, one attempt.
                let longest_sleep = policy
                    .backoff()
                    .max_delay()
                    .max(policy.max_hint().unwrap_or(Duration::from_nanos(scenario.hint_ns)));
                let attempt = Duration::from_nanos(scenario.attempt_ns);
                let bound = scenario
                    .horizon
                    .later(model.first_start)
                    .saturating_add(attempt)
                    .saturating_add(policy.attempt_timeout().unwrap_or(Duration::ZERO))
                    .saturating_add(longest_sleep)
                    .saturating_add(attempt);
                world
                    .check("G13", eff <= bound, || format!("finished at {eff:?}, past the liveness bound {bound:?}"))?;
            }
        }
    }
    if !model.finished {
        model.wake = machine.poll_timeout().filter(|_| model.running.is_none_or(|(_, _, d)| d.is_some()));
        if let Some((_, _, Some(deadline))) = model.running {
            model.wake = Some(deadline);
        }
    }
    Ok(())
}

/// G1: a scheduled delay respects its schedule's bounds, or its hint.
fn check_delay(
    world: &mut World,
    policy: &RetryPolicy,
    model: &mut Model,
    hint: Option<u64>,
    delay_ns: u64,
    now: Instant,
    budget_end: Option<Instant>,
) -> Result<(), Violation> {
    let backoff = policy.backoff();
    if let Some(hinted) = hint {
        let mut expected = hinted.min(policy.max_hint().map_or(u64::MAX, |d| d.as_nanos() as u64));
        if let Some(end) = budget_end {
            expected = expected.min(end.saturating_duration_since(now).as_nanos() as u64);
        }
        world.check("G1", delay_ns == expected, || format!("hinted delay {delay_ns} ns, expected {expected} ns"))?;
        if policy.restarts_after_hint() {
            model.streak = 0;
            model.previous_delay = 0;
        } else {
            model.streak += 1;
            model.previous_delay = delay_ns;
        }
        return Ok(());
    }
    model.streak += 1;
    let cap = backoff.max_delay().as_nanos() as u64;
    let floor = backoff.min_delay().as_nanos() as u64;
    world.check("G1", delay_ns <= cap, || format!("delay {delay_ns} ns over the cap {cap} ns"))?;
    world.check("G1", delay_ns >= floor, || format!("delay {delay_ns} ns under the floor {floor} ns"))?;
    let envelope = backoff.envelope(model.streak).as_nanos() as u64;
    let most = match (backoff.schedule(), backoff.jitter_kind()) {
        (Schedule::Decorrelated { base }, _) => {
            let base = base.as_nanos() as u64;
            model.previous_delay.max(base).saturating_mul(3)
        }
        (_, Jitter::Proportional(f)) => envelope.saturating_add((envelope as f64 * f) as u64 + 1),
        _ => envelope,
    };
    world.check("G1", delay_ns <= most.max(floor).min(cap), || {
        format!("delay {delay_ns} ns over its bound {most} ns for failure {}", model.streak)
    })?;
    model.previous_delay = delay_ns;
    Ok(())
}

/// G2, G4, G7, G11: the outcome is the one the model expects.
fn check_outcome(
    world: &mut World,
    policy: &RetryPolicy,
    model: &Model,
    limit: u32,
    outcome: &Outcome<u32>,
    budget_end: Option<Instant>,
    now: Instant,
) -> Result<(), Violation> {
    let last = model.last.map(|l| l.0);
    match outcome.kind() {
        OutcomeKind::Succeeded => {
            world.check("G11", model.succeeded, || format!("succeeded after {last:?}, no success was fed"))
        }
        OutcomeKind::Exhausted => {
            world.check("G2", model.attempts == limit, || format!("exhausted after {} of {limit}", model.attempts))?;
            world.check("G4", last.is_some_and(FailureClass::is_retryable), || format!("exhausted by {last:?}"))
        }
        OutcomeKind::Fatal => {
            world.check("G4", matches!(last, Some(FailureClass::Fatal | FailureClass::DoNotRetry)), || {
                format!("fatal outcome after {last:?}")
            })
        }
        OutcomeKind::Canceled => world.check("G4", model.canceled || last == Some(FailureClass::Canceled), || {
            format!("canceled outcome after {last:?}")
        }),
        OutcomeKind::OutOfTime => {
            let Some(end) = budget_end else {
                return Err(world.violation("G7", "out of time without a total budget".into()));
            };
            // A hint is clamped to the budget, so only an expired budget ends a hinted failure;
            // a scheduled delay ends it only if the longest possible delay would overrun.
            let possible = if model.last.is_some_and(|l| l.1.is_some()) {
                now > end
            } else {
                now.saturating_add(policy.backoff().max_delay()) > end
            };
            world.check("G7", possible, || format!("out of time at {now:?} with the budget ending {end:?}"))
        }
        OutcomeKind::Rejected => world.check("U4", model.refused, || "rejected without a refusal".into()),
    }
}
