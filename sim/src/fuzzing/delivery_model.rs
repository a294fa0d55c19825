//! One task's redelivery (D1–D10, G10–G12) against the delivery model the `delivery` family
//! shares ([`DeliveryModel`]), with independent checks of what consumes a retry and what does
//! not.
//!
//! Every input while actions of an earlier one wait to be drained is refused with `Undrained`
//! (after the validity errors) and a timeout does nothing: the `Hold` operation stops the
//! draining until `Drain`.

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use persevere::{
    AttemptProgress, Delivery, DeliveryAction, DeliveryError, DeliveryPolicy, DeliveryPolicyBuilder, DeliveryStatus,
    Durability, Failure, FailureClass, FailurePolicy, FreeReturn, IdempotencyKey, Instant, Interruption, OutcomeKind,
    Terminal,
};

use super::retry_model::{AttemptIn, KindIn, RetryIn};
use super::{
    At, Clock, Count, Ctx, ErrorKind, SETUP, Span, compare, compare_returned, ensure, nanos, parse, rng, verdict,
};
use crate::model::delivery::{DeliveryModel, State, waits};

type Task = Delivery<u8, u8, u16, u8, u8>;
type Act = DeliveryAction<u8, u8, u16, u8, u8>;

const TASK: u8 = 7;
const STEP: u64 = 42;

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum FailIn {
    Fail,
    Proceed,
    Divert(u8),
}

#[derive(Arbitrary, Debug)]
struct Config {
    retry: RetryIn,
    max_redeliveries: Option<Count>,
    asynchronous: bool,
    start_timeout: Option<Span>,
    heartbeat_timeout: Option<Span>,
    on_failure: FailIn,
    created: u32,
    seed: u64,
}

fn build(config: &Config) -> Option<DeliveryPolicy<u8>> {
    let retry = config.retry.build()?;
    let mut builder: DeliveryPolicyBuilder<u8> = DeliveryPolicy::builder(retry).on_failure(match config.on_failure {
        FailIn::Fail => FailurePolicy::Fail,
        FailIn::Proceed => FailurePolicy::Proceed,
        FailIn::Divert(route) => FailurePolicy::Divert(route),
    });
    ensure!(
        SETUP,
        builder.max_redeliveries == 3 && builder.durability == Durability::Sync,
        "D4",
        "defaults {builder:?}"
    );
    if let Some(n) = config.max_redeliveries {
        builder = builder.max_redeliveries(n.get());
    }
    if config.asynchronous {
        builder = builder.durability(Durability::Async);
    }
    if let Some(t) = config.start_timeout {
        builder = builder.start_timeout(t.get());
    }
    if let Some(t) = config.heartbeat_timeout {
        builder = builder.heartbeat_timeout(t.get());
    }
    let mut reasons = Vec::new();
    if retry.attempt_timeout().is_some() {
        reasons.push(ErrorKind::Conflict);
    }
    for lease in [builder.start_timeout, builder.heartbeat_timeout] {
        match nanos(lease) {
            None => reasons.push(ErrorKind::DurationOverflow),
            Some(0) => reasons.push(ErrorKind::Zero),
            Some(_) => {}
        }
    }
    let policy = verdict("delivery policy", builder.build(), &reasons)?;
    ensure!(
        SETUP,
        DeliveryPolicyBuilder::from(policy).build() == Ok(policy),
        "D1",
        "the policy does not rebuild to itself"
    );
    Some(policy)
}

type Model = DeliveryModel<u8, u8, u16, u8, u8>;

