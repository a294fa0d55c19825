//! The scheduler: recurring flows that back off after failures and trip after a streak
//! (rules F1–F10), on any executor.
//!
//! All flows live in one core [`Flows`] registry behind one lock, and one timer loop drives them
//! all: it sleeps until the registry's earliest due time (or the earliest cron tick), dispatches
//! what is due, and goes back to sleep. Each dispatched run is spawned; its result is fed back
//! into the registry by one transition under the lock, so [`SchedulerHandle::status`] never
//! sees a state in between (F3).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::{Future, poll_fn};
use std::ops::ControlFlow;
use std::pin::pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use croner::Cron;
use event_listener::Event;
use persevere::{
    Failure, FailureKind, Flow, FlowAction, FlowError, FlowInfo, FlowPolicy, Flows, Instant, PolicyError, SkipReason,
    TripReason,
};

use crate::classify::Classifier;
use crate::fault::{Fault, Faults};

/// A `tracing` event of target `persevere::scheduler` (docs/guide.md's Observability table) when
/// the `tracing` feature is on; nothing otherwise.
macro_rules! event {
    ($level:ident, $($arg:tt)*) => {
        #[cfg(feature = "tracing")]
        tracing::$level!(target: "persevere::scheduler", $($arg)*);
    };
}
use crate::bounds::{Id, JobErrorType, SendRuntime};
use crate::job::{JobError, catch_create, poll_caught};
use crate::listeners::Listeners;
use crate::runtime::Timeline;
use crate::signals::Nudge;
use crate::spawn::Spawn;
use crate::sync::lock;
use persevere::SplitMix64;

