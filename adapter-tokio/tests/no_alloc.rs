//! The adapter's per-call paths allocate nothing: `retry` (success, and failures with zero
//! delays) and the shared `Breaker` on its closed path, counted on the test's own thread.

use std::time::Duration;

use persevere::{Backoff, BreakerPolicy, RetryPolicy};

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

use alloc_counter::allocations as count;

#[test]
fn retry_and_the_closed_breaker_allocate_nothing_per_call() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let exponential = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap();
    let zero =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(5).build().unwrap();
    let breaker_policy = BreakerPolicy::builder(Backoff::constant(Duration::from_secs(1)).build().unwrap())
        .consecutive_failures(5)
        .build()
        .unwrap();
    rt.block_on(async {
        let breaker = persevere_tokio::Breaker::new(breaker_policy);
        // Warm up whatever tokio or the runtime's clock allocates once.
        let _ = persevere_tokio::retry(&zero, || async { Err::<(), _>(()) }).await;
        let before = count();
        for i in 0..1_000u32 {
            let done = persevere_tokio::retry(&exponential, || async move { Ok::<_, ()>(i) }).await;
            assert_eq!(done.result, Ok(i));
            let mut left = 3;
            let done = persevere_tokio::retry(&zero, || {
                left -= 1;
                let fail = left > 0;
                async move { if fail { Err(()) } else { Ok(()) } }
            })
            .await;
            assert_eq!(done.stats.attempts, 3);
            assert_eq!(breaker.call(async { Ok::<_, ()>(i) }).await, Ok(i));
        }
        assert_eq!(count() - before, 0, "allocations on the per-call paths");
        // The counter works: a box is counted.
        let before = count();
        drop(std::hint::black_box(Box::new(1u8)));
        assert_eq!(count() - before, 1);
    });
}
