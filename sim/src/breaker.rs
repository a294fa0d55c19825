//! Breaker scenarios: one real [`persevere::Breaker`] and one shared retry budget (a
//! [`persevere::TokenBucket`] or a [`persevere::RatioBudget`]) used by many simulated callers,
//! with drawn call durations and outcomes, lost probe results, and an operator who isolates,
//! disables and resets the breaker at random; checked after every input against the breaker
//! model the fuzz target shares (`model::breaker`: every input, every permit and refusal, the
//! state after every step) and the budget's exact arithmetic (U1–U3), and against the
//! guarantees as the steps come (G8, G9, G12, G13).

use std::time::Duration;

use persevere::{
    Breaker, BreakerError, BreakerPolicy, BreakerStatus, CallOutcome, Grant, Instant, Permit, RatioBudget,
    RatioBudgetPolicy, RetryClass, TokenBucket, TokenBucketPolicy,
};

use crate::model::breaker::{BreakerModel, PPM, PermitModel, Phase, Rules, open_until};
use crate::model::budget::{BucketModel, RatioModel, RatioRules};
use crate::world::{Summary, Violation, World, delay_bounds, draw_backoff};

/// A deliberate defect, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerBug {
    /// A half-open breaker that admits one probe more than `permits`.
    ExtraProbe,
    /// An open breaker that lets a call through before its open period ends.
    AdmitWhileOpen,
    /// A budget that grants a retry it should refuse.
    Overgrant,
}

/// The shared retry budget of a scenario.
#[derive(Clone, Copy, Debug)]
pub enum BudgetSpec {
    /// No budget: every failed call is retried once.
    None,
    /// A token bucket (U1).
    Bucket(TokenBucketPolicy),
    /// A ratio budget (U2), with its settings as the model reads them (computed from what
    /// was drawn, not asked of the policy).
    Ratio(RatioBudgetPolicy, RatioRules),
}

