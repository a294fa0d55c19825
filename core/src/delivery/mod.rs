//! Redelivery: one task's attempts handed to workers that can crash, disconnect, stop
//! heartbeating or decline, while the server itself can fail over (rules D1–D10).
//!
//! A [`DeliveryPolicy`] is the shared, immutable configuration (a [`RetryPolicy`] plus the
//! leases, the free-return cap, the durability mode and the failure policy); a [`Delivery`] is
//! one task's state: plain data, no policy, RNG or clock inside, so a durable engine can
//! persist it alone. With the `alloc` feature, [`Deliveries`](crate::Deliveries) keeps a table
//! of them keyed by task id for a dispatcher.
//!
//! # What consumes a retry
//!
//! | the attempt ended by                                         | retry used | attempt number   | progress            |
//! |--------------------------------------------------------------|------------|------------------|---------------------|
//! | a result: success ([`Delivery::handle_success`])           | —          | —                | (terminal)          |
//! | a result: failure ([`Delivery::handle_failure`])              | yes (R-rules) | next          | `NotCompleted`      |
//! | an [`Interruption`]: crash, disconnect, missed lease or heartbeat, server failover | yes | next (never reused, D2) | `NotCompleted` |
//! | a [`FreeReturn`]: declined, send failed, closed before start | no (D3), capped by `max_redeliveries` (D4) | same | unchanged for a failed send, else `NotCompleted` |
//! | an `Async` rollback: the server failed over before the start was durable | no (D6) | same | `NotCompleted` |
//!
//! Retries are counted by an embedded [`Retry`] machine, so limits, fatal classes, hints and
//! the total budget follow the R-rules exactly (`max_attempts` counts every attempt number,
//! `max_retries(n)` allows `n + 1`). When retries end, the [`FailurePolicy`] decides (D8).

mod load;
mod outcome;
mod policy;

use rand_core::Rng;

use crate::Instant;
use crate::error::Refused;
use crate::failure::{Failure, FailureClass, LastFailure};
use crate::retry::{Outcome, Retry, RetryAction, Stats};

pub use outcome::{
    AttemptFailure, AttemptProgress, DeadLetter, DeliveryAction, DeliveryError, DeliveryStatus, FreeReturn, HandOut,
    IdempotencyKey, Interruption, RecoveryError, Terminal, TerminalKind,
};
pub use policy::{DeliveryPolicy, DeliveryPolicyBuilder, Durability, FailurePolicy};

/// How many declining workers one task remembers (D3).
///
/// The set is a fixed array, so a [`Delivery`] never allocates. Every decline is a free return,
/// and free returns are capped by `max_redeliveries` (default 3), so with the default cap a task
/// is dead-lettered before the set can overflow. With a larger cap the set keeps the latest
/// `DECLINED_CAPACITY` decliners (oldest first out): a forgotten decliner may be offered the task
/// again, which costs one more free return and can never cost a retry. The `Deliveries` table
/// additionally remembers every (worker, task type) decline without a bound.
pub const DECLINED_CAPACITY: usize = 4;

const REVOKE: u8 = 1;
const READY: u8 = 2;
const HAND_OUT: u8 = 4;
const FINISH: u8 = 8;

