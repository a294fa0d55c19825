//! Rule O1: every machine reports its transitions as outputs, with the reason.

use core::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerEvent, BreakerPolicy, BreakerPolicyBuilder, BreakerReason, BreakerState, BreakerStatus,
    CallOutcome, Instant,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn rng() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(5)
}

/// Open for 1 s, then 2 s, 4 s, … up to 8 s; no jitter.
fn breaker_policy(configure: impl FnOnce(BreakerPolicyBuilder) -> BreakerPolicyBuilder) -> BreakerPolicy {
    let open = Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(8)).build().unwrap();
    configure(BreakerPolicy::builder(open)).build().unwrap()
}

fn call(b: &mut Breaker, p: &BreakerPolicy, acquired: Instant, ended: Instant, outcome: CallOutcome) {
    let permit = b.try_acquire(p, acquired, &mut rng()).unwrap();
    b.record(p, ended, permit, outcome, &mut rng()).unwrap();
}

fn drain(b: &mut Breaker) -> Vec<(BreakerState, BreakerState, Instant, BreakerReason)> {
    std::iter::from_fn(|| b.poll_event()).map(|e| (e.from.state(), e.to.state(), e.at, e.reason)).collect()
}

use BreakerReason as R;
use BreakerState as S;

#[test]
fn o1_the_breaker_reports_each_transition_with_the_rule_that_made_it() {
    let p = breaker_policy(|b| b.consecutive_failures(2));
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(0), CallOutcome::Failure);
    assert_eq!(b.poll_event(), None, "one failure of two changes nothing");
    call(&mut b, &p, at(10), at(10), CallOutcome::Failure);
    let opened = b.poll_event().expect("the second failure opens it");
    assert_eq!(
        (opened.from, opened.to, opened.at, opened.reason, opened.generation),
        (BreakerStatus::Closed, BreakerStatus::Open { until: at(1_010) }, at(10), R::ConsecutiveFailures, 1)
    );
    assert_eq!(opened.open_for(), Some(Duration::from_secs(1)));
    assert_eq!(b.poll_event(), None, "drained");

    // At `until` the first probe turns it half-open; the probe fails and it reopens for 2 s.
    call(&mut b, &p, at(1_010), at(1_020), CallOutcome::Failure);
    let events: Vec<BreakerEvent> = std::iter::from_fn(|| b.poll_event()).collect();
    assert_eq!(events.len(), 2);
    assert_eq!((events[0].to, events[0].reason), (BreakerStatus::HalfOpen { permits: 0 }, R::OpenPeriodEnded));
    assert_eq!(events[1].from, BreakerStatus::HalfOpen { permits: 0 }, "the probe has come back");
    assert_eq!((events[1].reason, events[1].open_for()), (R::ProbeFailed, Some(Duration::from_secs(2))));
    assert_eq!(events[0].open_for(), None);
    assert_eq!((events[0].generation, events[1].generation), (2, 3));

    // The next probe succeeds and closes it.
    call(&mut b, &p, at(3_020), at(3_030), CallOutcome::Success);
    assert_eq!(
        drain(&mut b),
        [
            (S::Open, S::HalfOpen, at(3_020), R::OpenPeriodEnded),
            (S::HalfOpen, S::Closed, at(3_030), R::ProbesSucceeded),
        ]
    );

    // By hand: every change of kind is an event; a reset of a closed breaker is none.
    b.handle_isolate(at(4_000));
    b.handle_disable(at(4_001));
    b.handle_metrics_only(&p, at(4_002));
    assert_eq!(
        drain(&mut b),
        [
            (S::Closed, S::Isolated, at(4_000), R::ByHand),
            (S::Isolated, S::Disabled, at(4_001), R::ByHand),
            (S::Disabled, S::MetricsOnly, at(4_002), R::ByHand),
        ]
    );
    b.handle_reset(&p, at(4_003));
    b.handle_reset(&p, at(4_004));
    b.handle_open(&p, at(4_005), &mut rng()).unwrap();
    b.handle_half_open(&p, at(4_006), &mut rng()).unwrap();
    assert_eq!(
        drain(&mut b),
        [
            (S::MetricsOnly, S::Closed, at(4_003), R::ByHand),
            (S::Closed, S::Open, at(4_005), R::ByHand),
            (S::Open, S::HalfOpen, at(4_006), R::ByHand),
        ]
    );
    // A refused transition by hand makes none.
    assert!(b.handle_half_open(&p, at(4_007), &mut rng()).is_err());
    assert_eq!(b.poll_event(), None);
}