/// The drawn configuration of one breaker scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct BreakerScenario {
    /// The breaker's policy.
    pub policy: BreakerPolicy,
    /// Its rules as the model reads them, from what was drawn (not asked of the policy).
    pub(crate) rules: Rules,
    /// The rate thresholds drawn, in parts per million (`None`: unset).
    pub failure_ppm: Option<u64>,
    /// The slow-call rate threshold in ppm, and the slow-call threshold.
    pub slow: Option<(u64, Duration)>,
    /// The consecutive-failure limit.
    pub consecutive: Option<u32>,
    /// The budget the callers share.
    pub budget: BudgetSpec,
    /// How many callers.
    pub callers: u32,
    /// Longest pause between a caller's requests, in nanoseconds.
    pub gap_ns: u64,
    /// Longest call, in nanoseconds.
    pub call_ns: u64,
    /// Per-mille chance that a call fails (before the horizon).
    pub failure_rate: u64,
    /// Per-mille chance that a call is ignored (canceled by the caller).
    pub ignore_rate: u64,
    /// Per-mille chance that a probe's result is lost (before the horizon).
    pub lost_rate: u64,
    /// Per-mille chance that a step is an operator action (before the horizon).
    pub operator_rate: u64,
    /// Per-mille chance that a step reports a stale clock.
    pub stall_rate: u64,
    /// Per-mille chance that a step first feeds a wrong permit (G12, K5).
    pub misuse_rate: u64,
    /// After this instant calls succeed, fast, and nothing is lost; the operator restores the
    /// breaker to automatic operation.
    pub horizon: Instant,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl BreakerScenario {
    /// Draws a scenario from the world's RNG.
    pub fn draw(world: &mut World) -> Self {
        let open = draw_backoff(world, 300, 3_000);
        let mut builder = BreakerPolicy::builder(open);
        let consecutive = world.chance(600).then(|| world.between(1, 6) as u32);
        if let Some(n) = consecutive {
            builder = builder.consecutive_failures(n);
        }
        let failure_ppm = world.chance(500).then(|| world.between(1, 1000) * 1_000);
        if let Some(ppm) = failure_ppm {
            builder = builder.failure_rate(ppm as f64 / 1e6);
        }
        let slow = world.chance(300).then(|| (world.between(1, 1000) * 1_000, ms(world.between(1, 300))));
        if let Some((ppm, threshold)) = slow {
            builder = builder.slow_call_rate(ppm as f64 / 1e6, threshold);
        }
        let consecutive = if consecutive.is_none() && failure_ppm.is_none() && slow.is_none() {
            let n = world.between(1, 6) as u32;
            builder = builder.consecutive_failures(n);
            Some(n)
        } else {
            consecutive
        };
        let window_calls = world.between(1, 64) as u32;
        // K2's window: the last calls (minimum calls by default: the window's size), or time
        // buckets (minimum calls by default: 100).
        let (calls, width_ns, buckets, default_minimum) = if world.chance(500) {
            builder = builder.count_window(window_calls);
            (Some(window_calls), 0, 0, window_calls)
        } else {
            let (span_ms, buckets) = (world.between(16, 2_000), world.between(1, 16) as u32);
            builder = builder.time_window(ms(span_ms), buckets);
            (None, span_ms * 1_000_000 / u64::from(buckets), buckets, 100)
        };
        let minimum = world.chance(700).then(|| world.between(1, u64::from(window_calls)) as u32);
        if let Some(n) = minimum {
            builder = builder.minimum_calls(n);
        }
        let permits = world.between(1, 4) as u32;
        builder = builder.half_open_permits(permits);
        let close_after = world.chance(500).then(|| world.between(1, 4) as u32);
        if let Some(n) = close_after {
            builder = builder.successes_to_close(n);
        }
        let probe_ms = world.between(5, 2_000);
        builder = builder.probe_timeout(ms(probe_ms));
        let policy = builder.build().expect("drawn breaker policies are valid");
        let rules = Rules {
            consecutive: consecutive.map_or(u64::MAX, u64::from),
            failure_ppm: failure_ppm.unwrap_or(PPM + 1),
            slow_ppm: slow.map_or(PPM + 1, |(ppm, _)| ppm),
            slow_ns: slow.map_or(u64::MAX, |(_, threshold)| threshold.as_nanos() as u64),
            calls,
            width_ns,
            buckets,
            minimum: minimum.unwrap_or(default_minimum),
            permits,
            // K4: as many successful probes as permits close it, by default.
            close_after: close_after.unwrap_or(permits),
            probe_ns: probe_ms * 1_000_000,
        };
        let budget = match world.between(0, 5) {
            0 => BudgetSpec::None,
            1 => BudgetSpec::Bucket(TokenBucketPolicy::aws()),
            2 => BudgetSpec::Bucket(
                TokenBucketPolicy::grpc(world.between(1, 100) as u32, world.between(1, 3_000) as f64 / 1000.0)
                    .expect("drawn gRPC budgets are valid"),
            ),
            3 => {
                let capacity = world.between(1, 50) as u32;
                let cost = |w: &mut World| w.between(1, u64::from(capacity)) as u32;
                let (a, b, c) = (cost(world), cost(world), cost(world));
                let mut bucket = TokenBucketPolicy::builder(capacity)
                    .costs(a, b, c)
                    .success_refund_milli(world.between(0, 3_000))
                    .refund_retry_cost(world.chance(500))
                    .charge_refused(world.chance(500));
                if world.chance(500) {
                    bucket = bucket.refuse_at_or_below(world.between(0, u64::from(capacity) - 1) as u32);
                }
                BudgetSpec::Bucket(bucket.build().expect("drawn buckets are valid"))
            }
            _ => {
                let (ttl_ms, per_sec) = (world.between(16, 10_000), world.between(0, 10));
                let per_mille = world.between(0, 1000);
                let buckets = world.between(1, 16) as u32;
                let policy = RatioBudgetPolicy::builder(per_mille as f64 / 1000.0)
                    .ttl(ms(ttl_ms))
                    .buckets(buckets)
                    .min_retries_per_sec(per_sec as u32)
                    .build()
                    .expect("drawn ratio budgets are valid");
                let rules = RatioRules {
                    ratio_ppm: per_mille * 1_000,
                    // U3: the floor is min_retries_per_sec × ttl, in millionths, exactly.
                    floor_ppm: per_sec * ttl_ms * 1_000,
                    width_ns: ttl_ms * 1_000_000 / u64::from(buckets),
                    buckets,
                    burst: None,
                };
                BudgetSpec::Ratio(policy, rules)
            }
        };
        BreakerScenario {
            policy,
            rules,
            failure_ppm,
            slow,
            consecutive,
            budget,
            callers: world.between(1, 6) as u32,
            gap_ns: ms(world.between(5, 300)).as_nanos() as u64,
            call_ns: ms(world.between(0, 300)).as_nanos() as u64,
            failure_rate: world.between(0, 1000),
            ignore_rate: world.between(0, 50),
            lost_rate: world.between(0, 300),
            operator_rate: world.between(0, 20),
            stall_rate: world.between(0, 100),
            misuse_rate: world.between(0, 100),
            horizon: Instant::from_millis(world.between(0, 8_000)),
        }
    }
}