/// A caller mistake; nothing changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// No flow has this id.
    #[error("no flow has this id")]
    UnknownId,
    /// A flow with this id is already registered.
    #[error("a flow with this id is already registered")]
    DuplicateId,
    /// The cron expression does not parse, or never matches.
    #[error("invalid cron expression `{expression}`: {reason}")]
    InvalidCron {
        /// The expression as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An invalid setting (a zero interval).
    #[error("invalid flow setting: {0}")]
    Policy(#[from] PolicyError),
    /// `trigger` on a tripped flow (F7): reset it first.
    #[error("the flow is tripped ({reason:?}, with {streak} consecutive failures); call `reset_flow` first")]
    Tripped {
        /// Its failure streak.
        streak: u32,
        /// Why it tripped.
        reason: persevere::TripReason,
    },
    /// `trigger` while a run of the flow is in flight (F7): runs of one flow never overlap.
    #[error("the flow is already running; runs of one flow never overlap")]
    Running,
    /// The scheduler was stopped.
    #[error("the scheduler is stopped")]
    Stopped,
    /// Another refusal of the core flow machine.
    #[error(transparent)]
    Flow(FlowError),
}

impl From<FlowError> for SchedulerError {
    fn from(error: FlowError) -> Self {
        match error {
            FlowError::UnknownId => SchedulerError::UnknownId,
            FlowError::Tripped { streak, reason } => SchedulerError::Tripped { streak, reason },
            FlowError::Running => SchedulerError::Running,
            other => SchedulerError::Flow(other),
        }
    }
}

/// A flow's job with its type erased. It spawns each run of its flow itself, so the run's
/// future holds the job's future inline: a dispatch costs the spawn's allocation and no box.
trait Job<Rt, Sp, K, E>: Send + Sync {
    /// Spawns one run of the flow `id` on `shared`'s spawner.
    fn spawn_run(self: Arc<Self>, shared: &Arc<Shared<Rt, Sp, K, E>>, id: K, classifier: Option<SharedClassifier<E>>);
}

/// A job closure, as given to [`Scheduler::every`] or [`Scheduler::cron`].
struct JobFn<F>(F);

impl<F, Fut, Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> Job<Rt, Sp, K, E> for JobFn<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
{
    fn spawn_run(self: Arc<Self>, shared: &Arc<Shared<Rt, Sp, K, E>>, id: K, classifier: Option<SharedClassifier<E>>) {
        let guard = RunGuard { shared: shared.clone(), id: Some(id) };
        shared.spawner.spawn(run(guard, self, classifier));
    }
}

/// A flow's classifier, shared by its runs (which never overlap, so the lock is never waited on).
type SharedClassifier<E> = Arc<Mutex<dyn Classifier<E> + Send>>;

/// What one run of a flow needs: its job, and how its errors are classified.
struct Work<Rt, Sp, K, E> {
    job: Arc<dyn Job<Rt, Sp, K, E>>,
    classifier: Option<SharedClassifier<E>>,
}

/// The runs a dispatch took, spawned once the registry's lock is released.
type Batch<Rt, Sp, K, E> = Vec<(K, Work<Rt, Sp, K, E>)>;

impl<Rt, Sp, K, E> Clone for Work<Rt, Sp, K, E> {
    fn clone(&self) -> Self {
        Work { job: self.job.clone(), classifier: self.classifier.clone() }
    }
}

/// How a run ended, as fed back into the flow.
enum RunEnd<E> {
    Succeeded,
    Failed(Failure<JobError<E>>),
}

enum Schedule {
    Every(Duration),
    Cron(Box<Cron>),
}

struct Spec<Rt, Sp, K, E> {
    schedule: Schedule,
    work: Work<Rt, Sp, K, E>,
    policy: Option<FlowPolicy>,
}

/// Recurring flows, configured before [`start`](Self::start): `every` and `cron` flows, each
/// with a job and a [`FlowPolicy`] (backoff and trip limit, F2).
///
/// Generic over the executor's clock and timers (`Rt`), its spawner (`Sp`), flow ids (`K`) and
/// the jobs' error type (`E`); `persevere-tokio` and `persevere-smol` name it with their
/// runtime filled in.
///
/// - **Every** (F5): dispatched at start; after each run at `max(run_end + interval,
///   next_eligible)`.
/// - **Cron** (F6): expressions are parsed by the `croner` crate (5 fields, or 6 with seconds
///   first, or 7 with years last; `L`, `W`, `#`), evaluated in UTC. The first tick is the
///   first occurrence strictly after start. Ticks inside the backoff window, while a run is in
///   flight, or while the flow is tripped are skipped and never replayed; ticks missed because
///   the loop ran late are coalesced into one.
/// - **Cron time.** At start, the scheduler pins the wall clock (or
///   [`wall_clock_at_start`](Self::wall_clock_at_start)) to the runtime's clock and follows the
///   runtime's clock from there, so cron flows run on paused or simulated time too; a later
///   step of the system's wall clock (an NTP correction) is not followed.
/// - **Jobs** return `Result<(), E>`; a panic while creating or polling a run is caught and is
///   a failure with [`JobError::Panicked`] (retryable). Every error is retryable unless the
///   flow has a [`classify`](Self::classify)er: then `Fatal` and `DoNotRetry` trip the flow at
///   once (the status says why), a hint (`Retry-After`) sets the backoff window, and
///   `Canceled` is a clean cancel (F3, F4).
pub struct Scheduler<Rt, Sp, K, E> {
    rt: Rt,
    spawner: Sp,
    specs: BTreeMap<K, Spec<Rt, Sp, K, E>>,
    default_policy: FlowPolicy,
    seed: Option<u64>,
    wall: Option<SystemTime>,
    faults: Faults,
}

impl<Rt: Default, Sp: Default, K, E> Default for Scheduler<Rt, Sp, K, E> {
    fn default() -> Self {
        Scheduler::with(Rt::default(), Sp::default())
    }
}

impl<Rt: Default, Sp: Default, K, E> Scheduler<Rt, Sp, K, E> {
    /// A scheduler with no flows, on the default runtime and spawner.
    pub fn new() -> Self {
        Scheduler::default()
    }
}

impl<Rt, Sp, K, E> Scheduler<Rt, Sp, K, E> {
    /// A scheduler with no flows, on `rt` and `spawner`.
    pub fn with(rt: Rt, spawner: Sp) -> Self {
        Scheduler {
            rt,
            spawner,
            specs: BTreeMap::new(),
            default_policy: FlowPolicy::default(),
            seed: None,
            wall: None,
            faults: Faults::default(),
        }
    }
}

impl<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> Scheduler<Rt, Sp, K, E> {
    /// Adds a flow dispatched at start and then every `interval` after each run ends (F5).
    ///
    /// # Errors
    /// [`SchedulerError::DuplicateId`], or [`SchedulerError::Policy`] for a zero interval;
    /// nothing changes.
    pub fn every<F, Fut>(&mut self, id: K, interval: Duration, job: F) -> Result<&mut Self, SchedulerError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        if interval.is_zero() {
            return Err(PolicyError::Zero {
                setting: "interval",
                why: "a flow every 0 s would run back to back; use a positive interval",
            }
            .into());
        }
        self.insert(id, Schedule::Every(interval), job)
    }

    /// Adds a flow dispatched by the cron expression `expression` (F6), in UTC.
    ///
    /// # Errors
    /// [`SchedulerError::InvalidCron`] when it does not parse or never matches;
    /// [`SchedulerError::DuplicateId`]; nothing changes.
    pub fn cron<F, Fut>(&mut self, id: K, expression: &str, job: F) -> Result<&mut Self, SchedulerError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        let invalid = |reason: String| SchedulerError::InvalidCron { expression: expression.to_owned(), reason };
        let cron = Cron::from_str(expression).map_err(|e| invalid(e.to_string()))?;
        let now = utc(unix_nanos(SystemTime::now())).ok_or_else(|| invalid("the clock is out of range".into()))?;
        cron.find_next_occurrence(&now, false).map_err(|e| invalid(format!("it never matches ({e})")))?;
        self.insert(id, Schedule::Cron(Box::new(cron)), job)
    }

    fn insert<F, Fut>(&mut self, id: K, schedule: Schedule, job: F) -> Result<&mut Self, SchedulerError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        if self.specs.contains_key(&id) {
            return Err(SchedulerError::DuplicateId);
        }
        let job: Arc<dyn Job<Rt, Sp, K, E>> = Arc::new(JobFn(job));
        self.specs.insert(id, Spec { schedule, work: Work { job, classifier: None }, policy: None });
        Ok(self)
    }

    /// Classifies the errors of the flow `id`'s runs (a closure `FnMut(&E) -> FailureKind`, or
    /// [`ByTrait`](crate::ByTrait)), as `retry` does: `Fatal` and `DoNotRetry` trip the flow at
    /// once, a hint sets the window (bounded by the policy's `max_hint`, B6), `Canceled` is a
    /// clean cancel. Without one, every error is retryable. A classifier that panics counts the
    /// run as panicked.
    ///
    /// # Errors
    /// [`SchedulerError::UnknownId`]; nothing changes.
    pub fn classify<C>(&mut self, id: &K, classifier: C) -> Result<&mut Self, SchedulerError>
    where
        C: Classifier<E> + Send + 'static,
    {
        let spec = self.specs.get_mut(id).ok_or(SchedulerError::UnknownId)?;
        spec.work.classifier = Some(Arc::new(Mutex::new(classifier)));
        Ok(self)
    }

    /// Sets the backoff and trip limit of the flow `id` (F2). Flows with equal policies share
    /// one copy.
    ///
    /// # Errors
    /// [`SchedulerError::UnknownId`]; nothing changes.
    pub fn set_backoff(&mut self, id: &K, policy: FlowPolicy) -> Result<&mut Self, SchedulerError> {
        self.specs.get_mut(id).ok_or(SchedulerError::UnknownId)?.policy = Some(policy);
        Ok(self)
    }

    /// Sets the policy of every flow without its own [`set_backoff`](Self::set_backoff)
    /// (by default [`FlowPolicy::default`], F2: 1 s, ×2, cap 5 min, jitter 0.1, never trips).
    pub fn default_backoff(&mut self, policy: FlowPolicy) -> &mut Self {
        self.default_policy = policy;
        self
    }

    /// Seeds the jitter, for reproducible delays (by default, the runtime's entropy).
    pub fn seed(&mut self, seed: u64) -> &mut Self {
        self.seed = Some(seed);
        self
    }

    /// The wall-clock time that cron expressions see at start (by default, the system's).
    pub fn wall_clock_at_start(&mut self, at: SystemTime) -> &mut Self {
        self.wall = Some(at);
        self
    }

    /// Injects `fault` into the scheduler (test-only, feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn inject_fault(&mut self, fault: crate::fault::Fault) -> &mut Self {
        self.faults.inject(fault);
        self
    }

    /// The number of flows.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether there are no flows.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Starts the timer loop (spawned): every-flows are dispatched at once, cron flows at their
    /// first tick.
    pub fn start(self) -> SchedulerHandle<Rt, Sp, K, E> {
        let now = self.rt.now();
        let wall = WallClock { anchor_ns: unix_nanos(self.wall.unwrap_or_else(SystemTime::now)), at: now };
        let mut flows = Flows::new();
        let mut entries = BTreeMap::new();
        let mut cron_due = BTreeSet::new();
        let mut policies = vec![Arc::new(self.default_policy)];
        for (id, spec) in self.specs {
            let policy = match spec.policy {
                None => policies[0].clone(),
                Some(policy) => match policies.iter().find(|p| ***p == policy) {
                    Some(shared) => shared.clone(),
                    None => {
                        policies.push(Arc::new(policy));
                        policies[policies.len() - 1].clone()
                    }
                },
            };
            let cron = match spec.schedule {
                Schedule::Every(interval) => {
                    // The ids are distinct (checked by `every`/`cron`), so the insert succeeds.
                    let _ = flows.insert(id.clone(), Flow::every(now, interval));
                    None
                }
                Schedule::Cron(cron) => {
                    let _ = flows.insert(id.clone(), Flow::cron(now));
                    if let Some(tick) = wall.next_tick(&cron, now) {
                        cron_due.insert((tick, id.clone()));
                    }
                    Some(cron)
                }
            };
            entries.insert(id, Entry { work: spec.work, policy, cron });
        }
        let seed = self.seed.unwrap_or_else(|| self.rt.entropy());
        let shared = Arc::new(Shared {
            rt: self.rt,
            spawner: self.spawner,
            wall,
            state: Mutex::new(State {
                flows,
                entries,
                cron_due,
                rng: SplitMix64::new(seed),
                sleeping_until: Instant::ZERO,
                in_flight: 0,
                stopped: false,
                loop_done: false,
                skipped_ticks: 0,
                transitions: 0,
            }),
            wake: Nudge::default(),
            done: Event::new(),
            listeners: Listeners::new(),
            faults: self.faults,
        });
        shared.spawner.spawn(timer_loop(shared.clone()));
        SchedulerHandle { shared }
    }
}

