//! A circuit breaker that cannot wedge (rules K1–K5).
//!
//! A [`BreakerPolicy`] is the shared, immutable configuration: when to trip, how long to stay
//! open, how many probes to let through while half-open and how long each probe may take. A
//! [`Breaker`] is one dependency's state: fixed-size plain data (no allocation, no clock, no
//! RNG inside), so it can be cloned, compared and persisted.
//!
//! Admission is a query plus a recorded permit (K5): [`Breaker::try_acquire`] answers with a
//! [`Permit`] or a [`Rejected`] carrying `retry_after`; the caller makes the call and hands the
//! permit back with its outcome to [`Breaker::record`]. A permit names its breaker, the state
//! generation it was issued in and its own id, so a stale or foreign permit is refused as misuse
//! ([`BreakerError`]) and changes nothing.
//!
//! The closed path (admission + record) allocates nothing and is O(1): a consecutive-failure
//! counter, plus, when a rate rule is configured, one two-bit slot of a fixed ring (count
//! window) or one bucket (time window, with a division only when a new bucket starts).

mod load;
mod outcome;
mod policy;
mod window;

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState};
use crate::outbox::Outbox;
use crate::time::{nanos_of, saturating_nanos};
use crate::{Instant, PolicyError};

pub use outcome::{
    BreakerError, BreakerEvent, BreakerReason, BreakerState, BreakerStatus, CallOutcome, Permit, Rejected,
};
pub use policy::{
    BreakerPolicy, BreakerPolicyBuilder, BreakerWindow, HalfOpenRule, MAX_PERMITS, MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS,
};
pub use window::WindowCounts;
#[allow(clippy::wildcard_imports)]
use {outcome::*, policy::*, window::*};

/// `repr(u8)`: an explicit tag byte, so telling closed from the rest is one compare (without
/// it the tag hides in `Ring`'s niche and every call decodes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[repr(u8)]
enum Phase {
    Closed(Window),
    Open { until: Instant },
    HalfOpen(Probes),
    Isolated,
    Disabled,
    MetricsOnly(Window),
}

