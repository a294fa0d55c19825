//! One flow (F1–F10, G5, G12) against an exact reference model: streak arithmetic, backoff
//! windows, trips (and why), hints, schedules, ticks and the drain rule.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Failure, FailureKind, Flow, FlowAction, FlowError, FlowPolicy, FlowPolicyBuilder, FlowSchedule, FlowStatus, Hint,
    Instant, TripReason,
};

use super::backoff_model::{BackoffIn, check_delay};
use super::retry_model::KindIn;
use super::{At, Clock, Count, Ctx, ErrorKind, SETUP, Span, compare, ensure, nanos_sat, parse, rng, verdict};
use crate::model::flow::{FlowModel, Phase, waits};

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
    let mut model = FlowModel::<u8>::new(created, every);
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
                machine.handle_timeout(now);
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
                compare(ctx, machine.handle_cancel(now), model.cancel(now))
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

/// The flow's observable state against the model's.
fn check_state(ctx: Ctx<'_>, machine: &Flow<u8>, model: &FlowModel<u8>) {
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
    was: &FlowModel<u8>,
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
                            let place = was.schedule.place.saturating_add(1);
                            check_delay(ctx, policy.backoff(), place, was.schedule.previous_ns, delay_ns);
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

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
