//! The simulated world: one seed, virtual time, a trace, and the guarantee checks' bookkeeping.

use std::fmt;

use std::time::Duration;

use persevere::{Backoff, FailureClass, FailureKind, Hint, Instant, Jitter};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

pub use crate::model::backoff::delay_bounds;

/// How many recent events a violation report shows.
pub const RECENT: usize = 48;

/// Checks are counted per guarantee: `G0`–`G13`, then one slot for the machine rules
/// (`R`, `S`, `F`, `K`, `U`, `D`, `X`) that the families also check.
pub const RULES: usize = 15;

/// The name of slot `i` of [`Summary::by_rule`].
pub fn rule_name(i: usize) -> &'static str {
    const NAMES: [&str; RULES] =
        ["G0", "G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9", "G10", "G11", "G12", "G13", "R/S/F/K/U/D/X"];
    NAMES.get(i).copied().unwrap_or("?")
}

/// The slot of `rule` in [`Summary::by_rule`]: `"G7"` is 7, anything else the last slot.
#[inline]
fn rule_index(rule: &str) -> usize {
    match rule.as_bytes() {
        [b'G', d] if d.is_ascii_digit() => usize::from(d - b'0'),
        [b'G', b'1', d] if (b'0'..=b'3').contains(d) => 10 + usize::from(d - b'0'),
        _ => RULES - 1,
    }
}

/// Draws a backoff (swarm testing): any schedule, any jitter, an initial delay up to
/// `initial_ms` and a cap up to `cap_ms` above it, sometimes a floor.
pub fn draw_backoff(world: &mut World, initial_ms: u64, cap_ms: u64) -> Backoff {
    let ms = Duration::from_millis;
    let jitter = match world.between(0, 3) {
        0 => Jitter::None,
        1 => Jitter::Full,
        2 => Jitter::Equal,
        _ => Jitter::Proportional(world.between(0, 1000) as f64 / 1000.0),
    };
    let initial = ms(world.between(0, initial_ms));
    let cap = initial + ms(world.between(0, cap_ms));
    let builder = match world.between(0, 3) {
        0 => Backoff::constant(initial).jitter(jitter),
        1 => Backoff::linear(initial, ms(world.between(0, initial_ms.max(1) * 2))).jitter(jitter),
        2 => Backoff::exponential(initial.max(ms(1)), 1.0 + world.between(0, 3_000) as f64 / 1000.0).jitter(jitter),
        _ => Backoff::decorrelated(initial.max(ms(1))),
    };
    let builder = builder.max_delay(cap.max(ms(1)));
    let builder = if world.chance(300) { builder.min_delay(ms(world.between(0, 50)).min(initial)) } else { builder };
    builder.build().expect("drawn backoffs are valid")
}

/// The failure classes a scenario injects, in the order of its fault weights.
const FAILURE_CLASSES: [FailureClass; 8] = [
    FailureClass::Retryable,
    FailureClass::Timeout,
    FailureClass::Panicked,
    FailureClass::Fatal,
    FailureClass::Canceled,
    FailureClass::RetryAfter,
    FailureClass::DoNotRetry,
    FailureClass::Throttled,
];

/// The relative weight of each failure class a scenario injects (retryable, timeout, panicked,
/// fatal, canceled, `Retry-After`, `DoNotRetry`, throttled), in that order.
pub type FaultWeights = [u64; 8];

/// Draws relative weights for the failure classes of [`draw_failure`]: each 0–10, the
/// transient class 5 more (mostly transient failures).
pub fn draw_fault_weights(world: &mut World) -> FaultWeights {
    let mut weights = [0u64; 8];
    for w in &mut weights {
        *w = world.between(0, 10);
    }
    weights[0] += 5;
    weights
}

