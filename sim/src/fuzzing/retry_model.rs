//! The retry machine (R1–R6, B6, G2, G4, G7, G11, G12) against the exact reference model
//! [`RetryModel`] (shared with the retry scenario family and the delivery model). Every input
//! that arrives while actions of an earlier one wait to be drained must be refused: the runner
//! checks that on every step by probing the machine between an input and the drain of its
//! actions.

use core::time::Duration;

use arbitrary::Arbitrary;
use persevere::{
    Failure, FailureClass, FailureKind, Hint, Instant, Outcome, PolicyError, Retry, RetryAction, RetryError,
    RetryPolicy, RetryPolicyBuilder, RetryStatus,
};
use rand_chacha::ChaCha8Rng;

use super::backoff_model::{BackoffIn, check_delay};
use super::{
    At, Clock, Count, Ctx, ErrorKind, SETUP, Span, compare, compare_returned, ensure, judge_probe, nanos, nanos_sat,
    parse, rng, verdict, violated,
};
pub(crate) use crate::model::retry::RetryModel;
use crate::model::retry::{hinted_ns, waits};

/// The settings of a retry policy, as the fuzzer draws them.
///
/// Whether the policy asks for `unbounded()` (R3: a policy without a limit must say so) has
/// no byte of its own, so that every input decodes as it did before the rule existed and the
/// committed corpus (this target's, the delivery target's, the state targets') keeps its
/// meaning: see [`asks_unbounded`](Self::asks_unbounded).
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
    /// Whether the settings give a limit (R3): an attempt or retry count, or a total budget
    /// that fits in `u64` nanoseconds (a longer one, such as `Duration::MAX`, is documented as
    /// "no limit").
    fn limited(&self) -> bool {
        self.max_attempts.is_some()
            || self.max_retries.is_some()
            || self.total.is_some_and(|t| nanos(t.get()).is_some_and(|n| n < u64::MAX))
    }

    /// Whether the drawn policy asks for `unbounded()`: when no limit at all was drawn (what
    /// "no limit" meant before R3, so such inputs still retry for ever), but not when its only
    /// bound is a total budget too long to be one, which must then be refused as
    /// [`PolicyError::Unbounded`]. (A limit together with `unbounded()`, a `Conflict`, is not
    /// drawn; the unit tests below feed it.)
    fn asks_unbounded(&self) -> bool {
        !self.limited() && self.total.is_none()
    }

    /// Every reason the model sees for `build()` to refuse these settings with `unbounded`
    /// (empty: valid), and whether one of them is R3's "no limit" ([`PolicyError::Unbounded`],
    /// which has no [`ErrorKind`]).
    fn reasons(&self, unbounded: bool) -> (Vec<ErrorKind>, bool) {
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
        if unbounded && self.limited() {
            reasons.push(ErrorKind::Conflict);
        }
        (reasons, !unbounded && !self.limited())
    }

    /// The settings as a builder.
    fn builder(&self, backoff: persevere::Backoff, unbounded: bool) -> RetryPolicyBuilder {
        let mut builder = RetryPolicy::builder(backoff).restart_after_hint(self.restart_after_hint);
        builder.max_attempts = self.max_attempts.map(Count::get);
        builder.max_retries = self.max_retries.map(Count::get);
        builder.total = self.total.map(Span::get);
        builder.attempt_timeout = self.attempt_timeout.map(Span::get);
        if let Some(max_hint) = self.max_hint {
            builder = builder.max_hint(max_hint.get());
        }
        builder.unbounded = unbounded;
        builder
    }

    /// Builds the policy (its backoff first) and checks both verdicts against the model's.
    pub(crate) fn build(&self) -> Option<RetryPolicy> {
        self.build_as(self.asks_unbounded())
    }

    /// [`build`](Self::build), asking for `unbounded()` or not.
    fn build_as(&self, unbounded: bool) -> Option<RetryPolicy> {
        let backoff = self.backoff.build()?;
        let ctx = SETUP;
        let defaults = RetryPolicy::builder(backoff);
        ensure!(
            ctx,
            defaults.max_hint == persevere::DEFAULT_MAX_HINT && !defaults.unbounded && !defaults.restart_after_hint,
            "B6",
            "builder defaults {defaults:?}"
        );
        let (reasons, no_limit) = self.reasons(unbounded);
        let built = self.builder(backoff, unbounded).build();
        if let Err(PolicyError::Unbounded) = built {
            ensure!(ctx, no_limit, "R3", "refused as unbounded, but the settings have a limit: {self:?}");
            return None;
        }
        if built.is_ok() {
            ensure!(ctx, !no_limit, "R3", "a policy with no limit at all built without unbounded(): {self:?}");
        } else if reasons.is_empty() {
            ensure!(ctx, !no_limit, "R3", "{built:?}: the model expects PolicyError::Unbounded");
        }
        let policy = verdict("retry policy", built, &reasons)?;
        let limit = match (self.max_attempts, self.max_retries) {
            (Some(n), _) => Some(n.get()),
            (_, Some(n)) => Some(n.get() + 1),
            _ => None,
        };
        ensure!(
            ctx,
            policy.max_attempts() == limit,
            "R3",
            "max_attempts() is {:?}, given {limit:?}",
            policy.max_attempts()
        );
        let max_hint = self.max_hint.map_or(persevere::DEFAULT_MAX_HINT, Span::get);
        let expected_hint = if nanos(max_hint).is_some_and(|n| n < u64::MAX) { max_hint } else { Duration::MAX };
        ensure!(
            ctx,
            policy.max_hint() == expected_hint,
            "B6",
            "max_hint() is {:?}, given {max_hint:?}",
            policy.max_hint()
        );
        ensure!(
            ctx,
            policy.is_unbounded() == unbounded,
            "R3",
            "is_unbounded() is {}, given {unbounded}",
            policy.is_unbounded()
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
    Throttled,
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
            KindIn::Throttled => FailureKind::Throttled,
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
    /// Any number (a `u32`, as before attempt numbers were `u64`, so that inputs keep their
    /// meaning).
    Raw(u32),
}

impl AttemptIn {
    pub(crate) fn get(self, current: u64) -> u64 {
        match self {
            AttemptIn::Current | AttemptIn::Current2 | AttemptIn::Current3 => current,
            AttemptIn::Previous => current.wrapping_sub(1),
            AttemptIn::Next => current.wrapping_add(1),
            AttemptIn::Raw(n) => u64::from(n),
        }
    }
}

/// The policy's `max_hint` in nanoseconds (`u64::MAX`: any hint).
fn max_hint_ns(policy: &RetryPolicy) -> u64 {
    nanos_sat(policy.max_hint())
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

/// What a scheduled delay must obey: the schedule at place `n`, or a hint (in ns).
#[derive(Clone, Copy, Debug)]
enum DelayRule {
    None,
    Schedule { n: u32, previous_ns: u64 },
    Hint(u64),
}

/// What the guarantees need to remember across operations.
#[derive(Default)]
struct Seen {
    started: u64,
    finishes: u32,
    last_class: Option<FailureClass>,
}

/// An input fed while the actions of the previous one wait to be drained (the drain rule).
#[derive(Clone, Copy, Debug)]
enum Probe {
    Timeout,
    Success,
    Failure,
    Cancel,
    Rejected,
    Start,
}

const PROBES: [Probe; 6] =
    [Probe::Timeout, Probe::Success, Probe::Failure, Probe::Cancel, Probe::Rejected, Probe::Start];

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    let Some(policy) = config.policy.build() else { return };
    let mut rng = rng(config.seed);
    let mut machine = Retry::<u8>::new();
    let mut model = RetryModel::<u8>::new();
    let mut clock = Clock::default();
    let mut seen = Seen::default();
    let mut probes = 0usize;
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        let before = machine;
        let mut delay_rule = DelayRule::None;
        let schedule =
            DelayRule::Schedule { n: model.schedule.place.saturating_add(1), previous_ns: model.schedule.previous_ns };
        let result: Result<Vec<RetryAction<u8>>, RetryError> = match *op {
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
                delay_rule = match hinted_ns(failure.kind, model.last_now.later(now)) {
                    Some(hinted) => DelayRule::Hint(hinted),
                    None => schedule,
                };
                let got = machine.handle_failure(&policy, now, attempt, failure, &mut rng);
                let expected = model.failure(&policy, now, attempt, failure, waits(&machine));
                compare_returned(ctx, got, &failure, expected)
            }
            Op::Timeout(at) | Op::Timeout2(at) => {
                let now = clock.at(at, machine.poll_timeout());
                machine.handle_timeout(&policy, now, &mut rng);
                let expected = model.timeout(&policy, now, waits(&machine));
                delay_rule = schedule;
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
        if let Op::Failure(_, _, kind, _) = *op
            && result.is_ok()
        {
            seen.last_class = Some(kind.get(Instant::ZERO).class());
        }
        match result {
            Err(_) => ensure!(ctx, machine == before, "G12", "a refused input changed the state"),
            Ok(expected) => {
                ensure!(
                    ctx,
                    machine.has_actions() != expected.is_empty(),
                    "drain",
                    "has_actions() is {} with {expected:?} to drain",
                    machine.has_actions()
                );
                // Drained one action at a time; before each, an input is refused and changes
                // nothing (the drain rule).
                model.undrained = true;
                let mut got = Vec::new();
                for want in &expected {
                    probe(ctx, PROBES[probes % PROBES.len()], &policy, &mut machine, &mut model, &mut clock, &mut rng);
                    probes += 1;
                    let action = machine.poll_action();
                    // The guarantees first, on what the machine did (a delay out of its
                    // schedule's bounds is B3, not a mere difference from the model).
                    if let Some(action) = &action {
                        check_action(ctx, &policy, &model, &mut seen, action, delay_rule);
                    }
                    ensure!(
                        ctx,
                        action.as_ref() == Some(want),
                        "model",
                        "action {action:?}, the model expects {want:?}"
                    );
                    got.push(*want);
                }
                model.undrained = false;
                let extra = machine.poll_action();
                ensure!(ctx, extra.is_none(), "model", "action {extra:?} after {got:?}, the model expects none");
                ensure!(ctx, !machine.has_actions(), "drain", "has_actions() after the drain");
            }
        }
        check_state(ctx, &machine, &model);
    }
}

/// While actions wait to be drained, feeds `probe` and checks that the machine answers what
/// the model does (its validity error, else `Undrained`; a timeout does nothing) and that
/// neither changes.
fn probe(
    ctx: Ctx<'_>,
    probe: Probe,
    policy: &RetryPolicy,
    machine: &mut Retry<u8>,
    model: &mut RetryModel<u8>,
    clock: &mut Clock,
    rng: &mut ChaCha8Rng,
) {
    let (before, was) = (*machine, model.clone());
    let now = match probe {
        Probe::Timeout => Instant::MAX,
        _ => clock.now,
    };
    let attempt = model.attempt;
    let (got, expected) = match probe {
        Probe::Timeout => {
            machine.handle_timeout(policy, now, rng);
            let expected = model.timeout(policy, now, waits(machine));
            ensure!(ctx, expected.is_empty(), "drain", "the model acts on a timeout while undrained: {expected:?}");
            (Ok(()), Ok(expected))
        }
        Probe::Success => (machine.handle_success(now, attempt), model.success(now, attempt)),
        Probe::Failure => {
            let failure = Failure::retryable(9);
            let got = machine.handle_failure(policy, now, attempt, failure, rng);
            if let Err(refused) = &got {
                ensure!(ctx, refused.input == failure, "G12", "the refused failure came back as {:?}", refused.input);
            }
            (got.map_err(|r| r.error), model.failure(policy, now, attempt, failure, waits(machine)))
        }
        Probe::Cancel => (machine.handle_cancel(now), model.cancel(now)),
        Probe::Rejected => (machine.handle_rejected(now), model.rejected(now)),
        Probe::Start => (machine.handle_start(policy, now), model.start(policy, now)),
    };
    judge_probe(ctx, probe, got, expected, (*machine == before, *model == was));
}

/// The guarantees each action must meet, whatever the model says.
fn check_action(
    ctx: Ctx<'_>,
    policy: &RetryPolicy,
    model: &RetryModel<u8>,
    seen: &mut Seen,
    action: &RetryAction<u8>,
    delay_rule: DelayRule,
) {
    let limit = policy.max_attempts().map_or(u64::MAX, u64::from);
    let budget_end = policy.total().map(|total| model.first_start.saturating_add(total));
    let max_hint = max_hint_ns(policy);
    ensure!(ctx, seen.finishes == 0, "G11", "{action:?} after the operation finished");
    match *action {
        RetryAction::Start { attempt, deadline } => {
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
        RetryAction::Sleep { next_attempt, delay, until } => {
            ensure!(
                ctx,
                next_attempt == seen.started + 1 && next_attempt <= limit,
                "G2",
                "a retry before attempt {next_attempt} (limit {limit})"
            );
            let class = seen.last_class;
            ensure!(ctx, class.is_some_and(FailureClass::is_retryable), "G4", "a retry scheduled after {class:?}");
            ensure!(ctx, until == model.last_now.saturating_add(delay), "R6", "a sleep of {delay:?} ends at {until:?}");
            if let Some(end) = budget_end {
                ensure!(ctx, until <= end, "G7", "a sleep until {until:?} ends past the total budget {end:?}");
            }
            match delay_rule {
                // A delay cut by the end of representable time is neither the hint's nor the
                // schedule's.
                _ if until == Instant::MAX => {}
                DelayRule::Hint(hinted) => {
                    // B6: waited in full, and only when within max_hint (and the budget).
                    ensure!(
                        ctx,
                        nanos_sat(delay) == hinted,
                        "B6",
                        "hinted delay {delay:?}, the hint asked {hinted} ns"
                    );
                    ensure!(ctx, hinted <= max_hint, "B6", "a hint of {hinted} ns waited past max_hint {max_hint} ns");
                }
                DelayRule::Schedule { n, previous_ns } => {
                    check_delay(ctx, policy.backoff(), n, previous_ns, nanos_sat(delay));
                }
                DelayRule::None => ensure!(ctx, false, "R6", "a sleep without a failure"),
            }
        }
        RetryAction::Abandon { attempt } => {
            ensure!(ctx, attempt == seen.started, "R1", "abandon of attempt {attempt}, attempt {} runs", seen.started);
            if matches!(delay_rule, DelayRule::Schedule { .. }) {
                // Abandoned at its deadline: the machine's own timeout failure.
                seen.last_class = Some(FailureClass::Timeout);
            }
        }
        RetryAction::Finish { ref outcome, stats } => {
            seen.finishes += 1;
            ensure!(
                ctx,
                stats.attempts == seen.started,
                "R5",
                "stats count {} attempts, {} started",
                stats.attempts,
                seen.started
            );
            let elapsed = model.last_now.saturating_duration_since(model.first_start);
            ensure!(ctx, stats.elapsed == Some(elapsed), "R5", "elapsed {:?}, expected {elapsed:?}", stats.elapsed);
            let class = outcome.last_failure().map(|l| l.class);
            match *outcome {
                Outcome::Exhausted { .. } => {
                    ensure!(
                        ctx,
                        stats.attempts == limit,
                        "G2",
                        "exhausted after {} of {limit} attempts",
                        stats.attempts
                    )
                }
                Outcome::Fatal { .. } => ensure!(
                    ctx,
                    matches!(class, Some(FailureClass::Fatal | FailureClass::DoNotRetry)),
                    "G4",
                    "a fatal outcome after {class:?}"
                ),
                Outcome::Deferred { retry_at, .. } => {
                    // B6: the limit first (a failure of the last attempt exhausts), then a
                    // hint past max_hint or past the budget defers to the hinted instant.
                    ensure!(
                        ctx,
                        stats.attempts < limit,
                        "G2",
                        "deferred by the last allowed attempt {}",
                        stats.attempts
                    );
                    let hinted = match delay_rule {
                        DelayRule::Hint(hinted) => hinted,
                        _ => violated(ctx, "B6", format_args!("deferred without a hint ({class:?})")),
                    };
                    let (expected, defers) = crate::model::hint::hinted(
                        model.last_now,
                        Duration::from_nanos(hinted),
                        policy.max_hint(),
                        budget_end.unwrap_or(Instant::MAX),
                    );
                    ensure!(ctx, retry_at == expected, "B6", "deferred to {retry_at:?}, the hint asked {expected:?}");
                    ensure!(
                        ctx,
                        defers,
                        "B6",
                        "a hint of {hinted} ns within max_hint and the budget ended the operation"
                    );
                }
                Outcome::OutOfTime { .. } => {
                    ensure!(ctx, budget_end.is_some(), "G7", "out of time without a total budget");
                    ensure!(
                        ctx,
                        matches!(delay_rule, DelayRule::Schedule { .. }),
                        "B6",
                        "a hinted failure ended out of time, not deferred"
                    );
                }
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
        machine.now() == model.last_now,
        "R6",
        "now {:?}, the model expects {:?}",
        machine.now(),
        model.last_now
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

#[cfg(test)]
mod tests {
    use super::*;

    fn input(max_attempts: Option<Count>, total: Option<Span>) -> RetryIn {
        let bytes = [0u8; 64];
        let backoff = BackoffIn::arbitrary(&mut arbitrary::Unstructured::new(&bytes)).expect("zeros decode");
        RetryIn {
            backoff,
            max_attempts,
            max_retries: None,
            total,
            attempt_timeout: None,
            max_hint: None,
            restart_after_hint: false,
        }
    }

    #[test]
    fn r3_a_policy_without_a_limit_is_refused_unless_unbounded() {
        assert_eq!(input(None, None).reasons(false), (vec![], true));
        assert_eq!(input(None, Some(Span::Max)).reasons(false), (vec![], true), "Duration::MAX is no limit");
        assert_eq!(input(None, Some(Span::HugeSecs(u64::MAX))).reasons(false), (vec![], true));
        assert_eq!(input(None, None).reasons(true), (vec![], false));
        assert_eq!(input(Some(Count::Small(3)), None).reasons(true), (vec![ErrorKind::Conflict], false));
        assert_eq!(input(None, Some(Span::Secs(3))).reasons(true), (vec![ErrorKind::Conflict], false));
        assert_eq!(input(None, Some(Span::Secs(3))).reasons(false), (vec![], false));
    }

    #[test]
    fn r3_the_builder_agrees_with_the_model_on_every_limit_and_unbounded() {
        // `build_as` panics if the builder and the model disagree.
        for (attempts, total) in [
            (None, None),
            (Some(Count::Small(3)), None),
            (None, Some(Span::Secs(1))),
            (None, Some(Span::Max)),
            (Some(Count::Small(3)), Some(Span::Max)),
        ] {
            let limited = attempts.is_some() || total == Some(Span::Secs(1));
            for unbounded in [false, true] {
                let built = input(attempts, total).build_as(unbounded);
                assert_eq!(built.is_some(), unbounded != limited, "{attempts:?} {total:?} unbounded {unbounded}");
            }
        }
    }

    #[test]
    fn r3_a_drawn_policy_asks_for_unbounded_only_when_it_has_no_limit_at_all() {
        // No limit drawn: unbounded, as "no limit" meant before R3 (the corpus keeps its meaning).
        assert!(input(None, None).asks_unbounded());
        assert!(input(None, None).build().is_some_and(|p| p.is_unbounded()));
        // A budget too long to be a limit: not unbounded, so refused (R3).
        assert!(!input(None, Some(Span::Max)).asks_unbounded());
        assert!(input(None, Some(Span::Max)).build().is_none());
        assert!(!input(Some(Count::Small(2)), None).asks_unbounded());
        assert!(input(Some(Count::Small(2)), None).build().is_some_and(|p| !p.is_unbounded()));
    }
}
