//! A supervised task: its settings resolved (S1); its event stream (S1, S3, S5, S6, B6),
//! checked without a model of the machine ([`Grammar`]: the core's `Supervision` in the fuzz
//! target and the supervision family, and the driver's real `Supervisor` in the `supervisor`
//! family, are all held to this one grammar); and the machine's every event predicted exactly
//! (`SupervisionModel`, for the fuzz target and the supervision family alike).
//!
//! The model restates the one failure decision (revised by issue 12): a failure's class first
//! (`Fatal` and `DoNotRetry` finish `Fatal`, `Canceled` finishes `Canceled` without counting),
//! then the limit (`once`, or a streak past `max_retries`, finishes `Failed` / `TimedOut`, a
//! hinted failure too), then the hint (never shortened; past `max_hint` the task finishes
//! `Deferred` at the hinted instant) or else the backoff, whose delay is the one the machine
//! drew, held to the schedule's bounds
//! ([`adopt`](super::backoff::adopt)). Every decided failure counts into the
//! streak; after a hinted delay under `restart_after_hint` the backoff's place starts over
//! while the streak goes on. Between an input and the drain of its events every input is
//! refused (`Undrained`, after the validity errors) and a timeout does nothing.

use core::time::Duration;

use persevere::{
    Backoff, Failure, FailureClass, FailureKind, Hint, Instant, LastFailure, Restart, Setting, Supervision,
    SupervisionAction, SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder, SupervisionStatus, TaskDefaults,
    TaskOutcome, TaskOutcomeKind,
};

use super::Judge;
use super::backoff::{Place, nanos};

/// S1: a task's settings resolved against the defaults: an explicit setting wins, `Inherit`
/// takes the default, `Off` switches it off (no restart, no timeout, no retry limit, no
/// spacing, a zero backoff, any hint honoured, no restart after a hint).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    /// The restart policy.
    pub restart: Restart,
    /// The attempt timeout; one too long to fit in `u64` nanoseconds is none.
    pub attempt_timeout: Option<Duration>,
    /// The retry limit.
    pub max_retries: Option<u32>,
    /// The least time between attempt starts, saturated to `u64` nanoseconds.
    pub min_spacing: Duration,
    /// The backoff.
    pub backoff: Backoff,
    /// The longest hint waited; one too long to fit in `u64` nanoseconds is any.
    pub max_hint: Duration,
    /// Whether the schedule starts over after a hinted delay.
    pub restart_after_hint: bool,
}

fn setting<T>(setting: Setting<T>, default: T, off: T) -> T {
    match setting {
        Setting::Inherit => default,
        Setting::Off => off,
        Setting::Set(value) => value,
    }
}

fn optional<T>(setting: Setting<T>, default: Option<T>) -> Option<T> {
    match setting {
        Setting::Inherit => default,
        Setting::Off => None,
        Setting::Set(value) => Some(value),
    }
}

/// A span saturated to `u64` nanoseconds.
fn saturated(span: Duration) -> Duration {
    Duration::from_nanos(u64::try_from(span.as_nanos()).unwrap_or(u64::MAX))
}

impl Resolved {
    /// `builder` resolved against `defaults` (S1).
    pub fn new(builder: &SupervisionPolicyBuilder, defaults: &TaskDefaults) -> Self {
        let fits = |span: &Duration| u64::try_from(span.as_nanos()).is_ok_and(|n| n < u64::MAX);
        let max_hint = setting(builder.max_hint, defaults.max_hint, Duration::MAX);
        Resolved {
            restart: setting(builder.restart, defaults.restart, Restart::Once),
            attempt_timeout: optional(builder.attempt_timeout, defaults.attempt_timeout).filter(fits),
            max_retries: optional(builder.max_retries, defaults.max_retries),
            min_spacing: saturated(setting(builder.min_spacing, defaults.min_spacing, Duration::ZERO)),
            backoff: match builder.backoff {
                Setting::Inherit => defaults.backoff,
                Setting::Off => Backoff::constant(Duration::ZERO).build().expect("a constant zero backoff is valid"),
                Setting::Set(backoff) => backoff,
            },
            max_hint: if fits(&max_hint) { max_hint } else { Duration::MAX },
            restart_after_hint: setting(builder.restart_after_hint, defaults.restart_after_hint, false),
        }
    }