/// A call in flight.
#[derive(Clone, Copy, Debug)]
struct Call {
    permit: Permit,
    ends: Instant,
    outcome: CallOutcome,
    /// The result never arrives.
    lost: bool,
}

/// One simulated caller.
#[derive(Clone, Copy, Debug)]
struct Caller {
    /// When it next acts (a new request, a retry, or its call's end).
    at: Instant,
    call: Option<Call>,
    /// The next call is a retry the budget granted (with its grant, for a refund).
    retry: Option<Option<Grant>>,
}

/// What the breaker must be (its model), and what the family remembers beside it.
#[derive(Clone, Debug)]
struct Model {
    breaker: BreakerModel,
    rules: Rules,
    /// The generation the trace last reported.
    traced: u32,
    /// The model's generation and last open duration after the previous input.
    seen: (u32, u64),
    /// The latest permit the breaker issued (a stale one, once the breaker moves on).
    last_permit: Option<Permit>,
}

impl Model {
    /// Compares the breaker's answer to a record with the model's.
    fn recorded(
        &mut self,
        world: &World,
        policy: &BreakerPolicy,
        breaker: &Breaker,
        now: Instant,
        (permit, outcome): (Permit, CallOutcome),
        got: Result<(), BreakerError>,
    ) -> Result<(), Violation> {
        let elapsed_ns = now.as_nanos().saturating_sub(permit.acquired_at().as_nanos());
        let observed = open_until(breaker);
        let answer =
            self.breaker.record(policy, &self.rules, now, PermitModel::of(&permit), outcome, elapsed_ns, observed);
        if got == answer {
            Ok(())
        } else {
            Err(world.violation("model", format!("record of {permit:?} gave {got:?}, the model {answer:?}")))
        }
    }
}