/// One task's delivery state (rules D1–D10).
///
/// `K` is the task id, `W` a worker id, `C` a checkpoint, `E` the worker's error, `R` a
/// recovery route ([`FailurePolicy::Divert`]). All are plain data the machine stores and hands
/// back; it compares worker ids (`PartialEq`) and clones ids and checkpoints into actions, and
/// never formats anything.
///
/// # Driving it
///
/// Input comes in through `handle_*`; output goes out through [`poll_action`](Self::poll_action)
/// and [`poll_timeout`](Self::poll_timeout). After every `handle_*` call, drain `poll_action`
/// until it returns `None`; call [`handle_timeout`](Self::handle_timeout) when `poll_timeout`
/// is due. Hand a ready attempt out with [`handle_hand_out`](Self::handle_hand_out), send the
/// [`HandOut`], and report what the worker says with the attempt number it quotes.
///
/// **Drain order.** At most one of each, in this order: [`DeliveryAction::Revoke`] (a lease or
/// heartbeat deadline passed), [`DeliveryAction::Ready`] (an attempt may be handed out),
/// [`DeliveryAction::HandOut`], [`DeliveryAction::Finish`] (exactly once per task). Every
/// action of an input is reported; an input that arrives before they are drained is refused
/// with [`DeliveryError::Undrained`] (and `handle_timeout` does nothing), so none is ever
/// dropped unseen. The [`Deliveries`](crate::Deliveries) table drains each task into its own
/// queue, so there actions of many inputs accumulate in order.
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. `handle_timeout` early, or twice, changes nothing.
///
/// **Misuse** (a report for an attempt that is not out, from the wrong worker, a second result,
/// anything after the terminal state) returns a [`DeliveryError`] and leaves the machine exactly
/// as it was (G12); user data in the input is handed back in a [`Refused`].
///
/// **Another policy.** A task is plain data and may be driven under another policy than the
/// one it was created under (persisted, then loaded): leases and heartbeat deadlines already
/// set, a retry delay already scheduled and an attempt already pending stay as they are; the
/// new leases, limits, durability and failure policy apply from the next hand-out, start or
/// failure.
///
/// ```
/// use core::time::Duration;
/// use persevere::{
///     AttemptProgress, Backoff, Delivery, DeliveryAction, DeliveryPolicy, Failure, Instant, Interruption,
///     RetryPolicy, Terminal,
/// };
/// use rand_core::SeedableRng;
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?;
/// let policy = DeliveryPolicy::builder(retry).build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let now = Instant::ZERO;
/// // Task 7, step execution 1; workers are `&str`, checkpoints `u32`, errors `&str`.
/// let mut task = Delivery::<u32, &str, u32, &str>::new(&policy, now, 7, 1);
/// assert_eq!(task.poll_action(), Some(DeliveryAction::Ready { attempt: 1 }));
///
/// task.handle_hand_out(&policy, now, "w1")?;
/// let Some(DeliveryAction::HandOut(out)) = task.poll_action() else { unreachable!() };
/// assert_eq!((out.attempt, out.key.task, out.key.step_execution), (1, 7, 1));
/// task.handle_started(&policy, now, 1, &"w1")?;
/// task.handle_interrupted(&policy, now, 1, &"w1", Interruption::WorkerCrashed, &mut rng)?;
/// assert_eq!(task.poll_action(), Some(DeliveryAction::Ready { attempt: 2 })); // a retry was used
///
/// task.handle_hand_out(&policy, now, "w2")?;
/// assert!(matches!(task.poll_action(), Some(DeliveryAction::HandOut(_))));
/// task.handle_success(now, 2, &"w2")?;
/// assert_eq!(task.terminal(), Some(&Terminal::Completed { attempt: 2 }));
/// assert_eq!(task.attempt_progress(), AttemptProgress::NotCompleted);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Delivery<K, W, C, E, R = ()> {
    task: K,
    step_execution: u64,
    state: DeliveryStatus<W, E, R>,
    retry: Retry<AttemptFailure<E>>,
    progress: AttemptProgress,
    redeliveries: u32,
    checkpoint: Option<C>,
    /// The checkpoint the outstanding attempt was handed out with (its input snapshot).
    snapshot: Option<C>,
    declined: [Option<W>; DECLINED_CAPACITY],
    declined_next: u8,
    revoked: Option<(W, u64, Interruption)>,
    last_now: Instant,
    pending: u8,
}

