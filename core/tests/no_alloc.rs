//! The per-call paths allocate nothing (the project's bar, `benches/README.md`), proven with a
//! counting global allocator.
//!
//! The counter is per thread, so the test harness's own allocations on other threads do not
//! count; each test counts only what its closure does.

use std::time::Duration;

use persevere::{
    Backoff, BackoffState, Breaker, BreakerPolicy, CallOutcome, Failure, Flow, FlowPolicy, Instant, Jitter,
    RatioBudget, RatioBudgetPolicy, Retry, RetryAction, RetryClass, RetryPolicy, Supervision, SupervisionPolicy,
    TaskDefaults, TokenBucket, TokenBucketPolicy,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

use alloc_counter::allocations_in as allocations;

#[test]
fn the_counter_sees_an_allocation() {
    // Proves the harness can fail: a boxed value is counted.
    assert_eq!(allocations(|| drop(std::hint::black_box(Box::new(7u64)))), 1);
}

#[test]
fn next_delay_with_every_jitter_allocates_nothing() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for jitter in [Jitter::None, Jitter::Full, Jitter::Equal, Jitter::Proportional(0.2)] {
        let backoff = Backoff::exponential(Duration::from_millis(5), 2.0)
            .max_delay(Duration::from_secs(9))
            .jitter(jitter)
            .build()
            .unwrap();
        let mut state = BackoffState::new();
        let n = allocations(|| {
            for _ in 0..1_000 {
                std::hint::black_box(state.next_delay(&backoff, &mut rng));
            }
        });
        assert_eq!(n, 0, "{jitter:?}");
    }
}

