//! Hedging: several attempts of one operation in flight, the first success wins (rules X1–X5).
//!
//! A [`HedgePolicy`] is the shared configuration (how many attempts, how far apart, what a
//! non-fatal failure does, how long a pushback may be); a [`Hedge`] is one operation's state:
//! plain data, no clock, no RNG, no allocation. The machine only decides; the driver starts and
//! cancels the attempts it names.

use core::time::Duration;

use crate::decision::DEFAULT_MAX_HINT;
use crate::error::Refused;
use crate::failure::{Failure, FailureKind, Hint, LastFailure};
use crate::retry::{Outcome, OutcomeKind};
use crate::time::nanos_of;
use crate::{Instant, PolicyError};

/// The most attempts a hedged operation may have in flight (and in all).
pub const MAX_HEDGED_ATTEMPTS: u32 = 16;

/// The configuration of a hedged operation (gRPC's `hedgingPolicy`, Polly's hedging strategy).
///
/// ```
/// use core::time::Duration;
/// use persevere::HedgePolicy;
///
/// // gRPC's example: up to 4 attempts, a new one every 500 ms while none has answered.
/// let policy = HedgePolicy::builder(4, Duration::from_millis(500)).build()?;
/// assert_eq!(policy.max_attempts(), 4);
/// assert!(policy.next_on_failure());
/// assert!(HedgePolicy::builder(0, Duration::ZERO).build().is_err());
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "HedgePolicyBuilder", into = "HedgePolicyBuilder")
)]
pub struct HedgePolicy {
    max_attempts: u32,
    delay_ns: u64,
    next_on_failure: bool,
    max_hint_ns: u64,
}

/// The settings of a [`HedgePolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct HedgePolicyBuilder {
    /// Attempts in all, the first included: `1..=`[`MAX_HEDGED_ATTEMPTS`].
    pub max_attempts: u32,
    /// How long after an attempt starts the next one does, while none has answered (X1).
    /// Zero starts them all at once.
    pub delay: Duration,
    /// Whether a non-fatal failure starts the next attempt at once instead of at its time (X3).
    /// `true` by default, as gRPC does.
    pub next_on_failure: bool,
    /// The longest pushback honoured: a hint asking for more stops further attempts (B6);
    /// [`Duration::MAX`] honours any.
    pub max_hint: Duration,
}

impl HedgePolicyBuilder {
    /// Whether a non-fatal failure starts the next attempt at once.
    pub const fn next_on_failure(mut self, start: bool) -> Self {
        self.next_on_failure = start;
        self
    }

    /// The longest pushback honoured.
    pub const fn max_hint(mut self, max_hint: Duration) -> Self {
        self.max_hint = max_hint;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when `max_attempts` is zero or above [`MAX_HEDGED_ATTEMPTS`], `delay`
    /// does not fit in `u64` nanoseconds, or `max_hint` is zero ([`Duration::MAX`] honours any
    /// hint, as for every policy).
    pub fn build(self) -> Result<HedgePolicy, PolicyError> {
        if self.max_attempts == 0 {
            return Err(PolicyError::Zero {
                setting: "max_attempts",
                why: "a hedged operation needs at least its first attempt",
            });
        }
        if self.max_attempts > MAX_HEDGED_ATTEMPTS {
            return Err(PolicyError::LimitTooLarge { setting: "max_attempts", max: u64::from(MAX_HEDGED_ATTEMPTS) });
        }
        let delay_ns = nanos_of(self.delay).ok_or(PolicyError::DurationOverflow { setting: "delay" })?;
        let max_hint_ns = crate::decision::max_hint_ns(self.max_hint)?;
        Ok(HedgePolicy {
            max_attempts: self.max_attempts,
            delay_ns,
            next_on_failure: self.next_on_failure,
            max_hint_ns,
        })
    }
}

impl TryFrom<HedgePolicyBuilder> for HedgePolicy {
    type Error = PolicyError;

