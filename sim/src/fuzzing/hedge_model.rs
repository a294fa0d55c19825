//! The hedging machine against a reference written from rules X1–X5 (`docs/RULES.md`): after every
//! input, the machine's drained outputs must be exactly the model's, a refused input must leave the
//! machine as it was (G12), and the run ends with exactly one outcome.

use core::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use persevere::{Failure, FailureClass, Hedge, HedgeAction, HedgePolicy, HedgeStats, Instant, OutcomeKind};

use super::{Ctx, MAX_OPS, SETUP, ensure};

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Config {
    max_attempts: u8,
    delay_ms: u16,
    next_on_failure: bool,
    max_hint_ms: u16,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// The clock moves by this many ms (backwards for a negative value) and the machine is woken.
    Timeout(i16),
    /// The running attempt picked by the index (or any number) succeeds.
    Success(u8),
    /// It fails: 0 fatal, 1 canceled, 2 do not retry, 3 a hint of `hint_ms`, else retryable.
    Failure { pick: u8, kind: u8, hint_ms: u16 },
    /// The budget refuses the hedge picked (the newest one, if the pick says so).
    Reject(u8),
    /// The driver cancels the operation.
    Cancel,
}

/// Why the model starts no further attempt.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stopped {
    DoNotRetry,
    Deferred(u64),
    Rejected,
}

/// What the driver is told to do, in the model's words.
#[derive(Clone, Debug, PartialEq)]
enum Told {
    Start(u64),
    Cancel(u64),
    Finish {
        kind: OutcomeKind,
        class: Option<FailureClass>,
        error: Option<u8>,
        retry_at: Option<u64>,
        stats: HedgeStats,
    },
}

/// The reference: times in ns since the operation started.
struct Model {
    max: u64,
    delay: u64,
    next_on_failure: bool,
    max_hint: u64,
    now: u64,
    /// Attempts started, in order (a refused hedge is taken back).
    started: u64,
    running: Vec<u64>,
    next: Option<u64>,
    /// The latest pushback's instant: nothing starts before it (B6).
    not_before: u64,
    stopped: Option<Stopped>,
    canceled: u64,
    last: Option<(FailureClass, u8)>,
    /// The failure that stopped further starts; the outcome names it.
    stopped_by: Option<(FailureClass, u8)>,
    /// The attempts the latest accepted input started: only those may be refused (X4).
    fresh: Vec<u64>,
    finished: bool,
    told: Vec<Told>,
}

impl Model {
    fn start_due(&mut self) {
        while let Some(at) = self.next
            && at <= self.now
            && self.stopped.is_none()
            && self.started < self.max
        {
            self.started += 1;
            self.running.push(self.started);
            self.fresh.push(self.started);
            self.told.push(Told::Start(self.started));
            // X1: the next one `delay` after this one started, and never before a pushback.
            self.next = (self.started < self.max).then_some((self.now + self.delay).max(self.not_before));
        }
        if self.started >= self.max {
            self.next = None;
        }
    }

    fn finish(&mut self, kind: OutcomeKind, winner: Option<u64>, retry_at: Option<u64>) {
        self.finish_with(kind, winner, retry_at, self.last);
    }

    fn finish_with(
        &mut self,
        kind: OutcomeKind,
        winner: Option<u64>,
        retry_at: Option<u64>,
        failure: Option<(FailureClass, u8)>,
    ) {
        // X2: every attempt still running is canceled, lowest first, before the outcome.
        self.running.sort_unstable();
        for attempt in self.running.drain(..) {
            self.told.push(Told::Cancel(attempt));
            self.canceled += 1;
        }
        let (class, error) = match (kind, failure) {
            (OutcomeKind::Succeeded, _) | (_, None) => (None, None),
            (_, Some((class, error))) => (Some(class), Some(error)),
        };
        let stats = HedgeStats {
            started: self.started,
            canceled: self.canceled,
            winner,
            elapsed: Duration::from_nanos(self.now),
        };
        self.told.push(Told::Finish { kind, class, error, retry_at, stats });
        self.finished = true;
        self.next = None;
    }

