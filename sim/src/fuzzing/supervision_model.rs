//! The supervision machine (S1–S6, B6, G12) against an exact reference model, plus an
//! independent check of the event grammar of S6 and the spacing of S5.
//!
//! The model restates the one failure decision (revised by issue 12): a failure's class first
//! (`Fatal` and `DoNotRetry` finish `Fatal`, `Canceled` finishes `Canceled` without counting),
//! then the limit (`once`, or a streak past `max_retries`, finishes `Failed` / `TimedOut`, a
//! hinted failure too), then the hint (never shortened; past `max_hint` the task finishes
//! `Deferred` at the hinted instant) or else the backoff. Every decided failure counts into
//! the streak; after a hinted delay under `restart_after_hint` the backoff's place starts over
//! while the streak goes on. Between an input and the drain of its events every input is
//! refused (`Undrained`, after the validity errors) and a timeout does nothing: the runner
//! probes that on every step.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Backoff, DEFAULT_MAX_HINT, Failure, FailureClass, FailureKind, Hint, Instant, LastFailure, Restart, Setting,
    Supervision, SupervisionAction, SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder, SupervisionStatus,
    TaskDefaults, TaskOutcome, TaskOutcomeKind,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::BackoffIn;
use super::retry_model::{AttemptIn, KindIn};
use super::{At, Clock, Count, Ctx, ErrorKind, SETUP, Span, ensure, nanos_sat, parse, rng, verdict};
use crate::model::backoff::{adopt, delay_bounds};
use crate::model::supervision::{Grammar, Resolved};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Running { deadline: Option<Instant> },
    Abandoning,
    Waiting { until: Instant },
    Finished(TaskOutcomeKind),
}

/// What a [`Supervision`] must be doing, restated from S1–S6 and B6.
#[derive(Clone, Debug, PartialEq)]
struct Model {
    phase: Phase,
    attempt: u64,
    /// The streak: failures since the last success that the failure decision counted (every
    /// one but a cancel; a panic while dropping a timed-out attempt is final by S4 and is not
    /// decided, so not counted).
    failures: u32,
    /// The backoff's place: failures since the schedule last started over.
    place: u32,
    last_delay_ns: u64,
    last_start: Instant,
    last_now: Instant,
    last_failure: Option<LastFailure<u8>>,
    /// The hinted instant of a `Deferred` outcome.
    retry_at: Option<Instant>,
    /// Events of an earlier input wait to be drained (the runner holds them).
    undrained: bool,
}

type Events = Vec<SupervisionAction<u8>>;

impl Model {
    fn new() -> Self {
        Model {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            place: 0,
            last_delay_ns: 0,
            last_start: Instant::ZERO,
            last_now: Instant::ZERO,
            last_failure: None,
            retry_at: None,
            undrained: false,
        }
    }

    fn status(&self) -> SupervisionStatus {
        match self.phase {
            Phase::Idle => SupervisionStatus::Idle,
            Phase::Running { deadline } => SupervisionStatus::Running { attempt: self.attempt, deadline },
            Phase::Abandoning => SupervisionStatus::Abandoning { attempt: self.attempt },
            Phase::Waiting { until } => {
                SupervisionStatus::Waiting { next_attempt: self.attempt.saturating_add(1), until }
            }
            Phase::Finished(kind) => SupervisionStatus::Finished(kind),
        }
    }

