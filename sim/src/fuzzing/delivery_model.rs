//! One task's redelivery (D1–D10, G10–G12) against a reference model built on the retry model,
//! with independent checks of what consumes a retry and what does not.
//!
//! The embedded retry follows the R-rules as revised by issue 12 (through [`RetryModel`]): a
//! hint past `max_hint` or past the total budget ends retries with `Deferred` and the hinted
//! instant in the recovery error (B6). Every input while actions of an earlier one wait to be
//! drained is refused with `Undrained` (after the validity errors) and a timeout does nothing:
//! the `Hold` operation stops the draining until `Drain`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use arbitrary::Arbitrary;
use persevere::{
    AttemptFailure, AttemptProgress, DeadLetter, Delivery, DeliveryAction, DeliveryError, DeliveryPolicy,
    DeliveryPolicyBuilder, DeliveryStatus, Durability, Failure, FailureClass, FailurePolicy, FreeReturn, HandOut,
    IdempotencyKey, Instant, Interruption, LastFailure, Outcome, OutcomeKind, RecoveryError, RetryAction, Terminal,
};

use super::retry_model::{AttemptIn, KindIn, RetryIn, RetryModel};
use super::{
    At, Clock, Count, Ctx, ErrorKind, SETUP, Span, compare, compare_returned, ensure, nanos, parse, rng, verdict,
};

type Task = Delivery<u8, u8, u16, u8, u8>;
type Act = DeliveryAction<u8, u8, u16, u8, u8>;
type Term = Terminal<u8, u8>;

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

#[derive(Clone, Debug, PartialEq)]
enum State {
    Pending { attempt: u64, not_before: Option<Instant> },
    HandedOut { attempt: u64, worker: u8, deadline: Instant, durable: bool },
    Running { attempt: u64, worker: u8, heartbeat_deadline: Instant, durable: bool },
    Done(Term),
}

const REVOKE: u8 = 1;
const READY: u8 = 2;
const HAND_OUT: u8 = 4;
const FINISH: u8 = 8;

/// What a [`Delivery`] must be, restated from D1–D10, with the retry model inside.
#[derive(Clone, Debug)]
struct Model {
    state: State,
    retry: RetryModel<AttemptFailure<u8>>,
    progress: AttemptProgress,
    redeliveries: u32,
    checkpoint: Option<u16>,
    snapshot: Option<u16>,
    declined: VecDeque<u8>,
    revoked: Option<(u8, u64, Interruption)>,
    last_now: Instant,
    pending: u8,
}

impl Model {
    fn new(policy: &DeliveryPolicy<u8>, now: Instant) -> Self {
        let mut retry = RetryModel::new();
        let _ = retry.start(policy.retry(), now);
        Model {
            state: State::Pending { attempt: 1, not_before: None },
            retry,
            progress: match policy.durability() {
                Durability::Sync => AttemptProgress::NotStarted,
                Durability::Async => AttemptProgress::NotCompleted,
            },
            redeliveries: 0,
            checkpoint: None,
            snapshot: None,
            declined: VecDeque::new(),
            revoked: None,
            last_now: now,
            pending: READY,
        }
    }

    fn status(&self) -> DeliveryStatus<u8, u8, u8> {
        match self.state.clone() {
            State::Pending { attempt, not_before } => DeliveryStatus::Pending { attempt, not_before },
            State::HandedOut { attempt, worker, deadline, durable } => {
                DeliveryStatus::HandedOut { attempt, worker, deadline, durable }
            }
            State::Running { attempt, worker, heartbeat_deadline, durable } => {
                DeliveryStatus::Running { attempt, worker, heartbeat_deadline, durable }
            }
            State::Done(terminal) => DeliveryStatus::Done(terminal),
        }
    }