impl<K, W, C, E, R> Delivery<K, W, C, E, R> {
    /// A new task, created at `now`: attempt 1 is ready for a worker.
    pub fn new(policy: &DeliveryPolicy<R>, now: Instant, task: K, step_execution: u64) -> Self {
        let mut retry = Retry::new();
        // A fresh `Retry` always accepts its start; its only action is `Start { attempt: 1 }`.
        let _ = retry.handle_start(&policy.retry, now);
        drain_retry(&mut retry);
        Delivery {
            task,
            step_execution,
            state: DeliveryStatus::Pending { attempt: 1, not_before: None },
            retry,
            progress: match policy.durability {
                Durability::Sync => AttemptProgress::NotStarted,
                Durability::Async => AttemptProgress::NotCompleted,
            },
            redeliveries: 0,
            checkpoint: None,
            snapshot: None,
            declined: [const { None }; DECLINED_CAPACITY],
            declined_next: 0,
            revoked: None,
            last_now: now,
            pending: READY,
        }
    }

    /// Hands the pending attempt to `worker`; drain the [`DeliveryAction::HandOut`] and send it.
    /// In [`Durability::Sync`], persist the task before sending.
    ///
    /// # Errors
    /// When an attempt is already out, the retry delay has not ended, `worker` declined this
    /// task, the task is finished, or actions wait to be drained; nothing changes and `worker`
    /// is handed back.
    #[inline]
    pub fn handle_hand_out(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        worker: W,
    ) -> Result<(), Refused<DeliveryError, W>>
    where
        W: PartialEq,
        C: Clone,
    {
        let now = self.last_now.later(now);
        if let Err(error) = self.check_hand_out(now, &worker) {
            return Err(Refused::new(error, worker));
        }
        let attempt = self.retry.attempt();
        self.last_now = now;
        self.snapshot.clone_from(&self.checkpoint);
        self.state = DeliveryStatus::HandedOut {
            attempt,
            worker,
            deadline: now.saturating_add_nanos(policy.start_timeout_ns),
            durable: policy.durability == Durability::Sync,
        };
        self.pending |= HAND_OUT;
        Ok(())
    }

    /// Whether [`handle_hand_out`](Self::handle_hand_out) would accept `worker` at `now`.
    pub fn can_hand_out(&self, now: Instant, worker: &W) -> bool
    where
        W: PartialEq,
    {
        self.check_hand_out(self.last_now.later(now), worker).is_ok()
    }

    /// The worker started attempt `attempt`: the handler may run from now on, and its first
    /// heartbeat is due within `heartbeat_timeout`.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, it has already started, the task
    /// is finished, or actions wait to be drained; nothing changes.
    #[inline]
    pub fn handle_started(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.start(policy, now);
        Ok(())
    }

