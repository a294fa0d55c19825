//! The failure decision every machine shares (B6, R3, S3, F3): given a failure's class and the
//! streak so far, stop (and why), or wait (and how long).
//!
//! [`Retry`](crate::Retry) and [`Supervision`](crate::Supervision) decide through the attempt
//! engine, [`Flow`](crate::Flow) directly; each maps the decision to its own outcome or status,
//! in this order (the first row that applies decides):
//!
//! | the failure | decision | retry | supervision | flow |
//! |---|---|---|---|---|
//! | `Fatal`, `DoNotRetry` | stop | `Fatal` | `Fatal` | tripped (`Fatal` / `DoNotRetry`) |
//! | `Canceled` | stop, streak unchanged | `Canceled` | `Canceled` | idle (F4) |
//! | retryable, streak past the limit (a hint or not) | stop | `Exhausted` | `Failed` / `TimedOut` | tripped (`Streak`) |
//! | a hint past `max_hint` | stop, with the hinted instant | `Deferred` | `Deferred` | tripped (`Deferred`) |
//! | a hint within `max_hint` | wait exactly the hint (never less) | sleep | backoff | window |
//! | any other retryable failure | wait the next delay of the schedule (a `Throttled` one, of the throttling schedule if the policy has one) | sleep | backoff | window |

use core::time::Duration;

use rand_core::Rng;

use crate::backoff::{Backoff, BackoffState};
use crate::failure::{FailureKind, Hint};
use crate::time::saturating_nanos;
use crate::{Instant, PolicyError};

/// The longest hinted delay honoured unless a policy says otherwise (B6): five minutes.
///
/// A server that asks for more (a `Retry-After: 3600`) ends the operation at once with an
/// outcome that carries the hinted instant, so the caller can come back then, instead of
/// holding a task, a connection or a request open for an hour. Set `max_hint` to
/// [`Duration::MAX`] to honour any hint.
pub const DEFAULT_MAX_HINT: Duration = Duration::from_secs(300);

/// [`DEFAULT_MAX_HINT`], for the `serde(default)` of the builders' `max_hint`.
#[cfg(feature = "serde")]
pub(crate) const fn default_max_hint() -> Duration {
    DEFAULT_MAX_HINT
}

/// A `max_hint` as persisted: a duration, or `null` — what a policy saved before the default
/// existed held for "honour any hint", read as [`Duration::MAX`].
#[cfg(feature = "serde")]
pub(crate) fn max_hint_or_any<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let max_hint: Option<Duration> = serde::Deserialize::deserialize(deserializer)?;
    Ok(max_hint.unwrap_or(Duration::MAX))
}

/// What a machine needs to decide a failure: the schedule, the streak limit and the hint rule.
/// Part of every policy that retries ([`RetryPolicy`](crate::RetryPolicy),
/// [`SupervisionPolicy`](crate::SupervisionPolicy), [`FlowPolicy`](crate::FlowPolicy)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FailureRules {
    pub(crate) backoff: Backoff,
    /// The schedule of [`FailureKind::Throttled`] failures, when it differs (the AWS SDKs back
    /// off throttling from a longer base); `None`: `backoff`. Both count the same streak.
    pub(crate) throttling_backoff: Option<Backoff>,
    /// Failures of one streak that are followed by another try; `u64::MAX`: every one (the
    /// streak, a `u32`, never reaches it).
    pub(crate) retries_allowed: u64,
    /// The longest hinted delay honoured; `u64::MAX` for any.
    pub(crate) max_hint_ns: u64,
    /// Whether the schedule starts over from its first delay after a hinted delay.
    pub(crate) restart_after_hint: bool,
}

impl FailureRules {
    /// Rules with the default hint rule ([`DEFAULT_MAX_HINT`], no restart).
    pub(crate) const fn new(backoff: Backoff, retries_allowed: u64) -> Self {
        FailureRules {
            backoff,
            throttling_backoff: None,
            retries_allowed,
            max_hint_ns: DEFAULT_MAX_HINT.as_secs() * 1_000_000_000,
            restart_after_hint: false,
        }
    }

