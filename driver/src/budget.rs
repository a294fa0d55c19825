//! A retry budget shared by many retried operations (rules U1–U4).

use std::fmt;
use std::sync::Arc;

use persevere::{
    ConcurrencyBudget, ConcurrencyBudgetPolicy, FailureClass, Grant, Instant, RatioBudget, RatioBudgetPolicy,
    RetryClass, TokenBucket, TokenBucketPolicy,
};

use crate::classify::RetryGate;
use crate::refusal::{Gate, Refusal};
use crate::runtime::Runtime;
use crate::sync::shared::{Mutex, lock};

enum Kind {
    Tokens {
        policy: TokenBucketPolicy,
        bucket: Mutex<TokenBucket>,
    },
    Ratio {
        policy: RatioBudgetPolicy,
        budget: Mutex<RatioBudget>,
    },
    /// Its own allocation, which the requests and tickets in flight share to end themselves.
    Concurrency {
        policy: ConcurrencyBudgetPolicy,
        budget: Arc<Mutex<ConcurrencyBudget>>,
    },
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
/// - A concurrency budget ([`Budget::concurrency`], e.g. [`ConcurrencyBudgetPolicy::envoy`])
///   counts what is in flight: each operation from its start until it ends (its
///   [`BudgetRequest`]), each retry from its grant until its attempt ends (its
///   [`BudgetTicket`]), also when the operation's future is dropped; a retry is granted while
///   the retries in flight are under the policy's share of the requests in flight.
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
            Kind::Concurrency { budget, .. } => {
                let b = lock(budget);
                f.debug_struct("Budget")
                    .field("requests_in_flight", &b.requests())
                    .field("retries_in_flight", &b.retries())
                    .finish()
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

    /// A token-bucket budget under `policy` that takes over from `previous`, whose policy it
    /// replaces (gRPC, when the service config changes): its balance is `previous`'s share of
    /// its capacity at the new one ([`TokenBucket::rescale`]); full if `previous` is not a token
    /// bucket. Operations gated on `previous` keep using it; gate new ones on this one.
    pub fn tokens_replacing(previous: &Budget<Rt>, policy: TokenBucketPolicy) -> Self
    where
        Rt: Clone,
    {
        let (runtime, kind) = &*previous.shared;
        let mut bucket = TokenBucket::new(&policy);
        if let Kind::Tokens { policy: from, bucket: old } = kind {
            bucket = *lock(old);
            bucket.rescale(from, &policy);
        }
        Budget { shared: Arc::new((runtime.clone(), Kind::Tokens { policy, bucket: Mutex::new(bucket) })) }
    }

    /// A budget on retries in flight (Envoy's), with nothing in flight.
    pub fn concurrency(runtime: Rt, policy: ConcurrencyBudgetPolicy) -> Self {
        let budget = Arc::new(Mutex::new(ConcurrencyBudget::new()));
        Budget { shared: Arc::new((runtime, Kind::Concurrency { policy, budget })) }
    }

    /// A token bucket's balance, in milli-tokens; `None` for another kind.
    pub fn balance_milli(&self) -> Option<u64> {
        match &self.shared.1 {
            Kind::Tokens { bucket, .. } => Some(lock(bucket).balance_milli()),
            Kind::Ratio { .. } | Kind::Concurrency { .. } => None,
        }
    }

    /// A concurrency budget's requests and retries in flight now; `None` for another kind.
    pub fn in_flight(&self) -> Option<ConcurrencyBudget> {
        match &self.shared.1 {
            Kind::Concurrency { budget, .. } => Some(*lock(budget)),
            Kind::Tokens { .. } | Kind::Ratio { .. } => None,
        }
    }
}

/// A retry a [`Budget`] granted: a token bucket's [`Grant`], refunded if the retry succeeds
/// and the policy refunds retry costs; for a concurrency budget, the retry's place in flight,
/// given back when the ticket is dropped (its attempt ended, or the operation was dropped);
/// nothing for a ratio budget. Not `Clone`: a place is given back once.
#[derive(Debug)]
pub struct BudgetTicket {
    grant: Option<Grant>,
    in_flight: Option<Arc<Mutex<ConcurrencyBudget>>>,
}

impl BudgetTicket {
    /// The token bucket's grant, if the budget is one.
    pub fn grant(&self) -> Option<Grant> {
        self.grant
    }
}

impl Drop for BudgetTicket {
    fn drop(&mut self) {
        if let Some(budget) = self.in_flight.take() {
            // Counted in flight when granted, so one is.
            let _ = lock(&budget).release_retry();
        }
    }
}

/// An operation a concurrency [`Budget`] counts in flight, from its start until it ends: its
/// end is counted when this is dropped. Empty for other kinds.
#[derive(Debug, Default)]
pub struct BudgetRequest {
    in_flight: Option<Arc<Mutex<ConcurrencyBudget>>>,
}

impl Drop for BudgetRequest {
    fn drop(&mut self) {
        if let Some(budget) = self.in_flight.take() {
            // Counted in flight when it started, so one is.
            let _ = lock(&budget).record_request_end();
        }
    }
}

impl<Rt: Runtime> RetryGate for Budget<Rt> {
    type Ticket = BudgetTicket;
    type Request = BudgetRequest;

