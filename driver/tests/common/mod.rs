//! A virtual-time runtime for the driver's tests.

use std::cell::Cell;
use std::future::{Ready, ready};
use std::rc::Rc;
use std::time::Duration;

use persevere::Instant;
use persevere_driver::Runtime;

/// Virtual time: sleeping jumps the clock to the deadline at once (plus `lateness`, a timer
/// that fires late). Counts clock reads, sleeps and requests for entropy.
#[derive(Clone, Default)]
pub(crate) struct Virtual {
    pub(crate) now: Rc<Cell<u64>>,
    pub(crate) reads: Rc<Cell<u32>>,
    pub(crate) sleeps: Rc<Cell<u32>>,
    pub(crate) entropies: Rc<Cell<u32>>,
    pub(crate) lateness: Rc<Cell<u64>>,
}

impl Runtime for Virtual {
    type Sleep = Ready<()>;

    fn now(&self) -> Instant {
        self.reads.set(self.reads.get() + 1);
        Instant::from_nanos(self.now.get())
    }

    fn sleep_until(&self, deadline: Instant) -> Ready<()> {
        self.sleeps.set(self.sleeps.get() + 1);
        self.now.set(self.now.get().max(deadline.as_nanos()) + self.lateness.get());
        ready(())
    }

    fn entropy(&self) -> u64 {
        self.entropies.set(self.entropies.get() + 1);
        7
    }
}

impl Virtual {
    #[allow(dead_code)]
    pub(crate) fn advance(&self, by: Duration) {
        self.now.set(self.now.get() + by.as_nanos() as u64);
    }
}

/// Its sleeps are over when they are made, so the blocking retry can run on it.
impl persevere_driver::blocking::Blocking for Virtual {}

/// The scenario the observability tests watch: a breaker that opens on one failure, probes
/// after 100 ms and closes; then a ratio budget (no floor) that refuses a retry after one
/// request.
#[allow(dead_code)]
pub(crate) fn breaker_and_budget_scenario(rt: &Virtual) {
    use persevere::{Backoff, BreakerPolicy, FailureClass, RatioBudgetPolicy};
    use persevere_driver::{Breaker, Budget, RetryGate};

    let open_for = Backoff::constant(Duration::from_millis(100)).build().unwrap();
    let breaker =
        Breaker::with_runtime(rt.clone(), BreakerPolicy::builder(open_for).consecutive_failures(1).build().unwrap());
    let _ = futures_lite::future::block_on(breaker.call(async { Err::<(), _>(()) }));
    rt.advance(Duration::from_millis(100));
    let _ = futures_lite::future::block_on(breaker.call(async { Ok::<_, ()>(()) }));

    let budget = Budget::ratio(rt.clone(), RatioBudgetPolicy::builder(0.1).min_retries_per_sec(0).build().unwrap());
    budget.on_request(None);
    assert!(budget.allow_retry(None, FailureClass::Retryable).is_none());
    // Ten requests back one retry at 10 %: the budget recovers after its one refusal.
    for _ in 0..9 {
        budget.on_request(None);
    }
    assert!(budget.allow_retry(None, FailureClass::Retryable).is_some());
}

/// A gate whose `on_success` panics (a user's bug).
#[allow(dead_code)]
pub(crate) struct PanicsOnSuccess;

impl persevere_driver::RetryGate for PanicsOnSuccess {
    type Ticket = ();
    type Request = ();
    fn allow_retry(&self, _: Option<Instant>, _: persevere::FailureClass) -> Option<()> {
        Some(())
    }
    fn on_success(&self, _: Option<()>) {
        panic!("the gate's on_success panics");
    }
}

/// Polls `future` once with a no-op waker; a panic comes back as its message.
#[allow(dead_code)]
pub(crate) fn poll_once_catching<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    }))
    .map_err(|payload| payload.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_default())
}