    /// S1: `policy` has exactly these settings.
    pub fn check<J: Judge>(&self, judge: &mut J, policy: &SupervisionPolicy) -> Result<(), J::Error> {
        let built = Resolved {
            restart: policy.restart(),
            attempt_timeout: policy.attempt_timeout(),
            max_retries: policy.max_retries(),
            min_spacing: policy.min_spacing(),
            backoff: *policy.backoff(),
            max_hint: policy.max_hint(),
            restart_after_hint: policy.restarts_after_hint(),
        };
        judge.check("S1", built == *self, || format!("the policy has {built:?}, resolved {self:?}"))
    }
}

/// S5, S6 (and S1, S3, B6 where the stream shows them): a task's event stream, checked
/// without a model of the machine.
#[derive(Clone, Debug, Default)]
pub struct Grammar {
    started: u64,
    open: Option<u64>,
    ended: Option<u64>,
    scheduled: Option<u64>,
    finished: bool,
    last_start: Option<Instant>,
    streak: u64,
}

impl Grammar {
    /// Checks `event`, told at `now` by a task supervised under `policy`.
    pub fn event<E, J: Judge>(
        &mut self,
        judge: &mut J,
        policy: &SupervisionPolicy,
        now: Instant,
        event: &SupervisionAction<E>,
    ) -> Result<(), J::Error>
    where
        E: core::fmt::Debug,
    {
        let rule = if matches!(event, SupervisionAction::TaskFinished { .. }) { "G11" } else { "S6" };
        judge.check(rule, !self.finished, || format!("{event:?} after TaskFinished"))?;
        match *event {
            SupervisionAction::AttemptStarting { attempt, .. } => {
                judge.check("S6", self.open.is_none(), || {
                    format!("attempt {attempt} starts while {:?} has not ended", self.open)
                })?;
                judge.check("S6", attempt == self.started + 1, || {
                    format!("attempt {attempt} starts after attempt {}", self.started)
                })?;
                if attempt > 1 {
                    judge.check("S6", self.scheduled == Some(attempt), || {
                        format!("attempt {attempt} starts without BackoffScheduled")
                    })?;
                }
                if let Some(previous) = self.last_start {
                    let earliest = previous.saturating_add(policy.min_spacing());
                    judge.check("S5", now >= earliest, || {
                        format!("attempt {attempt} starts at {now:?}, before {earliest:?} (min_spacing)")
                    })?;
                }
                self.last_start = Some(now);
                self.started = attempt;
                self.open = Some(attempt);
                self.ended = None;
                self.scheduled = None;
            }
            SupervisionAction::AttemptSucceeded { attempt }
            | SupervisionAction::AttemptFailed { attempt, .. }
            | SupervisionAction::AttemptTimedOut { attempt }
            | SupervisionAction::AttemptCanceled { attempt } => {
                judge.check("S6", self.open == Some(attempt), || {
                    format!("{event:?} but the open attempt is {:?}", self.open)
                })?;
                self.open = None;
                self.ended = Some(attempt);
                match event {
                    SupervisionAction::AttemptSucceeded { .. } => self.streak = 0,
                    // The final classes (G4) end a streak's count; every other failure extends it.
                    SupervisionAction::AttemptFailed { class, .. }
                        if !matches!(
                            class,
                            FailureClass::Fatal | FailureClass::DoNotRetry | FailureClass::Canceled
                        ) =>
                    {
                        self.streak += 1
                    }
                    SupervisionAction::AttemptTimedOut { .. } => self.streak += 1,
                    _ => {}
                }
            }
            SupervisionAction::BackoffScheduled { next_attempt, until, .. } => {
                judge.check("S6", self.open.is_none(), || {
                    format!("BackoffScheduled while attempt {:?} runs", self.open)
                })?;
                judge.check("S6", self.ended == Some(self.started), || {
                    format!("BackoffScheduled before attempt {} ended", self.started)
                })?;
                judge.check("S6", self.scheduled.is_none(), || "a second BackoffScheduled".to_string())?;
                judge.check("S6", next_attempt == self.started + 1, || {
                    format!("BackoffScheduled for {next_attempt} after {}", self.started)
                })?;
                if let Some(max) = policy.max_retries() {
                    judge.check("S3", self.streak <= u64::from(max), || {
                        format!("a retry after {} failures in a row (max_retries {max})", self.streak)
                    })?;
                }
                judge.check("S1", policy.restart() != Restart::Once, || {
                    format!("a `once` task schedules attempt {next_attempt}")
                })?;
                if let Some(start) = self.last_start {
                    let earliest = start.saturating_add(policy.min_spacing());
                    judge.check("S5", until >= earliest, || {
                        format!("attempt {next_attempt} scheduled at {until:?}, before {earliest:?}")
                    })?;
                }
                self.scheduled = Some(next_attempt);
            }
            SupervisionAction::TaskFinished { attempts, ref outcome } => {
                judge
                    .check("S6", self.open.is_none(), || format!("TaskFinished while attempt {:?} runs", self.open))?;
                if let TaskOutcome::Deferred { retry_at, last_failure } = outcome {
                    // B6: only a hint past max_hint defers, and the limit is judged first.
                    judge.check("B6", last_failure.class == FailureClass::RetryAfter, || {
                        format!("deferred by a {:?} failure", last_failure.class)
                    })?;
                    // (A hint cut by the end of representable time cannot be measured.)
                    let hinted = retry_at.saturating_duration_since(now);
                    judge.check("B6", hinted > policy.max_hint() || *retry_at == Instant::MAX, || {
                        format!("deferred by a hint of {hinted:?} within max_hint")
                    })?;
                    let within = policy.restart() != Restart::Once
                        && policy.max_retries().is_none_or(|max| self.streak <= u64::from(max));
                    judge.check("S3", within, || {
                        format!("deferred after {} failures in a row, past the limit", self.streak)
                    })?;
                }
                judge.check("S6", attempts == self.started, || {
                    format!("TaskFinished counts {attempts} attempts, {} started", self.started)
                })?;
                self.finished = true;
            }
        }
        Ok(())
    }

