//! Rules P: each preset reproduces its source dialect's defaults and counting.

use core::time::Duration;

use persevere::presets::{self, WorkflowCap, WorkflowRetryOn};
use persevere::{
    Backoff, Breaker, BreakerStatus, CallOutcome, DEFAULT_MAX_HINT, Failure, FailureClass, Flow, FlowPolicy,
    FlowStatus, Instant, Jitter, LastFailure, Outcome, Retry, RetryAction, RetryClass, RetryPolicy, SupervisionPolicy,
    TaskDefaults, TokenBucket, TokenBucketPolicy, TripReason,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Fails every attempt with `failure` and returns the delays slept and the outcome (stops after
/// `limit` attempts with a cancel). Each action is acted on as it is polled: a start or a sleep
/// is always the last action of its input, so every input comes after a full drain.
fn delays(policy: &RetryPolicy, failure: impl Fn(u64) -> Failure<u64>, limit: u64) -> (Vec<Duration>, Outcome<u64>) {
    let mut r = ChaCha8Rng::seed_from_u64(4);
    let mut retry = Retry::new();
    let mut now = Instant::ZERO;
    let mut slept = Vec::new();
    retry.handle_start(policy, now).unwrap();
    loop {
        match retry.poll_action() {
            Some(RetryAction::Start { attempt, .. }) if attempt > limit => retry.handle_cancel(now).unwrap(),
            Some(RetryAction::Start { attempt, .. }) => {
                retry.handle_failure(policy, now, attempt, failure(attempt), &mut r).unwrap()
            }
            Some(RetryAction::Sleep { delay, until, .. }) => {
                assert!(!retry.has_actions(), "a sleep is the last action of its input");
                slept.push(delay);
                now = until;
                retry.handle_timeout(policy, now, &mut r);
            }
            Some(RetryAction::Finish { outcome, .. }) => return (slept, outcome),
            Some(RetryAction::Abandon { .. }) => {} // the cancel of the attempt past `limit`
            None => panic!("no deadlines here, so there is always an action"),
        }
    }
}

#[test]
fn p_the_scheduler_preset_is_f2_and_its_trip_counts_like_the_source() {
    assert_eq!(presets::scheduler(), FlowPolicy::default());
    assert_eq!(presets::scheduler_with_trip(3), FlowPolicy::builder().with_trip(3).build().unwrap());
    // The source trips on the first failure for 0; the unified builder refuses 0.
    let p = presets::scheduler_with_trip(0);
    assert_eq!(p, FlowPolicy::builder().with_trip(1).build().unwrap());
    let mut flow = Flow::<()>::cron(Instant::ZERO);
    flow.trigger(Instant::ZERO).unwrap();
    while flow.poll_action().is_some() {}
    flow.handle_failure(&p, Instant::ZERO, Failure::retryable(()), &mut ChaCha8Rng::seed_from_u64(1)).unwrap();
    assert_eq!(flow.status(), FlowStatus::Tripped { streak: 1, last_error: &(), reason: TripReason::Streak });
    assert!(FlowPolicy::builder().with_trip(0).build().is_err());
}

#[test]
fn p_the_supervisor_preset_is_s2() {
    let d = presets::supervisor();
    assert_eq!(d, TaskDefaults::default());
    assert_eq!(
        d.backoff,
        Backoff::exponential(Duration::from_millis(200), 2.0)
            .max_delay(secs(30))
            .jitter(Jitter::Equal)
            .build()
            .unwrap()
    );
    let p = SupervisionPolicy::from_defaults().build(&d).unwrap();
    assert_eq!((p.attempt_timeout(), p.max_retries(), p.min_spacing()), (None, None, Duration::from_millis(1)));
    // Hints are not in S2; the core honours them up to the default `max_hint` (B6).
    assert_eq!((d.max_hint, d.restart_after_hint), (DEFAULT_MAX_HINT, false));
    assert_eq!((p.max_hint(), p.restarts_after_hint()), (DEFAULT_MAX_HINT, false));
}

#[test]
fn p_the_workflow_engine_preset_makes_3_attempts_from_1s_capped_with_jitter_0_25() {
    for (cap, cap_secs) in [(WorkflowCap::Secs30, 30), (WorkflowCap::Secs60, 60)] {
        let p = presets::workflow_engine(cap);
        let expected = Backoff::exponential(secs(1), 2.0)
            .max_delay(secs(cap_secs))
            .jitter(Jitter::Proportional(0.25))
            .build()
            .unwrap();
        assert_eq!(p, RetryPolicy::builder(expected).max_attempts(3).build().unwrap());
        assert_eq!(p.max_hint(), DEFAULT_MAX_HINT, "the workflow engine keeps the default max_hint");
        assert_eq!(cap.duration(), secs(cap_secs));
        let (slept, outcome) = delays(&p, Failure::retryable, 100);
        assert_eq!(slept.len(), 2, "3 attempts in all");
        assert_eq!(outcome.kind(), persevere::OutcomeKind::Exhausted);
        for (n, d) in slept.iter().enumerate() {
            let envelope = secs(1 << n);
            assert!(*d >= envelope.mul_f64(0.75) && *d <= envelope.mul_f64(1.25), "{n}: {d:?}");
        }
        // A cap is a cap, also after the +25 % jitter (B2).
        let b = p.backoff();
        let mut r = ChaCha8Rng::seed_from_u64(8);
        for _ in 0..1_000 {
            assert!(b.delay(20, Duration::ZERO, &mut r) <= secs(cap_secs));
        }
    }
}

#[test]
fn p_the_workflow_engine_retries_only_transient_failures_when_asked() {
    let p = presets::workflow_engine(WorkflowCap::Secs30);
    let only = WorkflowRetryOn::TransientOnly;
    let (slept, outcome) = delays(&p, |a| only.classify(false, a), 100);
    assert!(slept.is_empty());
    assert_eq!(outcome, Outcome::Fatal { failure: LastFailure { class: FailureClass::Fatal, error: Some(1) } });
    let (slept, _) = delays(&p, |a| only.classify(true, a), 100);
    assert_eq!(slept.len(), 2);
    let (slept, _) = delays(&p, |a| WorkflowRetryOn::default().classify(false, a), 100);
    assert_eq!(slept.len(), 2, "by default every failure is retried");
}

#[test]
fn p_the_durable_step_preset_is_1s_x2_cap_100s_unlimited_without_jitter_and_honours_retry_after() {
    let p = presets::durable_step();
    let expected = Backoff::exponential(secs(1), 2.0).max_delay(secs(100)).build().unwrap();
    // Unlimited on purpose (R3: a policy without a limit must say so), and any hint is
    // honoured in full (B6: `max_hint` is `Duration::MAX`).
    assert_eq!(p, RetryPolicy::builder(expected).unbounded().max_hint(Duration::MAX).build().unwrap());
    assert!(p.is_unbounded());
    assert_eq!(p.max_hint(), Duration::MAX);
    let (slept, _) = delays(&p, Failure::retryable, 12);
    let want: Vec<_> = [1, 2, 4, 8, 16, 32, 64, 100, 100, 100, 100, 100].into_iter().map(secs).collect();
    assert_eq!(slept, want, "no jitter; unlimited until canceled");
    let (slept, _) = delays(&p, |a| if a == 2 { Failure::retry_after(secs(7), a) } else { Failure::retryable(a) }, 4);
    assert_eq!(slept, vec![secs(1), secs(7), secs(4), secs(8)], "the hint replaces one delay and counts as a step");
    // However long: a day is waited in full, never shortened and never deferred.
    let day = secs(86_400);
    let (slept, _) = delays(&p, |a| if a == 2 { Failure::retry_after(day, a) } else { Failure::retryable(a) }, 3);
    assert_eq!(slept, vec![secs(1), day, secs(4)]);
}

#[test]
fn p_the_workflow_engine_defers_a_hint_past_the_default_max_hint() {
    // B6: the workflow engine keeps the default `max_hint` (5 min): a longer hint ends the
    // operation `Deferred` with the hinted instant, never shortened; a shorter one is waited.
    let p = presets::workflow_engine(WorkflowCap::Secs30);
    let (slept, outcome) = delays(&p, |a| Failure::retry_after(secs(3_600), a), 100);
    assert!(slept.is_empty(), "{slept:?}");
    assert_eq!(
        outcome,
        Outcome::Deferred {
            retry_at: Instant::ZERO + secs(3_600),
            last_failure: LastFailure { class: FailureClass::RetryAfter, error: Some(1) },
        }
    );
    let (slept, _) = delays(&p, |a| Failure::retry_after(DEFAULT_MAX_HINT, a), 100);
    assert_eq!(slept, vec![DEFAULT_MAX_HINT, DEFAULT_MAX_HINT], "past the 30 s cap: a hint is not the schedule's");
}

#[test]
fn p_the_durable_step_reads_zero_attempts_as_unlimited_like_the_source() {
    assert_eq!(presets::durable_step_with_max_attempts(0), presets::durable_step());
    assert_eq!(presets::durable_step_with_max_attempts(0).max_attempts(), None);
    let p = presets::durable_step_with_max_attempts(1);
    assert_eq!(p.max_attempts(), Some(1));
    assert!(delays(&p, Failure::retryable, 10).0.is_empty(), "1 attempt: no retry");
    assert!(RetryPolicy::builder(*p.backoff()).max_attempts(0).build().is_err(), "unified: 0 is refused");
}

#[test]
fn p_the_aws_standard_retry_makes_3_attempts_with_full_jitter_from_100ms_capped_at_20s() {
    let policy = presets::aws_standard_retry();
    assert_eq!(policy.max_attempts(), Some(3));
    let backoff = policy.backoff();
    let full_jitter = |base| Backoff::exponential(base, 2.0).max_delay(secs(20)).jitter(Jitter::Full).build().unwrap();
    assert_eq!(*backoff, full_jitter(Duration::from_millis(100)));
    assert_eq!(backoff.jitter_kind(), Jitter::Full);
    // THROTTLING_RETRY_DELAY_BASE: throttled failures back off from 500 ms.
    let throttling = policy.throttling_backoff().expect("a throttling schedule");
    assert_eq!(*throttling, full_jitter(Duration::from_millis(500)));
    let throttled: Vec<Duration> = (1..=7).map(|n| throttling.envelope(n)).collect();
    assert_eq!(throttled, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000].map(Duration::from_millis));
    // `min(DEFAULT_RETRY_DELAY_BASE × 2^i, MAXIMUM_RETRY_DELAY)` for retry i = 0, 1, …: the
    // core's envelope counts failures from 1.
    let ms = Duration::from_millis;
    let envelopes: Vec<Duration> = (1..=10).map(|n| backoff.envelope(n)).collect();
    let expected = [100, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 20_000, 20_000].map(ms);
    assert_eq!(envelopes, expected);
    // Every failure is retried until the third attempt; each delay is drawn from [0, envelope].
    let (slept, outcome) = delays(&policy, Failure::retryable, 10);
    assert_eq!(slept.len(), 2);
    assert!(slept[0] <= ms(100) && slept[1] <= ms(200), "{slept:?}");
    assert!(matches!(outcome, Outcome::Exhausted { .. }));
    // Throttled failures draw exactly what a policy on the throttling schedule draws from the
    // same random numbers.
    let (slept, _) = delays(&policy, Failure::throttled, 10);
    let on_throttling = RetryPolicy::builder(*throttling).max_attempts(3).build().unwrap();
    assert_eq!(slept, delays(&on_throttling, Failure::retryable, 10).0);
    assert_ne!(slept, delays(&policy, Failure::retryable, 10).0);
    // With the retry quota: 500 tokens at RETRY_COST 5 pay for exactly 100 retries, at
    // TIMEOUT_RETRY_COST 10 for 50.
    let quota = TokenBucketPolicy::aws();
    for (class, granted) in [(RetryClass::Transient, 100), (RetryClass::Timeout, 50)] {
        let mut bucket = TokenBucket::new(&quota);
        let got = (0..200).filter(|_| bucket.try_acquire(&quota, class).is_ok()).count();
        assert_eq!(got, granted, "{class:?}");
    }
}

/// Records `outcomes` (true: a failure) at `now`, each taking `took`.
fn record(breaker: &mut Breaker, policy: &persevere::BreakerPolicy, now: Instant, took: Duration, failures: &[bool]) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for &failed in failures {
        let permit = breaker.try_acquire(policy, now, &mut rng).expect("admitted");
        let outcome = if failed { CallOutcome::Failure } else { CallOutcome::Success };
        breaker.record(policy, now + took, permit, outcome, &mut rng).unwrap();
    }
}