/// Unix time in nanoseconds (negative before 1970).
fn unix_nanos(at: SystemTime) -> i128 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

fn utc(unix_ns: i128) -> Option<DateTime<Utc>> {
    let secs = i64::try_from(unix_ns.div_euclid(1_000_000_000)).ok()?;
    DateTime::from_timestamp(secs, unix_ns.rem_euclid(1_000_000_000) as u32)
}

/// The wall clock pinned to the runtime's clock at start.
#[derive(Clone, Copy, Debug)]
struct WallClock {
    anchor_ns: i128,
    at: Instant,
}

impl WallClock {
    /// The first tick of `cron` strictly after `after`.
    fn next_tick(&self, cron: &Cron, after: Instant) -> Option<Instant> {
        let since = i128::from(after.as_nanos()) - i128::from(self.at.as_nanos());
        let now = utc(self.anchor_ns + since)?;
        let next = cron.find_next_occurrence(&now, false).ok()?;
        let next_ns = i128::from(next.timestamp()) * 1_000_000_000 + i128::from(next.timestamp_subsec_nanos());
        let offset = u64::try_from((next_ns - self.anchor_ns).max(0)).unwrap_or(u64::MAX);
        Some(self.at.saturating_add(Duration::from_nanos(offset)))
    }
}

struct Entry<Rt, Sp, K, E> {
    work: Work<Rt, Sp, K, E>,
    policy: Arc<FlowPolicy>,
    cron: Option<Box<Cron>>,
}

