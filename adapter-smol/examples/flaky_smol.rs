//! A task that fails twice and succeeds on the third attempt, retried with exponential backoff
//! from 500 ms on smol. Prints one line per scheduled retry and the success.
//!
//! `cargo run -p persevere-smol --example flaky_smol`

use std::time::Duration;

use persevere::{Backoff, RetryPolicy};
use persevere_smol::{RetryEvent, retry};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    smol::block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let policy = RetryPolicy::builder(
        Backoff::exponential(Duration::from_millis(500), 2.0).max_delay(Duration::from_secs(10)).build()?,
    )
    .max_attempts(5)
    .build()?;

    let mut calls = 0;
    let done = retry(&policy, || {
        calls += 1;
        let attempt = calls;
        async move { if attempt < 3 { Err(format!("flaky failed on attempt {attempt}")) } else { Ok("flaky is done") } }
    })
    .notify(|e: &RetryEvent<'_, String>| {
        println!("retry for flaky in {}ms (attempt {})", e.delay.as_millis(), e.next_attempt);
    })
    .await;

    let value = done.result.map_err(|g| g.to_string())?;
    println!("{value} after {} attempts, {}ms asleep", done.stats.attempts, done.stats.slept.as_millis());
    Ok(())
}
