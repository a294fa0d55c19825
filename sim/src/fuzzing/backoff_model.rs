//! Backoff schedules (B1–B5): the builder's validation, the envelope against its formula, and
//! every jittered delay against its bounds.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{Backoff, BackoffBuilder, BackoffState, Jitter, Schedule};

use crate::model::backoff::{Formula, delay_bounds, formula, tolerance};

use super::{Ctx, ErrorKind, Fraction, SETUP, Span, ensure, nanos, nanos_sat, parse, rng, verdict};

/// An exponential multiplier, valid or not.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) enum Multiplier {
    One,
    Two,
    /// `1 + n/100`.
    Hundredths(u16),
    /// `1 + n·1e-8`: below the accepted minimum of `1 + 1e-6` for `n < 100`.
    Tiny(u8),
    Raw(f64),
    Huge,
    Nan,
    Infinite,
    /// Below 1.
    Shrinking(u8),
}

impl Multiplier {
    fn get(self) -> f64 {
        match self {
            Multiplier::One => 1.0,
            Multiplier::Two => 2.0,
            Multiplier::Hundredths(n) => 1.0 + f64::from(n) / 100.0,
            Multiplier::Tiny(n) => 1.0 + f64::from(n) * 1e-8,
            Multiplier::Raw(x) => x,
            Multiplier::Huge => 1e300,
            Multiplier::Nan => f64::NAN,
            Multiplier::Infinite => f64::INFINITY,
            Multiplier::Shrinking(n) => f64::from(n) / 256.0,
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) enum ScheduleIn {
    Constant(Span),
    Linear(Span, Span),
    Exponential(Span, Multiplier),
    Decorrelated(Span),
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) enum JitterIn {
    None,
    Full,
    Equal,
    Proportional(Fraction),
}

/// The settings of a backoff, as the fuzzer draws them.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) struct BackoffIn {
    schedule: ScheduleIn,
    max_delay: Option<Span>,
    min_delay: Option<Span>,
    jitter: JitterIn,
}

impl BackoffIn {
    fn jitter(&self) -> Jitter {
        match self.jitter {
            JitterIn::None => Jitter::None,
            JitterIn::Full => Jitter::Full,
            JitterIn::Equal => Jitter::Equal,
            JitterIn::Proportional(f) => Jitter::Proportional(f.get()),
        }
    }

    fn builder(&self) -> BackoffBuilder {
        let mut builder = BackoffBuilder::new(match self.schedule {
            ScheduleIn::Constant(d) => Schedule::Constant(d.get()),
            ScheduleIn::Linear(initial, step) => Schedule::Linear { initial: initial.get(), step: step.get() },
            ScheduleIn::Exponential(initial, m) => {
                Schedule::Exponential { initial: initial.get(), multiplier: m.get() }
            }
            ScheduleIn::Decorrelated(base) => Schedule::Decorrelated { base: base.get() },
        });
        if let Some(max) = self.max_delay {
            builder = builder.max_delay(max.get());
        }
        if let Some(min) = self.min_delay {
            builder = builder.min_delay(min.get());
        }
        builder.jitter(self.jitter())
    }

    /// Every reason the model sees for `build()` to refuse these settings (empty: valid).
    fn reasons(&self) -> Vec<ErrorKind> {
        let mut reasons = Vec::new();
        let overflow = |span: Span, reasons: &mut Vec<ErrorKind>| {
            let n = nanos(span.get());
            if n.is_none() {
                reasons.push(ErrorKind::DurationOverflow);
            }
            n.unwrap_or(u64::MAX)
        };
        let min_ns = self.min_delay.map_or(0, |min| overflow(min, &mut reasons));
        let first_ns = match self.schedule {
            ScheduleIn::Constant(d) => overflow(d, &mut reasons),
            ScheduleIn::Linear(initial, step) => {
                overflow(step, &mut reasons);
                overflow(initial, &mut reasons)
            }
            ScheduleIn::Exponential(initial, m) => {
                let initial = overflow(initial, &mut reasons);
                let m = m.get();
                if initial == 0 {
                    reasons.push(ErrorKind::Zero);
                }
                if !m.is_finite() {
                    reasons.push(ErrorKind::NotFinite);
                } else if m != 1.0 && m < 1.0 + 1e-6 {
                    reasons.push(ErrorKind::MultiplierOutOfRange);
                }
                initial
            }
            ScheduleIn::Decorrelated(base) => {
                let base = overflow(base, &mut reasons);
                if base == 0 {
                    reasons.push(ErrorKind::Zero);
                }
                if self.jitter != JitterIn::None {
                    reasons.push(ErrorKind::Conflict);
                }
                base
            }
        };
        if let JitterIn::Proportional(f) = self.jitter {
            let f = f.get();
            if !f.is_finite() {
                reasons.push(ErrorKind::NotFinite);
            } else if !(0.0..=1.0).contains(&f) {
                reasons.push(ErrorKind::FractionOutOfRange);
            }
        }
        let max_ns = self.max_delay.map_or(u64::MAX, |max| nanos_sat(max.get()));
        if max_ns < first_ns || max_ns < min_ns {
            reasons.push(ErrorKind::CapBelow);
        }
        reasons
    }

