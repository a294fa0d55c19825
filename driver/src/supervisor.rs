//! The supervisor: long-running tasks restarted by policy (rules S1–S6), on any executor.
//!
//! Each task is one spawned future that owns its core [`Supervision`] machine and drives it:
//! it runs attempts one after another (never two at once), sleeps through backoffs and
//! intervals, drops an attempt at its deadline, catches panics, and reports lifecycle events
//! (best-effort) and one final outcome (reliable).

use std::collections::BTreeMap;
use std::fmt;
use std::future::{Future, poll_fn};
use std::ops::ControlFlow;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use event_listener::Event;
use persevere::{
    Failure, Instant, PolicyError, Supervision, SupervisionAction, SupervisionPolicy, SupervisionPolicyBuilder,
    TaskDefaults, TaskOutcome, TaskOutcomeKind,
};
use pin_project_lite::pin_project;

use crate::bounds::{Id, JobErrorType, SendRuntime};
use crate::classify::{Classifier, RetryAll};
use crate::fault::{Fault, Faults};
use crate::job::{JobError, catch_create, drop_caught, poll_caught};
use crate::listeners::Listeners;
use crate::runtime::{Runtime, Timeline};
use crate::signals::{OneshotReceiver, OneshotSender, Signal, TaskCell, oneshot};
use crate::spawn::Spawn;
use crate::sync::lock;
use persevere::SplitMix64;

/// Control levels of a task (they only rise).
const STOP: u8 = 1;
const CANCEL: u8 = 2;
const ABORT: u8 = 3;

/// The default capacity of the event channel.
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;

/// How one task restarts (S1): the core's [`SupervisionPolicyBuilder`], under the name a
/// supervisor's user reaches for. Start from [`TaskSpec::once`], [`TaskSpec::restartable`],
/// [`TaskSpec::periodic`] or [`TaskSpec::from_defaults`]; every setting not given is inherited
/// from the supervisor's [`TaskDefaults`], and `no_*` / `unlimited_retries` switch an inherited
/// setting off. The supervisor resolves it with [`build`](SupervisionPolicyBuilder::build).
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, Jitter, Restart, TaskDefaults};
/// use persevere_driver::TaskSpec;
///
/// let spec = TaskSpec::restartable()
///     .backoff(Backoff::exponential(Duration::from_millis(100), 2.0).jitter(Jitter::Equal).build()?)
///     .attempt_timeout(Duration::from_secs(5))
///     .max_retries(3);
/// let policy = spec.build(&TaskDefaults::new())?;
/// assert_eq!(policy.restart(), Restart::Restartable);
/// assert_eq!(policy.max_retries(), Some(3));
/// assert!(TaskSpec::once().max_retries(0).build(&TaskDefaults::new()).is_err());
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub type TaskSpec = SupervisionPolicyBuilder;

/// A lifecycle event of one task (S6), as sent on the supervisor's [`Events`] stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorEvent<K, E> {
    /// The task's id.
    pub id: K,
    /// When the driver saw it, on the supervisor's runtime clock.
    pub at: Instant,
    /// What happened.
    pub event: SupervisionAction<JobError<E>>,
}

/// How a task ended: its outcome (S4), the attempts it started, and whether the supervisor
/// had to abort it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskExit<E> {
    /// The outcome.
    pub outcome: TaskOutcome<JobError<E>>,
    /// Attempts started.
    pub attempts: u64,
    /// `true` when the task was aborted: canceled by [`Supervisor::shutdown`] after its time
    /// limit, or dropped by its executor before it finished (the outcome is then
    /// [`TaskOutcome::Canceled`]).
    pub aborted: bool,
}

/// A caller mistake; nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisorError {
    /// A task with this id is still supervised.
    #[error("a task with this id is still supervised; remove it (or await its outcome) first")]
    DuplicateId,
    /// No task with this id is supervised (it never was, it finished, or it was removed).
    #[error("no task with this id is supervised (it never was, it has finished, or it was removed)")]
    UnknownId,
    /// [`Supervisor::shutdown`] has begun.
    #[error("the supervisor is shutting down; no task can be added")]
    ShuttingDown,
    /// The task's spec does not resolve to a valid policy.
    #[error("invalid task policy: {0}")]
    Policy(#[from] PolicyError),
}

/// What [`Supervisor::shutdown`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownReport<K> {
    /// Tasks that ended by themselves, with their outcomes, in the order they ended.
    pub completed: Vec<(K, TaskOutcomeKind)>,
    /// Tasks aborted at the time limit (their attempts were dropped) or dropped by their
    /// executor, in the order they ended; each ended [`Canceled`](TaskOutcomeKind::Canceled)
    /// with [`TaskExit::aborted`] set.
    ///
    /// Each task is in exactly one of the two lists, the one its [`TaskExit::aborted`] names: a
    /// task whose attempt ends by itself at the limit's instant, before it sees the abort, is
    /// completed.
    pub aborted: Vec<K>,
}