#[test]
fn o1_an_opening_names_the_rate_that_tripped_it() {
    let p = breaker_policy(|b| b.failure_rate(0.5).count_window(4));
    let mut b = Breaker::new(&p, 1);
    for (i, outcome) in
        [CallOutcome::Success, CallOutcome::Failure, CallOutcome::Success, CallOutcome::Failure].into_iter().enumerate()
    {
        call(&mut b, &p, at(i as u64), at(i as u64), outcome);
    }
    assert_eq!(drain(&mut b), [(S::Closed, S::Open, at(3), R::FailureRate)]);

    let p = breaker_policy(|b| b.slow_call_rate(0.5, ms(100)).count_window(2));
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(1), CallOutcome::Success);
    call(&mut b, &p, at(1), at(200), CallOutcome::Success);
    assert_eq!(drain(&mut b), [(S::Closed, S::Open, at(200), R::SlowCallRate)]);

    // Half-open by rates: the probes' failure rate reopens it, and says so.
    let p = breaker_policy(|b| {
        b.consecutive_failures(1).failure_rate(0.5).count_window(10).half_open_permits(2).half_open_by_rates()
    });
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(0), CallOutcome::Failure);
    let first = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    let second = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    b.record(&p, at(1_001), first, CallOutcome::Success, &mut rng()).unwrap();
    b.record(&p, at(1_002), second, CallOutcome::Failure, &mut rng()).unwrap();
    assert_eq!(
        drain(&mut b),
        [
            (S::Closed, S::Open, at(0), R::ConsecutiveFailures),
            (S::Open, S::HalfOpen, at(1_000), R::OpenPeriodEnded),
            (S::HalfOpen, S::Open, at(1_002), R::FailureRate),
        ]
    );
}

/// A probe lease that ran out is noticed late, after the reopening it caused has itself ended:
/// the breaker went half-open → open → half-open within one input. Comparing the status before
/// and after that input (as the shared driver's `Breaker` once did) shows no change at all;
/// the events show both.
#[test]
fn o1_a_lease_noticed_late_is_two_transitions_not_none() {
    let p = breaker_policy(|b| b.consecutive_failures(1).probe_timeout(ms(500)));
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(0), CallOutcome::Failure);
    let _lost = b.try_acquire(&p, at(1_000), &mut rng()).unwrap();
    drain(&mut b);
    let before = b.status();
    b.handle_timeout(&p, at(4_000), &mut rng());
    assert_eq!(before.state(), b.status().state(), "half-open before, half-open after");
    let events: Vec<BreakerEvent> = std::iter::from_fn(|| b.poll_event()).collect();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].from, events[0].to, events[0].at, events[0].reason),
        (BreakerStatus::HalfOpen { permits: 1 }, BreakerStatus::Open { until: at(3_500) }, at(1_500), R::ProbeExpired),
        "reopened at the lease's deadline, for the next open duration (2 s)"
    );
    assert_eq!(
        (events[1].to, events[1].at, events[1].reason),
        (BreakerStatus::HalfOpen { permits: 0 }, at(4_000), R::OpenPeriodEnded)
    );
}

#[test]
fn o1_an_undrained_breaker_keeps_the_latest_four_events_and_counts_the_rest() {
    let p = breaker_policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(0), CallOutcome::Success);
    assert_eq!(b.poll_event(), None, "the closed path makes no event");
    for i in 0..3 {
        b.handle_isolate(at(i * 2));
        b.handle_reset(&p, at(i * 2 + 1));
    }
    assert_eq!(b.dropped_events(), 2, "six events, four kept");
    let kept = drain(&mut b);
    assert_eq!(kept.len(), 4);
    assert_eq!(kept[0], (S::Closed, S::Isolated, at(2), R::ByHand), "the oldest two were pushed out");
    assert_eq!(b.dropped_events(), 2, "the count stays, so the loss stays seen");
}

#[cfg(feature = "serde")]
#[test]
fn o1_events_are_outputs_and_a_saved_breaker_leaves_them_out() {
    let p = breaker_policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    call(&mut b, &p, at(0), at(0), CallOutcome::Failure);
    let saved = serde_json::to_string(&b).unwrap();
    let mut loaded: Breaker = serde_json::from_str(&saved).unwrap();
    assert_eq!(loaded.poll_event(), None);
    assert_eq!(b.poll_event().map(|e| e.reason), Some(R::ConsecutiveFailures));
    assert_eq!(loaded, b, "events take no part in equality: the loaded breaker is the saved one");
}

