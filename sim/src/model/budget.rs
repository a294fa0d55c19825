//! Retry budgets, written once for the `breaker` family (which asks a shared budget before
//! each retry) and the budget fuzz target: their grants (U1, U2, G9), a token bucket's balance
//! and the tokens that pass through it (`BucketModel`: U1, U3), and a ratio budget's window
//! and decisions (`RatioModel`: U2, G9).

use std::collections::VecDeque;

use persevere::{Grant, Instant, RatioBudget, RetryClass, TokenBucket, TokenBucketPolicy};

use super::Judge;

/// U1 (a token bucket): a retry costing `cost` is granted from `balance` when it leaves more
/// than `threshold` (or anything at all, with no threshold). Returns the grant and the balance
/// the retry's cost would leave (`None` when it costs more than the balance).
pub fn bucket_grants(balance: u64, cost: u64, threshold: Option<u64>) -> (bool, Option<u64>) {
    let after = balance.checked_sub(cost);
    (after.is_some_and(|after| threshold.is_none_or(|threshold| after > threshold)), after)
}

/// U2 (a ratio budget): one more retry is granted while `retries + 1` stays within
/// `ratio × requests + floor` over the window, in parts per million.
pub fn ratio_grants(requests: u64, retries: u64, ratio_ppm: u64, floor_ppm: u64) -> bool {
    retries.saturating_add(1).saturating_mul(1_000_000) <= ratio_ppm.saturating_mul(requests).saturating_add(floor_ppm)
}

/// A ratio budget's window (U2) as a plain list: `(epoch, is_request)`, and the bucket width
/// and count it is kept in (`None` before the first call).
#[derive(Clone, Debug, Default)]
pub struct RatioWindow {
    entries: VecDeque<(u64, bool)>,
    latest: u64,
    shape: Option<(u64, u32)>,
}

impl RatioWindow {
    /// Moves to `now`'s bucket of `width_ns` (or stays at the latest seen, for an earlier
    /// `now`) and forgets the buckets that left the last `buckets`; a bucket leaves whole.
    /// Under another bucket width or count the window starts over empty: counts kept in one
    /// shape are never read in another.
    pub fn advance(&mut self, width_ns: u64, buckets: u32, now: Instant) {
        let shape = (width_ns, buckets);
        if self.shape != Some(shape) {
            *self = RatioWindow { shape: Some(shape), ..RatioWindow::default() };
        }
        self.latest = self.latest.max(now.as_nanos() / width_ns);
        let latest = self.latest;
        self.entries.retain(|&(epoch, _)| latest - epoch < u64::from(buckets));
    }

    /// Counts a request (`true`) or a granted retry in the latest bucket.
    pub fn push(&mut self, request: bool) {
        self.entries.push_back((self.latest, request));
    }

    /// Requests in the window.
    pub fn requests(&self) -> u64 {
        self.entries.iter().filter(|e| e.1).count() as u64
    }

    /// Retries in the window.
    pub fn retries(&self) -> u64 {
        self.entries.iter().filter(|e| !e.1).count() as u64
    }

    /// Whether one more retry keeps every stretch of the last `buckets` buckets that ends
    /// with the latest within `ratio × its requests + floor`.
    pub fn burst_allows(&self, ratio_ppm: u64, buckets: u64, floor_ppm: u64) -> bool {
        (1..=buckets).all(|stretch| {
            let recent = self.entries.iter().filter(|&&(epoch, _)| self.latest - epoch < stretch);
            let (requests, retries) = recent.fold((0u64, 0u64), |(q, r), e| if e.1 { (q + 1, r) } else { (q, r + 1) });
            ratio_grants(requests, retries, ratio_ppm, floor_ppm)
        })
    }
}

/// What a token bucket must hold (U1), and every token that went through it (U3): the first
/// capacity, plus refunds, minus charges and what a smaller capacity cut off, is the balance.
#[derive(Clone, Debug, Default)]
pub struct BucketModel {
    /// The balance, in thousandths of a token.
    pub balance: u64,
    initial: u128,
    charged: u128,
    refunded: u128,
    cut: u128,
    /// The policy was replaced and no call has read the balance since (it may exceed the new
    /// capacity until then).
    replaced: bool,
}

impl BucketModel {
    /// A full bucket of `capacity` thousandths.
    pub fn new(capacity: u64) -> Self {
        BucketModel { balance: capacity, initial: u128::from(capacity), ..BucketModel::default() }
    }

    /// U1: a retry of `class` asks the bucket under `policy`; returns whether it is granted
    /// and what it costs. A balance kept under a larger capacity is read, and kept, as full at
    /// this one; a refused retry is charged what is left above zero when the policy says so.
    pub fn acquire(&mut self, policy: &TokenBucketPolicy, class: RetryClass) -> (bool, u64) {
        let settings = policy.settings();
        let cost = match class {
            RetryClass::Throttling => settings.throttling_cost_milli,
            RetryClass::Transient => settings.transient_cost_milli,
            RetryClass::Timeout => settings.timeout_cost_milli,
        };
        let capped = self.balance.min(policy.capacity_milli());
        self.cut += u128::from(self.balance - capped);
        self.balance = capped;
        self.replaced = false;
        let (granted, after) = bucket_grants(self.balance, cost, settings.threshold_milli);
        if granted || settings.charge_refused {
            let left = after.unwrap_or(0);
            self.charged += u128::from(self.balance - left);
            self.balance = left;
        }
        (granted, cost)
    }