/// One dependency's circuit breaker (rules K1–K5).
///
/// # Driving it
///
/// Before each call, [`try_acquire`](Self::try_acquire): a [`Permit`] means make the call, a
/// [`Rejected`] means don't (and says when to ask again). After the call,
/// [`record`](Self::record) the permit with its [`CallOutcome`]. Wake the breaker at
/// [`poll_timeout`](Self::poll_timeout) with [`handle_timeout`](Self::handle_timeout): the end
/// of the open period, or the earliest probe lease. Every verb also does the work that is due,
/// so a driver that never calls `handle_timeout` still cannot wedge the breaker: the next
/// `try_acquire` turns it half-open, and expires overdue probe leases as failures (K4).
///
/// Its decisions are the results of `try_acquire`, and its state is [`status`](Self::status).
/// Transitions happen only inside `try_acquire`, `record`, `handle_timeout` and the manual
/// `handle_open` / `handle_half_open` / `handle_isolate` / `handle_disable` /
/// `handle_metrics_only` / `handle_reset`; each one is told as a [`BreakerEvent`], with its
/// reason, drained with [`poll_event`](Self::poll_event) (O1).
///
/// **Drain order.** Events come out in the order they happened. One input makes at most three
/// (a probe lease noticed late reopens the breaker, its open period has already ended, and a
/// hand-made change follows); up to four wait, and a fifth pushes the oldest out, counted by
/// [`dropped_events`](Self::dropped_events). Drain after every input to lose none. Draining
/// costs nothing when there is nothing to drain; a breaker nobody drains pays nothing on the
/// closed path either (events are written on transitions only). Events are outputs, not state:
/// a serialized breaker leaves them out.
///
/// **States** (K1): `Closed` → (a trip rule holds, K2) → `Open { until }` → (at `until`) →
/// `HalfOpen` → (`successes_to_close` successful probes) → `Closed`, or (one failed or expired
/// probe) → `Open` again, for the next, longer open duration of the backoff (K3); under
/// [`HalfOpenRule::Rates`], half-open instead waits for `half_open_permits` answers and decides
/// by their rates. `Isolated`, `Disabled` and `MetricsOnly` are set and left by hand, and a
/// breaker can be opened or turned half-open by hand (`handle_open`, `handle_half_open`).
///
/// **Time.** Every input takes `now`; a `now` earlier than the latest accepted one is read as
/// that latest one. A probe lease that expired is counted as a failure at its deadline, also
/// when the breaker only notices later, so the state does not depend on how promptly
/// `handle_timeout` was called. `handle_timeout` early or twice changes nothing.
///
/// **Misuse** (a permit from another breaker, from an earlier state, or recorded twice)
/// returns a [`BreakerError`] and leaves the breaker exactly as it was (G12).
///
/// **Another policy.** A breaker is plain data and may outlive its policy (persisted, then
/// loaded under a new one). The thresholds, permits and `successes_to_close` of the policy it
/// is driven under apply at once (a half-open breaker holding more probes than the new
/// `half_open_permits` admits no more until enough return); an open period or a probe lease
/// already set is kept, and the new open durations and leases apply from the next opening or
/// probe. A closed window built for another
/// window shape (another kind, length, span or bucket count, or none where a rate rule now
/// needs one) is rebuilt empty at the next recorded call, keeping the consecutive failures: a
/// rate is never computed over calls counted under another shape. A loaded state is validated
/// (`serde`): one that no sequence of calls could have made is refused.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, Breaker, BreakerPolicy, BreakerStatus, CallOutcome, Instant};
/// use rand_core::SeedableRng;
///
/// let policy = BreakerPolicy::builder(Backoff::constant(Duration::from_secs(5)).build()?)
///     .consecutive_failures(2)
///     .build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut breaker = Breaker::new(&policy, 7);
/// let now = Instant::from_secs(100);
/// for _ in 0..2 {
///     let permit = breaker.try_acquire(&policy, now, &mut rng)?;
///     breaker.record(&policy, now, permit, CallOutcome::Failure, &mut rng)?;
/// }
/// assert_eq!(breaker.status(), BreakerStatus::Open { until: Instant::from_secs(105) });
/// let rejected = breaker.try_acquire(&policy, Instant::from_secs(101), &mut rng).unwrap_err();
/// assert_eq!(rejected.retry_after, Some(Duration::from_secs(4)));
///
/// // At `until` one probe goes through; its success closes the breaker.
/// let probe = breaker.try_acquire(&policy, Instant::from_secs(105), &mut rng)?;
/// assert_eq!(breaker.status(), BreakerStatus::HalfOpen { permits: 1 });
/// breaker.record(&policy, Instant::from_secs(106), probe, CallOutcome::Success, &mut rng)?;
/// assert_eq!(breaker.status(), BreakerStatus::Closed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Breaker {
    id: u32,
    generation: u32,
    /// The next permit id (probe ids are drawn from the same counter, with [`PROBE_BIT`]).
    next_id: u32,
    /// Closed or disabled: `next_id` when this generation began, plus the permits recorded
    /// since (mod 2^31), so `next_id − settled` permits are outstanding. Only `record` writes
    /// it and only `try_acquire` writes `next_id`: one store each per call on the closed path.
    settled: u32,
    last_now: Instant,
    openings: BackoffState,
    phase: Phase,
    /// Undrained transitions (outputs, not state: never serialized).
    #[cfg_attr(feature = "serde", serde(skip))]
    events: Outbox<BreakerEvent, 4>,
}

impl Breaker {
    /// A closed breaker with an empty window. `id` tells its permits apart from other
    /// breakers' (any value unique among the breakers a permit could be confused with).
    pub fn new(policy: &BreakerPolicy, id: u32) -> Self {
        Breaker {
            id,
            generation: 0,
            next_id: 0,
            settled: 0,
            last_now: Instant::ZERO,
            openings: BackoffState::new(),
            phase: Phase::Closed(Window::new(policy)),
            events: Outbox::new(),
        }
    }

    /// Asks to make one call at `now` (K5). Closed or disabled: a permit. Open: a permit for
    /// the first probe once `until` has passed (the breaker turns half-open), a [`Rejected`]
    /// before. Half-open: a probe permit while fewer than `half_open_permits` are out (K4),
    /// after expiring overdue leases as failures (a reopening whose open period has already
    /// ended admits the probe at once). Isolated: rejected.
    ///
    /// `rng` is drawn from only when an expired probe lease reopens the breaker (jitter of
    /// the open duration).
    ///
    /// # Errors
    /// [`Rejected`], with the time until the breaker may admit a call again.
    #[inline]
    pub fn try_acquire<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<Permit, Rejected> {
        match self.phase {
            Phase::Closed(_) => Ok(self.issue(now)),
            // Open and not yet due: nothing changes.
            Phase::Open { until } if now < until && self.last_now < until => {
                Err(Rejected { retry_after: Some(until.saturating_duration_since(self.last_now.later(now))) })
            }
            _ => {
                let id = self.acquire_slow(policy, now, rng)?;
                let acquired_at = if id & PROBE_BIT != 0 { self.last_now } else { now };
                Ok(Permit { breaker: self.id, generation: self.generation, id, acquired_at })
            }
        }
    }