#[test]
fn o1_a_budget_tells_when_it_is_exhausted_and_when_it_recovers() {
    use persevere::{
        BudgetEvent, ConcurrencyBudget, ConcurrencyBudgetPolicy, RatioBudget, RatioBudgetPolicy, RetryClass,
        TokenBucket, TokenBucketPolicy,
    };

    // gRPC's bucket of 4 tokens, refusing at or below 2: one retry, then refusals until a
    // success refills it.
    let p = TokenBucketPolicy::grpc(4, 1.0).unwrap();
    let mut bucket = TokenBucket::new(&p);
    assert!(bucket.try_acquire(&p, RetryClass::Transient).is_ok());
    assert_eq!(bucket.poll_event(), None, "a grant while granting is no turn");
    for _ in 0..3 {
        assert!(bucket.try_acquire(&p, RetryClass::Transient).is_err());
    }
    assert_eq!(bucket.poll_event(), Some(BudgetEvent::Exhausted), "told once, at the first refusal");
    assert_eq!(bucket.poll_event(), None);
    // gRPC charges refused retries too: the three refusals left 0 tokens; four successes refill it.
    for _ in 0..4 {
        bucket.record_success(&p, None);
    }
    assert_eq!(bucket.poll_event(), None, "refilled is not recovered: no retry was granted yet");
    assert!(bucket.try_acquire(&p, RetryClass::Transient).is_ok());
    assert_eq!(bucket.poll_event(), Some(BudgetEvent::Recovered { refused: 3 }));

    // Finagle's ratio budget with no floor: no request, no retry.
    let p = RatioBudgetPolicy::builder(0.5).min_retries_per_sec(0).build().unwrap();
    let mut ratio = RatioBudget::new();
    assert!(ratio.try_acquire(&p, at(0)).is_err());
    assert_eq!(ratio.poll_event(), Some(BudgetEvent::Exhausted), "exhausted from the start");
    ratio.record_request(&p, at(1));
    ratio.record_request(&p, at(1));
    assert!(ratio.try_acquire(&p, at(2)).is_ok());
    assert_eq!(ratio.poll_event(), Some(BudgetEvent::Recovered { refused: 1 }));
    // A new window shape (another ttl) starts the counts over, not the run of refusals.
    assert!(ratio.try_acquire(&p, at(2)).is_err());
    assert_eq!(ratio.poll_event(), Some(BudgetEvent::Exhausted));
    let wider = RatioBudgetPolicy::builder(0.5).ttl(Duration::from_secs(60)).min_retries_per_sec(0).build().unwrap();
    for _ in 0..4 {
        ratio.record_request(&wider, at(3));
    }
    assert!(ratio.try_acquire(&wider, at(3)).is_ok());
    assert_eq!(ratio.poll_event(), Some(BudgetEvent::Recovered { refused: 1 }), "the run survived the new shape");

    // Envoy's: at most 3 retries in flight with few requests.
    let p = ConcurrencyBudgetPolicy::envoy();
    let mut in_flight = ConcurrencyBudget::new();
    for _ in 0..3 {
        assert!(in_flight.try_acquire(&p).is_ok());
    }
    assert!(in_flight.try_acquire(&p).is_err());
    assert!(in_flight.try_acquire(&p).is_err());
    in_flight.release_retry().unwrap();
    assert!(in_flight.try_acquire(&p).is_ok());
    let told: Vec<BudgetEvent> = std::iter::from_fn(|| in_flight.poll_event()).collect();
    assert_eq!(told, [BudgetEvent::Exhausted, BudgetEvent::Recovered { refused: 2 }]);
    assert_eq!(in_flight.dropped_events(), 0);
}

#[test]
fn o1_a_flow_tells_its_trip_and_its_reset() {
    use persevere::{Failure, Flow, FlowAction, FlowError, FlowPolicy, TripReason};

    let policy = FlowPolicy::builder().with_trip(2).build().unwrap();
    let mut flow = Flow::<&str>::every(Instant::ZERO, Duration::from_secs(10));
    let mut rng = rng();
    for (run, t) in [(1, 0), (2, 2)] {
        flow.trigger(at(t)).unwrap();
        assert_eq!(flow.poll_action(), Some(FlowAction::Dispatch { run }));
        flow.handle_failure(&policy, at(t + 1), Failure::retryable("down"), &mut rng).unwrap();
    }
    assert_eq!(flow.poll_action(), Some(FlowAction::Tripped { streak: 2, reason: TripReason::Streak }));
    assert_eq!(flow.poll_action(), None, "one backoff before it: no action");

    // A fatal failure trips at once, and says why.
    let mut fatal = Flow::<&str>::every(Instant::ZERO, Duration::from_secs(10));
    fatal.trigger(at(0)).unwrap();
    fatal.poll_action();
    fatal.handle_failure(&policy, at(1), Failure::fatal("bad config"), &mut rng).unwrap();
    assert_eq!(fatal.poll_action(), Some(FlowAction::Tripped { streak: 1, reason: TripReason::Fatal }));

    // The reset is told with the streak it cleared; a reset of a flow with none is not told.
    flow.reset_flow(at(10)).unwrap();
    assert_eq!(flow.poll_action(), Some(FlowAction::Reset { streak: 2, tripped: true }));
    flow.reset_flow(at(11)).unwrap();
    assert_eq!(flow.poll_action(), None);
    // The drain rule holds for resets as for every input: the trip waits, so the reset is refused.
    let mut undrained = Flow::<&str>::every(Instant::ZERO, Duration::from_secs(10));
    undrained.trigger(at(0)).unwrap();
    undrained.poll_action();
    undrained.handle_failure(&policy, at(1), Failure::fatal("bad config"), &mut rng).unwrap();
    let before = undrained;
    assert_eq!(undrained.reset_flow(at(2)), Err(FlowError::Undrained));
    assert_eq!(undrained, before, "a refused reset changes nothing");
}
