//! One flow (F1–F10, G5, G12) against an exact reference model: streak arithmetic, backoff
//! windows, trips, schedules and ticks.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Flow, FlowAction, FlowError, FlowPolicy, FlowPolicyBuilder, FlowSchedule, FlowStatus, FlowStatusKind, Instant,
    SkipReason,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::{BackoffIn, check_delay};
use super::{At, Clock, Count, Ctx, ErrorKind, SETUP, Span, ensure, nanos_sat, parse, rng, verdict};

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum BackoffChoice {
    /// F2's default.
    Default,
    Custom(BackoffIn),
}

#[derive(Arbitrary, Debug)]
struct Config {
    backoff: BackoffChoice,
    trip_after: Option<Count>,
    /// `None`: a cron flow.
    every: Option<Span>,
    created: u32,
    seed: u64,
}

fn build(config: &Config) -> Option<FlowPolicy> {
    let mut builder = FlowPolicy::builder();
    if let BackoffChoice::Custom(backoff) = config.backoff {
        builder = builder.backoff(backoff.build()?);
    } else {
        let f2 = persevere::Backoff::exponential(Duration::from_secs(1), 2.0)
            .max_delay(Duration::from_secs(300))
            .jitter(persevere::Jitter::Proportional(0.1))
            .build();
        ensure!(SETUP, Ok(builder.backoff) == f2, "F2", "the default backoff is {:?}", builder.backoff);
        ensure!(SETUP, builder.trip_after.is_none(), "F2", "the default trips after {:?}", builder.trip_after);
    }
    builder.trip_after = config.trip_after.map(Count::get);
    let reasons = if builder.trip_after == Some(0) { vec![ErrorKind::Zero] } else { Vec::new() };
    let policy = verdict("flow policy", builder.build(), &reasons)?;
    ensure!(SETUP, policy.trip_after() == builder.trip_after, "F2", "trip_after {:?}", policy.trip_after());
    ensure!(
        SETUP,
        FlowPolicyBuilder::from(policy).build() == Ok(policy),
        "F2",
        "the policy does not rebuild to itself"
    );
    Some(policy)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Running,
    Completed,
    Backoff { until: Instant, last_error: u8 },
    Tripped { last_error: u8 },
}

/// What a [`Flow`] must be, restated from F1–F10.
#[derive(Clone, Debug)]
struct Model {
    phase: Phase,
    every: Option<Duration>,
    streak: u32,
    last_delay_ns: u64,
    next_eligible: Option<Instant>,
    interval_due: Instant,
    run_count: u64,
    last_now: Instant,
}

impl Model {
    fn status(&self) -> FlowStatus<u8> {
        match self.phase {
            Phase::Idle => FlowStatus::Idle,
            Phase::Running => FlowStatus::Running,
            Phase::Completed => FlowStatus::Completed,
            Phase::Backoff { until, last_error } => FlowStatus::Backoff { until, streak: self.streak, last_error },
            Phase::Tripped { last_error } => FlowStatus::Tripped { streak: self.streak, last_error },
        }
    }

    fn kind(&self) -> FlowStatusKind {
        self.status().kind()
    }

    /// F5: an every-flow is due at `max(run_end + interval, next_eligible)`; never while it runs
    /// or is tripped (F10).
    fn due(&self) -> Option<Instant> {
        match (self.every, self.phase) {
            (None, _) | (_, Phase::Running | Phase::Tripped { .. }) => None,
            (Some(_), _) => Some(self.next_eligible.map_or(self.interval_due, |until| until.later(self.interval_due))),
        }
    }

    fn dispatch(&mut self) -> Vec<FlowAction> {
        self.run_count = self.run_count.saturating_add(1);
        self.phase = Phase::Running;
        vec![FlowAction::Dispatch { run: self.run_count }]
    }

    fn end_run(&mut self, now: Instant) -> Result<Instant, FlowError> {
        if self.phase != Phase::Running {
            return Err(FlowError::NotRunning(self.kind()));
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        if let Some(interval) = self.every {
            self.interval_due = now.saturating_add(Duration::from_nanos(nanos_sat(interval)));
        }
        Ok(now)
    }

    fn timeout(&mut self, now: Instant) -> Vec<FlowAction> {
        let now = self.last_now.later(now);
        if self.due().is_some_and(|due| due <= now) {
            self.last_now = now;
            return self.dispatch();
        }
        Vec::new()
    }

    fn tick(&mut self, now: Instant, tick: Instant) -> Result<Vec<FlowAction>, FlowError> {
        if self.every.is_some() {
            return Err(FlowError::NotCron);
        }
        self.last_now = self.last_now.later(now);
        let reason = match (self.phase, self.next_eligible) {
            (Phase::Running, _) => Some(SkipReason::Running),
            (Phase::Tripped { .. }, _) => Some(SkipReason::Tripped),
            (_, Some(until)) if tick < until => Some(SkipReason::InBackoff { until }),
            _ => None,
        };
        Ok(match reason {
            Some(reason) => vec![FlowAction::TickSkipped { tick, reason }],
            None => self.dispatch(),
        })
    }

    fn trigger(&mut self, now: Instant) -> Result<Vec<FlowAction>, FlowError> {
        match self.phase {
            Phase::Tripped { .. } => return Err(FlowError::Tripped { streak: self.streak }),
            Phase::Running => return Err(FlowError::Running),
            _ => {}
        }
        self.last_now = self.last_now.later(now);
        Ok(self.dispatch())
    }

    fn success(&mut self, now: Instant) -> Result<Vec<FlowAction>, FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Completed;
        self.streak = 0;
        self.last_delay_ns = 0;
        self.next_eligible = None;
        Ok(Vec::new())
    }