struct State<Rt, Sp, K, E> {
    flows: Flows<K, JobError<E>>,
    entries: BTreeMap<K, Entry<Rt, Sp, K, E>>,
    /// The next tick of each cron flow.
    cron_due: BTreeSet<(Instant, K)>,
    rng: SplitMix64,
    /// What the timer loop sleeps until (`Instant::MAX` for nothing); a change that makes
    /// something due earlier nudges it.
    sleeping_until: Instant,
    in_flight: usize,
    stopped: bool,
    loop_done: bool,
    skipped_ticks: u64,
    /// Flow transitions told to listeners so far ([`FlowTransition::sequence`]).
    transitions: u64,
}

/// A flow that tripped or was reset, as [`SchedulerHandle::on_transition`] listeners hear it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowTransition<K> {
    /// The flow.
    pub flow: K,
    /// What changed.
    pub change: FlowChange,
    /// When, on the scheduler's runtime clock.
    pub at: Instant,
    /// The scheduler's count of transitions, this one included: it grows with every one, so
    /// two made at nearly the same moment by two tasks (a run's end that trips a flow and a
    /// `reset_flow` racing it), which listeners may hear in either order, can be put back in
    /// the order they happened.
    pub sequence: u64,
}

/// What changed in a [`FlowTransition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlowChange {
    /// The flow tripped (F10): no run is dispatched until it is reset.
    Tripped {
        /// Its consecutive failures.
        streak: u32,
        /// Why it tripped.
        reason: TripReason,
    },
    /// The flow was reset (F8): streak and window zeroed.
    Reset,
}