/// Runs the breaker scenario of `seed`; `bug` injects a defect.
pub fn run(seed: u64, bug: Option<BreakerBug>) -> Result<Summary, Violation> {
    let mut world = World::new("breaker", seed);
    let scenario = BreakerScenario::draw(&mut world);
    let policy = &scenario.policy;
    let mut breaker = Breaker::new(policy, 1);
    let mut other = Breaker::new(policy, 2);
    let mut bucket = match scenario.budget {
        BudgetSpec::Bucket(p) => Some((p, TokenBucket::new(&p))),
        _ => None,
    };
    let mut ratio = match scenario.budget {
        BudgetSpec::Ratio(p, rules) => Some((p, rules, RatioBudget::new())),
        _ => None,
    };
    let mut bucket_model = BucketModel::new(bucket.map_or(0, |(p, _)| p.capacity_milli()));
    let mut ratio_model = RatioModel::default();
    let rules = scenario.rules;
    let mut model = Model { breaker: BreakerModel::new(1, &rules), rules, traced: 0, seen: (0, 0), last_permit: None };
    let mut callers: Vec<Caller> = (0..scenario.callers)
        .map(|_| Caller { at: Instant::from_nanos(world.between(0, scenario.gap_ns)), call: None, retry: None })
        .collect();
    // G13: once faults stop, the breaker is closed again within a bound from its policy.
    let open_max = delay_bounds(policy.open_backoff(), u32::MAX, u64::MAX).1;
    let round = scenario.call_ns + policy.probe_timeout().as_nanos() as u64 + scenario.gap_ns;
    // A closed window may still hold failures from before the horizon and trip once more on a
    // success, until they have left it: after its span, or after as many calls as it holds.
    let window = match policy.window() {
        persevere::BreakerWindow::Time { span, .. } => span.as_nanos() as u64,
        persevere::BreakerWindow::Calls(n) => u64::from(n) * (scenario.gap_ns + scenario.call_ns),
    };
    let settle = Duration::from_nanos(
        window + 2 * (open_max.saturating_add(round)) + 2 * (u64::from(policy.successes_to_close()) + 2) * round,
    );
    let closed_by = scenario.horizon.saturating_add(settle);
    let end = closed_by.saturating_add(Duration::from_nanos(round));
    let mut restored = false;
    let mut settled = false;

    for _ in 0..400_000u32 {
        // The next thing due: a caller, the breaker's timeout, the horizon, the liveness check.
        let mut next: Option<(Instant, usize)> = None;
        for (c, caller) in callers.iter().enumerate() {
            let at = caller.call.map_or(caller.at, |call| call.ends);
            if (caller.call.is_some() || at < end) && next.is_none_or(|(best, _)| at < best) {
                next = Some((at, c));
            }
        }
        const TIMEOUT: usize = usize::MAX;
        const RESTORE: usize = usize::MAX - 1;
        const SETTLED: usize = usize::MAX - 2;
        for (at, what) in [
            (breaker.poll_timeout().filter(|t| *t < end), TIMEOUT),
            ((!restored).then_some(scenario.horizon), RESTORE),
            ((!settled).then_some(closed_by), SETTLED),
        ] {
            if let Some(at) = at
                && next.is_none_or(|(best, _)| at < best)
            {
                next = Some((at, what));
            }
        }
        let Some((due, what)) = next else {
            return Ok(world.summary());
        };
        // Stalled clocks are faults too: past the horizon the clock is read on time, so that
        // no call is measured slower than it was.
        let reported = world.step_to(due, scenario.stall_rate, scenario.horizon);
        if world.chance(scenario.misuse_rate) {
            misuse(&mut world, policy, &mut breaker, &mut other, &mut model, reported)?;
        }
        let before = breaker.status();
        // Whether the breaker was told the time (a refused input tells it nothing).
        let mut told = false;
        match what {
            TIMEOUT => {
                told = true;
                world.record(u32::MAX, "breaker timeout", reported.as_nanos(), 0);
                breaker.handle_timeout(policy, reported, world.rng());
                model.breaker.timeout(policy, reported, open_until(&breaker));
                // A second timeout at the same time changes nothing.
                let once = breaker;
                breaker.handle_timeout(policy, reported, world.rng());
                model.breaker.timeout(policy, reported, open_until(&breaker));
                world.check("§3", breaker == once, || {
                    "a repeated timeout changed the breaker (handle_timeout twice must do nothing)".into()
                })?;
            }
            RESTORE => {
                restored = true;
                if matches!(before, BreakerStatus::Isolated | BreakerStatus::Disabled) {
                    world.record(u32::MAX, "operator restores", 0, 0);
                    breaker.handle_reset(policy, reported);
                    model.breaker.reset(&model.rules, reported);
                }
            }
            SETTLED => {
                settled = true;
                world.record(u32::MAX, "liveness check", 0, 0);
                world.check("G13", before == BreakerStatus::Closed, || {
                    format!("the breaker is {before:?} at {closed_by:?}, past its liveness bound")
                })?;
                continue;
            }
            c => {
                if world.now < scenario.horizon && world.chance(scenario.operator_rate) {
                    let op = world.between(0, 2);
                    world.record(u32::MAX, "operator", op, 0);
                    match op {
                        0 => {
                            breaker.handle_isolate(reported);
                            model.breaker.isolate(reported);
                        }
                        1 => {
                            breaker.handle_disable(reported);
                            model.breaker.disable(reported);
                        }
                        _ => {
                            breaker.handle_reset(policy, reported);
                            model.breaker.reset(&model.rules, reported);
                        }
                    }
                    check_transition(&mut world, &scenario, &mut model, &breaker, reported, false)?;
                }
                let before = breaker.status();
                let caller = &mut callers[c];
                if let Some(call) = caller.call.filter(|call| call.ends == due) {
                    caller.call = None;
                    caller.at = world.now.saturating_add(Duration::from_nanos(world.between(0, scenario.gap_ns)));
                    if call.lost {
                        world.record(c as u32, "result lost", u64::from(call.permit.id()), 0);
                    } else {
                        told = record(&mut world, &scenario, &mut breaker, &mut model, c, call, reported)?;
                        // The budget decides whether a failed call is retried (U4).
                        let retry = caller.retry.take();
                        match call.outcome {
                            CallOutcome::Failure => {
                                let class =
                                    world.pick(&[RetryClass::Transient, RetryClass::Throttling, RetryClass::Timeout]);
                                let granted = ask_budget(
                                    &mut world,
                                    &mut bucket,
                                    &mut ratio,
                                    (&mut bucket_model, &mut ratio_model),
                                    bug,
                                    class,
                                    reported,
                                )?;
                                if let Some(grant) = granted {
                                    caller.retry = Some(grant);
                                    caller.at = world.now.saturating_add(ms(world.between(0, 50)));
                                }
                            }
                            CallOutcome::Success => {
                                if let Some((p, b)) = bucket.as_mut() {
                                    let grant = retry.flatten();
                                    b.record_success(p, grant);
                                    let before = bucket_model.balance;
                                    bucket_model.success(p, grant);
                                    let credited = bucket_model.balance.saturating_sub(before);
                                    world.record(c as u32, "budget refund", credited, b.balance_milli());
                                    bucket_model.check(&mut world, p, b)?;
                                }
                            }
                            CallOutcome::Ignored => {}
                        }
                    }
                } else {
                    // A new request, or a retry the budget granted.
                    if caller.retry.is_none()
                        && let Some((p, rules, r)) = ratio.as_mut()
                    {
                        r.record_request(p, reported);
                        ratio_model.request(rules, reported);
                        world.record(c as u32, "request", 0, 0);
                    }
                    told = true;
                    acquire(&mut world, &scenario, &mut breaker, &mut model, bug, c, caller, reported, before)?;
                }
            }
        }
        check_transition(&mut world, &scenario, &mut model, &breaker, reported, told)?;
        if let Some((_, _, r)) = ratio.as_ref() {
            ratio_model.check(&mut world, r)?;
        }
    }
    Err(world.violation("G13", "the scenario did not finish within 400000 steps".into()))
}