    fn try_from(builder: HedgePolicyBuilder) -> Result<Self, PolicyError> {
        builder.build()
    }
}

impl From<HedgePolicy> for HedgePolicyBuilder {
    fn from(policy: HedgePolicy) -> Self {
        HedgePolicyBuilder {
            max_attempts: policy.max_attempts,
            delay: Duration::from_nanos(policy.delay_ns),
            next_on_failure: policy.next_on_failure,
            max_hint: crate::decision::max_hint_of(policy.max_hint_ns),
        }
    }
}

impl HedgePolicy {
    /// A builder: `max_attempts` in all, started `delay` apart; a non-fatal failure starts the
    /// next at once; pushbacks up to [`DEFAULT_MAX_HINT`] are honoured.
    pub const fn builder(max_attempts: u32, delay: Duration) -> HedgePolicyBuilder {
        HedgePolicyBuilder { max_attempts, delay, next_on_failure: true, max_hint: DEFAULT_MAX_HINT }
    }

    /// Attempts in all.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay between two starts while no attempt has answered.
    pub const fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    /// Whether a non-fatal failure starts the next attempt at once.
    pub const fn next_on_failure(&self) -> bool {
        self.next_on_failure
    }

    /// The longest pushback honoured.
    pub const fn max_hint(&self) -> Duration {
        crate::decision::max_hint_of(self.max_hint_ns)
    }
}

/// What a hedged operation took (X5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HedgeStats {
    /// Attempts started (a hedge the budget refused never started).
    pub started: u64,
    /// Attempts canceled by the machine's [`HedgeAction::Cancel`].
    pub canceled: u64,
    /// The attempt whose success is the outcome.
    pub winner: Option<u64>,
    /// From the first attempt's start to the outcome.
    pub elapsed: Duration,
}

/// What the driver must do; drain with [`Hedge::poll_action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum HedgeAction<E> {
    /// Start attempt `attempt` now. For a hedge (attempt 2 or later) a driver with a retry
    /// budget asks it first (X4); on a refusal it starts neither this one nor any later
    /// `Start` of the same drain, and reports [`Hedge::handle_rejected`] for this one.
    Start {
        /// Its number, from 1.
        attempt: u64,
    },
    /// Drop attempt `attempt`, which still runs: another one decided the outcome (X2, X3). A
    /// result that still arrives for it is refused.
    Cancel {
        /// Its number.
        attempt: u64,
    },
    /// The operation ended (X5); nothing follows.
    Finish {
        /// How.
        outcome: Outcome<E>,
        /// What it took.
        stats: HedgeStats,
    },
}

/// A caller mistake on a [`Hedge`]; the machine is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum HedgeError {
    /// `handle_start` on an operation that already started.
    #[error("the hedged operation has already started; create a new `Hedge` for a new operation")]
    AlreadyStarted,
    /// An input that needs a started operation, before `handle_start`.
    #[error("the hedged operation has not started; call `handle_start` first")]
    NotStarted,
    /// A result for an attempt that does not run: never started, already answered, canceled
    /// or refused.
    #[error("attempt {attempt} is not in flight; results belong to started attempts that have not answered")]
    NotInFlight {
        /// The attempt named by the input.
        attempt: u64,
    },
    /// `handle_rejected` for an attempt other than the newest hedge.
    #[error(
        "attempt {attempt} is not the newest hedge, so it cannot be refused; refuse the first `Start` of a hedge the budget denied"
    )]
    NothingToReject {
        /// The attempt named by the input.
        attempt: u64,
    },
    /// Any input after the outcome.
    #[error("the hedged operation has finished ({0:?}); its outcome was final")]
    Finished(OutcomeKind),
    /// An input while outputs of an earlier one wait to be drained (the drain rule).
    #[error("actions of an earlier input wait to be drained; call `poll_action` until it returns `None` first")]
    Undrained,
}

/// Why no further attempt will start, though more were allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stop {
    /// The other side said not to try again ([`Hint::DoNotRetry`]).
    DoNotRetry,
    /// A pushback asked for later than `max_hint` allows: come back at this instant.
    Deferred(Instant),
    /// The budget refused a hedge.
    Rejected,
}

