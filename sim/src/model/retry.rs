//! The retry machine (R1–R6, B6, G2, G4, G7, G11, G12) as a reference model that predicts
//! every action exactly: the fuzz target `retry` and the retry scenario family both hold the
//! core's `Retry` to it after every input, and the delivery model embeds it.
//!
//! It restates the rules, in their order (B6 and R1–R6 in `docs/RULES.md`): a failure's class first
//! (`Fatal` and `DoNotRetry` stop, `Canceled` stops without counting), then the attempt limit (a
//! failure of the last allowed attempt exhausts, hinted or not), then the hint (never shortened:
//! past `max_hint` or past the total budget it defers the operation to the hinted instant) or else
//! the schedule (a delay past the total budget is out of time). Every failure but a cancel counts
//! into the streak; after a hinted delay under `restart_after_hint` the schedule's place starts
//! over while the streak goes on. Every input that arrives while actions of an earlier one wait to
//! be drained is refused (`Undrained`, after the validity errors) and a timeout then does nothing.
//!
//! The model draws no jitter: a scheduled delay is the one the machine drew, held to the
//! schedule's bounds ([`adopt`](crate::model::backoff::adopt)).

use core::time::Duration;

use persevere::{
    Failure, FailureKind, Hint, Instant, LastFailure, Outcome, OutcomeKind, RetryAction, RetryError, RetryPolicy,
    RetryStatus, Stats,
};

use crate::model::backoff::{Place, nanos};

/// The instant `machine` waits until before its next attempt, if it is waiting: what a
/// runner passes to the model's [`RetryModel::failure`] and [`RetryModel::timeout`].
pub(crate) fn waits<E>(machine: &persevere::Retry<E>) -> Option<Instant> {
    match machine.status() {
        RetryStatus::Sleeping { until, .. } => Some(until),
        _ => None,
    }
}

/// Where the operation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Running { deadline: Option<Instant> },
    Sleeping { until: Instant },
    Finished(OutcomeKind),
}

/// The hinted delay of a failure at `now`, in nanoseconds (`None`: not hinted): an `At` in the
/// past is "now".
pub(crate) fn hinted_ns(kind: FailureKind, now: Instant) -> Option<u64> {
    match kind {
        FailureKind::Hinted(Hint::After(d)) => Some(nanos(d)),
        FailureKind::Hinted(Hint::At(at)) => Some(nanos(at.saturating_duration_since(now))),
        _ => None,
    }
}

/// What a [`Retry`] must be doing, restated from R1–R6 and B6.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RetryModel<E> {
    pub(crate) phase: Phase,
    pub(crate) attempt: u64,
    /// The streak: consecutive failures counted (every failure but a cancel).
    pub(crate) failures: u32,
    /// Where the schedule stands: it starts over after a success, and after a hinted delay
    /// under `restart_after_hint` (the streak goes on).
    pub(crate) schedule: Place,
    pub(crate) first_start: Instant,
    pub(crate) last_now: Instant,
    pub(crate) slept_ns: u64,
    pub(crate) last_failure: Option<LastFailure<E>>,
    /// The hinted instant of a `Deferred` outcome.
    pub(crate) retry_at: Option<Instant>,
    /// Actions of an earlier input wait to be drained (set by a runner that holds them): every
    /// input is refused with `Undrained` after its validity errors, a timeout does nothing.
    pub(crate) undrained: bool,
}

impl<E: Clone> RetryModel<E> {
    pub(crate) fn new() -> Self {
        RetryModel {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            schedule: Place::default(),
            first_start: Instant::ZERO,
            last_now: Instant::ZERO,
            slept_ns: 0,
            last_failure: None,
            retry_at: None,
            undrained: false,
        }
    }