/// Asks the shared budget for a retry after a failure of `class`, and checks its answer
/// against the exact reference (G9, U1–U3). Returns the grant.
#[allow(clippy::too_many_arguments)]
fn ask_budget(
    world: &mut World,
    bucket: &mut Option<(TokenBucketPolicy, TokenBucket)>,
    ratio: &mut Option<(RatioBudgetPolicy, RatioRules, RatioBudget)>,
    (bucket_model, ratio_model): (&mut BucketModel, &mut RatioModel),
    bug: Option<BreakerBug>,
    class: RetryClass,
    now: Instant,
) -> Result<Option<Option<Grant>>, Violation> {
    if let Some((p, b)) = bucket.as_mut() {
        let balance = bucket_model.balance;
        let (expected, cost) = bucket_model.acquire(p, class);
        let got = b.try_acquire(p, class);
        let granted = got.is_ok() || bug == Some(BreakerBug::Overgrant);
        world.record(u32::MAX, "bucket asked", cost, u64::from(granted));
        world.check("G9", granted == expected, || {
            format!(
                "the bucket {} a retry costing {cost} at balance {balance}",
                if granted { "granted" } else { "refused" }
            )
        })?;
        bucket_model.check(world, p, b)?;
        return Ok(granted.then_some(got.ok()));
    }
    if let Some((p, rules, r)) = ratio.as_mut() {
        let (expected, requests, retries) = ratio_model.retry(rules, now);
        let granted = r.try_acquire(p, now).is_ok() || bug == Some(BreakerBug::Overgrant);
        world.record(u32::MAX, "ratio asked", requests, retries);
        world.check("G9", granted == expected, || {
            format!(
                "the ratio budget {} retry {} over {requests} requests (ratio {} ppm, floor {})",
                if granted { "granted" } else { "refused" },
                retries + 1,
                rules.ratio_ppm,
                rules.floor_ppm
            )
        })?;
        return Ok(granted.then_some(None));
    }
    Ok(Some(None))
}

