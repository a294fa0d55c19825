//! One flow (F1–F10, G5, G12) against an exact reference model: streak arithmetic, backoff
//! windows, trips (and why), hints, schedules, ticks and the drain rule.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Failure, FailureKind, Flow, FlowAction, FlowError, FlowPolicy, FlowPolicyBuilder, FlowSchedule, FlowStatus,
    FlowStatusKind, Hint, Instant, TripReason,
};

use super::backoff_model::{BackoffIn, check_delay};
use super::retry_model::KindIn;
use super::{At, Clock, Count, Ctx, ErrorKind, SETUP, Span, ensure, nanos_sat, parse, rng, verdict};
use crate::model::backoff::{adopt, delay_bounds};

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
    /// `None`: the default, [`persevere::DEFAULT_MAX_HINT`].
    max_hint: Option<Span>,
    restart_after_hint: bool,
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
        ensure!(
            SETUP,
            builder.max_hint == persevere::DEFAULT_MAX_HINT && !builder.restart_after_hint,
            "B6",
            "the default hint rule is {:?} with restart {}",
            builder.max_hint,
            builder.restart_after_hint
        );
    }
    builder.trip_after = config.trip_after.map(Count::get);
    if let Some(max_hint) = config.max_hint {
        builder = builder.max_hint(max_hint.get());
    }
    builder = builder.restart_after_hint(config.restart_after_hint);
    let mut reasons = Vec::new();
    if builder.trip_after == Some(0) {
        reasons.push(ErrorKind::Zero);
    }
    if builder.max_hint.is_zero() {
        reasons.push(ErrorKind::Zero);
    }
    let policy = verdict("flow policy", builder.build(), &reasons)?;
    ensure!(SETUP, policy.trip_after() == builder.trip_after, "F2", "trip_after {:?}", policy.trip_after());
    // A `max_hint` past `u64::MAX` ns honours any hint, as `Duration::MAX` does.
    let max_hint = if nanos_sat(builder.max_hint) == u64::MAX { Duration::MAX } else { builder.max_hint };
    ensure!(SETUP, policy.max_hint() == max_hint, "B6", "max_hint {:?}, given {max_hint:?}", policy.max_hint());
    ensure!(
        SETUP,
        policy.restarts_after_hint() == config.restart_after_hint,
        "B6",
        "restart_after_hint {}",
        policy.restarts_after_hint()
    );
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
    Tripped { last_error: u8, reason: TripReason },
}

/// What a [`Flow`] must be, restated from F1–F10 and B6.
#[derive(Clone, Debug)]
struct Model {
    phase: Phase,
    every: Option<Duration>,
    streak: u32,
    /// The schedule's place: failures since the schedule started (at the streak's start, or
    /// after a hinted window with `restart_after_hint`). The streak itself keeps counting.
    place: u32,
    /// The delay of the last window (a hint's, or the schedule's).
    last_delay_ns: u64,
    next_eligible: Option<Instant>,
    interval_due: Instant,
    run_count: u64,
    last_now: Instant,
    /// The action made and not drained yet (the drain rule: at most one).
    pending: Option<FlowAction>,
}

impl Model {
    fn status(&self) -> FlowStatus<u8> {
        match self.phase {
            Phase::Idle => FlowStatus::Idle,
            Phase::Running => FlowStatus::Running,
            Phase::Completed => FlowStatus::Completed,
            Phase::Backoff { until, last_error } => FlowStatus::Backoff { until, streak: self.streak, last_error },
            Phase::Tripped { last_error, reason } => FlowStatus::Tripped { streak: self.streak, last_error, reason },
        }
    }

    fn kind(&self) -> FlowStatusKind {
        self.status().kind()
    }

    /// F5: an every-flow is due at `max(run_end + interval, next_eligible)`; never while it runs
    /// or is tripped (F10).
    fn due(&self) -> Option<Instant> {
        let busy = matches!(self.phase, Phase::Running | Phase::Tripped { .. });
        self.every.and_then(|_| crate::model::flow::due(busy, self.interval_due, self.next_eligible))
    }

    /// The drain rule: an input while an action waits is refused.
    fn drained(&self) -> Result<(), FlowError> {
        if self.pending.is_some() { Err(FlowError::Undrained) } else { Ok(()) }
    }

    fn dispatch(&mut self) {
        self.run_count = self.run_count.saturating_add(1);
        self.phase = Phase::Running;
        self.pending = Some(FlowAction::Dispatch { run: self.run_count });
    }