#[test]
fn p_the_resilience4j_breaker_opens_at_half_of_100_calls_waits_60s_and_admits_10_probes() {
    let policy = presets::resilience4j_breaker();
    let t0 = Instant::from_secs(1);
    let fast = Duration::from_millis(5);
    // "If only 99 calls have been recorded the breaker will not open even if all 99 failed."
    let mut breaker = Breaker::new(&policy, 1);
    record(&mut breaker, &policy, t0, fast, &[true; 99]);
    assert_eq!(breaker.status(), BreakerStatus::Closed);
    record(&mut breaker, &policy, t0, fast, &[true]);
    assert!(matches!(breaker.status(), BreakerStatus::Open { .. }), "the 100th call makes 100 % ≥ 50 %");
    // 49 % of the last 100 keeps it closed; 50 % opens it ("equal or greater than the threshold").
    let mut breaker = Breaker::new(&policy, 2);
    let mut calls = vec![false; 51];
    calls.extend([true; 49]);
    record(&mut breaker, &policy, t0, fast, &calls);
    assert_eq!(breaker.status(), BreakerStatus::Closed);
    record(&mut breaker, &policy, t0, fast, &[true]);
    assert!(matches!(breaker.status(), BreakerStatus::Open { .. }), "the oldest success left: 50 of 100");
    // Open for waitDurationInOpenState = 60 s, then 10 probes at once.
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let opened = t0 + fast;
    assert!(breaker.try_acquire(&policy, opened + secs(60) - Duration::from_nanos(1), &mut rng).is_err());
    let half_open = opened + secs(60);
    let probes: Vec<_> = (0..10).map(|_| breaker.try_acquire(&policy, half_open, &mut rng).expect("a probe")).collect();
    assert!(breaker.try_acquire(&policy, half_open, &mut rng).is_err(), "an 11th probe");
    for probe in probes {
        breaker.record(&policy, half_open + fast, probe, CallOutcome::Success, &mut rng).unwrap();
    }
    assert_eq!(breaker.status(), BreakerStatus::Closed, "10 successful probes close it");
    // Half-open decides by the rates over the 10 probes: 4 failed (40 %) close it, 5 failed
    // (50 %, "equal or greater") reopen it; no decision before the 10th answer.
    for (failed, reopens) in [(4, false), (5, true)] {
        let mut breaker = Breaker::new(&policy, 4);
        record(&mut breaker, &policy, t0, fast, &[true; 100]);
        let probes: Vec<_> =
            (0..10).map(|_| breaker.try_acquire(&policy, half_open, &mut rng).expect("a probe")).collect();
        for (i, probe) in probes.into_iter().enumerate() {
            assert!(matches!(breaker.status(), BreakerStatus::HalfOpen { .. }), "undecided after {i} answers");
            let outcome = if i < failed { CallOutcome::Failure } else { CallOutcome::Success };
            breaker.record(&policy, half_open + fast, probe, outcome, &mut rng).unwrap();
        }
        assert_eq!(matches!(breaker.status(), BreakerStatus::Open { .. }), reopens, "{failed} of 10 probes failed");
        assert_eq!(breaker.status() == BreakerStatus::Closed, !reopens);
    }
    // Slow calls (longer than 60 s) open it only when all of the 100 are slow; a call of
    // exactly 60 s is not slow.
    let slow = secs(60) + Duration::from_nanos(1);
    let mut breaker = Breaker::new(&policy, 3);
    record(&mut breaker, &policy, t0, secs(60), &[false]);
    record(&mut breaker, &policy, t0, slow, &[false; 99]);
    assert_eq!(breaker.status(), BreakerStatus::Closed, "99 of 100 slow");
    record(&mut breaker, &policy, t0, slow, &[false]);
    assert!(matches!(breaker.status(), BreakerStatus::Open { .. }), "the 60 s call left: 100 of 100 slow");
}