struct Entry<E> {
    serial: u64,
    /// The task's control signal, in the cell it shares with its handle.
    cell: Arc<TaskCell<TaskExit<E>>>,
}

struct Registry<K, E> {
    tasks: BTreeMap<K, Entry<E>>,
    serial: u64,
    shutting_down: bool,
    /// `(id, outcome, aborted)` of tasks that ended after the shutdown began.
    ended: Vec<(K, TaskOutcomeKind, bool)>,
}

struct Inner<Rt, Sp, K, E> {
    rt: Rt,
    spawner: Sp,
    defaults: TaskDefaults,
    seed: Option<u64>,
    events_tx: async_channel::Sender<SupervisorEvent<K, E>>,
    events_rx: async_channel::Receiver<SupervisorEvent<K, E>>,
    /// Events emitted, by [`event_slot`], and the dropped ones in the last slot.
    emitted: [AtomicU64; EVENT_KINDS + 1],
    registry: Mutex<Registry<K, E>>,
    changed: Event,
    listeners: Listeners<SupervisorEvent<K, E>>,
    /// Test-only defects (none without the `fault-injection` feature).
    faults: Faults,
}

impl<Rt, Sp, K, E> Inner<Rt, Sp, K, E> {
    fn emit(&self, id: &K, at: Instant, event: SupervisionAction<JobError<E>>)
    where
        K: Clone + fmt::Debug,
    {
        trace_event(id, &event);
        self.emitted[event_slot(&event)].fetch_add(1, Ordering::Relaxed);
        let event = SupervisorEvent { id: id.clone(), at, event };
        self.listeners.tell(&event);
        if let Err(async_channel::TrySendError::Full(_)) = self.events_tx.try_send(event) {
            self.emitted[EVENT_KINDS].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Emits `event` of task `id` as a `tracing` event (target `persevere::supervisor`,
/// docs/guide.md's Observability table) when the `tracing` feature is on; nothing otherwise.
#[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
fn trace_event<K: fmt::Debug, E>(id: &K, event: &SupervisionAction<JobError<E>>) {
    #[cfg(feature = "tracing")]
    match *event {
        SupervisionAction::AttemptStarting { attempt, .. } => {
            tracing::debug!(target: "persevere::supervisor", task = ?id, attempt, "attempt starting");
        }
        SupervisionAction::AttemptSucceeded { attempt } => {
            tracing::debug!(target: "persevere::supervisor", task = ?id, attempt, "attempt succeeded");
        }
        SupervisionAction::AttemptFailed { attempt, class } => {
            tracing::debug!(target: "persevere::supervisor", task = ?id, attempt, class = ?class, "attempt failed");
        }
        SupervisionAction::AttemptTimedOut { attempt } => {
            tracing::info!(target: "persevere::supervisor", task = ?id, attempt, "attempt timed out");
        }
        SupervisionAction::AttemptCanceled { attempt } => {
            tracing::debug!(target: "persevere::supervisor", task = ?id, attempt, "attempt canceled");
        }
        SupervisionAction::BackoffScheduled { next_attempt, delay, .. } => {
            let delay_ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
            tracing::debug!(target: "persevere::supervisor", task = ?id, next_attempt, delay_ns, "restart scheduled");
        }
        SupervisionAction::TaskFinished { ref outcome, attempts } => {
            tracing::info!(
                target: "persevere::supervisor", task = ?id, outcome = ?outcome.kind(), attempts, "task finished"
            );
        }
    }
}

/// The kinds of [`SupervisionAction`].
const EVENT_KINDS: usize = 7;

/// The counter of `event`'s kind in [`Inner::emitted`] (the order of [`EventCounts`]).
fn event_slot<E>(event: &SupervisionAction<E>) -> usize {
    match event {
        SupervisionAction::AttemptStarting { .. } => 0,
        SupervisionAction::AttemptSucceeded { .. } => 1,
        SupervisionAction::AttemptFailed { .. } => 2,
        SupervisionAction::AttemptTimedOut { .. } => 3,
        SupervisionAction::AttemptCanceled { .. } => 4,
        SupervisionAction::BackoffScheduled { .. } => 5,
        SupervisionAction::TaskFinished { .. } => 6,
    }
}

/// The events a [`Supervisor`] has emitted, by kind; see [`Supervisor::event_counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventCounts {
    /// [`AttemptStarting`](SupervisionAction::AttemptStarting) events.
    pub attempt_starting: u64,
    /// [`AttemptSucceeded`](SupervisionAction::AttemptSucceeded) events.
    pub attempt_succeeded: u64,
    /// [`AttemptFailed`](SupervisionAction::AttemptFailed) events.
    pub attempt_failed: u64,
    /// [`AttemptTimedOut`](SupervisionAction::AttemptTimedOut) events.
    pub attempt_timed_out: u64,
    /// [`AttemptCanceled`](SupervisionAction::AttemptCanceled) events.
    pub attempt_canceled: u64,
    /// [`BackoffScheduled`](SupervisionAction::BackoffScheduled) events.
    pub backoff_scheduled: u64,
    /// [`TaskFinished`](SupervisionAction::TaskFinished) events: one per task that ended.
    pub task_finished: u64,
    /// Events of any kind dropped because the channel was full (also counted by kind above).
    pub dropped: u64,
}

/// Configures a [`Supervisor`]: runtime, spawner, event capacity and jitter seed.
#[must_use = "call `build()` to get the supervisor"]
pub struct SupervisorBuilder<Rt, Sp> {
    defaults: TaskDefaults,
    rt: Rt,
    spawner: Sp,
    capacity: usize,
    seed: Option<u64>,
    faults: Faults,
}

impl<Rt: Default, Sp: Default> SupervisorBuilder<Rt, Sp> {
    /// A builder with the given task defaults, the default runtime and spawner, an event
    /// capacity of [`DEFAULT_EVENT_CAPACITY`] and jitter seeded from the runtime's entropy.
    pub fn new(defaults: TaskDefaults) -> Self {
        SupervisorBuilder {
            defaults,
            rt: Rt::default(),
            spawner: Sp::default(),
            capacity: DEFAULT_EVENT_CAPACITY,
            seed: None,
            faults: Faults::default(),
        }
    }
}

impl<Rt, Sp> SupervisorBuilder<Rt, Sp> {
    /// A builder with the given task defaults, runtime and spawner.
    pub fn with(defaults: TaskDefaults, rt: Rt, spawner: Sp) -> Self {
        SupervisorBuilder {
            defaults,
            rt,
            spawner,
            capacity: DEFAULT_EVENT_CAPACITY,
            seed: None,
            faults: Faults::default(),
        }
    }

    /// Uses `rt` for clocks and timers.
    pub fn runtime<Rt2>(self, rt: Rt2) -> SupervisorBuilder<Rt2, Sp> {
        SupervisorBuilder {
            defaults: self.defaults,
            rt,
            spawner: self.spawner,
            capacity: self.capacity,
            seed: self.seed,
            faults: self.faults,
        }
    }

    /// Uses `spawner` to start tasks.
    pub fn spawner<Sp2>(self, spawner: Sp2) -> SupervisorBuilder<Rt, Sp2> {
        SupervisorBuilder {
            defaults: self.defaults,
            rt: self.rt,
            spawner,
            capacity: self.capacity,
            seed: self.seed,
            faults: self.faults,
        }
    }

    /// Holds at most `capacity` undelivered events (default [`DEFAULT_EVENT_CAPACITY`]; at least
    /// 1). When the channel is full, new events are dropped and counted (see
    /// [`Supervisor::dropped_events`]); tasks never wait for a reader.
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// Seeds the jitter of every task (task `n` gets a generator derived from `seed` and `n`),
    /// for reproducible delays. By default each task is seeded from the runtime's entropy.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Injects `fault` into the supervisor (test-only, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn inject_fault(mut self, fault: crate::fault::Fault) -> Self {
        self.faults.inject(fault);
        self
    }

    /// The supervisor.
    pub fn build<K, E>(self) -> Supervisor<Rt, Sp, K, E> {
        let (events_tx, events_rx) = async_channel::bounded(self.capacity);
        Supervisor {
            inner: Arc::new(Inner {
                rt: self.rt,
                spawner: self.spawner,
                defaults: self.defaults,
                seed: self.seed,
                events_tx,
                events_rx,
                emitted: Default::default(),
                registry: Mutex::new(Registry {
                    tasks: BTreeMap::new(),
                    serial: 0,
                    shutting_down: false,
                    ended: Vec::new(),
                }),
                changed: Event::new(),
                listeners: Listeners::new(),
                faults: self.faults,
            }),
        }
    }
}

/// Supervises long-running tasks: each runs attempts under its restart policy (S1–S5), one at
/// a time, and reports lifecycle events (S6) and a final outcome.
///
/// Generic over the executor's clock and timers (`Rt`), its spawner (`Sp`), task ids (`K`)
/// and the tasks' error type (`E`); `persevere-tokio` and `persevere-smol` name it with their
/// runtime filled in. Cloning it gives another handle to the same supervisor.
///
/// - **Attempts.** A task is a closure that makes one attempt (a future of `Result<(), E>`).
///   Attempts of one task never overlap: the next is created only after the previous ended
///   and its backoff or interval elapsed. An error is classified by the task's
///   [`Classifier`] ([`RetryAll`] for [`add`](Self::add)).
/// - **Timeouts.** An attempt past its timeout is dropped; the task sees
///   [`SupervisionAction::AttemptTimedOut`] and retries like after any retryable failure. A panic while
///   dropping it ends the task [`Panicked`](TaskOutcome::Panicked) (S4).
/// - **Panics.** A panic while creating or polling an attempt is caught and is a retryable
///   failure with [`JobError::Panicked`] (S4).
/// - **Events.** Per attempt: `AttemptStarting`, then one of `AttemptSucceeded`,
///   `AttemptFailed`, `AttemptTimedOut`, `AttemptCanceled`, then `BackoffScheduled` if another
///   attempt follows; one `TaskFinished` at the end. They go to a bounded channel
///   ([`events`](Self::events)); when it is full they are dropped and counted, never waited
///   for. Events of one task arrive in order; events of different tasks interleave.
/// - **Outcome.** The [`TaskHandle`] returned by [`add`](Self::add) resolves to the task's
///   [`TaskExit`], always: also when it is canceled, aborted, or dropped by its executor.
/// - **Stopping.** [`cancel`](Self::cancel) and [`remove`](Self::remove) stop one task at
///   once (its running attempt is dropped); [`shutdown`](Self::shutdown) stops all gracefully
///   (running attempts may finish, no new attempt starts) and aborts those still running at
///   its time limit.
pub struct Supervisor<Rt, Sp, K, E> {
    inner: Arc<Inner<Rt, Sp, K, E>>,
}

impl<Rt, Sp, K, E> Clone for Supervisor<Rt, Sp, K, E> {
    fn clone(&self) -> Self {
        Supervisor { inner: self.inner.clone() }
    }
}

impl<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> Supervisor<Rt, Sp, K, E> {
    /// A supervisor whose tasks inherit `defaults` (S1, S2), on the default runtime and
    /// spawner, with an event channel of [`DEFAULT_EVENT_CAPACITY`].
    pub fn new(defaults: TaskDefaults) -> Self
    where
        Rt: Default,
        Sp: Default,
    {
        SupervisorBuilder::new(defaults).build()
    }

    /// Starts supervising `task` under `id`: its first attempt starts at once (S5). Every
    /// error is retryable (limits permitting).
    ///
    /// # Errors
    /// [`SupervisorError::DuplicateId`], [`SupervisorError::ShuttingDown`], or
    /// [`SupervisorError::Policy`] when `spec` does not resolve to a valid policy; nothing is
    /// started.
    pub fn add<F, Fut>(&self, id: K, spec: TaskSpec, task: F) -> Result<TaskHandle<E>, SupervisorError>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.add_classified(id, spec, RetryAll, task)
    }

    /// As [`add`](Self::add), classifying each error with `classifier` (a closure
    /// `FnMut(&E) -> FailureKind`, or [`ByTrait`](crate::ByTrait)): `Fatal` ends the task,
    /// `Canceled` cancels it, a hint sets the next delay.
    ///
    /// # Errors
    /// As [`add`](Self::add).
    pub fn add_classified<C, F, Fut>(
        &self,
        id: K,
        spec: TaskSpec,
        classifier: C,
        task: F,
    ) -> Result<TaskHandle<E>, SupervisorError>
    where
        C: Classifier<E> + Send + 'static,
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        let inner = &self.inner;
        let policy = spec.build(&inner.defaults)?;
        let (exit_tx, exit_rx) = oneshot();
        let cell = exit_rx.cell().clone();
        let serial = {
            let mut registry = lock(&inner.registry);
            if registry.shutting_down {
                return Err(SupervisorError::ShuttingDown);
            }
            if registry.tasks.contains_key(&id) {
                return Err(SupervisorError::DuplicateId);
            }
            registry.serial += 1;
            let serial = registry.serial;
            registry.tasks.insert(id.clone(), Entry { serial, cell: cell.clone() });
            serial
        };
        let seed = match inner.seed {
            Some(seed) => seed.wrapping_add(serial.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            None => inner.rt.entropy(),
        };
        let guard = TaskGuard {
            inner: inner.clone(),
            id,
            serial,
            machine: Supervision::new(),
            policy,
            exit: Some(exit_tx),
            aborted: false,
        };
        inner.spawner.spawn(drive(guard, cell, SplitMix64::new(seed), classifier, task));
        Ok(TaskHandle { exit: exit_rx })
    }

    /// Cancels the task `id` now: its running attempt is dropped
    /// ([`SupervisionAction::AttemptCanceled`]) or its wait ends, and it finishes
    /// [`Canceled`](TaskOutcome::Canceled). Its id stays taken until it has finished.
    ///
    /// # Errors
    /// [`SupervisorError::UnknownId`]; nothing changes.
    pub fn cancel(&self, id: &K) -> Result<(), SupervisorError> {
        let registry = lock(&self.inner.registry);
        let entry = registry.tasks.get(id).ok_or(SupervisorError::UnknownId)?;
        entry.cell.control.raise(CANCEL);
        Ok(())
    }

    /// Removes the task `id`: cancels it as [`cancel`](Self::cancel) does and frees its id at
    /// once (a new task may take it while the old one winds down).
    ///
    /// # Errors
    /// [`SupervisorError::UnknownId`]; nothing changes.
    pub fn remove(&self, id: &K) -> Result<(), SupervisorError> {
        let entry = lock(&self.inner.registry).tasks.remove(id).ok_or(SupervisorError::UnknownId)?;
        entry.cell.control.raise(CANCEL);
        self.inner.changed.notify(usize::MAX);
        Ok(())
    }

    /// Whether a task with this id is supervised.
    pub fn contains(&self, id: &K) -> bool {
        lock(&self.inner.registry).tasks.contains_key(id)
    }

    /// The number of supervised tasks (not yet finished, not removed).
    pub fn len(&self) -> usize {
        lock(&self.inner.registry).tasks.len()
    }

    /// Whether no task is supervised.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `listener` with every lifecycle event of every task from now on (S6), as it
    /// happens: the same events as [`events`](Self::events), in the same order for each task,
    /// and never dropped (the channel drops what nobody reads once it is full; a listener hears
    /// all). Events of different tasks may interleave differently in the two.
    ///
    /// Listeners are called in the order they were added, by the task the event is about, with
    /// no lock held. A listener must be quick; a panic in one is caught and ignored.
    pub fn on_event(&self, listener: impl Fn(&SupervisorEvent<K, E>) + Send + Sync + 'static) {
        self.inner.listeners.add(listener);
    }

    /// The lifecycle events of all tasks. Every call returns a receiver of the same channel:
    /// with several receivers, each event goes to one of them.
    pub fn events(&self) -> Events<K, E> {
        Events { rx: self.inner.events_rx.clone() }
    }

    /// Events dropped because the channel was full.
    pub fn dropped_events(&self) -> u64 {
        self.inner.emitted[EVENT_KINDS].load(Ordering::Relaxed)
    }

    /// How many events of each kind the supervisor has emitted since it was built, whether
    /// they reached the channel or were dropped, and how many were dropped. Every task adds
    /// exactly one [`TaskFinished`](SupervisionAction::TaskFinished), and every attempt one
    /// [`AttemptStarting`](SupervisionAction::AttemptStarting) and at most one ending, so the
    /// counts check the event grammar (S6) even when the channel is full. Each figure is read
    /// on its own (tasks may emit between two reads).
    pub fn event_counts(&self) -> EventCounts {
        let read = |slot: usize| self.inner.emitted[slot].load(Ordering::Relaxed);
        EventCounts {
            attempt_starting: read(0),
            attempt_succeeded: read(1),
            attempt_failed: read(2),
            attempt_timed_out: read(3),
            attempt_canceled: read(4),
            backoff_scheduled: read(5),
            task_finished: read(6),
            dropped: read(EVENT_KINDS),
        }
    }

    /// The runtime this supervisor runs on.
    pub fn runtime(&self) -> &Rt {
        &self.inner.rt
    }

    /// Stops every task gracefully and waits for them, at most `limit`: a task waiting between
    /// attempts finishes [`Canceled`](TaskOutcome::Canceled) at once; a running attempt may
    /// end by itself, and the task then finishes (Canceled, or by its own outcome) without a
    /// new attempt. At `limit`, tasks still running are aborted: their attempts are dropped,
    /// they finish Canceled with [`TaskExit::aborted`] set, and the report lists them. No task
    /// can be added once the shutdown has begun.
    ///
    /// Returns once every task has finished (aborted tasks finish at their next poll).
    pub async fn shutdown(&self, limit: Duration) -> ShutdownReport<K> {
        let inner = &*self.inner;
        let deadline = inner.rt.now().saturating_add(limit);
        {
            let mut registry = lock(&inner.registry);
            registry.shutting_down = true;
            for entry in registry.tasks.values() {
                entry.cell.control.raise(STOP);
            }
        }
        let mut timer = pin!(inner.rt.sleep_until(deadline));
        let timed_out = loop {
            let mut listener = inner.changed.listen();
            if lock(&inner.registry).tasks.is_empty() {
                break false;
            }
            let fired = poll_fn(|cx| {
                if Pin::new(&mut listener).poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                timer.as_mut().poll(cx).map(|_| true)
            })
            .await;
            if fired {
                break true;
            }
        };
        if timed_out {
            for entry in lock(&inner.registry).tasks.values() {
                entry.cell.control.raise(ABORT);
            }
        }
        loop {
            let listener = inner.changed.listen();
            if lock(&inner.registry).tasks.is_empty() {
                break;
            }
            listener.await;
        }
        // Each task's own finish decides its list: a task that ends by itself at the limit's
        // instant, before it sees the abort, is completed, as its exit says.
        let mut report = ShutdownReport { completed: Vec::new(), aborted: Vec::new() };
        for (id, kind, aborted) in std::mem::take(&mut lock(&inner.registry).ended) {
            if aborted {
                report.aborted.push(id);
            } else {
                report.completed.push((id, kind));
            }
        }
        report
    }
}

/// A supervised task: a future of its [`TaskExit`], and a way to cancel it.
///
/// Dropping the handle does not stop the task.
pub struct TaskHandle<E> {
    exit: OneshotReceiver<TaskExit<E>>,
}

impl<E> TaskHandle<E> {
    /// Cancels the task now (as [`Supervisor::cancel`]).
    pub fn cancel(&self) {
        self.exit.cell().control.raise(CANCEL);
    }

