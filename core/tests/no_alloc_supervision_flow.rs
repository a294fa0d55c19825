//! The supervision decision and the flow outcome transitions allocate nothing.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use persevere::{Failure, Flow, FlowPolicy, Instant, Supervision, SupervisionPolicy, TaskDefaults};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards every call to `System` unchanged; only counts allocations on this thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn the_supervision_decision_allocates_nothing() {
    let policy = SupervisionPolicy::periodic(Duration::ZERO).build(&TaskDefaults::new()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut task = Supervision::<u32>::new();
    let mut now = Instant::ZERO;
    let n = allocations_in(|| {
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
    let n = allocations_in(|| {
        for run in 0..10_000u32 {
            now = flow.poll_timeout().unwrap().later(now);
            flow.handle_timeout(now);
            while flow.poll_action().is_some() {}
            match run % 3 {
                0 => flow.handle_failure(&policy, now, run, &mut rng).unwrap(),
                1 => flow.handle_cancel(now).unwrap(),
                _ => flow.handle_success(now).unwrap(),
            }
            let _ = flow.info();
        }
    });
    assert_eq!(flow.run_count(), 10_000);
    assert_eq!(n, 0);
}