    /// Builds the backoff and checks the builder's verdict against the model's; `None` when
    /// both agree the settings are invalid.
    pub(crate) fn build(&self) -> Option<Backoff> {
        let backoff = verdict("backoff", self.builder().build(), &self.reasons())?;
        check_policy(self, &backoff);
        Some(backoff)
    }
}

/// The built policy answers with what it was given, and rebuilds to itself.
fn check_policy(given: &BackoffIn, backoff: &Backoff) {
    let cap = given.max_delay.map_or(u64::MAX, |max| nanos_sat(max.get()));
    ensure!(SETUP, nanos_sat(backoff.max_delay()) == cap, "B2", "max_delay {:?}, given {cap} ns", backoff.max_delay());
    let floor = given.min_delay.map_or(0, |min| nanos_sat(min.get()));
    ensure!(
        SETUP,
        nanos_sat(backoff.min_delay()) == floor,
        "B2",
        "min_delay {:?}, given {floor} ns",
        backoff.min_delay()
    );
    let rebuilt = BackoffBuilder::from(*backoff).build();
    ensure!(SETUP, rebuilt == Ok(*backoff), "B1", "the backoff does not rebuild to itself: {rebuilt:?}");
}

/// B1, B4: the envelope of failure `n` against its formula, capped.
pub(crate) fn check_envelope(ctx: Ctx<'_>, backoff: &Backoff, n: u32) -> u64 {
    let envelope = nanos_sat(backoff.envelope(n));
    let cap = nanos_sat(backoff.max_delay());
    ensure!(ctx, envelope <= cap, "B2", "envelope({n}) = {envelope} ns is above the cap {cap} ns");
    match formula(backoff, n) {
        Formula::Exact(raw) => {
            let expected = raw.min(u128::from(cap)) as u64;
            ensure!(ctx, envelope == expected, "B1", "envelope({n}) = {envelope} ns, the formula gives {expected} ns");
        }
        Formula::Approx(raw) => {
            let expected = raw.min(cap as f64);
            let (relative, absolute) = tolerance(n);
            let tolerance = expected * relative + absolute;
            ensure!(
                ctx,
                (envelope as f64 - expected).abs() <= tolerance,
                "B1",
                "envelope({n}) = {envelope} ns, the formula gives {expected} ns"
            );
            if raw >= cap as f64 * (1.0 + relative) + 2.0 {
                ensure!(
                    ctx,
                    envelope == cap,
                    "B4",
                    "envelope({n}) = {envelope} ns is past the cap point but not {cap} ns"
                );
            }
        }
    }
    envelope
}

/// B4: the envelope is non-decreasing around `n` and never above its value at `u32::MAX`.
fn check_monotone(ctx: Ctx<'_>, backoff: &Backoff, a: u32, b: u32) {
    let (lo, hi) = (a.min(b), a.max(b));
    let (e_lo, e_hi) = (check_envelope(ctx, backoff, lo), check_envelope(ctx, backoff, hi));
    ensure!(ctx, e_lo <= e_hi, "B4", "envelope({lo}) = {e_lo} ns > envelope({hi}) = {e_hi} ns");
    let next = check_envelope(ctx, backoff, hi.saturating_add(1));
    ensure!(ctx, e_hi <= next, "B4", "envelope({hi}) = {e_hi} ns > envelope({hi}+1) = {next} ns");
    let last = nanos_sat(backoff.envelope(u32::MAX));
    ensure!(ctx, next <= last, "B4", "envelope({hi}+1) = {next} ns > envelope(u32::MAX) = {last} ns (a wrap)");
    let first = nanos_sat(backoff.envelope(1));
    ensure!(ctx, first <= e_lo, "B4", "envelope({lo}) = {e_lo} ns fell below envelope(1) = {first} ns");
}

/// B2, B3: a jittered delay for failure `n` after `previous` lies in the bounds of its jitter,
/// raised to the floor and capped.
pub(crate) fn check_delay(ctx: Ctx<'_>, backoff: &Backoff, n: u32, previous_ns: u64, delay_ns: u64) {
    let cap = nanos_sat(backoff.max_delay());
    let floor = nanos_sat(backoff.min_delay());
    ensure!(ctx, delay_ns <= cap, "B2", "delay {delay_ns} ns for failure {n} is above the cap {cap} ns");
    ensure!(ctx, delay_ns >= floor, "B2", "delay {delay_ns} ns for failure {n} is below the floor {floor} ns");
    let (lo, hi) = delay_bounds(backoff, n, previous_ns);
    ensure!(
        ctx,
        (lo..=hi).contains(&delay_ns),
        "B3",
        "delay {delay_ns} ns for failure {n} (previous {previous_ns} ns) is outside [{lo}, {hi}] ns"
    );
    // Within the formula's tolerance above; and, unjittered, exactly the core's own envelope
    // raised to the floor (a consistency check between two core functions, as B5 is).
    if backoff.jitter_kind() == Jitter::None && !matches!(backoff.schedule(), Schedule::Decorrelated { .. }) {
        let envelope = nanos_sat(backoff.envelope(n)).max(floor).min(cap);
        ensure!(
            ctx,
            delay_ns == envelope,
            "B3",
            "unjittered delay {delay_ns} ns for failure {n}, envelope {envelope} ns, under {backoff:?}"
        );
    }
}

#[derive(Arbitrary, Debug)]
struct Config {
    backoff: BackoffIn,
    seed: u64,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Envelope(u32),
    EnvelopePair(u32, u32),
    Delay { failures: u32, previous: Span },
    Next,
    NextMany(u8),
    Reset,
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(backoff) = config.backoff.build() else { return };
    let mut rng = rng(config.seed);
    let mut state = BackoffState::new();
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        match *op {
            Op::Envelope(n) => check_monotone(ctx, &backoff, n, n.saturating_sub(1).max(1)),
            Op::EnvelopePair(a, b) => check_monotone(ctx, &backoff, a, b),
            Op::Delay { failures, previous } => {
                let previous = previous.get();
                let (mut r1, mut r2) = (rng.clone(), rng.clone());
                let d1 = backoff.delay(failures, previous, &mut r1);
                let d2 = backoff.delay(failures, previous, &mut r2);
                ensure!(ctx, d1 == d2, "B5", "delay() is not a pure function of its draws: {d1:?} then {d2:?}");
                check_delay(ctx, &backoff, failures, nanos_sat(previous), nanos_sat(d1));
                let _ = backoff.delay(failures, previous, &mut rng);
            }
            Op::Next => next(ctx, &backoff, &mut state, &mut rng),
            Op::NextMany(k) => {
                for _ in 0..k % 32 {
                    next(ctx, &backoff, &mut state, &mut rng);
                }
            }
            Op::Reset => {
                state.reset();
                ensure!(ctx, state == BackoffState::new(), "B5", "reset left {state:?}");
            }
        }
    }
}

/// B5: the incremental form answers exactly what the pure function answers.
fn next(ctx: Ctx<'_>, backoff: &Backoff, state: &mut BackoffState, rng: &mut rand_chacha::ChaCha8Rng) {
    let (failures, previous) = (state.failures(), state.last_delay());
    let n = failures.saturating_add(1);
    let expected = backoff.delay(n, previous, &mut rng.clone());
    let got = state.next_delay(backoff, rng);
    ensure!(ctx, got == expected, "B5", "next_delay gave {got:?}, delay({n}, {previous:?}) gives {expected:?}");
    ensure!(ctx, state.failures() == n, "B5", "the failure count is {} after {failures} + 1", state.failures());
    ensure!(ctx, state.last_delay() == got, "B5", "last_delay {:?}, returned {got:?}", state.last_delay());
    check_delay(ctx, backoff, n, nanos_sat(previous), nanos_sat(got));
    let _: Duration = got;
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
