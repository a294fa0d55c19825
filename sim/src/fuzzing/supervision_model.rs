//! The supervision machine (S1–S6, B6, G12) against the exact reference model
//! [`SupervisionModel`] (shared with the supervision family), plus the event grammar of S6 and
//! the spacing of S5 ([`Grammar`]). Between an input and the drain of its events the runner
//! probes that every input is refused and a timeout does nothing.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Backoff, DEFAULT_MAX_HINT, Failure, Instant, Restart, Setting, Supervision, SupervisionAction, SupervisionError,
    SupervisionPolicy, SupervisionPolicyBuilder, SupervisionStatus, TaskDefaults,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::BackoffIn;
use super::retry_model::{AttemptIn, KindIn};
use super::{
    At, Clock, Count, Ctx, ErrorKind, SETUP, Span, compare, compare_returned, ensure, judge_probe, parse, rng, verdict,
};
use crate::model::supervision::{Grammar, Resolved, SupervisionModel, waits};

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum RestartIn {
    Once,
    Restartable,
    Periodic(Span),
}

impl RestartIn {
    fn get(self) -> Restart {
        match self {
            RestartIn::Once => Restart::Once,
            RestartIn::Restartable => Restart::Restartable,
            RestartIn::Periodic(interval) => Restart::Periodic { interval: interval.get() },
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum SettingIn<T> {
    Inherit,
    Off,
    Set(T),
}

impl<T> SettingIn<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Setting<U> {
        match self {
            SettingIn::Inherit => Setting::Inherit,
            SettingIn::Off => Setting::Off,
            SettingIn::Set(value) => Setting::Set(f(value)),
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum DefaultsIn {
    /// S2's defaults.
    Standard,
    Custom {
        restart: RestartIn,
        backoff: BackoffIn,
        attempt_timeout: Option<Span>,
        max_retries: Option<Count>,
        min_spacing: Span,
    },
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
struct TaskIn {
    restart: SettingIn<RestartIn>,
    backoff: SettingIn<BackoffIn>,
    attempt_timeout: SettingIn<Span>,
    max_retries: SettingIn<Count>,
    min_spacing: SettingIn<Span>,
}

/// The hint settings (B6) of the defaults and of the task. They are drawn from the top bits of
/// the configuration's seed rather than from bytes of their own, so that every input decodes
/// as it did before these settings existed and the committed corpus keeps its meaning.
#[derive(Clone, Copy, Debug, PartialEq)]
struct HintsIn {
    /// `TaskDefaults::max_hint` (custom defaults only).
    default_max_hint: Duration,
    /// `TaskDefaults::restart_after_hint` (custom defaults only).
    default_restart: bool,
    max_hint: Setting<Duration>,
    restart_after_hint: Setting<bool>,
}

impl HintsIn {
    fn from_seed(seed: u64) -> Self {
        let bits = seed >> 32;
        let byte = |shift: u32| (bits >> shift) & 0xff;
        HintsIn {
            default_max_hint: match bits & 3 {
                0 => DEFAULT_MAX_HINT,
                1 => Duration::MAX,
                2 => Duration::from_millis(byte(8) * 10),
                _ => Duration::from_secs(byte(8)),
            },
            default_restart: bits & 4 != 0,
            max_hint: match (bits >> 3) & 3 {
                1 => Setting::Off,
                2 => Setting::Set(Duration::from_millis(byte(16) * 16)),
                _ => Setting::Inherit,
            },
            restart_after_hint: match (bits >> 5) & 3 {
                0 => Setting::Inherit,
                1 => Setting::Off,
                2 => Setting::Set(true),
                _ => Setting::Set(false),
            },
        }
    }
}

/// Builds the defaults and the task's policy, checking every verdict against the model's and
/// the resolved settings against S1.
fn build(defaults: &DefaultsIn, task: &TaskIn, hints: &HintsIn) -> Option<SupervisionPolicy> {
    let defaults = match *defaults {
        DefaultsIn::Standard => {
            let d = TaskDefaults::new();
            let s2 = Backoff::exponential(Duration::from_millis(200), 2.0)
                .max_delay(Duration::from_secs(30))
                .jitter(persevere::Jitter::Equal)
                .build();
            ensure!(SETUP, Ok(d.backoff) == s2, "S2", "the default backoff is {:?}", d.backoff);
            ensure!(SETUP, d.restart == Restart::Restartable && d.max_retries.is_none(), "S2", "defaults {d:?}");
            ensure!(SETUP, d.attempt_timeout.is_none() && d.min_spacing == Duration::from_millis(1), "S2", "{d:?}");
            ensure!(SETUP, d.max_hint == DEFAULT_MAX_HINT && !d.restart_after_hint, "B6", "defaults {d:?}");
            d
        }
        DefaultsIn::Custom { restart, backoff, attempt_timeout, max_retries, min_spacing } => TaskDefaults {
            restart: restart.get(),
            backoff: backoff.build()?,
            attempt_timeout: attempt_timeout.map(Span::get),
            max_retries: max_retries.map(Count::get),
            min_spacing: min_spacing.get(),
            max_hint: hints.default_max_hint,
            restart_after_hint: hints.default_restart,
        },
    };
    let backoff = match task.backoff {
        SettingIn::Inherit => Setting::Inherit,
        SettingIn::Off => Setting::Off,
        SettingIn::Set(b) => Setting::Set(b.build()?),
    };
    let builder = SupervisionPolicyBuilder {
        restart: task.restart.map(RestartIn::get),
        backoff,
        attempt_timeout: task.attempt_timeout.map(Span::get),
        max_retries: task.max_retries.map(Count::get),
        min_spacing: task.min_spacing.map(Span::get),
        max_hint: hints.max_hint,
        restart_after_hint: hints.restart_after_hint,
    };
    let resolved = Resolved::new(&builder, &defaults);
    let mut reasons = Vec::new();
    let timeout_zero = resolved.attempt_timeout.is_some_and(|t| t.is_zero());
    if resolved.max_retries == Some(0) || timeout_zero || resolved.max_hint.is_zero() {
        reasons.push(ErrorKind::Zero);
    }
    let policy = verdict("supervision policy", builder.build(&defaults), &reasons)?;
    let _ = resolved.check(&mut SETUP.judge(), &policy);
    Some(policy)
}

#[derive(Arbitrary, Debug)]
struct Config {
    defaults: DefaultsIn,
    task: TaskIn,
    seed: u64,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Start(At),
    Success(At, AttemptIn),
    Failure(At, AttemptIn, KindIn, u8),
    Abandoned(At, AttemptIn, Option<u8>),
    Timeout(At),
    Timeout2(At),
    Cancel(At),
}

/// An input fed while the events of the previous one wait to be drained (the drain rule).
#[derive(Clone, Copy, Debug)]
enum Probe {
    Timeout,
    Success,
    Failure,
    Abandoned,
    Cancel,
    Start,
}

const PROBES: [Probe; 6] =
    [Probe::Timeout, Probe::Success, Probe::Failure, Probe::Abandoned, Probe::Cancel, Probe::Start];

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let hints = HintsIn::from_seed(config.seed);
    let Some(policy) = build(&config.defaults, &config.task, &hints) else { return };
    let mut rng = rng(config.seed);
    let mut machine = Supervision::<u8>::new();
    let mut model = SupervisionModel::<u8>::new();
    let mut clock = Clock::default();
    let mut grammar = Grammar::default();
    let mut probes = 0usize;
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let result: Result<Vec<SupervisionAction<u8>>, SupervisionError> = match *op {
            Op::Start(at) => {
                let now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_start(&policy, now), model.start(&policy, now))
            }
            Op::Success(at, attempt) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(model.attempt);
                compare(ctx, machine.handle_success(&policy, now, attempt), model.success(&policy, now, attempt))
            }
            Op::Failure(at, attempt, kind, error) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(model.attempt);
                let failure = Failure::new(kind.get(now), error);
                let got = machine.handle_failure(&policy, now, attempt, failure, &mut rng);
                let expected = model.failure(&policy, now, attempt, failure, waits(&machine));
                compare_returned(ctx, got, &failure, expected)
            }
            Op::Abandoned(at, attempt, panic) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(model.attempt);
                let got = machine.handle_abandoned(&policy, now, attempt, panic, &mut rng);
                let expected = model.abandoned(&policy, now, attempt, panic, waits(&machine));
                if let Err(refused) = &got {
                    ensure!(ctx, refused.input == panic, "G12", "the refused panic came back as {:?}", refused.input);
                }
                compare(ctx, got.map_err(|r| r.error), expected)
            }
            Op::Timeout(at) | Op::Timeout2(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let expected = model.timeout(&policy, now);
                machine.handle_timeout(&policy, now);
                if expected.is_empty() {
                    ensure!(ctx, machine == before, "S6", "an early or spurious handle_timeout changed the state");
                }
                Ok(expected)
            }
            Op::Cancel(at) => {
                let now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_cancel(now), model.cancel(now))
            }
        };
        match result {
            Err(_) => ensure!(ctx, machine == before, "G12", "a refused input changed the state"),
            Ok(expected) => {
                ensure!(ctx, expected.len() <= 4, "S6", "the model expects more than four events: {expected:?}");
                // Drained one event at a time; before each, an input is refused and changes
                // nothing (the drain rule).
                model.undrained = true;
                for want in &expected {
                    let probe = PROBES[probes % PROBES.len()];
                    probes += 1;
                    feed_probe(ctx, probe, &policy, &mut machine, &mut model, clock.now, &mut rng);
                    let event = machine.poll_action();
                    ensure!(ctx, event.as_ref() == Some(want), "model", "event {event:?}, the model expects {want:?}");
                    let _ = grammar.event(&mut ctx.judge(), &policy, model.last_now, want);
                }
                model.undrained = false;
                let extra = machine.poll_action();
                ensure!(ctx, extra.is_none(), "model", "event {extra:?} after {expected:?}, the model expects none");
            }
        }
        let status = machine.status();
        let timeout = machine.poll_timeout();
        let consistent = match status {
            SupervisionStatus::Running { deadline, .. } => timeout == deadline,
            SupervisionStatus::Waiting { until, .. } => timeout == Some(until),
            _ => timeout.is_none(),
        };
        ensure!(ctx, consistent, "S6", "poll_timeout {timeout:?} does not match the status {status:?}");
        ensure!(ctx, status == model.status(), "model", "status {status:?}, the model expects {:?}", model.status());
        ensure!(
            ctx,
            machine.streak() == model.failures,
            "S3",
            "{} failures, the model counts {}",
            machine.streak(),
            model.failures
        );
        ensure!(
            ctx,
            machine.attempt() == model.attempt,
            "S6",
            "attempt {}, the model expects {}",
            machine.attempt(),
            model.attempt
        );
        ensure!(
            ctx,
            machine.now() == model.last_now,
            "S5",
            "now {:?}, the model expects {:?}",
            machine.now(),
            model.last_now
        );
        ensure!(
            ctx,
            machine.last_failure() == model.last_failure.as_ref(),
            "S4",
            "last failure {:?}, the model expects {:?}",
            machine.last_failure(),
            model.last_failure
        );
    }
}