    /// U1: a call succeeded (a retry, with its `grant`): the refund is the retry's cost when
    /// the policy refunds it, else the success refund, up to the capacity.
    pub fn success(&mut self, policy: &TokenBucketPolicy, grant: Option<Grant>) {
        let settings = policy.settings();
        let refund = match grant {
            Some(grant) if settings.refund_retry_cost => grant.cost_milli(),
            _ => settings.success_refund_milli,
        };
        let capped = self.balance.saturating_add(refund).min(settings.capacity_milli);
        if capped >= self.balance {
            self.refunded += u128::from(capped - self.balance);
        } else {
            self.cut += u128::from(self.balance - capped);
        }
        self.balance = capped;
        self.replaced = false;
    }

    /// The bucket is driven under a new policy from now on.
    pub fn replace(&mut self) {
        self.replaced = true;
    }

    /// Holds `bucket` to the model: its balance (U1), within the capacity (G9), never more
    /// charged than the capacity and the refunds (G9), no token created or lost (U3).
    pub fn check<J: Judge>(
        &self,
        judge: &mut J,
        policy: &TokenBucketPolicy,
        bucket: &TokenBucket,
    ) -> Result<(), J::Error> {
        let balance = self.balance;
        judge.check("U1", bucket.balance_milli() == balance, || {
            format!("balance {}, the model holds {balance}", bucket.balance_milli())
        })?;
        let capacity = policy.capacity_milli();
        judge.check("G9", self.replaced || balance <= capacity, || {
            format!("balance {balance} above the capacity {capacity}")
        })?;
        let (charged, refunded, initial) = (self.charged, self.refunded, self.initial);
        judge.check("G9", charged <= initial + refunded, || {
            format!("{charged} charged out of {initial} plus {refunded} refunded")
        })?;
        judge.check("U3", initial + refunded - self.cut - charged == u128::from(balance), || {
            "tokens were created or lost".into()
        })
    }
}

/// A ratio budget's configuration as a model reads it, computed from the settings it was
/// built from (never asked of the policy).
#[derive(Clone, Copy, Debug)]
pub struct RatioRules {
    /// Retries per request, in parts per million.
    pub ratio_ppm: u64,
    /// The floor over the whole window, in millionths of a retry.
    pub floor_ppm: u64,
    /// The width of a bucket.
    pub width_ns: u64,
    /// How many buckets the window holds.
    pub buckets: u32,
    /// The burst window in buckets, and its floor in millionths of a retry.
    pub burst: Option<(u64, u64)>,
}

/// What a ratio budget must decide (U2, G9): its window, as a plain list.
#[derive(Clone, Debug, Default)]
pub struct RatioModel {
    window: RatioWindow,
}

impl RatioModel {
    /// A request at `now` is counted.
    pub fn request(&mut self, rules: &RatioRules, now: Instant) {
        self.window.advance(rules.width_ns, rules.buckets, now);
        self.window.push(true);
    }

    /// U2: a retry asks at `now`: granted while the window's retries, this one included,
    /// stay within `ratio × requests + floor`, over the window and over every stretch of the
    /// burst window. Returns the grant and the window's requests and retries before it; a
    /// granted retry is counted.
    pub fn retry(&mut self, rules: &RatioRules, now: Instant) -> (bool, u64, u64) {
        self.window.advance(rules.width_ns, rules.buckets, now);
        let (requests, retries) = (self.window.requests(), self.window.retries());
        let burst_ok =
            rules.burst.is_none_or(|(buckets, floor)| self.window.burst_allows(rules.ratio_ppm, buckets, floor));
        let granted = ratio_grants(requests, retries, rules.ratio_ppm, rules.floor_ppm) && burst_ok;
        if granted {
            self.window.push(false);
        }
        (granted, requests, retries)
    }

    /// Holds `budget` to the model: the requests and retries in its window (U2).
    pub fn check<J: Judge>(&self, judge: &mut J, budget: &RatioBudget) -> Result<(), J::Error> {
        let (requests, retries) = (self.window.requests(), self.window.retries());
        judge.check("U2", u64::from(budget.requests()) == requests, || {
            format!("{} requests in the window, the model counts {requests}", budget.requests())
        })?;
        judge.check("U2", u64::from(budget.retries()) == retries, || {
            format!("{} retries in the window, the model counts {retries}", budget.retries())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u1_u2_grants_at_the_boundaries() {
        assert_eq!(bucket_grants(10_000, 1_000, Some(5_000)), (true, Some(9_000)));
        assert_eq!(bucket_grants(6_000, 1_000, Some(5_000)), (false, Some(5_000)), "not above the threshold");
        assert_eq!(bucket_grants(500, 1_000, None), (false, None));
        assert_eq!(bucket_grants(1_000, 1_000, None), (true, Some(0)));
        assert!(ratio_grants(10, 1, 200_000, 0), "2 retries over 10 requests at 20 %");
        assert!(!ratio_grants(10, 2, 200_000, 0));
        assert!(ratio_grants(0, 0, 200_000, 1_000_000), "the floor alone");
    }
}
