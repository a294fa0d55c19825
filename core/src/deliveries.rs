//! A table of deliveries keyed by task id, for a dispatcher (requires the `alloc` feature).

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};

use rand_core::Rng;

use crate::Instant;
use crate::delivery::{
    Delivery, DeliveryAction, DeliveryError, DeliveryPolicy, DeliveryStatus, FreeReturn, Interruption, Terminal,
};
use crate::error::Refused;
use crate::failure::Failure;

/// How many tasks are in each state (D1, D9); see [`Deliveries::counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeliveryCounts {
    /// Waiting for a worker (or for a retry delay).
    pub pending: usize,
    /// Handed out, not started.
    pub handed_out: usize,
    /// Running.
    pub running: usize,
    /// [`Terminal::Completed`].
    pub completed: usize,
    /// [`Terminal::Failed`].
    pub failed: usize,
    /// [`Terminal::Proceeded`].
    pub proceeded: usize,
    /// [`Terminal::Diverted`].
    pub diverted: usize,
    /// [`Terminal::DeadLettered`].
    pub dead_lettered: usize,
}

impl DeliveryCounts {
    /// All tasks counted: every task is in exactly one state (D9).
    pub const fn total(&self) -> usize {
        self.pending
            + self.handed_out
            + self.running
            + self.completed
            + self.failed
            + self.proceeded
            + self.diverted
            + self.dead_lettered
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry<K, T, W, C, E, R> {
    task_type: T,
    delivery: Delivery<K, W, C, E, R>,
}

/// The table's queue of undrained actions, each with its task's id.
type ActionQueue<K, W, C, E, R> = VecDeque<(K, DeliveryAction<K, W, C, E, R>)>;

/// Many tasks' [`Delivery`] machines keyed by task id `K`, each with a task type `T`, driven by a
/// dispatcher: it hands the next ready task to a worker that has not declined its type, expires
/// leases and heartbeats on [`handle_timeout`](Self::handle_timeout), forwards every worker
/// report to the right task, and counts tasks per state.
///
/// Finished tasks stay in the table (in their one terminal state, D9) until
/// [`remove`](Self::remove)d, so nothing is lost.
///
/// **Drain order.** [`poll_action`](Self::poll_action) yields `(task id, action)` in the order
/// the actions were made: after every input the table drains the task it touched into its own
/// queue (so a task in the table never refuses an input as undrained), and actions of many
/// inputs accumulate there, in order, until drained. None is ever dropped.
///
/// **Cost.** Lookups by id are `O(log n)`; [`hand_out_next`](Self::hand_out_next),
/// [`poll_timeout`](Self::poll_timeout), [`handle_timeout`](Self::handle_timeout),
/// [`handle_failover`](Self::handle_failover) and [`counts`](Self::counts) scan every task
/// (`O(n)`, no allocation). Allocation happens on [`insert`](Self::insert), on the first decline
/// of a (worker, type) pair, and when the queue of undrained actions grows past its largest
/// size so far.
///
/// **Persistence.** With `serde`, the table saves its tasks, the declines and the undrained
/// actions; a loaded table validates every task (as [`Delivery`] does), that each is filed
/// under its own id, and that the queued actions are ones its tasks could have made.
///
/// **Misuse** (an unknown id, or anything a [`Delivery`] refuses) leaves the table exactly as it was.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, Deliveries, DeliveryAction, DeliveryPolicy, FreeReturn, Instant, RetryPolicy};
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(5).build()?;
/// let policy = DeliveryPolicy::builder(retry).build()?;
/// let mut table = Deliveries::<u32, &str, &str, (), ()>::new();
/// let now = Instant::ZERO;
/// table.insert(&policy, now, 1, "pdf", 100).unwrap();
/// table.insert(&policy, now, 2, "email", 200).unwrap();
///
/// assert_eq!(table.hand_out_next(&policy, now, &"w1"), Some(1));
/// table.handle_returned(&policy, now, &1, 1, &"w1", FreeReturn::Declined)?; // w1 does no "pdf"
/// assert_eq!(table.hand_out_next(&policy, now, &"w1"), Some(2)); // so it gets the email
/// assert_eq!(table.hand_out_next(&policy, now, &"w2"), Some(1)); // and w2 the pdf, attempt 1 still
/// table.handle_success(now, &1, 1, &"w2")?;
/// let counts = table.counts();
/// assert_eq!((counts.handed_out, counts.completed, counts.total()), (1, 1, 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deliveries<K, T, W, C, E, R = ()> {
    tasks: BTreeMap<K, Entry<K, T, W, C, E, R>>,
    /// Task types each worker declined.
    declined: BTreeMap<W, BTreeSet<T>>,
    /// Undrained actions, in the order they were made.
    actions: ActionQueue<K, W, C, E, R>,
}

impl<K, T, W, C, E, R> Default for Deliveries<K, T, W, C, E, R> {
    fn default() -> Self {
        Deliveries::new()
    }
}

impl<K, T, W, C, E, R> Deliveries<K, T, W, C, E, R> {
    /// An empty table.
    pub const fn new() -> Self {
        Deliveries { tasks: BTreeMap::new(), declined: BTreeMap::new(), actions: VecDeque::new() }
    }

