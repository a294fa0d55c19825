//! Breaker scenarios: one real [`persevere::Breaker`] and one shared retry budget (a
//! [`persevere::TokenBucket`] or a [`persevere::RatioBudget`]) used by many simulated callers,
//! with drawn call durations and outcomes, lost probe results, and an operator who isolates,
//! disables and resets the breaker at random; checked after every input against reference
//! models of the breaker's window and probes and of the budget's exact arithmetic (G8, G9,
//! G12, G13, K2–K5, U1–U3).

use std::time::Duration;

use persevere::{
    Breaker, BreakerError, BreakerPolicy, BreakerStatus, CallOutcome, Grant, Instant, Permit, RatioBudget,
    RatioBudgetPolicy, RetryClass, TokenBucket, TokenBucketPolicy,
};

use crate::model::breaker::{PPM, Rules, Window};
use crate::model::budget::RatioWindow;
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
    /// A ratio budget (U2), with its floor in millionths of a retry, computed independently.
    Ratio(RatioBudgetPolicy, u64),
}

/// The drawn configuration of one breaker scenario (swarm testing: the seed chooses it).
#[derive(Clone, Debug)]
pub struct BreakerScenario {
    /// The breaker's policy.
    pub policy: BreakerPolicy,
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
        builder = if world.chance(500) {
            builder.count_window(window_calls)
        } else {
            builder.time_window(ms(world.between(16, 2_000)), world.between(1, 16) as u32)
        };
        if world.chance(700) {
            builder = builder.minimum_calls(world.between(1, u64::from(window_calls)) as u32);
        }
        builder = builder.half_open_permits(world.between(1, 4) as u32);
        if world.chance(500) {
            builder = builder.successes_to_close(world.between(1, 4) as u32);
        }
        builder = builder.probe_timeout(ms(world.between(5, 2_000)));
        let policy = builder.build().expect("drawn breaker policies are valid");
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
                let ratio = world.between(0, 1000) as f64 / 1000.0;
                let policy = RatioBudgetPolicy::builder(ratio)
                    .ttl(ms(ttl_ms))
                    .buckets(world.between(1, 16) as u32)
                    .min_retries_per_sec(per_sec as u32)
                    .build()
                    .expect("drawn ratio budgets are valid");
                // U3: the floor is min_retries_per_sec × ttl, in millionths, exactly.
                BudgetSpec::Ratio(policy, per_sec * ttl_ms * 1_000)
            }
        };
        BreakerScenario {
            policy,
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

/// The reference model of the breaker's closed-state window (K2) and of its probes (K4).
#[derive(Clone, Debug, Default)]
struct Model {
    generation: u32,
    /// Closed: the calls in the window (K2).
    window: Window,
    /// Closed: permits issued and not recorded in this generation.
    closed_out: u32,
    /// Half-open: probes out, as `(id, lease deadline)`.
    probes: Vec<(u32, Instant)>,
    /// An upper bound of the previous open duration (for a decorrelated open backoff).
    previous_open: u64,
    /// The latest permit the breaker issued (a stale one, once the breaker moves on).
    last_permit: Option<Permit>,
}

/// The reference model of the budget's arithmetic (U1–U3).
#[derive(Clone, Debug, Default)]
struct BudgetModel {
    balance: u64,
    granted_cost: u64,
    refunded: u64,
    charged_refused: u64,
    /// Ratio: the window (U2).
    window: RatioWindow,
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
        BudgetSpec::Ratio(p, floor) => Some((p, floor, RatioBudget::new())),
        _ => None,
    };
    let mut budget_model = BudgetModel { balance: bucket.map_or(0, |(p, _)| p.capacity_milli()), ..Default::default() };
    let mut model = Model::default();
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
            misuse(&mut world, policy, &mut breaker, &mut other, &model, reported)?;
        }
        let before = breaker.status();
        // Whether the breaker was told the time (a refused input tells it nothing).
        let mut told = false;
        match what {
            TIMEOUT => {
                told = true;
                world.record(u32::MAX, "breaker timeout", reported.as_nanos(), 0);
                breaker.handle_timeout(policy, reported, world.rng());
                // A second timeout at the same time changes nothing.
                let once = breaker;
                breaker.handle_timeout(policy, reported, world.rng());
                world.check("§3", breaker == once, || {
                    "a repeated timeout changed the breaker (handle_timeout twice must do nothing)".into()
                })?;
            }
            RESTORE => {
                restored = true;
                if matches!(before, BreakerStatus::Isolated | BreakerStatus::Disabled) {
                    world.record(u32::MAX, "operator restores", 0, 0);
                    breaker.handle_reset(policy, reported);
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
                        0 => breaker.handle_isolate(policy, reported),
                        1 => breaker.handle_disable(policy, reported),
                        _ => breaker.handle_reset(policy, reported),
                    }
                    check_transition(&mut world, &scenario, &mut model, &breaker, before, reported, false)?;
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
                                    &mut budget_model,
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
                                    let refund = match grant {
                                        Some(g) if p.settings().refund_retry_cost => g.cost_milli(),
                                        _ => p.settings().success_refund_milli,
                                    };
                                    let credited = refund.min(p.capacity_milli() - budget_model.balance);
                                    budget_model.balance += credited;
                                    budget_model.refunded += credited;
                                    world.record(c as u32, "budget refund", credited, b.balance_milli());
                                    world.check("G9", b.balance_milli() == budget_model.balance, || {
                                        format!(
                                            "bucket balance {} after a refund, the model says {}",
                                            b.balance_milli(),
                                            budget_model.balance
                                        )
                                    })?;
                                }
                            }
                            CallOutcome::Ignored => {}
                        }
                    }
                } else {
                    // A new request, or a retry the budget granted.
                    if caller.retry.is_none()
                        && let Some((p, _, r)) = ratio.as_mut()
                    {
                        r.record_request(p, reported);
                        budget_model.note(p, reported, false);
                        world.record(c as u32, "request", 0, 0);
                    }
                    told = true;
                    acquire(&mut world, &scenario, &mut breaker, &mut model, bug, c, caller, reported, before)?;
                }
            }
        }
        check_transition(&mut world, &scenario, &mut model, &breaker, before, reported, told)?;
        if let Some((_, _, r)) = ratio.as_ref() {
            let (requests, retries) = budget_model.counts();
            world.check("G9", (r.requests(), r.retries()) == (requests, retries), || {
                format!("ratio window holds {}/{}, the model {requests}/{retries}", r.requests(), r.retries())
            })?;
        }
    }
    Err(world.violation("G13", "the scenario did not finish within 400000 steps".into()))
}