    /// Whether the task has finished (its outcome is ready).
    pub fn is_finished(&self) -> bool {
        self.exit.is_sent()
    }
}

impl<E> Future for TaskHandle<E> {
    type Output = TaskExit<E>;

    /// Resolves once, to the task's exit.
    ///
    /// # Panics
    /// When polled again after it resolved.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TaskExit<E>> {
        Pin::new(&mut self.exit).poll(cx).map(|exit| exit.expect("`TaskHandle` polled after it resolved"))
    }
}

pin_project! {
    /// The lifecycle events of a supervisor's tasks, best-effort (see [`Supervisor`]). A
    /// [`Stream`](futures_core::Stream), or read with [`recv`](Self::recv).
    pub struct Events<K, E> {
        #[pin]
        rx: async_channel::Receiver<SupervisorEvent<K, E>>,
    }
}

impl<K, E> Events<K, E> {
    /// The next event; `None` once the supervisor and all its tasks are gone and the channel is
    /// drained.
    pub async fn recv(&self) -> Option<SupervisorEvent<K, E>> {
        self.rx.recv().await.ok()
    }

    /// The next event if one is waiting.
    pub fn try_recv(&self) -> Option<SupervisorEvent<K, E>> {
        self.rx.try_recv().ok()
    }

    /// Events waiting to be read.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

impl<K, E> futures_core::Stream for Events<K, E> {
    type Item = SupervisorEvent<K, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.project().rx.poll_next(cx)
    }
}

