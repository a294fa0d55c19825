//! A loop of calls through `RetryLayer` that succeed at once, for counting instructions with
//! callgrind (CONTRIBUTING.md, "Benches"):
//!
//! ```sh
//! cargo build --release -p persevere-tower --example retry_layer_loop
//! valgrind --tool=callgrind target/release/examples/retry_layer_loop 1000
//! valgrind --tool=callgrind target/release/examples/retry_layer_loop 3000
//! ```
//!
//! The service is held across calls and called as `svc.ready().await?.call(req).await`, as
//! `success/retry_layer` in `benches/layers.rs` does.

use std::future::ready;
use std::hint::black_box;
use std::time::Duration;

use persevere::{Backoff, RetryPolicy};
use persevere_tower::{RetryErrors, RetryLayer};
use tower::{Layer, Service, ServiceExt, service_fn};

fn main() {
    let iterations: u64 = std::env::args().nth(1).map_or(1000, |n| n.parse().expect("an iteration count"));
    let policy = RetryPolicy::builder(Backoff::exponential(Duration::from_millis(100), 2.0).build().unwrap())
        .max_attempts(5)
        .build()
        .unwrap();
    let echo = service_fn(|n: u64| ready(Ok::<u64, &'static str>(black_box(n))));
    let mut service = RetryLayer::new(policy).classify(RetryErrors).layer(echo);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let sum = rt.block_on(async {
        let mut sum = 0;
        for _ in 0..iterations {
            let ready = service.ready().await.unwrap();
            sum += black_box(ready.call(black_box(7)).await.unwrap());
        }
        sum
    });
    assert_eq!(sum, iterations * 7);
}
