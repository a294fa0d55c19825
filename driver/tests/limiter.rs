//! The shared `Limiter` (L2, L4, T4) on a virtual clock: places are leases returned however a
//! call ends, completions carry the RTT the runtime's clock measured, and a full limit sheds
//! calls and refuses retries with how long to wait.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};
use std::time::Duration;

use futures_lite::future::{block_on, pending};
use persevere::{Completion, FailureClass, LimitAlgorithm, LimiterPolicy, OutcomeKind, RetryPolicy};
use persevere_driver::{Gate, Limiter, Refusal, RetryGate, ShedError, retry};

mod common;
use common::Virtual;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// AIMD that halves on a drop or a call slower than 50 ms, its limit in [1, `max`] from `max`.
fn aimd(rt: &Virtual, max: u32) -> Limiter<Virtual> {
    let algorithm = LimitAlgorithm::Aimd { backoff_ratio: 0.5, timeout: ms(50) };
    Limiter::with_runtime(rt.clone(), LimiterPolicy::builder(algorithm).limits(1, max, max).build().unwrap())
}

#[test]
fn l4_a_guard_returns_its_place_once_and_a_dropped_guard_samples_nothing() {
    let rt = Virtual::default();
    let limiter = aimd(&rt, 2);
    let first = limiter.try_acquire().unwrap();
    let second = limiter.try_acquire().unwrap();
    assert_eq!(limiter.in_flight(), 2);
    let refusal = limiter.try_acquire().unwrap_err();
    assert_eq!(refusal, Refusal::new(Gate::Limiter, Some(Duration::ZERO)), "no RTT measured yet");
    assert_eq!(refusal.to_string(), "the concurrency limit is full (retry after 0ns)");
    // Dropped without a verdict: the place returns, the limit does not move.
    rt.advance(ms(500));
    drop(first);
    assert_eq!((limiter.in_flight(), limiter.limit()), (1, 2));
    // A reported drop returns the place and backs off.
    second.dropped();
    assert_eq!((limiter.in_flight(), limiter.limit()), (0, 1));
}

#[test]
fn l2_a_call_reports_the_rtt_measured_on_the_runtime_clock() {
    let rt = Virtual::default();
    let limiter = aimd(&rt, 8);
    // An answer in 10 ms: a success, and the limit stays (AIMD adds only under load).
    let clock = rt.clone();
    let ok = block_on(limiter.call(async move {
        clock.advance(ms(10));
        Ok::<_, ()>(7)
    }));
    assert_eq!((ok, limiter.limit()), (Ok(7), 8));
    // An answer in 80 ms, past AIMD's 50 ms timeout: a loss, measured by the runtime's clock.
    let clock = rt.clone();
    let slow = block_on(limiter.call(async move {
        clock.advance(ms(80));
        Ok::<_, ()>(8)
    }));
    assert_eq!((slow, limiter.limit(), limiter.in_flight()), (Ok(8), 4, 0));
    // An error is a drop by default; a classifier may call it ignored.
    let failed = block_on(limiter.call(async { Err::<(), _>("503") }));
    assert_eq!((failed, limiter.limit()), (Err(ShedError::Failed("503")), 2));
    let ignored =
        block_on(limiter.call_classified(async { Err::<(), _>("400") }, |_: &Result<(), _>| Completion::Ignored));
    assert_eq!((ignored, limiter.limit()), (Err(ShedError::Failed("400")), 2));
}

#[test]
fn l4_a_call_dropped_before_it_completes_returns_its_place() {
    let rt = Virtual::default();
    let limiter = aimd(&rt, 1);
    {
        let mut call = pin!(limiter.call(pending::<Result<(), ()>>()));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        assert_eq!(limiter.in_flight(), 1);
        // The place is taken: another call is shed, not made.
        let shed = block_on(limiter.call(async { unreachable!("a shed call is not made") as Result<(), ()> }));
        assert_eq!(shed, Err(ShedError::Shed { retry_after: Duration::ZERO }));
        assert_eq!(shed.unwrap_err().refusal(), Some(Refusal::new(Gate::Limiter, Some(Duration::ZERO))));
    }
    assert_eq!((limiter.in_flight(), limiter.limit()), (0, 1), "canceled: returned, nothing sampled");
}

#[test]
fn t4_a_full_limiter_refuses_calls_and_retries_with_its_minimum_rtt() {
    let rt = Virtual::default();
    // Vegas measures the minimum RTT (AIMD does not, and says 0 until a re-probe measures one).
    let policy = LimiterPolicy::builder(LimitAlgorithm::Vegas { smoothing: 1.0 }).limits(1, 1, 1).build().unwrap();
    let limiter = Limiter::with_runtime(rt.clone(), policy);
    let clock = rt.clone();
    let _ = block_on(limiter.call(async move {
        clock.advance(ms(20));
        Ok::<_, ()>(())
    }));
    assert_eq!(limiter.min_rtt(), Some(ms(20)));
    assert_eq!(limiter.admit(), Ok(()), "a place is free");
    let held = limiter.try_acquire().unwrap();
    assert_eq!(limiter.admit(), Err(Refusal::new(Gate::Limiter, Some(ms(20)))));
    // A retry while the limit is full is refused, naming the limiter (the attempt itself ran
    // outside it).
    let policy =
        RetryPolicy::builder(persevere::Backoff::constant(ms(1)).build().unwrap()).max_attempts(3).build().unwrap();
    let done = block_on(retry(rt.clone(), policy, || async { Err::<(), _>("busy") }).gate(limiter.clone()));
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.refused_by(), gave_up.retry_after()),
        (OutcomeKind::Rejected, Some(Gate::Limiter), Some(ms(20)))
    );
    drop(held);
    assert_eq!(limiter.try_retry(None, FailureClass::Retryable), Ok(()));
}

#[cfg(feature = "metrics")]
#[test]
fn o2_a_shed_call_and_a_limit_change_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = Virtual::default();
        let limiter = aimd(&rt, 2);
        let held = limiter.try_acquire().unwrap();
        let _second = limiter.try_acquire().unwrap();
        assert!(limiter.try_acquire().is_err());
        held.dropped();
    });
    let mut figures: Vec<_> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let value = match value {
                DebugValue::Counter(n) => n.to_string(),
                DebugValue::Gauge(g) => g.into_inner().to_string(),
                DebugValue::Histogram(h) => format!("{h:?}"),
            };
            (key.key().name().to_owned(), value)
        })
        .collect();
    figures.sort();
    assert_eq!(
        figures,
        [
            ("persevere_limiter_limit".to_owned(), "1".to_owned()),
            ("persevere_limiter_shed_total".to_owned(), "1".to_owned())
        ]
    );
}