impl BudgetModel {
    /// Counts a request or a granted retry at `now` in the ratio window.
    fn note(&mut self, policy: &RatioBudgetPolicy, now: Instant, retry: bool) {
        self.advance(policy, now);
        self.window.push(!retry);
    }

    /// Moves to `now`'s bucket (never backwards) and forgets what left the window.
    fn advance(&mut self, policy: &RatioBudgetPolicy, now: Instant) {
        self.window.advance(policy.bucket_width().as_nanos() as u64, policy.buckets(), now);
    }

    /// Requests and retries in the window.
    fn counts(&self) -> (u32, u32) {
        (self.window.requests() as u32, self.window.retries() as u32)
    }
}

/// Asks the shared budget for a retry after a failure of `class`, and checks its answer
/// against the exact reference (G9, U1–U3). Returns the grant.
#[allow(clippy::too_many_arguments)]
fn ask_budget(
    world: &mut World,
    bucket: &mut Option<(TokenBucketPolicy, TokenBucket)>,
    ratio: &mut Option<(RatioBudgetPolicy, u64, RatioBudget)>,
    model: &mut BudgetModel,
    bug: Option<BreakerBug>,
    class: RetryClass,
    now: Instant,
) -> Result<Option<Option<Grant>>, Violation> {
    if let Some((p, b)) = bucket.as_mut() {
        let cost = p.cost_milli(class);
        let (expected, after) = crate::model::budget::bucket_grants(model.balance, cost, p.settings().threshold_milli);
        let got = b.try_acquire(p, class);
        let granted = got.is_ok() || bug == Some(BreakerBug::Overgrant);
        world.record(u32::MAX, "bucket asked", cost, u64::from(granted));
        world.check("G9", granted == expected, || {
            format!(
                "the bucket {} a retry costing {cost} at balance {}",
                if granted { "granted" } else { "refused" },
                model.balance
            )
        })?;
        if expected {
            model.balance -= cost;
            model.granted_cost += cost;
        } else if p.settings().charge_refused {
            model.charged_refused += model.balance - after.unwrap_or(0);
            model.balance = after.unwrap_or(0);
        }
        world.check("G9", b.balance_milli() == model.balance, || {
            format!("bucket balance {}, the model says {}", b.balance_milli(), model.balance)
        })?;
        // Over the whole run: never more granted than the capacity plus what was refunded.
        world.check("G9", model.granted_cost + model.charged_refused <= p.capacity_milli() + model.refunded, || {
            "the bucket granted more than its capacity and refunds".into()
        })?;
        return Ok(granted.then_some(got.ok()));
    }
    if let Some((p, floor_ppm, r)) = ratio.as_mut() {
        model.advance(p, now);
        let (requests, retries) = model.counts();
        let expected =
            crate::model::budget::ratio_grants(u64::from(requests), u64::from(retries), p.ratio_ppm(), *floor_ppm);
        let granted = r.try_acquire(p, now).is_ok() || bug == Some(BreakerBug::Overgrant);
        world.record(u32::MAX, "ratio asked", u64::from(requests), u64::from(retries));
        world.check("G9", granted == expected, || {
            format!(
                "the ratio budget {} retry {} over {requests} requests (ratio {} ppm, floor {floor_ppm})",
                if granted { "granted" } else { "refused" },
                retries + 1,
                p.ratio_ppm()
            )
        })?;
        if granted {
            model.note(p, now, true);
        }
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
                model.probes.push((u32::MAX, reported.saturating_add(policy.probe_timeout())));
                world.check("G8", model.probes.len() as u32 <= policy.half_open_permits(), || {
                    format!(
                        "{} probes admitted in half-open, permits {}",
                        model.probes.len(),
                        policy.half_open_permits()
                    )
                })?;
                return Ok(());
            }
            match before {
                BreakerStatus::Open { until } => {
                    let (least, most) =
                        (until.saturating_duration_since(world.now), until.saturating_duration_since(reported));
                    world.check("K3", rejected.retry_after.is_some_and(|r| least <= r && r <= most), || {
                        format!("retry_after {:?} while open until {until:?}", rejected.retry_after)
                    })?;
                }
                BreakerStatus::Isolated => {
                    world.check("K1", rejected.retry_after.is_none(), || "an isolated breaker names a time".into())?;
                }
                BreakerStatus::Closed | BreakerStatus::Disabled | BreakerStatus::MetricsOnly => {
                    return Err(world.violation("K1", format!("a call rejected while {before:?}")));
                }
                BreakerStatus::HalfOpen { .. } => {
                    // Rejected only with every permit held, or after an expired lease reopened it.
                    let full = model.probes.len() as u32 >= policy.half_open_permits();
                    world.check("G8", full || matches!(after, BreakerStatus::Open { .. }), || {
                        format!(
                            "a half-open breaker with {} of {} probes out rejected a call",
                            model.probes.len(),
                            policy.half_open_permits()
                        )
                    })?;
                    // K3: it says when the earliest lease ends (or when it turns half-open again).
                    let until = match after {
                        BreakerStatus::Open { until } => Some(until),
                        _ => model.probes.iter().map(|p| p.1).min(),
                    };
                    let now = world.now;
                    let ok = until.is_some_and(|until| {
                        let (least, most) =
                            (until.saturating_duration_since(now), until.saturating_duration_since(reported));
                        rejected.retry_after.is_some_and(|r| least <= r && r <= most)
                    });
                    world.check("K3", ok, || {
                        format!("retry_after {:?} in half-open, until {until:?}", rejected.retry_after)
                    })?;
                }
            }
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
    world.check("K4", permit.is_probe() == probe, || format!("permit {permit:?} while {:?}", breaker.status()))?;
    if permit.generation() != model.generation {
        // The admission itself moved the breaker on (open → half-open).
        model.generation = permit.generation();
        model.probes.clear();
        model.closed_out = 0;
    }
    if probe {
        model.probes.push((permit.id(), permit.acquired_at().saturating_add(policy.probe_timeout())));
        world.check("G8", model.probes.len() as u32 <= policy.half_open_permits(), || {
            format!("{} probes admitted in half-open, permits {}", model.probes.len(), policy.half_open_permits())
        })?;
    } else {
        model.closed_out += 1;
    }
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

/// A caller records its call's outcome (K2, K4, K5, G12); returns whether it was accepted.
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
        return Ok(false);
    }
    world
        .check("K5", result.is_ok(), || format!("the permit {permit:?} of this generation was refused: {result:?}"))?;
    if permit.is_probe() {
        model.probes.retain(|(id, _)| *id != permit.id());
        return Ok(true);
    }
    model.closed_out = model.closed_out.saturating_sub(1);
    if before.status() != BreakerStatus::Closed || call.outcome == CallOutcome::Ignored {
        return Ok(true);
    }
    // K2: the closed window against the reference.
    let failed = call.outcome == CallOutcome::Failure;
    let elapsed = reported.as_nanos().saturating_sub(permit.acquired_at().as_nanos());
    let rules = rules(scenario);
    let trips = model.window.push(&rules, reported, failed, elapsed >= rules.slow_ns);
    let counts = model.window.counts();
    let opened = matches!(breaker.status(), BreakerStatus::Open { .. });
    world.check("K2", opened == trips, || format!("after {counts:?} the breaker is {:?}", breaker.status()))?;
    if let Some(got) = breaker.window_counts() {
        world.check("K2", got == counts, || format!("window {got:?}, the model {counts:?}"))?;
    }
    Ok(true)
}