/// Draws a failure kind by `weights` (see [`draw_fault_weights`]). A `Retry-After` hint is up
/// to `hint_ns` long, as a delay or as an instant (possibly in the past); its delay from `now`
/// is returned too, in ns, as the machine must read it.
pub fn draw_failure(
    world: &mut World,
    weights: &FaultWeights,
    hint_ns: u64,
    now: Instant,
) -> (FailureKind, Option<u64>) {
    let total: u64 = weights.iter().sum();
    let mut ticket = world.between(0, total.max(1) - 1);
    let mut class = FailureClass::Retryable;
    for (c, w) in FAILURE_CLASSES.iter().zip(weights) {
        if ticket < *w {
            class = *c;
            break;
        }
        ticket -= w;
    }
    match class {
        FailureClass::Timeout => (FailureKind::Timeout, None),
        FailureClass::Panicked => (FailureKind::Panicked, None),
        FailureClass::Fatal => (FailureKind::Fatal, None),
        FailureClass::Canceled => (FailureKind::Canceled, None),
        FailureClass::DoNotRetry => (FailureKind::Hinted(Hint::DoNotRetry), None),
        FailureClass::Throttled => (FailureKind::Throttled, None),
        FailureClass::RetryAfter => {
            let d = world.between(0, hint_ns);
            if world.chance(500) {
                (FailureKind::Hinted(Hint::After(Duration::from_nanos(d))), Some(d))
            } else {
                let back = Duration::from_millis(world.between(0, 100));
                let at = now.saturating_add(Duration::from_nanos(d)).saturating_sub(back);
                (FailureKind::Hinted(Hint::At(at)), Some(at.saturating_duration_since(now).as_nanos() as u64))
            }
        }
        _ => (FailureKind::Retryable, None),
    }
}

/// A hint shortened to `max_hint` from `now`, as the rule was before issue 12 (B6 now never
/// shortens a hint): the defect the families inject to prove that their hint checks can fail.
pub fn clamp_hint(kind: FailureKind, now: Instant, max_hint: Duration) -> FailureKind {
    match kind {
        FailureKind::Hinted(Hint::After(d)) => FailureKind::Hinted(Hint::After(d.min(max_hint))),
        FailureKind::Hinted(Hint::At(at)) => FailureKind::Hinted(Hint::At(at.earlier(now.saturating_add(max_hint)))),
        kind => kind,
    }
}

/// One thing that happened, compact and `Copy` so that tracing costs no allocation. Formatted
/// only when a violation is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    /// Virtual time, in nanoseconds.
    pub at: u64,
    /// Which operation, task, flow or delivery it concerns.
    pub subject: u32,
    /// What happened (a short static label).
    pub what: &'static str,
    /// First detail (an attempt number, a count).
    pub a: u64,
    /// Second detail (a delay or an instant, in nanoseconds; a class code).
    pub b: u64,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>14.6} ms  #{:<4} {:<24} a={} b={}", self.at as f64 / 1e6, self.subject, self.what, self.a, self.b)
    }
}

/// A broken guarantee, with everything needed to replay it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule, e.g. `"G2"`.
    pub rule: &'static str,
    /// What broke, in words.
    pub message: String,
    /// The scenario family, e.g. `"retry"`.
    pub machine: &'static str,
    /// The seed that reproduces it.
    pub seed: u64,
    /// The step at which it was detected.
    pub step: u64,
    /// The most recent events, oldest first.
    pub recent: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} violated in a {} scenario at step {}: {}", self.rule, self.machine, self.step, self.message)?;
        writeln!(f, "seed: {}", self.seed)?;
        writeln!(f, "recent trace:")?;
        for event in &self.recent {
            writeln!(f, "  {event}")?;
        }
        writeln!(f, "replay with:")?;
        writeln!(
            f,
            "  SIM_SEED={} SIM_MACHINE={} cargo test -p sim --test scenarios replay -- --nocapture",
            self.seed, self.machine
        )?;
        write!(f, "  cargo run -p sim --release -- replay {} {}", self.machine, self.seed)
    }
}

impl std::error::Error for Violation {}

/// The world one scenario runs in.
pub struct World {
    /// The scenario's seed.
    pub seed: u64,
    machine: &'static str,
    rng: ChaCha8Rng,
    /// Virtual time.
    pub now: Instant,
    /// Steps taken (inputs fed to a machine).
    pub steps: u64,
    /// Guarantee checks evaluated.
    pub checks: u64,
    by_rule: [u64; RULES],
    hash: u64,
    ring: [Event; RECENT],
    events: u64,
}

