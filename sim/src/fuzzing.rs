//! Fuzzing entry points: bytes in, a configuration and a list of operations out, run against the
//! real core machine and a simple reference model, with the guarantees checked after every
//! operation (`docs/ARCHITECTURE.md`, *Testing*).
//!
//! Each function turns `data` into a configuration with [`arbitrary`] and builds it through the
//! public builders: an invalid configuration must come back as a [`persevere::PolicyError`] of
//! the kind the model expects (and never panic), and then the run stops. A valid one drives the
//! machine through at most [`MAX_OPS`] operations — times that jump forward, stand still or go
//! backwards, stale or future attempt numbers, foreign permits, wrong workers — and after each
//! one checks the machine's outputs and state against the model. A broken rule panics with a
//! message that starts with the rule's id (`B2`, `R1`, `G12`, …).
//!
//! The fuzz targets in `fuzz/fuzz_targets/` are one-liners over these functions, and
//! `sim/tests/fuzz_corpus.rs` replays the committed seed corpus through them on stable.
//!
//! | function          | machine                              | what is checked after every operation                          |
//! |-------------------|--------------------------------------|-----------------------------------------------------------------|
//! | [`backoff`]       | `Backoff`, `BackoffState`            | B1–B5: envelope formula and monotonicity, delays in bounds      |
//! | [`retry`]         | `Retry`                              | R1–R6, B6, G2, G4, G7, G11, G12 against an exact model           |
//! | [`supervision`]   | `Supervision`                        | S3–S6 and the event grammar, G12, against an exact model         |
//! | [`flow`]          | `Flow`                               | F3–F10 streak arithmetic and dispatch rules, against a model     |
//! | [`breaker`]       | `Breaker`                            | K1–K5, G8, G12, against a model with a plain list as its window  |
//! | [`budget`]        | `TokenBucket`, `RatioBudget`         | U1–U3, G9, against exact models                                  |
//! | [`delivery`]      | `Delivery`                           | D1–D9, G10–G12, against a model built on the retry model         |
//! | [`hedge`]         | `Hedge`                              | X1–X5, G12: every output against a reference written from the rules |
//! | [`retry_state`], [`supervision_state`], [`flow_state`], [`breaker_state`], [`budget_state`], [`delivery_state`], [`backoff_state`], [`flows_state`], [`deliveries_state`], [`concurrency_state`], [`limits_state`] | a *loaded* state of each | any state that loads is safe to drive: a state decoded from arbitrary bytes is refused or driven, under an arbitrary policy, without a panic or an overflow; it stays loadable after every operation; refused inputs change nothing (see [`state`]) |

use core::fmt::Debug;
use core::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use persevere::Instant;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

mod backoff_model;
mod breaker_model;
mod budget_model;
mod delivery_model;
mod flow_model;
mod hedge_model;
mod limits_state;
mod retry_model;
pub mod state;
mod supervision_model;

/// The most operations one input runs (TIGER_STYLE: a bound on every loop).
pub const MAX_OPS: usize = 256;

/// Backoff schedules (B1–B5): builder validation, `envelope`, `delay` and `BackoffState`.
pub fn backoff(data: &[u8]) {
    backoff_model::run(data);
}

/// The retry machine (R1–R6, B6, G2, G4, G7, G11, G12).
pub fn retry(data: &[u8]) {
    retry_model::run(data);
}

/// The supervision machine (S1–S6, G12).
pub fn supervision(data: &[u8]) {
    supervision_model::run(data);
}

/// One flow (F1–F10, G5, G12).
pub fn flow(data: &[u8]) {
    flow_model::run(data);
}

/// The circuit breaker (K1–K5, G8, G12).
pub fn breaker(data: &[u8]) {
    breaker_model::run(data);
}

/// The retry budgets: token bucket and ratio budget (U1–U3, G9).
pub fn budget(data: &[u8]) {
    budget_model::run(data);
}

/// One task's redelivery (D1–D10, G10–G12).
pub fn delivery(data: &[u8]) {
    delivery_model::run(data);
}

/// The hedging machine (X1–X5, G12), against a reference written from the rules.
pub fn hedge(data: &[u8]) {
    hedge_model::run(data);
}

/// A loaded [`persevere::Retry`] state driven under any policy (see [`state`]).
pub fn retry_state(data: &[u8]) {
    state::retry(data);
}

/// A loaded [`persevere::Supervision`] state driven under any policy (see [`state`]).
pub fn supervision_state(data: &[u8]) {
    state::supervision(data);
}

/// A loaded [`persevere::Flow`] state driven under any policy (see [`state`]).
pub fn flow_state(data: &[u8]) {
    state::flow(data);
}

