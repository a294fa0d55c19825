//! Drives one retried operation by hand: a clock you move yourself, a seeded RNG, and a flaky
//! call that fails three times. Prints the timeline the machine decides.
//!
//! `cargo run -p persevere --example by_hand`

use std::time::Duration;

use persevere::{Backoff, Failure, Instant, Jitter, Outcome, Retry, RetryAction, RetryPolicy};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = RetryPolicy::builder(
        Backoff::exponential(Duration::from_millis(200), 2.0)
            .max_delay(Duration::from_secs(2))
            .jitter(Jitter::Equal)
            .build()?,
    )
    .max_retries(5)
    .attempt_timeout(Duration::from_millis(500))
    .total(Duration::from_secs(10))
    .build()?;

    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mut retry = Retry::<&'static str>::new();
    // The epoch is "when we started"; each attempt takes 40 ms of (pretend) work, except the
    // third, which hangs and is timed out by the machine.
    let mut now = Instant::ZERO;
    let work = Duration::from_millis(40);
    let ms = |t: Instant| t.as_nanos() as f64 / 1e6;

    // Each action is acted on as it is polled: a start is always the last action of its input,
    // so every input below comes after the machine's actions are drained (the drain rule).
    retry.handle_start(&policy, now)?;
    loop {
        match retry.poll_action() {
            Some(RetryAction::Start { attempt, deadline }) => {
                let deadline = deadline.map_or("none".to_string(), |d| format!("{:.0} ms", ms(d)));
                println!("{:>8.1} ms  attempt {attempt} starts (deadline {deadline})", ms(now));
                match attempt {
                    3 => {} // hangs: nothing to report; the machine's deadline will fire
                    1 | 2 | 4 => {
                        now = now.saturating_add(work);
                        println!("{:>8.1} ms  attempt {attempt} fails: 503 Service Unavailable", ms(now));
                        retry
                            .handle_failure(&policy, now, attempt, Failure::retryable("503"), &mut rng)
                            .map_err(|e| e.error)?;
                    }
                    _ => {
                        now = now.saturating_add(work);
                        println!("{:>8.1} ms  attempt {attempt} succeeds", ms(now));
                        retry.handle_success(now, attempt)?;
                    }
                }
            }
            Some(RetryAction::Abandon { attempt }) => {
                println!("{:>8.1} ms  attempt {attempt} passed its deadline: abandoned", ms(now));
            }
            Some(RetryAction::Sleep { next_attempt, delay, until }) => {
                println!(
                    "{:>8.1} ms  backoff {:.1} ms (streak {}), attempt {next_attempt} at {:.1} ms",
                    ms(now),
                    delay.as_secs_f64() * 1e3,
                    retry.streak(),
                    ms(until)
                );
            }
            Some(RetryAction::Finish { outcome, stats }) => {
                println!(
                    "{:>8.1} ms  finished: {:?} after {} attempts, {:.1} ms asleep, {:.1} ms in all",
                    ms(now),
                    outcome.kind(),
                    stats.attempts,
                    stats.slept.as_secs_f64() * 1e3,
                    stats.elapsed.expect("the core always measures the elapsed time").as_secs_f64() * 1e3
                );
                assert_eq!(outcome, Outcome::Succeeded);
                assert_eq!(stats.attempts, 5);
                return Ok(());
            }
            None => {
                // The driver's only job: wait until the machine's next timeout, then tell it.
                now = now.later(retry.poll_timeout().ok_or("nothing pending")?);
                retry.handle_timeout(&policy, now, &mut rng);
            }
        }
    }
}
