//! Retry budgets' grants (U1, U2, G9) and a ratio budget's window, written once for the
//! `breaker` family (which asks a shared budget before each retry) and the budget fuzz target.

use std::collections::VecDeque;

use persevere::Instant;

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