/// A loaded [`persevere::Breaker`] state driven under any policy (see [`state`]).
pub fn breaker_state(data: &[u8]) {
    state::breaker(data);
}

/// Loaded [`persevere::TokenBucket`] and [`persevere::RatioBudget`] states driven under any
/// policies (see [`state`]).
pub fn budget_state(data: &[u8]) {
    state::budget(data);
}

/// A loaded [`persevere::Delivery`] state driven under any policy (see [`state`]).
pub fn delivery_state(data: &[u8]) {
    state::delivery(data);
}

/// A loaded [`persevere::BackoffState`] driven under any backoff (see [`state`]).
pub fn backoff_state(data: &[u8]) {
    state::backoff(data);
}

/// A loaded [`persevere::Flows`] registry driven under any policy (see [`state`]).
pub fn flows_state(data: &[u8]) {
    state::flows(data);
}

/// A loaded [`persevere::Deliveries`] table driven under any policy (see [`state`]).
pub fn deliveries_state(data: &[u8]) {
    state::deliveries(data);
}

/// A loaded [`persevere::ConcurrencyBudget`] driven under any policy (see [`state`]).
pub fn concurrency_state(data: &[u8]) {
    state::concurrency(data);
}

/// A loaded [`persevere::Limiter`] and [`persevere::Bulkhead`] driven under any policies: L1, L3,
/// L4 besides the state checks (see [`state`]).
pub fn limits_state(data: &[u8]) {
    limits_state::run(data);
}

/// The fuzz targets, by name, in report order.
pub const TARGETS: [&str; 19] = [
    "backoff",
    "retry",
    "supervision",
    "flow",
    "breaker",
    "budget",
    "delivery",
    "hedge",
    "backoff_state",
    "retry_state",
    "supervision_state",
    "flow_state",
    "breaker_state",
    "budget_state",
    "delivery_state",
    "flows_state",
    "deliveries_state",
    "concurrency_state",
    "limits_state",
];

/// Runs the target `name` on `data`; `false` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "backoff" => backoff(data),
        "retry" => retry(data),
        "supervision" => supervision(data),
        "flow" => flow(data),
        "breaker" => breaker(data),
        "budget" => budget(data),
        "delivery" => delivery(data),
        "hedge" => hedge(data),
        "backoff_state" => backoff_state(data),
        "retry_state" => retry_state(data),
        "supervision_state" => supervision_state(data),
        "flow_state" => flow_state(data),
        "breaker_state" => breaker_state(data),
        "budget_state" => budget_state(data),
        "delivery_state" => delivery_state(data),
        "flows_state" => flows_state(data),
        "deliveries_state" => deliveries_state(data),
        "concurrency_state" => concurrency_state(data),
        "limits_state" => limits_state(data),
        _ => return false,
    }
    true
}

/// The configuration and operations that `data` decodes to for the target `name`, to read a
/// crashing input (`None` for an unknown name).
pub fn describe(name: &str, data: &[u8]) -> Option<String> {
    Some(match name {
        "backoff" => backoff_model::describe(data),
        "retry" => retry_model::describe(data),
        "supervision" => supervision_model::describe(data),
        "flow" => flow_model::describe(data),
        "breaker" => breaker_model::describe(data),
        "budget" => budget_model::describe(data),
        "delivery" => delivery_model::describe(data),
        "hedge" => hedge_model::describe(data),
        name if name.ends_with("_state") => format!("{} bytes of encoded state, policy and operations", data.len()),
        _ => return None,
    })
}

/// Panics with the rule's id and a message when `cond` is false.
macro_rules! ensure {
    ($ctx:expr, $cond:expr, $rule:literal, $($arg:tt)+) => {{
        let holds: bool = $cond;
        if !holds {
            $crate::fuzzing::violated($ctx, $rule, format_args!($($arg)+));
        }
    }};
}
pub(crate) use ensure;

/// Where a run is: the operation's index and the operation itself, for violation messages.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) step: usize,
    pub(crate) op: &'a dyn Debug,
}

impl<'a> Ctx<'a> {
    /// This context as a [`Judge`](crate::model::Judge): a broken rule panics, as `ensure!` does.
    pub(crate) fn judge(self) -> CtxJudge<'a> {
        CtxJudge(self)
    }
}

/// A fuzz context judging a shared model's rules (see [`Ctx::judge`]).
pub(crate) struct CtxJudge<'a>(Ctx<'a>);

impl crate::model::Judge for CtxJudge<'_> {
    type Error = core::convert::Infallible;

    fn check(&mut self, rule: &'static str, holds: bool, why: impl FnOnce() -> String) -> Result<(), Self::Error> {
        if !holds {
            violated(self.0, rule, format_args!("{}", why()));
        }
        Ok(())
    }
}

