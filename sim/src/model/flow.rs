//! A scheduled flow, written once for the `flow` family and the flow fuzz target: when an
//! every-flow is due (F5, F10), why a cron tick is skipped (F6), and the flow's every
//! transition (`FlowModel`: F1–F10, B6).

use core::time::Duration;

use persevere::{
    Failure, FailureKind, Flow, FlowAction, FlowError, FlowPolicy, FlowStatus, FlowStatusKind, Hint, Instant,
    SkipReason, TripReason,
};

use super::backoff::{Place, nanos};

/// F5, F10: an every-flow is due at `max(run_end + interval, next_eligible)` (`interval_due` is
/// the first); never while a run is in flight or the flow is tripped.
pub fn due(running_or_tripped: bool, interval_due: Instant, next_eligible: Option<Instant>) -> Option<Instant> {
    if running_or_tripped { None } else { Some(next_eligible.map_or(interval_due, |until| until.later(interval_due))) }
}

/// F6: why a cron tick at `tick` is skipped, if it is: a run is in flight, the flow is
/// tripped, or the tick falls before the backoff window's end. Skipped ticks are never replayed.
pub fn tick_skip(running: bool, tripped: bool, next_eligible: Option<Instant>, tick: Instant) -> Option<SkipReason> {
    match next_eligible {
        _ if running => Some(SkipReason::Running),
        _ if tripped => Some(SkipReason::Tripped),
        Some(until) if tick < until => Some(SkipReason::InBackoff { until }),
        _ => None,
    }
}

/// The end of `flow`'s backoff window, if it is in one: what a runner passes to
/// [`FlowModel::failure`].
pub(crate) fn waits<E>(flow: &Flow<E>) -> Option<Instant> {
    match flow.status() {
        FlowStatus::Backoff { until, .. } => Some(until),
        _ => None,
    }
}

/// Where a flow stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase<E> {
    Idle,
    Running,
    Completed,
    Backoff { until: Instant, last_error: E },
    Tripped { last_error: E, reason: TripReason },
}

/// What a [`Flow`] must be, restated from F1–F10 and B6.
#[derive(Clone, Debug)]
pub(crate) struct FlowModel<E> {
    pub(crate) phase: Phase<E>,
    pub(crate) every: Option<Duration>,
    pub(crate) streak: u32,
    /// Where the schedule stands: it starts with a streak, and over after a hinted window
    /// with `restart_after_hint` (the streak itself keeps counting).
    pub(crate) schedule: Place,
    pub(crate) next_eligible: Option<Instant>,
    pub(crate) interval_due: Instant,
    pub(crate) run_count: u64,
    pub(crate) last_now: Instant,
    /// The action made and not drained yet (the drain rule: at most one).
    pub(crate) pending: Option<FlowAction>,
}

impl<E: Copy + PartialEq> FlowModel<E> {
    /// A flow created at `created`: an every-flow (first due then) or a cron flow.
    pub(crate) fn new(created: Instant, every: Option<Duration>) -> Self {
        FlowModel {
            phase: Phase::Idle,
            every,
            streak: 0,
            schedule: Place::default(),
            next_eligible: None,
            interval_due: created,
            run_count: 0,
            last_now: created,
            pending: None,
        }
    }

    pub(crate) fn status(&self) -> FlowStatus<E> {
        match self.phase {
            Phase::Idle => FlowStatus::Idle,
            Phase::Running => FlowStatus::Running,
            Phase::Completed => FlowStatus::Completed,
            Phase::Backoff { until, last_error } => FlowStatus::Backoff { until, streak: self.streak, last_error },
            Phase::Tripped { last_error, reason } => FlowStatus::Tripped { streak: self.streak, last_error, reason },
        }
    }

    pub(crate) fn kind(&self) -> FlowStatusKind {
        self.status().kind()
    }

    /// F5: an every-flow is due at `max(run_end + interval, next_eligible)`; never while it runs
    /// or is tripped (F10).
    pub(crate) fn due(&self) -> Option<Instant> {
        let busy = matches!(self.phase, Phase::Running | Phase::Tripped { .. });
        self.every.and_then(|_| due(busy, self.interval_due, self.next_eligible))
    }

    /// The drain rule: an input while an action waits is refused.
    fn drained(&self) -> Result<(), FlowError> {
        if self.pending.is_some() { Err(FlowError::Undrained) } else { Ok(()) }
    }

    fn dispatch(&mut self) {
        self.run_count = self.run_count.saturating_add(1);
        self.phase = Phase::Running;
        self.pending = Some(FlowAction::Dispatch { run: self.run_count });
    }

    /// A run's result: only while a run is in flight (a validity error first), and drained.
    fn end_run(&mut self, now: Instant) -> Result<Instant, FlowError> {
        if self.phase != Phase::Running {
            return Err(FlowError::NotRunning(self.kind()));
        }
        self.drained()?;
        let now = self.last_now.later(now);
        self.last_now = now;
        if let Some(interval) = self.every {
            self.interval_due = now.saturating_add(Duration::from_nanos(nanos(interval)));
        }
        Ok(now)
    }