    fn failure(
        &mut self,
        policy: &FlowPolicy,
        now: Instant,
        error: u8,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<FlowAction>, FlowError> {
        let now = self.end_run(now)?;
        self.streak = self.streak.saturating_add(1);
        if policy.trip_after().is_some_and(|limit| self.streak >= limit) {
            self.phase = Phase::Tripped { last_error: error };
            self.next_eligible = None;
        } else {
            let previous = Duration::from_nanos(self.last_delay_ns);
            self.last_delay_ns = nanos_sat(policy.backoff().delay(self.streak, previous, rng));
            let until = now.saturating_add(Duration::from_nanos(self.last_delay_ns));
            self.phase = Phase::Backoff { until, last_error: error };
            self.next_eligible = Some(until);
        }
        Ok(Vec::new())
    }

    fn cancel(&mut self, now: Instant) -> Result<Vec<FlowAction>, FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Idle;
        Ok(Vec::new())
    }

    fn reset(&mut self, now: Instant) -> Vec<FlowAction> {
        self.last_now = self.last_now.later(now);
        self.streak = 0;
        self.last_delay_ns = 0;
        self.next_eligible = None;
        if self.phase != Phase::Running {
            self.phase = Phase::Idle;
        }
        Vec::new()
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Timeout(At),
    Timeout2(At),
    Tick(At, At),
    Trigger(At),
    Success(At),
    Failure(At, u8),
    Failure2(At, u8),
    Cancel(At),
    Reset(At),
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(policy) = build(&config) else { return };
    let mut rng = rng(config.seed);
    let created = Instant::from_nanos(u64::from(config.created));
    let every = config.every.map(Span::get);
    let mut machine = match every {
        Some(interval) => Flow::<u8>::every(created, interval),
        None => Flow::<u8>::cron(created),
    };
    let expected_schedule = every.map_or(FlowSchedule::Cron, |interval| FlowSchedule::Every { interval });
    ensure!(SETUP, machine.schedule() == expected_schedule, "F5", "schedule {:?}", machine.schedule());
    let mut model = Model {
        phase: Phase::Idle,
        every,
        streak: 0,
        last_delay_ns: 0,
        next_eligible: None,
        interval_due: created,
        run_count: 0,
        last_now: created,
    };
    let mut clock = Clock { now: created };
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let was = model.clone();
        let mut draws = rng.clone();
        let now;
        let result: Result<Vec<FlowAction>, FlowError> = match *op {
            Op::Timeout(at) | Op::Timeout2(at) => {
                now = clock.at(at, machine.poll_timeout());
                let expected = model.timeout(now);
                machine.handle_timeout(now);
                if expected.is_empty() {
                    ensure!(ctx, machine == before, "F5", "an early or spurious handle_timeout changed the flow");
                } else {
                    let due = was.due().unwrap_or(Instant::MAX);
                    ensure!(ctx, model.last_now >= due, "F5", "dispatched at {:?}, before {due:?}", model.last_now);
                }
                Ok(expected)
            }
            Op::Tick(at, tick) => {
                now = clock.at(at, None);
                let tick = Clock { now }.at(tick, None);
                compare(ctx, machine.handle_tick(now, tick), model.tick(now, tick))
            }
            Op::Trigger(at) => {
                now = clock.at(at, machine.poll_timeout());
                let got = machine.trigger(now);
                if matches!(was.phase, Phase::Tripped { .. }) {
                    ensure!(ctx, got.is_err(), "F7", "trigger accepted on a tripped flow");
                }
                compare(ctx, got, model.trigger(now))
            }
            Op::Success(at) => {
                now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_success(now), model.success(now))
            }
            Op::Failure(at, error) | Op::Failure2(at, error) => {
                now = clock.at(at, machine.poll_timeout());
                let expected = model.failure(&policy, now, error, &mut draws);
                let got = machine.handle_failure(&policy, now, error, &mut rng);
                if let Err(refused) = &got {
                    ensure!(
                        ctx,
                        refused.last_error == error,
                        "G12",
                        "the refused error came back as {}",
                        refused.last_error
                    );
                }
                compare(ctx, got.map_err(|r| r.error), expected)
            }
            Op::Cancel(at) => {
                now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_cancel(now), model.cancel(now))
            }
            Op::Reset(at) => {
                now = clock.at(at, machine.poll_timeout());
                machine.reset_flow(now);
                Ok(model.reset(now))
            }
        };
        let accepted = result.is_ok();
        match result {
            Err(_) => ensure!(ctx, machine == before, "G12", "a refused input changed the flow"),
            Ok(expected) => {
                let got: Vec<FlowAction> = machine.poll_action().into_iter().collect();
                ensure!(ctx, machine.poll_action().is_none(), "F1", "more than one action after one input");
                if matches!(was.phase, Phase::Tripped { .. }) {
                    let dispatched = got.iter().any(|a| matches!(a, FlowAction::Dispatch { .. }));
                    ensure!(ctx, !dispatched, "F10", "a tripped flow was dispatched: {got:?}");
                }
                ensure!(ctx, got == expected, "model", "actions {got:?}, the model expects {expected:?}");
            }
        }
        if accepted {
            check_transition(ctx, &policy, op, &was, &machine, now);
        }
        let info = machine.info();
        ensure!(
            ctx,
            info.status.cloned() == model.status(),
            "model",
            "status {:?}, the model expects {:?}",
            info.status,
            model.status()
        );
        ensure!(
            ctx,
            info.failure_streak == model.streak,
            "F9",
            "streak {}, the model expects {}",
            info.failure_streak,
            model.streak
        );
        ensure!(
            ctx,
            info.next_eligible == model.next_eligible,
            "F9",
            "next_eligible {:?}, expected {:?}",
            info.next_eligible,
            model.next_eligible
        );
        ensure!(
            ctx,
            info.run_count == model.run_count,
            "F9",
            "run_count {}, the model expects {}",
            info.run_count,
            model.run_count
        );
        ensure!(
            ctx,
            machine.poll_timeout() == model.due(),
            "F5",
            "poll_timeout {:?}, expected {:?}",
            machine.poll_timeout(),
            model.due()
        );
    }
}

