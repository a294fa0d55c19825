//! The retry layer's two phases hand over exactly: a first attempt runs outside the driving
//! loop only while nothing has failed, and everything the loop would do for it (catch a panic,
//! tell the gate of the request and of a success) happens once, on either path (T1).
//! A call whose first attempt succeeds allocates nothing; a retried call allocates its loop once.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use persevere::{Backoff, FailureClass, Instant, OutcomeKind, RetryPolicy};
use persevere_tower::{RetryErrors, RetryGate, RetryLayer};
use tower::{Layer, Service, ServiceExt, service_fn};

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

/// A gate that writes down what it hears; its tickets say which retry they granted.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<&'static str>>>);

impl RetryGate for Recorder {
    type Ticket = &'static str;
    type Request = ();
    fn on_request(&self, _: Option<Instant>) {
        self.0.lock().unwrap().push("request");
    }
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<&'static str> {
        let mut log = self.0.lock().unwrap();
        let granted = if log.contains(&"retry?") { "success of retry 2" } else { "success of retry 1" };
        log.push("retry?");
        Some(granted)
    }
    fn on_success(&self, ticket: Option<&'static str>) {
        self.0.lock().unwrap().push(ticket.unwrap_or("success"));
    }
}

impl Recorder {
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn policy(timeout: Option<Duration>) -> RetryPolicy {
    let builder = RetryPolicy::builder(Backoff::constant(Duration::from_millis(1)).build().unwrap()).max_attempts(4);
    match timeout {
        Some(timeout) => builder.attempt_timeout(timeout).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

/// A service that fails its first `fail` calls of each request (`Err` with the call number)
/// and panics on call number `panic_at`, counting its calls.
fn flaky(fail: u32, panic_at: u32) -> (impl Service<u32, Response = u32, Error = u32> + Clone, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let service = service_fn(move |request: u32| {
        let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
        async move {
            assert_ne!(n, panic_at, "the inner call panics");
            if n <= fail { Err(n) } else { Ok(request * 10) }
        }
    });
    (service, calls)
}

#[tokio::test]
async fn t1_the_gate_hears_one_request_and_one_success_per_call_on_either_path() {
    for timeout in [None, Some(Duration::from_secs(5))] {
        let gate = Recorder::default();
        let (service, _) = flaky(0, 0);
        let service = RetryLayer::new(policy(timeout)).classify(RetryErrors).gate(gate.clone()).layer(service);
        assert_eq!(service.clone().oneshot(1).await.unwrap(), 10);
        assert_eq!(gate.take(), ["request", "success"], "first attempt succeeds, timeout {timeout:?}");

        let (service, calls) = flaky(2, 0);
        let service = RetryLayer::new(policy(timeout)).classify(RetryErrors).gate(gate.clone()).layer(service);
        assert_eq!(service.oneshot(2).await.unwrap(), 20);
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        assert_eq!(
            gate.take(),
            ["request", "retry?", "retry?", "success of retry 2"],
            "two failures first, timeout {timeout:?}"
        );
    }
}

#[tokio::test]
async fn t1_a_first_attempt_that_panics_is_a_panicked_failure_and_retried() {
    let (service, calls) = flaky(0, 1);
    let gate = Recorder::default();
    let service = RetryLayer::new(policy(None)).classify(RetryErrors).gate(gate.clone()).layer(service);
    assert_eq!(service.oneshot(3).await.unwrap(), 30);
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    assert_eq!(gate.take(), ["request", "retry?", "success of retry 1"]);

    // Every attempt panics: the loop gives up with the class of the last.
    let service = service_fn(|_: u32| async { panic!("always") as Result<u32, u32> });
    let error = RetryLayer::new(policy(None)).classify(RetryErrors).layer(service).oneshot(4).await.unwrap_err();
    assert_eq!((error.outcome(), error.class()), (OutcomeKind::Exhausted, Some(FailureClass::Panicked)));
    assert_eq!(error.stats().attempts, 4);
    assert!(error.error().is_none());
}

#[test]
fn t1_a_call_that_succeeds_at_once_allocates_nothing_and_a_retried_call_allocates_its_loop_once() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let ok = service_fn(|n: u32| std::future::ready(Ok::<u32, u32>(n)));
        let mut service = RetryLayer::new(policy(None)).classify(RetryErrors).layer(ok);
        let before = alloc_counter::allocations();
        for n in 0..1_000 {
            assert_eq!(service.ready().await.unwrap().call(n).await.unwrap(), n);
        }
        assert_eq!(alloc_counter::allocations() - before, 0, "allocations on the success path");

        // Every odd-numbered inner call fails: each request fails once, then succeeds.
        let calls = Arc::new(AtomicU32::new(0));
        let alternating = service_fn(move |n: u32| {
            let fails = calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
            std::future::ready(if fails { Err(n) } else { Ok(n) })
        });
        let mut service = RetryLayer::new(policy(None)).classify(RetryErrors).layer(alternating);
        // Warm up what tokio's timer allocates once.
        service.ready().await.unwrap().call(0).await.unwrap();
        let before = alloc_counter::allocations();
        for n in 0..100 {
            assert_eq!(service.ready().await.unwrap().call(n).await.unwrap(), n);
        }
        assert_eq!(alloc_counter::allocations() - before, 100, "one allocation per retried call");
    });
}