    /// A heartbeat from the worker running `attempt`, with an optional checkpoint. It extends
    /// the heartbeat deadline and, with a checkpoint, replaces the stored one (last write wins,
    /// D7). A heartbeat for a handed-out attempt also starts it.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished, or actions
    /// wait to be drained; nothing changes (an interrupted attempt's checkpoint is not stored)
    /// and the checkpoint is handed back.
    #[inline]
    pub fn handle_heartbeat(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        checkpoint: Option<C>,
    ) -> Result<(), Refused<DeliveryError, Option<C>>>
    where
        W: PartialEq,
    {
        if let Err(error) = self.check_out(attempt, worker) {
            return Err(Refused::new(error, checkpoint));
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.start(policy, now);
        if checkpoint.is_some() {
            self.checkpoint = checkpoint;
        }
        Ok(())
    }

    /// The start of `attempt` is durable ([`Durability::Async`]); from now on a server failover
    /// interrupts it instead of rolling it back. In [`Durability::Sync`] every start is durable
    /// already and this changes nothing.
    ///
    /// # Errors
    /// When `attempt` is not out, the task is finished, or actions wait to be drained;
    /// nothing changes.
    pub fn handle_persisted(&mut self, now: Instant, attempt: u64) -> Result<(), DeliveryError> {
        self.check_attempt(attempt)?;
        self.check_drained()?;
        match &mut self.state {
            DeliveryStatus::HandedOut { durable, .. } | DeliveryStatus::Running { durable, .. } if !*durable => {
                *durable = true;
                self.last_now = self.last_now.later(now);
            }
            _ => {}
        }
        Ok(())
    }

    /// Attempt `attempt` completed: the task is [`Terminal::Completed`].
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished (a second
    /// result), or actions wait to be drained; nothing changes.
    #[inline]
    pub fn handle_success(&mut self, now: Instant, attempt: u64, worker: &W) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        self.check_out(attempt, worker)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        // The embedded retry runs `attempt`, so it accepts the success; its `Finish` is
        // drained here, since the task's own `Finish` reports the outcome.
        let _ = self.retry.handle_success(now, attempt);
        drain_retry(&mut self.retry);
        self.progress = AttemptProgress::NotCompleted;
        self.state = DeliveryStatus::Done(Terminal::Completed { attempt });
        self.pending |= FINISH;
        Ok(())
    }

    /// The former name of [`handle_success`](Self::handle_success), with its former arguments:
    /// the policy, which a success never reads, is taken and ignored so that old calls compile.
    ///
    /// # Errors
    /// As [`handle_success`](Self::handle_success).
    #[deprecated(since = "0.1.0", note = "renamed `handle_success`, as every machine names it, which takes no policy")]
    pub fn handle_completed(
        &mut self,
        _policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        self.handle_success(now, attempt, worker)
    }

    /// The former name of [`handle_failure`](Self::handle_failure).
    ///
    /// # Errors
    /// As [`handle_failure`](Self::handle_failure).
    #[deprecated(since = "0.1.0", note = "renamed `handle_failure`, as every machine names it")]
    pub fn handle_failed<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>>
    where
        W: PartialEq,
        R: Clone,
    {
        self.handle_failure(policy, now, attempt, worker, failure, rng)
    }

    /// Attempt `attempt` failed with `failure`: it consumes a retry by the R-rules, or retries
    /// end and the failure policy decides (D8).
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished (a second
    /// result), or actions wait to be drained; nothing changes and the failure is handed back.
    pub fn handle_failure<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>>
    where
        W: PartialEq,
        R: Clone,
    {
        if let Err(error) = self.check_out(attempt, worker) {
            return Err(Refused::new(error, failure));
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        self.fail_attempt(policy, now, Failure::new(failure.kind, AttemptFailure::Failed(failure.error)), rng);
        Ok(())
    }

    /// Attempt `attempt` was interrupted (D2): it consumes a retry and its number is never
    /// handed out again. [`Interruption::ServerFailover`] is handled as by
    /// [`handle_failover`](Self::handle_failover): an `Async` start that is not durable rolls back.
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, the task is finished, or actions
    /// wait to be drained; nothing changes.
    pub fn handle_interrupted<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        interruption: Interruption,
        rng: &mut G,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq,
        R: Clone,
    {
        self.check_out(attempt, worker)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if interruption == Interruption::ServerFailover && !self.is_durable() {
            self.roll_back();
        } else {
            self.interrupt(policy, now, interruption, rng);
        }
        Ok(())
    }

    /// Attempt `attempt` came back although it certainly never ran (D3): it keeps its number and
    /// input snapshot and consumes no retry. A [`FreeReturn::Declined`] remembers `worker` so the
    /// task is not offered to it again. Past `max_redeliveries` free returns, the task is
    /// [`Terminal::DeadLettered`] instead (D4).
    ///
    /// # Errors
    /// When `attempt` is not out, `worker` does not hold it, it has started
    /// ([`DeliveryError::AlreadyStarted`]: report an interruption instead), the task is
    /// finished, or actions wait to be drained; nothing changes.
    pub fn handle_returned(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        attempt: u64,
        worker: &W,
        reason: FreeReturn,
    ) -> Result<(), DeliveryError>
    where
        W: PartialEq + Clone,
        E: Clone,
    {
        if self.check_out(attempt, worker)? {
            return Err(DeliveryError::AlreadyStarted { attempt });
        }
        self.last_now = self.last_now.later(now);
        if reason != FreeReturn::SendFailed {
            self.progress = AttemptProgress::NotCompleted;
        }
        if reason == FreeReturn::Declined && !self.has_declined(worker) {
            let slot = usize::from(self.declined_next) % DECLINED_CAPACITY;
            if let Some(entry) = self.declined.get_mut(slot) {
                *entry = Some(worker.clone());
            }
            self.declined_next = ((slot + 1) % DECLINED_CAPACITY) as u8;
        }
        if self.redeliveries >= policy.max_redeliveries {
            self.state = DeliveryStatus::Done(Terminal::DeadLettered(DeadLetter {
                reason,
                attempt,
                redeliveries: self.redeliveries,
                progress: self.progress,
                last_failure: self.retry.last_failure().cloned(),
            }));
            self.pending |= FINISH;
        } else {
            self.redeliveries = self.redeliveries.saturating_add(1);
            self.state = DeliveryStatus::Pending { attempt, not_before: None };
            self.pending |= READY;
        }
        Ok(())
    }

    /// The server failed over (D6). An attempt that is out is interrupted
    /// ([`Interruption::ServerFailover`], a retry is used) if its start is durable; otherwise
    /// (only in [`Durability::Async`]) it rolls back: the same attempt number is pending again
    /// with its input snapshot, no retry used, and the first worker may still be running it.
    /// A pending or finished task is not affected.
    ///
    /// # Errors
    /// [`DeliveryError::Undrained`] while actions wait to be drained (a failover is a fact the
    /// task must not miss, so it is refused rather than ignored); nothing changes.
    pub fn handle_failover<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        rng: &mut G,
    ) -> Result<(), DeliveryError>
    where
        R: Clone,
    {
        if !matches!(self.state, DeliveryStatus::HandedOut { .. } | DeliveryStatus::Running { .. }) {
            return Ok(());
        }
        self.check_drained()?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if self.is_durable() {
            self.interrupt(policy, now, Interruption::ServerFailover, rng);
        } else {
            self.roll_back();
        }
        Ok(())
    }

    /// Wakes the machine: a retry delay that has ended makes its attempt ready; a hand-out past
    /// its lease, or a running attempt past its heartbeat deadline, is revoked and interrupted
    /// (D2). Early, repeated or spurious calls, and calls while actions wait to be drained,
    /// change nothing.
    pub fn handle_timeout<G: Rng + ?Sized>(&mut self, policy: &DeliveryPolicy<R>, now: Instant, rng: &mut G)
    where
        R: Clone,
    {
        if self.pending != 0 {
            return;
        }
        let now = self.last_now.later(now);
        let reason = match self.state {
            DeliveryStatus::Pending { attempt, not_before: Some(t) } if t <= now => {
                self.last_now = now;
                self.state = DeliveryStatus::Pending { attempt, not_before: None };
                self.pending |= READY;
                return;
            }
            DeliveryStatus::HandedOut { deadline, .. } if deadline <= now => Interruption::LeaseExpired,
            DeliveryStatus::Running { heartbeat_deadline, .. } if heartbeat_deadline <= now => {
                Interruption::HeartbeatMissed
            }
            _ => return,
        };
        self.last_now = now;
        self.interrupt(policy, now, reason, rng);
    }

    /// The next action, in the documented drain order; `None` when there is nothing to do.
    #[inline]
    pub fn poll_action(&mut self) -> Option<DeliveryAction<K, W, C, E, R>>
    where
        K: Clone,
        W: Clone,
        C: Clone,
        E: Clone,
        R: Clone,
    {
        while self.pending != 0 {
            let next = self.pending & self.pending.wrapping_neg();
            self.pending &= !next;
            let action = match next {
                REVOKE => self.revoked.take().map(|(worker, attempt, reason)| DeliveryAction::Revoke {
                    worker,
                    attempt,
                    reason,
                }),
                READY => match self.state {
                    DeliveryStatus::Pending { attempt, not_before: None } => Some(DeliveryAction::Ready { attempt }),
                    _ => None,
                },
                HAND_OUT => match &self.state {
                    DeliveryStatus::HandedOut { attempt, worker, deadline, .. } => {
                        Some(DeliveryAction::HandOut(HandOut {
                            key: IdempotencyKey { task: self.task.clone(), step_execution: self.step_execution },
                            attempt: *attempt,
                            worker: worker.clone(),
                            deadline: *deadline,
                            checkpoint: self.checkpoint.clone(),
                        }))
                    }
                    _ => None,
                },
                _ => match &self.state {
                    DeliveryStatus::Done(terminal) => Some(DeliveryAction::Finish(terminal.clone())),
                    _ => None,
                },
            };
            if action.is_some() {
                return action;
            }
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the end of the retry delay, the
    /// hand-out's lease, or the heartbeat deadline; `None` when nothing is timed (a ready
    /// attempt waits for a worker, not for time). A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            DeliveryStatus::Pending { not_before, .. } => *not_before,
            DeliveryStatus::HandedOut { deadline, .. } => Some(*deadline),
            DeliveryStatus::Running { heartbeat_deadline, .. } => Some(*heartbeat_deadline),
            DeliveryStatus::Done(_) => None,
        }
    }

    /// Where the task is (D1).
    pub const fn status(&self) -> &DeliveryStatus<W, E, R> {
        &self.state
    }

    /// The current attempt number: the one pending, out, or the last one before the terminal state.
    pub const fn attempt(&self) -> u64 {
        match &self.state {
            DeliveryStatus::Pending { attempt, .. }
            | DeliveryStatus::HandedOut { attempt, .. }
            | DeliveryStatus::Running { attempt, .. } => *attempt,
            DeliveryStatus::Done(_) => self.retry.attempt(),
        }
    }

    /// The furthest any attempt reached (D5).
    pub const fn attempt_progress(&self) -> AttemptProgress {
        self.progress
    }

    /// Free returns so far (D4).
    pub const fn redeliveries(&self) -> u32 {
        self.redeliveries
    }

    /// Retries consumed so far: attempt numbers used up by failures and interruptions. Free
    /// returns and rollbacks never change it.
    pub const fn retries_used(&self) -> u64 {
        let attempt = self.retry.attempt();
        match &self.state {
            DeliveryStatus::Done(Terminal::Failed(_) | Terminal::Proceeded(_) | Terminal::Diverted { .. }) => attempt,
            _ => attempt.saturating_sub(1),
        }
    }

    /// The last stored checkpoint, which the next hand-out carries (D7).
    pub const fn checkpoint(&self) -> Option<&C> {
        self.checkpoint.as_ref()
    }

    /// The last failure while retries run (D8); after the terminal state, the recovery error
    /// or dead letter holds it.
    pub const fn last_failure(&self) -> Option<&LastFailure<AttemptFailure<E>>> {
        self.retry.last_failure()
    }

    /// The terminal state, once reached (D9).
    pub const fn terminal(&self) -> Option<&Terminal<E, R>> {
        match &self.state {
            DeliveryStatus::Done(terminal) => Some(terminal),
            _ => None,
        }
    }

    /// The recovery error of a failed, proceeded or diverted task (D8).
    pub const fn recovery_error(&self) -> Option<&RecoveryError<E>> {
        match &self.state {
            DeliveryStatus::Done(terminal) => terminal.recovery_error(),
            _ => None,
        }
    }

    /// The task id.
    pub const fn task(&self) -> &K {
        &self.task
    }

    /// The latest `now` the task accepted.
    pub const fn now(&self) -> Instant {
        self.last_now
    }

    /// The idempotency key every attempt of this task carries (D10).
    pub const fn idempotency_key(&self) -> IdempotencyKey<&K> {
        IdempotencyKey { task: &self.task, step_execution: self.step_execution }
    }

    /// Whether `worker` declined this task (among the last [`DECLINED_CAPACITY`] decliners).
    pub fn has_declined(&self, worker: &W) -> bool
    where
        W: PartialEq,
    {
        self.declined.iter().any(|d| d.as_ref() == Some(worker))
    }

    /// The workers that declined this task and are not offered it again (the last
    /// [`DECLINED_CAPACITY`]), in no particular order: what a store indexes to skip the task
    /// for them.
    pub fn declined_workers(&self) -> impl Iterator<Item = &W> {
        self.declined.iter().flatten()
    }

    /// Attempts, time between attempts, and time since creation, as counted by the embedded retry.
    pub fn stats(&self) -> Stats {
        self.retry.stats()
    }

    /// Whether actions wait to be drained.
    pub const fn has_actions(&self) -> bool {
        self.pending != 0
    }

    fn check_hand_out(&self, now: Instant, worker: &W) -> Result<(), DeliveryError>
    where
        W: PartialEq,
    {
        match &self.state {
            DeliveryStatus::Done(terminal) => Err(DeliveryError::Finished(terminal.kind())),
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } => {
                Err(DeliveryError::AlreadyHandedOut { attempt: *attempt })
            }
            DeliveryStatus::Pending { attempt, not_before: Some(t) } if *t > now => {
                Err(DeliveryError::NotYetEligible { attempt: *attempt, not_before: *t })
            }
            DeliveryStatus::Pending { .. } if self.has_declined(worker) => Err(DeliveryError::WorkerDeclined),
            DeliveryStatus::Pending { .. } => self.check_drained(),
        }
    }

    /// Refuses an input while actions wait to be drained (the drain rule).
    #[inline]
    fn check_drained(&self) -> Result<(), DeliveryError> {
        if self.pending == 0 { Ok(()) } else { Err(DeliveryError::Undrained) }
    }

    /// Checks that `attempt` is out; returns whether it has started. Does not check the drain.
    fn check_attempt(&self, got: u64) -> Result<bool, DeliveryError> {
        match &self.state {
            DeliveryStatus::Done(terminal) => Err(DeliveryError::Finished(terminal.kind())),
            DeliveryStatus::Pending { attempt, .. } if *attempt == got => {
                Err(DeliveryError::NotHandedOut { attempt: *attempt })
            }
            DeliveryStatus::Pending { attempt, .. } => Err(DeliveryError::StaleAttempt { current: *attempt, got }),
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } if *attempt != got => {
                Err(DeliveryError::StaleAttempt { current: *attempt, got })
            }
            DeliveryStatus::HandedOut { .. } => Ok(false),
            DeliveryStatus::Running { .. } => Ok(true),
        }
    }