/// One hedged operation (rules X1–X5).
///
/// # Driving it
/// [`handle_start`](Self::handle_start) at the first attempt's start, then drain
/// [`poll_action`](Self::poll_action): start the attempts it names, cancel the ones it
/// cancels. Report each attempt's end with [`handle_success`](Self::handle_success) or
/// [`handle_failure`](Self::handle_failure), wake the machine at
/// [`poll_timeout`](Self::poll_timeout) with [`handle_timeout`](Self::handle_timeout) (the next
/// hedge's time), and drain again after every input.
///
/// **Drain order.** Cancels (lowest attempt first), then starts (lowest first), then the
/// finish, which comes last and once.
///
/// **Rules.** Attempt 1 starts at once; while attempts remain, the next starts `delay` after
/// the previous one did (all at once for a zero delay), never more than `max_attempts` in all
/// (X1). The first success is the outcome and every other attempt still running is canceled
/// (X2). A fatal or canceled failure ends the operation with its outcome and cancels the rest;
/// a non-fatal one starts the next attempt at once (if the policy says so); a pushback
/// ([`Hint::After`], [`Hint::At`]) moves the next start to the hinted instant, and one past
/// `max_hint`, or [`Hint::DoNotRetry`], stops further starts without touching the attempts
/// that run (X3, B6). A budget's refusal of a hedge stops further starts too (X4). Once no
/// attempt runs and none will start, the operation ends: `Exhausted` (every attempt failed),
/// `Deferred` (a pushback past `max_hint`, with its instant), `Fatal` (told not to retry) or
/// `Rejected` (X5).
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. A late `handle_timeout` starts the next hedge at the time it is told, and
/// the one after `delay` later.
///
/// **Misuse** is refused with a [`HedgeError`] (with the failure handed back in a [`Refused`])
/// and changes nothing (G12).
///
/// ```
/// use core::time::Duration;
/// use persevere::{Failure, Hedge, HedgeAction, HedgePolicy, Instant, Outcome};
///
/// let policy = HedgePolicy::builder(3, Duration::from_millis(100)).build()?;
/// let mut hedge = Hedge::<&str>::new();
/// hedge.handle_start(&policy, Instant::ZERO)?;
/// assert_eq!(hedge.poll_action(), Some(HedgeAction::Start { attempt: 1 }));
/// assert_eq!(hedge.poll_action(), None);
/// // Nobody answered within 100 ms: a hedge.
/// assert_eq!(hedge.poll_timeout(), Some(Instant::from_millis(100)));
/// hedge.handle_timeout(&policy, Instant::from_millis(100));
/// assert_eq!(hedge.poll_action(), Some(HedgeAction::Start { attempt: 2 }));
/// assert_eq!(hedge.poll_action(), None);
/// // The hedge answers first: it wins, and attempt 1 is canceled.
/// hedge.handle_success(Instant::from_millis(130), 2)?;
/// assert_eq!(hedge.poll_action(), Some(HedgeAction::Cancel { attempt: 1 }));
/// let Some(HedgeAction::Finish { outcome, stats }) = hedge.poll_action() else { panic!() };
/// assert_eq!(outcome, Outcome::Succeeded);
/// assert_eq!((stats.started, stats.canceled, stats.winner), (2, 1, Some(2)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hedge<E> {
    started_at: Option<Instant>,
    now: Instant,
    /// Attempts started, numbered `1..=started`.
    started: u32,
    /// Bit `k − 1`: attempt `k` runs.
    in_flight: u32,
    /// When the next attempt starts; `None` when none will (all started, or stopped).
    next_at: Option<Instant>,
    /// No attempt starts before this: the latest pushback honoured (B6).
    not_before: Instant,
    stop: Option<Stop>,
    /// The failure that stopped further starts (a pushback), for the outcome.
    stop_failure: Option<LastFailure<E>>,
    /// The attempts the latest input started: the only ones a budget may refuse.
    fresh: u32,
    canceled: u32,
    winner: Option<u64>,
    last_failure: Option<LastFailure<E>>,
    /// Outputs not yet drained.
    pending_cancel: u32,
    pending_start: u32,
    finish: Option<Outcome<E>>,
    finished: Option<OutcomeKind>,
}