    fn check_running(&self, attempt: u64) -> Result<(), SupervisionError> {
        match self.phase {
            Phase::Running { .. } if attempt != self.attempt => {
                Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt })
            }
            Phase::Running { .. } if self.undrained => Err(SupervisionError::Undrained),
            Phase::Running { .. } => Ok(()),
            Phase::Abandoning | Phase::Waiting { .. } => Err(SupervisionError::NoAttemptRunning),
            Phase::Idle => Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => Err(SupervisionError::Finished(kind)),
        }
    }

    fn begin(&mut self, policy: &SupervisionPolicy, now: Instant) -> SupervisionAction<u8> {
        self.attempt = self.attempt.saturating_add(1);
        self.last_start = now;
        let deadline = policy.attempt_timeout().map(|t| now.saturating_add(t)).filter(|d| *d != Instant::MAX);
        self.phase = Phase::Running { deadline };
        SupervisionAction::AttemptStarting { attempt: self.attempt, deadline }
    }

    fn finish(&mut self, kind: TaskOutcomeKind) -> SupervisionAction<u8> {
        self.phase = Phase::Finished(kind);
        let last = self.last_failure.take();
        let outcome = match kind {
            TaskOutcomeKind::Completed => TaskOutcome::Completed,
            TaskOutcomeKind::TimedOut => TaskOutcome::TimedOut,
            TaskOutcomeKind::Canceled => TaskOutcome::Canceled { last_failure: last },
            TaskOutcomeKind::Panicked => TaskOutcome::Panicked { error: last.and_then(|l| l.error).unwrap_or(0) },
            TaskOutcomeKind::Fatal => TaskOutcome::Fatal { failure: last.expect("a fatal failure is stored") },
            TaskOutcomeKind::Deferred => TaskOutcome::Deferred {
                retry_at: self.retry_at.expect("a deferred task has its hinted instant"),
                last_failure: last.expect("a hinted failure is stored"),
            },
            _ => TaskOutcome::Failed { last_failure: last.expect("a failure is stored") },
        };
        SupervisionAction::TaskFinished { outcome, attempts: self.attempt }
    }

    fn wait(&mut self, policy: &SupervisionPolicy, now: Instant, delay_ns: u64) -> SupervisionAction<u8> {
        let until = now
            .saturating_add(Duration::from_nanos(delay_ns))
            .later(self.last_start.saturating_add(policy.min_spacing()));
        self.phase = Phase::Waiting { until };
        SupervisionAction::BackoffScheduled {
            next_attempt: self.attempt.saturating_add(1),
            delay: until.saturating_duration_since(self.last_now),
            until,
        }
    }

    /// A retryable failure (its hinted delay, if any): the limit, then the hint or the backoff.
    fn retry_or_finish(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        hinted: Option<u64>,
        not_retried: TaskOutcomeKind,
        observed: Option<Instant>,
    ) -> SupervisionAction<u8> {
        self.failures = self.failures.saturating_add(1);
        let limit_reached = policy.max_retries().is_some_and(|max| self.failures > max);
        if policy.restart() == Restart::Once || limit_reached {
            return self.finish(not_retried);
        }
        match hinted {
            Some(hinted) if hinted > nanos_sat(policy.max_hint()) => {
                self.retry_at = Some(now.saturating_add(Duration::from_nanos(hinted)));
                self.finish(TaskOutcomeKind::Deferred)
            }
            Some(hinted) => {
                if policy.restarts_after_hint() {
                    self.place = 0;
                    self.last_delay_ns = 0;
                } else {
                    self.place = self.place.saturating_add(1);
                    self.last_delay_ns = hinted;
                }
                self.wait(policy, now, hinted)
            }
            None => {
                self.place = self.place.saturating_add(1);
                let bounds = delay_bounds(policy.backoff(), self.place, self.last_delay_ns);
                self.last_delay_ns = adopt(observed, now, bounds, |_| false);
                self.wait(policy, now, self.last_delay_ns)
            }
        }
    }

    fn start(&mut self, policy: &SupervisionPolicy, now: Instant) -> Result<Events, SupervisionError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            _ => return Err(SupervisionError::AlreadyStarted),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(vec![self.begin(policy, now)])
    }

    fn success(&mut self, policy: &SupervisionPolicy, now: Instant, attempt: u64) -> Result<Events, SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        self.failures = 0;
        self.place = 0;
        self.last_delay_ns = 0;
        self.last_failure = None;
        let ended = SupervisionAction::AttemptSucceeded { attempt };
        Ok(vec![
            ended,
            match policy.restart() {
                Restart::Periodic { interval } => self.wait(policy, now, nanos_sat(interval)),
                _ => self.finish(TaskOutcomeKind::Completed),
            },
        ])
    }

    fn failure(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        failure: Failure<u8>,
        observed: Option<Instant>,
    ) -> Result<Events, SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        let class = failure.kind.class();
        self.last_failure = Some(LastFailure { class, error: Some(failure.error) });
        // A cancel reported by the task ends its attempt as canceled (S6).
        let ended = match failure.kind {
            FailureKind::Canceled => SupervisionAction::AttemptCanceled { attempt },
            _ => SupervisionAction::AttemptFailed { attempt, class },
        };
        let next = match failure.kind {
            FailureKind::Canceled => self.finish(TaskOutcomeKind::Canceled),
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => {
                self.failures = self.failures.saturating_add(1);
                self.finish(TaskOutcomeKind::Fatal)
            }
            kind => {
                let hinted = match kind {
                    FailureKind::Hinted(Hint::After(d)) => Some(nanos_sat(d)),
                    FailureKind::Hinted(Hint::At(at)) => Some(nanos_sat(at.saturating_duration_since(now))),
                    _ => None,
                };
                self.retry_or_finish(policy, now, hinted, TaskOutcomeKind::Failed, observed)
            }
        };
        Ok(vec![ended, next])
    }

    fn abandoned(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        attempt: u64,
        panic: Option<u8>,
        observed: Option<Instant>,
    ) -> Result<Events, SupervisionError> {
        match self.phase {
            Phase::Abandoning if attempt != self.attempt => {
                return Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt });
            }
            Phase::Abandoning if self.undrained => return Err(SupervisionError::Undrained),
            Phase::Abandoning => {}
            Phase::Idle => return Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            Phase::Running { .. } | Phase::Waiting { .. } => return Err(SupervisionError::NothingAbandoned),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(vec![match panic {
            Some(error) => {
                // The timed-out attempt failed: it counts, and its panicking drop ends the task.
                self.last_failure = Some(LastFailure { class: FailureClass::Panicked, error: Some(error) });
                self.failures = self.failures.saturating_add(1);
                self.finish(TaskOutcomeKind::Panicked)
            }
            None => self.retry_or_finish(policy, now, None, TaskOutcomeKind::TimedOut, observed),
        }])
    }

    fn timeout(&mut self, policy: &SupervisionPolicy, now: Instant) -> Events {
        let now = self.last_now.later(now);
        match self.phase {
            _ if self.undrained => Vec::new(),
            Phase::Running { deadline: Some(deadline) } if deadline <= now => {
                self.last_now = now;
                self.phase = Phase::Abandoning;
                self.last_failure = Some(LastFailure { class: FailureClass::Timeout, error: None });
                vec![SupervisionAction::AttemptTimedOut { attempt: self.attempt }]
            }
            Phase::Waiting { until } if until <= now => {
                self.last_now = now;
                vec![self.begin(policy, now)]
            }
            _ => Vec::new(),
        }
    }

    fn cancel(&mut self, now: Instant) -> Result<Events, SupervisionError> {
        let mut events = match self.phase {
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            _ if self.undrained => return Err(SupervisionError::Undrained),
            Phase::Running { .. } => vec![SupervisionAction::AttemptCanceled { attempt: self.attempt }],
            _ => Vec::new(),
        };
        self.last_now = self.last_now.later(now);
        events.push(self.finish(TaskOutcomeKind::Canceled));
        Ok(events)
    }
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
    let mut model = Model::new();
    let mut clock = Clock::default();
    let mut grammar = Grammar::default();
    let mut probes = 0usize;
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let result: Result<Events, SupervisionError> = match *op {
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
                if let Err(refused) = &got {
                    ensure!(
                        ctx,
                        refused.input == failure,
                        "G12",
                        "the refused failure came back as {:?}",
                        refused.input
                    );
                }
                compare(ctx, got.map_err(|r| r.error), expected)
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
                machine.handle_timeout(&policy, now, &mut rng);
                if expected.is_empty() {
                    ensure!(ctx, machine == before, "S6", "an early or spurious handle_timeout changed the state");
                }
                Ok(expected)
            }
            Op::Cancel(at) => {
                let now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_cancel(&policy, now), model.cancel(now))
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