#[tokio::test(start_paused = true)]
async fn u2_an_envoy_budget_counts_a_call_in_flight_from_its_start_until_it_ends() {
    use persevere::ConcurrencyBudgetPolicy;
    use persevere_tokio::{Budget, TokioRuntime};

    let budget = Budget::concurrency(TokioRuntime::new(), ConcurrencyBudgetPolicy::envoy());
    let slow = service_fn(|request: u32| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, u32>(request)
    });
    let service = RetryLayer::new(policy(None)).classify(RetryErrors).gate(budget.clone()).layer(slow);
    let call = tokio::spawn(service.oneshot(7));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(budget.in_flight().map(|c| c.requests()), Some(1), "counted while its first attempt runs");
    assert_eq!(call.await.unwrap().unwrap(), 7);
    assert_eq!(budget.in_flight().map(|c| (c.requests(), c.retries())), Some((0, 0)));
}

/// A gate whose `on_success` panics (a user's bug).
#[derive(Clone)]
struct PanicsOnSuccess;

impl RetryGate for PanicsOnSuccess {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        Some(())
    }
    fn on_success(&self, _: Option<()>) {
        panic!("the gate's on_success panics");
    }
}

#[tokio::test]
async fn t1_a_success_whose_gate_panics_is_over_and_never_sends_the_request_again() {
    use std::future::Future;
    use std::task::Context;
    // Zero delays: every poll runs to the outcome, with no timer to wait for.
    let policy =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(4).build().unwrap();
    // A success of the first attempt (outside the loop) and of a retry (inside it).
    for fail_first in [0, 1] {
        let (service, calls) = flaky(fail_first, 0);
        let mut service = RetryLayer::new(policy).classify(RetryErrors).gate(PanicsOnSuccess).layer(service);
        let mut future = Box::pin(service.ready().await.unwrap().call(1));
        let waker = std::task::Waker::noop();
        let mut poll = || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                future.as_mut().poll(&mut Context::from_waker(waker)).map(|_| ())
            }))
            .map_err(|payload| payload.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_default())
        };
        assert_eq!(poll(), Err("the gate's on_success panics".to_owned()), "fail first {fail_first}");
        // Polled again, as a caller that caught the panic might: the call is over, and says so.
        let again = poll();
        assert!(
            again.as_ref().is_err_and(|message| message.contains("polled after")),
            "fail first {fail_first}: {again:?}"
        );
        assert_eq!(calls.load(Ordering::Relaxed), fail_first + 1, "the request was not sent again");
    }
}
