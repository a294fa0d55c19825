//! Recurring flows that back off after failures and trip after a streak (rules F1–F10).
//!
//! A [`FlowPolicy`] is the shared configuration (a backoff, an optional trip limit and the hint
//! rule); a [`Flow`] is one flow's state: its status, failure streak ([`BackoffState`]), backoff
//! window and schedule. A run's failure is the same [`Failure`] a retry reports, decided by the
//! same rule ([`crate::decision`]): `Fatal` and `DoNotRetry` trip the flow at once, a hint sets
//! the window. With the `alloc` feature, [`Flows`] keeps many flows by id and finds the next due
//! one in `O(log n)`.

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState, Jitter};
use crate::decision::{DEFAULT_MAX_HINT, Decision, FailureRules, Stop};
use crate::error::Refused;
use crate::failure::Failure;
use crate::{Instant, PolicyError};

/// How a flow backs off, when it trips, and how hints apply (F2, B6). Immutable; share one
/// among any number of flows.
///
/// The default (also [`FlowPolicy::builder`]) is F2: exponential backoff from 1 s, ×2, capped at
/// 5 min, proportional jitter 0.1, and no trip limit; hints are honoured up to
/// [`DEFAULT_MAX_HINT`](crate::DEFAULT_MAX_HINT).
///
/// ```
/// use core::time::Duration;
/// use persevere::FlowPolicy;
///
/// let policy = FlowPolicy::builder().with_trip(3).build()?;
/// assert_eq!(policy.trip_after(), Some(3));
/// assert_eq!(policy.backoff().envelope(1), Duration::from_secs(1));
/// assert_eq!(policy.backoff().max_delay(), Duration::from_secs(300));
/// assert!(FlowPolicy::builder().with_trip(0).build().is_err());
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "FlowPolicyBuilder", into = "FlowPolicyBuilder")
)]
pub struct FlowPolicy {
    /// `retries_allowed` is the trip limit minus one (`u64::MAX`: never trips).
    rules: FailureRules,
}

/// The settings of a [`FlowPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct FlowPolicyBuilder {
    /// The delays after consecutive failures.
    pub backoff: Backoff,
    /// Trip after this many consecutive failures; `None` never trips.
    pub trip_after: Option<u32>,
    /// The longest window a hint may ask for; a longer one trips the flow
    /// ([`TripReason::Deferred`], B6). [`Duration::MAX`] honours any hint.
    #[cfg_attr(feature = "serde", serde(default = "crate::decision::default_max_hint"))]
    pub max_hint: Duration,
    /// Whether the backoff starts over from its first delay after a hinted window (B6).
    #[cfg_attr(feature = "serde", serde(default))]
    pub restart_after_hint: bool,
}

impl FlowPolicyBuilder {
    /// Sets the backoff.
    pub const fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Trips the flow after `n` consecutive failures (F2).
    ///
    /// `n = 0` is refused by [`build`](Self::build): here zero has no meaning. (One source
    /// scheduler reads a trip limit of 0 as "trip on the first failure"; that is `with_trip(1)`.)
    pub const fn with_trip(mut self, n: u32) -> Self {
        self.trip_after = Some(n);
        self
    }

    /// Sets the longest window a hint may ask for (B6); [`Duration::MAX`] honours any hint.
    pub const fn max_hint(mut self, max_hint: Duration) -> Self {
        self.max_hint = max_hint;
        self
    }

