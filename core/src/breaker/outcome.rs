//! What a breaker answers and reports: permits and refusals, its status and events, and the
//! caller mistakes it refuses.

#[allow(clippy::wildcard_imports)]
use super::*;

/// How a call went, as reported to [`Breaker::record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CallOutcome {
    /// The call succeeded (it may still be slow).
    Success,
    /// The call failed in a way that says something about the dependency.
    Failure,
    /// The call says nothing about the dependency (canceled by the caller, rejected as
    /// invalid input): the permit is released and nothing is counted.
    Ignored,
}

/// Leave to make one call, from [`Breaker::try_acquire`]; hand it back to [`Breaker::record`].
///
/// A permit is tied to its breaker (the id given to [`Breaker::new`]), to the state it was
/// issued in (a generation that changes on every transition) and to its own id. Recording it
/// after the breaker changed state, twice, or on another breaker is refused ([`BreakerError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a permit must be handed back to `Breaker::record`; a half-open probe's lease otherwise expires as a failure"]
pub struct Permit {
    pub(super) breaker: u32,
    pub(super) generation: u32,
    pub(super) id: u32,
    pub(super) acquired_at: Instant,
}

impl Permit {
    /// When it was issued (the `now` given to [`Breaker::try_acquire`]).
    pub const fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Its id (unique among the permits of its breaker until 2³¹ have been issued).
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// The state generation it was issued in (see [`Breaker::generation`]).
    pub const fn generation(&self) -> u32 {
        self.generation
    }

    /// The id of the breaker that issued it.
    pub const fn breaker(&self) -> u32 {
        self.breaker
    }

    /// Whether it is a half-open probe (its result decides whether the breaker closes).
    pub const fn is_probe(&self) -> bool {
        self.id & PROBE_BIT != 0
    }
}

/// Probe ids have the top bit set, so a closed-state permit is never mistaken for a probe.
pub(super) const PROBE_BIT: u32 = 1 << 31;

/// A refused admission: the breaker is open, isolated, or its half-open probes are all out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[error("the circuit breaker rejected the call (retry after {retry_after:?})")]
pub struct Rejected {
    /// How long until the breaker may admit a call again (K3): until it turns half-open, or
    /// until the earliest probe lease ends. `None` while isolated by hand.
    pub retry_after: Option<Duration>,
}

/// A caller mistake on [`Breaker::record`]; the breaker is left exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum BreakerError {
    /// The permit was issued by another breaker.
    #[error(
        "the permit belongs to breaker {got}, not to this breaker ({this}); record it on the breaker that issued it"
    )]
    Foreign {
        /// This breaker's id.
        this: u32,
        /// The id in the permit.
        got: u32,
    },
    /// The breaker changed state since the permit was issued; its result no longer counts.
    #[error(
        "stale permit from state generation {got} (the breaker is at {current}); its result no longer counts and may be dropped"
    )]
    Stale {
        /// The breaker's generation.
        current: u32,
        /// The generation in the permit.
        got: u32,
    },
    /// The permit was already recorded, or its probe lease already expired. Probes are tracked
    /// one by one; closed-state permits are only counted (a table would cost the closed path
    /// its speed), so a closed permit recorded twice is caught only when no other permit of
    /// the same state is outstanding.
    #[error("permit {id} is not outstanding: already recorded, its lease expired, or never issued")]
    NotOutstanding {
        /// The permit's id.
        id: u32,
    },
    /// A transition by hand ([`Breaker::handle_open`], [`Breaker::handle_half_open`]) that
    /// makes no sense from where the breaker is.
    #[error("a breaker that is {from:?} cannot be moved to {to:?} by hand: {why}")]
    IllegalTransition {
        /// Where the breaker is.
        from: BreakerState,
        /// Where it was asked to go.
        to: BreakerState,
        /// Why not, and what to do instead.
        why: &'static str,
    },
}

