//! What redelivery is configured with: the durability mode, the failure policy, and the
//! validated [`DeliveryPolicy`] with its builder.

use core::time::Duration;

use crate::PolicyError;
use crate::retry::RetryPolicy;
use crate::time::nanos_of;
#[cfg(doc)]
use crate::{AttemptProgress, Delivery, HandOut, Interruption, Terminal};

/// When the start of an attempt becomes durable (D6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Durability {
    /// The start is durable before the worker gets the task: the driver persists the
    /// [`Delivery`] after [`Delivery::handle_hand_out`] and before it sends the
    /// [`HandOut`]. A server failover interrupts every attempt that is out (it consumes a retry).
    #[default]
    Sync,
    /// The task is sent while its start is persisted; the driver confirms the write with
    /// [`Delivery::handle_persisted`]. A server failover before that rolls the attempt back: the
    /// same attempt number runs again, using no retry, possibly overlapping with the first
    /// worker. Because a rolled-back hand-out leaves no trace in the durable record, the
    /// task's [`AttemptProgress`] is [`NotCompleted`](AttemptProgress::NotCompleted) from the start.
    Async,
}

/// What happens when retries end without a success (D8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum FailurePolicy<R> {
    /// The task fails: [`Terminal::Failed`]. The default.
    #[default]
    Fail,
    /// The workflow continues with the task's input unchanged: [`Terminal::Proceeded`], with the
    /// recovery error set.
    Proceed,
    /// The task goes to a recovery step: [`Terminal::Diverted`] with this route.
    Divert(R),
}

/// The configuration of redelivery, shared by every task it governs.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, DeliveryPolicy, Durability, FailurePolicy, RetryPolicy};
///
/// let retry = RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?)
///     .max_attempts(3)
///     .build()?;
/// let policy = DeliveryPolicy::builder(retry)
///     .heartbeat_timeout(Duration::from_secs(10))
///     .on_failure(FailurePolicy::Divert("compensate"))
///     .build()?;
/// assert_eq!(policy.max_redeliveries(), 3);
/// assert_eq!(policy.durability(), Durability::Sync);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(
        try_from = "DeliveryPolicyBuilder<R>",
        into = "DeliveryPolicyBuilder<R>",
        bound(serialize = "R: Clone + serde::Serialize", deserialize = "R: serde::Deserialize<'de>")
    )
)]
pub struct DeliveryPolicy<R = ()> {
    pub(super) retry: RetryPolicy,
    pub(super) max_redeliveries: u32,
    pub(super) durability: Durability,
    pub(super) start_timeout_ns: u64,
    pub(super) heartbeat_timeout_ns: u64,
    pub(super) on_failure: FailurePolicy<R>,
}

/// The settings of a [`DeliveryPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct DeliveryPolicyBuilder<R = ()> {
    /// How failed and interrupted attempts are retried. It must not set `attempt_timeout`:
    /// the leases below bound an attempt instead.
    pub retry: RetryPolicy,
    /// Free returns allowed per task before it is dead-lettered (D4); 3 by default. Zero
    /// dead-letters a task on its first free return.
    pub max_redeliveries: u32,
    /// When a start is durable (D6); [`Durability::Sync`] by default.
    pub durability: Durability,
    /// How long a handed-out attempt may wait for its worker's start (or first heartbeat)
    /// before it counts as interrupted ([`Interruption::LeaseExpired`]); 10 s by default.
    pub start_timeout: Duration,
    /// How long a running attempt may go without a heartbeat before it counts as interrupted
    /// ([`Interruption::HeartbeatMissed`]); 30 s by default.
    pub heartbeat_timeout: Duration,
    /// What happens when retries end (D8); [`FailurePolicy::Fail`] by default.
    pub on_failure: FailurePolicy<R>,
}

impl<R> DeliveryPolicyBuilder<R> {
    /// At most `n` free returns per task (D4).
    pub const fn max_redeliveries(mut self, n: u32) -> Self {
        self.max_redeliveries = n;
        self
    }