    /// Whether the task's `TaskFinished` was told.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

/// The instant `machine` waits until before its next restart, if it is waiting: what a runner
/// passes to [`SupervisionModel::failure`] and [`SupervisionModel::abandoned`].
pub(crate) fn waits<E>(machine: &Supervision<E>) -> Option<Instant> {
    match machine.status() {
        SupervisionStatus::Waiting { until, .. } => Some(until),
        _ => None,
    }
}

/// Where a supervised task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Running { deadline: Option<Instant> },
    Abandoning,
    Waiting { until: Instant },
    Finished(TaskOutcomeKind),
}

/// What a [`Supervision`] must be doing, restated from S1–S6 and B6.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SupervisionModel<E> {
    pub(crate) phase: Phase,
    pub(crate) attempt: u64,
    /// The streak: failures since the last success (every one but a cancel; a timed-out
    /// attempt counts once, whether its drop was clean or panicked, S4).
    pub(crate) failures: u32,
    /// Where the backoff stands.
    pub(crate) schedule: Place,
    pub(crate) last_start: Instant,
    pub(crate) last_now: Instant,
    pub(crate) last_failure: Option<LastFailure<E>>,
    /// The hinted instant of a `Deferred` outcome.
    pub(crate) retry_at: Option<Instant>,
    /// Events of an earlier input wait to be drained (the runner holds them).
    pub(crate) undrained: bool,
}

impl<E: Clone + Default> SupervisionModel<E> {
    pub(crate) fn new() -> Self {
        SupervisionModel {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            schedule: Place::default(),
            last_start: Instant::ZERO,
            last_now: Instant::ZERO,
            last_failure: None,
            retry_at: None,
            undrained: false,
        }
    }