/// F3, F4, F8: what each accepted outcome does to the streak and the window, from the state
/// before (without the model).
fn check_transition(ctx: Ctx<'_>, policy: &FlowPolicy, op: &Op, was: &Model, flow: &Flow<u8>, now: Instant) {
    match *op {
        Op::Success(_) => {
            ensure!(ctx, flow.status() == FlowStatus::Completed, "F3", "a success left {:?}", flow.status());
            ensure!(
                ctx,
                flow.streak() == 0 && flow.next_eligible().is_none(),
                "F3",
                "a success left streak {} and window {:?}",
                flow.streak(),
                flow.next_eligible()
            );
        }
        Op::Failure(_, _) | Op::Failure2(_, _) => {
            let streak = was.streak.saturating_add(1);
            ensure!(ctx, flow.streak() == streak, "F3", "streak {} after {} + 1", flow.streak(), was.streak);
            let trips = policy.trip_after().is_some_and(|limit| streak >= limit);
            match flow.status() {
                FlowStatus::Tripped { .. } => {
                    ensure!(ctx, trips, "F3", "tripped at streak {streak} (limit {:?})", policy.trip_after());
                    ensure!(ctx, flow.next_eligible().is_none(), "F3", "a tripped flow has a window");
                }
                FlowStatus::Backoff { until, .. } => {
                    ensure!(ctx, !trips, "F3", "streak {streak} reached the limit but the flow backs off");
                    ensure!(
                        ctx,
                        flow.next_eligible() == Some(until),
                        "F3",
                        "next_eligible {:?} != until {until:?}",
                        flow.next_eligible()
                    );
                    if until != Instant::MAX {
                        let end = was.last_now.later(now);
                        let delay_ns = nanos_sat(until.saturating_duration_since(end));
                        check_delay(ctx, policy.backoff(), streak, was.last_delay_ns, delay_ns);
                    }
                }
                other => ensure!(ctx, false, "F3", "a failure left {other:?}"),
            }
        }
        Op::Cancel(_) => {
            ensure!(ctx, flow.status() == FlowStatus::Idle, "F4", "a cancel left {:?}", flow.status());
            ensure!(
                ctx,
                flow.streak() == was.streak && flow.next_eligible() == was.next_eligible,
                "F4",
                "a cancel changed the streak or window"
            );
        }
        Op::Reset(_) => {
            ensure!(
                ctx,
                flow.streak() == 0 && flow.next_eligible().is_none(),
                "F8",
                "a reset left streak {} and window {:?}",
                flow.streak(),
                flow.next_eligible()
            );
            let running = was.phase == Phase::Running;
            ensure!(
                ctx,
                (flow.status() == FlowStatus::Running) == running,
                "F8",
                "a reset left {:?} (running before: {running})",
                flow.status()
            );
        }
        _ => {}
    }
}

fn compare(
    ctx: Ctx<'_>,
    got: Result<(), FlowError>,
    expected: Result<Vec<FlowAction>, FlowError>,
) -> Result<Vec<FlowAction>, FlowError> {
    match (&got, &expected) {
        (Ok(()), Ok(_)) => {}
        (Err(g), Err(e)) => ensure!(ctx, g == e, "model", "refused with {g:?}, the model expects {e:?}"),
        _ => ensure!(ctx, false, "model", "the flow answered {got:?}, the model expects {expected:?}"),
    }
    expected
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