/// The scenario's breaker rules, as the window model reads them.
fn rules(scenario: &BreakerScenario) -> Rules {
    let policy = &scenario.policy;
    let (calls, width_ns, buckets) = match policy.window() {
        persevere::BreakerWindow::Calls(n) => (Some(n), 0, 0),
        persevere::BreakerWindow::Time { span, buckets } => {
            (None, span.as_nanos() as u64 / u64::from(buckets), buckets)
        }
    };
    Rules {
        consecutive: scenario.consecutive.map_or(u64::MAX, u64::from),
        failure_ppm: scenario.failure_ppm.unwrap_or(PPM + 1),
        slow_ppm: scenario.slow.map_or(PPM + 1, |(ppm, _)| ppm),
        slow_ns: scenario.slow.map_or(u64::MAX, |(_, threshold)| threshold.as_nanos() as u64),
        calls,
        width_ns,
        buckets,
        minimum: policy.minimum_calls(),
        permits: policy.half_open_permits(),
        close_after: policy.successes_to_close(),
        probe_ns: policy.probe_timeout().as_nanos() as u64,
    }
}

/// After every input: a new generation clears the model; half-open never holds more than
/// `permits` probes nor a lease past its deadline (G8); open durations follow the backoff (K3).
fn check_transition(
    world: &mut World,
    scenario: &BreakerScenario,
    model: &mut Model,
    breaker: &Breaker,
    before: BreakerStatus,
    reported: Instant,
    told: bool,
) -> Result<(), Violation> {
    let policy = &scenario.policy;
    let status = breaker.status();
    if breaker.generation() != model.generation {
        let (label, detail) = match status {
            BreakerStatus::Closed => ("breaker closed", 0),
            BreakerStatus::Open { until } => ("breaker opens until", until.as_nanos()),
            BreakerStatus::HalfOpen { permits } => ("breaker half-open", u64::from(permits)),
            BreakerStatus::Isolated => ("breaker isolated", 0),
            BreakerStatus::Disabled => ("breaker disabled", 0),
            BreakerStatus::MetricsOnly => ("breaker metrics-only", 0),
        };
        world.record(u32::MAX, label, detail, u64::from(breaker.generation()));
        model.generation = breaker.generation();
        let earliest = model.probes.iter().map(|p| p.1).min();
        model.probes.clear();
        model.closed_out = 0;
        if status == BreakerStatus::Closed {
            model.window = Window::new(&rules(scenario));
        }
        if let BreakerStatus::Open { until } = status
            && !matches!(before, BreakerStatus::Open { .. })
        {
            // K3: the open period is the next delay of the open backoff, from the failure.
            let (lo, hi) = delay_bounds(policy.open_backoff(), breaker.openings(), model.previous_open);
            let from = earliest.map_or(reported, |e| e.earlier(reported));
            let now = world.now;
            world.check("K3", until <= now.saturating_add(Duration::from_nanos(hi)), || {
                format!("open until {until:?}, more than {hi} ns after {now:?}")
            })?;
            world.check("K3", until >= from.saturating_add(Duration::from_nanos(lo)), || {
                format!("open until {until:?}, less than {lo} ns after {from:?}")
            })?;
            model.previous_open = hi;
        }
    }
    if status == BreakerStatus::Closed && breaker.openings() == 0 {
        model.previous_open = 0;
    }
    if let BreakerStatus::HalfOpen { permits } = status {
        world.check("G8", permits <= policy.half_open_permits(), || format!("{permits} probes out in half-open"))?;
        world.check("K4", permits as usize == model.probes.len(), || {
            format!("the breaker holds {permits} probes, the model {}", model.probes.len())
        })?;
        // Never wedged: every lease still held ends after the time the breaker was told.
        let expired = model.probes.iter().map(|p| p.1).min().filter(|d| told && *d <= reported);
        world.check("G8", expired.is_none(), || format!("half-open with a lease that ended at {expired:?}"))?;
        let timeout = breaker.poll_timeout();
        let earliest = model.probes.iter().map(|p| p.1).min();
        world.check("G8", timeout == earliest, || {
            format!("wakes at {timeout:?}, the earliest lease ends {earliest:?}")
        })?;
    }
    Ok(())
}