    /// The drain rule: an input while actions of an earlier one wait is refused.
    fn drained(&self) -> Result<(), DeliveryError> {
        if self.pending == 0 { Ok(()) } else { Err(DeliveryError::Undrained) }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Pending { not_before, .. } => not_before,
            State::HandedOut { deadline, .. } => Some(deadline),
            State::Running { heartbeat_deadline, .. } => Some(heartbeat_deadline),
            State::Done(_) => None,
        }
    }

    fn out(&self) -> Option<(u64, u8, bool, bool)> {
        match self.state {
            State::HandedOut { attempt, worker, durable, .. } => Some((attempt, worker, durable, false)),
            State::Running { attempt, worker, durable, .. } => Some((attempt, worker, durable, true)),
            _ => None,
        }
    }

    fn drain(&mut self) -> Vec<Act> {
        let mut actions = Vec::new();
        for bit in [REVOKE, READY, HAND_OUT, FINISH] {
            if self.pending & bit == 0 {
                continue;
            }
            let action = match (bit, &self.state) {
                (REVOKE, _) => self.revoked.take().map(|(worker, attempt, reason)| DeliveryAction::Revoke {
                    worker,
                    attempt,
                    reason,
                }),
                (READY, State::Pending { attempt, not_before: None }) => {
                    Some(DeliveryAction::Ready { attempt: *attempt })
                }
                (HAND_OUT, State::HandedOut { attempt, worker, deadline, .. }) => {
                    Some(DeliveryAction::HandOut(HandOut {
                        key: IdempotencyKey { task: TASK, step_execution: STEP },
                        attempt: *attempt,
                        worker: *worker,
                        deadline: *deadline,
                        checkpoint: self.checkpoint,
                    }))
                }
                (FINISH, State::Done(terminal)) => Some(DeliveryAction::Finish(*terminal)),
                _ => None,
            };
            actions.extend(action);
        }
        self.pending = 0;
        actions
    }

    fn check_attempt(&self, got: u64) -> Result<bool, DeliveryError> {
        match self.state {
            State::Done(ref terminal) => Err(DeliveryError::Finished(terminal.kind())),
            State::Pending { attempt, .. } if attempt == got => Err(DeliveryError::NotHandedOut { attempt }),
            State::Pending { attempt, .. } => Err(DeliveryError::StaleAttempt { current: attempt, got }),
            State::HandedOut { attempt, .. } | State::Running { attempt, .. } if attempt != got => {
                Err(DeliveryError::StaleAttempt { current: attempt, got })
            }
            State::HandedOut { .. } => Ok(false),
            State::Running { .. } => Ok(true),
        }
    }

    fn check_out(&self, got: u64, worker: u8) -> Result<bool, DeliveryError> {
        let started = self.check_attempt(got)?;
        match self.out() {
            Some((_, holder, _, _)) if holder != worker => Err(DeliveryError::WrongWorker { attempt: got }),
            _ => Ok(started),
        }
    }

    fn hand_out(&mut self, policy: &DeliveryPolicy<u8>, now: Instant, worker: u8) -> Result<(), DeliveryError> {
        let now = self.last_now.later(now);
        match self.state {
            State::Done(ref terminal) => return Err(DeliveryError::Finished(terminal.kind())),
            State::HandedOut { attempt, .. } | State::Running { attempt, .. } => {
                return Err(DeliveryError::AlreadyHandedOut { attempt });
            }
            State::Pending { attempt, not_before: Some(t) } if t > now => {
                return Err(DeliveryError::NotYetEligible { attempt, not_before: t });
            }
            _ if self.declined.contains(&worker) => return Err(DeliveryError::WorkerDeclined),
            _ => self.drained()?,
        }
        self.last_now = now;
        self.snapshot = self.checkpoint;
        self.state = State::HandedOut {
            attempt: self.retry.attempt,
            worker,
            deadline: now.saturating_add(policy.start_timeout()),
            durable: policy.durability() == Durability::Sync,
        };
        self.pending |= HAND_OUT;
        Ok(())
    }

    fn start(&mut self, policy: &DeliveryPolicy<u8>, now: Instant) {
        let heartbeat_deadline = now.saturating_add(policy.heartbeat_timeout());
        self.progress = AttemptProgress::NotCompleted;
        if let Some((attempt, worker, durable, _)) = self.out() {
            self.state = State::Running { attempt, worker, heartbeat_deadline, durable };
        }
    }

    fn started(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        attempt: u64,
        worker: u8,
    ) -> Result<(), DeliveryError> {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        self.drained()?;
        self.last_now = self.last_now.later(now);
        self.start(policy, self.last_now);
        Ok(())
    }

    fn heartbeat(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        attempt: u64,
        worker: u8,
        checkpoint: Option<u16>,
    ) -> Result<(), DeliveryError> {
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        self.start(policy, self.last_now);
        if checkpoint.is_some() {
            self.checkpoint = checkpoint;
        }
        Ok(())
    }

    fn persisted(&mut self, now: Instant, attempt: u64) -> Result<(), DeliveryError> {
        self.check_attempt(attempt)?;
        self.drained()?;
        match &mut self.state {
            State::HandedOut { durable, .. } | State::Running { durable, .. } if !*durable => {
                *durable = true;
                self.last_now = self.last_now.later(now);
            }
            _ => {}
        }
        Ok(())
    }

    fn completed(&mut self, now: Instant, attempt: u64, worker: u8) -> Result<(), DeliveryError> {
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let _ = self.retry.success(self.last_now, attempt);
        self.progress = AttemptProgress::NotCompleted;
        self.state = State::Done(Terminal::Completed { attempt });
        self.pending |= FINISH;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn failed(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        attempt: u64,
        worker: u8,
        failure: Failure<u8>,
        observed: Option<Instant>,
    ) -> Result<(), DeliveryError> {
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let failure = Failure::new(failure.kind, AttemptFailure::Failed(failure.error));
        self.fail_attempt(policy, self.last_now, failure, observed);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn interrupted(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        attempt: u64,
        worker: u8,
        reason: Interruption,
        observed: Option<Instant>,
    ) -> Result<(), DeliveryError> {
        let (_, _, durable, _) = self.out().unwrap_or((0, 0, true, false));
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        if reason == Interruption::ServerFailover && !durable {
            self.roll_back();
        } else {
            self.interrupt(policy, self.last_now, reason, observed);
        }
        Ok(())
    }

    fn returned(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        attempt: u64,
        worker: u8,
        reason: FreeReturn,
    ) -> Result<(), DeliveryError> {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        self.drained()?;
        self.last_now = self.last_now.later(now);
        if reason != FreeReturn::SendFailed {
            self.progress = AttemptProgress::NotCompleted;
        }
        if reason == FreeReturn::Declined && !self.declined.contains(&worker) {
            self.declined.push_back(worker);
            if self.declined.len() > persevere::DECLINED_CAPACITY {
                self.declined.pop_front();
            }
        }
        if self.redeliveries >= policy.max_redeliveries() {
            self.state = State::Done(Terminal::DeadLettered(DeadLetter {
                reason,
                attempt,
                redeliveries: self.redeliveries,
                progress: self.progress,
                last_failure: self.retry.last_failure,
            }));
            self.pending |= FINISH;
        } else {
            self.redeliveries += 1;
            self.state = State::Pending { attempt, not_before: None };
            self.pending |= READY;
        }
        Ok(())
    }

    /// D6: a failover affects only an attempt that is out; it is a fact the task must not miss,
    /// so while actions wait to be drained it is refused rather than ignored.
    fn failover(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        observed: Option<Instant>,
    ) -> Result<(), DeliveryError> {
        let Some((_, _, durable, _)) = self.out() else { return Ok(()) };
        self.drained()?;
        self.last_now = self.last_now.later(now);
        if durable {
            self.interrupt(policy, self.last_now, Interruption::ServerFailover, observed);
        } else {
            self.roll_back();
        }
        Ok(())
    }

    /// Nothing at all while actions wait to be drained.
    fn timeout(&mut self, policy: &DeliveryPolicy<u8>, now: Instant, observed: Option<Instant>) {
        if self.pending != 0 {
            return;
        }
        let now = self.last_now.later(now);
        let reason = match self.state {
            State::Pending { attempt, not_before: Some(t) } if t <= now => {
                self.last_now = now;
                self.state = State::Pending { attempt, not_before: None };
                self.pending |= READY;
                return;
            }
            State::HandedOut { deadline, .. } if deadline <= now => Interruption::LeaseExpired,
            State::Running { heartbeat_deadline, .. } if heartbeat_deadline <= now => Interruption::HeartbeatMissed,
            _ => return,
        };
        self.last_now = now;
        self.interrupt(policy, now, reason, observed);
    }

    fn interrupt(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        reason: Interruption,
        observed: Option<Instant>,
    ) {
        if matches!(reason, Interruption::LeaseExpired | Interruption::HeartbeatMissed)
            && let Some((attempt, worker, _, _)) = self.out()
        {
            self.revoked = Some((worker, attempt, reason));
            self.pending |= REVOKE;
        }
        let kind = match reason.class() {
            FailureClass::Timeout => persevere::FailureKind::Timeout,
            _ => persevere::FailureKind::Retryable,
        };
        self.fail_attempt(policy, now, Failure::new(kind, AttemptFailure::Interrupted(reason)), observed);
    }

    fn fail_attempt(
        &mut self,
        policy: &DeliveryPolicy<u8>,
        now: Instant,
        failure: Failure<AttemptFailure<u8>>,
        observed: Option<Instant>,
    ) {
        self.progress = AttemptProgress::NotCompleted;
        let attempt = self.retry.attempt;
        let actions = self.retry.failure(policy.retry(), now, attempt, failure, observed).unwrap_or_default();
        let mut until = None;
        for action in actions {
            match action {
                RetryAction::Sleep { until: t, .. } => until = Some(t),
                RetryAction::Finish { outcome, stats } => {
                    self.conclude(policy, outcome, stats);
                    return;
                }
                _ => {}
            }
        }
        let until = until.unwrap_or(now);
        let _ = self.retry.timeout(policy.retry(), until, None);
        let attempt = self.retry.attempt;
        self.state = State::Pending { attempt, not_before: (until > now).then_some(until) };
        if until <= now {
            self.pending |= READY;
        }
    }

    /// D8, with B6: a task whose retries were deferred by a hint tells when it may be retried.
    fn conclude(&mut self, policy: &DeliveryPolicy<u8>, outcome: Outcome<AttemptFailure<u8>>, stats: persevere::Stats) {
        let ended = outcome.kind();
        let retry_at = match outcome {
            Outcome::Deferred { retry_at, .. } => Some(retry_at),
            _ => None,
        };
        let last_failure =
            outcome.last_failure().cloned().unwrap_or(LastFailure { class: FailureClass::Canceled, error: None });
        let error = RecoveryError { ended, last_failure, retry_at, progress: self.progress, stats };
        self.state = State::Done(match *policy.on_failure() {
            FailurePolicy::Fail => Terminal::Failed(error),
            FailurePolicy::Proceed => Terminal::Proceeded(error),
            FailurePolicy::Divert(route) => Terminal::Diverted { route, error },
        });
        self.pending |= FINISH;
    }

    fn roll_back(&mut self) {
        self.progress = AttemptProgress::NotCompleted;
        self.checkpoint = self.snapshot.take();
        self.state = State::Pending { attempt: self.retry.attempt, not_before: None };
        self.pending |= READY;
    }
}

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
    let mut model = Model::new(&policy, created);
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
                compare(ctx, machine.handle_persisted(&policy, now, attempt), model.persisted(now, attempt))
            }
            Op::Completed(at, attempt, worker) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let expected = model.completed(now, attempt, worker);
                compare(ctx, machine.handle_completed(&policy, now, attempt, &worker), expected)
            }
            Op::Failed(at, attempt, worker, kind, error) => {
                let now = clock.at(at, machine.poll_timeout());
                let (attempt, worker) = (attempt.get(current), worker_of(worker));
                let failure = Failure::new(kind.get(now), error);
                let got = machine.handle_failed(&policy, now, attempt, &worker, failure, &mut rng);
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

/// The instant `task` waits until before its next hand-out, if a retry delay is running;
/// `Instant::ZERO` when a retry is due at once (a delay of zero), `None` when none is pending.
fn waits(task: &Task) -> Option<Instant> {
    match task.status() {
        DeliveryStatus::Pending { not_before, .. } => Some(not_before.unwrap_or(Instant::ZERO)),
        _ => None,
    }
}

fn check_state(ctx: Ctx<'_>, task: &Task, model: &Model) {
    let expected = model.status();
    ensure!(ctx, *task.status() == expected, "model", "state {:?}, the model expects {expected:?}", task.status());
    ensure!(
        ctx,
        task.poll_timeout() == model.poll_timeout(),
        "D1",
        "poll_timeout {:?}, expected {:?}",
        task.poll_timeout(),
        model.poll_timeout()
    );
    ensure!(
        ctx,
        task.attempt_progress() == model.progress,
        "D5",
        "progress {:?}, expected {:?}",
        task.attempt_progress(),
        model.progress
    );
    ensure!(
        ctx,
        task.redeliveries() == model.redeliveries,
        "D4",
        "{} free returns, the model counts {}",
        task.redeliveries(),
        model.redeliveries
    );
    ensure!(
        ctx,
        task.checkpoint() == model.checkpoint.as_ref(),
        "D7",
        "checkpoint {:?}, expected {:?}",
        task.checkpoint(),
        model.checkpoint
    );
    ensure!(
        ctx,
        task.stats() == model.retry.stats(),
        "model",
        "stats {:?}, expected {:?}",
        task.stats(),
        model.retry.stats()
    );
    ensure!(
        ctx,
        task.last_failure() == model.retry.last_failure.as_ref(),
        "D8",
        "last failure {:?}, expected {:?}",
        task.last_failure(),
        model.retry.last_failure
    );
    for worker in 0..8u8 {
        ensure!(
            ctx,
            task.has_declined(&worker) == model.declined.contains(&worker),
            "D3",
            "worker {worker}: declined {}",
            task.has_declined(&worker)
        );
    }
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
