//! The retry machine (R1–R6, B6, G2, G4, G7, G11, G12) against an exact reference model.
//!
//! [`RetryModel`] is also the retry inside the delivery model.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Action, Failure, FailureClass, FailureKind, Hint, Instant, LastFailure, Outcome, OutcomeKind, Retry, RetryError,
    RetryPolicy, RetryPolicyBuilder, RetryStatus, Stats,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::{BackoffIn, check_delay};
use super::{At, Clock, Count, Ctx, ErrorKind, Span, ensure, nanos_sat, parse, rng, verdict};

/// The settings of a retry policy, as the fuzzer draws them.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
pub(crate) struct RetryIn {
    backoff: BackoffIn,
    max_attempts: Option<Count>,
    max_retries: Option<Count>,
    total: Option<Span>,
    pub(crate) attempt_timeout: Option<Span>,
    max_hint: Option<Span>,
    restart_after_hint: bool,
}

impl RetryIn {
    fn reasons(&self) -> Vec<ErrorKind> {
        let mut reasons = Vec::new();
        match (self.max_attempts.map(Count::get), self.max_retries.map(Count::get)) {
            (Some(_), Some(_)) => reasons.push(ErrorKind::Conflict),
            (Some(0), None) => reasons.push(ErrorKind::Zero),
            (None, Some(u32::MAX)) => reasons.push(ErrorKind::LimitTooLarge),
            _ => {}
        }
        for span in [self.total, self.attempt_timeout, self.max_hint].into_iter().flatten() {
            if span.get().is_zero() {
                reasons.push(ErrorKind::Zero);
            }
        }
        reasons
    }

    /// Builds the policy (its backoff first) and checks both verdicts against the model's.
    pub(crate) fn build(&self) -> Option<RetryPolicy> {
        let backoff = self.backoff.build()?;
        let mut builder = RetryPolicy::builder(backoff).restart_after_hint(self.restart_after_hint);
        builder.max_attempts = self.max_attempts.map(Count::get);
        builder.max_retries = self.max_retries.map(Count::get);
        builder.total = self.total.map(Span::get);
        builder.attempt_timeout = self.attempt_timeout.map(Span::get);
        builder.max_hint = self.max_hint.map(Span::get);
        let policy = verdict("retry policy", builder.build(), &self.reasons())?;
        let limit = match (self.max_attempts, self.max_retries) {
            (Some(n), _) => Some(n.get()),
            (_, Some(n)) => Some(n.get() + 1),
            _ => None,
        };
        let ctx = super::SETUP;
        ensure!(
            ctx,
            policy.max_attempts() == limit,
            "R3",
            "max_attempts() is {:?}, given {limit:?}",
            policy.max_attempts()
        );
        let rebuilt = RetryPolicyBuilder::from(policy).build();
        ensure!(ctx, rebuilt == Ok(policy), "R3", "the policy does not rebuild to itself: {rebuilt:?}");
        Some(policy)
    }
}

/// A failure kind, as the fuzzer draws it.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KindIn {
    Retryable,
    Timeout,
    Panicked,
    Fatal,
    Canceled,
    After(Span),
    /// A hint at `now + span`.
    AtLater(Span),
    /// A hint at `now − span` (in the past: "now").
    AtEarlier(Span),
    DoNotRetry,
}

impl KindIn {
    pub(crate) fn get(self, now: Instant) -> FailureKind {
        match self {
            KindIn::Retryable => FailureKind::Retryable,
            KindIn::Timeout => FailureKind::Timeout,
            KindIn::Panicked => FailureKind::Panicked,
            KindIn::Fatal => FailureKind::Fatal,
            KindIn::Canceled => FailureKind::Canceled,
            KindIn::After(d) => FailureKind::Hinted(Hint::After(d.get())),
            KindIn::AtLater(d) => FailureKind::Hinted(Hint::At(now.saturating_add(d.get()))),
            KindIn::AtEarlier(d) => FailureKind::Hinted(Hint::At(now.saturating_sub(d.get()))),
            KindIn::DoNotRetry => FailureKind::Hinted(Hint::DoNotRetry),
        }
    }
}

