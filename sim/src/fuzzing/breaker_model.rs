//! The circuit breaker (K1–K5, G8, G12) against a reference model whose window is a plain list
//! of calls, with permits that may be stale, replayed or foreign.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Breaker, BreakerError, BreakerPolicy, BreakerPolicyBuilder, BreakerReason, BreakerState, BreakerStatus,
    BreakerWindow, CallOutcome, Instant, MAX_PERMITS, MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS, Permit, Rejected,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::{BackoffIn, check_delay};
use crate::model::backoff::{adopt, delay_bounds};

use crate::model::breaker::{PPM, Rules, Window};

use super::{At, Clock, Count, Ctx, ErrorKind, Fraction, SETUP, Span, ensure, nanos, nanos_sat, parse, rng, verdict};

const PROBE_BIT: u32 = 1 << 31;
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

#[derive(Clone, Debug)]
enum Phase {
    Closed(Window),
    Open { until: Instant },
    HalfOpen { probes: Vec<(u32, Instant)>, successes: u32 },
    Isolated,
    Disabled,
}

/// What a [`Breaker`] must be, restated from K1–K5.
#[derive(Clone, Debug)]
struct Model {
    id: u32,
    phase: Phase,
    generation: u32,
    next_id: u32,
    in_flight: u32,
    last_now: Instant,
    openings: u32,
    last_open_ns: u64,
}

/// What the model says a permit must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PermitModel {
    breaker: u32,
    generation: u32,
    id: u32,
    acquired_at: Instant,
}

impl PermitModel {
    fn of(permit: &Permit) -> Self {
        PermitModel {
            breaker: permit.breaker(),
            generation: permit.generation(),
            id: permit.id(),
            acquired_at: permit.acquired_at(),
        }
    }
}