/// A task's machine and its reporting duties; its drop reports an outcome if the task did not.
struct TaskGuard<Rt: Runtime, Sp, K: Ord + Clone + fmt::Debug, E: Clone> {
    inner: Arc<Inner<Rt, Sp, K, E>>,
    id: K,
    serial: u64,
    machine: Supervision<JobError<E>>,
    policy: SupervisionPolicy,
    exit: Option<OneshotSender<TaskExit<E>>>,
    aborted: bool,
}

impl<Rt: Runtime, Sp, K: Ord + Clone + fmt::Debug, E: Clone> TaskGuard<Rt, Sp, K, E> {
    fn emit(&self, at: Instant, event: SupervisionAction<JobError<E>>) {
        self.inner.emit(&self.id, at, event);
    }

    /// Reports the outcome: the event, the exit, and the registry.
    fn finish(&mut self, at: Instant, outcome: TaskOutcome<JobError<E>>, attempts: u64) {
        let Some(exit) = self.exit.take() else { return };
        // The registry first: whoever sees the exit sees the id free.
        {
            let mut registry = lock(&self.inner.registry);
            if registry.tasks.get(&self.id).is_some_and(|entry| entry.serial == self.serial) {
                registry.tasks.remove(&self.id);
            }
            if registry.shutting_down {
                registry.ended.push((self.id.clone(), outcome.kind(), self.aborted));
            }
        }
        if !self.inner.faults.has(Fault::DropTaskFinished) {
            self.emit(at, SupervisionAction::TaskFinished { outcome: outcome.clone(), attempts });
        }
        exit.send(TaskExit { outcome, attempts, aborted: self.aborted });
        self.inner.changed.notify(usize::MAX);
    }
}