/// A worker id relative to the one holding the attempt: usually the holder, sometimes another.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum WorkerIn {
    Holder,
    Holder2,
    Other(u8),
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum InterruptionIn {
    WorkerCrashed,
    Disconnected,
    LeaseExpired,
    HeartbeatMissed,
    ServerFailover,
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum ReturnIn {
    Declined,
    SendFailed,
    ClosedBeforeStart,
}

#[derive(Arbitrary, Debug)]
enum Op {
    HandOut(At, u8),
    HandOut2(At, u8),
    Started(At, AttemptIn, WorkerIn),
    Heartbeat(At, AttemptIn, WorkerIn, Option<u16>),
    Persisted(At, AttemptIn),
    Completed(At, AttemptIn, WorkerIn),
    Failed(At, AttemptIn, WorkerIn, KindIn, u8),
    Interrupted(At, AttemptIn, WorkerIn, InterruptionIn),
    Returned(At, AttemptIn, WorkerIn, ReturnIn),
    Failover(At),
    Timeout(At),
    Timeout2(At),
    /// From now on the driver does not drain the task's actions after an input (until `Drain`).
    Hold,
    /// The driver drains the task's actions, and drains after every input again.
    Drain,
}

/// What the guarantees remember across operations, without the model.
#[derive(Default)]
struct Seen {
    finishes: u32,
    /// Attempt numbers used up by a failure or an interruption (D2).
    consumed: BTreeSet<u64>,
    /// Sync mode: the worker that started each attempt (G10).
    started_by: BTreeMap<u64, u8>,
    /// Some attempt reached a worker (D5).
    reached: bool,
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(policy) = build(&config) else { return };
    let mut rng = rng(config.seed);
    let created = Instant::from_nanos(u64::from(config.created));
    let mut machine = Task::new(&policy, created, TASK, STEP);
    let mut model = Model::new(&policy, created, IdempotencyKey { task: TASK, step_execution: STEP });
    let mut clock = Clock { now: created };
    let mut seen = Seen::default();
    let sync = policy.durability() == Durability::Sync;
    let first = drain(&mut machine);
    ensure!(SETUP, first == model.drain(), "D1", "a new task emitted {first:?}");
    let mut holding = false;
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let was = model.clone();
        let current = model.out().map_or(model.retry.attempt, |o| o.0);
        let holder = model.out().map_or(0, |o| o.1);
        let worker_of = |w: WorkerIn| match w {
            WorkerIn::Holder | WorkerIn::Holder2 => holder,
            WorkerIn::Other(w) => w,
        };
        let result: Result<(), DeliveryError> = match *op {
            Op::HandOut(at, worker) | Op::HandOut2(at, worker) => {
                let now = clock.at(at, machine.poll_timeout());
                let worker = worker % 8;
                let can = machine.can_hand_out(now, &worker);
                let expected = model.hand_out(&policy, now, worker);
                let got = machine.handle_hand_out(&policy, now, worker);
                ensure!(ctx, can == got.is_ok(), "D1", "can_hand_out said {can}, handle_hand_out {got:?}");
                if let Err(refused) = &got {
                    ensure!(ctx, refused.input == worker, "G12", "the refused worker came back as {}", refused.input);
                }
                compare(ctx, got.map_err(|r| r.error), expected)
            }
            Op::Started(at, attempt, worker) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let expected = model.started(&policy, now, attempt, worker);
                compare(ctx, machine.handle_started(&policy, now, attempt, &worker), expected)
            }
            Op::Heartbeat(at, attempt, worker, checkpoint) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let expected = model.heartbeat(&policy, now, attempt, worker, checkpoint);
                let got = machine.handle_heartbeat(&policy, now, attempt, &worker, checkpoint);
                compare_returned(ctx, got, &checkpoint, expected)
            }
            Op::Persisted(at, attempt) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(current);
                compare(ctx, machine.handle_persisted(now, attempt), model.persisted(now, attempt))
            }
            Op::Completed(at, attempt, worker) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let expected = model.completed(now, attempt, worker);
                compare(ctx, machine.handle_success(now, attempt, &worker), expected)
            }
            Op::Failed(at, attempt, worker, kind, error) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let failure = Failure::new(kind.get(now), error);
                let got = machine.handle_failure(&policy, now, attempt, &worker, failure, &mut rng);
                let expected = model.failed(&policy, now, attempt, worker, failure, waits(&machine));
                compare_returned(ctx, got, &failure, expected)
            }
            Op::Interrupted(at, attempt, worker, reason) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let reason = match reason {
                    InterruptionIn::WorkerCrashed => Interruption::WorkerCrashed,
                    InterruptionIn::Disconnected => Interruption::Disconnected,
                    InterruptionIn::LeaseExpired => Interruption::LeaseExpired,
                    InterruptionIn::HeartbeatMissed => Interruption::HeartbeatMissed,
                    InterruptionIn::ServerFailover => Interruption::ServerFailover,
                };
                let got = machine.handle_interrupted(&policy, now, attempt, &worker, reason, &mut rng);
                compare(ctx, got, model.interrupted(&policy, now, attempt, worker, reason, waits(&machine)))
            }
            Op::Returned(at, attempt, worker, reason) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let reason = match reason {
                    ReturnIn::Declined => FreeReturn::Declined,
                    ReturnIn::SendFailed => FreeReturn::SendFailed,
                    ReturnIn::ClosedBeforeStart => FreeReturn::ClosedBeforeStart,
                };
                let expected = model.returned(&policy, now, attempt, worker, reason);
                let got = machine.handle_returned(&policy, now, attempt, &worker, reason);
                if got.is_ok() {
                    check_free_return(ctx, &policy, &before, &machine, reason);
                }
                compare(ctx, got, expected)
            }
            Op::Failover(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let got = machine.handle_failover(&policy, now, &mut rng);
                compare(ctx, got, model.failover(&policy, now, waits(&machine)))
            }
            Op::Timeout(at) | Op::Timeout2(at) => {
                let now = clock.at(at, machine.poll_timeout());
                machine.handle_timeout(&policy, now, &mut rng);
                model.timeout(&policy, now, waits(&machine));
                if was.poll_timeout().is_none_or(|t| t > was.last_now.later(now)) {
                    ensure!(ctx, machine == before, "D1", "an early or spurious handle_timeout changed the task");
                }
                if was.pending != 0 {
                    ensure!(
                        ctx,
                        machine == before,
                        "drain",
                        "a handle_timeout with actions undrained changed the task"
                    );
                }
                Ok(())
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
        // The drain rule: with actions of an earlier input undrained, every report is refused (by a
        // validity error, or as undrained); a failover is refused while an attempt is out.
        let input = !matches!(op, Op::Timeout(_) | Op::Timeout2(_) | Op::Hold | Op::Drain)
            && (was.out().is_some() || !matches!(op, Op::Failover(_)));
        if was.pending != 0 && input {
            ensure!(ctx, result.is_err(), "drain", "{op:?} was accepted while actions waited to be drained");
        }
        if result.is_err() {
            ensure!(ctx, machine == before, "G12", "a refused input changed the task");
            if matches!(was.state, State::Done(_)) {
                ensure!(
                    ctx,
                    matches!(result, Err(DeliveryError::Finished(_))),
                    "D9",
                    "a finished task refused with {result:?}"
                );
            }
        }
        ensure!(
            ctx,
            machine.has_actions() == (model.pending != 0),
            "drain",
            "actions waiting: {}, the model says {}",
            machine.has_actions(),
            model.pending != 0
        );
        let got = if holding { Vec::new() } else { drain(&mut machine) };
        check_guarantees(ctx, &policy, sync, &mut seen, &was, &before, &machine, &got, model.last_now);
        if !holding {
            let expected = model.drain();
            ensure!(ctx, got == expected, "model", "actions {got:?}, the model expects {expected:?}");
        }
        check_state(ctx, &machine, &model);
    }
}