    /// Whether the backoff starts over after a hinted window (B6).
    pub const fn restart_after_hint(mut self, restart: bool) -> Self {
        self.restart_after_hint = restart;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError::Zero`] for a trip limit or a `max_hint` of zero.
    pub fn build(self) -> Result<FlowPolicy, PolicyError> {
        let retries_allowed = match self.trip_after {
            Some(0) => {
                return Err(PolicyError::Zero {
                    setting: "trip limit",
                    why: "a flow trips after n consecutive failures; use with_trip(1) to trip on the first failure",
                });
            }
            Some(n) => u64::from(n) - 1,
            None => u64::MAX,
        };
        Ok(FlowPolicy {
            rules: FailureRules::build(self.backoff, retries_allowed, self.max_hint, self.restart_after_hint)?,
        })
    }
}

impl TryFrom<FlowPolicyBuilder> for FlowPolicy {
    type Error = PolicyError;

    fn try_from(builder: FlowPolicyBuilder) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl From<FlowPolicy> for FlowPolicyBuilder {
    fn from(policy: FlowPolicy) -> Self {
        FlowPolicyBuilder {
            backoff: policy.rules.backoff,
            trip_after: policy.trip_after(),
            max_hint: policy.max_hint(),
            restart_after_hint: policy.rules.restart_after_hint,
        }
    }
}

impl Default for FlowPolicy {
    fn default() -> Self {
        FlowPolicy { rules: FailureRules::new(f2_backoff(), u64::MAX) }
    }
}

/// F2's backoff: 1 s, ×2, cap 5 min, proportional jitter 0.1.
fn f2_backoff() -> Backoff {
    Backoff::exponential_unchecked(1_000_000_000, 2.0, 300_000_000_000, Jitter::Proportional(0.1))
}

impl FlowPolicy {
    /// A builder holding the defaults of F2.
    pub fn builder() -> FlowPolicyBuilder {
        FlowPolicyBuilder {
            backoff: f2_backoff(),
            trip_after: None,
            max_hint: DEFAULT_MAX_HINT,
            restart_after_hint: false,
        }
    }

    /// F2 with a trip limit; `n` is not zero (the presets pass `n.max(1)`).
    pub(crate) fn f2_tripping_after(n: u32) -> FlowPolicy {
        FlowPolicy { rules: FailureRules::new(f2_backoff(), u64::from(n.max(1)) - 1) }
    }

    /// The backoff.
    pub const fn backoff(&self) -> &Backoff {
        &self.rules.backoff
    }

    /// The trip limit; `None` never trips.
    pub const fn trip_after(&self) -> Option<u32> {
        match self.rules.retries_allowed {
            u64::MAX => None,
            // Built from a `u32` limit, so it fits.
            n => Some(n as u32 + 1),
        }
    }

    /// The longest hinted window honoured ([`Duration::MAX`]: any).
    pub fn max_hint(&self) -> Duration {
        self.rules.max_hint()
    }

    /// Whether the backoff starts over after a hinted window.
    pub const fn restarts_after_hint(&self) -> bool {
        self.rules.restart_after_hint
    }
}

/// When a flow is dispatched by time (F5, F6). Part of the flow's state, not of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum FlowSchedule {
    /// Dispatched when created; after each run, at `max(run_end + interval, next_eligible)` (F5).
    Every {
        /// The pause from one run's end to the next dispatch.
        interval: Duration,
    },
    /// Dispatched by ticks the driver reports with [`Flow::handle_tick`] (its cron
    /// expression is its own business); ticks inside the backoff window are skipped (F6).
    Cron,
}

/// Why a flow tripped (F3): the status says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum TripReason {
    /// The streak of consecutive failures reached the policy's trip limit.
    Streak,
    /// A run failed with [`FailureKind::Fatal`](crate::FailureKind::Fatal): retrying cannot help.
    Fatal,
    /// A run failed with [`Hint::DoNotRetry`](crate::Hint::DoNotRetry): the other side asked not to be tried again.
    DoNotRetry,
    /// A run's hint asked for a window ending at `retry_at`, longer than the policy's
    /// `max_hint` (B6): the hint is never shortened, so the flow trips and tells when the other
    /// side will take it again.
    Deferred {
        /// When the other side asked to be tried again.
        retry_at: Instant,
    },
}

/// A flow's status (F1), as seen by [`Flow::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FlowStatus<E> {
    /// Not running; never ran, was canceled (F4) or was reset (F8).
    Idle,
    /// A run is in flight.
    Running,
    /// The last run succeeded.
    Completed,
    /// The last run failed; no scheduled dispatch before `until`.
    Backoff {
        /// The end of the backoff window.
        until: Instant,
        /// Consecutive failures.
        streak: u32,
        /// The last run's error.
        last_error: E,
    },
    /// Never dispatched until reset (F10): `reason` says why.
    Tripped {
        /// Consecutive failures.
        streak: u32,
        /// The last run's error.
        last_error: E,
        /// Why it tripped.
        reason: TripReason,
    },
}

impl<E> FlowStatus<E> {
    /// The status without its payload.
    pub const fn kind(&self) -> FlowStatusKind {
        match self {
            FlowStatus::Idle => FlowStatusKind::Idle,
            FlowStatus::Running => FlowStatusKind::Running,
            FlowStatus::Completed => FlowStatusKind::Completed,
            FlowStatus::Backoff { .. } => FlowStatusKind::Backoff,
            FlowStatus::Tripped { .. } => FlowStatusKind::Tripped,
        }
    }
}

impl<E: Clone> FlowStatus<&E> {
    /// The status with its error cloned.
    pub fn cloned(self) -> FlowStatus<E> {
        match self {
            FlowStatus::Idle => FlowStatus::Idle,
            FlowStatus::Running => FlowStatus::Running,
            FlowStatus::Completed => FlowStatus::Completed,
            FlowStatus::Backoff { until, streak, last_error } => {
                FlowStatus::Backoff { until, streak, last_error: last_error.clone() }
            }
            FlowStatus::Tripped { streak, last_error, reason } => {
                FlowStatus::Tripped { streak, last_error: last_error.clone(), reason }
            }
        }
    }
}

/// [`FlowStatus`] without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FlowStatusKind {
    /// See [`FlowStatus::Idle`].
    Idle,
    /// See [`FlowStatus::Running`].
    Running,
    /// See [`FlowStatus::Completed`].
    Completed,
    /// See [`FlowStatus::Backoff`].
    Backoff,
    /// See [`FlowStatus::Tripped`].
    Tripped,
}

/// What a scheduler shows about a flow (F9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FlowInfo<E> {
    /// Consecutive failures.
    pub failure_streak: u32,
    /// The end of the backoff window; `None` when there is none (never failed, succeeded,
    /// reset, or tripped: a tripped flow waits for a reset, not for a time).
    pub next_eligible: Option<Instant>,
    /// Runs dispatched so far (by schedule, tick or trigger).
    pub run_count: u64,
    /// The status.
    pub status: FlowStatus<E>,
}