    /// The number of tasks, finished ones included.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the table holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// How many tasks are in each state.
    pub fn counts(&self) -> DeliveryCounts {
        let mut counts = DeliveryCounts::default();
        for entry in self.tasks.values() {
            let slot = match entry.delivery.status() {
                DeliveryStatus::Pending { .. } => &mut counts.pending,
                DeliveryStatus::HandedOut { .. } => &mut counts.handed_out,
                DeliveryStatus::Running { .. } => &mut counts.running,
                DeliveryStatus::Done(Terminal::Completed { .. }) => &mut counts.completed,
                DeliveryStatus::Done(Terminal::Failed(_)) => &mut counts.failed,
                DeliveryStatus::Done(Terminal::Proceeded(_)) => &mut counts.proceeded,
                DeliveryStatus::Done(Terminal::Diverted { .. }) => &mut counts.diverted,
                DeliveryStatus::Done(Terminal::DeadLettered(_)) => &mut counts.dead_lettered,
            };
            *slot += 1;
        }
        counts
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work: a retry
    /// delay ending, a lease or a heartbeat deadline. A pure query.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.tasks.values().filter_map(|entry| entry.delivery.poll_timeout()).min()
    }

    /// Every task with its id and type, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &T, &Delivery<K, W, C, E, R>)> {
        self.tasks.iter().map(|(key, entry)| (key, &entry.task_type, &entry.delivery))
    }
}