impl<Rt: Runtime, Sp, K: Ord + Clone + fmt::Debug, E: Clone> Drop for TaskGuard<Rt, Sp, K, E> {
    fn drop(&mut self) {
        // The task's future was dropped before it finished (its executor shut down, or never
        // polled it; its attempt, a local of that future, is already dropped): cancel the
        // machine and report what it says.
        if self.exit.is_none() {
            return;
        }
        self.aborted = true;
        let at = self.inner.rt.now();
        let _ = self.machine.handle_cancel(at);
        while let Some(event) = self.machine.poll_action() {
            match event {
                SupervisionAction::TaskFinished { outcome, attempts } => return self.finish(at, outcome, attempts),
                other => self.emit(at, other),
            }
        }
        // Unreachable for a machine that had not finished; report a cancel regardless.
        let attempts = self.machine.attempt();
        self.finish(at, TaskOutcome::Canceled { last_failure: None }, attempts);
    }
}

/// What woke a task's driver.
enum Step<E> {
    /// The attempt ended: its result, or the message of a panic while polling it.
    Ended(Result<Result<(), E>, Arc<str>>),
    /// The deadline or the wait ended.
    Timer,
    /// A graceful stop while no attempt runs.
    Stop,
    /// Cancel now; `true` for an abort by the shutdown.
    Cancel(bool),
}

