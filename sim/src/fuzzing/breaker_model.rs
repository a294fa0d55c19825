//! The circuit breaker (K1–K5, G8, G12) against a reference model whose window is a plain list
//! of calls, with permits that may be stale, replayed or foreign.

use arbitrary::Arbitrary;
use persevere::{
    Breaker, BreakerError, BreakerPolicy, BreakerPolicyBuilder, BreakerReason, BreakerState, BreakerStatus,
    BreakerWindow, CallOutcome, Instant, MAX_PERMITS, MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS, Permit,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::{BackoffIn, check_delay};

use crate::model::breaker::{BreakerModel as Model, PPM, PermitModel, Phase, Rules, open_until};

use super::{At, Clock, Count, Ctx, ErrorKind, Fraction, SETUP, Span, ensure, nanos, nanos_sat, parse, rng, verdict};

/// The widest time-window bucket a policy accepts (about 18 years), as its `LimitTooLarge`
/// error documents.
const MAX_BUCKET_WIDTH_NS: u64 = (1 << 59) - 1;

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum WindowIn {
    Default,
    Calls(Count),
    Time(Span, Count),
}

#[derive(Arbitrary, Clone, Debug)]
struct Config {
    open: BackoffIn,
    consecutive: Option<Count>,
    failure_rate: Option<Fraction>,
    slow_rate: Option<Fraction>,
    slow_threshold: Option<Span>,
    window: WindowIn,
    minimum_calls: Option<Count>,
    permits: Count,
    successes_to_close: Option<Count>,
    probe_timeout: Option<Span>,
    id: u32,
    seed: u64,
}

/// A rate as parts per million, rounded to the nearest (as documented), and the reasons it is
/// refused.
fn rate(rate: Option<f64>, reasons: &mut Vec<ErrorKind>) -> u64 {
    let Some(rate) = rate else { return PPM + 1 };
    if !rate.is_finite() {
        reasons.push(ErrorKind::NotFinite);
        return PPM + 1;
    }
    if !(0.0..=1.0).contains(&rate) {
        reasons.push(ErrorKind::FractionOutOfRange);
        return PPM + 1;
    }
    let ppm = (rate * PPM as f64).round() as u64;
    if ppm == 0 {
        reasons.push(ErrorKind::Zero);
    }
    ppm
}

fn build(config: &Config) -> Option<(BreakerPolicy, Rules)> {
    let open = config.open.build()?;
    let mut builder = BreakerPolicy::builder(open);
    builder.consecutive_failures = config.consecutive.map(Count::get);
    builder.failure_rate = config.failure_rate.map(Fraction::get);
    builder.slow_call_rate = config.slow_rate.map(Fraction::get);
    builder.slow_call_threshold = config.slow_threshold.map(Span::get);
    builder.window = match config.window {
        WindowIn::Default => builder.window,
        WindowIn::Calls(n) => BreakerWindow::Calls(n.get()),
        WindowIn::Time(span, buckets) => BreakerWindow::Time { span: span.get(), buckets: buckets.get() },
    };
    builder.minimum_calls = config.minimum_calls.map(Count::get);
    builder.half_open_permits = config.permits.get();
    builder.successes_to_close = config.successes_to_close.map(Count::get);
    if let Some(timeout) = config.probe_timeout {
        builder.probe_timeout = timeout.get();
    }

    let mut reasons = Vec::new();
    if builder.consecutive_failures.is_none() && builder.failure_rate.is_none() && builder.slow_call_rate.is_none() {
        reasons.push(ErrorKind::Zero);
    }
    if builder.consecutive_failures == Some(0) {
        reasons.push(ErrorKind::Zero);
    }
    let failure_ppm = rate(builder.failure_rate, &mut reasons);
    let slow_ppm = rate(builder.slow_call_rate, &mut reasons);
    match builder.slow_call_threshold {
        None if builder.slow_call_rate.is_some() => reasons.push(ErrorKind::Zero),
        Some(d) if d.is_zero() => reasons.push(ErrorKind::Zero),
        _ => {}
    }
    let (calls, width_ns, buckets, default_minimum) = match builder.window {
        BreakerWindow::Calls(n) => {
            if n == 0 {
                reasons.push(ErrorKind::Zero);
            }
            if n > MAX_WINDOW_CALLS {
                reasons.push(ErrorKind::LimitTooLarge);
            }
            (Some(n), 0, 0, n)
        }
        BreakerWindow::Time { span, buckets } => {
            if buckets == 0 {
                reasons.push(ErrorKind::Zero);
            }
            if buckets > MAX_WINDOW_BUCKETS {
                reasons.push(ErrorKind::LimitTooLarge);
            }
            let width = match nanos(span) {
                None => {
                    reasons.push(ErrorKind::DurationOverflow);
                    1
                }
                Some(ns) => ns / u64::from(buckets.max(1)),
            };
            if width == 0 {
                reasons.push(ErrorKind::Zero);
            }
            if width > MAX_BUCKET_WIDTH_NS {
                reasons.push(ErrorKind::LimitTooLarge);
            }
            (None, width, buckets, 100)
        }
    };
    let minimum = builder.minimum_calls.unwrap_or(default_minimum);
    if builder.minimum_calls == Some(0) {
        reasons.push(ErrorKind::Zero);
    }
    if calls.is_some_and(|n| minimum > n) {
        reasons.push(ErrorKind::Conflict);
    }
    if builder.half_open_permits == 0 {
        reasons.push(ErrorKind::Zero);
    }
    if builder.half_open_permits > MAX_PERMITS {
        reasons.push(ErrorKind::LimitTooLarge);
    }
    if builder.successes_to_close == Some(0) {
        reasons.push(ErrorKind::Zero);
    }
    match nanos(builder.probe_timeout) {
        None => reasons.push(ErrorKind::DurationOverflow),
        Some(0) => reasons.push(ErrorKind::Zero),
        Some(_) => {}
    }
    let policy = verdict("breaker policy", builder.build(), &reasons)?;
    let rebuilt = BreakerPolicyBuilder::from(policy).build();
    ensure!(SETUP, rebuilt == Ok(policy), "K1", "the policy does not rebuild to itself: {rebuilt:?}");
    let rules = Rules {
        consecutive: builder.consecutive_failures.map_or(u64::MAX, u64::from),
        failure_ppm,
        slow_ppm,
        slow_ns: builder.slow_call_threshold.map_or(u64::MAX, nanos_sat),
        calls,
        width_ns,
        buckets,
        minimum,
        permits: builder.half_open_permits,
        close_after: builder.successes_to_close.unwrap_or(builder.half_open_permits),
        probe_ns: nanos_sat(builder.probe_timeout),
    };
    Some((policy, rules))
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum PermitPick {
    Latest,
    Back(u8),
    Foreign,
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum OutcomeIn {
    Success,
    Failure,
    Ignored,
}

/// One step. `Acquire2` and `Record2` only make acquiring and recording twice as likely a
/// choice for the fuzzer; [`Op::meaning`] reads them as `Acquire` and a `Record` without a
/// measured duration.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op {
    Acquire(At),
    Acquire2(At),
    Record {
        at: At,
        pick: PermitPick,
        outcome: OutcomeIn,
        duration: Option<Span>,
    },
    Record2 {
        at: At,
        pick: PermitPick,
        outcome: OutcomeIn,
    },
    Timeout(At),
    Isolate(At),
    Disable(At),
    Reset(At),
    /// The breaker is driven under another policy from now on (a replaced policy, or a state
    /// loaded under a new one): this window, these permits, the rate rules kept or dropped.
    Repolicy {
        window: WindowIn,
        permits: Count,
        rates: bool,
    },
    /// Back to the configuration's own policy.
    Restore,
}

impl Op {
    /// The step with the weighting twins folded into the variants they stand for.
    fn meaning(self) -> Op {
        match self {
            Op::Acquire2(at) => Op::Acquire(at),
            Op::Record2 { at, pick, outcome } => Op::Record { at, pick, outcome, duration: None },
            op => op,
        }
    }
}

/// How many permits the driver remembers (newest kept).
const PERMITS_KEPT: usize = 64;

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some((first_policy, first_rules)) = build(&config) else { return };
    let (mut policy, mut rules) = (first_policy, first_rules);
    // Whether the breaker has been driven under another policy than its first.
    let mut switched = false;
    let mut rng = rng(config.seed);
    let mut machine = Breaker::new(&policy, config.id);
    let mut foreign = Breaker::new(&policy, config.id.wrapping_add(1));
    foreign.handle_disable(Instant::ZERO);
    let mut model = Model::new(config.id, &rules);
    let mut permits: Vec<Permit> = Vec::new();
    let mut clock = Clock::default();
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let was = model.clone();
        match op.meaning() {
            Op::Acquire(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let got = machine.try_acquire(&policy, now, &mut rng);
                let expected = model.acquire(&policy, &rules, now, open_until(&machine));
                if let Ok(permit) = &got {
                    match was.phase {
                        Phase::Isolated => ensure!(ctx, false, "G8", "a call was admitted while isolated"),
                        Phase::Open { until } => {
                            let effective = was.last_now.later(now);
                            ensure!(
                                ctx,
                                effective >= until,
                                "G8",
                                "a call was admitted at {effective:?}, open until {until:?}"
                            );
                            ensure!(
                                ctx,
                                permit.is_probe(),
                                "K4",
                                "an open breaker admitted a call that is not a probe"
                            );
                        }
                        Phase::HalfOpen { .. } => {
                            ensure!(ctx, permit.is_probe(), "K4", "a half-open breaker admitted a non-probe")
                        }
                        Phase::Closed(_) | Phase::Disabled => {
                            ensure!(ctx, !permit.is_probe(), "K5", "a closed call is a probe")
                        }
                    }
                    if let BreakerStatus::HalfOpen { permits } = machine.status() {
                        // G8: a probe is admitted only while fewer than the policy's permits are out.
                        ensure!(
                            ctx,
                            permits <= policy.half_open_permits(),
                            "G8",
                            "{permits} probes out after an admission (permits {})",
                            policy.half_open_permits()
                        );
                    }
                    permits.push(*permit);
                    if permits.len() > PERMITS_KEPT {
                        let _ = permits.remove(0);
                    }
                }
                let got = got.map(|p| PermitModel::of(&p));
                ensure!(ctx, got == expected, "model", "try_acquire gave {got:?}, the model expects {expected:?}");
                if got.is_err() && matches!(was.phase, Phase::Isolated) {
                    ensure!(ctx, machine == before, "K1", "a rejection by an isolated breaker changed it");
                }
            }
            Op::Record { at, pick, outcome, duration } => {
                record(
                    ctx,
                    &policy,
                    &rules,
                    &mut machine,
                    &mut model,
                    &mut foreign,
                    &mut permits,
                    &mut clock,
                    (at, pick, outcome, duration),
                    &mut rng,
                    before,
                );
            }
            Op::Timeout(at) => {
                let now = clock.at(at, machine.poll_timeout());
                machine.handle_timeout(&policy, now, &mut rng);
                model.timeout(&policy, now, open_until(&machine));
                let due = was.poll_timeout().is_some_and(|t| t <= was.last_now.later(now));
                if !due {
                    ensure!(ctx, machine == before, "K1", "an early or spurious handle_timeout changed the breaker");
                }
            }
            Op::Isolate(at) => {
                let now = clock.at(at, machine.poll_timeout());
                model.isolate(now);
                machine.handle_isolate(now);
            }
            Op::Disable(at) => {
                let now = clock.at(at, machine.poll_timeout());
                model.disable(now);
                machine.handle_disable(now);
            }
            Op::Reset(at) => {
                let now = clock.at(at, machine.poll_timeout());
                model.reset(&rules, now);
                machine.handle_reset(&policy, now);
            }
            Op::Repolicy { window, permits, rates } => {
                let mut other = config.clone();
                other.window = window;
                other.permits = permits;
                if !rates {
                    other.failure_rate = None;
                    other.slow_rate = None;
                    other.consecutive = other.consecutive.or(Some(Count::Small(3)));
                }
                // An invalid policy is refused by its builder (as the model expects): no switch.
                if let Some((p, r)) = build(&other) {
                    (policy, rules, switched) = (p, r, true);
                }
                ensure!(ctx, machine == before, "K1", "a new policy changed the breaker before any input");
            }
            Op::Restore => {
                (policy, rules) = (first_policy, first_rules);
            }
            Op::Acquire2(_) | Op::Record2 { .. } => unreachable!("`meaning` folds the twins"),
        }
        // An open period that ends at `Instant::MAX` saturated: the draw was at least what
        // fits, and is not observable (the model adopts what fits, and both end there).
        if let (Phase::Open { until }, Some(drawn_until)) = (&model.phase, open_until(&machine))
            && model.generation != was.generation
            && drawn_until != Instant::MAX
        {
            // K3: a new opening lasts the open backoff's next delay, as the machine drew it
            // (the model's own is that draw clamped to the bounds): from the instant the model
            // opened at, to where the machine's open period ends.
            let at_ns = until.as_nanos().saturating_sub(model.last_open_ns);
            let drawn_ns = drawn_until.as_nanos().saturating_sub(at_ns);
            check_delay(ctx, policy.open_backoff(), model.openings, was.last_open_ns, drawn_ns);
        }
        check_state(ctx, &policy, switched, &machine, &model);
        let by_hand = matches!(op.meaning(), Op::Isolate(_) | Op::Disable(_) | Op::Reset(_));
        check_events(ctx, &rules, by_hand, &before, &mut machine);
    }
}