fn drain(machine: &mut Task) -> Vec<Act> {
    let mut actions = Vec::new();
    while let Some(action) = machine.poll_action() {
        actions.push(action);
        if actions.len() > 4 {
            break;
        }
    }
    actions
}

/// D3, D4: a free return keeps the attempt number and uses no retry; past the cap it
/// dead-letters.
fn check_free_return(ctx: Ctx<'_>, policy: &DeliveryPolicy<u8>, before: &Task, task: &Task, reason: FreeReturn) {
    ensure!(
        ctx,
        task.retries_used() == before.retries_used(),
        "D3",
        "a {reason:?} used a retry ({} → {})",
        before.retries_used(),
        task.retries_used()
    );
    match task.status() {
        DeliveryStatus::Pending { attempt, not_before: None } => {
            ensure!(
                ctx,
                *attempt == before.attempt(),
                "D3",
                "a {reason:?} changed the attempt {} → {attempt}",
                before.attempt()
            );
            ensure!(
                ctx,
                task.redeliveries() == before.redeliveries() + 1,
                "D4",
                "redeliveries {} after {}",
                task.redeliveries(),
                before.redeliveries()
            );
            ensure!(
                ctx,
                task.redeliveries() <= policy.max_redeliveries(),
                "D4",
                "{} free returns, max {}",
                task.redeliveries(),
                policy.max_redeliveries()
            );
        }
        DeliveryStatus::Done(Terminal::DeadLettered(letter)) => {
            ensure!(
                ctx,
                letter.redeliveries == policy.max_redeliveries(),
                "D4",
                "dead-lettered after {} free returns, max {}",
                letter.redeliveries,
                policy.max_redeliveries()
            );
            ensure!(ctx, letter.attempt == before.attempt() && letter.reason == reason, "D4", "dead letter {letter:?}");
        }
        other => ensure!(ctx, false, "D3", "a {reason:?} left {other:?}"),
    }
    if reason == FreeReturn::SendFailed {
        ensure!(ctx, task.attempt_progress() == before.attempt_progress(), "D5", "a failed send changed the progress");
    }
}