/// An attempt number relative to the one the model runs: usually right, sometimes stale or
/// from the future.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptIn {
    Current,
    Current2,
    Current3,
    Previous,
    Next,
    Raw(u32),
}

impl AttemptIn {
    pub(crate) fn get(self, current: u32) -> u32 {
        match self {
            AttemptIn::Current | AttemptIn::Current2 | AttemptIn::Current3 => current,
            AttemptIn::Previous => current.wrapping_sub(1),
            AttemptIn::Next => current.wrapping_add(1),
            AttemptIn::Raw(n) => n,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Running { deadline: Option<Instant> },
    Sleeping { until: Instant },
    Finished(OutcomeKind),
}

/// What a [`Retry`] must be doing, restated from R1–R6 and B6.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RetryModel<E> {
    pub(crate) phase: Phase,
    pub(crate) attempt: u32,
    pub(crate) failures: u32,
    pub(crate) last_delay_ns: u64,
    pub(crate) first_start: Instant,
    pub(crate) last_now: Instant,
    pub(crate) slept_ns: u64,
    pub(crate) last_failure: Option<LastFailure<E>>,
}

impl<E: Clone> RetryModel<E> {
    pub(crate) fn new() -> Self {
        RetryModel {
            phase: Phase::Idle,
            attempt: 0,
            failures: 0,
            last_delay_ns: 0,
            first_start: Instant::ZERO,
            last_now: Instant::ZERO,
            slept_ns: 0,
            last_failure: None,
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            attempts: self.attempt,
            slept: Duration::from_nanos(self.slept_ns),
            elapsed: self.last_now.saturating_duration_since(self.first_start),
        }
    }

    pub(crate) fn status(&self) -> RetryStatus {
        match self.phase {
            Phase::Idle => RetryStatus::Idle,
            Phase::Running { deadline } => RetryStatus::Running { attempt: self.attempt, deadline },
            Phase::Sleeping { until } => RetryStatus::Sleeping { next_attempt: self.attempt.saturating_add(1), until },
            Phase::Finished(kind) => RetryStatus::Finished(kind),
        }
    }

    fn check_running(&self, attempt: u32) -> Result<(), RetryError> {
        match self.phase {
            Phase::Running { .. } if attempt == self.attempt => Ok(()),
            Phase::Running { .. } => Err(RetryError::StaleAttempt { running: self.attempt, got: attempt }),
            Phase::Sleeping { .. } => Err(RetryError::NoAttemptRunning),
            Phase::Idle => Err(RetryError::NotStarted),
            Phase::Finished(kind) => Err(RetryError::Finished(kind)),
        }
    }

    fn begin(&mut self, policy: &RetryPolicy, now: Instant) -> Action<E> {
        self.attempt = self.attempt.max(1);
        let deadline = policy.attempt_timeout().map(|t| now.saturating_add(t)).filter(|d| *d != Instant::MAX);
        self.phase = Phase::Running { deadline };
        Action::Start { attempt: self.attempt, deadline }
    }

    fn finish(&mut self, kind: OutcomeKind) -> Action<E> {
        self.phase = Phase::Finished(kind);
        let last = self.last_failure.take();
        let outcome = match kind {
            OutcomeKind::Succeeded => Outcome::Succeeded,
            OutcomeKind::Canceled => Outcome::Canceled { last_failure: last },
            kind => {
                let last_failure = last.expect("every other outcome follows a failure");
                match kind {
                    OutcomeKind::Exhausted => Outcome::Exhausted { last_failure },
                    OutcomeKind::Fatal => Outcome::Fatal { failure: last_failure },
                    OutcomeKind::OutOfTime => Outcome::OutOfTime { last_failure },
                    _ => Outcome::Rejected { last_failure },
                }
            }
        };
        Action::Finish { outcome, stats: self.stats() }
    }