struct Shared<Rt, Sp, K, E> {
    rt: Rt,
    spawner: Sp,
    wall: WallClock,
    state: Mutex<State<Rt, Sp, K, E>>,
    wake: Nudge,
    done: Event,
    listeners: Listeners<FlowTransition<K>>,
    /// Test-only defects (none without the `fault-injection` feature).
    faults: Faults,
}

impl<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> Shared<Rt, Sp, K, E> {
    /// Takes note of run `id`, which the registry has just dispatched; the caller spawns it
    /// with [`launch`](Self::launch) once the lock is released (a spawner may drop a future at
    /// once, and its drop takes the lock).
    fn take_run(state: &mut State<Rt, Sp, K, E>, id: K, batch: &mut Batch<Rt, Sp, K, E>) {
        if let Some(entry) = state.entries.get(&id) {
            #[cfg(feature = "tracing")]
            {
                let run = state.flows.get(&id).map_or(0, |flow| flow.info().run_count);
                tracing::debug!(target: "persevere::scheduler", flow = ?id, run, "run dispatched");
            }
            state.in_flight += 1;
            batch.push((id, entry.work.clone()));
        }
    }

    /// Spawns the runs of `batch`. Called without the lock.
    fn launch(self: &Arc<Self>, batch: &mut Batch<Rt, Sp, K, E>) {
        for (id, work) in batch.drain(..) {
            work.job.spawn_run(self, id, work.classifier);
        }
    }

    /// Dispatches everything due at `now` into `batch`; returns when the loop must wake next.
    fn dispatch_due(
        &self,
        state: &mut State<Rt, Sp, K, E>,
        now: Instant,
        batch: &mut Batch<Rt, Sp, K, E>,
    ) -> Option<Instant> {
        state.flows.handle_timeout(now);
        while let Some((id, action)) = state.flows.poll_action() {
            if let FlowAction::Dispatch { .. } = action {
                Self::take_run(state, id, batch);
            }
        }
        while let Some((tick, id)) = state.cron_due.first().cloned() {
            if tick > now {
                break;
            }
            state.cron_due.pop_first();
            if !state.entries.contains_key(&id) {
                continue;
            }
            match state.flows.handle_tick(now, &id, tick) {
                Ok(FlowAction::Dispatch { .. }) => Self::take_run(state, id.clone(), batch),
                Ok(skipped) => {
                    if let FlowAction::TickSkipped { reason, .. } = skipped {
                        event!(debug, flow = ?id, reason = ?reason, "tick skipped");
                        if let SkipReason::InBackoff { until } = reason
                            && self.faults.has(Fault::ReplaySkippedTick)
                        {
                            // The injected defect: the skipped tick comes back when the window ends.
                            state.cron_due.insert((until, id.clone()));
                        }
                        let _ = reason;
                    }
                    state.skipped_ticks += 1;
                }
                Err(_) => continue,
            }
            if let Some(cron) = state.entries.get(&id).and_then(|e| e.cron.as_deref()) {
                // Ticks missed while the loop ran late are coalesced, never replayed.
                if let Some(next) = self.wall.next_tick(cron, tick.later(now)) {
                    state.cron_due.insert((next, id));
                }
            }
        }
        let next_cron = state.cron_due.first().map(|(tick, _)| *tick);
        match (state.flows.poll_timeout(), next_cron) {
            (Some(a), Some(b)) => Some(a.earlier(b)),
            (a, b) => a.or(b),
        }
    }

