//! A supervised task's event stream (S1, S3, S5, S6, B6), checked without a model of the
//! machine: the core's `Supervision` in the fuzz target, and the driver's real `Supervisor` in
//! the simulator's `supervisor` family, are both held to this one grammar.

use core::time::Duration;

use persevere::{
    Backoff, FailureClass, Instant, Restart, Setting, SupervisionAction, SupervisionPolicy, SupervisionPolicyBuilder,
    TaskDefaults, TaskOutcome,
};

use super::Judge;

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
                    // DESIGN's final classes (G4) end a streak's count; every other failure extends it.
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