    /// Dispatches a due every-flow; nothing at all while an action waits to be drained.
    pub(crate) fn timeout(&mut self, now: Instant) {
        let now = self.last_now.later(now);
        if self.pending.is_none() && self.due().is_some_and(|due| due <= now) {
            self.last_now = now;
            self.dispatch();
        }
    }

    pub(crate) fn tick(&mut self, now: Instant, tick: Instant) -> Result<(), FlowError> {
        if self.every.is_some() {
            return Err(FlowError::NotCron);
        }
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let reason = tick_skip(
            self.phase == Phase::Running,
            matches!(self.phase, Phase::Tripped { .. }),
            self.next_eligible,
            tick,
        );
        match reason {
            Some(reason) => self.pending = Some(FlowAction::TickSkipped { tick, reason }),
            None => self.dispatch(),
        }
        Ok(())
    }

    pub(crate) fn trigger(&mut self, now: Instant) -> Result<(), FlowError> {
        match self.phase {
            Phase::Tripped { reason, .. } => return Err(FlowError::Tripped { streak: self.streak, reason }),
            Phase::Running => return Err(FlowError::Running),
            _ => self.drained()?,
        }
        self.last_now = self.last_now.later(now);
        self.dispatch();
        Ok(())
    }

    pub(crate) fn success(&mut self, now: Instant) -> Result<(), FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Completed;
        self.clear_streak();
        Ok(())
    }

    /// F3 from the failure's class, in this order: `Canceled` is F4; `Fatal` and `DoNotRetry`
    /// trip at once; a streak at the trip limit trips (a hint or not); a hint past `max_hint`
    /// trips with the hinted instant; a hint within it is the window, exactly; anything else
    /// waits the schedule's next delay, the one the machine drew (`observed`: where it waits
    /// after the same failure), held to the schedule's bounds ([`adopt`]).
    pub(crate) fn failure(
        &mut self,
        policy: &FlowPolicy,
        now: Instant,
        failure: Failure<E>,
        observed: Option<Instant>,
    ) -> Result<(), FlowError> {
        let now = self.end_run(now)?;
        let error = failure.error;
        let hinted = match failure.kind {
            FailureKind::Canceled => {
                self.phase = Phase::Idle;
                return Ok(());
            }
            FailureKind::Fatal => return self.trip(error, TripReason::Fatal),
            FailureKind::Hinted(Hint::DoNotRetry) => return self.trip(error, TripReason::DoNotRetry),
            FailureKind::Hinted(Hint::After(d)) => Some(nanos(d)),
            FailureKind::Hinted(Hint::At(at)) => Some(nanos(at.saturating_duration_since(now))),
            _ => None,
        };
        if policy.trip_after().is_some_and(|limit| self.streak.saturating_add(1) >= limit) {
            return self.trip(error, TripReason::Streak);
        }
        let delay = match hinted {
            Some(d) if u128::from(d) > policy.max_hint().as_nanos() => {
                let retry_at = now.saturating_add(Duration::from_nanos(d));
                return self.trip(error, TripReason::Deferred { retry_at });
            }
            Some(d) => {
                self.streak = self.streak.saturating_add(1);
                self.schedule.hinted(policy.restarts_after_hint(), d);
                d
            }
            None => {
                self.streak = self.streak.saturating_add(1);
                self.schedule.scheduled(policy.backoff(), observed, now, |_| false)
            }
        };
        let until = now.saturating_add(Duration::from_nanos(delay));
        self.phase = Phase::Backoff { until, last_error: error };
        self.next_eligible = Some(until);
        Ok(())
    }

    /// The failure trips the flow: counted into the streak, no window (F3, F10).
    fn trip(&mut self, last_error: E, reason: TripReason) -> Result<(), FlowError> {
        self.streak = self.streak.saturating_add(1);
        self.phase = Phase::Tripped { last_error, reason };
        self.next_eligible = None;
        // O1: the trip is an output.
        self.pending = Some(FlowAction::Tripped { streak: self.streak, reason });
        Ok(())
    }

    pub(crate) fn cancel(&mut self, now: Instant) -> Result<(), FlowError> {
        self.end_run(now)?;
        self.phase = Phase::Idle;
        Ok(())
    }

    /// F8: refused while an action waits; a reset that clears a streak is an output (O1).
    pub(crate) fn reset(&mut self, now: Instant) -> Result<(), FlowError> {
        self.drained()?;
        self.last_now = self.last_now.later(now);
        let (streak, tripped) = (self.streak, matches!(self.phase, Phase::Tripped { .. }));
        self.clear_streak();
        if self.phase != Phase::Running {
            self.phase = Phase::Idle;
        }
        if streak > 0 || tripped {
            self.pending = Some(FlowAction::Reset { streak, tripped });
        }
        Ok(())
    }

    fn clear_streak(&mut self) {
        self.streak = 0;
        self.schedule.start_over();
        self.next_eligible = None;
    }
}