/// A caller asks the breaker to admit a call (G8, K3–K5).
#[allow(clippy::too_many_arguments)]
fn acquire(
    world: &mut World,
    scenario: &BreakerScenario,
    breaker: &mut Breaker,
    model: &mut Model,
    bug: Option<BreakerBug>,
    c: usize,
    caller: &mut Caller,
    reported: Instant,
    before: BreakerStatus,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let result = breaker.try_acquire(policy, reported, world.rng());
    let probes_before = model.breaker.probes().len() as u32;
    let answer = model.breaker.acquire(policy, &model.rules, reported, open_until(breaker));
    let after = breaker.status();
    let subject = c as u32;
    let permit = match result {
        Ok(permit) => permit,
        Err(rejected) => {
            world.record(subject, "rejected", rejected.retry_after.map_or(u64::MAX, |d| d.as_nanos() as u64), 0);
            let bugged = matches!(
                (bug, before, after),
                (Some(BreakerBug::ExtraProbe), BreakerStatus::HalfOpen { .. }, BreakerStatus::HalfOpen { .. })
                    | (Some(BreakerBug::AdmitWhileOpen), BreakerStatus::Open { .. }, _)
            );
            if bugged {
                // The defect: the call goes through anyway, as a probe the breaker does not hold.
                if let BreakerStatus::Open { until } = before {
                    return world
                        .check("G8", world.now >= until, || format!("a call admitted while open until {until:?}"));
                }
                let out = probes_before + 1;
                return world.check("G8", out <= policy.half_open_permits(), || {
                    format!("{out} probes admitted in half-open, permits {}", policy.half_open_permits())
                });
            }
            world.check("model", answer == Err(rejected), || {
                format!("a call was rejected ({rejected:?}) while {before:?}; the model answers {answer:?}")
            })?;
            let wait =
                rejected.retry_after.unwrap_or(Duration::from_nanos(scenario.gap_ns)).max(Duration::from_nanos(1));
            caller.at = world.now.saturating_add(wait);
            return Ok(());
        }
    };
    world.record(subject, "admitted", u64::from(permit.id()), u64::from(permit.is_probe()));
    model.last_permit = Some(permit);
    match before {
        BreakerStatus::Open { until } => {
            world.check("G8", world.now >= until, || format!("a call admitted while open until {until:?}"))?;
        }
        BreakerStatus::Isolated => return Err(world.violation("G8", "a call admitted while isolated".into())),
        _ => {}
    }
    let probe = matches!(breaker.status(), BreakerStatus::HalfOpen { .. });
    if let BreakerStatus::HalfOpen { permits } = breaker.status() {
        world.check("G8", permits <= policy.half_open_permits(), || {
            format!("{permits} probes admitted in half-open, permits {}", policy.half_open_permits())
        })?;
    }
    let got = PermitModel::of(&permit);
    world.check("model", answer == Ok(got), || format!("admitted {got:?}, the model answers {answer:?}"))?;
    let faulty = world.now < scenario.horizon;
    let mut longest = scenario.call_ns;
    if !faulty {
        // Past the horizon calls are fast: never slow, never past a probe lease.
        let slow = scenario.slow.map_or(u64::MAX, |(_, t)| t.as_nanos() as u64);
        longest = longest.min(slow.saturating_sub(1)).min(policy.probe_timeout().as_nanos() as u64 - 1);
    }
    let took = world.between(0, longest);
    let outcome = if faulty && world.chance(scenario.failure_rate) {
        CallOutcome::Failure
    } else if faulty && world.chance(scenario.ignore_rate) {
        CallOutcome::Ignored
    } else {
        CallOutcome::Success
    };
    let lost = faulty && probe && world.chance(scenario.lost_rate);
    caller.call = Some(Call { permit, ends: world.now.saturating_add(Duration::from_nanos(took)), outcome, lost });
    Ok(())
}