    /// The durability mode (D6).
    pub const fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The lease of a handed-out attempt that has not started.
    pub const fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// The longest silence allowed between heartbeats of a running attempt.
    pub const fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// The failure policy (D8); its route type becomes the policy's.
    pub fn on_failure<R2>(self, on_failure: FailurePolicy<R2>) -> DeliveryPolicyBuilder<R2> {
        DeliveryPolicyBuilder {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout: self.start_timeout,
            heartbeat_timeout: self.heartbeat_timeout,
            on_failure,
        }
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError::Zero`] for a zero `start_timeout` or `heartbeat_timeout`,
    /// [`PolicyError::DurationOverflow`] for one longer than `u64::MAX` nanoseconds, and
    /// [`PolicyError::Conflict`] when the retry policy sets an `attempt_timeout`.
    pub fn build(self) -> Result<DeliveryPolicy<R>, PolicyError> {
        if self.retry.attempt_timeout().is_some() {
            return Err(PolicyError::Conflict {
                setting: "attempt_timeout",
                other: "a delivery policy",
                why: "a delivered attempt is bounded by its leases; use start_timeout and heartbeat_timeout",
            });
        }
        Ok(DeliveryPolicy {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout_ns: lease(
                self.start_timeout,
                "start_timeout",
                "every hand-out would expire at once; a lost hand-out must expire, so pick a finite lease",
            )?,
            heartbeat_timeout_ns: lease(
                self.heartbeat_timeout,
                "heartbeat_timeout",
                "every running attempt would miss its heartbeat at once",
            )?,
            on_failure: self.on_failure,
        })
    }
}

fn lease(span: Duration, setting: &'static str, why: &'static str) -> Result<u64, PolicyError> {
    match nanos_of(span) {
        Some(0) => Err(PolicyError::Zero { setting, why }),
        Some(ns) => Ok(ns),
        None => Err(PolicyError::DurationOverflow { setting }),
    }
}

impl<R> TryFrom<DeliveryPolicyBuilder<R>> for DeliveryPolicy<R> {
    type Error = PolicyError;

    fn try_from(builder: DeliveryPolicyBuilder<R>) -> Result<Self, Self::Error> {
        builder.build()
    }
}

impl<R> From<DeliveryPolicy<R>> for DeliveryPolicyBuilder<R> {
    fn from(policy: DeliveryPolicy<R>) -> Self {
        DeliveryPolicyBuilder {
            retry: policy.retry,
            max_redeliveries: policy.max_redeliveries,
            durability: policy.durability,
            start_timeout: Duration::from_nanos(policy.start_timeout_ns),
            heartbeat_timeout: Duration::from_nanos(policy.heartbeat_timeout_ns),
            on_failure: policy.on_failure,
        }
    }
}

impl DeliveryPolicy<()> {
    /// A builder with `retry` and the defaults: 3 free returns, [`Durability::Sync`], a 10 s
    /// start lease, a 30 s heartbeat timeout, [`FailurePolicy::Fail`].
    pub const fn builder(retry: RetryPolicy) -> DeliveryPolicyBuilder<()> {
        DeliveryPolicyBuilder {
            retry,
            max_redeliveries: 3,
            durability: Durability::Sync,
            start_timeout: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(30),
            on_failure: FailurePolicy::Fail,
        }
    }
}

impl<R> DeliveryPolicy<R> {
    /// The retry policy.
    pub const fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Free returns allowed per task (D4).
    pub const fn max_redeliveries(&self) -> u32 {
        self.max_redeliveries
    }

    /// The durability mode (D6).
    pub const fn durability(&self) -> Durability {
        self.durability
    }

    /// The lease of a handed-out attempt that has not started.
    pub const fn start_timeout(&self) -> Duration {
        Duration::from_nanos(self.start_timeout_ns)
    }

    /// The heartbeat timeout of a running attempt.
    pub const fn heartbeat_timeout(&self) -> Duration {
        Duration::from_nanos(self.heartbeat_timeout_ns)
    }

    /// The failure policy (D8).
    pub const fn on_failure(&self) -> &FailurePolicy<R> {
        &self.on_failure
    }

    /// The same policy with its recovery route mapped by `f` (only a
    /// [`FailurePolicy::Divert`] has one): for a store that keeps routes as strings, say.
    ///
    /// ```
    /// use core::time::Duration;
    /// use persevere::{Backoff, DeliveryPolicy, FailurePolicy, RetryPolicy};
    ///
    /// let retry = RetryPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?).max_attempts(3).build()?;
    /// let policy = DeliveryPolicy::builder(retry).on_failure(FailurePolicy::Divert("refund")).build()?;
    /// let owned = policy.map_route(String::from);
    /// assert_eq!(owned.on_failure(), &FailurePolicy::Divert("refund".to_string()));
    /// assert_eq!(owned.max_redeliveries(), policy.max_redeliveries());
    /// # Ok::<(), persevere::PolicyError>(())
    /// ```
    pub fn map_route<R2>(self, f: impl FnOnce(R) -> R2) -> DeliveryPolicy<R2> {
        DeliveryPolicy {
            retry: self.retry,
            max_redeliveries: self.max_redeliveries,
            durability: self.durability,
            start_timeout_ns: self.start_timeout_ns,
            heartbeat_timeout_ns: self.heartbeat_timeout_ns,
            on_failure: match self.on_failure {
                FailurePolicy::Fail => FailurePolicy::Fail,
                FailurePolicy::Proceed => FailurePolicy::Proceed,
                FailurePolicy::Divert(route) => FailurePolicy::Divert(f(route)),
            },
        }
    }
}