    /// Ends the operation when nothing runs and nothing will start (X5).
    fn end_if_idle(&mut self) {
        if self.finished || !self.running.is_empty() || self.next.is_some() {
            return;
        }
        // A pushback that stopped the starts is the outcome's failure; otherwise the last one.
        match self.stopped {
            None => self.finish(OutcomeKind::Exhausted, None, None),
            Some(Stopped::DoNotRetry) => self.finish_with(OutcomeKind::Fatal, None, None, self.stopped_by),
            Some(Stopped::Deferred(at)) => self.finish_with(OutcomeKind::Deferred, None, Some(at), self.stopped_by),
            Some(Stopped::Rejected) => self.finish(OutcomeKind::Rejected, None, None),
        }
    }

    fn stop(&mut self, why: Stopped) {
        if self.stopped.is_none() {
            self.stopped = Some(why);
        }
        self.next = None;
    }
}

/// Runs one input.
pub(super) fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(config) = Config::arbitrary(&mut u) else { return };
    let built = HedgePolicy::builder(u32::from(config.max_attempts), Duration::from_millis(u64::from(config.delay_ms)))
        .next_on_failure(config.next_on_failure)
        .max_hint(Duration::from_millis(u64::from(config.max_hint_ms)))
        .build();
    // A zero max_hint is refused, as by every policy (B6).
    let valid = (1..=16).contains(&config.max_attempts) && config.max_hint_ms > 0;
    ensure!(
        SETUP,
        built.is_ok() == valid,
        "X1",
        "max_attempts {} and max_hint {} ms built as {built:?}",
        config.max_attempts,
        config.max_hint_ms
    );
    let Ok(policy) = built else { return };
    let ms = 1_000_000u64;
    let mut model = Model {
        max: u64::from(config.max_attempts),
        delay: u64::from(config.delay_ms) * ms,
        next_on_failure: config.next_on_failure,
        max_hint: u64::from(config.max_hint_ms) * ms,
        now: 0,
        started: 0,
        running: Vec::new(),
        next: Some(0),
        not_before: 0,
        stopped: None,
        canceled: 0,
        last: None,
        stopped_by: None,
        fresh: Vec::new(),
        finished: false,
        told: Vec::new(),
    };
    let mut hedge = Hedge::<u8>::new();
    ensure!(SETUP, hedge.handle_start(&policy, Instant::ZERO).is_ok(), "X1", "a fresh machine refused its start");
    model.start_due();
    compare(SETUP, &mut hedge, &mut model);
    let mut clock: i64 = 0;
    for step in 0..MAX_OPS {
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        let ctx = Ctx { step: step + 1, op: &op };
        let before = hedge.clone();
        let pick = |pick: u8, model: &Model| {
            model.running.get(usize::from(pick) % model.running.len().max(1)).copied().unwrap_or(u64::from(pick) % 18)
        };
        let accepted = match op {
            Op::Timeout(by) => {
                clock = (clock + i64::from(by) * ms as i64).max(0);
                let now = model.now.max(clock as u64);
                hedge.handle_timeout(&policy, Instant::from_nanos(clock as u64));
                // Only a hedge that is due wakes it; an early call changes nothing.
                if !model.finished && model.next.is_some_and(|next| next <= now) {
                    model.now = now;
                    model.fresh.clear();
                    model.start_due();
                } else {
                    ensure!(ctx, hedge == before, "X1", "a timeout with no hedge due changed the machine: {hedge:?}");
                }
                None
            }
            Op::Success(p) => {
                let attempt = pick(p, &model);
                let ok = hedge.handle_success(Instant::from_nanos(clock as u64), attempt).is_ok();
                let expected = !model.finished && model.running.contains(&attempt);
                if expected {
                    model.now = model.now.max(clock as u64);
                    model.running.retain(|&a| a != attempt);
                    model.finish(OutcomeKind::Succeeded, Some(attempt), None);
                }
                Some((ok, expected))
            }
            Op::Failure { pick: p, kind, hint_ms } => {
                let attempt = pick(p, &model);
                let failure = match kind % 5 {
                    0 => Failure::fatal(kind),
                    1 => Failure::canceled(kind),
                    2 => Failure::do_not_retry(kind),
                    3 => Failure::retry_after(Duration::from_millis(u64::from(hint_ms)), kind),
                    _ => Failure::retryable(kind),
                };
                let class = failure.kind.class();
                let ok = hedge.handle_failure(&policy, Instant::from_nanos(clock as u64), attempt, failure).is_ok();
                let expected = !model.finished && model.running.contains(&attempt);
                if expected {
                    model.now = model.now.max(clock as u64);
                    model.fresh.clear();
                    model.running.retain(|&a| a != attempt);
                    let hinted_at = model.now + u64::from(hint_ms) * ms;
                    // Whether this failure stops further starts (B6: told not to, or a pushback
                    // past max_hint); the first such failure is the outcome's.
                    let stops = kind % 5 == 2 || (kind % 5 == 3 && hinted_at - model.now > model.max_hint);
                    if stops && model.stopped.is_none() {
                        model.stopped_by = Some((class, kind));
                    } else {
                        model.last = Some((class, kind));
                    }
                    match kind % 5 {
                        0 => model.finish(OutcomeKind::Fatal, None, None),
                        1 => model.finish(OutcomeKind::Canceled, None, None),
                        2 => model.stop(Stopped::DoNotRetry),
                        3 if stops => model.stop(Stopped::Deferred(hinted_at)),
                        3 => {
                            model.not_before = model.not_before.max(hinted_at);
                            model.next = model.next.map(|next| next.max(hinted_at));
                        }
                        _ => {
                            if model.next_on_failure && model.next.is_some() {
                                model.next = Some(model.now.max(model.not_before));
                            }
                        }
                    }
                    if !model.finished {
                        model.start_due();
                        model.end_if_idle();
                    }
                }
                Some((ok, expected))
            }
            Op::Reject(p) => {
                let attempt = if p % 2 == 0 { model.started } else { pick(p, &model) };
                let ok = hedge.handle_rejected(Instant::from_nanos(clock as u64), attempt).is_ok();
                // Only the attempts the latest input started may be refused, the newest with it.
                let all_fresh = (attempt..=model.started).all(|a| model.fresh.contains(&a));
                let expected = !model.finished && attempt >= 2 && model.running.contains(&attempt) && all_fresh;
                if expected {
                    model.now = model.now.max(clock as u64);
                    model.fresh.clear();
                    model.running.retain(|&a| a < attempt);
                    model.started = attempt - 1;
                    model.stop(Stopped::Rejected);
                    model.end_if_idle();
                }
                Some((ok, expected))
            }
            Op::Cancel => {
                let ok = hedge.handle_cancel(Instant::from_nanos(clock as u64)).is_ok();
                let expected = !model.finished;
                if expected {
                    model.now = model.now.max(clock as u64);
                    let failure = model.last.or(model.stopped_by);
                    model.finish_with(OutcomeKind::Canceled, None, None, failure);
                }
                Some((ok, expected))
            }
        };
        if let Some((ok, expected)) = accepted {
            ensure!(ctx, ok == expected, "G12", "accepted {ok}, the model says {expected}");
            if !ok {
                ensure!(ctx, hedge == before, "G12", "a refused input changed the machine");
            }
        }
        compare(ctx, &mut hedge, &mut model);
        ensure!(ctx, hedge.in_flight() <= u32::from(config.max_attempts), "X1", "{} in flight", hedge.in_flight());
        if model.finished {
            break;
        }
    }
}