    /// A run's result: only while a run is in flight (a validity error first), and drained.
    fn end_run(&mut self, now: Instant) -> Result<Instant, FlowError> {
        if self.phase != Phase::Running {
            return Err(FlowError::NotRunning(self.kind()));
        }
        self.drained()?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if let Some(interval) = self.every {
            self.interval_due = now.saturating_add(Duration::from_nanos(nanos_sat(interval)));
        }
        Ok(now)
    }

    /// Dispatches a due every-flow; nothing at all while an action waits to be drained.
    fn timeout(&mut self, now: Instant) {
        let now = self.last_now.later(now);
        if self.pending.is_none() && self.due().is_some_and(|due| due <= now) {
            self.last_now = now;
            self.dispatch();
        }
    }

    fn tick(&mut self, now: Instant, tick: Instant) -> Result<(), FlowError> {
        if self.every.is_some() {
            return Err(FlowError::NotCron);
        }
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let reason = crate::model::flow::tick_skip(
            self.phase == Phase::Running,
            matches!(self.phase, Phase::Tripped { .. }),
            self.next_eligible,
            tick,
        );
        match reason {
            Some(reason) => self.pending = Some(FlowAction::TickSkipped { tick, reason }),
            None => self.dispatch(),
        }
        Ok(())
    }

    fn trigger(&mut self, now: Instant) -> Result<(), FlowError> {
        match self.phase {
            Phase::Tripped { reason, .. } => return Err(FlowError::Tripped { streak: self.streak, reason }),
            Phase::Running => return Err(FlowError::Running),
            _ => self.drained()?,
        }
        self.last_now = self.last_now.later(now);
        self.dispatch();
        Ok(())
    }