impl<E> Default for Hedge<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> Hedge<E> {
    /// An operation that has not started.
    pub const fn new() -> Self {
        Hedge {
            started_at: None,
            now: Instant::ZERO,
            started: 0,
            in_flight: 0,
            next_at: None,
            not_before: Instant::ZERO,
            stop: None,
            stop_failure: None,
            fresh: 0,
            canceled: 0,
            winner: None,
            last_failure: None,
            pending_cancel: 0,
            pending_start: 0,
            finish: None,
            finished: None,
        }
    }

    /// The first attempt starts at `now` (X1).
    ///
    /// # Errors
    /// [`HedgeError::AlreadyStarted`]; nothing changes.
    pub fn handle_start(&mut self, policy: &HedgePolicy, now: Instant) -> Result<(), HedgeError> {
        if self.started_at.is_some() {
            return Err(HedgeError::AlreadyStarted);
        }
        self.started_at = Some(now);
        self.now = now;
        self.next_at = Some(now);
        self.advance(policy);
        Ok(())
    }

    /// Attempt `attempt` succeeded at `now`: it is the outcome, and every other attempt still
    /// running is canceled (X2).
    ///
    /// # Errors
    /// [`HedgeError`] when the operation has not started or has finished, outputs wait to be
    /// drained, or `attempt` is not in flight; nothing changes.
    pub fn handle_success(&mut self, now: Instant, attempt: u64) -> Result<(), HedgeError> {
        self.check(attempt)?;
        self.fresh = 0;
        self.now = self.now.later(now);
        self.in_flight &= !bit(attempt);
        self.winner = Some(attempt);
        self.end(Outcome::Succeeded);
        Ok(())
    }

    /// Attempt `attempt` failed at `now` (X3). A fatal or canceled failure ends the operation
    /// and cancels the rest; a non-fatal one lets the hedging go on: the next attempt starts at
    /// once (when the policy says so), or at the pushback's instant, or never (a pushback past
    /// `max_hint`, or [`Hint::DoNotRetry`]). When no attempt runs any more and none will start,
    /// the operation ends.
    ///
    /// # Errors
    /// As [`handle_success`](Self::handle_success), with the failure handed back; nothing
    /// changes.
    pub fn handle_failure(
        &mut self,
        policy: &HedgePolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<E>,
    ) -> Result<(), Refused<HedgeError, Failure<E>>> {
        if let Err(error) = self.check(attempt) {
            return Err(Refused::new(error, failure));
        }
        let now = self.now.later(now);
        self.now = now;
        self.fresh = 0;
        self.in_flight &= !bit(attempt);
        let kind = failure.kind;
        let failed = LastFailure { class: kind.class(), error: Some(failure.error) };
        // A failure that stops further starts is kept for the outcome it leads to.
        let stops = match kind {
            FailureKind::Hinted(Hint::DoNotRetry) => true,
            FailureKind::Hinted(hint) => Self::hinted_at(hint, now).as_nanos() - now.as_nanos() > policy.max_hint_ns,
            _ => false,
        };
        if stops && self.stop.is_none() {
            self.stop_failure = Some(failed);
        } else {
            self.last_failure = Some(failed);
        }
        match kind {
            FailureKind::Fatal => {
                let failure = self.take_last_failure();
                self.end(Outcome::Fatal { failure });
                return Ok(());
            }
            FailureKind::Canceled => {
                let last_failure = self.last_failure.take();
                self.end(Outcome::Canceled { last_failure });
                return Ok(());
            }
            FailureKind::Hinted(Hint::DoNotRetry) => self.stop(Stop::DoNotRetry),
            FailureKind::Hinted(hint) => {
                let at = Self::hinted_at(hint, now);
                if stops {
                    self.stop(Stop::Deferred(at));
                } else {
                    // Never shortened, by the delay nor by a later failure: no attempt starts
                    // before the pushback's instant (B6).
                    self.not_before = self.not_before.later(at);
                    self.next_at = self.next_at.map(|next| next.later(at));
                }
            }
            _ => {
                if policy.next_on_failure && self.next_at.is_some() {
                    self.next_at = Some(now.later(self.not_before));
                }
            }
        }
        self.advance(policy);
        self.settle();
        Ok(())
    }

