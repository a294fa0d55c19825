//! A loop of retries, for counting instructions with callgrind (CONTRIBUTING.md, "Benches"):
//!
//! ```sh
//! cargo build --release -p persevere-tokio --example retry_loop
//! valgrind --tool=callgrind target/release/examples/retry_loop success 1000
//! valgrind --tool=callgrind target/release/examples/retry_loop success 3000
//! ```
//!
//! The difference between two counts, divided by the difference of their iterations, is the
//! cost of one retried operation (the start-up cancels out). `success` is a first attempt that
//! succeeds (exponential backoff, 5 attempts, no deadline); `fail3` is three failures with zero
//! delays then a success, as in `benches/retry.rs`.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use persevere::{Backoff, RetryPolicy};

thread_local! {
    /// Failures left before the operation succeeds.
    static LEFT: Cell<u32> = const { Cell::new(0) };
}

/// The operation: fails while `LEFT` is above zero, then returns 42.
async fn op() -> Result<u64, &'static str> {
    let left = LEFT.get();
    if left > 0 {
        LEFT.set(left - 1);
        Err("busy")
    } else {
        Ok(black_box(42))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "success".into());
    let iterations: u64 = args.next().map_or(1000, |n| n.parse().expect("an iteration count"));
    let (backoff, failures) = match mode.as_str() {
        "success" => (Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap(), 0),
        "fail3" => (Backoff::constant(Duration::ZERO).build().unwrap(), 3),
        other => panic!("unknown mode {other:?}: success or fail3"),
    };
    let policy = RetryPolicy::builder(backoff).max_attempts(5).build().unwrap();
    // Hidden from the optimiser once, not per call (see benches/README.md).
    let policy = black_box(&policy);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let attempts = rt.block_on(async {
        let mut attempts = 0;
        for _ in 0..iterations {
            LEFT.set(failures);
            let done = persevere_tokio::retry(policy, op).await;
            assert_eq!(done.result, Ok(42));
            attempts += black_box(done.stats.attempts);
        }
        attempts
    });
    assert_eq!(attempts, iterations * (u64::from(failures) + 1));
}