    /// A closed or disabled state's permit.
    #[inline]
    fn issue(&mut self, now: Instant) -> Permit {
        let id = self.next_id;
        self.next_id = id.wrapping_add(1) & !PROBE_BIT;
        Permit { breaker: self.id, generation: self.generation, id, acquired_at: now }
    }

    /// Every state but closed. Returns the permit's id only (a probe's was acquired at
    /// `last_now`, a disabled breaker's at `now`): 16 bytes come back in registers, where a
    /// whole `Result<Permit, _>` would come back through memory and make the caller's closed
    /// path build its permit in memory too.
    #[cold]
    fn acquire_slow<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<u32, Rejected> {
        if let Phase::Disabled | Phase::MetricsOnly(_) = self.phase {
            return Ok(self.issue(now).id);
        }
        let now = self.last_now.later(now);
        self.settle(policy, now, rng);
        match &mut self.phase {
            Phase::HalfOpen(probes) => {
                let cap = policy.permits.min(MAX_PERMITS);
                // Under the rates rule the probes that answered keep their places: `cap` in all.
                let taken = match policy.half_open {
                    HalfOpenRule::FirstFailure => probes.held(),
                    HalfOpenRule::Rates => probes.held().saturating_add(probes.answered),
                };
                if taken >= cap && probes.busy != 0 {
                    // A place frees when a lease ends (first failure); under the rates rule the
                    // breaker decides, at the latest, when the last lease ends.
                    let next = match policy.half_open {
                        HalfOpenRule::FirstFailure => probes.earliest(),
                        HalfOpenRule::Rates => probes.latest(),
                    };
                    let next = next.unwrap_or(now);
                    return Err(Rejected { retry_after: Some(next.saturating_duration_since(now)) });
                }
                let slot = (!probes.busy).trailing_zeros() as usize % LEASES;
                let id = self.next_id | PROBE_BIT;
                self.next_id = self.next_id.wrapping_add(1) & !PROBE_BIT;
                probes.busy |= 1 << slot;
                probes.ids[slot] = id;
                probes.deadlines[slot] = now.saturating_add_nanos(policy.probe_timeout_ns);
                self.last_now = now;
                Ok(id)
            }
            Phase::Open { until } => Err(Rejected { retry_after: Some(until.saturating_duration_since(now)) }),
            Phase::Isolated => Err(Rejected { retry_after: None }),
            // Unreachable: closed, disabled and metrics-only are admitted above.
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                Err(Rejected { retry_after: Some(Duration::ZERO) })
            }
        }
    }

    /// Records the outcome of the call made with `permit`, measuring its duration as
    /// `now − permit.acquired_at()` (a call taking at least the policy's
    /// `slow_call_threshold` is slow). Closed: counted in the window; the breaker opens when
    /// a trip rule holds (K2), for the next open duration drawn from `rng` (K3). Half-open:
    /// a failure (or a slow call, when a slow-call rate is configured) reopens it; the
    /// `successes_to_close`-th success closes it (K4). Disabled: nothing is counted.
    ///
    /// # Errors
    /// [`BreakerError`] when the permit is foreign, stale (the breaker changed state since)
    /// or not outstanding (see [`BreakerError::NotOutstanding`] for what is detected); nothing
    /// changes.
    #[inline]
    pub fn record<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let elapsed = now.as_nanos().saturating_sub(permit.acquired_at.as_nanos());
        self.record_ns(policy, now, permit, outcome, elapsed, rng)
    }

    /// [`record`](Self::record) with the call's duration measured by the caller.
    ///
    /// # Errors
    /// As [`record`](Self::record); nothing changes.
    #[inline]
    pub fn record_with_duration<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        duration: Duration,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        self.record_ns(policy, now, permit, outcome, saturating_nanos(duration), rng)
    }

    #[inline]
    fn record_ns<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        permit: Permit,
        outcome: CallOutcome,
        elapsed_ns: u64,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        if permit.breaker != self.id || permit.generation != self.generation {
            return Err(self.misfit(permit.breaker, permit.generation));
        }
        if let Phase::Closed(window) = &mut self.phase {
            // Closed permits are counted, not tracked one by one (that would take a table).
            settle_closed_permit(self.next_id, &mut self.settled, permit.id)?;
            if outcome == CallOutcome::Ignored {
                return Ok(());
            }
            if window.key != policy.window_key {
                window.rebuild(policy);
            }
            if window.push(policy, now, outcome == CallOutcome::Failure, elapsed_ns >= policy.slow_ns) {
                let reason = window.trip_reason(policy);
                self.open(policy, now, reason, rng);
            }
            return Ok(());
        }
        self.record_slow(policy, now, permit.id, outcome, elapsed_ns, rng)
    }

    /// Why a permit from another breaker or generation is refused.
    #[cold]
    fn misfit(&self, breaker: u32, generation: u32) -> BreakerError {
        if breaker != self.id {
            BreakerError::Foreign { this: self.id, got: breaker }
        } else {
            BreakerError::Stale { current: self.generation, got: generation }
        }
    }

    /// `record` in every state but closed.
    #[cold]
    fn record_slow<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        id: u32,
        outcome: CallOutcome,
        elapsed_ns: u64,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        match &mut self.phase {
            Phase::Disabled => settle_closed_permit(self.next_id, &mut self.settled, id),
            Phase::MetricsOnly(window) => {
                settle_closed_permit(self.next_id, &mut self.settled, id)?;
                if outcome != CallOutcome::Ignored {
                    if window.key != policy.window_key {
                        window.rebuild(policy);
                    }
                    // Counted, never tripping.
                    let _ = window.push(policy, now, outcome == CallOutcome::Failure, elapsed_ns >= policy.slow_ns);
                }
                Ok(())
            }
            Phase::HalfOpen(probes) => {
                let Some(slot) = probes.slot_of(id) else {
                    return Err(BreakerError::NotOutstanding { id });
                };
                let now = self.last_now.later(now);
                // A lease that ended before its result came is the failure it already was; this
                // permit's result no longer counts, whether the expiry moved the breaker on
                // (first failure) or only counted the lease as an answer (rates).
                let generation = self.generation;
                self.settle(policy, now, rng);
                self.last_now = now;
                if self.generation != generation {
                    return Ok(());
                }
                let Phase::HalfOpen(probes) = &mut self.phase else { return Ok(()) };
                if probes.slot_of(id) != Some(slot) {
                    return Ok(());
                }
                probes.busy &= !(1 << slot);
                let slow = policy.slow_ppm != NEVER && elapsed_ns >= policy.slow_ns;
                let failed = match outcome {
                    CallOutcome::Ignored => return Ok(()),
                    CallOutcome::Failure => true,
                    CallOutcome::Success => false,
                };
                match policy.half_open {
                    HalfOpenRule::FirstFailure if failed || slow => {
                        self.open(policy, now, BreakerReason::ProbeFailed, rng);
                    }
                    HalfOpenRule::FirstFailure => {
                        probes.successes = probes.successes.saturating_add(1);
                        if probes.successes >= policy.close_after {
                            self.close(policy, BreakerReason::ProbesSucceeded);
                        }
                    }
                    HalfOpenRule::Rates => {
                        probes.answer(failed, slow);
                        self.judge(policy, now, rng);
                    }
                }
                Ok(())
            }
            // No permit is issued in these states, and entering them changed the generation;
            // closed is handled by `record_ns`.
            Phase::Open { .. } | Phase::Isolated | Phase::Closed(_) => Err(BreakerError::NotOutstanding { id }),
        }
    }

    /// Wakes the breaker: at the end of the open period it turns half-open; an expired probe
    /// lease counts as a failure and reopens it (K4), at the lease's deadline, so if that open
    /// period has ended by `now` too it is half-open again at once. Early, repeated or spurious
    /// calls change nothing.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        let now = self.last_now.later(now);
        self.settle(policy, now, rng);
    }

    /// Does all the work due at `now`: expires overdue probe leases (reopening the breaker at
    /// the earliest deadline), then turns an open breaker whose open period has ended
    /// half-open. Both in one call, so that the state at `now` does not depend on how often, or
    /// how promptly, the driver woke the breaker: a reopening whose open period already ended
    /// by `now` (a zero open duration, or a lease noticed late) is half-open at once.
    fn settle<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        if let Phase::HalfOpen(_) = self.phase {
            self.expire(policy, now, rng);
        }
        if let Phase::Open { until } = self.phase
            && until <= now
        {
            self.last_now = now;
            self.enter(Phase::HalfOpen(Probes::new()), BreakerReason::OpenPeriodEnded);
        }
    }

    /// Opens the breaker by hand, as a trip rule would: for the next open duration of the
    /// backoff (counted as an opening, K3), after which it turns half-open on its own.
    /// Outstanding permits become stale. The work due at `now` is done first (as by
    /// [`handle_timeout`](Self::handle_timeout)), so the transition starts from the state the
    /// breaker is in at `now`.
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] when it is open already, or metrics-only (a state
    /// that never trips: leave it with [`handle_reset`](Self::handle_reset) first); nothing
    /// changes, not even the work due (though `rng` may have been drawn from, when that work
    /// would have reopened the breaker).
    pub fn handle_open<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let (mut next, now) = self.settled_copy(policy, now, rng);
        let why = match next.phase {
            Phase::Open { .. } => "it is open already; `handle_half_open` ends the open period early",
            Phase::MetricsOnly(_) => {
                "a metrics-only breaker never trips; leave it with `handle_reset` (closed) or `handle_isolate` (forced open)"
            }
            _ => {
                next.open(policy, now, BreakerReason::ByHand, rng);
                *self = next;
                return Ok(());
            }
        };
        Err(next.illegal(BreakerState::Open, why))
    }

    /// Turns the breaker half-open by hand: the open period (or the isolation) ends now, and
    /// probes are admitted as if it had ended on its own (K4). Outstanding permits become
    /// stale. The work due at `now` is done first, as by [`handle_open`](Self::handle_open).
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] unless the breaker is open or isolated: a closed,
    /// disabled or metrics-only breaker admits every call, so there is nothing to probe, and a
    /// half-open one is half-open already; nothing changes.
    pub fn handle_half_open<R: Rng + ?Sized>(
        &mut self,
        policy: &BreakerPolicy,
        now: Instant,
        rng: &mut R,
    ) -> Result<(), BreakerError> {
        let (mut next, now) = self.settled_copy(policy, now, rng);
        let why = match next.phase {
            Phase::Open { .. } | Phase::Isolated => {
                next.last_now = now;
                next.enter(Phase::HalfOpen(Probes::new()), BreakerReason::ByHand);
                *self = next;
                return Ok(());
            }
            Phase::HalfOpen(_) => "it is half-open already",
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                "it admits every call, so there is nothing to probe; `handle_open` opens it"
            }
        };
        Err(next.illegal(BreakerState::HalfOpen, why))
    }

    /// This breaker as it is at `now` once the work due is done, leaving `self` as it is (a
    /// transition by hand that is refused changes nothing), and `now` clamped.
    fn settled_copy<R: Rng + ?Sized>(&self, policy: &BreakerPolicy, now: Instant, rng: &mut R) -> (Breaker, Instant) {
        let now = self.last_now.later(now);
        let mut next = *self;
        next.settle(policy, now, rng);
        next.last_now = now;
        (next, now)
    }

    /// The refusal of a transition by hand to `to`.
    #[cold]
    fn illegal(&self, to: BreakerState, why: &'static str) -> BreakerError {
        BreakerError::IllegalTransition { from: self.status().state(), to, why }
    }

    /// Forces the breaker closed by hand but keeps counting (resilience4j's `METRICS_ONLY`):
    /// every call is admitted and counted in a fresh window ([`window_counts`](Self::window_counts)),
    /// and no rule trips it, until [`handle_reset`](Self::handle_reset). Outstanding permits
    /// become stale.
    pub fn handle_metrics_only(&mut self, policy: &BreakerPolicy, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::MetricsOnly(Window::new(policy)), BreakerReason::ByHand);
    }

    /// Forces the breaker open by hand (K1): every call is rejected until
    /// [`handle_reset`](Self::handle_reset). Outstanding permits become stale.
    pub fn handle_isolate(&mut self, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Isolated, BreakerReason::ByHand);
    }

    /// Forces the breaker closed by hand (K1): every call is admitted and nothing is counted
    /// until [`handle_reset`](Self::handle_reset). Outstanding permits become stale.
    pub fn handle_disable(&mut self, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Disabled, BreakerReason::ByHand);
    }

    /// Closes the breaker by hand, from any state, and returns it to automatic operation:
    /// closed, with an empty window and the open durations starting over. Outstanding permits
    /// become stale.
    pub fn handle_reset(&mut self, policy: &BreakerPolicy, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.close(policy, BreakerReason::ByHand);
    }

    /// Closes, with an empty window and the open durations starting over.
    fn close(&mut self, policy: &BreakerPolicy, reason: BreakerReason) {
        self.openings.reset();
        self.enter(Phase::Closed(Window::new(policy)), reason);
    }

    /// Under [`HalfOpenRule::Rates`], once every probe has answered: reopens (from `at`) if
    /// their failure or slow-call rate reaches the policy's, closes otherwise.
    fn judge<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, at: Instant, rng: &mut R) {
        let Phase::HalfOpen(probes) = &self.phase else { return };
        if policy.half_open != HalfOpenRule::Rates || probes.answered < policy.permits.min(MAX_PERMITS) {
            return;
        }
        let answered = u64::from(probes.answered);
        if u64::from(probes.failed) * PPM >= policy.failure_ppm * answered {
            self.open(policy, at, BreakerReason::FailureRate, rng);
        } else if u64::from(probes.slow) * PPM >= policy.slow_ppm * answered {
            self.open(policy, at, BreakerReason::SlowCallRate, rng);
        } else {
            self.last_now = self.last_now.later(at);
            self.close(policy, BreakerReason::ProbesSucceeded);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the end of the open period,
    /// or the earliest probe lease; `None` otherwise. A pure query.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Open { until } => Some(*until),
            Phase::HalfOpen(probes) => probes.earliest(),
            Phase::Closed(_) | Phase::Isolated | Phase::Disabled | Phase::MetricsOnly(_) => None,
        }
    }

    /// The oldest undrained [`BreakerEvent`]: the transitions made so far, in the order they
    /// happened (O1).
    #[inline]
    pub fn poll_event(&mut self) -> Option<BreakerEvent> {
        self.events.pop()
    }

    /// Events pushed out unseen because more than four waited (see the drain order above);
    /// stays 0 for a driver that drains after every input.
    pub const fn dropped_events(&self) -> u32 {
        self.events.dropped()
    }

    /// Where the breaker is (K1).
    pub fn status(&self) -> BreakerStatus {
        match &self.phase {
            Phase::Closed(_) => BreakerStatus::Closed,
            Phase::Open { until } => BreakerStatus::Open { until: *until },
            Phase::HalfOpen(probes) => BreakerStatus::HalfOpen { permits: probes.held() },
            Phase::Isolated => BreakerStatus::Isolated,
            Phase::Disabled => BreakerStatus::Disabled,
            Phase::MetricsOnly(_) => BreakerStatus::MetricsOnly,
        }
    }

    /// This breaker's id, as carried by its permits.
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The latest `now` the breaker accepted.
    pub const fn now(&self) -> Instant {
        self.last_now
    }

    /// The state generation: it changes on every transition, which makes older permits stale.
    pub const fn generation(&self) -> u32 {
        self.generation
    }

    /// Consecutive failures counted while closed or metrics-only (zero in any other state).
    pub const fn consecutive_failures(&self) -> u32 {
        match &self.phase {
            Phase::Closed(window) | Phase::MetricsOnly(window) => window.consecutive,
            _ => 0,
        }
    }

    /// Permits of the current state that are out and not yet recorded: closed or disabled,
    /// the calls admitted and not yet recorded (mod 2^31); half-open, the probes out; open
    /// and isolated, none. A permit of an earlier state is stale and not counted. A caller
    /// that records or releases every permit sees this return to 0 when its calls are done.
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Backoff, Breaker, BreakerPolicy, CallOutcome, Instant, SplitMix64};
    ///
    /// let open = Backoff::constant(Duration::from_secs(5)).build()?;
    /// let policy = BreakerPolicy::builder(open).consecutive_failures(1).build()?;
    /// let (mut breaker, mut rng) = (Breaker::new(&policy, 0), SplitMix64::new(1));
    /// let now = Instant::from_secs(1);
    /// let a = breaker.try_acquire(&policy, now, &mut rng)?;
    /// let b = breaker.try_acquire(&policy, now, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 2);
    /// breaker.record(&policy, now, a, CallOutcome::Ignored, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 1);
    /// // `b` fails and opens the breaker: nothing of the closed state is out any more.
    /// breaker.record(&policy, now, b, CallOutcome::Failure, &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 0);
    /// // Half-open, the probe is the one permit out.
    /// let _probe = breaker.try_acquire(&policy, Instant::from_secs(6), &mut rng)?;
    /// assert_eq!(breaker.outstanding_permits(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn outstanding_permits(&self) -> u32 {
        match &self.phase {
            Phase::Closed(_) | Phase::Disabled | Phase::MetricsOnly(_) => {
                closed_permits_out(self.next_id, self.settled)
            }
            Phase::HalfOpen(probes) => probes.held(),
            Phase::Open { .. } | Phase::Isolated => 0,
        }
    }

    /// Consecutive openings since the breaker last closed (the backoff's failure count, K3).
    pub const fn openings(&self) -> u32 {
        self.openings.failures()
    }

    /// Closed or metrics-only: the calls, failures and slow calls in the window, and the
    /// consecutive failures. A policy without a rate rule (consecutive failures only) keeps no
    /// window: its calls, failures and slow calls stay 0.
    pub fn window_counts(&self) -> Option<WindowCounts> {
        match &self.phase {
            Phase::Closed(w) | Phase::MetricsOnly(w) => Some(WindowCounts {
                calls: w.calls,
                failures: w.failures,
                slow: w.slow,
                consecutive_failures: w.consecutive,
            }),
            _ => None,
        }
    }

    /// Half-open: expires every lease whose deadline is at or before `now`, as a failure at
    /// its deadline, in deadline order. Under [`HalfOpenRule::FirstFailure`] the earliest one
    /// reopens the breaker; under [`HalfOpenRule::Rates`] each is an answer, and the one that
    /// completes the probes decides at its deadline (as does a breaker that already holds all
    /// its answers, say under a policy with fewer permits than the one it was made under).
    fn expire<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, now: Instant, rng: &mut R) {
        let mut expired = false;
        while let Phase::HalfOpen(probes) = &mut self.phase {
            let Some((slot, deadline)) = probes.earliest_slot().filter(|&(_, d)| d <= now) else { break };
            expired = true;
            if policy.half_open == HalfOpenRule::FirstFailure {
                self.open(policy, deadline, BreakerReason::ProbeExpired, rng);
                break;
            }
            probes.busy &= !(1 << slot);
            probes.answer(true, false);
            self.judge(policy, deadline, rng);
        }
        self.judge(policy, now, rng);
        if expired {
            self.last_now = self.last_now.later(now);
        }
    }

    /// Opens for the next open duration of the backoff, counted from `at`.
    #[cold]
    fn open<R: Rng + ?Sized>(&mut self, policy: &BreakerPolicy, at: Instant, reason: BreakerReason, rng: &mut R) {
        let at = self.last_now.later(at);
        let delay = self.openings.next_delay_ns(&policy.open, rng);
        let until = at.saturating_add_nanos(delay);
        self.last_now = at;
        self.enter(Phase::Open { until }, reason);
    }

    /// Moves to `phase` at `last_now` (a new generation), and tells the change of kind, if it
    /// is one, as an event.
    fn enter(&mut self, phase: Phase, reason: BreakerReason) {
        let from = self.status();
        self.phase = phase;
        self.generation = self.generation.wrapping_add(1);
        self.settled = self.next_id;
        let to = self.status();
        if from.state() != to.state() {
            self.events.push(BreakerEvent { from, to, at: self.last_now, generation: self.generation, reason });
        }
    }
}

/// Counts a closed or disabled permit as recorded, if one is outstanding (`next_id − settled`,
/// mod 2^31). Wraps (and then refuses a valid permit) only with 2^31 permits of one state
/// outstanding at once.
#[inline]
fn settle_closed_permit(next_id: u32, settled: &mut u32, id: u32) -> Result<(), BreakerError> {
    if closed_permits_out(next_id, *settled) == 0 {
        return Err(BreakerError::NotOutstanding { id });
    }
    *settled = settled.wrapping_add(1) & !PROBE_BIT;
    Ok(())
}

/// Closed or disabled permits issued and not yet recorded: `next_id − settled`, mod 2^31.
#[inline]
const fn closed_permits_out(next_id: u32, settled: u32) -> u32 {
    next_id.wrapping_sub(settled) & !PROBE_BIT
}
