//! The contention experiment: many clients compete for one resource, each retrying with a jitter
//! strategy (after Marc Brooker's "Exponential Backoff And Jitter", AWS Architecture Blog, 2015).
//!
//! The resource is optimistic: time is cut into slots of [`SLOT`]; of the calls that arrive in
//! one slot, the first wins and the others conflict and fail. Every client starts at time zero
//! and retries with its own [`BackoffState`] over the strategy's real [`Backoff`] until it wins.
//! The published result: at 100 contenders, full and decorrelated jitter need well under half
//! the calls of capped exponential backoff without jitter.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use persevere::{Backoff, BackoffState, Jitter};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// How long the resource takes to serve one call: calls closer than this conflict.
pub const SLOT: Duration = Duration::from_millis(1);
/// The first delay of every strategy.
pub const BASE: Duration = Duration::from_millis(5);
/// The cap of every strategy.
pub const CAP: Duration = Duration::from_secs(10);

/// A retry strategy under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// A constant delay of [`BASE`]: no backoff, no jitter.
    NoBackoff,
    /// Capped exponential backoff (×2), no jitter.
    Exponential,
    /// Capped exponential with full jitter.
    Full,
    /// Capped exponential with equal jitter.
    Equal,
    /// Decorrelated jitter.
    Decorrelated,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Strategy; 5] =
        [Strategy::NoBackoff, Strategy::Exponential, Strategy::Full, Strategy::Equal, Strategy::Decorrelated];

    /// The strategy's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::NoBackoff => "none (constant)",
            Strategy::Exponential => "capped exponential",
            Strategy::Full => "full jitter",
            Strategy::Equal => "equal jitter",
            Strategy::Decorrelated => "decorrelated",
        }
    }

    /// The strategy as a core backoff.
    pub fn backoff(self) -> Backoff {
        let exponential = Backoff::exponential(BASE, 2.0).max_delay(CAP);
        match self {
            Strategy::NoBackoff => Backoff::constant(BASE).build(),
            Strategy::Exponential => exponential.build(),
            Strategy::Full => exponential.jitter(Jitter::Full).build(),
            Strategy::Equal => exponential.jitter(Jitter::Equal).build(),
            Strategy::Decorrelated => Backoff::decorrelated(BASE).max_delay(CAP).build(),
        }
        .expect("the experiment's backoffs are valid")
    }
}

/// What one run of the experiment measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contention {
    /// Calls made by all clients together, wins included.
    pub calls: u64,
    /// When the last client won.
    pub finished: Duration,
}

/// Runs `contenders` clients with `strategy`, jitter drawn from `seed`.
pub fn run(strategy: Strategy, contenders: u32, seed: u64) -> Contention {
    let backoff = strategy.backoff();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut states = vec![BackoffState::new(); contenders as usize];
    // (arrival in ns, client): the earliest arrival first, ties by client id.
    let mut queue: BinaryHeap<Reverse<(u64, u32)>> = (0..contenders).map(|c| Reverse((0, c))).collect();
    let slot = SLOT.as_nanos() as u64;
    let (mut calls, mut finished, mut busy_until) = (0u64, 0u64, 0u64);
    // Bounded: every slot has a winner, so at most contenders² calls can ever be made.
    let budget = u64::from(contenders).pow(2) + u64::from(contenders);
    while let Some(Reverse((at, client))) = queue.pop() {
        calls += 1;
        if at >= busy_until {
            // First in its slot: it wins and the resource is busy for one slot.
            busy_until = at + slot;
            finished = finished.max(at);
        } else {
            let delay = states[client as usize].next_delay(&backoff, &mut rng);
            queue.push(Reverse((at + delay.as_nanos() as u64, client)));
        }
        if calls > budget {
            break;
        }
    }
    Contention { calls, finished: Duration::from_nanos(finished) }
}

/// The mean of `runs` seeded runs.
pub fn mean(strategy: Strategy, contenders: u32, runs: u64, seed: u64) -> Contention {
    let (mut calls, mut finished) = (0u64, 0u128);
    for r in 0..runs {
        let one = run(strategy, contenders, seed.wrapping_add(r));
        calls += one.calls;
        finished += one.finished.as_nanos();
    }
    Contention { calls: calls / runs, finished: Duration::from_nanos((finished / u128::from(runs)) as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_jitter_clients_retry_in_lockstep_and_one_wins_per_round() {
        // All 100 start together and stay synchronised: N + (N−1) + … + 1 calls.
        assert_eq!(run(Strategy::Exponential, 100, 1).calls, 5_050);
        assert_eq!(run(Strategy::NoBackoff, 10, 1).calls, 55);
    }

    #[test]
    fn full_and_decorrelated_jitter_cut_total_calls_by_more_than_half_at_100_contenders() {
        let plain = mean(Strategy::Exponential, 100, 10, 7).calls;
        for strategy in [Strategy::Full, Strategy::Decorrelated] {
            let jittered = mean(strategy, 100, 10, 7).calls;
            assert!(jittered * 2 < plain, "{}: {jittered} calls vs {plain} without jitter", strategy.name());
        }
    }

    #[test]
    fn one_client_wins_at_once() {
        for strategy in Strategy::ALL {
            assert_eq!(run(strategy, 1, 3), Contention { calls: 1, finished: Duration::ZERO });
        }
    }
}