/// Why a tick of a cron flow did not dispatch it (F6). Skipped ticks are never replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum SkipReason {
    /// The tick fell inside the backoff window.
    InBackoff {
        /// The window's end.
        until: Instant,
    },
    /// A run was still in flight (runs of one flow never overlap).
    Running,
    /// The flow is tripped (F10).
    Tripped,
}

/// What the driver must do for a flow; drained with [`Flow::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum FlowAction {
    /// Run the flow now, then report the run with `handle_success`, `handle_failure` or
    /// `handle_cancel`.
    Dispatch {
        /// The run's number, from 1 (the new `run_count`).
        run: u64,
    },
    /// A tick was skipped, and will not be replayed.
    TickSkipped {
        /// The tick.
        tick: Instant,
        /// Why.
        reason: SkipReason,
    },
    /// The run's failure tripped the flow (F10, O1): nothing is dispatched until
    /// [`reset_flow`](Flow::reset_flow).
    Tripped {
        /// Its consecutive failures, this one included.
        streak: u32,
        /// Why it tripped.
        reason: TripReason,
    },
    /// [`reset_flow`](Flow::reset_flow) cleared a failure streak (F8, O1): the flow had one
    /// (tripped, backing off, or idle or running after a failure), and is idle now (or keeps
    /// its run in flight).
    Reset {
        /// The streak it cleared.
        streak: u32,
        /// Whether the flow was tripped.
        tripped: bool,
    },
}

/// A caller mistake; the flow is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// A run result while no run is in flight.
    #[error("the flow is not running (it is {0:?}); results belong to `FlowAction::Dispatch`ed runs")]
    NotRunning(FlowStatusKind),
    /// `trigger` while a run is in flight.
    #[error("the flow is already running; runs of one flow never overlap")]
    Running,
    /// `trigger` on a tripped flow (F7).
    #[error("the flow is tripped ({reason:?}, with {streak} consecutive failures); call `reset_flow` first")]
    Tripped {
        /// Its failure streak.
        streak: u32,
        /// Why it tripped.
        reason: TripReason,
    },
    /// `handle_tick` on a flow that is not a cron flow.
    #[error("the flow runs on an `Every` schedule; ticks are for `Cron` flows")]
    NotCron,
    /// An id the registry does not hold.
    #[error("no flow has this id")]
    UnknownId,
    /// An id the registry already holds.
    #[error("a flow with this id is already registered; ids must be unique")]
    DuplicateId,
    /// An input while the action of an earlier one waits to be drained (the drain rule).
    #[error("an action of an earlier input waits to be drained; call `poll_action` until it returns `None` first")]
    Undrained,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
enum Phase<E> {
    Idle,
    Running,
    Completed,
    Backoff { until: Instant, last_error: E },
    Tripped { last_error: E, reason: TripReason },
}

/// One flow's state (rules F1–F10).
///
/// # Driving it
///
/// Create it with [`Flow::every`] or [`Flow::cron`]. After every `handle_*` call (and
/// [`trigger`](Self::trigger)), drain [`poll_action`](Self::poll_action): on
/// [`FlowAction::Dispatch`] run the flow and report the run's outcome with
/// [`handle_success`](Self::handle_success), [`handle_failure`](Self::handle_failure) or
/// [`handle_cancel`](Self::handle_cancel). An every-flow is dispatched by
/// [`handle_timeout`](Self::handle_timeout) at [`poll_timeout`](Self::poll_timeout); a cron flow
/// by [`handle_tick`](Self::handle_tick).
///
/// **Drain order.** At most one action per input: [`FlowAction::Dispatch`] or
/// [`FlowAction::TickSkipped`] for a dispatch or a tick, [`FlowAction::Tripped`] for a failure
/// that trips the flow, [`FlowAction::Reset`] for a reset that cleared a streak (O1: the trips
/// and resets are outputs). An input that arrives before it is drained is refused with
/// [`FlowError::Undrained`] (and `handle_timeout` does nothing), so no action is ever dropped
/// unseen.
///
/// **One transition per outcome (F3).** Success: `Completed`, streak 0, no window. Failure:
/// streak + 1, then `Tripped` if the streak reaches the trip limit, or at once for `Fatal` and
/// `DoNotRetry` (no delay is computed), else `Backoff { until: now + delay }` with
/// `next_eligible = until`; a hinted delay is never shortened, and one past `max_hint` trips
/// with [`TripReason::Deferred`]. Clean cancel (also a `Canceled` failure): `Idle`, streak
/// unchanged (F4). No observer sees a state in between.
///
/// **Time.** A `now` earlier than the latest accepted one is read as that latest one;
/// `handle_timeout` early, or twice, changes nothing. **Misuse** returns a [`FlowError`] and
/// leaves the state exactly as it was.
///
/// **Another policy.** A flow is plain data and may be driven under another policy than the
/// one it failed under (persisted, then loaded): a window already set, or a trip, stays as it
/// is; the new backoff, trip limit and hint rule apply from the next failure.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Failure, Flow, FlowAction, FlowPolicy, FlowStatus, Instant, TripReason};
/// use rand_core::SeedableRng;
///
/// let policy = FlowPolicy::builder().with_trip(2).build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
/// let mut flow = Flow::<&str>::every(Instant::ZERO, Duration::from_secs(10));
/// flow.handle_timeout(Instant::ZERO);
/// assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 1 }));
/// flow.handle_failure(&policy, Instant::from_secs(1), Failure::retryable("db down"), &mut rng).unwrap();
/// let Some(until) = flow.next_eligible() else { unreachable!() };
/// assert_eq!(flow.poll_timeout(), Some(until.later(Instant::from_secs(11))));
/// flow.trigger(Instant::from_secs(2))?; // bypasses the window
/// assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run: 2 }));
/// flow.handle_failure(&policy, Instant::from_secs(3), Failure::retryable("db down"), &mut rng).unwrap();
/// assert_eq!(flow.status(), FlowStatus::Tripped { streak: 2, last_error: &"db down", reason: TripReason::Streak });
/// assert_eq!(flow.poll_action(), Some(FlowAction::Tripped { streak: 2, reason: TripReason::Streak }));
/// assert!(flow.trigger(Instant::from_secs(4)).is_err());
/// flow.reset_flow(Instant::from_secs(5))?;
/// assert_eq!(flow.status(), FlowStatus::Idle);
/// assert_eq!(flow.poll_action(), Some(FlowAction::Reset { streak: 2, tripped: true }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Flow<E> {
    phase: Phase<E>,
    schedule: FlowSchedule,
    /// The failure streak and the schedule's place in it.
    backoff: BackoffState,
    next_eligible: Option<Instant>,
    /// Every-schedules: the last run's end plus the interval (the creation time before the
    /// first run).
    interval_due: Instant,
    run_count: u64,
    last_now: Instant,
    pending: Option<FlowAction>,
}