/// Feeds a permit the breaker must refuse, and checks nothing changes (K5, G12).
#[allow(clippy::too_many_arguments)]
fn misuse(
    world: &mut World,
    policy: &BreakerPolicy,
    breaker: &mut Breaker,
    other: &mut Breaker,
    model: &Model,
    now: Instant,
) -> Result<(), Violation> {
    let before = *breaker;
    let outcome = world.pick(&[CallOutcome::Success, CallOutcome::Failure, CallOutcome::Ignored]);
    let (what, result) = match (world.between(0, 2), model.last_permit) {
        (0, Some(permit)) if permit.generation() != breaker.generation() => {
            ("stale", breaker.record(policy, now, permit, outcome, world.rng()))
        }
        (1, _) if model.closed_out == 0 && breaker.status() == BreakerStatus::Closed => {
            // A permit recorded twice: refused when none of its state is outstanding.
            let permit =
                breaker.try_acquire(policy, now, world.rng()).map_err(|e| world.violation("K1", format!("{e}")))?;
            breaker
                .record(policy, now, permit, CallOutcome::Ignored, world.rng())
                .map_err(|e| world.violation("K5", format!("{e}")))?;
            let snapshot = *breaker;
            let result = breaker.record(policy, now, permit, outcome, world.rng());
            world.record(0, "misuse: recorded twice", u64::from(permit.id()), 0);
            world.check("K5", matches!(result, Err(BreakerError::NotOutstanding { .. })), || {
                format!("a permit recorded twice was not refused: {result:?}")
            })?;
            return world.check("G12", *breaker == snapshot, || "a refused record changed the breaker".into());
        }
        _ => {
            let Ok(permit) = other.try_acquire(policy, now, world.rng()) else { return Ok(()) };
            ("foreign", breaker.record(policy, now, permit, outcome, world.rng()))
        }
    };
    world.record(0, "misuse fed", 0, u64::from(what == "stale"));
    let expected = match what {
        "stale" => matches!(result, Err(BreakerError::Stale { .. })),
        _ => matches!(result, Err(BreakerError::Foreign { .. })),
    };
    world.check("K5", expected, || format!("a {what} permit was not refused as {what}: {result:?}"))?;
    world.check("G12", *breaker == before, || "a refused record changed the breaker".into())
}