    /// One turn of the timer loop, under the lock: dispatches into `batch` what is due now (after
    /// the timer fired, at least what it was set for, `fired`) and says when the loop must wake
    /// next (`None`: only a nudge wakes it); `Break` once the scheduler is stopped.
    fn turn(&self, fired: Option<Instant>, batch: &mut Batch<Rt, Sp, K, E>) -> ControlFlow<(), Option<Instant>> {
        let mut state = lock(&self.state);
        if state.stopped {
            return ControlFlow::Break(());
        }
        // The registry's flows each keep their own latest time: no floor but the timer's.
        let now = match fired {
            Some(fired) => Timeline::CLOCK.woken(&self.rt, Instant::ZERO, fired),
            None => Timeline::CLOCK.now(&self.rt, Instant::ZERO),
        };
        let next = self.dispatch_due(&mut state, now, batch);
        state.sleeping_until = next.unwrap_or(Instant::MAX);
        ControlFlow::Continue(next)
    }

    /// The timer loop has ended: once no run is in flight either, [`SchedulerHandle::wait`]
    /// hears of it.
    fn loop_ended(&self) {
        let idle = {
            let mut state = lock(&self.state);
            state.loop_done = true;
            state.in_flight == 0
        };
        if idle {
            self.done.notify(usize::MAX);
        }
    }

    /// Feeds a run's end back (one transition under the lock, F3); `None` when the run was
    /// dropped before it ended (a clean cancel, F4).
    fn complete(&self, id: &K, end: Option<RunEnd<E>>) {
        let now = self.rt.now();
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let mut tripped = None;
        // The flow is running this run (only its end ends it), and the registry drains its
        // flows itself, so it accepts the run's end.
        if let Some(policy) = state.entries.get(id).map(|e| e.policy.clone()) {
            let action = match end {
                Some(RunEnd::Succeeded) => {
                    event!(debug, flow = ?id, "run succeeded");
                    state.flows.handle_success(now, id).map(|()| None)
                }
                Some(RunEnd::Failed(failure)) => {
                    event!(debug, flow = ?id, class = ?failure.kind.class(), "run failed");
                    state.flows.handle_failure(&policy, now, id, failure, &mut state.rng).map_err(|r| r.error)
                }
                None => {
                    event!(debug, flow = ?id, "run canceled");
                    state.flows.handle_cancel(now, id).map(|()| None)
                }
            };
            if let Ok(Some(FlowAction::Tripped { streak, reason })) = action {
                event!(info, flow = ?id, streak, reason = ?reason, "flow tripped");
                #[cfg(feature = "metrics")]
                metrics::counter!("persevere_flow_trips_total").increment(1);
                state.transitions += 1;
                tripped = Some((FlowChange::Tripped { streak, reason }, state.transitions));
            }
        }
        state.in_flight -= 1;
        let due = state.flows.get(id).and_then(Flow::poll_timeout);
        let wake = due.is_some_and(|due| due < state.sleeping_until);
        let idle = state.in_flight == 0 && state.loop_done;
        drop(guard);
        if let Some((change, sequence)) = tripped {
            self.listeners.tell(&FlowTransition { flow: id.clone(), change, at: now, sequence });
        }
        if wake {
            self.wake.nudge();
        }
        if idle {
            self.done.notify(usize::MAX);
        }
    }
}

/// Reports a run's result; if the run is dropped before it ends, reports a clean cancel.
struct RunGuard<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> {
    shared: Arc<Shared<Rt, Sp, K, E>>,
    id: Option<K>,
}

