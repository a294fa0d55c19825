//! One task's redelivery, written once for the `delivery` family and the delivery fuzz target:
//! what every input does to a [`persevere::Delivery`] (D1–D10, with the embedded retry's R-rules
//! and B6 through the retry model).
//!
//! The model holds the task's state, its checkpoint (and the one the attempt out was handed
//! out with, for an `Async` rollback), its free returns, the workers that declined it and the
//! actions its last input left. Every input while actions wait to be drained is refused with
//! `Undrained` (after the validity errors), and a timeout then does nothing.

use std::collections::VecDeque;
use std::fmt::Debug;

use persevere::{
    AttemptFailure, AttemptProgress, DeadLetter, Delivery, DeliveryAction, DeliveryError, DeliveryPolicy,
    DeliveryStatus, Durability, Failure, FailureClass, FailureKind, FailurePolicy, FreeReturn, HandOut, IdempotencyKey,
    Instant, Interruption, LastFailure, Outcome, RecoveryError, RetryAction, Stats, Terminal,
};

use super::Judge;
use super::retry::RetryModel;

/// Where a task is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum State<W, E, R> {
    /// Waiting for a hand-out of `attempt`, not before `not_before` (a retry delay).
    Pending { attempt: u64, not_before: Option<Instant> },
    /// Handed out to `worker`, who must start it by `deadline`.
    HandedOut { attempt: u64, worker: W, deadline: Instant, durable: bool },
    /// Started by `worker`, who must heartbeat by `heartbeat_deadline`.
    Running { attempt: u64, worker: W, heartbeat_deadline: Instant, durable: bool },
    /// Over.
    Done(Terminal<E, R>),
}

/// The actions an input may leave, in their drain order (D9: the finish is last).
const REVOKE: u8 = 1;
const READY: u8 = 2;
const HAND_OUT: u8 = 4;
const FINISH: u8 = 8;

/// What a [`Delivery`] must be, restated from D1–D10, with the retry
/// model inside. Task key `K`, worker `W`, checkpoint `C`, error `E`, recovery route `R`.
#[derive(Clone, Debug)]
pub(crate) struct DeliveryModel<K, W, C, E, R> {
    pub(crate) key: IdempotencyKey<K>,
    pub(crate) state: State<W, E, R>,
    pub(crate) retry: RetryModel<AttemptFailure<E>>,
    pub(crate) progress: AttemptProgress,
    pub(crate) redeliveries: u32,
    pub(crate) checkpoint: Option<C>,
    /// The checkpoint when the attempt out was handed out (D6: restored by a rollback).
    snapshot: Option<C>,
    pub(crate) declined: VecDeque<W>,
    revoked: Option<(W, u64, Interruption)>,
    pub(crate) last_now: Instant,
    pub(crate) pending: u8,
}

/// D2: a missed deadline counts as a timeout, any other interruption as a retryable failure.
fn interruption_kind(reason: Interruption) -> FailureKind {
    match reason {
        Interruption::LeaseExpired | Interruption::HeartbeatMissed => FailureKind::Timeout,
        _ => FailureKind::Retryable,
    }
}