/// O1: the events of one input lead, one per change of kind, from where the breaker was before
/// it to where it is after it, each in a newer generation and at an instant within the input's
/// span of time, each with a reason that can make that change (a change by hand for an input
/// by hand; a rate only when the policy has that rate), and none is pushed out unseen.
fn check_events(ctx: Ctx<'_>, rules: &Rules, by_hand: bool, before: &Breaker, machine: &mut Breaker) {
    let (mut kind, mut generation) = (before.status().state(), before.generation());
    let mut count = 0;
    while let Some(event) = machine.poll_event() {
        count += 1;
        ensure!(ctx, event.from.state() == kind, "O1", "{event:?} does not start where the breaker was, {kind:?}");
        ensure!(ctx, event.to.state() != kind, "O1", "{event:?} is not a change of kind");
        let newer = event.generation.wrapping_sub(generation);
        ensure!(ctx, (1..=8).contains(&newer), "O1", "{event:?} is not newer than generation {generation}");
        ensure!(
            ctx,
            before.now() <= event.at && event.at <= machine.now(),
            "O1",
            "{event:?} is not within the input's time, {:?}..={:?}",
            before.now(),
            machine.now()
        );
        ensure!(
            ctx,
            event.open_for().is_some() == (event.to.state() == persevere::BreakerState::Open),
            "O1",
            "{event:?}"
        );
        ensure!(
            ctx,
            reason_fits(rules, by_hand, event.from.state(), event.to.state(), event.reason),
            "O1",
            "{event:?} gives a reason that cannot make this change ({})",
            if by_hand { "an input by hand" } else { "an input of the breaker's own" }
        );
        (kind, generation) = (event.to.state(), event.generation);
    }
    let status = machine.status();
    ensure!(ctx, kind == status.state(), "O1", "the breaker is {status:?}, its events end at {kind:?}");
    ensure!(ctx, count <= 3 && machine.dropped_events() == 0, "O1", "{count} events from one input");
}