    /// Checks that `attempt` is out to `worker` and every action is drained; returns whether
    /// it has started.
    fn check_out(&self, got: u64, worker: &W) -> Result<bool, DeliveryError>
    where
        W: PartialEq,
    {
        let started = self.check_attempt(got)?;
        match &self.state {
            DeliveryStatus::HandedOut { worker: holder, .. } | DeliveryStatus::Running { worker: holder, .. }
                if holder != worker =>
            {
                Err(DeliveryError::WrongWorker { attempt: got })
            }
            _ => self.check_drained().map(|()| started),
        }
    }

    fn is_durable(&self) -> bool {
        match self.state {
            DeliveryStatus::HandedOut { durable, .. } | DeliveryStatus::Running { durable, .. } => durable,
            _ => true,
        }
    }

    /// HandedOut → Running, or a heartbeat on Running: the deadline moves.
    fn start(&mut self, policy: &DeliveryPolicy<R>, now: Instant) {
        let heartbeat_deadline = now.saturating_add_nanos(policy.heartbeat_timeout_ns);
        self.progress = AttemptProgress::NotCompleted;
        let state = core::mem::replace(&mut self.state, DeliveryStatus::Pending { attempt: 0, not_before: None });
        self.state = match state {
            DeliveryStatus::HandedOut { attempt, worker, durable, .. }
            | DeliveryStatus::Running { attempt, worker, durable, .. } => {
                DeliveryStatus::Running { attempt, worker, heartbeat_deadline, durable }
            }
            other => other,
        };
    }