    fn success(&mut self, now: Instant) -> Result<(), FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Completed;
        self.clear_streak();
        Ok(())
    }

    /// F3 from the failure's class, in this order: `Canceled` is F4; `Fatal` and `DoNotRetry`
    /// trip at once; a streak at the trip limit trips (a hint or not); a hint past `max_hint`
    /// trips with the hinted instant; a hint within it is the window, exactly; anything else
    /// waits the schedule's next delay, the one the machine drew (`observed`: where it waits
    /// after the same failure), held to the schedule's bounds ([`adopt`]).
    fn failure(
        &mut self,
        policy: &FlowPolicy,
        now: Instant,
        failure: Failure<u8>,
        observed: Option<Instant>,
    ) -> Result<(), FlowError> {
        let now = self.end_run(now)?;
        let error = failure.error;
        let hinted = match failure.kind {
            FailureKind::Canceled => {
                self.phase = Phase::Idle;
                return Ok(());
            }
            FailureKind::Fatal => return self.trip(error, TripReason::Fatal),
            FailureKind::Hinted(Hint::DoNotRetry) => return self.trip(error, TripReason::DoNotRetry),
            FailureKind::Hinted(Hint::After(d)) => Some(nanos_sat(d)),
            FailureKind::Hinted(Hint::At(at)) => Some(nanos_sat(at.saturating_duration_since(now))),
            _ => None,
        };
        if policy.trip_after().is_some_and(|limit| self.streak.saturating_add(1) >= limit) {
            return self.trip(error, TripReason::Streak);
        }
        let delay = match hinted {
            Some(d) if u128::from(d) > policy.max_hint().as_nanos() => {
                let retry_at = now.saturating_add(Duration::from_nanos(d));
                return self.trip(error, TripReason::Deferred { retry_at });
            }
            Some(d) => {
                self.streak = self.streak.saturating_add(1);
                if policy.restarts_after_hint() {
                    self.place = 0;
                    self.last_delay_ns = 0;
                } else {
                    self.place = self.place.saturating_add(1);
                    self.last_delay_ns = d;
                }
                d
            }
            None => {
                self.streak = self.streak.saturating_add(1);
                self.place = self.place.saturating_add(1);
                let bounds = delay_bounds(policy.backoff(), self.place, self.last_delay_ns);
                self.last_delay_ns = adopt(observed, now, bounds, |_| false);
                self.last_delay_ns
            }
        };
        let until = now.saturating_add(Duration::from_nanos(delay));
        self.phase = Phase::Backoff { until, last_error: error };
        self.next_eligible = Some(until);
        Ok(())
    }

    /// The failure trips the flow: counted into the streak, no window (F3, F10).
    fn trip(&mut self, last_error: u8, reason: TripReason) -> Result<(), FlowError> {
        self.streak = self.streak.saturating_add(1);
        self.phase = Phase::Tripped { last_error, reason };
        self.next_eligible = None;
        // O1: the trip is an output.
        self.pending = Some(FlowAction::Tripped { streak: self.streak, reason });
        Ok(())
    }

    fn cancel(&mut self, now: Instant) -> Result<(), FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Idle;
        Ok(())
    }

    /// F8: refused while an action waits; a reset that clears a streak is an output (O1).
    fn reset(&mut self, now: Instant) -> Result<(), FlowError> {
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let (streak, tripped) = (self.streak, matches!(self.phase, Phase::Tripped { .. }));
        self.clear_streak();
        if self.phase != Phase::Running {
            self.phase = Phase::Idle;
        }
        if streak > 0 || tripped {
            self.pending = Some(FlowAction::Reset { streak, tripped });
        }
        Ok(())
    }

    fn clear_streak(&mut self) {
        self.streak = 0;
        self.place = 0;
        self.last_delay_ns = 0;
        self.next_eligible = None;
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op {
    Timeout(At),
    Timeout2(At),
    Tick(At, At),
    Trigger(At),
    Success(At),
    Failure(At, KindIn, u8),
    Failure2(At, KindIn, u8),
    Cancel(At),
    Reset(At),
    /// From now on the driver does not drain the flow's action after an input (until `Drain`).
    Hold,
    /// The driver drains the flow's action, and drains after every input again.
    Drain,
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
        place: 0,
        last_delay_ns: 0,
        next_eligible: None,
        interval_due: created,
        run_count: 0,
        last_now: created,
        pending: None,
    };
    let mut clock = Clock { now: created };
    let mut holding = false;
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let was = model.clone();
        let mut now = model.last_now;
        let mut failure = None;
        let result: Result<(), FlowError> = match *op {
            Op::Timeout(at) | Op::Timeout2(at) => {
                now = clock.at(at, machine.poll_timeout());
                model.timeout(now);
                machine.handle_timeout(&policy, now, &mut rng);
                if model.pending == was.pending {
                    ensure!(
                        ctx,
                        machine == before,
                        "F5",
                        "an early, spurious or undrained handle_timeout changed the flow"
                    );
                } else {
                    let due = was.due().unwrap_or(Instant::MAX);
                    ensure!(ctx, model.last_now >= due, "F5", "dispatched at {:?}, before {due:?}", model.last_now);
                }
                Ok(())
            }
            Op::Tick(at, tick) => {
                now = clock.at(at, None);
                let tick = Clock { now }.at(tick, None);
                compare(ctx, machine.handle_tick(&policy, now, tick), model.tick(now, tick))
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
                compare(ctx, machine.handle_success(&policy, now), model.success(now))
            }
            Op::Failure(at, kind, error) | Op::Failure2(at, kind, error) => {
                now = clock.at(at, machine.poll_timeout());
                let input = Failure::new(kind.get(now), error);
                failure = Some(input);
                let got = machine.handle_failure(&policy, now, input, &mut rng);
                let expected = model.failure(&policy, now, input, waits(&machine));
                if let Err(refused) = &got {
                    ensure!(ctx, refused.input == input, "G12", "the refused failure came back as {:?}", refused.input);
                }
                compare(ctx, got.map_err(|r| r.error), expected)
            }
            Op::Cancel(at) => {
                now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_cancel(&policy, now), model.cancel(now))
            }
            Op::Reset(at) => {
                now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.reset_flow(now), model.reset(now))
            }
            Op::Hold => {
                holding = true;
                Ok(())
            }
            Op::Drain => {
                holding = false;
                Ok(())
            }
        };
        let is_input = !matches!(op, Op::Timeout(_) | Op::Timeout2(_) | Op::Hold | Op::Drain);
        if was.pending.is_some() && is_input {
            // The drain rule: refused (by a validity error or as undrained), nothing changed.
            ensure!(ctx, result.is_err(), "drain", "{op:?} was accepted while {:?} waited to be drained", was.pending);
        }
        if result.is_err() {
            ensure!(ctx, machine == before, "G12", "a refused input changed the flow");
        }
        // F10: what this input made (seen on a copy, so that a held action stays undrained).
        let made = if was.pending.is_none() { Flow::poll_action(&mut { machine }) } else { None };
        if matches!(was.phase, Phase::Tripped { .. }) {
            let dispatched = matches!(made, Some(FlowAction::Dispatch { .. }));
            ensure!(ctx, !dispatched, "F10", "a tripped flow was dispatched: {made:?}");
        }
        if !holding {
            let got: Vec<FlowAction> = std::iter::from_fn(|| machine.poll_action()).take(2).collect();
            ensure!(ctx, got.len() <= 1, "F1", "more than one action waited to be drained: {got:?}");
            let expected: Vec<FlowAction> = model.pending.take().into_iter().collect();
            ensure!(ctx, got == expected, "model", "actions {got:?}, the model expects {expected:?}");
        }
        if result.is_ok() && is_input {
            check_transition(ctx, &policy, op, failure, &was, &machine, now);
        }
        check_state(ctx, &machine, &model);
    }
}