/// One task's driving loop: the future each task spawns.
///
/// Its state is put together here and the `async move` block works on it in place: an `async
/// fn`, or a block that moved its captures into new locals, would hold them twice, and the
/// guard holds the policy (some 770 bytes). Each task's spawned allocation is this future
/// (`a_tasks_future_holds_its_policy_once` in tests/tests/supervisor.rs).
#[allow(clippy::manual_async_fn, reason = "an `async fn` would hold its arguments twice")]
fn drive<Rt, Sp, K, E, C, F, Fut>(
    guard: TaskGuard<Rt, Sp, K, E>,
    cell: Arc<TaskCell<TaskExit<E>>>,
    rng: SplitMix64,
    classifier: C,
    task: F,
) -> impl Future<Output = ()>
where
    Rt: Runtime,
    K: Ord + Clone + fmt::Debug,
    E: Clone,
    C: Classifier<E>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut run = TaskLoop { guard, cell, rng, classifier, task, now: Instant::ZERO };
    async move {
        let mut attempt = pin!(None::<Fut>);
        let mut timer = pin!(None::<Rt::Sleep>);
        run.begin();
        loop {
            if let ControlFlow::Break((outcome, attempts)) = run.drain(attempt.as_mut(), timer.as_mut()) {
                // Compiled only with the feature: the extra attempt's await would otherwise
                // take room in every task's future.
                #[cfg(feature = "fault-injection")]
                if run.guard.inner.faults.has(Fault::RestartAfterFatal) && outcome.kind() == TaskOutcomeKind::Fatal {
                    // The injected defect: one more attempt, unseen by the machine (polled
                    // once, then dropped: it may hang).
                    if let Ok(extra) = catch_create(&mut run.task) {
                        let mut extra = pin!(extra);
                        let _ = poll_fn(|cx| Poll::Ready(poll_caught(extra.as_mut(), cx))).await;
                    }
                }
                run.guard.finish(run.now, outcome, attempts);
                return;
            }
            let control = &run.cell.control;
            let step = poll_fn(|cx| poll_step(control, attempt.as_mut(), timer.as_mut(), cx)).await;
            run.feed(step, attempt.as_mut(), timer.as_mut());
        }
    }
}

