//! A loop of admissions and releases on the uncontended path (one call in flight at a time),
//! for counting instructions with callgrind (CONTRIBUTING.md, "Benches"):
//!
//! ```sh
//! cargo build --release -p persevere --example limits_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.1000 target/release/examples/limits_loop aimd 1000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.3000 target/release/examples/limits_loop aimd 3000
//! ```
//!
//! The difference between the two counts, divided by 2000, is the cost of one admission and
//! release (the start-up cancels out). The modes are those of `benches/limits.rs`: `aimd`,
//! `vegas` and `gradient2` (the [`Limiter`] under each preset), `breaker` (the breaker's closed
//! path, the bar), `bulkhead` and `atomic` (a hand-written atomic counter, the baseline of
//! `adapter-tower/benches/limits.rs`). Every call starts 1 µs after the last and takes 1 µs, and
//! succeeds: each machine is told the instant of its admission and of its end, as a caller
//! reading its clock at both would.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerPolicy, Bulkhead, BulkheadPolicy, CallOutcome, Completion, Instant, Limiter,
    LimiterPolicy, SplitMix64,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "aimd".into());
    let iterations: u64 = args.next().map_or(1000, |n| n.parse().expect("an iteration count"));
    let admitted = match mode.as_str() {
        "aimd" => limiter(&LimiterPolicy::aimd(), iterations),
        "vegas" => limiter(&LimiterPolicy::vegas(), iterations),
        "gradient2" => limiter(&LimiterPolicy::gradient2(), iterations),
        "breaker" => breaker(iterations),
        "bulkhead" => bulkhead(iterations),
        "atomic" => atomic(iterations),
        other => panic!("unknown mode {other:?}: aimd, vegas, gradient2, breaker, bulkhead or atomic"),
    };
    assert_eq!(admitted, iterations);
}

/// When call `i` starts and ends: 1 µs apart, each 1 µs after the last. Hidden from the
/// optimiser, as two readings of a clock are: it would otherwise know the RTT.
fn call_at(i: u64) -> (Instant, Instant) {
    let start = i.wrapping_mul(1_000);
    black_box((Instant::from_nanos(start), Instant::from_nanos(start.wrapping_add(1_000))))
}

fn limiter(policy: &LimiterPolicy, iterations: u64) -> u64 {
    let mut limiter = Limiter::new(policy, 1);
    let mut rng = SplitMix64::new(1);
    // Hidden from the optimiser once, not per call (see benches/README.md).
    let policy = black_box(policy);
    let mut admitted = 0;
    for i in 0..iterations {
        let (start, end) = call_at(i);
        let ok = match limiter.try_acquire(policy, start) {
            Ok(permit) => limiter.release(policy, end, permit, Completion::Success, &mut rng).is_ok(),
            Err(_) => false,
        };
        admitted += u64::from(black_box(ok));
    }
    admitted
}

fn breaker(iterations: u64) -> u64 {
    let open = Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build().unwrap();
    let policy = BreakerPolicy::builder(open).consecutive_failures(5).build().unwrap();
    let mut breaker = Breaker::new(&policy, 1);
    let mut rng = SplitMix64::new(1);
    let policy = black_box(&policy);
    let mut admitted = 0;
    for i in 0..iterations {
        let (start, end) = call_at(i);
        let ok = match breaker.try_acquire(policy, start, &mut rng) {
            Ok(permit) => breaker.record(policy, end, permit, CallOutcome::Success, &mut rng).is_ok(),
            Err(_) => false,
        };
        admitted += u64::from(black_box(ok));
    }
    admitted
}

fn bulkhead(iterations: u64) -> u64 {
    let policy = BulkheadPolicy::builder(20).max_wait(Duration::from_millis(10), 8).build().unwrap();
    let mut bulkhead = Bulkhead::new();
    let policy = black_box(&policy);
    let mut admitted = 0;
    for i in 0..iterations {
        let (start, _) = call_at(i);
        let ok = match bulkhead.try_acquire(policy, start) {
            Ok(permit) => bulkhead.release(permit).is_ok(),
            Err(_) => false,
        };
        admitted += u64::from(black_box(ok));
    }
    admitted
}

/// A hand-written concurrency limit: one atomic counter (as in the benches).
struct AtomicLimit {
    in_flight: AtomicU32,
    limit: u32,
}

impl AtomicLimit {
    fn try_acquire(&self) -> bool {
        let mut current = self.in_flight.load(Ordering::Relaxed);
        loop {
            if current >= self.limit {
                return false;
            }
            match self.in_flight.compare_exchange_weak(current, current + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::Release);
    }
}

fn atomic(iterations: u64) -> u64 {
    let atomic = AtomicLimit { in_flight: AtomicU32::new(0), limit: 20 };
    let mut admitted = 0;
    for _ in 0..iterations {
        let limit = black_box(&atomic);
        let ok = limit.try_acquire();
        if ok {
            limit.release();
        }
        admitted += u64::from(black_box(ok));
    }
    admitted
}
