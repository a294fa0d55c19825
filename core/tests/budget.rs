//! Rules U1–U4 on the retry budgets, G9 (never more retries than configured), G12 (a
//! refused retry takes nothing, unless the policy says refusals are charged) and O1 (a budget's
//! turns, exhausted and recovered, are outputs).

use core::time::Duration;

use persevere::{
    Backoff, BudgetEvent, BudgetRefused, Failure, FailureClass, Instant, OutcomeKind, PolicyError, RatioBudget,
    RatioBudgetPolicy, Retry, RetryAction, RetryClass, RetryPolicy, TokenBucket, TokenBucketPolicy,
};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn secs(n: u64) -> Instant {
    Instant::from_secs(n)
}

/// O1's reference for every budget: the retries refused in a row, and the event each answer
/// should make (exhausted at the first refusal after a grant, recovered at the first grant
/// after refusals, with their number).
#[derive(Default)]
struct Streak(u32);

impl Streak {
    fn after(&mut self, granted: bool) -> Option<BudgetEvent> {
        let refused = self.0;
        self.0 = if granted { 0 } else { refused + 1 };
        match (granted, refused) {
            (true, 0) | (false, 1..) => None,
            (true, refused) => Some(BudgetEvent::Recovered { refused }),
            (false, 0) => Some(BudgetEvent::Exhausted),
        }
    }
}

#[test]
fn u1_a_token_bucket_charges_per_class_and_refuses_at_or_below_its_threshold() {
    let p =
        TokenBucketPolicy::builder(20).costs(2, 3, 5).success_refund_milli(250).refuse_at_or_below(5).build().unwrap();
    let mut b = TokenBucket::new(&p);
    assert_eq!(b.balance_milli(), 20_000);
    assert_eq!(b.try_acquire(&p, RetryClass::Timeout).unwrap().cost_milli(), 5_000); // 15
    assert_eq!(b.try_acquire(&p, RetryClass::Transient).unwrap().cost_milli(), 3_000); // 12
    assert_eq!(b.try_acquire(&p, RetryClass::Throttling).unwrap().cost_milli(), 2_000); // 10
    assert_eq!(b.balance_milli(), 10_000);
    // A timeout would leave exactly 5: at the threshold, refused; a throttling leaves 8.
    assert_eq!(b.try_acquire(&p, RetryClass::Timeout), Err(BudgetRefused));
    assert_eq!(b.balance_milli(), 10_000, "a refusal is not charged by default");
    let _ = b.try_acquire(&p, RetryClass::Throttling).unwrap(); // 8
    let _ = b.try_acquire(&p, RetryClass::Throttling).unwrap(); // 6
    assert_eq!(b.try_acquire(&p, RetryClass::Throttling), Err(BudgetRefused)); // would leave 4
    // Refunds: a quarter token per success, capped at the capacity.
    for _ in 0..4 {
        b.record_success(&p, None);
    }
    assert_eq!(b.balance_milli(), 7_000);
    for _ in 0..1_000 {
        b.record_success(&p, None);
    }
    assert_eq!(b.balance_milli(), 20_000);
    // Failure classes map onto retry classes.
    assert_eq!(RetryClass::from(FailureClass::Timeout), RetryClass::Timeout);
    assert_eq!(RetryClass::from(FailureClass::RetryAfter), RetryClass::Throttling);
    assert_eq!(RetryClass::from(FailureClass::Retryable), RetryClass::Transient);
}

#[test]
fn u1_the_grpc_preset_reproduces_grpc_retry_throttling() {
    // gRPC core's own unit test: max_tokens 4 (threshold 2), token_ratio 1.6.
    let p = TokenBucketPolicy::grpc(4, 1.6).unwrap();
    let mut b = TokenBucket::new(&p);
    assert!(b.try_acquire(&p, RetryClass::Transient).is_ok()); // 3 > 2
    b.record_success(&p, None); // 4.6 → 4
    assert_eq!(b.balance_milli(), 4_000);
    assert!(b.try_acquire(&p, RetryClass::Transient).is_ok()); // 3
    assert!(b.try_acquire(&p, RetryClass::Transient).is_err()); // 2: at the threshold
    assert!(b.try_acquire(&p, RetryClass::Transient).is_err()); // 1: charged anyway
    assert_eq!(b.balance_milli(), 1_000);
    b.record_success(&p, None); // 2.6
    assert!(b.try_acquire(&p, RetryClass::Transient).is_err()); // 1.6
    b.record_success(&p, None); // 3.2
    assert!(b.try_acquire(&p, RetryClass::Transient).is_ok()); // 2.2 > 2
    assert_eq!(b.balance_milli(), 2_200);
    // Failures never take the balance below zero.
    for _ in 0..10 {
        assert!(b.try_acquire(&p, RetryClass::Timeout).is_err());
    }
    assert_eq!(b.balance_milli(), 0);

    // Validation follows gRPC's service config.
    assert!(matches!(TokenBucketPolicy::grpc(0, 0.1), Err(PolicyError::Zero { .. })));
    assert!(matches!(TokenBucketPolicy::grpc(1001, 0.1), Err(PolicyError::LimitTooLarge { max: 1000, .. })));
    assert!(matches!(TokenBucketPolicy::grpc(10, f64::NAN), Err(PolicyError::NotFinite { .. })));
    assert!(matches!(TokenBucketPolicy::grpc(10, -1.0), Err(PolicyError::FractionOutOfRange { .. })));
    assert!(matches!(TokenBucketPolicy::grpc(10, 0.0004), Err(PolicyError::Zero { .. })));
    // Zero is not negative: it is refused as a zero ratio.
    assert!(matches!(TokenBucketPolicy::grpc(10, 0.0), Err(PolicyError::Zero { setting: "token_ratio", .. })));
    // Three decimals, exact; further decimals are ignored.
    assert_eq!(TokenBucketPolicy::grpc(10, 1.005).unwrap().settings().success_refund_milli, 1_005);
    assert_eq!(TokenBucketPolicy::grpc(10, 0.1239).unwrap().settings().success_refund_milli, 123);
    // The largest ratio taken is 10^12 itself; one more is refused.
    assert_eq!(TokenBucketPolicy::grpc(10, 1e12).unwrap().settings().success_refund_milli, 1_000_000_000_000_000);
    assert!(matches!(
        TokenBucketPolicy::grpc(10, 1e12 + 1.0),
        Err(PolicyError::LimitTooLarge { setting: "token_ratio", max: 1_000_000_000_000 })
    ));
}