    /// The budget refused hedge `attempt`, started by the latest input (X4): it and any later
    /// attempt of the same drain never ran, and no further attempt starts; the attempts that
    /// run go on. When none runs, the operation ends `Rejected`. Report it right after the
    /// drain that named it, before any other input.
    ///
    /// # Errors
    /// [`HedgeError::NothingToReject`] for attempt 1, or an attempt the latest input did not
    /// start, or as [`handle_success`](Self::handle_success); nothing changes.
    pub fn handle_rejected(&mut self, now: Instant, attempt: u64) -> Result<(), HedgeError> {
        self.check(attempt)?;
        // The refused attempt and every later one were started by the latest input.
        let later = (attempt..=u64::from(self.started)).fold(0, |bits, a| bits | bit(a));
        if attempt < 2 || self.fresh & later != later {
            return Err(HedgeError::NothingToReject { attempt });
        }
        self.fresh = 0;
        self.now = self.now.later(now);
        self.in_flight &= !later;
        self.started = attempt as u32 - 1;
        self.stop(Stop::Rejected);
        self.settle();
        Ok(())
    }

    /// Wakes the machine at `now`: the next hedge starts if its time has come (X1). Early,
    /// repeated or spurious calls, undrained ones, and ones before the start or after the
    /// outcome change nothing (not even the machine's `now`). A hedge draws no jitter, so it
    /// takes no RNG.
    pub fn handle_timeout(&mut self, policy: &HedgePolicy, now: Instant) {
        let now = self.now.later(now);
        // Nothing is due before the start or after the outcome (neither has a next hedge).
        let due = self.next_at.is_some_and(|at| at <= now);
        if !due || self.undrained() {
            return;
        }
        self.fresh = 0;
        self.now = now;
        self.advance(policy);
        // Under a policy with fewer attempts than the one the hedge started under, the due
        // hedge may not start: with none running, the operation is over.
        self.settle();
    }

    /// The driver cancels the operation at `now`: every attempt still running is canceled, and
    /// the outcome is `Canceled` with the last failure, if any.
    ///
    /// # Errors
    /// As [`handle_success`](Self::handle_success) without an attempt; nothing changes.
    pub fn handle_cancel(&mut self, now: Instant) -> Result<(), HedgeError> {
        self.check_running()?;
        self.fresh = 0;
        self.now = self.now.later(now);
        let last_failure = self.last_failure.take().or_else(|| self.stop_failure.take());
        self.end(Outcome::Canceled { last_failure });
        Ok(())
    }

    /// The next output, in the documented order; `None` when drained.
    pub fn poll_action(&mut self) -> Option<HedgeAction<E>> {
        if self.pending_cancel != 0 {
            let attempt = take_lowest(&mut self.pending_cancel);
            return Some(HedgeAction::Cancel { attempt });
        }
        if self.pending_start != 0 {
            let attempt = take_lowest(&mut self.pending_start);
            return Some(HedgeAction::Start { attempt });
        }
        let outcome = self.finish.take()?;
        Some(HedgeAction::Finish { outcome, stats: self.stats() })
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the next hedge's start.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.finished.is_some() { None } else { self.next_at }
    }

    /// What it took so far.
    pub fn stats(&self) -> HedgeStats {
        let elapsed = self.started_at.map_or(Duration::ZERO, |at| self.now.saturating_duration_since(at));
        HedgeStats {
            started: u64::from(self.started),
            canceled: u64::from(self.canceled),
            winner: self.winner,
            elapsed,
        }
    }

    /// Attempts started so far.
    pub const fn started(&self) -> u64 {
        self.started as u64
    }