/// The guarantees of one step's actions, from the state before and after (without the model).
#[allow(clippy::too_many_arguments)]
fn check_guarantees(
    ctx: Ctx<'_>,
    policy: &DeliveryPolicy<u8>,
    sync: bool,
    seen: &mut Seen,
    was: &Model,
    before: &Task,
    task: &Task,
    actions: &[Act],
    now: Instant,
) {
    // What happened to the attempt that was out.
    if let Some((attempt, worker, durable, started)) = was.out() {
        let rolled_back = !durable
            && matches!(task.status(), DeliveryStatus::Pending { attempt: a, .. } if *a == attempt)
            && task.redeliveries() == before.redeliveries();
        match task.status() {
            DeliveryStatus::Running { attempt: a, worker: w, .. } => {
                ensure!(
                    ctx,
                    *a == attempt && *w == worker,
                    "D1",
                    "attempt {attempt} of worker {worker} became {a} of {w}"
                );
            }
            DeliveryStatus::Pending { attempt: next, .. } if rolled_back => {
                // D6: an Async rollback reruns the same attempt and uses no retry.
                ensure!(
                    ctx,
                    *next == attempt && task.retries_used() == before.retries_used(),
                    "D6",
                    "a rollback moved to attempt {next}"
                );
                ensure!(
                    ctx,
                    task.attempt_progress() == AttemptProgress::NotCompleted,
                    "D6",
                    "progress after a rollback"
                );
            }
            DeliveryStatus::Pending { attempt: next, .. } if *next != attempt => {
                // D2: a failure or an interruption consumes a retry; its number is never reused.
                ensure!(ctx, *next == attempt + 1, "D2", "attempt {attempt} was followed by {next}");
                ensure!(
                    ctx,
                    task.retries_used() == before.retries_used() + 1,
                    "D2",
                    "retries used {} → {}",
                    before.retries_used(),
                    task.retries_used()
                );
                seen.consumed.insert(attempt);
            }
            DeliveryStatus::Done(Terminal::Failed(_) | Terminal::Proceeded(_) | Terminal::Diverted { .. }) => {
                seen.consumed.insert(attempt);
            }
            _ => {}
        }
        if started || matches!(task.status(), DeliveryStatus::Running { .. }) {
            seen.reached = true;
        }
    }
    if let DeliveryStatus::Running { attempt, worker, .. } = task.status() {
        seen.reached = true;
        if sync {
            // G10: in Sync mode an attempt number runs on at most one worker.
            let first = *seen.started_by.entry(*attempt).or_insert(*worker);
            ensure!(ctx, first == *worker, "G10", "attempt {attempt} ran on worker {first} and on worker {worker}");
        }
    }
    if task.attempt_progress() == AttemptProgress::NotCompleted && was.progress == AttemptProgress::NotStarted {
        seen.reached = true;
    }
    if task.attempt_progress() == AttemptProgress::NotStarted {
        ensure!(ctx, sync && !seen.reached, "D5", "progress NotStarted although an attempt reached a worker");
    }
    for action in actions {
        ensure!(ctx, seen.finishes == 0, "D9", "{action:?} after the task finished");
        match action {
            DeliveryAction::HandOut(out) => {
                ensure!(
                    ctx,
                    !seen.consumed.contains(&out.attempt),
                    "D2",
                    "attempt {} handed out again after it was used up",
                    out.attempt
                );
                ensure!(
                    ctx,
                    out.key == IdempotencyKey { task: TASK, step_execution: STEP },
                    "D10",
                    "key {:?}",
                    out.key
                );
                ensure!(
                    ctx,
                    out.checkpoint == task.checkpoint().copied(),
                    "D7",
                    "hand-out carries {:?}, stored {:?}",
                    out.checkpoint,
                    task.checkpoint()
                );
                let lease = now.saturating_add(policy.start_timeout());
                ensure!(
                    ctx,
                    out.deadline == lease,
                    "D1",
                    "the hand-out's lease ends {:?}, expected {lease:?}",
                    out.deadline
                );
            }
            DeliveryAction::Ready { attempt } => {
                ensure!(
                    ctx,
                    !seen.consumed.contains(attempt),
                    "D2",
                    "attempt {attempt} ready again after it was used up"
                );
            }
            DeliveryAction::Finish(terminal) => {
                seen.finishes += 1;
                ensure!(
                    ctx,
                    task.terminal() == Some(terminal),
                    "D9",
                    "finished {terminal:?} but the state is {:?}",
                    task.status()
                );
                if let Some(error) = terminal.recovery_error() {
                    // B6: only a deferred task has an instant to come back at.
                    ensure!(
                        ctx,
                        error.retry_at.is_some() == (error.ended == OutcomeKind::Deferred)
                            && (error.ended != OutcomeKind::Deferred
                                || error.last_failure.class == FailureClass::RetryAfter),
                        "B6",
                        "retries ended {:?} after {:?} with retry_at {:?}",
                        error.ended,
                        error.last_failure.class,
                        error.retry_at
                    );
                    let limit = policy.retry().max_attempts().map_or(u64::MAX, u64::from);
                    ensure!(
                        ctx,
                        error.stats.attempts <= limit,
                        "G2",
                        "{} attempt numbers used under a limit of {limit}",
                        error.stats.attempts
                    );
                }
            }
            DeliveryAction::Revoke { .. } => {}
        }
    }
}

fn check_state(ctx: Ctx<'_>, task: &Task, model: &Model) {
    let _ = model.check(&mut ctx.judge(), task, 0..8u8);
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
