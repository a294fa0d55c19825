//! Retry budgets' grants (U1, U2, G9), written once for the `breaker` family (which asks a
//! shared budget before each retry) and the budget fuzz target.

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