/// A caller records its call's outcome (K5, G12, and the model); returns whether it was
/// accepted.
fn record(
    world: &mut World,
    scenario: &BreakerScenario,
    breaker: &mut Breaker,
    model: &mut Model,
    c: usize,
    call: Call,
    reported: Instant,
) -> Result<bool, Violation> {
    let policy = &scenario.policy;
    let permit = call.permit;
    let before = *breaker;
    world.record(c as u32, "record", u64::from(permit.id()), call.outcome as u64);
    let result = breaker.record(policy, reported, permit, call.outcome, world.rng());
    if permit.generation() != before.generation() {
        world.check("K5", matches!(result, Err(BreakerError::Stale { .. })), || {
            format!("a stale permit {permit:?} was not refused as stale: {result:?}")
        })?;
        world.check("G12", *breaker == before, || "a refused record changed the breaker".into())?;
    } else {
        world.check("K5", result.is_ok(), || {
            format!("the permit {permit:?} of this generation was refused: {result:?}")
        })?;
    }
    model.recorded(world, policy, breaker, reported, (permit, call.outcome), result)?;
    Ok(result.is_ok())
}

/// After every input: half-open never holds more than `permits` probes nor a lease past the
/// time the breaker was told (G8); then the breaker against its model.
fn check_transition(
    world: &mut World,
    scenario: &BreakerScenario,
    model: &mut Model,
    breaker: &Breaker,
    reported: Instant,
    told: bool,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let status = breaker.status();
    if breaker.generation() != model.traced {
        let (label, detail) = match status {
            BreakerStatus::Closed => ("breaker closed", 0),
            BreakerStatus::Open { until } => ("breaker opens until", until.as_nanos()),
            BreakerStatus::HalfOpen { permits } => ("breaker half-open", u64::from(permits)),
            BreakerStatus::Isolated => ("breaker isolated", 0),
            BreakerStatus::Disabled => ("breaker disabled", 0),
            BreakerStatus::MetricsOnly => ("breaker metrics-only", 0),
        };
        world.record(u32::MAX, label, detail, u64::from(breaker.generation()));
        model.traced = breaker.generation();
    }
    if let BreakerStatus::HalfOpen { permits } = status {
        world.check("G8", permits <= policy.half_open_permits(), || format!("{permits} probes out in half-open"))?;
        // Never wedged: every lease the model holds ends after the time the breaker was told.
        let earliest = model.breaker.probes().iter().map(|p| p.1).min();
        let expired = earliest.filter(|d| told && *d <= reported);
        world.check("G8", expired.is_none(), || format!("half-open with a lease that ended at {expired:?}"))?;
    }
    let (generation, previous_ns) = model.seen;
    if let (Phase::Open { until }, BreakerStatus::Open { until: drawn_until }) = (&model.breaker.phase, status)
        && model.breaker.generation != generation
    {
        // K3: a new opening lasts the open backoff's next delay, as the breaker drew it: from
        // the instant the model opened at to where the breaker's open period ends, within the
        // bounds of the opening's place in the schedule (the model adopts the draw clamped to
        // them, so this comes first).
        let at_ns = until.as_nanos().saturating_sub(model.breaker.last_open_ns);
        let drawn_ns = drawn_until.as_nanos().saturating_sub(at_ns);
        let n = model.breaker.openings;
        let (lo, hi) = delay_bounds(policy.open_backoff(), n, previous_ns);
        world.check("K3", (lo..=hi).contains(&drawn_ns), || {
            format!("opening {n} lasts {drawn_ns} ns, outside {lo}..={hi}")
        })?;
    }
    let result = model.breaker.check(world, policy, false, breaker);
    model.seen = (model.breaker.generation, model.breaker.last_open_ns);
    result
}