    /// Rules from a builder's settings: `max_hint` is validated ([`max_hint_ns`]).
    pub(crate) fn build(
        backoff: Backoff,
        retries_allowed: u64,
        max_hint: Duration,
        restart_after_hint: bool,
    ) -> Result<Self, PolicyError> {
        Ok(FailureRules {
            backoff,
            throttling_backoff: None,
            retries_allowed,
            max_hint_ns: max_hint_ns(max_hint)?,
            restart_after_hint,
        })
    }

    /// The hint limit as configured: [`Duration::MAX`] for "any hint".
    pub(crate) fn max_hint(&self) -> Duration {
        max_hint_of(self.max_hint_ns)
    }
}

/// A hint limit in nanoseconds as configured: [`Duration::MAX`] for "any hint" (`u64::MAX`).
pub(crate) const fn max_hint_of(max_hint_ns: u64) -> Duration {
    if max_hint_ns == u64::MAX { Duration::MAX } else { Duration::from_nanos(max_hint_ns) }
}

/// `max_hint` in nanoseconds, as every policy reads it: `Duration::MAX` (or anything past
/// `u64::MAX` ns) honours any hint; zero is refused.
pub(crate) fn max_hint_ns(max_hint: Duration) -> Result<u64, PolicyError> {
    if max_hint.is_zero() {
        return Err(PolicyError::Zero {
            setting: "max_hint",
            why: "every hint would end the operation; use Duration::MAX to honour any hint",
        });
    }
    Ok(saturating_nanos(max_hint))
}

/// What a failure decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Try again after `delay_ns` from `now`; `hinted` when the delay is the other side's word
    /// (which nothing may shorten, B6).
    Wait { delay_ns: u64, hinted: bool },
    /// Stop trying.
    Stop(Stop),
}

/// Why a failure stops the trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// [`FailureKind::Fatal`] (G4).
    Fatal,
    /// [`Hint::DoNotRetry`] (G4).
    DoNotRetry,
    /// [`FailureKind::Canceled`]: the streak is not counted (F4).
    Canceled,
    /// The streak passed the limit (R3, S3, F3).
    Limit,
    /// A hint asked for a retry later than `max_hint` allows: the caller may come back at
    /// `retry_at` (B6).
    Deferred { retry_at: Instant },
}

impl BackoffState {
    /// Counts the failure `kind` at `now` into the streak (a cancel excepted) and decides what
    /// follows. Draws jitter from `rng` only for a scheduled delay that has one.
    #[inline(always)]
    pub(crate) fn decide<R: Rng + ?Sized>(
        &mut self,
        rules: &FailureRules,
        now: Instant,
        kind: FailureKind,
        rng: &mut R,
    ) -> Decision {
        let hinted_ns = match kind {
            FailureKind::Canceled => return Decision::Stop(Stop::Canceled),
            FailureKind::Fatal => {
                self.record_final();
                return Decision::Stop(Stop::Fatal);
            }
            FailureKind::Hinted(Hint::DoNotRetry) => {
                self.record_final();
                return Decision::Stop(Stop::DoNotRetry);
            }
            FailureKind::Hinted(Hint::After(delay)) => Some(saturating_nanos(delay)),
            FailureKind::Hinted(Hint::At(at)) => Some(at.as_nanos().saturating_sub(now.as_nanos())),
            FailureKind::Retryable | FailureKind::Timeout | FailureKind::Panicked | FailureKind::Throttled => None,
        };
        if u64::from(self.failures()) >= rules.retries_allowed {
            self.record_final();
            return Decision::Stop(Stop::Limit);
        }
        match hinted_ns {
            None => {
                let backoff = match (kind, &rules.throttling_backoff) {
                    (FailureKind::Throttled, Some(throttling)) => throttling,
                    _ => &rules.backoff,
                };
                Decision::Wait { delay_ns: self.next_delay_ns(backoff, rng), hinted: false }
            }
            Some(delay_ns) if delay_ns > rules.max_hint_ns => {
                self.record_final();
                Decision::Stop(Stop::Deferred { retry_at: now.saturating_add_nanos(delay_ns) })
            }
            Some(delay_ns) => {
                self.record_hinted(delay_ns, rules.restart_after_hint);
                Decision::Wait { delay_ns, hinted: true }
            }
        }
    }
}
