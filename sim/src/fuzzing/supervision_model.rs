//! The supervision machine (S1–S6, G12) against an exact reference model, plus an independent
//! check of the event grammar of S6 and the spacing of S5.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Backoff, Failure, FailureClass, FailureKind, Hint, Instant, LastFailure, Restart, Setting, Supervision,
    SupervisionError, SupervisionPolicy, SupervisionPolicyBuilder, TaskDefaults, TaskEvent, TaskOutcome,
    TaskOutcomeKind, TaskStatus,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::BackoffIn;
use super::retry_model::{AttemptIn, KindIn};
use super::{At, Clock, Count, Ctx, ErrorKind, SETUP, Span, ensure, nanos_sat, parse, rng, verdict};

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

fn resolve<T>(setting: Setting<T>, default: Option<T>) -> Option<T> {
    match setting {
        Setting::Inherit => default,
        Setting::Off => None,
        Setting::Set(value) => Some(value),
    }
}

/// Builds the defaults and the task's policy, checking every verdict against the model's and
/// the resolved settings against S1.
fn build(defaults: &DefaultsIn, task: &TaskIn) -> Option<SupervisionPolicy> {
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
            d
        }
        DefaultsIn::Custom { restart, backoff, attempt_timeout, max_retries, min_spacing } => TaskDefaults {
            restart: restart.get(),
            backoff: backoff.build()?,
            attempt_timeout: attempt_timeout.map(Span::get),
            max_retries: max_retries.map(Count::get),
            min_spacing: min_spacing.get(),
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
    };
    let max_retries = resolve(builder.max_retries, defaults.max_retries);
    let attempt_timeout = resolve(builder.attempt_timeout, defaults.attempt_timeout);
    let mut reasons = Vec::new();
    if max_retries == Some(0) || attempt_timeout.is_some_and(|t| t.is_zero()) {
        reasons.push(ErrorKind::Zero);
    }
    let policy = verdict("supervision policy", builder.build(&defaults), &reasons)?;
    let restart = resolve(builder.restart, Some(defaults.restart)).unwrap_or(Restart::Once);
    ensure!(SETUP, policy.restart() == restart, "S1", "restart {:?}, resolved {restart:?}", policy.restart());
    let timeout = attempt_timeout.filter(|t| nanos_sat(*t) != u64::MAX);
    ensure!(
        SETUP,
        policy.attempt_timeout() == timeout,
        "S1",
        "timeout {:?}, resolved {timeout:?}",
        policy.attempt_timeout()
    );
    ensure!(
        SETUP,
        policy.max_retries() == max_retries,
        "S1",
        "max_retries {:?}, resolved {max_retries:?}",
        policy.max_retries()
    );
    let spacing = Duration::from_nanos(resolve(builder.min_spacing, Some(defaults.min_spacing)).map_or(0, nanos_sat));
    ensure!(
        SETUP,
        policy.min_spacing() == spacing,
        "S1",
        "min_spacing {:?}, resolved {spacing:?}",
        policy.min_spacing()
    );
    let backoff = match resolve(builder.backoff, Some(defaults.backoff)) {
        Some(b) => b,
        None => Backoff::constant(Duration::ZERO).build().ok()?,
    };
    ensure!(SETUP, *policy.backoff() == backoff, "S1", "backoff {:?}, resolved {backoff:?}", policy.backoff());
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

/// What a [`Supervision`] must be doing, restated from S1–S6.
#[derive(Clone, Debug)]
struct Model {
    phase: Phase,
    attempt: u64,
    failures: u32,
    streak: u32,
    last_delay_ns: u64,
    last_start: Instant,
    last_now: Instant,
    last_failure: Option<LastFailure<u8>>,
}

type Events = Vec<TaskEvent<u8>>;

impl Model {
    fn new() -> Self {
        Model {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            streak: 0,
            last_delay_ns: 0,
            last_start: Instant::ZERO,
            last_now: Instant::ZERO,
            last_failure: None,
        }
    }

    fn status(&self) -> TaskStatus {
        match self.phase {
            Phase::Idle => TaskStatus::Idle,
            Phase::Running { deadline } => TaskStatus::Running { attempt: self.attempt, deadline },
            Phase::Abandoning => TaskStatus::Abandoning { attempt: self.attempt },
            Phase::Waiting { until } => TaskStatus::Waiting { next_attempt: self.attempt.saturating_add(1), until },
            Phase::Finished(kind) => TaskStatus::Finished(kind),
        }
    }