    fn on_request(&self, now: Option<Instant>) -> BudgetRequest {
        let (runtime, kind) = &*self.shared;
        match kind {
            Kind::Ratio { policy, budget } => {
                let now = now.unwrap_or_else(|| runtime.now());
                lock(budget).record_request(policy, now);
                BudgetRequest::default()
            }
            Kind::Concurrency { budget, .. } => {
                lock(budget).record_request_start();
                BudgetRequest { in_flight: Some(budget.clone()) }
            }
            Kind::Tokens { .. } => BudgetRequest::default(),
        }
    }

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<BudgetTicket> {
        let (runtime, kind) = &*self.shared;
        // The core makes at most one event per `try_acquire`; it is drained under the same lock.
        let (granted, event) = match kind {
            Kind::Tokens { policy, bucket } => {
                let mut bucket = lock(bucket);
                let grant = bucket.try_acquire(policy, RetryClass::from(class)).ok();
                (grant.map(|grant| BudgetTicket { grant: Some(grant), in_flight: None }), bucket.poll_event())
            }
            Kind::Ratio { policy, budget } => {
                let now = now.unwrap_or_else(|| runtime.now());
                let mut budget = lock(budget);
                let granted = budget.try_acquire(policy, now).is_ok();
                (granted.then_some(BudgetTicket { grant: None, in_flight: None }), budget.poll_event())
            }
            Kind::Concurrency { policy, budget: shared } => {
                let mut budget = lock(shared);
                let granted = budget.try_acquire(policy).is_ok();
                let ticket = granted.then(|| BudgetTicket { grant: None, in_flight: Some(shared.clone()) });
                (ticket, budget.poll_event())
            }
        };
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        {
            let budget = match kind {
                Kind::Tokens { .. } => "tokens",
                Kind::Ratio { .. } => "ratio",
                Kind::Concurrency { .. } => "concurrency",
            };
            if granted.is_none() {
                #[cfg(feature = "tracing")]
                tracing::debug!(target: "persevere::budget", budget, class = ?class, "retry refused");
                #[cfg(feature = "metrics")]
                metrics::counter!("persevere_budget_refusals_total", "budget" => budget).increment(1);
            }
            if let Some(event) = event {
                told(budget, event);
            }
        }
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        let _ = event;
        granted
    }

    /// A refusal names [`Gate::Budget`], with no time: when a budget grants again depends on
    /// the calls to come (a token bucket earns from successes, a ratio from new requests, a
    /// concurrency budget from retries in flight ending), which it cannot foresee.
    fn try_retry(&self, now: Option<Instant>, class: FailureClass) -> Result<BudgetTicket, Refusal> {
        self.allow_retry(now, class).ok_or(Refusal::new(Gate::Budget, None))
    }

    fn on_success(&self, ticket: Option<BudgetTicket>) {
        if let Kind::Tokens { policy, bucket } = &self.shared.1 {
            lock(bucket).record_success(policy, ticket.as_ref().and_then(BudgetTicket::grant));
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

/// Logs and counts a budget's turn (O1): the first refusal after a grant, the first grant after
/// refusals.
#[cfg(any(feature = "tracing", feature = "metrics"))]
#[cold]
fn told(budget: &'static str, event: persevere::BudgetEvent) {
    let to = match event {
        persevere::BudgetEvent::Exhausted => {
            #[cfg(feature = "tracing")]
            tracing::info!(target: "persevere::budget", budget, "budget exhausted");
            "exhausted"
        }
        persevere::BudgetEvent::Recovered { refused } => {
            #[cfg(feature = "tracing")]
            tracing::info!(target: "persevere::budget", budget, refused, "budget recovered");
            #[cfg(not(feature = "tracing"))]
            let _ = refused;
            "recovered"
        }
        _ => return,
    };
    #[cfg(feature = "metrics")]
    metrics::counter!("persevere_budget_transitions_total", "budget" => budget, "to" => to).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = to;
}