/// Waits, the machine drained, for what comes first: a cancel or an abort, the attempt's end,
/// a graceful stop while no attempt runs, or the timer.
fn poll_step<Fut, S, E>(
    control: &Signal,
    attempt: Pin<&mut Option<Fut>>,
    timer: Pin<&mut Option<S>>,
    cx: &mut Context<'_>,
) -> Poll<Step<E>>
where
    Fut: Future<Output = Result<(), E>>,
    S: Future,
{
    let level = control.poll(cx);
    if level >= CANCEL {
        return Poll::Ready(Step::Cancel(level >= ABORT));
    }
    match attempt.as_pin_mut() {
        Some(running) => {
            if let Poll::Ready(result) = poll_caught(running, cx) {
                return Poll::Ready(Step::Ended(result));
            }
        }
        None if level >= STOP => return Poll::Ready(Step::Stop),
        None => {}
    }
    match timer.as_pin_mut() {
        Some(sleep) => sleep.poll(cx).map(|_| Step::Timer),
        None => Poll::Pending,
    }
}

/// What one task's driving loop works on: its guard (the machine, the policy and the
/// reporting), its control signal, its jitter RNG, its classifier and its job. Its machine runs
/// on the runtime's clock ([`Timeline::CLOCK`]).
struct TaskLoop<Rt: Runtime, Sp, K: Ord + Clone + fmt::Debug, E: Clone, C, F> {
    guard: TaskGuard<Rt, Sp, K, E>,
    cell: Arc<TaskCell<TaskExit<E>>>,
    rng: SplitMix64,
    classifier: C,
    task: F,
    /// The machine's time for the step being handled: the clock, read once per step.
    now: Instant,
}