impl Model {
    fn status(&self) -> BreakerStatus {
        match &self.phase {
            Phase::Closed(_) => BreakerStatus::Closed,
            Phase::Open { until } => BreakerStatus::Open { until: *until },
            Phase::HalfOpen { probes, .. } => BreakerStatus::HalfOpen { permits: probes.len() as u32 },
            Phase::Isolated => BreakerStatus::Isolated,
            Phase::Disabled => BreakerStatus::Disabled,
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Open { until } => Some(*until),
            Phase::HalfOpen { probes, .. } => probes.iter().map(|p| p.1).min(),
            _ => None,
        }
    }

    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.generation = self.generation.wrapping_add(1);
        self.in_flight = 0;
    }

    /// K3: opens for the next open duration, counted from `at` (or the latest time seen), by
    /// an input at `now`. The duration is the one the machine drew ([`adopt`]): `observed` is
    /// where its open period ends after the same input, `None` when it is no longer open (then
    /// the period ended by `now`, so it was at most `now - at`).
    fn open(&mut self, policy: &BreakerPolicy, at: Instant, now: Instant, observed: Option<Instant>) {
        let at = self.last_now.later(at);
        self.openings = self.openings.saturating_add(1);
        let bounds = delay_bounds(policy.open_backoff(), self.openings, self.last_open_ns);
        self.last_open_ns = adopt(Some(observed.unwrap_or(now)), at, bounds, |_| false);
        self.last_now = at;
        self.enter(Phase::Open { until: at.saturating_add(Duration::from_nanos(self.last_open_ns)) });
    }

    /// K4: a lease past its deadline is a failure at that deadline.
    fn expire(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        if let Phase::HalfOpen { probes, .. } = &self.phase
            && let Some(earliest) = probes.iter().map(|p| p.1).min()
            && earliest <= now
        {
            self.open(policy, earliest, now, observed);
            self.last_now = self.last_now.later(now);
        }
    }

    /// Everything due at `now` in one step: overdue leases expire (reopening at the earliest
    /// deadline), then an open period that has ended turns half-open.
    fn settle(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        self.expire(policy, now, observed);
        if let Phase::Open { until } = self.phase
            && until <= now
        {
            self.last_now = now;
            self.enter(Phase::HalfOpen { probes: Vec::new(), successes: 0 });
        }
    }

    fn issue(&mut self, now: Instant) -> PermitModel {
        let id = self.next_id;
        self.next_id = (id + 1) & !PROBE_BIT;
        self.in_flight = self.in_flight.wrapping_add(1);
        PermitModel { breaker: self.id, generation: self.generation, id, acquired_at: now }
    }

    fn acquire(
        &mut self,
        policy: &BreakerPolicy,
        rules: &Rules,
        now: Instant,
        observed: Option<Instant>,
    ) -> Result<PermitModel, Rejected> {
        match self.phase {
            Phase::Closed(_) | Phase::Disabled => return Ok(self.issue(now)),
            Phase::Isolated => return Err(Rejected { retry_after: None }),
            Phase::Open { until } if now < until && self.last_now < until => {
                return Err(Rejected { retry_after: Some(until.saturating_duration_since(self.last_now.later(now))) });
            }
            _ => {}
        }
        let now = self.last_now.later(now);
        self.settle(policy, now, observed);
        match &mut self.phase {
            Phase::HalfOpen { probes, .. } => {
                if probes.len() as u32 >= rules.permits {
                    let earliest = probes.iter().map(|p| p.1).min().unwrap_or(now);
                    return Err(Rejected { retry_after: Some(earliest.saturating_duration_since(now)) });
                }
                let id = self.next_id | PROBE_BIT;
                self.next_id = (self.next_id + 1) & !PROBE_BIT;
                probes.push((id, now.saturating_add(Duration::from_nanos(rules.probe_ns))));
                self.last_now = now;
                Ok(PermitModel { breaker: self.id, generation: self.generation, id, acquired_at: now })
            }
            Phase::Open { until } => Err(Rejected { retry_after: Some(until.saturating_duration_since(now)) }),
            _ => unreachable!("only an open or half-open breaker gets here"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        policy: &BreakerPolicy,
        rules: &Rules,
        now: Instant,
        permit: PermitModel,
        outcome: CallOutcome,
        elapsed_ns: u64,
        observed: Option<Instant>,
    ) -> Result<(), BreakerError> {
        if permit.breaker != self.id {
            return Err(BreakerError::Foreign { this: self.id, got: permit.breaker });
        }
        if permit.generation != self.generation {
            return Err(BreakerError::Stale { current: self.generation, got: permit.generation });
        }
        match &mut self.phase {
            Phase::Closed(window) => {
                if self.in_flight == 0 {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                self.in_flight -= 1;
                if outcome != CallOutcome::Ignored
                    && window.push(rules, now, outcome == CallOutcome::Failure, elapsed_ns >= rules.slow_ns)
                {
                    self.open(policy, now, now, observed);
                }
                Ok(())
            }
            Phase::Disabled => {
                if self.in_flight == 0 {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                self.in_flight -= 1;
                Ok(())
            }
            Phase::HalfOpen { probes, .. } => {
                if !probes.iter().any(|p| p.0 == permit.id) {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                let now = self.last_now.later(now);
                // A lease that ended before its result came already counted as a failure.
                let generation = self.generation;
                self.settle(policy, now, observed);
                self.last_now = now;
                if self.generation != generation {
                    return Ok(());
                }
                let Phase::HalfOpen { probes, successes } = &mut self.phase else { return Ok(()) };
                probes.retain(|p| p.0 != permit.id);
                let failed = match outcome {
                    CallOutcome::Ignored => return Ok(()),
                    CallOutcome::Failure => true,
                    CallOutcome::Success => rules.slow_ppm <= PPM && elapsed_ns >= rules.slow_ns,
                };
                if failed {
                    self.open(policy, now, now, observed);
                } else {
                    *successes = successes.saturating_add(1);
                    if *successes >= rules.close_after {
                        self.openings = 0;
                        self.last_open_ns = 0;
                        self.enter(Phase::Closed(Window::new(rules)));
                    }
                }
                Ok(())
            }
            Phase::Open { .. } | Phase::Isolated => Err(BreakerError::NotOutstanding { id: permit.id }),
        }
    }

    fn timeout(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        let now = self.last_now.later(now);
        self.settle(policy, now, observed);
    }
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

/// Where `machine`'s open period ends, if it is open.
fn open_until(machine: &Breaker) -> Option<Instant> {
    match machine.status() {
        BreakerStatus::Open { until } => Some(until),
        _ => None,
    }
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some((first_policy, first_rules)) = build(&config) else { return };
    let (mut policy, mut rules) = (first_policy, first_rules);
    // Whether the breaker has been driven under another policy than its first.
    let mut switched = false;
    let mut rng = rng(config.seed);
    let mut machine = Breaker::new(&policy, config.id);
    let mut foreign = Breaker::new(&policy, config.id.wrapping_add(1));
    foreign.handle_disable(&policy, Instant::ZERO);
    let mut model = Model {
        id: config.id,
        phase: Phase::Closed(Window::new(&rules)),
        generation: 0,
        next_id: 0,
        in_flight: 0,
        last_now: Instant::ZERO,
        openings: 0,
        last_open_ns: 0,
    };
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
                model.last_now = model.last_now.later(now);
                model.enter(Phase::Isolated);
                machine.handle_isolate(&policy, now);
            }
            Op::Disable(at) => {
                let now = clock.at(at, machine.poll_timeout());
                model.last_now = model.last_now.later(now);
                model.enter(Phase::Disabled);
                machine.handle_disable(&policy, now);
            }
            Op::Reset(at) => {
                let now = clock.at(at, machine.poll_timeout());
                model.last_now = model.last_now.later(now);
                model.openings = 0;
                model.last_open_ns = 0;
                model.enter(Phase::Closed(Window::new(&rules)));
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
        if let (Phase::Open { until }, Some(drawn_until)) = (&model.phase, open_until(&machine))
            && model.generation != was.generation
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
    let status = machine.status();
    ensure!(ctx, status == model.status(), "model", "status {status:?}, the model expects {:?}", model.status());
    ensure!(
        ctx,
        machine.generation() == model.generation,
        "model",
        "generation {}, expected {}",
        machine.generation(),
        model.generation
    );
    ensure!(
        ctx,
        machine.openings() == model.openings,
        "K3",
        "{} openings, the model counts {}",
        machine.openings(),
        model.openings
    );
    let timeout = machine.poll_timeout();
    ensure!(
        ctx,
        timeout == model.poll_timeout(),
        "K4",
        "poll_timeout {timeout:?}, expected {:?}",
        model.poll_timeout()
    );
    match status {
        BreakerStatus::HalfOpen { permits } => {
            // Under a replaced policy with fewer permits, probes admitted before stay out (and
            // no more are admitted: see the acquisition).
            ensure!(
                ctx,
                switched || permits <= policy.half_open_permits(),
                "G8",
                "{permits} probes out (permits {})",
                policy.half_open_permits()
            );
            if permits > 0 {
                ensure!(
                    ctx,
                    timeout.is_some(),
                    "K4",
                    "probes are out but nothing times them out: the breaker could wedge"
                );
            }
        }
        BreakerStatus::Open { until } => {
            ensure!(ctx, timeout == Some(until), "K4", "open until {until:?} but poll_timeout is {timeout:?}")
        }
        _ => {}
    }
    if let Phase::Closed(window) = &model.phase {
        // A window without a rate rule counts no calls; one made under another policy keeps its
        // counts until its next recorded call rebuilds it.
        let expected = window.counts();
        let got = machine.window_counts();
        ensure!(ctx, got == Some(expected), "K2", "window counts {got:?}, the model counts {expected:?}");
    } else {
        ensure!(ctx, machine.window_counts().is_none(), "K2", "window counts outside the closed state");
    }
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