impl<E> Flow<E> {
    /// An every-flow (F5), first dispatched at `now`.
    pub const fn every(now: Instant, interval: Duration) -> Self {
        Flow::new(now, FlowSchedule::Every { interval })
    }

    /// A cron flow (F6), dispatched by the ticks given to [`handle_tick`](Self::handle_tick).
    pub const fn cron(now: Instant) -> Self {
        Flow::new(now, FlowSchedule::Cron)
    }

    const fn new(now: Instant, schedule: FlowSchedule) -> Self {
        Flow {
            phase: Phase::Idle,
            schedule,
            backoff: BackoffState::new(),
            next_eligible: None,
            interval_due: now,
            run_count: 0,
            last_now: now,
            pending: None,
        }
    }

    /// Dispatches an every-flow whose time has come (F5): at `max(run_end + interval,
    /// next_eligible)`, unless it runs or is tripped (F10). Early, repeated or spurious calls,
    /// calls on cron flows, and calls while an action waits to be drained change nothing.
    #[inline]
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.last_now.later(now);
        if self.pending.is_none() && self.poll_timeout().is_some_and(|due| due <= now) {
            self.last_now = now;
            self.dispatch();
        }
    }

    /// A tick of a cron flow is due at `tick` (F6): the flow is dispatched, unless the tick
    /// falls inside the backoff window, a run is in flight, or the flow is tripped; then the
    /// tick is skipped ([`FlowAction::TickSkipped`]) and never replayed.
    ///
    /// # Errors
    /// [`FlowError::NotCron`] for an every-flow, [`FlowError::Undrained`] while an action
    /// waits to be drained; nothing changes.
    pub fn handle_tick(&mut self, now: Instant, tick: Instant) -> Result<(), FlowError> {
        self.tick(now, tick).map(drop)
    }

    fn tick(&mut self, now: Instant, tick: Instant) -> Result<FlowAction, FlowError> {
        if let FlowSchedule::Every { .. } = self.schedule {
            return Err(FlowError::NotCron);
        }
        self.check_drained()?;
        self.last_now = self.last_now.later(now);
        let reason = match (&self.phase, self.next_eligible) {
            (Phase::Running, _) => Some(SkipReason::Running),
            (Phase::Tripped { .. }, _) => Some(SkipReason::Tripped),
            (_, Some(until)) if tick < until => Some(SkipReason::InBackoff { until }),
            _ => None,
        };
        Ok(match reason {
            Some(reason) => {
                let action = FlowAction::TickSkipped { tick, reason };
                self.pending = Some(action);
                action
            }
            None => self.dispatch(),
        })
    }

    /// Dispatches the flow now, bypassing the backoff window (F7).
    ///
    /// # Errors
    /// [`FlowError::Tripped`] (reset it first), [`FlowError::Running`] or
    /// [`FlowError::Undrained`]; nothing changes.
    pub fn trigger(&mut self, now: Instant) -> Result<(), FlowError> {
        self.trigger_dispatch(now).map(drop)
    }

    fn trigger_dispatch(&mut self, now: Instant) -> Result<FlowAction, FlowError> {
        match self.phase {
            Phase::Tripped { reason, .. } => return Err(FlowError::Tripped { streak: self.streak(), reason }),
            Phase::Running => return Err(FlowError::Running),
            _ => self.check_drained()?,
        }
        self.last_now = self.last_now.later(now);
        Ok(self.dispatch())
    }

    /// The run in flight succeeded (F3): `Completed`, streak 0, no window.
    ///
    /// # Errors
    /// [`FlowError::NotRunning`] or [`FlowError::Undrained`]; nothing changes.
    #[inline]
    pub fn handle_success(&mut self, now: Instant) -> Result<(), FlowError> {
        self.check_running()?;
        self.end_run(now);
        self.phase = Phase::Completed;
        self.backoff.reset();
        self.next_eligible = None;
        Ok(())
    }

    /// The run in flight failed with `failure` (F3): the streak grows by one; at the trip
    /// limit, or for a `Fatal` or `DoNotRetry` failure, the flow is `Tripped` (no delay is
    /// computed; [`FlowAction::Tripped`] tells it), otherwise it backs off until `now + delay`, the delay being the hint's when
    /// there is one (B6; a hint past `max_hint` trips it). A `Canceled` failure is a clean
    /// cancel (F4). Draws jitter from `rng` when the backoff needs it.
    ///
    /// # Errors
    /// [`FlowError::NotRunning`] or [`FlowError::Undrained`]; nothing changes and the failure
    /// is handed back.
    // `always`: out of line, the caller's first read of the new state waits on stores that
    // cannot forward (4.4 ns inlined, 11 ns called, on the `flow` bench).
    #[inline(always)]
    pub fn handle_failure<R: Rng + ?Sized>(
        &mut self,
        policy: &FlowPolicy,
        now: Instant,
        failure: Failure<E>,
        rng: &mut R,
    ) -> Result<(), Refused<FlowError, Failure<E>>> {
        if let Err(refusal) = self.check_running() {
            return Err(Refused::new(refusal, failure));
        }
        let now = self.end_run(now);
        let last_error = failure.error;
        let reason = match self.backoff.decide(&policy.rules, now, failure.kind, rng) {
            Decision::Wait { delay_ns, .. } => {
                let until = now.saturating_add_nanos(delay_ns);
                self.phase = Phase::Backoff { until, last_error };
                self.next_eligible = Some(until);
                return Ok(());
            }
            Decision::Stop(Stop::Canceled) => {
                self.phase = Phase::Idle;
                return Ok(());
            }
            Decision::Stop(Stop::Limit) => TripReason::Streak,
            Decision::Stop(Stop::DoNotRetry) => TripReason::DoNotRetry,
            Decision::Stop(Stop::Fatal) => TripReason::Fatal,
            Decision::Stop(Stop::Deferred { retry_at }) => TripReason::Deferred { retry_at },
        };
        self.phase = Phase::Tripped { last_error, reason };
        self.next_eligible = None;
        self.pending = Some(FlowAction::Tripped { streak: self.streak(), reason });
        Ok(())
    }

    /// The run in flight was canceled cleanly (F4): `Idle`, streak and window unchanged.
    ///
    /// # Errors
    /// [`FlowError::NotRunning`] or [`FlowError::Undrained`]; nothing changes.
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), FlowError> {
        self.check_running()?;
        self.end_run(now);
        self.phase = Phase::Idle;
        Ok(())
    }

    /// Zeroes the streak and the window (F8). The flow becomes `Idle` unless a run is in
    /// flight; if that run then fails, it starts a new streak at 1. A reset that cleared a
    /// streak says so with [`FlowAction::Reset`]; one of a flow with no streak makes no action
    /// (it still turns a completed flow idle).
    ///
    /// # Errors
    /// [`FlowError::Undrained`] while an action waits to be drained; nothing changes.
    pub fn reset_flow(&mut self, now: Instant) -> Result<(), FlowError> {
        self.check_drained()?;
        self.last_now = self.last_now.later(now);
        let (streak, tripped) = (self.streak(), matches!(self.phase, Phase::Tripped { .. }));
        self.backoff.reset();
        self.next_eligible = None;
        if !matches!(self.phase, Phase::Running) {
            self.phase = Phase::Idle;
        }
        if streak > 0 || tripped {
            self.pending = Some(FlowAction::Reset { streak, tripped });
        }
        Ok(())
    }

    /// The pending action, if any.
    #[inline]
    pub fn poll_action(&mut self) -> Option<FlowAction> {
        self.pending.take()
    }

    /// When an every-flow is next due ([`handle_timeout`](Self::handle_timeout)):
    /// `max(run_end + interval, next_eligible)`; `None` for cron flows, and while a run is in
    /// flight or the flow is tripped. A pure query.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.schedule, &self.phase) {
            (FlowSchedule::Cron, _) | (_, Phase::Running | Phase::Tripped { .. }) => None,
            (FlowSchedule::Every { .. }, _) => {
                Some(self.next_eligible.map_or(self.interval_due, |until| until.later(self.interval_due)))
            }
        }
    }

    /// The status (F1), borrowing the last error.
    pub fn status(&self) -> FlowStatus<&E> {
        match &self.phase {
            Phase::Idle => FlowStatus::Idle,
            Phase::Running => FlowStatus::Running,
            Phase::Completed => FlowStatus::Completed,
            Phase::Backoff { until, last_error } => {
                FlowStatus::Backoff { until: *until, streak: self.streak(), last_error }
            }
            Phase::Tripped { last_error, reason } => {
                FlowStatus::Tripped { streak: self.streak(), last_error, reason: *reason }
            }
        }
    }

    /// What a scheduler shows (F9).
    pub fn info(&self) -> FlowInfo<&E> {
        FlowInfo {
            failure_streak: self.streak(),
            next_eligible: self.next_eligible,
            run_count: self.run_count,
            status: self.status(),
        }
    }

    /// Consecutive failures.
    pub const fn streak(&self) -> u32 {
        self.backoff.failures()
    }

    /// The end of the backoff window, if any.
    pub const fn next_eligible(&self) -> Option<Instant> {
        self.next_eligible
    }

    /// Runs dispatched so far.
    pub const fn run_count(&self) -> u64 {
        self.run_count
    }

    /// The schedule.
    pub const fn schedule(&self) -> FlowSchedule {
        self.schedule
    }

    /// The latest `now` the flow accepted.
    pub const fn now(&self) -> Instant {
        self.last_now
    }

    #[inline]
    fn check_running(&self) -> Result<(), FlowError> {
        match self.phase {
            Phase::Running if self.pending.is_none() => Ok(()),
            Phase::Running => Err(FlowError::Undrained),
            _ => Err(self.not_running()),
        }
    }

    #[inline]
    fn check_drained(&self) -> Result<(), FlowError> {
        if self.pending.is_some() { Err(FlowError::Undrained) } else { Ok(()) }
    }

    #[cold]
    fn not_running(&self) -> FlowError {
        FlowError::NotRunning(self.status().kind())
    }

    fn dispatch(&mut self) -> FlowAction {
        self.run_count = self.run_count.saturating_add(1);
        self.phase = Phase::Running;
        let action = FlowAction::Dispatch { run: self.run_count };
        self.pending = Some(action);
        action
    }

    /// Accepts `now` as a run's end and schedules an every-flow's next dispatch from it (F5).
    #[inline]
    fn end_run(&mut self, now: Instant) -> Instant {
        let now = self.last_now.later(now);
        self.last_now = now;
        if let FlowSchedule::Every { interval } = self.schedule {
            self.interval_due = now.saturating_add(interval);
        }
        now
    }

    /// Whether a loaded state is one the transitions could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if !self.backoff.is_valid() {
            return Err("the backoff's schedule restarted after more failures than its streak has");
        }
        match (&self.phase, self.next_eligible) {
            (Phase::Backoff { until, .. }, Some(eligible)) if *until != eligible => {
                return Err("a backing-off flow's window and next_eligible differ");
            }
            (Phase::Backoff { .. }, None) => return Err("a backing-off flow has no window"),
            (Phase::Tripped { .. } | Phase::Completed, Some(_)) => {
                return Err("a tripped or completed flow has a window");
            }
            _ => {}
        }
        if matches!(self.phase, Phase::Backoff { .. } | Phase::Tripped { .. }) && self.streak() == 0 {
            return Err("a backing-off or tripped flow has no failure streak");
        }
        if matches!(self.phase, Phase::Running | Phase::Completed) && self.run_count == 0 {
            return Err("a flow that ran has no run count");
        }
        match self.pending {
            Some(FlowAction::Dispatch { run }) if run != self.run_count || !matches!(self.phase, Phase::Running) => {
                Err("a pending dispatch is not the running run")
            }
            Some(FlowAction::TickSkipped { .. }) if self.schedule != FlowSchedule::Cron => {
                Err("an every-flow has a skipped tick (ticks are for cron flows)")
            }
            Some(FlowAction::Tripped { streak, reason })
                if streak != self.streak()
                    || !matches!(self.phase, Phase::Tripped { reason: r, .. } if r == reason) =>
            {
                Err("a pending trip is not the flow's trip")
            }
            // A reset clears a streak, leaves no window, and leaves the flow idle, or running
            // (a tripped flow is never running).
            Some(FlowAction::Reset { streak, tripped })
                if streak == 0
                    || self.streak() != 0
                    || self.next_eligible.is_some()
                    || !matches!(self.phase, Phase::Idle | Phase::Running)
                    || (tripped && matches!(self.phase, Phase::Running)) =>
            {
                Err("a pending reset is not one a reset makes")
            }
            _ => Ok(()),
        }
    }
}