/// Whether `reason` can make the change `from` → `to` (K2–K4, O1).
fn reason_fits(rules: &Rules, by_hand: bool, from: BreakerState, to: BreakerState, reason: BreakerReason) -> bool {
    use BreakerReason as R;
    use BreakerState as S;
    if by_hand {
        return reason == R::ByHand;
    }
    match (from, to, reason) {
        (S::Open, S::HalfOpen, R::OpenPeriodEnded) | (S::HalfOpen, S::Closed, R::ProbesSucceeded) => true,
        (S::HalfOpen, S::Open, R::ProbeFailed | R::ProbeExpired) => true,
        (S::Closed, S::Open, R::ConsecutiveFailures) => rules.consecutive != u64::MAX,
        (S::Closed | S::HalfOpen, S::Open, R::FailureRate) => rules.failure_ppm <= PPM,
        (S::Closed | S::HalfOpen, S::Open, R::SlowCallRate) => rules.slow_ppm <= PPM,
        _ => false,
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    ctx: Ctx<'_>,
    policy: &BreakerPolicy,
    rules: &Rules,
    machine: &mut Breaker,
    model: &mut Model,
    foreign: &mut Breaker,
    permits: &mut [Permit],
    clock: &mut Clock,
    (at, pick, outcome, duration): (At, PermitPick, OutcomeIn, Option<Span>),
    rng: &mut ChaCha8Rng,
    before: Breaker,
) {
    let now = clock.at(at, machine.poll_timeout());
    let permit = match pick {
        PermitPick::Foreign => foreign.try_acquire(policy, now, rng).ok(),
        PermitPick::Latest => permits.last().copied(),
        PermitPick::Back(k) => permits.len().checked_sub(1 + usize::from(k)).map(|i| permits[i]),
    };
    let Some(permit) = permit else { return };
    let outcome = match outcome {
        OutcomeIn::Success => CallOutcome::Success,
        OutcomeIn::Failure => CallOutcome::Failure,
        OutcomeIn::Ignored => CallOutcome::Ignored,
    };
    let elapsed_ns = match duration {
        Some(d) => nanos_sat(d.get()),
        None => now.as_nanos().saturating_sub(permit.acquired_at().as_nanos()),
    };
    let got = match duration {
        Some(d) => machine.record_with_duration(policy, now, permit, outcome, d.get(), rng),
        None => machine.record(policy, now, permit, outcome, rng),
    };
    let expected = model.record(policy, rules, now, PermitModel::of(&permit), outcome, elapsed_ns, open_until(machine));
    if permit.breaker() != machine.id() {
        ensure!(
            ctx,
            matches!(got, Err(BreakerError::Foreign { .. })),
            "K5",
            "a foreign permit was not refused: {got:?}"
        );
    } else if permit.generation() != before.generation() {
        ensure!(ctx, matches!(got, Err(BreakerError::Stale { .. })), "K5", "a stale permit was not refused: {got:?}");
    }
    if got.is_err() {
        ensure!(ctx, *machine == before, "G12", "a refused permit changed the breaker");
    }
    ensure!(ctx, got == expected, "model", "record gave {got:?}, the model expects {expected:?}");
}

fn check_state(ctx: Ctx<'_>, policy: &BreakerPolicy, switched: bool, machine: &Breaker, model: &Model) {
    let _ = model.check(&mut ctx.judge(), policy, switched, machine);
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