    fn check_running(&self, attempt: u64) -> Result<(), SupervisionError> {
        match self.phase {
            Phase::Running { .. } if attempt == self.attempt => Ok(()),
            Phase::Running { .. } => Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt }),
            Phase::Abandoning | Phase::Waiting { .. } => Err(SupervisionError::NoAttemptRunning),
            Phase::Idle => Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => Err(SupervisionError::Finished(kind)),
        }
    }

    fn begin(&mut self, policy: &SupervisionPolicy, now: Instant) -> TaskEvent<u8> {
        self.attempt = self.attempt.max(1);
        self.last_start = now;
        let deadline = policy.attempt_timeout().map(|t| now.saturating_add(t)).filter(|d| *d != Instant::MAX);
        self.phase = Phase::Running { deadline };
        TaskEvent::AttemptStarting { attempt: self.attempt, deadline }
    }

    fn finish(&mut self, kind: TaskOutcomeKind) -> TaskEvent<u8> {
        self.phase = Phase::Finished(kind);
        let last = self.last_failure.take();
        let outcome = match kind {
            TaskOutcomeKind::Completed => TaskOutcome::Completed,
            TaskOutcomeKind::TimedOut => TaskOutcome::TimedOut,
            TaskOutcomeKind::Canceled => TaskOutcome::Canceled { last_failure: last },
            TaskOutcomeKind::Panicked => TaskOutcome::Panicked { error: last.and_then(|l| l.error).unwrap_or(0) },
            TaskOutcomeKind::Fatal => TaskOutcome::Fatal { failure: last.expect("a fatal failure is stored") },
            _ => TaskOutcome::Failed { last_failure: last.expect("a failure is stored") },
        };
        TaskEvent::TaskFinished { outcome, attempts: self.attempt }
    }

    fn wait(&mut self, policy: &SupervisionPolicy, now: Instant, delay_ns: u64) -> TaskEvent<u8> {
        let until = now
            .saturating_add(Duration::from_nanos(delay_ns))
            .later(self.last_start.saturating_add(policy.min_spacing()));
        self.phase = Phase::Waiting { until };
        TaskEvent::BackoffScheduled {
            next_attempt: self.attempt.saturating_add(1),
            delay: until.saturating_duration_since(self.last_now),
            until,
        }
    }

    fn retry_or_finish(
        &mut self,
        policy: &SupervisionPolicy,
        now: Instant,
        hinted: Option<u64>,
        not_retried: TaskOutcomeKind,
        rng: &mut ChaCha8Rng,
    ) -> TaskEvent<u8> {
        self.failures = self.failures.saturating_add(1);
        let limit_reached = policy.max_retries().is_some_and(|max| self.failures > max);
        if policy.restart() == Restart::Once || limit_reached {
            return self.finish(not_retried);
        }
        self.streak = self.streak.saturating_add(1);
        let delay = match hinted {
            Some(hinted) => hinted,
            None => nanos_sat(policy.backoff().delay(self.streak, Duration::from_nanos(self.last_delay_ns), rng)),
        };
        self.last_delay_ns = delay;
        self.wait(policy, now, delay)
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
        self.streak = 0;
        self.last_delay_ns = 0;
        self.last_failure = None;
        let ended = TaskEvent::AttemptSucceeded { attempt };
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
        rng: &mut ChaCha8Rng,
    ) -> Result<Events, SupervisionError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        let class = failure.kind.class();
        self.last_failure = Some(LastFailure { class, error: Some(failure.error) });
        // A cancel reported by the task ends its attempt as canceled (S6).
        let ended = match failure.kind {
            FailureKind::Canceled => TaskEvent::AttemptCanceled { attempt },
            _ => TaskEvent::AttemptFailed { attempt, class },
        };
        let next = match failure.kind {
            FailureKind::Canceled => self.finish(TaskOutcomeKind::Canceled),
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => self.finish(TaskOutcomeKind::Fatal),
            kind => {
                let hinted = match kind {
                    FailureKind::Hinted(Hint::After(d)) => Some(nanos_sat(d)),
                    FailureKind::Hinted(Hint::At(at)) => Some(nanos_sat(at.saturating_duration_since(now))),
                    _ => None,
                };
                self.retry_or_finish(policy, now, hinted, TaskOutcomeKind::Failed, rng)
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
        rng: &mut ChaCha8Rng,
    ) -> Result<Events, SupervisionError> {
        match self.phase {
            Phase::Abandoning if attempt == self.attempt => {}
            Phase::Abandoning => return Err(SupervisionError::StaleAttempt { current: self.attempt, got: attempt }),
            Phase::Idle => return Err(SupervisionError::NotStarted),
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            Phase::Running { .. } | Phase::Waiting { .. } => return Err(SupervisionError::NothingAbandoned),
        }
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(vec![match panic {
            Some(error) => {
                self.last_failure = Some(LastFailure { class: FailureClass::Panicked, error: Some(error) });
                self.finish(TaskOutcomeKind::Panicked)
            }
            None => self.retry_or_finish(policy, now, None, TaskOutcomeKind::TimedOut, rng),
        }])
    }

    fn timeout(&mut self, policy: &SupervisionPolicy, now: Instant) -> Events {
        let now = self.last_now.later(now);
        match self.phase {
            Phase::Running { deadline: Some(deadline) } if deadline <= now => {
                self.last_now = now;
                self.phase = Phase::Abandoning;
                self.last_failure = Some(LastFailure { class: FailureClass::Timeout, error: None });
                vec![TaskEvent::AttemptTimedOut { attempt: self.attempt }]
            }
            Phase::Waiting { until } if until <= now => {
                self.last_now = now;
                self.attempt = self.attempt.saturating_add(1);
                vec![self.begin(policy, now)]
            }
            _ => Vec::new(),
        }
    }

    fn cancel(&mut self, now: Instant) -> Result<Events, SupervisionError> {
        let mut events = match self.phase {
            Phase::Finished(kind) => return Err(SupervisionError::Finished(kind)),
            Phase::Running { .. } => vec![TaskEvent::AttemptCanceled { attempt: self.attempt }],
            _ => Vec::new(),
        };
        self.last_now = self.last_now.later(now);
        events.push(self.finish(TaskOutcomeKind::Canceled));
        Ok(events)
    }
}