/// The context of the configuration, before any operation.
pub(crate) const SETUP: Ctx<'static> = Ctx { step: 0, op: &"(configuration)" };

#[cold]
#[track_caller]
pub(crate) fn violated(ctx: Ctx<'_>, rule: &str, message: core::fmt::Arguments<'_>) -> ! {
    panic!("{rule} violated at operation {}: {message}\n  operation: {:?}", ctx.step, ctx.op)
}

/// The machine's answer to an input against the model's: both accept, or both refuse with the
/// same error. Returns the model's answer.
pub(crate) fn compare<T: Debug, E: PartialEq + Debug>(
    ctx: Ctx<'_>,
    got: Result<(), E>,
    expected: Result<T, E>,
) -> Result<T, E> {
    match (&got, &expected) {
        (Ok(()), Ok(_)) => {}
        (Err(g), Err(e)) => ensure!(ctx, g == e, "model", "refused with {g:?}, the model expects {e:?}"),
        _ => ensure!(ctx, false, "model", "the machine answered {got:?}, the model expects {expected:?}"),
    }
    expected
}

/// [`compare`] for an input the machine gives back when it refuses it: the very `input` (G12).
pub(crate) fn compare_returned<T: Debug, E: PartialEq + Debug, I: PartialEq + Debug>(
    ctx: Ctx<'_>,
    got: Result<(), persevere::Refused<E, I>>,
    input: &I,
    expected: Result<T, E>,
) -> Result<T, E> {
    if let Err(refused) = &got {
        ensure!(ctx, refused.input == *input, "G12", "the refused input came back as {:?}", refused.input);
    }
    compare(ctx, got.map_err(|r| r.error), expected)
}

/// The drain rule for `probe`, an input fed while the actions of an earlier one wait to be
/// drained: the model refuses it (or, for a timeout, makes nothing), the machine answers the
/// same, and neither changed (`kept`: the machine's state and the model's are as before).
pub(crate) fn judge_probe<A: Debug, E: PartialEq + Debug>(
    ctx: Ctx<'_>,
    probe: impl Debug,
    got: Result<(), E>,
    expected: Result<Vec<A>, E>,
    (machine_kept, model_kept): (bool, bool),
) {
    ensure!(ctx, !matches!(&expected, Ok(v) if !v.is_empty()), "drain", "the model accepts {probe:?} while undrained");
    let expected = expected.map(|_| ());
    ensure!(ctx, got == expected, "drain", "{probe:?} while undrained: {got:?}, the model expects {expected:?}");
    ensure!(ctx, machine_kept, "G12", "{probe:?} while undrained changed the state");
    ensure!(ctx, model_kept, "model", "{probe:?} while undrained changed the model");
}

/// Reads a configuration and then operations until the data or [`MAX_OPS`] runs out.
pub(crate) fn parse<'a, C: Arbitrary<'a>, O: Arbitrary<'a>>(data: &'a [u8]) -> Option<(C, Vec<O>)> {
    let mut u = Unstructured::new(data);
    let config = C::arbitrary(&mut u).ok()?;
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match O::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    Some((config, ops))
}

/// The RNG every machine draws its jitter from (no model draws: see
/// [`adopt`](crate::model::backoff::adopt)).
pub(crate) fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A span, biased towards the sizes that matter (zero, small, huge, overflowing `u64` ns).
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Span {
    Zero,
    Nanos(u8),
    Micros(u16),
    Millis(u16),
    Secs(u16),
    Raw(u64),
    /// Whole seconds from a `u64`: beyond ~584 years it no longer fits in `u64` nanoseconds.
    HugeSecs(u64),
    Max,
}

impl Span {
    pub(crate) fn get(self) -> Duration {
        match self {
            Span::Zero => Duration::ZERO,
            Span::Nanos(n) => Duration::from_nanos(u64::from(n)),
            Span::Micros(n) => Duration::from_micros(u64::from(n)),
            Span::Millis(n) => Duration::from_millis(u64::from(n)),
            Span::Secs(n) => Duration::from_secs(u64::from(n)),
            Span::Raw(n) => Duration::from_nanos(n),
            Span::HugeSecs(n) => Duration::from_secs(n),
            Span::Max => Duration::MAX,
        }
    }
}

/// The `now` of an operation, relative to the driver's clock: forward, standing still, backwards
/// (a stale reading), at the machine's own timeout, or anywhere.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    Same,
    Forward(Span),
    Back(Span),
    /// At the machine's `poll_timeout` (or the clock when none).
    Due,
    /// Just before the machine's `poll_timeout`.
    JustBeforeDue,
    /// Some time after the machine's `poll_timeout`.
    AfterDue(Span),
    Abs(u64),
    Max,
}