/// Drains the machine and checks its outputs are the model's.
fn compare(ctx: Ctx<'_>, hedge: &mut Hedge<u8>, model: &mut Model) {
    let mut told = Vec::new();
    while let Some(action) = hedge.poll_action() {
        told.push(match action {
            HedgeAction::Start { attempt } => Told::Start(attempt),
            HedgeAction::Cancel { attempt } => Told::Cancel(attempt),
            HedgeAction::Finish { outcome, stats } => Told::Finish {
                kind: outcome.kind(),
                class: outcome.last_failure().map(|f| f.class),
                error: outcome.last_failure().and_then(|f| f.error),
                retry_at: outcome.retry_at().map(Instant::as_nanos),
                stats,
            },
        });
    }
    let expected = core::mem::take(&mut model.told);
    ensure!(ctx, told == expected, "X5", "the machine told {told:?}, the rules say {expected:?}");
    ensure!(
        ctx,
        hedge.in_flight() as usize == model.running.len(),
        "X2",
        "{} in flight, the model has {:?}",
        hedge.in_flight(),
        model.running
    );
}

/// What `data` decodes to.
pub(super) fn describe(data: &[u8]) -> String {
    let mut u = Unstructured::new(data);
    let config = Config::arbitrary(&mut u);
    let ops: Vec<Op> = core::iter::from_fn(|| Op::arbitrary(&mut u).ok()).take(MAX_OPS).collect();
    format!("{config:?}\n{ops:#?}")
}