#[test]
fn u1_the_aws_preset_uses_the_published_retry_quota() {
    let p = TokenBucketPolicy::aws();
    let mut b = TokenBucket::new(&p);
    assert_eq!(b.balance_milli(), 500_000);
    let transient = b.try_acquire(&p, RetryClass::Transient).unwrap();
    assert_eq!(transient.cost_milli(), 5_000);
    let throttled = b.try_acquire(&p, RetryClass::Throttling).unwrap();
    assert_eq!(throttled.cost_milli(), 5_000);
    let timeout = b.try_acquire(&p, RetryClass::Timeout).unwrap();
    assert_eq!(timeout.cost_milli(), 10_000);
    assert_eq!(b.balance_milli(), 480_000);
    // A successful retry gives its cost back; a success without retry adds 1.
    b.record_success(&p, Some(timeout));
    assert_eq!(b.balance_milli(), 490_000);
    b.record_success(&p, None);
    assert_eq!(b.balance_milli(), 491_000);
    // Drained: 98 transient retries from 491 leave 1; the next is refused (1 < 5), free.
    let mut granted = 0;
    while b.try_acquire(&p, RetryClass::Transient).is_ok() {
        granted += 1;
    }
    assert_eq!((granted, b.balance_milli()), (98, 1_000));
    // From a full bucket, exactly 100 retries (500 / 5) are granted, or 50 after timeouts.
    let mut b = TokenBucket::new(&p);
    assert_eq!((0..1_000).filter(|_| b.try_acquire(&p, RetryClass::Transient).is_ok()).count(), 100);
    let mut b = TokenBucket::new(&p);
    assert_eq!((0..1_000).filter(|_| b.try_acquire(&p, RetryClass::Timeout).is_ok()).count(), 50);
}