    /// The outstanding attempt is interrupted: revoked if a deadline passed, then failed.
    fn interrupt<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        reason: Interruption,
        rng: &mut G,
    ) where
        R: Clone,
    {
        if matches!(reason, Interruption::LeaseExpired | Interruption::HeartbeatMissed) {
            let state = core::mem::replace(&mut self.state, DeliveryStatus::Pending { attempt: 0, not_before: None });
            if let DeliveryStatus::HandedOut { attempt, worker, .. } | DeliveryStatus::Running { attempt, worker, .. } =
                state
            {
                self.revoked = Some((worker, attempt, reason));
                self.pending |= REVOKE;
            }
        }
        self.fail_attempt(policy, now, Failure::new(reason.kind(), AttemptFailure::Interrupted(reason)), rng);
    }

    /// An attempt that may have run failed: the retry machine decides what comes next.
    fn fail_attempt<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        failure: Failure<AttemptFailure<E>>,
        rng: &mut G,
    ) where
        R: Clone,
    {
        self.progress = AttemptProgress::NotCompleted;
        let attempt = self.retry.attempt();
        // The embedded retry is running `attempt` whenever an attempt is out: it accepts.
        let _ = self.retry.handle_failure(&policy.retry, now, attempt, failure, rng);
        let mut finish = None;
        let mut until = None;
        for _ in 0..4 {
            match self.retry.poll_action() {
                Some(RetryAction::Sleep { until: t, .. }) => until = Some(t),
                Some(RetryAction::Finish { outcome, stats }) => finish = Some((outcome, stats)),
                Some(RetryAction::Start { .. } | RetryAction::Abandon { .. }) => {}
                None => break,
            }
        }
        if let Some((outcome, stats)) = finish {
            self.conclude(policy, outcome, stats);
            return;
        }
        let until = until.unwrap_or(now);
        // Start the next attempt in the retry at once (it cannot be handed out before `until`),
        // so that no later input needs an RNG to wake it. Its start draws nothing.
        self.retry.handle_timeout(&policy.retry, until, rng);
        drain_retry(&mut self.retry);
        let attempt = self.retry.attempt();
        if until <= now {
            self.state = DeliveryStatus::Pending { attempt, not_before: None };
            self.pending |= READY;
        } else {
            self.state = DeliveryStatus::Pending { attempt, not_before: Some(until) };
        }
    }

    /// Retries ended without a success: the failure policy decides (D8).
    fn conclude(&mut self, policy: &DeliveryPolicy<R>, outcome: Outcome<AttemptFailure<E>>, stats: Stats)
    where
        R: Clone,
    {
        let ended = outcome.kind();
        let retry_at = outcome.retry_at();
        // Retries end after a failure; only a cancel may come without one.
        let last_failure =
            outcome.into_last_failure().unwrap_or(LastFailure { class: FailureClass::Canceled, error: None });
        let error = RecoveryError { ended, last_failure, retry_at, progress: self.progress, stats };
        self.state = DeliveryStatus::Done(match &policy.on_failure {
            FailurePolicy::Fail => Terminal::Failed(error),
            FailurePolicy::Proceed => Terminal::Proceeded(error),
            FailurePolicy::Divert(route) => Terminal::Diverted { route: route.clone(), error },
        });
        self.pending |= FINISH;
    }

    /// An `Async` start that was not durable is undone: same attempt, input snapshot, no retry.
    fn roll_back(&mut self) {
        let attempt = self.retry.attempt();
        self.progress = AttemptProgress::NotCompleted;
        core::mem::swap(&mut self.checkpoint, &mut self.snapshot);
        self.snapshot = None;
        self.state = DeliveryStatus::Pending { attempt, not_before: None };
        self.pending |= READY;
    }
}

/// Drains a retry's actions (at most four exist at once).
fn drain_retry<E>(retry: &mut Retry<E>) {
    for _ in 0..4 {
        if retry.poll_action().is_none() {
            break;
        }
    }
}
