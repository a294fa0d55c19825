//! A supervised task's event stream (S1, S3, S5, S6, B6), checked without a model of the
//! machine: the core's `Supervision` in the fuzz target, and the driver's real `Supervisor` in
//! the simulator's `supervisor` family, are both held to this one grammar.

use persevere::{FailureClass, Instant, Restart, SupervisionAction, SupervisionPolicy, TaskOutcome};

use super::Judge;

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
                    SupervisionAction::AttemptFailed { class, .. } if class.is_retryable() => self.streak += 1,
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