impl<Rt, Sp, K, E, C, F, Fut> TaskLoop<Rt, Sp, K, E, C, F>
where
    Rt: Runtime,
    K: Ord + Clone + fmt::Debug,
    E: Clone,
    C: Classifier<E>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    /// Starts the machine, or cancels it if the task was stopped before its first attempt (it
    /// then finishes `Canceled` without one).
    fn begin(&mut self) {
        self.now = Timeline::CLOCK.now(&self.guard.inner.rt, Instant::ZERO);
        let guard = &mut self.guard;
        if self.cell.control.level() >= STOP {
            let _ = guard.machine.handle_cancel(self.now);
        } else {
            // A fresh machine accepts its start.
            let _ = guard.machine.handle_start(&guard.policy, self.now);
        }
    }

    /// Drains the machine, acting on each action; `Break` with the task's outcome and attempts
    /// once it has finished.
    fn drain(
        &mut self,
        mut attempt: Pin<&mut Option<Fut>>,
        mut timer: Pin<&mut Option<Rt::Sleep>>,
    ) -> ControlFlow<(TaskOutcome<JobError<E>>, u64)> {
        while let Some(event) = self.guard.machine.poll_action() {
            match event {
                SupervisionAction::AttemptStarting { attempt: n, deadline } => {
                    self.guard.emit(self.now, event);
                    self.start(n, deadline, attempt.as_mut(), timer.as_mut());
                }
                SupervisionAction::AttemptTimedOut { attempt: n } => {
                    self.guard.emit(self.now, event);
                    self.abandon(n, attempt.as_mut(), timer.as_mut());
                }
                SupervisionAction::BackoffScheduled { until, .. } => {
                    if self.cell.control.level() >= STOP {
                        // No attempt follows after all: the task is being stopped.
                        self.cancel();
                    } else {
                        self.guard.emit(self.now, event);
                        self.wait_until(until, timer.as_mut());
                    }
                }
                SupervisionAction::TaskFinished { outcome, attempts } => {
                    return ControlFlow::Break((outcome, attempts));
                }
                other => self.guard.emit(self.now, other),
            }
        }
        ControlFlow::Continue(())
    }

    /// Starts attempt `n`, with a timer for its deadline if it has one; a panic while creating
    /// it is its failure.
    fn start(
        &mut self,
        n: u64,
        deadline: Option<Instant>,
        mut attempt: Pin<&mut Option<Fut>>,
        mut timer: Pin<&mut Option<Rt::Sleep>>,
    ) {
        match catch_create(&mut self.task) {
            Ok(future) => {
                attempt.set(Some(future));
                let rt = &self.guard.inner.rt;
                timer.set(deadline.map(|d| Timeline::CLOCK.sleep_until(rt, d)));
            }
            Err(message) => {
                let guard = &mut self.guard;
                let failure = Failure::panicked(JobError::Panicked(message));
                // Attempt `n` is the running one, so the machine accepts its failure.
                let _ = guard.machine.handle_failure(&guard.policy, self.now, n, failure, &mut self.rng);
            }
        }
    }

    /// Drops attempt `n`, past its deadline, and tells the machine, which waits for exactly
    /// this drop (a panic while dropping it is reported with it).
    fn abandon(&mut self, n: u64, mut attempt: Pin<&mut Option<Fut>>, mut timer: Pin<&mut Option<Rt::Sleep>>) {
        timer.set(None);
        let panic = drop_caught(|| attempt.set(None));
        let guard = &mut self.guard;
        let _ =
            guard.machine.handle_abandoned(&guard.policy, self.now, n, panic.map(JobError::Panicked), &mut self.rng);
    }

    /// Waits until `until` before the next attempt; a zero wait goes straight on, never
    /// touching the timer.
    fn wait_until(&mut self, until: Instant, mut timer: Pin<&mut Option<Rt::Sleep>>) {
        let guard = &mut self.guard;
        if until <= self.now {
            guard.machine.handle_timeout(&guard.policy, self.now);
        } else {
            timer.set(Some(Timeline::CLOCK.sleep_until(&guard.inner.rt, until)));
        }
    }

    /// Feeds back what woke the loop, at the clock's time (one reading per step; after the
    /// timer fired, no earlier than what it was set for).
    fn feed(&mut self, step: Step<E>, mut attempt: Pin<&mut Option<Fut>>, mut timer: Pin<&mut Option<Rt::Sleep>>) {
        let due = if matches!(step, Step::Timer) { self.guard.machine.poll_timeout() } else { None };
        let rt = &self.guard.inner.rt;
        self.now = match due {
            Some(due) => Timeline::CLOCK.woken(rt, self.now, due),
            None => Timeline::CLOCK.now(rt, self.now),
        };
        timer.set(None);
        match step {
            Step::Ended(result) => {
                // A panic while dropping a finished attempt is the attempt's own business.
                let _ = drop_caught(|| attempt.set(None));
                self.end_attempt(result);
            }
            Step::Timer if self.cell.control.level() >= STOP && attempt.is_none() => self.cancel(),
            Step::Timer => {
                let guard = &mut self.guard;
                guard.machine.handle_timeout(&guard.policy, self.now);
            }
            Step::Stop => self.cancel(),
            Step::Cancel(abort) => {
                let _ = drop_caught(|| attempt.set(None));
                self.guard.aborted = abort;
                self.cancel();
            }
        }
    }

    /// The running attempt ended (and is dropped): the machine hears of its success, or of its
    /// error as the classifier sees it, or of its panic.
    fn end_attempt(&mut self, result: Result<Result<(), E>, Arc<str>>) {
        let failure = match result {
            Ok(Ok(())) => {
                let guard = &mut self.guard;
                // The running attempt is the machine's latest, so it accepts its result.
                let _ = guard.machine.handle_success(&guard.policy, self.now, guard.machine.attempt());
                return;
            }
            Ok(Err(error)) => Failure::new(self.classifier.classify(&error), JobError::Error(error)),
            Err(message) => Failure::panicked(JobError::Panicked(message)),
        };
        let guard = &mut self.guard;
        let attempt = guard.machine.attempt();
        let _ = guard.machine.handle_failure(&guard.policy, self.now, attempt, failure, &mut self.rng);
    }

    /// Cancels the machine (a started, unfinished, drained machine accepts it).
    fn cancel(&mut self) {
        let guard = &mut self.guard;
        let _ = guard.machine.handle_cancel(self.now);
    }
}