/// While events wait to be drained, feeds `probe` and checks that the machine answers what the
/// model does (its validity error, else `Undrained`; a timeout does nothing) and that neither
/// changes.
fn feed_probe(
    ctx: Ctx<'_>,
    probe: Probe,
    policy: &SupervisionPolicy,
    machine: &mut Supervision<u8>,
    model: &mut SupervisionModel<u8>,
    now: Instant,
    rng: &mut ChaCha8Rng,
) {
    let (before, was) = (*machine, model.clone());
    let attempt = model.attempt;
    let (got, expected) = match probe {
        Probe::Timeout => {
            machine.handle_timeout(policy, Instant::MAX);
            (Ok(()), Ok(model.timeout(policy, Instant::MAX)))
        }
        Probe::Success => (machine.handle_success(policy, now, attempt), model.success(policy, now, attempt)),
        Probe::Failure => {
            let failure = Failure::retryable(9);
            let got = machine.handle_failure(policy, now, attempt, failure, rng);
            if let Err(refused) = &got {
                ensure!(ctx, refused.input == failure, "G12", "the refused failure came back as {:?}", refused.input);
            }
            (got.map_err(|r| r.error), model.failure(policy, now, attempt, failure, waits(machine)))
        }
        Probe::Abandoned => {
            let got = machine.handle_abandoned(policy, now, attempt, None, rng);
            if let Err(refused) = &got {
                ensure!(ctx, refused.input.is_none(), "G12", "the refused drop came back as {:?}", refused.input);
            }
            (got.map_err(|r| r.error), model.abandoned(policy, now, attempt, None, waits(machine)))
        }
        Probe::Cancel => (machine.handle_cancel(now), model.cancel(now)),
        Probe::Start => (machine.handle_start(policy, now), model.start(policy, now)),
    };
    judge_probe(ctx, probe, got, expected, (*machine == before, *model == was));
}

/// The configuration, the hint settings drawn from its seed, and the operations `data`
/// decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    let parsed = parse::<Config, Op>(data);
    let hints = parsed.as_ref().map(|(config, _)| HintsIn::from_seed(config.seed));
    format!("{parsed:#?}\nhint settings from the seed: {hints:#?}")
}