impl<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> Drop for RunGuard<Rt, Sp, K, E> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.complete(&id, None);
        }
    }
}

/// One run of a flow.
async fn run<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType, F, Fut>(
    mut guard: RunGuard<Rt, Sp, K, E>,
    job: Arc<JobFn<F>>,
    classifier: Option<SharedClassifier<E>>,
) where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
{
    let result = match catch_create(|| (job.0)()) {
        Ok(future) => {
            let mut future = pin!(future);
            poll_fn(|cx| poll_caught(future.as_mut(), cx)).await
        }
        Err(message) => Err(message),
    };
    let end = match result {
        Ok(Ok(())) => RunEnd::Succeeded,
        Ok(Err(error)) => {
            let kind = match &classifier {
                Some(classifier) => catch_create(|| lock(classifier).classify(&error)).unwrap_or(FailureKind::Panicked),
                None => FailureKind::Retryable,
            };
            RunEnd::Failed(Failure::new(kind, JobError::Error(error)))
        }
        Err(message) => RunEnd::Failed(Failure::panicked(JobError::Panicked(message))),
    };
    if let Some(id) = guard.id.take() {
        guard.shared.complete(&id, Some(end));
    }
}

/// The one timer loop of a scheduler: dispatches what is due, sleeps until the next due time
/// or a nudge, and again, until the scheduler is stopped.
async fn timer_loop<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType>(shared: Arc<Shared<Rt, Sp, K, E>>) {
    let mut timer = pin!(None::<Rt::Sleep>);
    let mut batch = Vec::new();
    // What the timer is set for, and what it was set for once it fired.
    let mut armed: Option<Instant> = None;
    let mut fired: Option<Instant> = None;
    loop {
        shared.wake.clear();
        let ControlFlow::Continue(next) = shared.turn(fired.take(), &mut batch) else { break };
        shared.launch(&mut batch);
        if next != armed {
            timer.set(next.map(|at| Timeline::CLOCK.sleep_until(&shared.rt, at)));
            armed = next;
        }
        let timer_fired = poll_fn(|cx| {
            if shared.wake.poll_take(cx) {
                return Poll::Ready(false);
            }
            match timer.as_mut().as_pin_mut() {
                Some(sleep) => sleep.poll(cx).map(|_| true),
                None => Poll::Pending,
            }
        })
        .await;
        if timer_fired {
            fired = armed.take();
            timer.set(None);
        }
    }
    shared.loop_ended();
}

/// A running scheduler (from [`Scheduler::start`]). Cloning gives another handle to it;
/// dropping every handle does not stop it ([`stop`](Self::stop) does).
pub struct SchedulerHandle<Rt, Sp, K, E> {
    shared: Arc<Shared<Rt, Sp, K, E>>,
}

impl<Rt, Sp, K, E> Clone for SchedulerHandle<Rt, Sp, K, E> {
    fn clone(&self) -> Self {
        SchedulerHandle { shared: self.shared.clone() }
    }
}

impl<Rt, Sp, K, E> fmt::Debug for SchedulerHandle<Rt, Sp, K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulerHandle").finish_non_exhaustive()
    }
}

impl<Rt: SendRuntime, Sp: Spawn, K: Id, E: JobErrorType> SchedulerHandle<Rt, Sp, K, E> {
    /// What the flow `id` looks like now (F9): always a state some transition left it in,
    /// never one in between (F3).
    ///
    /// # Errors
    /// [`SchedulerError::UnknownId`].
    pub fn status(&self, id: &K) -> Result<FlowInfo<JobError<E>>, SchedulerError> {
        let state = lock(&self.shared.state);
        let info = state.flows.info(id).ok_or(SchedulerError::UnknownId)?;
        Ok(FlowInfo {
            failure_streak: info.failure_streak,
            next_eligible: info.next_eligible,
            run_count: info.run_count,
            status: info.status.cloned(),
        })
    }

