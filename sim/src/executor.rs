//! A deterministic single-threaded executor on virtual time, and the [`Runtime`] the real
//! driving loop runs on inside the simulator.
//!
//! There is one task; when it is pending, virtual time jumps to the earliest timer and the task
//! is polled again. No thread, no wall clock, no I/O.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use persevere::Instant;
use persevere_driver::Runtime;

#[derive(Debug, Default)]
struct Clock {
    now: Cell<u64>,
    timers: RefCell<BinaryHeap<Reverse<u64>>>,
    reads: Cell<u64>,
    sleeps: Cell<u64>,
}

/// Virtual time for the driving loop: [`Runtime::now`] reads it, [`Runtime::sleep_until`]
/// registers a timer that [`block_on`] jumps to. Cheap to clone (one `Rc`).
#[derive(Clone, Debug, Default)]
pub struct SimRuntime {
    clock: Rc<Clock>,
    seed: u64,
}

impl SimRuntime {
    /// A clock at the epoch whose operations seed their jitter with `seed`.
    pub fn new(seed: u64) -> Self {
        SimRuntime { clock: Rc::default(), seed }
    }

    /// The current virtual instant (not counted as a read).
    pub fn peek(&self) -> Instant {
        Instant::from_nanos(self.clock.now.get())
    }

    /// Clock reads so far.
    pub fn reads(&self) -> u64 {
        self.clock.reads.get()
    }

    /// Timers created so far.
    pub fn sleeps(&self) -> u64 {
        self.clock.sleeps.get()
    }

    /// A future that completes at `deadline` on this clock (also used by simulated attempts).
    pub fn sleep(&self, deadline: Instant) -> SimSleep {
        SimSleep { clock: self.clock.clone(), deadline: deadline.as_nanos(), registered: false }
    }
}

impl Runtime for SimRuntime {
    type Sleep = SimSleep;

    fn now(&self) -> Instant {
        self.clock.reads.set(self.clock.reads.get() + 1);
        Instant::from_nanos(self.clock.now.get())
    }

    fn sleep_until(&self, deadline: Instant) -> SimSleep {
        self.clock.sleeps.set(self.clock.sleeps.get() + 1);
        self.sleep(deadline)
    }

    fn entropy(&self) -> u64 {
        self.seed
    }
}

/// A virtual-time sleep.
#[derive(Debug)]
pub struct SimSleep {
    clock: Rc<Clock>,
    deadline: u64,
    registered: bool,
}

impl Future for SimSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.clock.now.get() >= self.deadline {
            return Poll::Ready(());
        }
        if !self.registered {
            self.registered = true;
            self.clock.timers.borrow_mut().push(Reverse(self.deadline));
        }
        Poll::Pending
    }
}

/// Runs `future` to completion on `runtime`'s virtual time, polling it at most `max_polls`
/// times; `None` if it is still pending then, or pending with no timer left (it would hang).
pub fn block_on<F: Future>(runtime: &SimRuntime, future: F, max_polls: u32) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..max_polls {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return Some(value);
        }
        let clock = &runtime.clock;
        let next = loop {
            // Stale timers (of dropped sleeps, or already passed) are skipped.
            match clock.timers.borrow_mut().pop() {
                Some(Reverse(at)) if at > clock.now.get() => break Some(at),
                Some(_) => continue,
                None => break None,
            }
        };
        clock.now.set(next?);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_jumps_to_the_next_timer() {
        let rt = SimRuntime::new(1);
        let r = rt.clone();
        let done = block_on(
            &rt,
            async move {
                r.sleep(Instant::from_secs(5)).await;
                r.sleep(Instant::from_secs(3)).await; // already passed
                r.sleep(Instant::from_secs(9)).await;
                r.peek()
            },
            10,
        );
        assert_eq!(done, Some(Instant::from_secs(9)));
    }

    #[test]
    fn a_future_with_no_timer_left_is_reported_as_hanging() {
        let rt = SimRuntime::new(1);
        assert_eq!(block_on(&rt, std::future::pending::<()>(), 10), None);
    }
}
