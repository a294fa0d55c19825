//! Drives the core's `Retry` and `Breaker` with nothing but `core`: see Cargo.toml.
#![no_std]
#![no_main]

use core::panic::PanicInfo;
use core::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerPolicy, CallOutcome, FailureKind, Instant, Retry, RetryAction, RetryPolicy, SplitMix64,
};

/// The only panic handler: a second one (std's) fails the link.
#[panic_handler]
fn panic(_: &PanicInfo<'_>) -> ! {
    loop {}
}

/// The prebuilt `core` of a hosted target refers to an unwinding personality; with
/// `panic = "abort"` nothing unwinds, so it is never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

// The C runtime's entry point calls `main`; libc provides the start-up code, not Rust's std.
#[link(name = "c")]
unsafe extern "C" {}

/// Three failures then a success through `Retry`, then a breaker tripped by two failures;
/// exits 0 if every decision is the documented one.
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    match run() {
        Some(()) => 0,
        None => 1,
    }
}

fn run() -> Option<()> {
    let backoff = Backoff::constant(Duration::from_millis(10)).build().ok()?;
    let policy = RetryPolicy::builder(backoff).max_attempts(5).build().ok()?;
    let mut rng = SplitMix64::new(7);
    let mut retry: Retry<()> = Retry::new();
    let mut now = Instant::ZERO;
    retry.handle_start(&policy, now).ok()?;
    let mut attempts = 0;
    loop {
        match retry.poll_action()? {
            RetryAction::Start { attempt, .. } => {
                attempts += 1;
                if attempts < 4 {
                    retry
                        .handle_failure(
                            &policy,
                            now,
                            attempt,
                            persevere::Failure::new(FailureKind::Retryable, ()),
                            &mut rng,
                        )
                        .ok()?;
                } else {
                    retry.handle_success(now, attempt).ok()?;
                }
            }
            RetryAction::Sleep { until, .. } => {
                now = until;
                retry.handle_timeout(&policy, now, &mut rng);
            }
            RetryAction::Finish { outcome, stats } => {
                if outcome.kind() != persevere::OutcomeKind::Succeeded || stats.attempts != 4 {
                    return None;
                }
                break;
            }
            _ => return None,
        }
    }

    let open_for = Backoff::constant(Duration::from_secs(1)).build().ok()?;
    let policy = BreakerPolicy::builder(open_for).consecutive_failures(2).build().ok()?;
    let mut breaker = Breaker::new(&policy, 0);
    for _ in 0..2 {
        let permit = breaker.try_acquire(&policy, now, &mut rng).ok()?;
        breaker.record(&policy, now, permit, CallOutcome::Failure, &mut rng).ok()?;
    }
    breaker.try_acquire(&policy, now, &mut rng).err().map(|_| ())
}