    pub(crate) fn status(&self) -> SupervisionStatus {
        match self.phase {
            Phase::Idle => SupervisionStatus::Idle,
            Phase::Running { deadline } => SupervisionStatus::Running { attempt: self.attempt, deadline },
            Phase::Abandoning => SupervisionStatus::Abandoning { attempt: self.attempt },
            Phase::Waiting { until } => {
                SupervisionStatus::Waiting { next_attempt: self.attempt.saturating_add(1), until }
            }
            Phase::Finished(kind) => SupervisionStatus::Finished(kind),
        }
    }

    fn check_running(&self, attempt: u64) -> Result<(), SupervisionError> {
        match self.phase {
            Phase::Running { .. } if attempt != self.attempt => {
                Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt })
            }
            Phase::Running { .. } if self.undrained => Err(SupervisionError::Undrained),
            Phase::Running { .. } => Ok(()),
            Phase::Abandoning | Phase::Waiting { .. } => Err(SupervisionError::NoAttemptRunning),
            Phase::Idle => Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => Err(SupervisionError::Finished(kind)),
        }
    }

    fn begin(&mut self, policy: &SupervisionPolicy, now: Instant) -> SupervisionAction<E> {
        self.attempt = self.attempt.saturating_add(1);
        self.last_start = now;
        let deadline = policy.attempt_timeout().map(|t| now.saturating_add(t)).filter(|d| *d != Instant::MAX);
        self.phase = Phase::Running { deadline };
        SupervisionAction::AttemptStarting { attempt: self.attempt, deadline }
    }

    fn finish(&mut self, kind: TaskOutcomeKind) -> SupervisionAction<E> {
        self.phase = Phase::Finished(kind);
        let last = self.last_failure.take();
        let outcome = match kind {
            TaskOutcomeKind::Completed => TaskOutcome::Completed,
            TaskOutcomeKind::TimedOut => TaskOutcome::TimedOut,
            TaskOutcomeKind::Canceled => TaskOutcome::Canceled { last_failure: last },
            TaskOutcomeKind::Panicked => {
                TaskOutcome::Panicked { error: last.and_then(|l| l.error).unwrap_or_default() }
            }
            TaskOutcomeKind::Fatal => TaskOutcome::Fatal { failure: last.expect("a fatal failure is stored") },
            TaskOutcomeKind::Deferred => TaskOutcome::Deferred {
                retry_at: self.retry_at.expect("a deferred task has its hinted instant"),
                last_failure: last.expect("a hinted failure is stored"),
            },
            _ => TaskOutcome::Failed { last_failure: last.expect("a failure is stored") },
        };
        SupervisionAction::TaskFinished { outcome, attempts: self.attempt }
    }

    fn wait(&mut self, policy: &SupervisionPolicy, now: Instant, delay_ns: u64) -> SupervisionAction<E> {
        let until = now
            .saturating_add(Duration::from_nanos(delay_ns))
            .later(self.last_start.saturating_add(policy.min_spacing()));
        self.phase = Phase::Waiting { until };
        SupervisionAction::BackoffScheduled {
            next_attempt: self.attempt.saturating_add(1),
            delay: until.saturating_duration_since(self.last_now),
            until,
        }
    }

    /// A retryable failure (its hinted delay, if any): the limit, then the hint or the backoff.
    fn retry_or_finish(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        hinted: Option<u64>,
        not_retried: TaskOutcomeKind,
        observed: Option<Instant>,
    ) -> SupervisionAction<E> {
        self.failures = self.failures.saturating_add(1);
        let limit_reached = policy.max_retries().is_some_and(|max| self.failures > max);
        if policy.restart() == Restart::Once || limit_reached {
            return self.finish(not_retried);
        }
        match hinted {
            Some(hinted) if hinted > nanos(policy.max_hint()) => {
                self.retry_at = Some(now.saturating_add(Duration::from_nanos(hinted)));
                self.finish(TaskOutcomeKind::Deferred)
            }
            Some(hinted) => {
                self.schedule.hinted(policy.restarts_after_hint(), hinted);
                self.wait(policy, now, hinted)
            }
            None => {
                let delay = self.schedule.scheduled(policy.backoff(), observed, now, |_| false);
                self.wait(policy, now, delay)
            }
        }
    }

    pub(crate) fn start(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
    ) -> Result<Vec<SupervisionAction<E>>, SupervisionError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            _ => return Err(SupervisionError::AlreadyStarted),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(vec![self.begin(policy, now)])
    }

    pub(crate) fn success(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
    ) -> Result<Vec<SupervisionAction<E>>, SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        self.failures = 0;
        self.schedule.start_over();
        self.last_failure = None;
        let ended = SupervisionAction::AttemptSucceeded { attempt };
        Ok(vec![
            ended,
            match policy.restart() {
                Restart::Periodic { interval } => self.wait(policy, now, nanos(interval)),
                _ => self.finish(TaskOutcomeKind::Completed),
            },
        ])
    }

    pub(crate) fn failure(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
        observed: Option<Instant>,
    ) -> Result<Vec<SupervisionAction<E>>, SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        let class = failure.kind.class();
        self.last_failure = Some(LastFailure { class, error: Some(failure.error) });
        // A cancel reported by the task ends its attempt as canceled (S6).
        let ended = match failure.kind {
            FailureKind::Canceled => SupervisionAction::AttemptCanceled { attempt },
            _ => SupervisionAction::AttemptFailed { attempt, class },
        };
        let next = match failure.kind {
            FailureKind::Canceled => self.finish(TaskOutcomeKind::Canceled),
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => {
                self.failures = self.failures.saturating_add(1);
                self.finish(TaskOutcomeKind::Fatal)
            }
            kind => {
                let hinted = match kind {
                    FailureKind::Hinted(Hint::After(d)) => Some(nanos(d)),
                    FailureKind::Hinted(Hint::At(at)) => Some(nanos(at.saturating_duration_since(now))),
                    _ => None,
                };
                self.retry_or_finish(policy, now, hinted, TaskOutcomeKind::Failed, observed)
            }
        };
        Ok(vec![ended, next])
    }

    pub(crate) fn abandoned(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        panic: Option<E>,
        observed: Option<Instant>,
    ) -> Result<Vec<SupervisionAction<E>>, SupervisionError> {
        match self.phase {
            Phase::Abandoning if attempt != self.attempt => {
                return Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt });
            }
            Phase::Abandoning if self.undrained => return Err(SupervisionError::Undrained),
            Phase::Abandoning => {}
            Phase::Idle => return Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            Phase::Running { .. } | Phase::Waiting { .. } => return Err(SupervisionError::NothingAbandoned),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(vec![match panic {
            Some(error) => {
                // The timed-out attempt failed: it counts, and its panicking drop ends the task.
                self.last_failure = Some(LastFailure { class: FailureClass::Panicked, error: Some(error) });
                self.failures = self.failures.saturating_add(1);
                self.finish(TaskOutcomeKind::Panicked)
            }
            None => self.retry_or_finish(policy, now, None, TaskOutcomeKind::TimedOut, observed),
        }])
    }

    pub(crate) fn timeout(&mut self, policy: &SupervisionPolicy, now: Instant) -> Vec<SupervisionAction<E>> {
        let now = self.last_now.later(now);
        match self.phase {
            _ if self.undrained => Vec::new(),
            Phase::Running { deadline: Some(deadline) } if deadline <= now => {
                self.last_now = now;
                self.phase = Phase::Abandoning;
                self.last_failure = Some(LastFailure { class: FailureClass::Timeout, error: None });
                vec![SupervisionAction::AttemptTimedOut { attempt: self.attempt }]
            }
            Phase::Waiting { until } if until <= now => {
                self.last_now = now;
                vec![self.begin(policy, now)]
            }
            _ => Vec::new(),
        }
    }

    pub(crate) fn cancel(&mut self, now: Instant) -> Result<Vec<SupervisionAction<E>>, SupervisionError> {
        let mut events = match self.phase {
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            _ if self.undrained => return Err(SupervisionError::Undrained),
            Phase::Running { .. } => vec![SupervisionAction::AttemptCanceled { attempt: self.attempt }],
            _ => Vec::new(),
        };
        self.last_now = self.last_now.later(now);
        events.push(self.finish(TaskOutcomeKind::Canceled));
        Ok(events)
    }
}