impl<K, T, W, C, E, R> Deliveries<K, T, W, C, E, R>
where
    K: Ord + Clone,
    T: Ord + Clone,
    W: Ord + Clone,
    C: Clone,
    E: Clone,
    R: Clone,
{
    /// Adds task `task` of type `task_type` at `now`; its attempt 1 is ready.
    ///
    /// # Errors
    /// [`DeliveryError::DuplicateTask`] when the id is taken; the id and type are handed back.
    pub fn insert(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: K,
        task_type: T,
        step_execution: u64,
    ) -> Result<(), Refused<DeliveryError, (K, T)>> {
        if self.tasks.contains_key(&task) {
            return Err(Refused { error: DeliveryError::DuplicateTask, input: (task, task_type) });
        }
        let mut delivery = Delivery::new(policy, now, task.clone(), step_execution);
        drain_into(&mut self.actions, &task, &mut delivery);
        self.tasks.insert(task, Entry { task_type, delivery });
        Ok(())
    }

    /// Removes a task and gives it back with its type (typically once it is finished).
    #[allow(clippy::type_complexity)]
    pub fn remove(&mut self, task: &K) -> Option<(T, Delivery<K, W, C, E, R>)> {
        self.tasks.remove(task).map(|entry| (entry.task_type, entry.delivery))
    }

    /// One task.
    pub fn get(&self, task: &K) -> Option<&Delivery<K, W, C, E, R>> {
        self.tasks.get(task).map(|entry| &entry.delivery)
    }

    /// One task's type.
    pub fn task_type(&self, task: &K) -> Option<&T> {
        self.tasks.get(task).map(|entry| &entry.task_type)
    }

    /// Whether `worker` declined tasks of type `task_type`.
    pub fn has_declined(&self, worker: &W, task_type: &T) -> bool {
        self.declined.get(worker).is_some_and(|types| types.contains(task_type))
    }

    /// Hands the ready task with the lowest id whose type `worker` has not declined to `worker`,
    /// and returns its id; drain [`poll_action`](Self::poll_action) for the
    /// [`HandOut`](crate::HandOut). `None` when no task is ready for this worker.
    pub fn hand_out_next(&mut self, policy: &DeliveryPolicy<R>, now: Instant, worker: &W) -> Option<K> {
        let declined = self.declined.get(worker);
        let (key, entry) = self.tasks.iter_mut().find(|(_, entry)| {
            !declined.is_some_and(|types| types.contains(&entry.task_type)) && entry.delivery.can_hand_out(now, worker)
        })?;
        // `can_hand_out` said yes, so the hand-out is accepted.
        let _ =
            tracked(&mut self.actions, key, &mut entry.delivery, |d| d.handle_hand_out(policy, now, worker.clone()));
        Some(key.clone())
    }

    /// See [`Delivery::handle_started`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes.
    pub fn handle_started(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError> {
        self.with(task, |d| d.handle_started(policy, now, attempt, worker)).and_then(|r| r)
    }

    /// See [`Delivery::handle_heartbeat`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes and the
    /// checkpoint is handed back.
    pub fn handle_heartbeat(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
        checkpoint: Option<C>,
    ) -> Result<(), Refused<DeliveryError, Option<C>>> {
        let Some(entry) = self.tasks.get_mut(task) else {
            return Err(Refused { error: DeliveryError::UnknownTask, input: checkpoint });
        };
        tracked(&mut self.actions, task, &mut entry.delivery, |d| {
            d.handle_heartbeat(policy, now, attempt, worker, checkpoint)
        })
    }

    /// See [`Delivery::handle_persisted`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes.
    pub fn handle_persisted(&mut self, now: Instant, task: &K, attempt: u64) -> Result<(), DeliveryError> {
        self.with(task, |d| d.handle_persisted(now, attempt)).and_then(|r| r)
    }

    /// See [`Delivery::handle_success`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes.
    pub fn handle_success(&mut self, now: Instant, task: &K, attempt: u64, worker: &W) -> Result<(), DeliveryError> {
        self.with(task, |d| d.handle_success(now, attempt, worker)).and_then(|r| r)
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
        task: &K,
        attempt: u64,
        worker: &W,
    ) -> Result<(), DeliveryError> {
        self.handle_success(now, task, attempt, worker)
    }

    /// The former name of [`handle_failure`](Self::handle_failure).
    ///
    /// # Errors
    /// As [`handle_failure`](Self::handle_failure).
    #[deprecated(since = "0.1.0", note = "renamed `handle_failure`, as every machine names it")]
    #[allow(clippy::too_many_arguments)]
    pub fn handle_failed<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>> {
        self.handle_failure(policy, now, task, attempt, worker, failure, rng)
    }

    /// See [`Delivery::handle_failure`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes and the failure
    /// is handed back.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_failure<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
        failure: Failure<E>,
        rng: &mut G,
    ) -> Result<(), Refused<DeliveryError, Failure<E>>> {
        let Some(entry) = self.tasks.get_mut(task) else {
            return Err(Refused { error: DeliveryError::UnknownTask, input: failure });
        };
        tracked(&mut self.actions, task, &mut entry.delivery, |d| {
            d.handle_failure(policy, now, attempt, worker, failure, rng)
        })
    }

    /// See [`Delivery::handle_interrupted`].
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_interrupted<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
        interruption: Interruption,
        rng: &mut G,
    ) -> Result<(), DeliveryError> {
        self.with(task, |d| d.handle_interrupted(policy, now, attempt, worker, interruption, rng)).and_then(|r| r)
    }

    /// See [`Delivery::handle_returned`]. A [`FreeReturn::Declined`] also makes the table offer
    /// `worker` no other task of this task's type.
    ///
    /// # Errors
    /// [`DeliveryError::UnknownTask`], or what the task refuses; nothing changes.
    pub fn handle_returned(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        task: &K,
        attempt: u64,
        worker: &W,
        reason: FreeReturn,
    ) -> Result<(), DeliveryError> {
        self.with(task, |d| d.handle_returned(policy, now, attempt, worker, reason)).and_then(|r| r)?;
        if let (FreeReturn::Declined, Some(entry)) = (reason, self.tasks.get(task)) {
            self.declined.entry(worker.clone()).or_default().insert(entry.task_type.clone());
        }
        Ok(())
    }

    /// Every attempt `worker` holds is interrupted with `interruption` (a crash or a disconnect
    /// of that worker); returns how many.
    pub fn handle_worker_lost<G: Rng + ?Sized>(
        &mut self,
        policy: &DeliveryPolicy<R>,
        now: Instant,
        worker: &W,
        interruption: Interruption,
        rng: &mut G,
    ) -> usize {
        let mut lost = 0;
        for (key, entry) in self.tasks.iter_mut() {
            let d = &mut entry.delivery;
            let attempt = match d.status() {
                DeliveryStatus::HandedOut { attempt, worker: holder, .. }
                | DeliveryStatus::Running { attempt, worker: holder, .. }
                    if holder == worker =>
                {
                    *attempt
                }
                _ => continue,
            };
            if tracked(&mut self.actions, key, d, |d| {
                d.handle_interrupted(policy, now, attempt, worker, interruption, rng)
            })
            .is_ok()
            {
                lost += 1;
            }
        }
        lost
    }

    /// The server failed over: see [`Delivery::handle_failover`], for every task.
    pub fn handle_failover<G: Rng + ?Sized>(&mut self, policy: &DeliveryPolicy<R>, now: Instant, rng: &mut G) {
        for (key, entry) in self.tasks.iter_mut() {
            // The table drains every task after each input, so no task refuses it.
            let _ = tracked(&mut self.actions, key, &mut entry.delivery, |d| d.handle_failover(policy, now, rng));
        }
    }

    /// Expires leases and heartbeats and ends retry delays that are due at `now`, for every
    /// task. Early, repeated or spurious calls change nothing.
    pub fn handle_timeout<G: Rng + ?Sized>(&mut self, policy: &DeliveryPolicy<R>, now: Instant, rng: &mut G) {
        for (key, entry) in self.tasks.iter_mut() {
            // Each task reads an earlier `now` than its latest as its latest: so does the filter.
            if entry.delivery.poll_timeout().is_none_or(|t| t > now.later(entry.delivery.now())) {
                continue;
            }
            tracked(&mut self.actions, key, &mut entry.delivery, |d| d.handle_timeout(policy, now, rng));
        }
    }

    /// The next `(task id, action)`, in the order the actions were made; `None` when there is
    /// none.
    #[allow(clippy::type_complexity)]
    pub fn poll_action(&mut self) -> Option<(K, DeliveryAction<K, W, C, E, R>)> {
        self.actions.pop_front()
    }

    /// Runs `f` on one task and queues the actions it made.
    fn with<X>(&mut self, task: &K, f: impl FnOnce(&mut Delivery<K, W, C, E, R>) -> X) -> Result<X, DeliveryError> {
        let entry = self.tasks.get_mut(task).ok_or(DeliveryError::UnknownTask)?;
        Ok(tracked(&mut self.actions, task, &mut entry.delivery, f))
    }
}