/// Feeds a permit the breaker must refuse, and checks nothing changes (K5, G12) and the model
/// refuses it alike.
#[allow(clippy::too_many_arguments)]
fn misuse(
    world: &mut World,
    policy: &BreakerPolicy,
    breaker: &mut Breaker,
    other: &mut Breaker,
    model: &mut Model,
    now: Instant,
) -> Result<(), Violation> {
    let before = *breaker;
    let outcome = world.pick(&[CallOutcome::Success, CallOutcome::Failure, CallOutcome::Ignored]);
    let (what, permit, result) = match (world.between(0, 2), model.last_permit) {
        (0, Some(permit)) if permit.generation() != breaker.generation() => {
            ("stale", permit, breaker.record(policy, now, permit, outcome, world.rng()))
        }
        (1, _) if model.breaker.in_flight() == 0 && breaker.status() == BreakerStatus::Closed => {
            // A permit recorded twice: refused when none of its state is outstanding.
            let permit =
                breaker.try_acquire(policy, now, world.rng()).map_err(|e| world.violation("K1", format!("{e}")))?;
            let answer = model.breaker.acquire(policy, &model.rules, now, open_until(breaker));
            world.check("model", answer == Ok(PermitModel::of(&permit)), || {
                format!("admitted {permit:?}, the model answers {answer:?}")
            })?;
            let result = breaker.record(policy, now, permit, CallOutcome::Ignored, world.rng());
            model.recorded(world, policy, breaker, now, (permit, CallOutcome::Ignored), result)?;
            let snapshot = *breaker;
            let result = breaker.record(policy, now, permit, outcome, world.rng());
            world.record(0, "misuse: recorded twice", u64::from(permit.id()), 0);
            world.check("K5", matches!(result, Err(BreakerError::NotOutstanding { .. })), || {
                format!("a permit recorded twice was not refused: {result:?}")
            })?;
            world.check("G12", *breaker == snapshot, || "a refused record changed the breaker".into())?;
            return model.recorded(world, policy, breaker, now, (permit, outcome), result);
        }
        _ => {
            let Ok(permit) = other.try_acquire(policy, now, world.rng()) else { return Ok(()) };
            ("foreign", permit, breaker.record(policy, now, permit, outcome, world.rng()))
        }
    };
    world.record(0, "misuse fed", 0, u64::from(what == "stale"));
    let expected = match what {
        "stale" => matches!(result, Err(BreakerError::Stale { .. })),
        _ => matches!(result, Err(BreakerError::Foreign { .. })),
    };
    world.check("K5", expected, || format!("a {what} permit was not refused as {what}: {result:?}"))?;
    world.check("G12", *breaker == before, || "a refused record changed the breaker".into())?;
    model.recorded(world, policy, breaker, now, (permit, outcome), result)
}