    pub(crate) fn start(&mut self, policy: &RetryPolicy, now: Instant) -> Result<Vec<Action<E>>, RetryError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            _ => return Err(RetryError::AlreadyStarted),
        }
        self.first_start = now;
        self.last_now = now;
        Ok(vec![self.begin(policy, now)])
    }

    pub(crate) fn success(&mut self, now: Instant, attempt: u32) -> Result<Vec<Action<E>>, RetryError> {
        self.check_running(attempt)?;
        self.last_now = self.last_now.later(now);
        self.failures = 0;
        self.last_delay_ns = 0;
        self.last_failure = None;
        Ok(vec![self.finish(OutcomeKind::Succeeded)])
    }

    pub(crate) fn failure(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        attempt: u32,
        failure: Failure<E>,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Action<E>>, RetryError> {
        self.check_running(attempt)?;
        let now = self.last_now.later(now);
        self.last_now = now;
        Ok(self.decide(policy, now, failure.kind, Some(failure.error), false, rng))
    }

    pub(crate) fn timeout(&mut self, policy: &RetryPolicy, now: Instant, rng: &mut ChaCha8Rng) -> Vec<Action<E>> {
        let now = self.last_now.later(now);
        match self.phase {
            Phase::Running { deadline: Some(deadline) } if deadline <= now => {
                self.last_now = now;
                self.decide(policy, now, FailureKind::Timeout, None, true, rng)
            }
            Phase::Sleeping { until } if until <= now => {
                self.slept_ns = self.slept_ns.saturating_add(nanos_sat(now.saturating_duration_since(self.last_now)));
                self.last_now = now;
                self.attempt = self.attempt.saturating_add(1);
                vec![self.begin(policy, now)]
            }
            _ => Vec::new(),
        }
    }

    pub(crate) fn cancel(&mut self, now: Instant) -> Result<Vec<Action<E>>, RetryError> {
        let mut actions = match self.phase {
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Running { .. } => vec![Action::Abandon { attempt: self.attempt }],
            _ => Vec::new(),
        };
        self.last_now = self.last_now.later(now);
        actions.push(self.finish(OutcomeKind::Canceled));
        Ok(actions)
    }

    pub(crate) fn rejected(&mut self, now: Instant) -> Result<Vec<Action<E>>, RetryError> {
        match self.phase {
            Phase::Sleeping { .. } => {}
            Phase::Finished(kind) => return Err(RetryError::Finished(kind)),
            Phase::Idle => return Err(RetryError::NotStarted),
            Phase::Running { .. } => return Err(RetryError::NothingToReject),
        }
        self.last_now = self.last_now.later(now);
        Ok(vec![self.finish(OutcomeKind::Rejected)])
    }

    fn decide(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        abandon: bool,
        rng: &mut ChaCha8Rng,
    ) -> Vec<Action<E>> {
        let mut actions = Vec::new();
        if abandon {
            actions.push(Action::Abandon { attempt: self.attempt });
        }
        self.last_failure = Some(LastFailure { class: kind.class(), error });
        let limit = policy.max_attempts().unwrap_or(u32::MAX);
        let verdict = match kind {
            FailureKind::Fatal | FailureKind::Hinted(Hint::DoNotRetry) => Err(OutcomeKind::Fatal),
            FailureKind::Canceled => Err(OutcomeKind::Canceled),
            _ if self.attempt >= limit => Err(OutcomeKind::Exhausted),
            _ => self.schedule(policy, now, kind, rng),
        };
        match verdict {
            Ok(until) => {
                self.phase = Phase::Sleeping { until };
                actions.push(Action::Sleep {
                    next_attempt: self.attempt.saturating_add(1),
                    delay: until.saturating_duration_since(self.last_now),
                    until,
                });
            }
            Err(kind) => actions.push(self.finish(kind)),
        }
        actions
    }

    fn schedule(
        &mut self,
        policy: &RetryPolicy,
        now: Instant,
        kind: FailureKind,
        rng: &mut ChaCha8Rng,
    ) -> Result<Instant, OutcomeKind> {
        let budget_end = policy.total().map_or(Instant::MAX, |t| self.first_start.saturating_add(t));
        if now > budget_end {
            return Err(OutcomeKind::OutOfTime);
        }
        let hinted = match kind {
            FailureKind::Hinted(Hint::After(d)) => Some(nanos_sat(d)),
            FailureKind::Hinted(Hint::At(at)) => Some(nanos_sat(at.saturating_duration_since(now))),
            _ => None,
        };
        match hinted {
            Some(hinted) => {
                let delay = hinted.min(policy.max_hint().map_or(u64::MAX, nanos_sat));
                if policy.restarts_after_hint() {
                    self.failures = 0;
                    self.last_delay_ns = 0;
                } else {
                    self.failures = self.failures.saturating_add(1);
                    self.last_delay_ns = delay;
                }
                Ok(now.saturating_add(Duration::from_nanos(delay)).earlier(budget_end))
            }
            None => {
                self.failures = self.failures.saturating_add(1);
                let delay =
                    nanos_sat(policy.backoff().delay(self.failures, Duration::from_nanos(self.last_delay_ns), rng));
                self.last_delay_ns = delay;
                let until = now.saturating_add(Duration::from_nanos(delay));
                if until > budget_end { Err(OutcomeKind::OutOfTime) } else { Ok(until) }
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Config {
    policy: RetryIn,
    seed: u64,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Start(At),
    Success(At, AttemptIn),
    Failure(At, AttemptIn, KindIn, u8),
    Timeout(At),
    Timeout2(At),
    Cancel(At),
    Rejected(At),
}

/// What a scheduled delay must obey: the schedule for failure `n`, or a hint (in ns).
#[derive(Clone, Copy, Debug)]
enum DelayRule {
    None,
    Schedule { n: u32, previous_ns: u64 },
    Hint(u64),
}

/// What the guarantees need to remember across operations.
#[derive(Default)]
struct Seen {
    started: u32,
    finishes: u32,
    last_class: Option<FailureClass>,
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(policy) = config.policy.build() else { return };
    let mut rng = rng(config.seed);
    let mut machine = Retry::<u8>::new();
    let mut model = RetryModel::<u8>::new();
    let mut clock = Clock::default();
    let mut seen = Seen::default();
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let mut draws = rng.clone();
        let mut delay_rule = DelayRule::None;
        let (failures_before, previous_ns) = (model.failures, model.last_delay_ns);
        let schedule = DelayRule::Schedule { n: failures_before.saturating_add(1), previous_ns };
        let result: Result<Vec<Action<u8>>, RetryError> = match *op {
            Op::Start(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let expected = model.start(&policy, now);
                compare(ctx, machine.handle_start(&policy, now), expected)
            }
            Op::Success(at, attempt) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(model.attempt);
                let expected = model.success(now, attempt);
                compare(ctx, machine.handle_success(now, attempt), expected)
            }
            Op::Failure(at, attempt, kind, error) => {
                let now = clock.at(at, machine.poll_timeout());
                let attempt = attempt.get(model.attempt);
                let failure = Failure::new(kind.get(now), error);
                let expected = model.failure(&policy, now, attempt, failure, &mut draws);
                delay_rule = match failure.kind {
                    FailureKind::Hinted(Hint::After(d)) => DelayRule::Hint(nanos_sat(d)),
                    FailureKind::Hinted(Hint::At(t)) => {
                        DelayRule::Hint(nanos_sat(t.saturating_duration_since(model.last_now)))
                    }
                    _ => schedule,
                };
                let got = machine.handle_failure(&policy, now, attempt, failure, &mut rng);
                if let Err(refused) = &got {
                    ensure!(
                        ctx,
                        refused.failure == failure,
                        "G12",
                        "the refused failure came back as {:?}",
                        refused.failure
                    );
                }
                compare(ctx, got.map_err(|r| r.error), expected)
            }
            Op::Timeout(at) | Op::Timeout2(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let expected = model.timeout(&policy, now, &mut draws);
                delay_rule = schedule;
                machine.handle_timeout(&policy, now, &mut rng);
                if expected.is_empty() {
                    ensure!(ctx, machine == before, "R6", "an early or spurious handle_timeout changed the state");
                }
                Ok(expected)
            }
            Op::Cancel(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let expected = model.cancel(now);
                compare(ctx, machine.handle_cancel(now), expected)
            }
            Op::Rejected(at) => {
                let now = clock.at(at, machine.poll_timeout());
                let expected = model.rejected(now);
                compare(ctx, machine.handle_rejected(now), expected)
            }
        };
        let accepted = result.is_ok();
        if let Op::Failure(_, _, kind, _) = *op
            && accepted
        {
            seen.last_class = Some(kind.get(Instant::ZERO).class());
        }
        match result {
            Err(_) => ensure!(ctx, machine == before, "G12", "a refused input changed the state"),
            Ok(expected) => {
                let mut got = Vec::new();
                while let Some(action) = machine.poll_action() {
                    ensure!(ctx, got.len() < 4, "R6", "more than four actions after one input: {got:?}");
                    got.push(action);
                }
                for action in &got {
                    check_action(ctx, &policy, &model, &mut seen, action, delay_rule);
                }
                ensure!(ctx, got == expected, "model", "actions {got:?}, the model expects {expected:?}");
            }
        }
        check_state(ctx, &machine, &model);
    }
}

/// The machine's answer to an input against the model's: both accept, or both refuse alike.
fn compare(
    ctx: Ctx<'_>,
    got: Result<(), RetryError>,
    expected: Result<Vec<Action<u8>>, RetryError>,
) -> Result<Vec<Action<u8>>, RetryError> {
    match (&got, &expected) {
        (Ok(()), Ok(_)) => {}
        (Err(g), Err(e)) => ensure!(ctx, g == e, "model", "refused with {g:?}, the model expects {e:?}"),
        _ => ensure!(ctx, false, "model", "the machine answered {got:?}, the model expects {expected:?}"),
    }
    expected
}

/// The guarantees each action must meet, whatever the model says.
fn check_action(
    ctx: Ctx<'_>,
    policy: &RetryPolicy,
    model: &RetryModel<u8>,
    seen: &mut Seen,
    action: &Action<u8>,
    delay_rule: DelayRule,
) {
    let limit = policy.max_attempts().unwrap_or(u32::MAX);
    ensure!(ctx, seen.finishes == 0, "G11", "{action:?} after the operation finished");
    match *action {
        Action::Start { attempt, deadline } => {
            ensure!(ctx, attempt == seen.started + 1, "R1", "attempt {attempt} started after attempt {}", seen.started);
            ensure!(ctx, attempt <= limit, "G2", "attempt {attempt} started under a limit of {limit}");
            if let Some(class) = seen.last_class {
                ensure!(ctx, class.is_retryable(), "G4", "attempt {attempt} started after a {class:?} failure");
            }
            if let (Some(timeout), Some(deadline)) = (policy.attempt_timeout(), deadline) {
                let expected = model.last_now.saturating_add(timeout);
                ensure!(
                    ctx,
                    deadline == expected,
                    "R3",
                    "deadline {deadline:?}, start + attempt_timeout = {expected:?}"
                );
            }
            seen.started = attempt;
        }
        Action::Sleep { next_attempt, delay, until } => {
            ensure!(
                ctx,
                next_attempt == seen.started + 1 && next_attempt <= limit,
                "G2",
                "a retry before attempt {next_attempt} (limit {limit})"
            );
            let class = seen.last_class;
            ensure!(ctx, class.is_some_and(FailureClass::is_retryable), "G4", "a retry scheduled after {class:?}");
            let budget_end = policy.total().map(|total| model.first_start.saturating_add(total));
            if let Some(end) = budget_end {
                ensure!(ctx, until <= end, "G7", "a sleep until {until:?} ends past the total budget {end:?}");
            }
            let left = budget_end.map_or(u64::MAX, |end| nanos_sat(end.saturating_duration_since(model.last_now)));
            match delay_rule {
                // A delay cut by the end of representable time is not the schedule's.
                _ if until == Instant::MAX => {}
                DelayRule::Schedule { n, previous_ns } => {
                    check_delay(ctx, policy.backoff(), n, previous_ns, nanos_sat(delay));
                }
                DelayRule::Hint(hinted) => {
                    let expected = hinted.min(policy.max_hint().map_or(u64::MAX, nanos_sat)).min(left);
                    ensure!(ctx, nanos_sat(delay) == expected, "B6", "hinted delay {delay:?}, expected {expected} ns");
                }
                DelayRule::None => ensure!(ctx, false, "R6", "a sleep without a failure"),
            }
        }
        Action::Abandon { attempt } => {
            ensure!(ctx, attempt == seen.started, "R1", "abandon of attempt {attempt}, attempt {} runs", seen.started);
            if matches!(delay_rule, DelayRule::Schedule { .. }) {
                // Abandoned at its deadline: the machine's own timeout failure.
                seen.last_class = Some(FailureClass::Timeout);
            }
        }
        Action::Finish { ref outcome, stats } => {
            seen.finishes += 1;
            ensure!(
                ctx,
                stats.attempts == seen.started,
                "R5",
                "stats count {} attempts, {} started",
                stats.attempts,
                seen.started
            );
            let class = outcome.last_failure().map(|l| l.class);
            match outcome.kind() {
                OutcomeKind::Exhausted => {
                    ensure!(
                        ctx,
                        stats.attempts == limit,
                        "G2",
                        "exhausted after {} of {limit} attempts",
                        stats.attempts
                    )
                }
                OutcomeKind::Fatal => ensure!(
                    ctx,
                    matches!(class, Some(FailureClass::Fatal | FailureClass::DoNotRetry)),
                    "G4",
                    "a fatal outcome after {class:?}"
                ),
                _ => {}
            }
        }
    }
}

/// The machine's observable state against the model's, and `poll_timeout` against the status.
fn check_state(ctx: Ctx<'_>, machine: &Retry<u8>, model: &RetryModel<u8>) {
    let status = machine.status();
    let timeout = machine.poll_timeout();
    let consistent = match status {
        RetryStatus::Running { deadline, .. } => timeout == deadline,
        RetryStatus::Sleeping { until, .. } => timeout == Some(until),
        RetryStatus::Idle | RetryStatus::Finished(_) => timeout.is_none(),
    };
    ensure!(ctx, consistent, "R6", "poll_timeout {timeout:?} does not match the status {status:?}");
    ensure!(ctx, status == model.status(), "model", "status {status:?}, the model expects {:?}", model.status());
    ensure!(
        ctx,
        machine.attempt() == model.attempt,
        "R1",
        "attempt {}, the model expects {}",
        machine.attempt(),
        model.attempt
    );
    ensure!(
        ctx,
        machine.streak() == model.failures,
        "R4",
        "streak {}, the model expects {}",
        machine.streak(),
        model.failures
    );
    ensure!(
        ctx,
        machine.stats() == model.stats(),
        "R5",
        "stats {:?}, the model expects {:?}",
        machine.stats(),
        model.stats()
    );
    ensure!(
        ctx,
        machine.last_failure() == model.last_failure.as_ref(),
        "R5",
        "last failure {:?}, the model expects {:?}",
        machine.last_failure(),
        model.last_failure
    );
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}