impl World {
    /// A world for a scenario of `machine`, drawn entirely from `seed`.
    pub fn new(machine: &'static str, seed: u64) -> Self {
        World {
            seed,
            machine,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Instant::ZERO,
            steps: 0,
            checks: 0,
            by_rule: [0; RULES],
            hash: 0xcbf2_9ce4_8422_2325,
            ring: [Event::default(); RECENT],
            events: 0,
        }
    }

    /// The world's RNG: it draws the scenario, the faults and the jitter.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// A uniform draw from `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        if span == u64::MAX {
            return self.rng.next_u64();
        }
        lo + ((u128::from(self.rng.next_u64()) * u128::from(span + 1)) >> 64) as u64
    }

    /// `true` with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.between(0, 999) < per_mille
    }

    /// One of `items`, uniformly.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.between(0, items.len() as u64 - 1) as usize]
    }

    /// Moves virtual time to `due` (never back) and counts a step. Returns the time the driver
    /// reports: before `stalls_until`, with a chance of `stall_per_mille`‰, a stalled clock up
    /// to 50 ms in the past; otherwise the time itself.
    pub fn step_to(&mut self, due: Instant, stall_per_mille: u64, stalls_until: Instant) -> Instant {
        self.now = self.now.later(due);
        self.steps += 1;
        if self.now < stalls_until && self.chance(stall_per_mille) {
            let back = Duration::from_millis(self.between(0, 50));
            self.now.saturating_sub(back)
        } else {
            self.now
        }
    }

    /// Records an event in the trace and its hash.
    #[inline]
    pub fn record(&mut self, subject: u32, what: &'static str, a: u64, b: u64) {
        let event = Event { at: self.now.as_nanos(), subject, what, a, b };
        self.ring[(self.events % RECENT as u64) as usize] = event;
        self.events += 1;
        // FNV-1a over 64-bit words and the label's bytes: the same in every process.
        for word in [event.at, u64::from(subject), a, b] {
            self.hash = (self.hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
        for byte in what.bytes() {
            self.hash = (self.hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Events recorded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// A hash of the whole trace: equal for equal traces (G0).
    pub fn trace_hash(&self) -> u64 {
        self.hash
    }

    /// Counts one evaluated check; returns a violation if `ok` is false.
    #[inline]
    pub fn check(&mut self, rule: &'static str, ok: bool, message: impl FnOnce() -> String) -> Result<(), Violation> {
        self.checks += 1;
        self.by_rule[rule_index(rule)] += 1;
        if ok { Ok(()) } else { Err(self.violation(rule, message())) }
    }

    /// The model's answer to an input the machine under test accepted (`what`): the answer, or
    /// a `model` violation when the model refuses the input.
    pub fn accepted<T, E: core::fmt::Display>(&self, what: &str, answer: Result<T, E>) -> Result<T, Violation> {
        answer.map_err(|e| self.violation("model", format!("the machine accepted {what}, the model refuses: {e}")))
    }

    /// A violation at the current step, with the recent trace.
    pub fn violation(&self, rule: &'static str, message: String) -> Violation {
        let kept = self.events.min(RECENT as u64);
        let recent = (self.events - kept..self.events).map(|i| self.ring[(i % RECENT as u64) as usize]).collect();
        Violation { rule, message, machine: self.machine, seed: self.seed, step: self.steps, recent }
    }
}

/// What a finished scenario reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Steps taken.
    pub steps: u64,
    /// Guarantee checks evaluated.
    pub checks: u64,
    /// Checks evaluated per rule (see [`rule_name`]).
    pub by_rule: [u64; RULES],
    /// Events traced.
    pub events: u64,
    /// The trace hash (G0).
    pub trace_hash: u64,
}

impl World {
    /// The summary of the scenario so far.
    pub fn summary(&self) -> Summary {
        Summary {
            steps: self.steps,
            checks: self.checks,
            by_rule: self.by_rule,
            events: self.events,
            trace_hash: self.hash,
        }
    }
}