/// The instant `machine` waits until before its next restart, if it is waiting.
fn waits(machine: &Supervision<u8>) -> Option<Instant> {
    match machine.status() {
        SupervisionStatus::Waiting { until, .. } => Some(until),
        _ => None,
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
    model: &mut Model,
    now: Instant,
    rng: &mut ChaCha8Rng,
) {
    let (before, was) = (*machine, model.clone());
    let attempt = model.attempt;
    let (got, expected) = match probe {
        Probe::Timeout => {
            machine.handle_timeout(policy, Instant::MAX, rng);
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
        Probe::Cancel => (machine.handle_cancel(policy, now), model.cancel(now)),
        Probe::Start => (machine.handle_start(policy, now), model.start(policy, now)),
    };
    ensure!(ctx, !matches!(&expected, Ok(v) if !v.is_empty()), "drain", "the model accepts {probe:?} while undrained");
    let expected = expected.map(|_| ());
    ensure!(ctx, got == expected, "drain", "{probe:?} while undrained: {got:?}, the model expects {expected:?}");
    ensure!(ctx, *machine == before, "G12", "{probe:?} while undrained changed the state");
    ensure!(ctx, *model == was, "model", "{probe:?} while undrained changed the model");
}

fn compare(
    ctx: Ctx<'_>,
    got: Result<(), SupervisionError>,
    expected: Result<Events, SupervisionError>,
) -> Result<Events, SupervisionError> {
    match (&got, &expected) {
        (Ok(()), Ok(_)) => {}
        (Err(g), Err(e)) => ensure!(ctx, g == e, "model", "refused with {g:?}, the model expects {e:?}"),
        _ => ensure!(ctx, false, "model", "the machine answered {got:?}, the model expects {expected:?}"),
    }
    expected
}

/// The configuration, the hint settings drawn from its seed, and the operations `data`
/// decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    let parsed = parse::<Config, Op>(data);
    let hints = parsed.as_ref().map(|(config, _)| HintsIn::from_seed(config.seed));
    format!("{parsed:#?}\nhint settings from the seed: {hints:#?}")
}