    /// Dispatches the flow `id` now, bypassing its backoff window (F7).
    ///
    /// # Errors
    /// [`SchedulerError::Tripped`] (reset it first), [`SchedulerError::Running`],
    /// [`SchedulerError::UnknownId`] or [`SchedulerError::Stopped`]; nothing changes.
    pub fn trigger(&self, id: &K) -> Result<(), SchedulerError> {
        let now = self.shared.rt.now();
        let mut state = lock(&self.shared.state);
        if state.stopped {
            return Err(SchedulerError::Stopped);
        }
        match state.flows.trigger(now, id) {
            // The injected defect: a tripped flow is dispatched all the same.
            Err(FlowError::Tripped { .. }) if self.shared.faults.has(Fault::DispatchWhileTripped) => {}
            result => {
                result?;
            }
        }
        let mut batch = Vec::with_capacity(1);
        Shared::<Rt, Sp, K, E>::take_run(&mut state, id.clone(), &mut batch);
        drop(state);
        self.shared.launch(&mut batch);
        Ok(())
    }

    /// Calls `listener` with each [`FlowTransition`] from now on: a flow that trips (F10) or is
    /// reset (F8).
    ///
    /// Listeners are called in the order they were added, by the task whose run ended (or the
    /// caller of `reset_flow`), with no lock held: a listener may reset the flow that just
    /// tripped. Two transitions made at nearly the same moment by two tasks may be heard in
    /// either order; [`FlowTransition::sequence`] orders them. A listener must be quick; a
    /// panic in one is caught and ignored.
    pub fn on_transition(&self, listener: impl Fn(&FlowTransition<K>) + Send + Sync + 'static) {
        self.shared.listeners.add(listener);
    }

    /// Zeroes the flow's streak and window (F8): a tripped or backing-off flow becomes `Idle`
    /// and is dispatched again by its schedule, and listeners and the log hear a reset. A run
    /// in flight keeps running; if it fails, the new streak starts at 1. Resetting a flow that
    /// has no streak clears nothing, and nobody hears of it.
    ///
    /// # Errors
    /// [`SchedulerError::UnknownId`]; nothing changes.
    pub fn reset_flow(&self, id: &K) -> Result<(), SchedulerError> {
        let now = self.shared.rt.now();
        let mut state = lock(&self.shared.state);
        let reset = state.flows.reset_flow(now, id)?;
        let told = match reset {
            Some(FlowAction::Reset { streak, tripped }) => {
                let _ = (streak, tripped); // only logged, with `tracing`
                event!(info, flow = ?id, streak, tripped, "flow reset");
                state.transitions += 1;
                Some((FlowChange::Reset, state.transitions))
            }
            _ => None,
        };
        let due = state.flows.get(id).and_then(Flow::poll_timeout);
        let wake = due.is_some_and(|due| due < state.sleeping_until);
        drop(state);
        if let Some((change, sequence)) = told {
            self.shared.listeners.tell(&FlowTransition { flow: id.clone(), change, at: now, sequence });
        }
        if wake {
            self.shared.wake.nudge();
        }
        Ok(())
    }

    /// The flow ids, in order.
    pub fn ids(&self) -> Vec<K> {
        lock(&self.shared.state).entries.keys().cloned().collect()
    }

    /// Runs in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }

    /// Cron ticks skipped so far (inside a backoff window, during a run, or while tripped; F6).
    pub fn skipped_ticks(&self) -> u64 {
        lock(&self.shared.state).skipped_ticks
    }

    /// The runtime the scheduler runs on.
    pub fn runtime(&self) -> &Rt {
        &self.shared.rt
    }

    /// Stops dispatching: the timer loop ends and [`trigger`](Self::trigger) is refused. Runs
    /// in flight go on; their results are still recorded. [`status`](Self::status) and
    /// [`reset_flow`](Self::reset_flow) keep working.
    pub fn stop(&self) {
        lock(&self.shared.state).stopped = true;
        self.shared.wake.nudge();
    }

    /// Waits until the scheduler has stopped and no run is in flight.
    pub async fn wait(&self) {
        loop {
            let listener = self.shared.done.listen();
            {
                let state = lock(&self.shared.state);
                if state.loop_done && state.in_flight == 0 {
                    return;
                }
            }
            listener.await;
        }
    }
}