impl<K: Copy, W: Copy + PartialEq, C: Copy, E: Clone, R: Copy> DeliveryModel<K, W, C, E, R> {
    /// A task created at `now` under `policy`: pending for attempt 1, ready at once (D1).
    pub(crate) fn new(policy: &DeliveryPolicy<R>, now: Instant, key: IdempotencyKey<K>) -> Self {
        let mut retry = RetryModel::new();
        let _ = retry.start(policy.retry(), now);
        DeliveryModel {
            key,
            state: State::Pending { attempt: 1, not_before: None },
            retry,
            // D5: in `Sync` mode nothing has run until a worker says it started.
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

    /// The status the task must report.
    pub(crate) fn status(&self) -> DeliveryStatus<W, E, R> {
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

    /// What the task must have taken so far.
    pub(crate) fn stats(&self) -> Stats {
        self.retry.stats()
    }

    /// The last failure the task must hold (D8).
    pub(crate) fn last_failure(&self) -> Option<&LastFailure<AttemptFailure<E>>> {
        self.retry.last_failure.as_ref()
    }

    /// The drain rule: an input while actions of an earlier one wait is refused.
    fn drained(&self) -> Result<(), DeliveryError> {
        if self.pending == 0 { Ok(()) } else { Err(DeliveryError::Undrained) }
    }

    /// When the task's timeout is due: the end of a retry delay, a lease or a heartbeat.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Pending { not_before, .. } => not_before,
            State::HandedOut { deadline, .. } => Some(deadline),
            State::Running { heartbeat_deadline, .. } => Some(heartbeat_deadline),
            State::Done(_) => None,
        }
    }

    /// The attempt out, if one is: `(attempt, worker, durable, started)`.
    pub(crate) fn out(&self) -> Option<(u64, W, bool, bool)> {
        match self.state {
            State::HandedOut { attempt, worker, durable, .. } => Some((attempt, worker, durable, false)),
            State::Running { attempt, worker, durable, .. } => Some((attempt, worker, durable, true)),
            _ => None,
        }
    }

    /// The actions the last input left, in the drain order; drains them.
    pub(crate) fn drain(&mut self) -> Vec<DeliveryAction<K, W, C, E, R>> {
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
                        key: self.key,
                        attempt: *attempt,
                        worker: *worker,
                        deadline: *deadline,
                        checkpoint: self.checkpoint,
                    }))
                }
                (FINISH, State::Done(terminal)) => Some(DeliveryAction::Finish(terminal.clone())),
                _ => None,
            };
            actions.extend(action);
        }
        self.pending = 0;
        actions
    }

    /// Whether a report about `got` may be taken: `Ok(started)` when it is the attempt out.
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

    /// [`check_attempt`](Self::check_attempt), and the report comes from the worker holding it.
    fn check_out(&self, got: u64, worker: W) -> Result<bool, DeliveryError> {
        let started = self.check_attempt(got)?;
        match self.out() {
            Some((_, holder, _, _)) if holder != worker => Err(DeliveryError::WrongWorker { attempt: got }),
            _ => Ok(started),
        }
    }

    /// Why the task may not be handed to `worker` at `now`, if it may not (D1, D3).
    pub(crate) fn check_hand_out(&self, now: Instant, worker: W) -> Result<(), DeliveryError> {
        match self.state {
            State::Done(ref terminal) => Err(DeliveryError::Finished(terminal.kind())),
            State::HandedOut { attempt, .. } | State::Running { attempt, .. } => {
                Err(DeliveryError::AlreadyHandedOut { attempt })
            }
            State::Pending { attempt, not_before: Some(t) } if t > self.last_now.later(now) => {
                Err(DeliveryError::NotYetEligible { attempt, not_before: t })
            }
            _ if self.declined.contains(&worker) => Err(DeliveryError::WorkerDeclined),
            _ => self.drained(),
        }
    }

    /// D1: the pending attempt goes to `worker`, who must start it within the start timeout.
    pub(crate) fn hand_out(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        worker: W,
    ) -> Result<(), DeliveryError> {
        self.check_hand_out(now, worker)?;
        let now = self.last_now.later(now);
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

    /// D5: the attempt out runs, under a heartbeat deadline from `now`.
    fn start(&mut self, policy: &DeliveryPolicy<R>, now: Instant) {
        let heartbeat_deadline = now.saturating_add(policy.heartbeat_timeout());
        self.progress = AttemptProgress::NotCompleted;
        if let Some((attempt, worker, durable, _)) = self.out() {
            self.state = State::Running { attempt, worker, heartbeat_deadline, durable };
        }
    }

    /// The worker started the attempt it holds.
    pub(crate) fn started(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: W,
    ) -> Result<(), DeliveryError> {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        self.drained()?;
        self.last_now = self.last_now.later(now);
        self.start(policy, self.last_now);
        Ok(())
    }

    /// D7: a heartbeat (which also starts a handed-out attempt) renews the deadline and stores
    /// its checkpoint.
    pub(crate) fn heartbeat(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: W,
        checkpoint: Option<C>,
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

    /// D6: an `Async` start is confirmed durable.
    pub(crate) fn persisted(&mut self, now: Instant, attempt: u64) -> Result<(), DeliveryError> {
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

    /// The attempt out completed: the task finishes.
    pub(crate) fn completed(&mut self, now: Instant, attempt: u64, worker: W) -> Result<(), DeliveryError> {
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let _ = self.retry.success(self.last_now, attempt);
        self.progress = AttemptProgress::NotCompleted;
        self.state = State::Done(Terminal::Completed { attempt });
        self.pending |= FINISH;
        Ok(())
    }

    /// D2: the attempt out failed; the retry rules decide. `observed` is the wait the task
    /// chose (see [`super::backoff::adopt`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn failed(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: W,
        failure: Failure<E>,
        observed: Option<Instant>,
    ) -> Result<(), DeliveryError> {
        self.check_out(attempt, worker)?;
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let failure = Failure::new(failure.kind, AttemptFailure::Failed(failure.error));
        self.fail_attempt(policy, self.last_now, failure, observed);
        Ok(())
    }

    /// D2, D6: the attempt out was interrupted; a failover rolls back an attempt not yet
    /// durable, anything else consumes a retry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn interrupted(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: W,
        reason: Interruption,
        observed: Option<Instant>,
    ) -> Result<(), DeliveryError> {
        let durable = self.out().is_none_or(|o| o.2);
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

    /// D3, D4: a hand-out that never ran comes back without using a retry; past the cap of
    /// free returns the task is dead-lettered.
    pub(crate) fn returned(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: W,
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
                last_failure: self.retry.last_failure.clone(),
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
    pub(crate) fn failover(
        &mut self,
        policy: &DeliveryPolicy<R>,
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

    /// A retry delay, a lease or a heartbeat deadline ended; nothing at all while actions wait
    /// to be drained, or before anything is due.
    pub(crate) fn timeout(&mut self, policy: &DeliveryPolicy<R>, now: Instant, observed: Option<Instant>) {
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

    /// D2: an interruption consumes a retry; a missed deadline also revokes the attempt.
    fn interrupt(&mut self, policy: &DeliveryPolicy<R>, now: Instant, reason: Interruption, observed: Option<Instant>) {
        if matches!(reason, Interruption::LeaseExpired | Interruption::HeartbeatMissed)
            && let Some((attempt, worker, _, _)) = self.out()
        {
            self.revoked = Some((worker, attempt, reason));
            self.pending |= REVOKE;
        }
        let failure = Failure::new(interruption_kind(reason), AttemptFailure::Interrupted(reason));
        self.fail_attempt(policy, now, failure, observed);
    }

    /// The retry model decides after a failed attempt: pending for the next one (after its
    /// delay), or over.
    fn fail_attempt(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        failure: Failure<AttemptFailure<E>>,
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

    /// D8, with B6: retries ended; the failure policy says how the task ends, and a task whose
    /// retries were deferred by a hint tells when it may be retried.
    fn conclude(&mut self, policy: &DeliveryPolicy<R>, outcome: Outcome<AttemptFailure<E>>, stats: Stats) {
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

    /// D6: an attempt that was never durable is rolled back: the same attempt is pending again,
    /// and what it stored is lost with it.
    fn roll_back(&mut self) {
        self.progress = AttemptProgress::NotCompleted;
        self.checkpoint = self.snapshot.take();
        self.state = State::Pending { attempt: self.retry.attempt, not_before: None };
        self.pending |= READY;
    }
}

/// The instant `task` waits until before its next hand-out, if a retry delay is running;
/// `Instant::ZERO` when a retry is due at once (a delay of zero), `None` when none is pending:
/// what the model adopts as the task's draw ([`super::backoff::adopt`]).
pub(crate) fn waits<K, W, C, E, R>(task: &Delivery<K, W, C, E, R>) -> Option<Instant> {
    match task.status() {
        DeliveryStatus::Pending { not_before, .. } => Some(not_before.unwrap_or(Instant::ZERO)),
        _ => None,
    }
}

impl<K, W, C, E, R> DeliveryModel<K, W, C, E, R>
where
    K: Copy,
    W: Copy + PartialEq + Debug,
    C: Copy + PartialEq + Debug,
    E: Clone + PartialEq + Debug,
    R: Copy + PartialEq + Debug,
{
    /// Holds `task` to the model: its status, timeout, progress (D5), free returns (D4),
    /// checkpoint (D7), statistics, last failure (D8), and which of `workers` declined it (D3).
    pub(crate) fn check<J: Judge>(
        &self,
        judge: &mut J,
        task: &Delivery<K, W, C, E, R>,
        workers: impl IntoIterator<Item = W>,
    ) -> Result<(), J::Error> {
        let expected = self.status();
        judge.check("model", *task.status() == expected, || {
            format!("state {:?}, the model expects {expected:?}", task.status())
        })?;
        judge.check("D1", task.poll_timeout() == self.poll_timeout(), || {
            format!("poll_timeout {:?}, expected {:?}", task.poll_timeout(), self.poll_timeout())
        })?;
        judge.check("D5", task.attempt_progress() == self.progress, || {
            format!("progress {:?}, expected {:?}", task.attempt_progress(), self.progress)
        })?;
        judge.check("D4", task.redeliveries() == self.redeliveries, || {
            format!("{} free returns, the model counts {}", task.redeliveries(), self.redeliveries)
        })?;
        judge.check("D7", task.checkpoint() == self.checkpoint.as_ref(), || {
            format!("checkpoint {:?}, expected {:?}", task.checkpoint(), self.checkpoint)
        })?;
        judge.check("model", task.stats() == self.stats(), || {
            format!("stats {:?}, expected {:?}", task.stats(), self.stats())
        })?;
        judge.check("D8", task.last_failure() == self.last_failure(), || {
            format!("last failure {:?}, expected {:?}", task.last_failure(), self.last_failure())
        })?;
        for worker in workers {
            let declined = self.declined.contains(&worker);
            judge.check("D3", task.has_declined(&worker) == declined, || {
                format!("worker {worker:?}: declined {}, the model says {declined}", task.has_declined(&worker))
            })?;
        }
        Ok(())
    }
}