crate::serde_validated!(Flow<E>, "a Flow");

#[cfg(feature = "alloc")]
pub use registry::Flows;

#[cfg(feature = "alloc")]
mod registry {
    extern crate alloc;

    use alloc::collections::{BTreeMap, BTreeSet};

    use rand_core::Rng;

    use super::{Flow, FlowAction, FlowError, FlowInfo, FlowPolicy};
    use crate::Instant;
    use crate::error::Refused;
    use crate::failure::Failure;

    /// Many flows keyed by id, with an index of due times so the next due every-flow is found in
    /// `O(log n)` (requires the `alloc` feature).
    ///
    /// Per-id inputs forward to the [`Flow`] and give its action back directly; time-driven
    /// dispatches come out of [`poll_action`](Self::poll_action) after
    /// [`handle_timeout`](Self::handle_timeout), earliest due first (ties by id). With `serde`,
    /// the registry persists as its flows and its latest `now`; the due index is rebuilt when
    /// it loads, and every flow is validated.
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Flow, FlowAction, Flows, Instant};
    ///
    /// let mut flows = Flows::<&str, ()>::new();
    /// flows.insert("b", Flow::every(Instant::from_secs(2), Duration::from_secs(60))).unwrap();
    /// flows.insert("a", Flow::every(Instant::from_secs(1), Duration::from_secs(60))).unwrap();
    /// assert_eq!(flows.poll_timeout(), Some(Instant::from_secs(1)));
    /// flows.handle_timeout(Instant::from_secs(5));
    /// assert_eq!(flows.poll_action(), Some(("a", FlowAction::Dispatch { run: 1 })));
    /// assert_eq!(flows.poll_action(), Some(("b", FlowAction::Dispatch { run: 1 })));
    /// assert_eq!(flows.poll_action(), None);
    /// flows.handle_success(Instant::from_secs(6), &"a")?;
    /// assert_eq!(flows.poll_timeout(), Some(Instant::from_secs(66)));
    /// # Ok::<(), persevere::FlowError>(())
    /// ```
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Flows<K, E> {
        flows: BTreeMap<K, Flow<E>>,
        due: BTreeSet<(Instant, K)>,
        last_now: Instant,
    }

    impl<K: Ord, E> Default for Flows<K, E> {
        fn default() -> Self {
            Flows { flows: BTreeMap::new(), due: BTreeSet::new(), last_now: Instant::ZERO }
        }
    }

    impl<K: Ord + Clone, E> Flows<K, E> {
        /// An empty registry.
        pub fn new() -> Self {
            Flows::default()
        }

        /// Adds a flow under `id`.
        ///
        /// # Errors
        /// [`FlowError::DuplicateId`] when `id` is taken, [`FlowError::Undrained`] when the
        /// flow holds an undrained action (drain it first: the registry hands out its own);
        /// the id and flow are handed back and nothing changes.
        // The refusal hands the flow back whole (as every refusal hands back its input).
        #[allow(clippy::type_complexity, clippy::result_large_err)]
        pub fn insert(&mut self, id: K, flow: Flow<E>) -> Result<(), Refused<FlowError, (K, Flow<E>)>> {
            if self.flows.contains_key(&id) {
                return Err(Refused::new(FlowError::DuplicateId, (id, flow)));
            }
            if flow.pending.is_some() {
                return Err(Refused::new(FlowError::Undrained, (id, flow)));
            }
            if let Some(due) = flow.poll_timeout() {
                self.due.insert((due, id.clone()));
            }
            self.flows.insert(id, flow);
            Ok(())
        }

        /// Removes and returns the flow under `id`.
        pub fn remove(&mut self, id: &K) -> Option<Flow<E>> {
            let flow = self.flows.remove(id)?;
            if let Some(due) = flow.poll_timeout() {
                self.due.remove(&(due, id.clone()));
            }
            Some(flow)
        }

        /// The flow under `id`.
        pub fn get(&self, id: &K) -> Option<&Flow<E>> {
            self.flows.get(id)
        }

        /// What a scheduler shows about the flow under `id` (F9).
        pub fn info(&self, id: &K) -> Option<FlowInfo<&E>> {
            self.flows.get(id).map(Flow::info)
        }

        /// The number of flows.
        pub fn len(&self) -> usize {
            self.flows.len()
        }

        /// Whether there are none.
        pub fn is_empty(&self) -> bool {
            self.flows.is_empty()
        }

        /// The flows in id order.
        pub fn iter(&self) -> impl Iterator<Item = (&K, &Flow<E>)> {
            self.flows.iter()
        }

        /// [`Flow::trigger`] on the flow under `id`; returns its dispatch.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`], or the flow's refusal; nothing changes.
        pub fn trigger(&mut self, now: Instant, id: &K) -> Result<FlowAction, FlowError> {
            self.with(id, |flow| flow.trigger_dispatch(now))?
        }

        /// [`Flow::handle_tick`] on the flow under `id`; returns its dispatch or skip.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`], or the flow's refusal; nothing changes.
        pub fn handle_tick(&mut self, now: Instant, id: &K, tick: Instant) -> Result<FlowAction, FlowError> {
            self.with(id, |flow| flow.tick(now, tick))?
        }

        /// [`Flow::handle_success`] on the flow under `id`.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`], or the flow's refusal; nothing changes.
        pub fn handle_success(&mut self, now: Instant, id: &K) -> Result<(), FlowError> {
            self.with(id, |flow| flow.handle_success(now))?
        }

        /// [`Flow::handle_failure`] on the flow under `id`; returns [`FlowAction::Tripped`]
        /// when the failure tripped it.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`], or the flow's refusal; nothing changes and the failure is
        /// handed back.
        pub fn handle_failure<R: Rng + ?Sized>(
            &mut self,
            policy: &FlowPolicy,
            now: Instant,
            id: &K,
            failure: Failure<E>,
            rng: &mut R,
        ) -> Result<Option<FlowAction>, Refused<FlowError, Failure<E>>> {
            let Some(flow) = self.flows.get_mut(id) else {
                return Err(Refused::new(FlowError::UnknownId, failure));
            };
            let before = flow.poll_timeout();
            let result = flow.handle_failure(policy, now, failure, rng).map(|()| flow.pending.take());
            let after = flow.poll_timeout();
            self.reindex(id, before, after);
            result
        }

        /// [`Flow::handle_cancel`] on the flow under `id`.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`], or the flow's refusal; nothing changes.
        pub fn handle_cancel(&mut self, now: Instant, id: &K) -> Result<(), FlowError> {
            self.with(id, |flow| flow.handle_cancel(now))?
        }

        /// [`Flow::reset_flow`] on the flow under `id` (F8); returns [`FlowAction::Reset`] when
        /// it cleared a streak.
        ///
        /// # Errors
        /// [`FlowError::UnknownId`]; nothing changes.
        pub fn reset_flow(&mut self, now: Instant, id: &K) -> Result<Option<FlowAction>, FlowError> {
            // A flow in the registry holds no action, so its reset is never refused.
            self.with(id, |flow| flow.reset_flow(now).map(|()| flow.pending.take()))?
        }

        /// Accepts `now`: every-flows due at or before it come out of
        /// [`poll_action`](Self::poll_action). The registry's clock is the latest `now` given
        /// here (an earlier one is read as it); per-flow inputs keep each flow's own clock and do
        /// not move the registry's, since a flow may be created at a future instant (its first
        /// dispatch) that the registry must not reach before `handle_timeout` says so.
        pub fn handle_timeout(&mut self, now: Instant) {
            self.last_now = self.last_now.later(now);
        }

        /// Dispatches the earliest every-flow due at or before the latest `handle_timeout`, and
        /// returns its id and [`FlowAction::Dispatch`]; `None` when none is due.
        pub fn poll_action(&mut self) -> Option<(K, FlowAction)> {
            let (due, id) = self.due.first()?.clone();
            if due > self.last_now {
                return None;
            }
            let now = self.last_now;
            let action = self.with(&id, |flow| {
                let now = flow.last_now.later(now);
                if flow.poll_timeout().is_some_and(|due| due <= now) {
                    flow.last_now = now;
                    Some(flow.dispatch())
                } else {
                    None
                }
            });
            match action {
                Ok(Some(action)) => Some((id, action)),
                // The index only holds due times of flows it holds; stay total regardless.
                _ => {
                    self.due.remove(&(due, id));
                    None
                }
            }
        }

        /// The earliest due time of any every-flow; `None` when none is timed. `O(log n)`.
        pub fn poll_timeout(&self) -> Option<Instant> {
            self.due.first().map(|(due, _)| *due)
        }

        /// The latest `now` the registry accepted.
        pub const fn now(&self) -> Instant {
            self.last_now
        }

        /// Runs `f` on the flow under `id`, keeping the due index in step.
        fn with<T>(&mut self, id: &K, f: impl FnOnce(&mut Flow<E>) -> T) -> Result<T, FlowError> {
            let flow = self.flows.get_mut(id).ok_or(FlowError::UnknownId)?;
            let before = flow.poll_timeout();
            let out = f(flow);
            // The registry hands actions out itself; a flow in it never holds one.
            flow.pending = None;
            let after = flow.poll_timeout();
            self.reindex(id, before, after);
            Ok(out)
        }

        fn reindex(&mut self, id: &K, before: Option<Instant>, after: Option<Instant>) {
            if before != after {
                if let Some(due) = before {
                    self.due.remove(&(due, id.clone()));
                }
                if let Some(due) = after {
                    self.due.insert((due, id.clone()));
                }
            }
        }
    }

    #[cfg(feature = "serde")]
    mod persist {
        use alloc::collections::BTreeMap;

        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        use super::{Flow, Flows};
        use crate::Instant;

        #[derive(Serialize)]
        struct Saved<'a, K: Ord, E> {
            flows: &'a BTreeMap<K, Flow<E>>,
            last_now: Instant,
        }

        #[derive(Deserialize)]
        struct Loaded<K: Ord, E> {
            flows: BTreeMap<K, Flow<E>>,
            last_now: Instant,
        }

        /// Saved as its flows and its latest `now` (the due index is derived).
        impl<K: Ord + Serialize, E: Serialize> Serialize for Flows<K, E> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                Saved { flows: &self.flows, last_now: self.last_now }.serialize(serializer)
            }
        }

        /// Loaded with every flow validated, the due index rebuilt. A flow that holds an
        /// action is refused: the registry hands actions out itself, so one held by a flow in
        /// it was never seen by its driver (a dispatch the driver never ran would leave the
        /// flow running for ever).
        impl<'de, K: Ord + Clone + Deserialize<'de>, E: Deserialize<'de>> Deserialize<'de> for Flows<K, E> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let loaded = Loaded::<K, E>::deserialize(deserializer)?;
                let mut flows = Flows::new();
                for (id, flow) in loaded.flows {
                    // The ids of a map are distinct, so only a held action is refused.
                    if flows.insert(id, flow).is_err() {
                        return Err(serde::de::Error::custom(
                            "invalid Flows: a flow holds an action (the registry hands actions out itself)",
                        ));
                    }
                }
                flows.last_now = flows.last_now.later(loaded.last_now);
                Ok(flows)
            }
        }
    }
}