/// Runs `f` on `task`'s delivery, then moves every action it made into the table's queue.
fn tracked<K: Clone, W: Clone, C: Clone, E: Clone, R: Clone, X>(
    actions: &mut ActionQueue<K, W, C, E, R>,
    task: &K,
    delivery: &mut Delivery<K, W, C, E, R>,
    f: impl FnOnce(&mut Delivery<K, W, C, E, R>) -> X,
) -> X {
    let out = f(delivery);
    drain_into(actions, task, delivery);
    out
}

/// Moves `delivery`'s undrained actions into the table's queue.
fn drain_into<K: Clone, W: Clone, C: Clone, E: Clone, R: Clone>(
    actions: &mut ActionQueue<K, W, C, E, R>,
    task: &K,
    delivery: &mut Delivery<K, W, C, E, R>,
) {
    while let Some(action) = delivery.poll_action() {
        actions.push_back((task.clone(), action));
    }
}

#[cfg(feature = "serde")]
mod persist {
    use alloc::collections::{BTreeMap, BTreeSet, VecDeque};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Deliveries, Entry};
    use crate::delivery::{Delivery, DeliveryAction, Terminal};

    #[derive(Serialize)]
    struct SavedEntry<'a, K, T, W, C, E, R> {
        task_type: &'a T,
        delivery: &'a Delivery<K, W, C, E, R>,
    }

    #[derive(Deserialize)]
    struct LoadedEntry<K, T, W, C, E, R> {
        task_type: T,
        delivery: Delivery<K, W, C, E, R>,
    }

    #[allow(clippy::type_complexity)]
    #[derive(Serialize)]
    struct Saved<'a, K: Ord, T, W: Ord, C, E, R> {
        tasks: BTreeMap<&'a K, SavedEntry<'a, K, T, W, C, E, R>>,
        declined: &'a BTreeMap<W, BTreeSet<T>>,
        actions: &'a VecDeque<(K, DeliveryAction<K, W, C, E, R>)>,
    }

    #[allow(clippy::type_complexity)]
    #[derive(Deserialize)]
    struct Loaded<K: Ord, T: Ord, W: Ord, C, E, R> {
        tasks: BTreeMap<K, LoadedEntry<K, T, W, C, E, R>>,
        declined: BTreeMap<W, BTreeSet<T>>,
        actions: VecDeque<(K, DeliveryAction<K, W, C, E, R>)>,
    }

    /// Saved as its tasks (with their types), the declines, and the undrained actions.
    impl<K, T, W, C, E, R> Serialize for Deliveries<K, T, W, C, E, R>
    where
        K: Ord + Serialize,
        T: Serialize,
        W: Ord + Serialize,
        C: Serialize,
        E: Serialize,
        R: Serialize,
    {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let tasks = self
                .tasks
                .iter()
                .map(|(k, e)| (k, SavedEntry { task_type: &e.task_type, delivery: &e.delivery }))
                .collect();
            Saved { tasks, declined: &self.declined, actions: &self.actions }.serialize(serializer)
        }
    }

    /// Whether the undrained actions could have been queued by the tasks they name.
    ///
    /// A hand-out is filed under its own task. The actions queued for an id since its newest
    /// `Ready { attempt: 1 }` (or all of them, if that was drained) are the present task's
    /// (a task added under the id of a removed one queues that `Ready` first, after the removed
    /// task's actions): they name no attempt after its current one, and a `Finish` among them is
    /// the newest, and of the kind the task finished with; a finished task's newest queued
    /// action is its `Finish` (queued actions are drained in order). Older actions of an id
    /// belong to removed tasks, or to the present one before a repeated `Ready { attempt: 1 }`
    /// (a decline, a free return, a rollback), and are only checked for the hand-out's id.
    #[allow(clippy::type_complexity)]
    fn check_actions<K: Ord, T, W, C, E, R>(
        tasks: &BTreeMap<K, Entry<K, T, W, C, E, R>>,
        actions: &VecDeque<(K, DeliveryAction<K, W, C, E, R>)>,
    ) -> Result<(), &'static str> {
        // Walked newest first: the ids seen so far, and those whose present task's actions
        // have all been checked.
        let mut seen = BTreeSet::new();
        let mut done = BTreeSet::new();
        for (key, action) in actions.iter().rev() {
            if let DeliveryAction::HandOut(handed) = action
                && handed.key.task != *key
            {
                return Err("invalid Deliveries: a queued hand-out names another task");
            }
            let newest = seen.insert(key);
            let Some(entry) = tasks.get(key) else { continue };
            if done.contains(key) {
                continue;
            }
            let delivery = &entry.delivery;
            // A finished task queues nothing after its outcome, and its outcome after all its
            // other actions: its id's newest queued action, if it has any, is that outcome.
            if newest && delivery.terminal().is_some() && !matches!(action, DeliveryAction::Finish(_)) {
                return Err("invalid Deliveries: a finished task has actions queued after its outcome");
            }
            let attempt = match action {
                DeliveryAction::Revoke { attempt, .. } | DeliveryAction::Ready { attempt } => *attempt,
                DeliveryAction::HandOut(handed) => handed.attempt,
                DeliveryAction::Finish(terminal) => {
                    if !newest {
                        return Err("invalid Deliveries: a task's queued actions go on after its outcome");
                    }
                    if delivery.terminal().map(Terminal::kind) != Some(terminal.kind()) {
                        return Err("invalid Deliveries: a queued outcome is not of the kind its task finished with");
                    }
                    continue;
                }
            };
            if attempt > delivery.attempt() {
                return Err("invalid Deliveries: a queued action names an attempt its task has not reached");
            }
            if matches!(action, DeliveryAction::Ready { attempt: 1 }) {
                done.insert(key);
            }
        }
        Ok(())
    }

    /// Loaded with every task validated (as [`Delivery`] is) and filed under its own id,
    /// holding no undrained action of its own (the table drains every task), and with queued
    /// actions its tasks could have made (`check_actions`).
    impl<'de, K, T, W, C, E, R> Deserialize<'de> for Deliveries<K, T, W, C, E, R>
    where
        K: Ord + Deserialize<'de>,
        T: Ord + Deserialize<'de>,
        W: Ord + Deserialize<'de>,
        C: Deserialize<'de>,
        E: Deserialize<'de>,
        R: Deserialize<'de>,
    {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let loaded = Loaded::<K, T, W, C, E, R>::deserialize(deserializer)?;
            let mut tasks = BTreeMap::new();
            for (key, entry) in loaded.tasks {
                if *entry.delivery.task() != key {
                    return Err(serde::de::Error::custom("invalid Deliveries: a task is filed under another id"));
                }
                if entry.delivery.has_actions() {
                    return Err(serde::de::Error::custom(
                        "invalid Deliveries: a task holds undrained actions (the table drains every task)",
                    ));
                }
                tasks.insert(key, Entry { task_type: entry.task_type, delivery: entry.delivery });
            }
            check_actions(&tasks, &loaded.actions).map_err(serde::de::Error::custom)?;
            Ok(Deliveries { tasks, declined: loaded.declined, actions: loaded.actions })
        }
    }
}