    /// R5: attempts, time asleep, and the elapsed time, always known in the core.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            attempts: self.attempt,
            slept: Duration::from_nanos(self.slept_ns),
            elapsed: Some(self.last_now.saturating_duration_since(self.first_start)),
        }
    }

    pub(crate) fn status(&self) -> RetryStatus {
        match self.phase {
            Phase::Idle => RetryStatus::Idle,
            Phase::Running { deadline } => RetryStatus::Running { attempt: self.attempt, deadline },
            Phase::Sleeping { until } => RetryStatus::Sleeping { next_attempt: self.attempt.saturating_add(1), until },
            Phase::Finished(kind) => RetryStatus::Finished(kind),
        }
    }

    fn check_running(&self, attempt: u64) -> Result<(), RetryError> {
        match self.phase {
            Phase::Running { .. } if attempt != self.attempt => {
                Err(RetryError::StaleAttempt { running: self.attempt, got: attempt })
            }
            Phase::Running { .. } if self.undrained => Err(RetryError::Undrained),
            Phase::Running { .. } => Ok(()),
            Phase::Sleeping { .. } => Err(RetryError::NoAttemptRunning),
            Phase::Idle => Err(RetryError::NotStarted),
            Phase::Finished(kind) => Err(RetryError::Finished(kind)),
        }
    }

    fn begin(&mut self, policy: &RetryPolicy, now: Instant) -> RetryAction<E> {
        self.attempt = self.attempt.saturating_add(1);
        let deadline = policy.attempt_timeout().map(|t| now.saturating_add(t)).filter(|d| *d != Instant::MAX);
        self.phase = Phase::Running { deadline };
        RetryAction::Start { attempt: self.attempt, deadline }
    }

    fn finish(&mut self, kind: OutcomeKind) -> RetryAction<E> {
        self.phase = Phase::Finished(kind);
        let last = self.last_failure.take();
        let outcome = match kind {
            OutcomeKind::Succeeded => Outcome::Succeeded,
            OutcomeKind::Canceled => Outcome::Canceled { last_failure: last },
            kind => {
                let last_failure = last.expect("every other outcome follows a failure");
                match kind {
                    OutcomeKind::Exhausted => Outcome::Exhausted { last_failure },
                    OutcomeKind::Fatal => Outcome::Fatal { failure: last_failure },
                    OutcomeKind::OutOfTime => Outcome::OutOfTime { last_failure },
                    OutcomeKind::Deferred => Outcome::Deferred {
                        retry_at: self.retry_at.expect("a deferred outcome has its hinted instant"),
                        last_failure,
                    },
                    _ => Outcome::Rejected { last_failure },
                }
            }
        };
        RetryAction::Finish { outcome, stats: self.stats() }
    }

    pub(crate) fn start(&mut self, policy: &RetryPolicy, now: Instant) -> Result<Vec<RetryAction<E>>, RetryError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            _ => return Err(RetryError::AlreadyStarted),
        }
        let now = self.last_now.later(now);
        self.first_start = now;
        self.last_now = now;
        Ok(vec![self.begin(policy, now)])
    }

    pub(crate) fn success(&mut self, now: Instant, attempt: u64) -> Result<Vec<RetryAction<E>>, RetryError> {
        self.check_running(attempt)?;
        self.last_now = self.last_now.later(now);
        // R4: a success ends the streak.
        self.failures = 0;
        self.schedule.start_over();
        self.last_failure = None;
        Ok(vec![self.finish(OutcomeKind::Succeeded)])
    }

    /// A failure of `attempt`; `observed` is the instant the machine under test waits until
    /// after the same failure (`None`: it does not wait), from which the model adopts the
    /// jittered delay it does not draw itself ([`adopt`]).
    pub(crate) fn failure(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
        observed: Option<Instant>,
    ) -> Result<Vec<RetryAction<E>>, RetryError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(self.decide(policy, now, failure.kind, Some(failure.error), false, observed))
    }

    /// `observed`: where the machine waits after the same timeout, if it does (see
    /// [`failure`](Self::failure)).
    pub(crate) fn timeout(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        observed: Option<Instant>,
    ) -> Vec<RetryAction<E>> {
        let now = self.last_now.later(now);
        match self.phase {
            _ if self.undrained => Vec::new(),
            Phase::Running { deadline: Some(deadline) } if deadline <= now => {
                self.last_now = now;
                self.decide(policy, now, FailureKind::Timeout, None, true, observed)
            }
            Phase::Sleeping { until } if until <= now => {
                self.slept_ns = self.slept_ns.saturating_add(nanos(now.saturating_duration_since(self.last_now)));
                self.last_now = now;
                // R3: no attempt starts past the total budget, also when the wake-up comes late.
                let budget_end = policy.total().map_or(Instant::MAX, |t| self.first_start.saturating_add(t));
                if now > budget_end { vec![self.finish(OutcomeKind::OutOfTime)] } else { vec![self.begin(policy, now)] }
            }
            _ => Vec::new(),
        }
    }

    pub(crate) fn cancel(&mut self, now: Instant) -> Result<Vec<RetryAction<E>>, RetryError> {
        let mut actions = match self.phase {
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            _ if self.undrained => return Err(RetryError::Undrained),
            Phase::Running { .. } => vec![RetryAction::Abandon { attempt: self.attempt }],
            Phase::Idle => {
                // Canceled before it started: no attempt, and no time taken.
                self.first_start = self.last_now.later(now);
                Vec::new()
            }
            Phase::Sleeping { .. } => Vec::new(),
        };
        self.last_now = self.last_now.later(now);
        actions.push(self.finish(OutcomeKind::Canceled));
        Ok(actions)
    }

    pub(crate) fn rejected(&mut self, now: Instant) -> Result<Vec<RetryAction<E>>, RetryError> {
        match self.phase {
            Phase::Running { .. } => return Err(RetryError::NothingToReject),
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Idle => return Err(RetryError::NotStarted),
            Phase::Sleeping { .. } if self.undrained => return Err(RetryError::Undrained),
            Phase::Sleeping { .. } => {}
        }
        self.last_now = self.last_now.later(now);
        Ok(vec![self.finish(OutcomeKind::Rejected)])
    }

    /// The failure decision, in the order of the rules: class, limit, hint or schedule, budget.
    fn decide(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        abandon: bool,
        observed: Option<Instant>,
    ) -> Vec<RetryAction<E>> {
        let mut actions = Vec::new();
        if abandon {
            actions.push(RetryAction::Abandon { attempt: self.attempt });
        }
        self.last_failure = Some(LastFailure { class: kind.class(), error });
        let limit = policy.max_attempts().map_or(u64::MAX, u64::from);
        let budget_end = policy.total().map_or(Instant::MAX, |t| self.first_start.saturating_add(t));
        let verdict = match kind {
            // G4: never retried; a cancel is not counted into the streak.
            FailureKind::Canceled => Err(OutcomeKind::Canceled),
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => {
                self.failures = self.failures.saturating_add(1);
                Err(OutcomeKind::Fatal)
            }
            // R3: the limit before the hint.
            _ if self.attempt >= limit => {
                self.failures = self.failures.saturating_add(1);
                Err(OutcomeKind::Exhausted)
            }
            _ => {
                self.failures = self.failures.saturating_add(1);
                match hinted_ns(kind, now) {
                    // B6: never shortened; past max_hint or the budget, deferred to the hint.
                    Some(hinted) => {
                        let (until, defers) = crate::model::hint::hinted(
                            now,
                            Duration::from_nanos(hinted),
                            policy.max_hint(),
                            budget_end,
                        );
                        self.schedule.hinted(policy.restarts_after_hint(), hinted);
                        if defers {
                            self.retry_at = Some(until);
                            Err(OutcomeKind::Deferred)
                        } else {
                            Ok(until)
                        }
                    }
                    None => {
                        let backoff = crate::retry::schedule_of(policy, kind.class());
                        let ends = |d: u64| now.saturating_add(Duration::from_nanos(d)) > budget_end;
                        let delay = self.schedule.scheduled(backoff, observed, now, ends);
                        let until = now.saturating_add(Duration::from_nanos(delay));
                        if until > budget_end { Err(OutcomeKind::OutOfTime) } else { Ok(until) }
                    }
                }
            }
        };
        match verdict {
            Ok(until) => {
                self.phase = Phase::Sleeping { until };
                actions.push(RetryAction::Sleep {
                    next_attempt: self.attempt.saturating_add(1),
                    delay: until.saturating_duration_since(self.last_now),
                    until,
                });
            }
            Err(kind) => actions.push(self.finish(kind)),
        }
        actions
    }
}