/// The end of `machine`'s backoff window, if it is in one.
fn waits(machine: &Flow<u8>) -> Option<Instant> {
    match machine.status() {
        FlowStatus::Backoff { until, .. } => Some(until),
        _ => None,
    }
}

/// The flow's observable state against the model's.
fn check_state(ctx: Ctx<'_>, machine: &Flow<u8>, model: &Model) {
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
    ensure!(ctx, machine.now() == model.last_now, "model", "now {:?}, the model {:?}", machine.now(), model.last_now);
}

/// F3, F4, F8, B6: what each accepted outcome does to the streak, the window and the trip, from
/// the state before (without the model's transitions).
fn check_transition(
    ctx: Ctx<'_>,
    policy: &FlowPolicy,
    op: &Op,
    failure: Option<Failure<u8>>,
    was: &Model,
    flow: &Flow<u8>,
    now: Instant,
) {
    let end = was.last_now.later(now);
    match (*op, failure) {
        (Op::Success(_), _) => {
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
        (Op::Cancel(_), _)
        | (Op::Failure(..) | Op::Failure2(..), Some(Failure { kind: FailureKind::Canceled, .. })) => {
            ensure!(ctx, flow.status() == FlowStatus::Idle, "F4", "a cancel left {:?}", flow.status());
            ensure!(
                ctx,
                flow.streak() == was.streak && flow.next_eligible() == was.next_eligible,
                "F4",
                "a cancel changed the streak or window"
            );
        }
        (Op::Failure(..) | Op::Failure2(..), Some(failure)) => {
            let streak = was.streak.saturating_add(1);
            ensure!(ctx, flow.streak() == streak, "F3", "streak {} after {} + 1", flow.streak(), was.streak);
            let limit = policy.trip_after().is_some_and(|limit| streak >= limit);
            let hint = match failure.kind {
                FailureKind::Hinted(Hint::After(d)) => Some(nanos_sat(d)),
                FailureKind::Hinted(Hint::At(at)) => Some(nanos_sat(at.saturating_duration_since(end))),
                _ => None,
            };
            let past_max = hint.filter(|d| u128::from(*d) > policy.max_hint().as_nanos());
            let reason = match failure.kind {
                FailureKind::Fatal => Some(TripReason::Fatal),
                FailureKind::Hinted(Hint::DoNotRetry) => Some(TripReason::DoNotRetry),
                _ if limit => Some(TripReason::Streak),
                _ => past_max.map(|d| TripReason::Deferred { retry_at: end.saturating_add(Duration::from_nanos(d)) }),
            };
            match flow.status() {
                FlowStatus::Tripped { reason: got, last_error, .. } => {
                    ensure!(
                        ctx,
                        Some(got) == reason,
                        "F3",
                        "tripped for {got:?} after {:?} at streak {streak} (limit {:?}, max_hint {:?}); expected {reason:?}",
                        failure.kind,
                        policy.trip_after(),
                        policy.max_hint()
                    );
                    ensure!(ctx, *last_error == failure.error, "F3", "tripped with error {last_error}");
                    ensure!(ctx, flow.next_eligible().is_none(), "F3", "a tripped flow has a window");
                }
                FlowStatus::Backoff { until, .. } => {
                    ensure!(
                        ctx,
                        reason.is_none(),
                        "F3",
                        "{:?} should trip ({reason:?}) but the flow backs off",
                        failure.kind
                    );
                    ensure!(
                        ctx,
                        flow.next_eligible() == Some(until),
                        "F3",
                        "next_eligible {:?} != until {until:?}",
                        flow.next_eligible()
                    );
                    let delay_ns = nanos_sat(until.saturating_duration_since(end));
                    match hint {
                        // B6: a hint is never shortened, nor lengthened.
                        Some(d) => ensure!(
                            ctx,
                            until == end.saturating_add(Duration::from_nanos(d)),
                            "B6",
                            "a hint of {d} ns at {end:?} set the window until {until:?}"
                        ),
                        None if until != Instant::MAX => {
                            let place = was.place.saturating_add(1);
                            check_delay(ctx, policy.backoff(), place, was.last_delay_ns, delay_ns);
                        }
                        None => {}
                    }
                }
                other => ensure!(ctx, false, "F3", "a failure left {other:?}"),
            }
        }
        (Op::Reset(_), _) => {
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

fn compare(ctx: Ctx<'_>, got: Result<(), FlowError>, expected: Result<(), FlowError>) -> Result<(), FlowError> {
    ensure!(ctx, got == expected, "model", "the flow answered {got:?}, the model expects {expected:?}");
    expected
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