#[test]
fn a_full_retry_cycle_allocates_nothing() {
    let policy =
        RetryPolicy::builder(Backoff::exponential(Duration::from_millis(5), 2.0).jitter(Jitter::Full).build().unwrap())
            .max_attempts(4)
            .total(Duration::from_secs(60))
            .attempt_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let n = allocations(|| {
        for round in 0..100u64 {
            let mut retry = Retry::<u64>::new();
            let mut now = Instant::from_secs(round);
            retry.handle_start(&policy, now).unwrap();
            loop {
                match retry.poll_action() {
                    Some(RetryAction::Start { attempt, .. }) if attempt < 3 => {
                        retry.handle_failure(&policy, now, attempt, Failure::retryable(round), &mut rng).unwrap();
                    }
                    Some(RetryAction::Start { attempt, .. }) => retry.handle_success(now, attempt).unwrap(),
                    Some(RetryAction::Finish { outcome, .. }) => {
                        std::hint::black_box(outcome);
                        break;
                    }
                    Some(_) => {}
                    None => {
                        now = retry.poll_timeout().unwrap();
                        retry.handle_timeout(&policy, now, &mut rng);
                    }
                }
            }
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn the_supervision_decision_allocates_nothing() {
    let policy = SupervisionPolicy::periodic(Duration::ZERO).build(&TaskDefaults::new()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut task = Supervision::<u32>::new();
    let mut now = Instant::ZERO;
    let n = allocations(|| {
        task.handle_start(&policy, now).unwrap();
        for attempt in 1..=10_000u64 {
            while task.poll_action().is_some() {}
            if attempt % 2 == 0 {
                task.handle_success(&policy, now, attempt).unwrap();
            } else {
                task.handle_failure(&policy, now, attempt, Failure::retryable(7), &mut rng).unwrap();
            }
            while task.poll_action().is_some() {}
            now = task.poll_timeout().unwrap();
            task.handle_timeout(&policy, now);
        }
    });
    assert_eq!(task.attempt(), 10_001);
    assert_eq!(n, 0);
}

#[test]
fn flow_outcome_transitions_allocate_nothing() {
    let policy = FlowPolicy::builder().with_trip(1_000).build().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut flow = Flow::<u32>::every(Instant::ZERO, Duration::from_millis(5));
    let mut now = Instant::ZERO;
    let n = allocations(|| {
        for run in 0..10_000u32 {
            now = flow.poll_timeout().unwrap().later(now);
            flow.handle_timeout(now);
            while flow.poll_action().is_some() {}
            match run % 3 {
                0 => flow.handle_failure(&policy, now, Failure::retryable(run), &mut rng).unwrap(),
                1 => flow.handle_cancel(now).unwrap(),
                _ => flow.handle_success(now).unwrap(),
            }
            let _ = flow.info();
        }
    });
    assert_eq!(flow.run_count(), 10_000);
    assert_eq!(n, 0);
}

#[test]
fn state_sizes() {
    // Recorded for the issue note; bounds that would catch an accidental growth.
    let sizes = (
        std::mem::size_of::<Supervision<()>>(),
        std::mem::size_of::<Supervision<u32>>(),
        std::mem::size_of::<Flow<()>>(),
        std::mem::size_of::<Flow<u32>>(),
    );
    println!("Supervision<()>, Supervision<u32>, Flow<()>, Flow<u32>: {sizes:?}");
    // Flow: 112 bytes until its trips and resets became actions (O1), whose trip reason can
    // carry an instant; 120 since.
    assert!(sizes.0 <= 64 && sizes.2 <= 120, "{sizes:?}");
}

#[test]
fn breaker_paths_allocate_nothing() {
    let backoff = Backoff::exponential(Duration::from_secs(1), 2.0)
        .max_delay(Duration::from_secs(30))
        .jitter(Jitter::Full)
        .build()
        .unwrap();
    let count = BreakerPolicy::builder(backoff)
        .consecutive_failures(5)
        .failure_rate(0.5)
        .slow_call_rate(0.9, Duration::from_millis(100))
        .count_window(100)
        .minimum_calls(10)
        .half_open_permits(3)
        .build()
        .unwrap();
    let timed = BreakerPolicy::builder(backoff)
        .failure_rate(0.5)
        .time_window(Duration::from_secs(10), 10)
        .minimum_calls(10)
        .build()
        .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for policy in [count, timed] {
        let mut b = Breaker::new(&policy, 1);
        let (mut rejections, mut probes) = (0u32, 0u32);
        let n = allocations(|| {
            let mut now = Instant::ZERO;
            for i in 0..100_000u64 {
                now = now.saturating_add(Duration::from_millis(1));
                // Closed path, then open, rejections, half-open probes, lease expiry.
                let outcome = if (i / 1_000) % 3 == 0 { CallOutcome::Failure } else { CallOutcome::Success };
                let acquired = b.try_acquire(&policy, now, &mut rng);
                rejections += u32::from(acquired.is_err());
                probes += u32::from(acquired.is_ok_and(|p| p.is_probe()));
                match acquired {
                    Ok(permit) if i % 17 != 0 => {
                        let _ = std::hint::black_box(b.record(&policy, now, permit, outcome, &mut rng));
                    }
                    Ok(_lost) => {}
                    Err(rejected) => {
                        std::hint::black_box(rejected);
                    }
                }
                b.handle_timeout(&policy, now, &mut rng);
                std::hint::black_box(b.poll_timeout());
            }
        });
        assert_eq!(n, 0, "{n} allocations on the breaker's paths");
        assert!(rejections > 0 && probes > 0, "every state was visited: {rejections} rejections, {probes} probes");
    }
}

#[test]
fn budget_paths_allocate_nothing() {
    let grpc = TokenBucketPolicy::grpc(100, 0.1).unwrap();
    let aws = TokenBucketPolicy::aws();
    let ratio = RatioBudgetPolicy::finagle();
    let (mut g, mut a, mut r) = (TokenBucket::new(&grpc), TokenBucket::new(&aws), RatioBudget::new());
    let n = allocations(|| {
        for i in 0..100_000u64 {
            let now = Instant::from_millis(i);
            let _ = std::hint::black_box(g.try_acquire(&grpc, RetryClass::Transient));
            g.record_success(&grpc, None);
            if let Ok(grant) = a.try_acquire(&aws, RetryClass::Timeout) {
                a.record_success(&aws, Some(grant));
            }
            r.record_request(&ratio, now);
            let _ = std::hint::black_box(r.try_acquire(&ratio, now));
        }
    });
    assert_eq!(n, 0, "{n} allocations on the budgets' paths");
}

#[test]
fn bulkhead_and_limiter_paths_allocate_nothing() {
    use persevere::{Bulkhead, BulkheadPolicy, Completion, Full, Limiter, LimiterPolicy, MinRttProbe};

    let policy = BulkheadPolicy::builder(2).max_wait(Duration::from_millis(5), 4).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let n = allocations(|| {
        for i in 0..1_000u64 {
            let now = Instant::from_micros(i * 100);
            let a = bulkhead.try_acquire(&policy, now).unwrap();
            let b = bulkhead.try_acquire(&policy, now).unwrap();
            // Both places taken: the third waits, and takes a place once one frees.
            let Err(Full::Queued(ticket)) = bulkhead.try_acquire(&policy, now) else { panic!("queued") };
            bulkhead.release(a).unwrap();
            let c = bulkhead.try_claim(&policy, now, ticket).unwrap().unwrap();
            bulkhead.handle_timeout(now);
            bulkhead.release(b).unwrap();
            bulkhead.release(c).unwrap();
        }
    });
    assert_eq!(n, 0, "bulkhead");
    let sizes = (std::mem::size_of::<Bulkhead>(), std::mem::size_of::<Limiter>());
    println!("Bulkhead, Limiter: {sizes:?}");
    // The bulkhead is its ring of 32 deadlines and three counters.
    assert!(sizes.0 <= 8 * 32 + 16 && sizes.1 <= 96, "{sizes:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for policy in [LimiterPolicy::aimd(), LimiterPolicy::vegas(), LimiterPolicy::gradient2()] {
        let policy = policy.to_builder().min_rtt_probe(MinRttProbe::envoy(Duration::from_millis(50))).build().unwrap();
        let mut limiter = Limiter::new(&policy, 1);
        let n = allocations(|| {
            for i in 0..10_000u64 {
                let now = Instant::from_micros(i * 10);
                limiter.handle_timeout(&policy, now);
                if let Ok(permit) = limiter.try_acquire(&policy, now) {
                    let done = now.saturating_add(Duration::from_micros(5 + i % 7));
                    limiter.release(&policy, done, permit, Completion::Success, &mut rng).unwrap();
                }
            }
        });
        assert_eq!(n, 0, "{:?}", policy.algorithm());
    }
}
