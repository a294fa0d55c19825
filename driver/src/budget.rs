//! A retry budget shared by many retried operations (rules U1–U4).

use std::fmt;
use std::sync::Arc;

use persevere::{
    FailureClass, Grant, Instant, RatioBudget, RatioBudgetPolicy, RetryClass, TokenBucket, TokenBucketPolicy,
};

use crate::classify::RetryGate;
use crate::runtime::Runtime;
use crate::sync::shared::{Mutex, lock};

enum Kind {
    Tokens { policy: TokenBucketPolicy, bucket: Mutex<TokenBucket> },
    Ratio { policy: RatioBudgetPolicy, budget: Mutex<RatioBudget> },
}

/// A retry budget shared by every operation that [`gate`](crate::RetryFuture::gate)s on it:
/// cheap to clone, one budget behind it. A refused retry ends its operation with
/// [`Rejected`](persevere::OutcomeKind::Rejected).
///
/// - A token bucket ([`Budget::tokens`], e.g. [`TokenBucketPolicy::aws`]) charges each retry
///   by its failure class and earns tokens back on successes: the per-success refund, or, for
///   a successful retry under a policy that refunds retry costs (AWS), what that retry cost
///   (its [`BudgetTicket`] carries the grant from the retry to its success). Under a policy
///   that charges final failures ([`TokenBucketPolicy::grpc`]) the failure that ends an
///   operation is charged too, so every failed attempt costs, as in gRPC.
/// - A ratio budget ([`Budget::ratio`], e.g. [`RatioBudgetPolicy::finagle`]) counts each
///   operation as a request and grants retries up to the ratio over its window; counting a
///   request reads the runtime's clock, so this kind costs one clock read per operation.
///
/// ```
/// use persevere::TokenBucketPolicy;
/// # struct Clock;
/// # impl persevere_driver::Runtime for Clock {
/// #     type Sleep = std::future::Ready<()>;
/// #     fn now(&self) -> persevere::Instant { persevere::Instant::ZERO }
/// #     fn sleep_until(&self, _: persevere::Instant) -> Self::Sleep { std::future::ready(()) }
/// # }
/// use persevere_driver::{Budget, RetryGate};
///
/// let budget = Budget::tokens(Clock, TokenBucketPolicy::builder(10).costs(5, 5, 5).build()?);
/// let granted = (0..3).filter(|_| budget.allow_retry(None, persevere::FailureClass::Retryable).is_some()).count();
/// assert_eq!(granted, 2); // 10 tokens at 5 a retry
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub struct Budget<Rt> {
    shared: Arc<(Rt, Kind)>,
}

impl<Rt> Clone for Budget<Rt> {
    fn clone(&self) -> Self {
        Budget { shared: self.shared.clone() }
    }
}

impl<Rt> fmt::Debug for Budget<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.shared.1 {
            Kind::Tokens { bucket, .. } => {
                f.debug_struct("Budget").field("balance_milli", &lock(bucket).balance_milli()).finish()
            }
            Kind::Ratio { budget, .. } => {
                let b = lock(budget);
                f.debug_struct("Budget").field("requests", &b.requests()).field("retries", &b.retries()).finish()
            }
        }
    }
}

impl<Rt: Runtime> Budget<Rt> {
    /// A token-bucket budget, full.
    pub fn tokens(runtime: Rt, policy: TokenBucketPolicy) -> Self {
        let bucket = Mutex::new(TokenBucket::new(&policy));
        Budget { shared: Arc::new((runtime, Kind::Tokens { policy, bucket })) }
    }

    /// A ratio budget, empty.
    pub fn ratio(runtime: Rt, policy: RatioBudgetPolicy) -> Self {
        Budget { shared: Arc::new((runtime, Kind::Ratio { policy, budget: Mutex::new(RatioBudget::new()) })) }
    }

    /// A token bucket's balance, in milli-tokens; `None` for a ratio budget.
    pub fn balance_milli(&self) -> Option<u64> {
        match &self.shared.1 {
            Kind::Tokens { bucket, .. } => Some(lock(bucket).balance_milli()),
            Kind::Ratio { .. } => None,
        }
    }
}

/// A retry a [`Budget`] granted: a token bucket's [`Grant`], refunded if the retry succeeds
/// and the policy refunds retry costs; nothing for a ratio budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetTicket {
    grant: Option<Grant>,
}

impl BudgetTicket {
    /// The token bucket's grant, if the budget is one.
    pub fn grant(&self) -> Option<Grant> {
        self.grant
    }
}

impl<Rt: Runtime> RetryGate for Budget<Rt> {
    type Ticket = BudgetTicket;

    fn on_request(&self, now: Option<Instant>) {
        let (runtime, kind) = &*self.shared;
        if let Kind::Ratio { policy, budget } = kind {
            let now = now.unwrap_or_else(|| runtime.now());
            lock(budget).record_request(policy, now);
        }
    }

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<BudgetTicket> {
        let (runtime, kind) = &*self.shared;
        let granted = match kind {
            Kind::Tokens { policy, bucket } => lock(bucket)
                .try_acquire(policy, RetryClass::from(class))
                .ok()
                .map(|grant| BudgetTicket { grant: Some(grant) }),
            Kind::Ratio { policy, budget } => {
                let now = now.unwrap_or_else(|| runtime.now());
                lock(budget).try_acquire(policy, now).ok().map(|()| BudgetTicket { grant: None })
            }
        };
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        if granted.is_none() {
            let budget = match kind {
                Kind::Tokens { .. } => "tokens",
                Kind::Ratio { .. } => "ratio",
            };
            #[cfg(feature = "tracing")]
            tracing::debug!(target: "persevere::budget", budget, class = ?class, "retry refused");
            #[cfg(feature = "metrics")]
            metrics::counter!("persevere_budget_refusals_total", "budget" => budget).increment(1);
        }
        granted
    }

    fn on_success(&self, ticket: Option<BudgetTicket>) {
        if let Kind::Tokens { policy, bucket } = &self.shared.1 {
            lock(bucket).record_success(policy, ticket.and_then(|t| t.grant));
        }
    }

    fn on_final_failure(&self, _: Option<Instant>, class: FailureClass) {
        if let Kind::Tokens { policy, bucket } = &self.shared.1
            && policy.settings().charge_final_failure
        {
            lock(bucket).record_final_failure(policy, RetryClass::from(class));
        }
    }
}
