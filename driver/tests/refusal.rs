//! A refusal says which gate refused and when to come back (T4), on a virtual clock.

use std::time::Duration;

use futures_lite::future::block_on;
use persevere::{Backoff, BreakerPolicy, FailureClass, Instant, OutcomeKind, RatioBudgetPolicy, RetryPolicy};
use persevere_driver::{Breaker, Budget, CallError, Gate, Refusal, RetryGate, retry};

mod common;
use common::Virtual;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A breaker that opens for 100 ms after one failure.
fn breaker(rt: &Virtual) -> Breaker<Virtual> {
    let open_for = Backoff::constant(ms(100)).build().unwrap();
    Breaker::with_runtime(rt.clone(), BreakerPolicy::builder(open_for).consecutive_failures(1).build().unwrap())
}

/// A ratio budget with no floor: one request earns a tenth of a retry.
fn budget(rt: &Virtual) -> Budget<Virtual> {
    Budget::ratio(rt.clone(), RatioBudgetPolicy::builder(0.1).min_retries_per_sec(0).build().unwrap())
}

fn retry_policy() -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(ms(10)).build().unwrap()).max_attempts(5).build().unwrap()
}

#[test]
fn t4_a_retry_refused_by_an_open_breaker_names_it_and_carries_its_open_time() {
    let rt = Virtual::default();
    let breaker = breaker(&rt);
    // The attempt fails through the breaker, which opens; the retry is refused.
    let done = block_on(
        retry(rt.clone(), retry_policy(), || breaker.call(async { Err::<(), _>("down") })).gate(breaker.clone()),
    );
    let gave_up = done.result.unwrap_err();
    assert_eq!((gave_up.outcome, gave_up.refused_by()), (OutcomeKind::Rejected, Some(Gate::Breaker)));
    assert_eq!(gave_up.retry_after(), Some(ms(100)), "the breaker's open time, none of it spent");
    assert_eq!(done.stats.attempts, 1);
    assert_eq!(
        gave_up.to_string(),
        "gave up: the circuit breaker refused the retry (retry after 100ms); last error: down"
    );

    // Isolated by hand: the breaker refuses, with no time to come back at.
    breaker.isolate();
    let refusal = breaker.try_retry(None, FailureClass::Retryable).unwrap_err();
    assert_eq!((refusal.gate(), refusal.retry_after()), (Gate::Breaker, None));
}

#[test]
fn t4_a_retry_refused_by_a_budget_names_it() {
    let rt = Virtual::default();
    let budget = budget(&rt);
    let done = block_on(retry(rt.clone(), retry_policy(), || async { Err::<(), _>("busy") }).gate(budget));
    let gave_up = done.result.unwrap_err();
    assert_eq!(
        (gave_up.outcome, gave_up.refused_by(), gave_up.retry_after()),
        (OutcomeKind::Rejected, Some(Gate::Budget), None)
    );
    assert!(gave_up.to_string().starts_with("gave up: the retry budget refused the retry"), "{gave_up}");
}

#[test]
fn t4_a_tuple_of_gates_names_the_one_that_refused() {
    let rt = Virtual::default();
    let (breaker, budget) = (breaker(&rt), budget(&rt));
    let gates = (breaker.clone(), budget.clone());
    // The breaker is closed, the budget has nothing to grant.
    gates.on_request(None);
    assert_eq!(gates.try_retry(None, FailureClass::Retryable).unwrap_err(), Refusal::new(Gate::Budget, None));
    // The breaker open: it refuses first, and the budget is not asked.
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    rt.advance(ms(30));
    assert_eq!(gates.try_retry(None, FailureClass::Retryable).unwrap_err(), Refusal::new(Gate::Breaker, Some(ms(70))));
    assert_eq!(gates.admit(), Err(Refusal::new(Gate::Breaker, Some(ms(70)))), "a tuple admits as its breaker does");
    // Once half-open, both let a call start, and a budget never refuses one.
    rt.advance(ms(70));
    assert_eq!(gates.admit(), Ok(()));
    assert_eq!(budget.admit(), Ok(()));
}

#[test]
fn t4_a_breaker_admits_calls_unless_open_or_isolated() {
    let rt = Virtual::default();
    let breaker = breaker(&rt);
    let reads = rt.reads.get();
    assert_eq!(breaker.admit(), Ok(()));
    assert_eq!(rt.reads.get(), reads, "a clean breaker admits without the clock");
    let _ = block_on(breaker.call(async { Err::<(), _>(()) }));
    assert_eq!(breaker.admit(), Err(Refusal::new(Gate::Breaker, Some(ms(100)))));
    rt.advance(ms(100));
    assert_eq!(breaker.admit(), Ok(()), "half-open: a probe may start");
    breaker.isolate();
    assert_eq!(breaker.admit(), Err(Refusal::new(Gate::Breaker, None)));
}

/// A gate of the caller's own that only says yes or no.
struct Mine;

impl RetryGate for Mine {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        None
    }
}

#[test]
fn t4_a_gate_that_does_not_say_who_it_is_is_named_other() {
    let rt = Virtual::default();
    let gave_up = block_on(retry(rt, retry_policy(), || async { Err::<(), _>(()) }).gate(Mine)).result.unwrap_err();
    assert_eq!((gave_up.refused_by(), gave_up.retry_after()), (Some(Gate::Other), None));
    assert_eq!(Mine.admit(), Ok(()));
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[test]
fn t4_a_call_error_over_a_boxed_error_is_an_error_and_names_its_refusal() {
    // `?` turns it into a `BoxError`, whose source is the boxed error.
    fn boxed(error: CallError<BoxError>) -> Result<(), BoxError> {
        Err(error)?
    }
    let failed = boxed(CallError::Failed("timed out".into())).unwrap_err();
    assert_eq!(failed.to_string(), "timed out");
    assert_eq!(failed.source().map(|s| s.to_string()), Some("timed out".to_owned()));
    let rejected = boxed(CallError::Rejected { retry_after: Some(ms(5)) }).unwrap_err();
    assert_eq!(rejected.to_string(), "circuit open: retry after 5ms");
    let rejected = rejected.downcast::<CallError<BoxError>>().unwrap();
    assert_eq!(rejected.refusal(), Some(Refusal::new(Gate::Breaker, Some(ms(5)))));
    assert_eq!(CallError::Failed(()).refusal(), None);
}
