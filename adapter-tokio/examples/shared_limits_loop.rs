//! A loop of calls through the shared `Limiter` and the shared `Breaker` on tokio, one call in
//! flight at a time, for counting instructions with callgrind (CONTRIBUTING.md, "Benches"):
//!
//! ```sh
//! cargo build --release -p persevere-tokio --example shared_limits_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.1000 target/release/examples/shared_limits_loop aimd 1000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.3000 target/release/examples/shared_limits_loop aimd 3000
//! ```
//!
//! The difference between the two counts, divided by 2000, is the cost of one call (the
//! start-up cancels out). `aimd`, `vegas` and `gradient2` call through a `Limiter` with that
//! preset; `breaker` through a closed `Breaker` that trips on consecutive failures (its clean
//! path: an atomic load on admission and on success, no lock and no clock), and `breaker-rate`
//! through one that trips on a failure rate (every call is counted: the lock and the clock on
//! admission and on the record, as a limiter's admission and release take them). Every call is
//! a ready future that succeeds, awaited with `Limiter::call` or `Breaker::call`.

use std::hint::black_box;
use std::time::Duration;

use persevere::{Backoff, BreakerPolicy, LimiterPolicy};
use persevere_tokio::{Breaker, Limiter};

async fn op() -> Result<u64, &'static str> {
    Ok(black_box(1))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "aimd".into());
    let iterations: u64 = args.next().map_or(1000, |n| n.parse().expect("an iteration count"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let sum = match mode.as_str() {
        "aimd" => rt.block_on(limiter(LimiterPolicy::aimd(), iterations)),
        "vegas" => rt.block_on(limiter(LimiterPolicy::vegas(), iterations)),
        "gradient2" => rt.block_on(limiter(LimiterPolicy::gradient2(), iterations)),
        "breaker" => rt.block_on(breaker(false, iterations)),
        "breaker-rate" => rt.block_on(breaker(true, iterations)),
        other => panic!("unknown mode {other:?}: aimd, vegas, gradient2, breaker or breaker-rate"),
    };
    assert_eq!(sum, iterations);
}

async fn limiter(policy: LimiterPolicy, iterations: u64) -> u64 {
    let limiter = Limiter::new(policy);
    let mut sum = 0;
    for _ in 0..iterations {
        sum += limiter.call(op()).await.unwrap();
    }
    assert_eq!(limiter.in_flight(), 0);
    sum
}

async fn breaker(rate: bool, iterations: u64) -> u64 {
    let open = Backoff::exponential(Duration::from_secs(1), 2.0).max_delay(Duration::from_secs(60)).build().unwrap();
    let policy = if rate {
        BreakerPolicy::builder(open).failure_rate(0.5).build().unwrap()
    } else {
        BreakerPolicy::builder(open).consecutive_failures(5).build().unwrap()
    };
    let breaker = Breaker::new(policy);
    let mut sum = 0;
    for _ in 0..iterations {
        sum += breaker.call(op()).await.unwrap();
    }
    sum
}