/// Where a breaker is (K1); see [`Breaker::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerStatus {
    /// Calls are admitted and counted.
    Closed,
    /// Calls are rejected until `until`.
    Open {
        /// When it turns half-open.
        until: Instant,
    },
    /// Probes are admitted, at most the policy's `half_open_permits` at once (in all, under
    /// [`HalfOpenRule::Rates`]).
    HalfOpen {
        /// Probes in flight.
        permits: u32,
    },
    /// Forced open by hand: every call is rejected until [`Breaker::handle_reset`].
    Isolated,
    /// Forced closed by hand: every call is admitted and nothing is counted until
    /// [`Breaker::handle_reset`].
    Disabled,
    /// Forced closed by hand, still counting: every call is admitted and counted in the window
    /// ([`Breaker::window_counts`]), and no rule trips it, until [`Breaker::handle_reset`].
    MetricsOnly,
}

impl BreakerStatus {
    /// The kind of state, without its details.
    pub const fn state(&self) -> BreakerState {
        match self {
            BreakerStatus::Closed => BreakerState::Closed,
            BreakerStatus::Open { .. } => BreakerState::Open,
            BreakerStatus::HalfOpen { .. } => BreakerState::HalfOpen,
            BreakerStatus::Isolated => BreakerState::Isolated,
            BreakerStatus::Disabled => BreakerState::Disabled,
            BreakerStatus::MetricsOnly => BreakerState::MetricsOnly,
        }
    }
}

/// The kinds of [`BreakerStatus`], as named by [`BreakerError::IllegalTransition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerState {
    /// See [`BreakerStatus::Closed`].
    Closed,
    /// See [`BreakerStatus::Open`].
    Open,
    /// See [`BreakerStatus::HalfOpen`].
    HalfOpen,
    /// See [`BreakerStatus::Isolated`].
    Isolated,
    /// See [`BreakerStatus::Disabled`].
    Disabled,
    /// See [`BreakerStatus::MetricsOnly`].
    MetricsOnly,
}

/// A change of a breaker's state (O1), drained with [`Breaker::poll_event`].
///
/// Only changes of kind are events: closed, open, half-open, isolated, disabled, metrics-only.
/// Probes going out and coming back while half-open are not, nor is a reset of a closed
/// breaker. Each event's `from` is of the kind of the previous event's `to`, and the last
/// event's `to` of the kind of the breaker's [`status`](Breaker::status); `from` and `to` are the
/// statuses at the moment of the change (a half-open breaker's probes out may differ between
/// one event's `to` and the next's `from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct BreakerEvent {
    /// The state the breaker left.
    pub from: BreakerStatus,
    /// The state it entered; `Open { until }` says until when it rejects calls.
    pub to: BreakerStatus,
    /// When: the `now` of the input that made the change, or, for an expired probe lease, the
    /// lease's deadline.
    pub at: Instant,
    /// The generation of the state entered ([`Breaker::generation`]); it grows with every
    /// change, so events heard out of order can be put back in order.
    pub generation: u32,
    /// Which rule made the change.
    pub reason: BreakerReason,
}

impl BreakerEvent {
    /// For an opening, how long the breaker rejects calls (`until − at`, drawn from the open
    /// backoff, K3); `None` for every other change.
    pub const fn open_for(&self) -> Option<Duration> {
        match self.to {
            BreakerStatus::Open { until } => Some(until.saturating_duration_since(self.at)),
            _ => None,
        }
    }
}

/// Why a breaker changed state, as told by its [`BreakerEvent`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum BreakerReason {
    /// Opened: the consecutive-failure rule held (K2).
    ConsecutiveFailures,
    /// Opened: the failure rate reached the policy's, over the closed window's calls or, under
    /// [`HalfOpenRule::Rates`], over the half-open probes' answers.
    FailureRate,
    /// Opened: the slow-call rate reached the policy's, over the same calls.
    SlowCallRate,
    /// Reopened: a probe failed, or was slow, under [`HalfOpenRule::FirstFailure`] (K4).
    ProbeFailed,
    /// Reopened: a probe's lease ran out before its result came, under
    /// [`HalfOpenRule::FirstFailure`] (counted as a failure at the lease's deadline, K4).
    ProbeExpired,
    /// Closed: enough probes succeeded.
    ProbesSucceeded,
    /// Half-open: the open period ended.
    OpenPeriodEnded,
    /// A change made by hand: `handle_open`, `handle_half_open`, `handle_isolate`,
    /// `handle_disable`, `handle_metrics_only` or `handle_reset`.
    ByHand,
}