    /// Attempts running now.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight.count_ones()
    }

    /// The latest `now` the machine accepted.
    pub const fn now(&self) -> Instant {
        self.now
    }

    /// How it ended, once it has.
    pub const fn finished(&self) -> Option<OutcomeKind> {
        self.finished
    }

    /// The last failure reported, but for the one that stopped further starts (a pushback),
    /// which is kept for the outcome.
    pub const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.last_failure.as_ref()
    }

    /// When a pushback asks for it: the instant it names.
    fn hinted_at(hint: Hint, now: Instant) -> Instant {
        match hint {
            Hint::After(delay) => now.saturating_add(delay),
            Hint::At(at) => at.later(now),
            Hint::DoNotRetry => now,
        }
    }

    /// Starts every attempt whose time has come: each `delay` after the previous one.
    fn advance(&mut self, policy: &HedgePolicy) {
        while let Some(at) = self.next_at
            && at <= self.now
            && self.stop.is_none()
            && self.started < policy.max_attempts.min(MAX_HEDGED_ATTEMPTS)
        {
            self.started += 1;
            let attempt = u64::from(self.started);
            self.in_flight |= bit(attempt);
            self.pending_start |= bit(attempt);
            self.fresh |= bit(attempt);
            self.next_at = (self.started < policy.max_attempts)
                .then(|| self.now.saturating_add_nanos(policy.delay_ns).later(self.not_before));
        }
        if self.started >= policy.max_attempts {
            self.next_at = None;
        }
    }

    /// No further attempt starts, for `stop` (the first reason is kept).
    fn stop(&mut self, stop: Stop) {
        self.stop.get_or_insert(stop);
        self.next_at = None;
    }

    /// Ends the operation once no attempt runs and none will start.
    fn settle(&mut self) {
        if self.in_flight != 0 || self.next_at.is_some() || self.finish.is_some() {
            return;
        }
        // A pushback that stopped the starts is the outcome's failure; otherwise the last one.
        let stopped_by = self.stop_failure.take();
        let outcome = match (self.stop, stopped_by) {
            (Some(Stop::DoNotRetry), Some(failure)) => Outcome::Fatal { failure },
            (Some(Stop::Deferred(retry_at)), Some(last_failure)) => Outcome::Deferred { retry_at, last_failure },
            (Some(Stop::Rejected), _) => Outcome::Rejected { last_failure: self.take_last_failure() },
            _ => Outcome::Exhausted { last_failure: self.take_last_failure() },
        };
        self.end(outcome);
    }

    /// The outcome is decided: cancel what runs, stop starting, finish.
    fn end(&mut self, outcome: Outcome<E>) {
        self.pending_cancel |= self.in_flight;
        self.canceled += self.in_flight.count_ones();
        self.in_flight = 0;
        self.next_at = None;
        self.finished = Some(outcome.kind());
        self.finish = Some(outcome);
    }

    /// The last failure, moved into an outcome. Every path that ends without a success has one:
    /// only a failure takes an attempt out of flight without ending the operation.
    fn take_last_failure(&mut self) -> LastFailure<E> {
        self.last_failure.take().unwrap_or_else(|| unreachable!("an attempt failed before the outcome"))
    }

    fn undrained(&self) -> bool {
        self.pending_cancel != 0 || self.pending_start != 0 || self.finish.is_some()
    }

    fn check_running(&self) -> Result<(), HedgeError> {
        if let Some(kind) = self.finished {
            return Err(HedgeError::Finished(kind));
        }
        if self.started_at.is_none() {
            return Err(HedgeError::NotStarted);
        }
        if self.undrained() {
            return Err(HedgeError::Undrained);
        }
        Ok(())
    }

    fn check(&self, attempt: u64) -> Result<(), HedgeError> {
        self.check_running()?;
        if attempt == 0 || attempt > u64::from(MAX_HEDGED_ATTEMPTS) || self.in_flight & bit(attempt) == 0 {
            return Err(HedgeError::NotInFlight { attempt });
        }
        Ok(())
    }
}

/// Attempt `attempt`'s bit (attempts are `1..=MAX_HEDGED_ATTEMPTS`; others have none).
const fn bit(attempt: u64) -> u32 {
    if attempt == 0 || attempt > MAX_HEDGED_ATTEMPTS as u64 { 0 } else { 1 << (attempt - 1) }
}

/// The lowest attempt in `bits`, taken out.
fn take_lowest(bits: &mut u32) -> u64 {
    let index = bits.trailing_zeros();
    *bits &= *bits - 1;
    u64::from(index) + 1
}