#[test]
fn u1_invalid_token_bucket_configurations_are_policy_errors() {
    assert!(matches!(TokenBucketPolicy::builder(0).build(), Err(PolicyError::Zero { setting: "capacity", .. })));
    assert!(matches!(TokenBucketPolicy::builder(10).costs(0, 1, 1).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(TokenBucketPolicy::builder(10).costs(1, 11, 1).build(), Err(PolicyError::LimitTooLarge { .. })));
    assert!(matches!(
        TokenBucketPolicy::builder(10).refuse_at_or_below(10).build(),
        Err(PolicyError::LimitTooLarge { .. })
    ));
}

#[test]
fn u2_a_ratio_budget_grants_ratio_times_requests_plus_the_floor_over_its_window() {
    // 20 % of requests plus 1 retry per second over 10 s: 10 extra.
    let p = RatioBudgetPolicy::builder(0.2).min_retries_per_sec(1).build().unwrap();
    assert_eq!(p.floor_retries(), 10);
    let mut b = RatioBudget::new();
    let granted = (0..100).filter(|_| b.try_acquire(&p, secs(0)).is_ok()).count();
    assert_eq!(granted, 10, "the floor alone, with no request yet");
    for _ in 0..50 {
        b.record_request(&p, secs(1));
    }
    let granted = (0..100).filter(|_| b.try_acquire(&p, secs(1)).is_ok()).count();
    assert_eq!(granted, 10, "20 % of 50 requests");
    assert_eq!((b.requests(), b.retries()), (50, 20));
    // 10 s after the first bucket (0–1 s) it leaves the window with its 10 retries.
    assert!(b.try_acquire(&p, secs(9)).is_err());
    assert!(b.try_acquire(&p, secs(10)).is_ok());
    assert_eq!((b.requests(), b.retries()), (50, 11));
    // 10 s after the requests, they leave too: only the floor remains.
    let granted = (0..100).filter(|_| b.try_acquire(&p, secs(11)).is_ok()).count();
    assert_eq!((b.requests(), b.retries()), (0, 10));
    assert_eq!(granted, 9);
}

/// Found by the `budget` fuzz target: with a bucket width that divides 2^64 − 1 (1 ns here),
/// every call at the last representable instant opened a new bucket, so requests still in the
/// window were forgotten and retries refused.
#[test]
fn u2_requests_at_the_last_instant_stay_in_the_window() {
    let p = RatioBudgetPolicy::builder(0.25)
        .ttl(Duration::from_nanos(16))
        .buckets(10)
        .min_retries_per_sec(0)
        .build()
        .unwrap();
    let mut b = RatioBudget::new();
    for _ in 0..4 {
        b.record_request(&p, Instant::MAX);
    }
    for _ in 0..20 {
        let _ = b.try_acquire(&p, Instant::MAX);
        assert_eq!(b.requests(), 4, "the requests left the window");
    }
    assert_eq!(b.retries(), 1, "0.25 × 4 requests allow one retry");
}

#[test]
fn u2_the_finagle_preset_has_finagles_defaults() {
    let p = RatioBudgetPolicy::finagle();
    assert_eq!(
        p,
        RatioBudgetPolicy::builder(0.2).ttl(Duration::from_secs(10)).min_retries_per_sec(10).build().unwrap()
    );
    assert_eq!((p.ratio_ppm(), p.floor_retries(), p.buckets()), (200_000, 100, 10));
    assert_eq!(p.bucket_width(), Duration::from_secs(1));
    let mut b = RatioBudget::new();
    for _ in 0..1_000 {
        b.record_request(&p, secs(0));
    }
    assert_eq!((0..1_000).filter(|_| b.try_acquire(&p, secs(0)).is_ok()).count(), 300);
}

#[test]
fn u2_invalid_ratio_budget_configurations_are_policy_errors() {
    assert!(matches!(RatioBudgetPolicy::builder(f64::NAN).build(), Err(PolicyError::NotFinite { .. })));
    assert!(matches!(
        RatioBudgetPolicy::builder(1000.001).build(),
        Err(PolicyError::OutOfRange { setting: "ratio", min: 0.0, max: 1000.0, .. })
    ));
    assert!(matches!(RatioBudgetPolicy::builder(-0.5).build(), Err(PolicyError::OutOfRange { .. })));
    assert_eq!(RatioBudgetPolicy::builder(1000.0).build().unwrap().ratio_ppm(), 1_000_000_000);
    assert!(matches!(RatioBudgetPolicy::builder(0.1).ttl(Duration::ZERO).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(RatioBudgetPolicy::builder(0.1).buckets(0).build(), Err(PolicyError::Zero { .. })));
    assert!(matches!(RatioBudgetPolicy::builder(0.1).buckets(17).build(), Err(PolicyError::LimitTooLarge { .. })));
    assert!(matches!(
        RatioBudgetPolicy::builder(0.1).ttl(Duration::MAX).build(),
        Err(PolicyError::DurationOverflow { .. })
    ));
    // A zero ratio with a zero floor is a budget that never retries: valid.
    let never = RatioBudgetPolicy::builder(0.0).min_retries_per_sec(0).build().unwrap();
    let mut b = RatioBudget::new();
    b.record_request(&never, secs(0));
    assert!(b.try_acquire(&never, secs(0)).is_err());
}

/// Drives a 100-requests-per-second client (one request every 10 ms) through healthy seconds
/// and a 3 s outage from `onset_ms` in which every request fails and asks for one retry at
/// once; returns the instants (ms) of the retries granted.
fn outage_grants(policy: &RatioBudgetPolicy, onset_ms: u64) -> Vec<u64> {
    let mut b = RatioBudget::new();
    let mut granted = Vec::new();
    for ms in (0..onset_ms + 3_000).step_by(10) {
        let now = Instant::from_millis(ms);
        b.record_request(policy, now);
        if ms >= onset_ms && b.try_acquire(policy, now).is_ok() {
            granted.push(ms);
        }
    }
    granted
}

/// How many of `instants` lie in `[from, to)` (ms).
fn within(instants: &[u64], from: u64, to: u64) -> u64 {
    instants.iter().filter(|&&t| (from..to).contains(&t)).count() as u64
}

/// The outage burst (issue 18): the window is sliding, so the first second of an outage can
/// spend what ten healthy seconds earned; a burst window of 1 s holds every second of the
/// outage to the ratio of its own requests plus the floor of one second.
#[test]
fn u2_a_burst_window_holds_the_first_second_of_an_outage_to_its_ratio_plus_floor() {
    let sliding = RatioBudgetPolicy::builder(0.1).min_retries_per_sec(2);
    let bounded = sliding.burst_window(Duration::from_secs(1)).build().unwrap();
    let sliding = sliding.build().unwrap();
    assert_eq!(bounded.burst_buckets(), Some(1));
    assert_eq!(sliding.burst_buckets(), None);

    // Onset on a bucket boundary: each second is one bucket of 100 requests, and it retries
    // 0.1 × 100 + 2.
    let grants = outage_grants(&bounded, 10_000);
    let per_second: Vec<u64> = (0..3).map(|s| within(&grants, 10_000 + s * 1_000, 11_000 + s * 1_000)).collect();
    assert_eq!(per_second, [12, 12, 12]);
    // Without the bound, the first second spends the healthy seconds' allowance: every one of
    // its 100 requests is retried (0.1 × the window's 1,000 requests + 20).
    assert_eq!(within(&outage_grants(&sliding, 10_000), 10_000, 11_000), 100);

    // Onset inside a bucket (100 ms buckets, a burst window of 10): every second that starts
    // on the onset's bucket keeps its retries within 0.1 × its 100 requests + 2, and the first
    // second from the onset itself, which also touches the next bucket (10 more requests), at
    // most 0.1 × 110 + 2 × 2.
    let fine = RatioBudgetPolicy::builder(0.1)
        .min_retries_per_sec(2)
        .buckets(16)
        .ttl(Duration::from_millis(1_600))
        .burst_window(Duration::from_millis(1_000))
        .build()
        .unwrap();
    assert_eq!(fine.burst_buckets(), Some(10));
    for onset in [10_050, 10_130, 10_370, 10_990] {
        let grants = outage_grants(&fine, onset);
        let bucket = onset / 100 * 100;
        for second in 0..2 {
            let from = bucket + second * 1_000;
            let n = within(&grants, from, from + 1_000);
            assert!((9..=12).contains(&n), "onset {onset} ms, {from}..+1 s: {n} retries for 100 requests");
        }
        let first = within(&grants, onset, onset + 1_000);
        assert!(first <= 15, "onset {onset} ms: {first} retries in the outage's first second");
    }
}

#[test]
fn u2_a_burst_window_is_whole_buckets_within_the_window_or_a_policy_error() {
    let ten = RatioBudgetPolicy::builder(0.1).ttl(Duration::from_secs(10)).buckets(10);
    assert!(matches!(ten.burst_window(Duration::ZERO).build(), Err(PolicyError::Zero { setting: "burst_window", .. })));
    assert!(matches!(
        ten.burst_window(Duration::from_millis(1_500)).build(),
        Err(PolicyError::Conflict { setting: "burst_window", other: "buckets", .. })
    ));
    assert!(matches!(
        ten.burst_window(Duration::from_secs(11)).build(),
        Err(PolicyError::Conflict { setting: "burst_window", other: "ttl", .. })
    ));
    assert!(matches!(
        ten.burst_window(Duration::MAX).build(),
        Err(PolicyError::Conflict { setting: "burst_window", other: "ttl", .. })
    ));
    assert_eq!(ten.burst_window(Duration::from_secs(10)).build().unwrap().burst_buckets(), Some(10));
    assert_eq!(ten.burst_window(Duration::from_secs(3)).build().unwrap().burst_buckets(), Some(3));
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a ratio budget
/// remembers the bucket width and count it was kept in, and under a policy with another width or
/// count it starts over empty, so counts kept in one shape are never read as buckets of another.
#[test]
fn u2_a_ratio_budget_driven_under_another_bucket_shape_starts_over_empty() {
    let ten = RatioBudgetPolicy::builder(0.5).ttl(Duration::from_secs(10)).buckets(10).min_retries_per_sec(0);
    let first = ten.build().unwrap();
    let other_count = ten.buckets(5).build().unwrap();
    let other_width = ten.ttl(Duration::from_secs(5)).build().unwrap();
    assert_eq!(other_count.bucket_width(), Duration::from_secs(2));
    assert_eq!((other_width.buckets(), other_width.bucket_width()), (10, Duration::from_millis(500)));
    for (name, second) in [("another bucket count", other_count), ("another bucket width", other_width)] {
        let mut b = RatioBudget::new();
        for _ in 0..10 {
            b.record_request(&first, secs(3));
        }
        assert!(b.try_acquire(&first, secs(3)).is_ok());
        assert_eq!((b.requests(), b.retries()), (10, 1));
        // The same instant, another shape: empty, so no request backs a retry.
        assert_eq!(b.try_acquire(&second, secs(3)), Err(BudgetRefused), "{name}");
        assert_eq!((b.requests(), b.retries()), (0, 0), "{name}: the counts started over");
        // From there it counts in the new shape.
        for _ in 0..4 {
            b.record_request(&second, secs(3));
        }
        assert_eq!((0..10).filter(|_| b.try_acquire(&second, secs(3)).is_ok()).count(), 2, "{name}");
        assert_eq!((b.requests(), b.retries()), (4, 2), "{name}");
        // And back under the first policy, it starts over again.
        b.record_request(&first, secs(3));
        assert_eq!((b.requests(), b.retries()), (1, 0), "{name}");
    }
}

/// A token bucket filled under a larger capacity (a persisted bucket, a replaced policy) is
/// read as full at the capacity of the policy it is driven under.
#[test]
fn u1_a_token_bucket_above_the_capacity_of_its_policy_grants_no_more_than_that_capacity() {
    let large = TokenBucketPolicy::aws();
    let small = TokenBucketPolicy::builder(10).success_refund_milli(0).build().unwrap();
    let mut b = TokenBucket::new(&large);
    assert_eq!(b.balance_milli(), 500_000);
    let granted = (0..1_000).filter(|_| b.try_acquire(&small, RetryClass::Transient).is_ok()).count();
    assert_eq!(granted, 10, "one token per retry, from at most 10 tokens");
    assert_eq!(b.balance_milli(), 0);
    // A refund is capped at the small capacity too.
    let mut b = TokenBucket::new(&large);
    b.record_success(&small, None);
    assert_eq!(b.balance_milli(), 10_000);
}

#[test]
fn u3_sixty_percent_ratio_grants_sixty_percent_not_all() {
    let p = RatioBudgetPolicy::builder(0.6).min_retries_per_sec(0).build().unwrap();
    let mut b = RatioBudget::new();
    for _ in 0..100 {
        b.record_request(&p, secs(0));
    }
    let granted = (0..100).filter(|_| b.try_acquire(&p, secs(0)).is_ok()).count();
    assert_eq!(granted, 60);
    // The truncated reciprocal grants them all: a withdrawal of `(1.0 / 0.6) as isize` = 1
    // per retry against a deposit of 1 per request.
    let truncated_cost = (1.0 / 0.6_f64) as i64;
    assert_eq!(100 / truncated_cost, 100);
    // Interleaved the same way: one request, then as many retries as allowed.
    let mut b = RatioBudget::new();
    let mut granted = 0;
    for _ in 0..1_000 {
        b.record_request(&p, secs(0));
        while b.try_acquire(&p, secs(0)).is_ok() {
            granted += 1;
        }
    }
    assert_eq!(granted, 600);
    // Other ratios that do not divide one: a third, and 0.7.
    for (ratio, expected) in [(1.0 / 3.0, 333), (0.7, 700), (0.001, 1), (1.0, 1_000)] {
        let p = RatioBudgetPolicy::builder(ratio).min_retries_per_sec(0).build().unwrap();
        let mut b = RatioBudget::new();
        for _ in 0..1_000 {
            b.record_request(&p, secs(0));
        }
        assert_eq!((0..2_000).filter(|_| b.try_acquire(&p, secs(0)).is_ok()).count(), expected, "ratio {ratio}");
    }
}

#[test]
fn u3_fractional_token_refunds_add_up_exactly() {
    // gRPC tokenRatio 0.001: a thousand successes are exactly one token.
    let p = TokenBucketPolicy::grpc(10, 0.001).unwrap();
    let mut b = TokenBucket::new(&p);
    for _ in 0..5 {
        let _ = b.try_acquire(&p, RetryClass::Transient);
    }
    assert_eq!(b.balance_milli(), 5_000);
    for _ in 0..1_000 {
        b.record_success(&p, None);
    }
    assert_eq!(b.balance_milli(), 6_000);
}

/// Runs `operations` retried operations against one shared budget: each fails until
/// `failures_each` attempts have failed, then succeeds. Returns the outcome of each.
fn run_shared(operations: usize, failures_each: u32, mut ask: impl FnMut(Instant) -> bool) -> Vec<(OutcomeKind, u64)> {
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build().unwrap())
        .max_attempts(10)
        .build()
        .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut retries: Vec<Retry<u64>> = (0..operations).map(|_| Retry::new()).collect();
    let mut outcomes = vec![None; operations];
    let mut now = Instant::ZERO;
    for r in &mut retries {
        r.handle_start(&policy, now).unwrap();
    }
    while outcomes.iter().any(Option::is_none) {
        for (i, r) in retries.iter_mut().enumerate() {
            while let Some(action) = r.poll_action() {
                match action {
                    RetryAction::Start { attempt, .. } if attempt > u64::from(failures_each) => {
                        r.handle_success(now, attempt).unwrap()
                    }
                    RetryAction::Start { attempt, .. } => {
                        r.handle_failure(&policy, now, attempt, Failure::retryable(attempt), &mut rng).unwrap()
                    }
                    RetryAction::Sleep { .. } => {
                        if !ask(now) {
                            r.handle_rejected(now).unwrap();
                        }
                    }
                    RetryAction::Finish { outcome, stats } => outcomes[i] = Some((outcome.kind(), stats.attempts)),
                    RetryAction::Abandon { .. } => {}
                }
            }
        }
        now = now.saturating_add(Duration::from_millis(10));
        for r in &mut retries {
            r.handle_timeout(&policy, now, &mut rng);
        }
    }
    outcomes.into_iter().map(Option::unwrap).collect()
}

#[test]
fn u4_a_shared_token_bucket_ends_operations_with_rejected_once_spent() {
    // 10 tokens, 1 per retry, refused at or below 3: six retries in all, shared by four
    // operations that each need two. Round 1: four grants; round 2: two grants, two refusals.
    let p = TokenBucketPolicy::builder(10).refuse_at_or_below(3).success_refund_milli(0).build().unwrap();
    let mut bucket = TokenBucket::new(&p);
    let outcomes = run_shared(4, 2, |_| bucket.try_acquire(&p, RetryClass::Transient).is_ok());
    assert_eq!(
        outcomes,
        [
            (OutcomeKind::Succeeded, 3),
            (OutcomeKind::Succeeded, 3),
            (OutcomeKind::Rejected, 2),
            (OutcomeKind::Rejected, 2),
        ]
    );
    assert_eq!(bucket.balance_milli(), 4_000);
}

#[test]
fn u4_a_shared_ratio_budget_ends_operations_with_rejected_beyond_its_ratio() {
    let p = RatioBudgetPolicy::builder(0.5).min_retries_per_sec(0).build().unwrap();
    let mut budget = RatioBudget::new();
    for _ in 0..6 {
        budget.record_request(&p, Instant::ZERO);
    }
    // Six operations, each needing one retry: half of them get it.
    let outcomes = run_shared(6, 1, |now| budget.try_acquire(&p, now).is_ok());
    let rejected = outcomes.iter().filter(|(kind, _)| *kind == OutcomeKind::Rejected).count();
    assert_eq!(rejected, 3, "{outcomes:?}");
    assert!(outcomes.iter().all(|(kind, attempts)| match kind {
        OutcomeKind::Rejected => *attempts == 1,
        OutcomeKind::Succeeded => *attempts == 2,
        _ => false,
    }));
}

#[derive(Clone, Copy, Debug)]
enum BucketOp {
    Retry(u8),
    Success { with_grant: bool },
    FinalFailure(u8),
}

fn bucket_policy() -> impl Strategy<Value = TokenBucketPolicy> {
    (
        1u32..50,
        1u64..5_000,
        1u64..5_000,
        1u64..5_000,
        0u64..3_000,
        any::<bool>(),
        any::<bool>(),
        0u32..100,
        any::<bool>(),
    )
        .prop_filter_map("valid", |(cap, a, b, c, refund, refund_retry, charge, threshold_pct, charge_final)| {
            let capacity = u64::from(cap) * 1_000;
            let threshold = (threshold_pct > 20).then(|| capacity * u64::from(threshold_pct - 20) / 100);
            persevere::TokenBucketPolicyBuilder {
                capacity_milli: capacity,
                throttling_cost_milli: a,
                transient_cost_milli: b,
                timeout_cost_milli: c,
                success_refund_milli: refund,
                refund_retry_cost: refund_retry,
                threshold_milli: threshold,
                charge_refused: charge,
                charge_final_failure: charge_final,
            }
            .build()
            .ok()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// G9 for a token bucket: the retries granted never cost more than the initial balance
    /// plus everything refunded, minus what must stay above the threshold; the balance matches
    /// an exact reference model. G12: a refusal changes nothing unless refusals are charged.
    #[test]
    fn g9_a_token_bucket_never_grants_more_than_its_tokens_allow(
        p in bucket_policy(),
        ops in prop::collection::vec(
            prop_oneof![
                3 => (0u8..3).prop_map(BucketOp::Retry),
                1 => any::<bool>().prop_map(|with_grant| BucketOp::Success { with_grant }),
                1 => (0u8..3).prop_map(BucketOp::FinalFailure),
            ],
            1..300,
        ),
    ) {
        let s = *p.settings();
        let mut b = TokenBucket::new(&p);
        let mut model: i128 = i128::from(s.capacity_milli);
        let mut credited: i128 = 0;
        let mut granted_cost: i128 = 0;
        let mut last_grant = None;
        let mut streak = Streak::default();
        for op in ops {
            match op {
                BucketOp::Retry(k) => {
                    let class = [RetryClass::Throttling, RetryClass::Transient, RetryClass::Timeout][k as usize];
                    let cost = i128::from(p.cost_milli(class));
                    let before = b.balance_milli();
                    let floor = s.threshold_milli.map_or(0, |t| i128::from(t) + 1);
                    let got = b.try_acquire(&p, class);
                    prop_assert_eq!(b.poll_event(), streak.after(got.is_ok()), "O1");
                    prop_assert_eq!(b.poll_event(), None, "O1: one event per retry asked for at most");
                    match got {
                        Ok(grant) => {
                            prop_assert!(model - cost >= floor, "granted below the threshold");
                            model -= cost;
                            granted_cost += cost;
                            last_grant = Some(grant);
                            // Every grant leaves the balance above the threshold.
                            prop_assert!(granted_cost <= i128::from(s.capacity_milli) + credited - floor);
                        }
                        Err(BudgetRefused) => {
                            prop_assert!(model - cost < floor, "refused with enough tokens");
                            if s.charge_refused {
                                model = (model - cost).max(0);
                            } else {
                                prop_assert_eq!(b.balance_milli(), before, "G12: a refusal takes nothing");
                            }
                        }
                    }
                }
                BucketOp::Success { with_grant } => {
                    let grant = if with_grant { last_grant.take() } else { None };
                    let refund = match grant {
                        Some(g) if s.refund_retry_cost => i128::from(g.cost_milli()),
                        _ => i128::from(s.success_refund_milli),
                    };
                    b.record_success(&p, grant);
                    let added = (model + refund).min(i128::from(s.capacity_milli)) - model;
                    credited += added;
                    model += added;
                }
                BucketOp::FinalFailure(k) => {
                    let class = [RetryClass::Throttling, RetryClass::Transient, RetryClass::Timeout][k as usize];
                    let before = b;
                    b.record_final_failure(&p, class);
                    if s.charge_final_failure {
                        model = (model - i128::from(p.cost_milli(class))).max(0);
                    } else {
                        prop_assert_eq!(b, before, "a final failure is not charged unless the policy says so");
                    }
                }
            }
            prop_assert_eq!(i128::from(b.balance_milli()), model);
            prop_assert!(b.balance_milli() <= s.capacity_milli);
        }
    }

    /// G9 for a ratio budget: whenever a retry is granted, the retries granted in the window
    /// ending then (it included) do not exceed ratio × requests in that window plus the floor,
    /// and a retry is refused only when they would; checked against a log of every event.
    /// (Later, requests may leave the window before the retries granted against them.)
    /// G12: a refusal leaves the window's counts as they were.
    #[test]
    fn g9_a_ratio_budget_never_grants_more_than_its_ratio_over_any_window(
        ratio_ppm in 0u32..=1_000_000,
        per_sec in 0u32..4,
        buckets in 1u32..=16,
        ttl_ms in 100u64..5_000,
        ops in prop::collection::vec((any::<bool>(), 0u64..400), 1..400),
    ) {
        let ratio = f64::from(ratio_ppm) / 1e6;
        let p = RatioBudgetPolicy::builder(ratio)
            .ttl(Duration::from_millis(ttl_ms))
            .buckets(buckets)
            .min_retries_per_sec(per_sec)
            .build()
            .unwrap();
        let width = p.bucket_width().as_nanos() as u64;
        let mut b = RatioBudget::new();
        let mut now = 0u64;
        // (epoch, is_request) of every counted event.
        let mut log: Vec<(u64, bool)> = Vec::new();
        let mut streak = Streak::default();
        for (is_request, advance_ms) in ops {
            now += advance_ms * 1_000_000;
            let epoch = now / width;
            let in_window = |log: &[(u64, bool)], request: bool| {
                log.iter().filter(|(e, r)| *r == request && e + u64::from(buckets) > epoch).count() as u64
            };
            if is_request {
                b.record_request(&p, Instant::from_nanos(now));
                log.push((epoch, true));
            } else {
                let requests = in_window(&log, true);
                let retries = in_window(&log, false);
                let got = b.try_acquire(&p, Instant::from_nanos(now));
                prop_assert_eq!(b.poll_event(), streak.after(got.is_ok()), "O1");
                match got {
                    Ok(()) => {
                        log.push((epoch, false));
                        prop_assert!(retries < p.allowance(requests), "granted beyond the allowance");
                    }
                    Err(BudgetRefused) => {
                        prop_assert!(retries >= p.allowance(requests), "refused below the allowance");
                        prop_assert_eq!((u64::from(b.requests()), u64::from(b.retries())), (requests, retries));
                    }
                }
            }
            let requests = in_window(&log, true);
            let retries = in_window(&log, false);
            prop_assert_eq!((u64::from(b.requests()), u64::from(b.retries())), (requests, retries));
            if !is_request && log.last() == Some(&(epoch, false)) {
                // Just granted: the window ending now, this retry included, is within the
                // budget, exactly: retries × 10⁶ ≤ ratio_ppm × requests + floor.
                prop_assert!(u128::from(retries) * 1_000_000
                    <= u128::from(p.ratio_ppm()) * u128::from(requests)
                        + u128::from(per_sec) * u128::from(ttl_ms) * 1_000_000 / 1_000);
            }
        }
    }
}

#[cfg(feature = "serde")]
#[test]
fn u1_budgets_round_trip_through_serde() {
    let p = TokenBucketPolicy::aws();
    assert_eq!(serde_json::from_str::<TokenBucketPolicy>(&serde_json::to_string(&p).unwrap()).unwrap(), p);
    let p = RatioBudgetPolicy::finagle();
    assert_eq!(serde_json::from_str::<RatioBudgetPolicy>(&serde_json::to_string(&p).unwrap()).unwrap(), p);
    let mut b = RatioBudget::new();
    b.record_request(&p, secs(3));
    assert_eq!(serde_json::from_str::<RatioBudget>(&serde_json::to_string(&b).unwrap()).unwrap(), b);
    // A burst window round-trips, and a policy saved before it existed still loads, without one.
    let bounded = RatioBudgetPolicy::builder(0.1).burst_window(Duration::from_secs(2)).build().unwrap();
    let json = serde_json::to_string(&bounded).unwrap();
    assert_eq!(serde_json::from_str::<RatioBudgetPolicy>(&json).unwrap(), bounded);
    let saved = r#"{"ratio":0.2,"ttl":{"secs":10,"nanos":0},"buckets":10,"min_retries_per_sec":10}"#;
    assert_eq!(serde_json::from_str::<RatioBudgetPolicy>(saved).unwrap(), RatioBudgetPolicy::finagle());
    // A saved burst window that does not fit the window is refused as it loads.
    let bad = r#"{"ratio":0.2,"ttl":{"secs":10,"nanos":0},"buckets":10,"min_retries_per_sec":10,"burst_window":{"secs":11,"nanos":0}}"#;
    assert!(serde_json::from_str::<RatioBudgetPolicy>(bad).is_err());
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a persisted ratio
/// budget whose totals are not the sums of its buckets, or whose current bucket is not one of its
/// buckets, is refused when it loads.
#[cfg(feature = "serde")]
#[test]
fn u2_a_loaded_ratio_budget_whose_totals_or_current_bucket_are_impossible_is_refused() {
    let p = RatioBudgetPolicy::finagle();
    let mut b = RatioBudget::new();
    for t in 0..3 {
        b.record_request(&p, secs(t));
        b.record_request(&p, secs(t));
    }
    b.try_acquire(&p, secs(2)).unwrap();
    let json = serde_json::to_string(&b).unwrap();
    assert_eq!(serde_json::from_str::<RatioBudget>(&json).unwrap(), b, "the unedited state loads");
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["count"], 10, "the budget's JSON shape changed: {json}");

    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 5] = [
        ("requests that are not the sum of the buckets", |v| v["requests"] = 7.into()),
        ("retries that are not the sum of the buckets", |v| v["retries"] = 0.into()),
        ("a current bucket equal to the bucket count", |v| v["slot"] = 10.into()),
        ("a current bucket near u32::MAX", |v| v["slot"] = u32::MAX.into()),
        ("a bucket count past the maximum", |v| v["count"] = 17.into()),
    ];
    for (what, edit) in edits {
        let mut edited = value.clone();
        edit(&mut edited);
        assert_ne!(edited, value, "{what}: the edit changed nothing");
        let err = serde_json::from_str::<RatioBudget>(&edited.to_string()).unwrap_err().to_string();
        assert!(err.contains("invalid state of a RatioBudget"), "{what}: {err}");
    }
}

#[test]
fn u2_finagle_percent_can_retry_above_one_grants_that_many_retries_per_request() {
    let now = Instant::from_secs(1);
    // Finagle's own test budget: "no minimum, and 1 request gives 1 retry" (`percentCanRetry =
    // 1.0`, `minRetriesPerSec = 0`, a one-minute ttl).
    let one = RatioBudgetPolicy::builder(1.0).ttl(Duration::from_secs(60)).min_retries_per_sec(0).build().unwrap();
    let mut budget = RatioBudget::new();
    budget.record_request(&one, now);
    assert!(budget.try_acquire(&one, now).is_ok());
    assert!(budget.try_acquire(&one, now).is_err());
    // "If 2.0 is used then every non-retry call will allow 2 retries."
    let two = RatioBudgetPolicy::builder(2.0).min_retries_per_sec(0).build().unwrap();
    let mut budget = RatioBudget::new();
    for _ in 0..3 {
        budget.record_request(&two, now);
    }
    let granted = (0..10).filter(|_| budget.try_acquire(&two, now).is_ok()).count();
    assert_eq!(granted, 6);
    // The largest ratio Finagle takes, on a full window, without overflow.
    let most = RatioBudgetPolicy::builder(1000.0).min_retries_per_sec(0).build().unwrap();
    let mut budget = RatioBudget::new();
    budget.record_request(&most, now);
    assert_eq!(most.allowance(u64::from(u32::MAX)), 1_000 * u64::from(u32::MAX));
    assert_eq!((0..2_000).filter(|_| budget.try_acquire(&most, now).is_ok()).count(), 1_000);
}

#[test]
fn u2_the_envoy_retry_budget_allows_a_share_of_the_requests_in_flight_and_never_fewer_than_its_floor() {
    use persevere::{ConcurrencyBudget, ConcurrencyBudgetPolicy, ConcurrencyError};

    let envoy = ConcurrencyBudgetPolicy::envoy();
    assert_eq!(Ok(envoy), ConcurrencyBudgetPolicy::builder(20.0).min_retry_concurrency(3).build(), "the defaults");
    assert_eq!((envoy.budget_percent(), envoy.min_retry_concurrency()), (20.0, 3));
    // Envoy's docs: "if there are 100 active requests and the budget_percent is set to 25,
    // there may be 25 active retries".
    let quarter = ConcurrencyBudgetPolicy::builder(25.0).build().unwrap();
    assert_eq!(quarter.limit(100), 25);
    // The floor: 10 requests at 20 % allow 2, but never fewer than 3.
    assert_eq!([envoy.limit(0), envoy.limit(10), envoy.limit(19), envoy.limit(20), envoy.limit(100)], [3, 3, 3, 4, 20]);
    // Exact, where a floating-point product is not: 33.3 % of 1 000 is 333.
    assert_eq!(ConcurrencyBudgetPolicy::builder(33.3).build().unwrap().limit(1_000), 333);

    let mut b = ConcurrencyBudget::new();
    assert_eq!(b.try_acquire(&envoy), Ok(()), "the floor holds with no request");
    for _ in 0..2 {
        b.try_acquire(&envoy).unwrap();
    }
    assert_eq!(b.try_acquire(&envoy), Err(BudgetRefused), "the fourth retry in flight");
    for _ in 0..20 {
        b.record_request_start();
    }
    assert_eq!((b.requests(), b.limit(&envoy)), (20, 4));
    assert_eq!(b.try_acquire(&envoy), Ok(()));
    b.release_retry().unwrap();
    // Misuse changes nothing.
    let mut empty = ConcurrencyBudget::new();
    assert_eq!(empty.record_request_end(), Err(ConcurrencyError::NoRequestInFlight));
    assert_eq!(empty.release_retry(), Err(ConcurrencyError::NoRetryInFlight));
    assert_eq!(empty, ConcurrencyBudget::new());

    assert!(matches!(ConcurrencyBudgetPolicy::builder(f64::NAN).build(), Err(PolicyError::NotFinite { .. })));
    assert!(matches!(ConcurrencyBudgetPolicy::builder(100.5).build(), Err(PolicyError::OutOfRange { .. })));
    assert!(matches!(ConcurrencyBudgetPolicy::builder(-1.0).build(), Err(PolicyError::OutOfRange { .. })));
    assert!(matches!(ConcurrencyBudgetPolicy::builder(0.0).build(), Err(PolicyError::Zero { .. })));
}

#[test]
fn o1_a_concurrency_budget_counts_the_events_it_pushes_out_unseen() {
    use persevere::{ConcurrencyBudget, ConcurrencyBudgetPolicy};

    let envoy = ConcurrencyBudgetPolicy::envoy();
    let mut b = ConcurrencyBudget::new();
    for _ in 0..3 {
        b.try_acquire(&envoy).unwrap();
    }
    // Spent, recovered, spent again: three events, and only two wait to be drained.
    assert_eq!(b.try_acquire(&envoy), Err(BudgetRefused));
    b.release_retry().unwrap();
    assert_eq!(b.try_acquire(&envoy), Ok(()));
    assert_eq!(b.try_acquire(&envoy), Err(BudgetRefused));
    assert_eq!(b.dropped_events(), 1);
    assert_eq!(b.poll_event(), Some(BudgetEvent::Recovered { refused: 1 }));
    assert_eq!(b.poll_event(), Some(BudgetEvent::Exhausted));
    assert_eq!(b.poll_event(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// U3 for the concurrency budget: a retry is granted exactly while the retries in flight
    /// are fewer than max(floor, ⌊percent × requests / 100⌋), computed here in rationals;
    /// misuse is refused and changes nothing.
    #[test]
    fn u3_the_concurrency_budget_grants_exactly_its_share_of_the_requests_in_flight(
        tenths in 0u32..=1_000,
        floor in 0u32..5,
        ops in prop::collection::vec(0u8..4, 1..400),
    ) {
        use persevere::{ConcurrencyBudget, ConcurrencyBudgetPolicy};
        prop_assume!(tenths > 0 || floor > 0);
        let policy = ConcurrencyBudgetPolicy::builder(f64::from(tenths) / 10.0).min_retry_concurrency(floor).build().unwrap();
        let mut b = ConcurrencyBudget::new();
        let (mut requests, mut retries) = (0u64, 0u64);
        let mut streak = Streak::default();
        for op in ops {
            let before = b;
            match op {
                0 => { b.record_request_start(); requests += 1; }
                1 => match b.record_request_end() {
                    Ok(()) => requests -= 1,
                    Err(_) => { prop_assert_eq!(requests, 0); prop_assert_eq!(b, before); }
                },
                2 => {
                    // tenths of a percent of the requests: ⌊tenths × requests / 1 000⌋.
                    let limit = (u64::from(tenths) * requests / 1_000).max(u64::from(floor));
                    let got = b.try_acquire(&policy);
                    prop_assert_eq!(b.poll_event(), streak.after(got.is_ok()), "O1");
                    match got {
                        Ok(()) => { prop_assert!(retries < limit); retries += 1; }
                        Err(_) => {
                            prop_assert!(retries >= limit);
                            prop_assert_eq!((b.requests(), b.retries()), (before.requests(), before.retries()));
                        }
                    }
                }
                _ => match b.release_retry() {
                    Ok(()) => retries -= 1,
                    Err(_) => { prop_assert_eq!(retries, 0); prop_assert_eq!(b, before); }
                },
            }
            prop_assert_eq!((b.requests(), b.retries()), (requests, retries));
        }
    }
}

#[test]
fn u1_grpc_rescales_a_bucket_when_its_policy_is_replaced() {
    // gRPC's service config changes from 10 tokens to 100 while the bucket holds 6 of 10: it
    // keeps its share, 60 of 100, so it throttles (60 > 50, one failure from 59) as before.
    let old = TokenBucketPolicy::grpc(10, 0.1).unwrap();
    let new = TokenBucketPolicy::grpc(100, 0.1).unwrap();
    let mut b = TokenBucket::new(&old);
    for _ in 0..4 {
        let _ = b.try_acquire(&old, RetryClass::Transient).unwrap();
    }
    assert_eq!(b.balance_milli(), 6_000);
    b.rescale(&old, &new);
    assert_eq!(b.balance_milli(), 60_000);
    // A share that does not divide evenly is rounded down: 2 of 3 tokens is two thirds of
    // 1 000 tokens, 666 666 milli-tokens.
    let mut b = TokenBucket::new(&TokenBucketPolicy::grpc(3, 0.1).unwrap());
    let _ = b.try_acquire(&TokenBucketPolicy::grpc(3, 0.1).unwrap(), RetryClass::Transient).unwrap();
    assert_eq!(b.balance_milli(), 2_000);
    b.rescale(&TokenBucketPolicy::grpc(3, 0.1).unwrap(), &TokenBucketPolicy::grpc(1_000, 0.1).unwrap());
    assert_eq!(b.balance_milli(), 666_666);
    // A balance kept under a larger capacity than `from` says is read as full at `from`'s.
    let mut full = TokenBucket::new(&new);
    full.rescale(&old, &old);
    assert_eq!(full.balance_milli(), 10_000);
}

#[test]
fn u1_a_retry_may_cost_the_whole_bucket_but_no_more() {
    let whole = TokenBucketPolicy::builder(3).costs(3, 3, 3).build().unwrap();
    assert_eq!(TokenBucket::new(&whole).try_acquire(&whole, RetryClass::Timeout).unwrap().cost_milli(), 3_000);
    assert!(matches!(
        TokenBucketPolicy::builder(3).costs(1, 4, 1).build(),
        Err(PolicyError::LimitTooLarge { setting: "transient cost", max: 3_000 })
    ));
}

#[test]
fn o1_a_token_bucket_counts_the_events_it_pushes_out_unseen() {
    // One token, a retry costs it and a success refunds it: grant, refuse, succeed, three times.
    let p = TokenBucketPolicy::builder(1).costs(1, 1, 1).success_refund_milli(1_000).build().unwrap();
    let mut b = TokenBucket::new(&p);
    for _ in 0..3 {
        let _ = b.try_acquire(&p, RetryClass::Transient).unwrap();
        assert_eq!(b.try_acquire(&p, RetryClass::Transient), Err(BudgetRefused));
        b.record_success(&p, None);
    }
    // Exhausted, recovered, exhausted, recovered, exhausted: five events, the latest two kept.
    assert_eq!(b.dropped_events(), 3);
    assert_eq!(b.poll_event(), Some(BudgetEvent::Recovered { refused: 1 }));
    assert_eq!(b.poll_event(), Some(BudgetEvent::Exhausted));
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.dropped_events(), 3, "the count stays, so the loss stays seen");
}

#[test]
fn o1_a_ratio_budget_counts_the_events_it_pushes_out_unseen() {
    // 20 % of requests plus 1 retry per second over 10 s: 10 retries before any request, then
    // one more for every 5 requests.
    let p = RatioBudgetPolicy::builder(0.2).min_retries_per_sec(1).build().unwrap();
    let mut b = RatioBudget::new();
    assert_eq!((0..11).filter(|_| b.try_acquire(&p, secs(0)).is_ok()).count(), 10);
    for _ in 0..2 {
        for _ in 0..5 {
            b.record_request(&p, secs(0));
        }
        assert_eq!(b.try_acquire(&p, secs(0)), Ok(()));
        assert_eq!(b.try_acquire(&p, secs(0)), Err(BudgetRefused));
    }
    // Exhausted, recovered, exhausted, recovered, exhausted: five events, the latest two kept.
    assert_eq!(b.dropped_events(), 3);
    assert_eq!(b.poll_event(), Some(BudgetEvent::Recovered { refused: 1 }));
    assert_eq!(b.poll_event(), Some(BudgetEvent::Exhausted));
    assert_eq!(b.poll_event(), None);
}

#[cfg(feature = "serde")]
#[test]
fn u2_a_loaded_ratio_budget_with_no_window_shape_must_be_empty() {
    // A budget not yet used has no window shape: it loads as it was saved, and one that holds
    // counts without a shape is refused.
    let fresh = RatioBudget::new();
    let json = serde_json::to_string(&fresh).unwrap();
    assert_eq!(serde_json::from_str::<RatioBudget>(&json).unwrap(), fresh);
    let mut edited: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(edited["width_ns"], 0, "the budget's JSON shape changed: {json}");
    edited["requests"] = 1.into();
    let err = serde_json::from_str::<RatioBudget>(&edited.to_string()).unwrap_err().to_string();
    assert!(err.contains("a window with no shape holds counts"), "{err}");
}

#[cfg(feature = "serde")]
#[test]
fn u2_a_ratio_budget_of_the_most_buckets_allowed_loads() {
    let p = RatioBudgetPolicy::builder(0.1).buckets(16).build().unwrap();
    let mut b = RatioBudget::new();
    b.record_request(&p, secs(0));
    let json = serde_json::to_string(&b).unwrap();
    assert_eq!(serde_json::from_str::<RatioBudget>(&json).unwrap(), b, "16 buckets: {json}");
}