/// S5, S6: the event stream's grammar, checked without the model.
#[derive(Default)]
struct Grammar {
    started: u64,
    open: Option<u64>,
    ended: Option<u64>,
    scheduled: Option<u64>,
    finished: bool,
    last_start: Option<Instant>,
    streak: u64,
}

impl Grammar {
    fn event(&mut self, ctx: Ctx<'_>, policy: &SupervisionPolicy, now: Instant, event: &TaskEvent<u8>) {
        ensure!(ctx, !self.finished, "S6", "{event:?} after TaskFinished");
        match *event {
            TaskEvent::AttemptStarting { attempt, .. } => {
                ensure!(ctx, self.open.is_none(), "S6", "attempt {attempt} starts while {:?} has not ended", self.open);
                ensure!(
                    ctx,
                    attempt == self.started + 1,
                    "S6",
                    "attempt {attempt} starts after attempt {}",
                    self.started
                );
                if attempt > 1 {
                    ensure!(
                        ctx,
                        self.scheduled == Some(attempt),
                        "S6",
                        "attempt {attempt} starts without BackoffScheduled"
                    );
                }
                if let Some(previous) = self.last_start {
                    let earliest = previous.saturating_add(policy.min_spacing());
                    ensure!(
                        ctx,
                        now >= earliest,
                        "S5",
                        "attempt {attempt} starts at {now:?}, before {earliest:?} (min_spacing)"
                    );
                }
                self.last_start = Some(now);
                self.started = attempt;
                self.open = Some(attempt);
                self.ended = None;
                self.scheduled = None;
            }
            TaskEvent::AttemptSucceeded { attempt }
            | TaskEvent::AttemptFailed { attempt, .. }
            | TaskEvent::AttemptTimedOut { attempt }
            | TaskEvent::AttemptCanceled { attempt } => {
                ensure!(ctx, self.open == Some(attempt), "S6", "{event:?} but the open attempt is {:?}", self.open);
                self.open = None;
                self.ended = Some(attempt);
                match event {
                    TaskEvent::AttemptSucceeded { .. } => self.streak = 0,
                    TaskEvent::AttemptFailed { class, .. } if class.is_retryable() => self.streak += 1,
                    TaskEvent::AttemptTimedOut { .. } => self.streak += 1,
                    _ => {}
                }
            }
            TaskEvent::BackoffScheduled { next_attempt, until, .. } => {
                ensure!(ctx, self.open.is_none(), "S6", "BackoffScheduled while attempt {:?} runs", self.open);
                ensure!(
                    ctx,
                    self.ended == Some(self.started),
                    "S6",
                    "BackoffScheduled before attempt {} ended",
                    self.started
                );
                ensure!(ctx, self.scheduled.is_none(), "S6", "a second BackoffScheduled");
                ensure!(
                    ctx,
                    next_attempt == self.started + 1,
                    "S6",
                    "BackoffScheduled for {next_attempt} after {}",
                    self.started
                );
                if let Some(max) = policy.max_retries() {
                    ensure!(
                        ctx,
                        self.streak <= u64::from(max),
                        "S3",
                        "a retry after {} failures in a row (max_retries {max})",
                        self.streak
                    );
                }
                ensure!(ctx, policy.restart() != Restart::Once, "S1", "a `once` task schedules attempt {next_attempt}");
                if let Some(start) = self.last_start {
                    let earliest = start.saturating_add(policy.min_spacing());
                    ensure!(
                        ctx,
                        until >= earliest,
                        "S5",
                        "attempt {next_attempt} scheduled at {until:?}, before {earliest:?}"
                    );
                }
                self.scheduled = Some(next_attempt);
            }
            TaskEvent::TaskFinished { attempts, .. } => {
                ensure!(ctx, self.open.is_none(), "S6", "TaskFinished while attempt {:?} runs", self.open);
                ensure!(
                    ctx,
                    attempts == self.started,
                    "S6",
                    "TaskFinished counts {attempts} attempts, {} started",
                    self.started
                );
                self.finished = true;
            }
        }
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

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(policy) = build(&config.defaults, &config.task) else { return };
    let mut rng = rng(config.seed);
    let mut machine = Supervision::<u8>::new();
    let mut model = Model::new();
    let mut clock = Clock::default();
    let mut grammar = Grammar::default();
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let mut draws = rng.clone();
        let current = u32::try_from(model.attempt).unwrap_or(u32::MAX);
        let result: Result<Events, SupervisionError> = match *op {
            Op::Start(at) => {
                let now = clock.at(at, machine.poll_timeout());
                compare(ctx, machine.handle_start(&policy, now), model.start(&policy, now))
            }
            Op::Success(at, attempt) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = u64::from(attempt.get(current));
                compare(ctx, machine.handle_success(&policy, now, attempt), model.success(&policy, now, attempt))
            }
            Op::Failure(at, attempt, kind, error) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = u64::from(attempt.get(current));
                let failure = Failure::new(kind.get(now), error);
                let expected = model.failure(&policy, now, attempt, failure, &mut draws);
                let got = machine.handle_failure(&policy, now, attempt, failure, &mut rng);
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
                let attempt = u64::from(attempt.get(current));
                let expected = model.abandoned(&policy, now, attempt, panic, &mut draws);
                let got = machine.handle_abandoned(&policy, now, attempt, panic, &mut rng);
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
                let mut got = Vec::new();
                while let Some(event) = machine.poll_action() {
                    ensure!(ctx, got.len() < 4, "S6", "more than four events after one input: {got:?}");
                    grammar.event(ctx, &policy, model.last_now, &event);
                    got.push(event);
                }
                ensure!(ctx, got == expected, "model", "events {got:?}, the model expects {expected:?}");
            }
        }
        let status = machine.status();
        let timeout = machine.poll_timeout();
        let consistent = match status {
            TaskStatus::Running { deadline, .. } => timeout == deadline,
            TaskStatus::Waiting { until, .. } => timeout == Some(until),
            _ => timeout.is_none(),
        };
        ensure!(ctx, consistent, "S6", "poll_timeout {timeout:?} does not match the status {status:?}");
        ensure!(ctx, status == model.status(), "model", "status {status:?}, the model expects {:?}", model.status());
        ensure!(
            ctx,
            machine.failures() == model.failures,
            "S3",
            "{} failures, the model counts {}",
            machine.failures(),
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
            machine.last_failure() == model.last_failure.as_ref(),
            "S4",
            "last failure {:?}, the model expects {:?}",
            machine.last_failure(),
            model.last_failure
        );
    }
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

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