/// The driver's clock: the latest time it has read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Clock {
    pub(crate) now: Instant,
}

impl Clock {
    /// The `now` an operation passes, given the machine's `poll_timeout`.
    pub(crate) fn at(&mut self, at: At, due: Option<Instant>) -> Instant {
        let now = match at {
            At::Same => self.now,
            At::Forward(span) => self.now.saturating_add(span.get()),
            At::Back(span) => return self.now.saturating_sub(span.get()),
            At::Due => due.unwrap_or(self.now),
            At::JustBeforeDue => return due.unwrap_or(self.now).saturating_sub(Duration::from_nanos(1)),
            At::AfterDue(span) => due.unwrap_or(self.now).saturating_add(span.get()),
            At::Abs(n) => Instant::from_nanos(n),
            At::Max => Instant::MAX,
        };
        self.now = self.now.later(now);
        now
    }
}

/// A count, biased towards small values.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    Small(u8),
    Byte(u8),
    Raw(u32),
    Max,
}

impl Count {
    pub(crate) fn get(self) -> u32 {
        match self {
            Count::Small(n) => u32::from(n % 8),
            Count::Byte(n) => u32::from(n),
            Count::Raw(n) => n,
            Count::Max => u32::MAX,
        }
    }
}

/// A fraction (jitter factor, rate, ratio), valid or not.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fraction {
    /// `n / 1000`: valid up to 1000.
    Thousandths(u16),
    Raw(f64),
    Nan,
    Infinite,
    Negative(u8),
}

impl Fraction {
    pub(crate) fn get(self) -> f64 {
        match self {
            Fraction::Thousandths(n) => f64::from(n) / 1000.0,
            Fraction::Raw(x) => x,
            Fraction::Nan => f64::NAN,
            Fraction::Infinite => f64::INFINITY,
            Fraction::Negative(n) => -f64::from(n) / 100.0 - 0.001,
        }
    }
}

/// `u64` nanoseconds of a span, or `None` when it does not fit (a policy's overflow error).
pub(crate) fn nanos(span: Duration) -> Option<u64> {
    u64::try_from(span.as_nanos()).ok()
}

/// `u64` nanoseconds of a span, saturating.
pub(crate) fn nanos_sat(span: Duration) -> u64 {
    nanos(span).unwrap_or(u64::MAX)
}

/// The discriminant of a [`persevere::PolicyError`], for comparing a builder's verdict with the
/// model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    NotFinite,
    MultiplierOutOfRange,
    FractionOutOfRange,
    OutOfRange,
    CapBelow,
    Zero,
    DurationOverflow,
    LimitTooLarge,
    Conflict,
    Unbounded,
}

pub(crate) fn error_kind(error: &persevere::PolicyError) -> Option<ErrorKind> {
    use persevere::PolicyError as P;
    Some(match error {
        P::NotFinite { .. } => ErrorKind::NotFinite,
        P::MultiplierOutOfRange { .. } => ErrorKind::MultiplierOutOfRange,
        P::FractionOutOfRange { .. } => ErrorKind::FractionOutOfRange,
        P::OutOfRange { .. } => ErrorKind::OutOfRange,
        P::CapBelow { .. } => ErrorKind::CapBelow,
        P::Zero { .. } => ErrorKind::Zero,
        P::DurationOverflow { .. } => ErrorKind::DurationOverflow,
        P::LimitTooLarge { .. } => ErrorKind::LimitTooLarge,
        P::Conflict { .. } => ErrorKind::Conflict,
        P::Unbounded => ErrorKind::Unbounded,
        _ => return None,
    })
}

/// Checks a builder's verdict against the model's list of reasons the configuration is invalid
/// (empty: valid). An invalid configuration must be refused with one of those reasons; a valid
/// one must build. Returns the built value when both agree it is valid.
pub(crate) fn verdict<T: Debug>(
    what: &str,
    built: Result<T, persevere::PolicyError>,
    reasons: &[ErrorKind],
) -> Option<T> {
    match built {
        Ok(value) => {
            ensure!(
                SETUP,
                reasons.is_empty(),
                "policy-validation",
                "{what}: built {value:?} although the model expects {reasons:?}"
            );
            Some(value)
        }
        Err(error) => {
            let kind = error_kind(&error);
            ensure!(
                SETUP,
                kind.is_some_and(|k| reasons.contains(&k)),
                "policy-validation",
                "{what}: refused with {error:?} ({error}), the model expects {reasons:?}"
            );
            None
        }
    }
}
