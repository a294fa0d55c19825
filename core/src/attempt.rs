//! The attempt engine: what [`Retry`](crate::Retry) and [`Supervision`](crate::Supervision)
//! (and so [`Delivery`](crate::Delivery), which embeds a `Retry`) share, written once.
//!
//! It owns the attempt numbering (`u64`, from 1), the running / waiting / finished phases and
//! the timer of each (an attempt's deadline, a wait's end), the failure decision
//! ([`BackoffState::decide`]), the clamped `now` (time never runs backwards), the refusal of
//! misuse, and the drain of pending outputs. A machine built on it keeps only what is its own:
//! a retry its total budget and statistics; a supervised task its restart mode, spacing and
//! the abandoning of a timed-out attempt.
//!
//! # Outputs and the drain rule
//!
//! One input leaves at most two outputs (an attempt's end and what follows it), drained in
//! this order: the attempt's end
//! ([`Output::Ended`], which a machine emits when it has something to say about it), a wait
//! ([`Output::Wait`]), an attempt start ([`Output::Start`]) and the outcome
//! ([`Output::Finish`], once). Each output is described by the state the input left, so an
//! input that arrives while outputs wait to be drained is refused ([`Misuse::Undrained`]) and
//! a timeout is not acted on: no output is ever dropped or reported stale.

use core::time::Duration;

use rand_core::Rng;

use crate::Instant;
use crate::backoff::BackoffState;
use crate::decision::{Decision, FailureRules, Stop};
use crate::failure::{FailureKind, LastFailure};

/// The attempt that ended (the machine decides whether to report it).
pub(crate) const ENDED: u8 = 1;
/// A wait before the next attempt.
pub(crate) const WAIT: u8 = 2;
/// An attempt start.
pub(crate) const START: u8 = 4;
/// The outcome.
pub(crate) const FINISH: u8 = 8;

/// Where an operation or task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(crate) enum Phase<O> {
    /// Not started.
    Idle,
    /// An attempt runs; the timer is its deadline ([`Instant::MAX`] for none).
    Running,
    /// Waiting for the next attempt until the timer.
    Waiting,
    /// The running attempt timed out; the driver is dropping it.
    Abandoning,
    /// Over, with this outcome.
    Finished(O),
}

/// One output, in the machine-neutral form each machine maps to its own action type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output<O> {
    Ended { attempt: u64 },
    Wait { next_attempt: u64, delay: Duration, until: Instant },
    Start { attempt: u64, deadline: Option<Instant> },
    Finish(O),
}

/// A caller mistake, as the engine sees it; each machine turns it into its own error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Misuse<O> {
    AlreadyStarted,
    NotStarted,
    NoAttemptRunning,
    Stale { current: u64, got: u64 },
    Finished(O),
    Undrained,
}

/// The engine's state. 48 bytes for `E = ()` and a one-byte outcome kind, so that a
/// [`Retry<()>`](crate::Retry) stays within 64 (the project's size bar, `benches/README.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(crate) struct Attempts<E, O> {
    /// Running: the deadline; Waiting: the wait's end; Finished after a deferring hint: the
    /// hinted instant.
    timer: Instant,
    attempt: u64,
    backoff: BackoffState,
    last_now: Instant,
    last_failure: Option<LastFailure<E>>,
    phase: Phase<O>,
    pending: u8,
}

impl<E, O: Copy> Attempts<E, O> {
    pub(crate) const fn new() -> Self {
        Attempts {
            timer: Instant::ZERO,
            attempt: 0,
            backoff: BackoffState::new(),
            last_now: Instant::ZERO,
            last_failure: None,
            phase: Phase::Idle,
            pending: 0,
        }
    }

    /// Refuses a start unless the machine is idle.
    #[inline]
    pub(crate) fn check_idle(&self) -> Result<(), Misuse<O>> {
        match self.phase {
            Phase::Idle => Ok(()),
            Phase::Finished(kind) => Err(Misuse::Finished(kind)),
            Phase::Running | Phase::Waiting | Phase::Abandoning => Err(Misuse::AlreadyStarted),
        }
    }

    /// Refuses a result unless `attempt` is the running attempt and every output is drained.
    #[inline]
    pub(crate) fn check_running(&self, attempt: u64) -> Result<(), Misuse<O>> {
        match self.phase {
            Phase::Running if attempt == self.attempt && self.pending == 0 => Ok(()),
            Phase::Running if attempt == self.attempt => Err(Misuse::Undrained),
            Phase::Running => Err(Misuse::Stale { current: self.attempt, got: attempt }),
            _ => Err(self.not_running()),
        }
    }

    /// Refuses an input that needs a started, unfinished machine with its outputs drained.
    #[inline]
    pub(crate) fn check_started(&self) -> Result<(), Misuse<O>> {
        match self.phase {
            Phase::Idle => Err(Misuse::NotStarted),
            Phase::Finished(kind) => Err(Misuse::Finished(kind)),
            _ if self.pending != 0 => Err(Misuse::Undrained),
            _ => Ok(()),
        }
    }

    #[cold]
    fn not_running(&self) -> Misuse<O> {
        match self.phase {
            Phase::Idle => Misuse::NotStarted,
            Phase::Finished(kind) => Misuse::Finished(kind),
            _ => Misuse::NoAttemptRunning,
        }
    }

    /// Accepts `now`, read as the latest accepted instant if it is earlier; returns it.
    #[inline(always)]
    pub(crate) fn accept(&mut self, now: Instant) -> Instant {
        let now = self.last_now.later(now);
        self.last_now = now;
        now
    }

    /// The next attempt starts at `now` (the first one if none has), with a deadline
    /// `timeout_ns` later (`u64::MAX` for none).
    #[inline]
    pub(crate) fn begin(&mut self, now: Instant, timeout_ns: u64) {
        self.attempt = self.attempt.saturating_add(1);
        self.timer = now.saturating_add_nanos(timeout_ns);
        self.phase = Phase::Running;
        self.pending |= START;
    }

    /// The next attempt waits until `until`.
    #[inline]
    pub(crate) fn wait(&mut self, until: Instant) {
        self.timer = until;
        self.phase = Phase::Waiting;
        self.pending |= WAIT;
    }

    /// The running attempt is being dropped after its deadline (supervision).
    pub(crate) fn abandon(&mut self) {
        self.phase = Phase::Abandoning;
    }

    /// Over, with `outcome`.
    #[inline]
    pub(crate) fn finish(&mut self, outcome: O) {
        self.phase = Phase::Finished(outcome);
        self.pending |= FINISH;
    }

    /// Over because a hint asked for a retry at `retry_at`, past what the policy may wait.
    pub(crate) fn defer(&mut self, outcome: O, retry_at: Instant) {
        self.timer = retry_at;
        self.finish(outcome);
    }

    /// The driver cancels the operation or task (also one that has not started): a running
    /// attempt's end is reported, and it finishes with `outcome`. Returns the phase it left.
    #[inline]
    pub(crate) fn cancel(&mut self, now: Instant, outcome: O) -> Result<Phase<O>, Misuse<O>> {
        let left = self.phase;
        match left {
            Phase::Finished(kind) => return Err(Misuse::Finished(kind)),
            _ if self.pending != 0 => return Err(Misuse::Undrained),
            Phase::Running => self.mark_ended(),
            Phase::Idle | Phase::Waiting | Phase::Abandoning => {}
        }
        self.accept(now);
        self.finish(outcome);
        Ok(left)
    }

    /// The attempt's end is to be reported.
    #[inline]
    pub(crate) fn mark_ended(&mut self) {
        self.pending |= ENDED;
    }

    /// An attempt succeeded: the streak ends (R4, S3).
    #[inline]
    pub(crate) fn succeed(&mut self) {
        self.backoff.reset();
        self.last_failure = None;
    }

    /// Records the failure of the current attempt and decides what follows.
    #[inline(always)]
    pub(crate) fn fail<R: Rng + ?Sized>(
        &mut self,
        rules: &FailureRules,
        now: Instant,
        kind: FailureKind,
        error: Option<E>,
        rng: &mut R,
    ) -> Decision {
        self.last_failure = Some(LastFailure { class: kind.class(), error });
        self.backoff.decide(rules, now, kind, rng)
    }

    /// Counts a failure into the streak without a decision (one that ends the task by itself).
    pub(crate) fn count_failure(&mut self) {
        self.backoff.record_final();
    }

    /// Records a failure that is not decided by the rules (a panic while dropping a timed-out
    /// attempt, the machine's own timeout awaiting that drop).
    pub(crate) fn record_failure(&mut self, failure: LastFailure<E>) {
        self.last_failure = Some(failure);
    }

    /// What is due at `now` (already clamped): the running attempt's deadline, or the wait's
    /// end. Nothing while outputs wait to be drained.
    #[inline]
    pub(crate) fn due(&self, now: Instant) -> Due {
        if self.pending != 0 || self.timer > now {
            return Due::Nothing;
        }
        match self.phase {
            Phase::Running if self.timer != Instant::MAX => Due::Deadline,
            Phase::Waiting => Due::WaitOver,
            _ => Due::Nothing,
        }
    }

    /// The next output, in the drain order; `None` when every output is drained.
    ///
    /// One test per bit, in the drain order, rather than isolating the lowest bit and switching
    /// on it: the switch became an indirect jump whose target changes from call to call (a
    /// driver drains a wait, a start, then nothing), the costliest instruction of the failure
    /// path; each test is a branch predicted on its own. No recursion either, so that it
    /// inlines whole into a driver's loop.
    #[inline]
    pub(crate) fn poll(&mut self) -> Option<Output<O>> {
        let pending = self.pending;
        if pending & ENDED != 0 {
            self.pending = pending & !ENDED;
            return Some(Output::Ended { attempt: self.attempt });
        }
        // `WAIT` is only ever set with `Phase::Waiting` and `START` with `Phase::Running` (by
        // `wait` and `begin`, and a loaded state is validated to match), so neither reads the
        // phase back.
        if pending & WAIT != 0 {
            self.pending = pending & !WAIT;
            return Some(Output::Wait {
                next_attempt: self.attempt.saturating_add(1),
                delay: self.timer.saturating_duration_since(self.last_now),
                until: self.timer,
            });
        }
        if pending & START != 0 {
            self.pending = pending & !START;
            return Some(Output::Start { attempt: self.attempt, deadline: self.deadline() });
        }
        // Any other bit cannot be set (as above); it is dropped, and the machine stays total.
        self.pending = 0;
        match self.phase {
            Phase::Finished(outcome) if pending & FINISH != 0 => Some(Output::Finish(outcome)),
            _ => None,
        }
    }

    /// When the machine next has work: the running attempt's deadline or the wait's end.
    #[inline]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => self.deadline(),
            Phase::Waiting => Some(self.timer),
            Phase::Idle | Phase::Abandoning | Phase::Finished(_) => None,
        }
    }

    /// The running attempt's deadline, `None` for none.
    #[inline]
    pub(crate) const fn deadline(&self) -> Option<Instant> {
        if self.timer.as_nanos() == u64::MAX { None } else { Some(self.timer) }
    }

    pub(crate) const fn phase(&self) -> Phase<O> {
        self.phase
    }

    pub(crate) const fn timer(&self) -> Instant {
        self.timer
    }

    pub(crate) const fn attempt(&self) -> u64 {
        self.attempt
    }

    pub(crate) const fn last_now(&self) -> Instant {
        self.last_now
    }

    pub(crate) const fn streak(&self) -> u32 {
        self.backoff.failures()
    }

    pub(crate) const fn last_failure(&self) -> Option<&LastFailure<E>> {
        self.last_failure.as_ref()
    }

    #[inline]
    pub(crate) fn take_last_failure(&mut self) -> Option<LastFailure<E>> {
        self.last_failure.take()
    }

    pub(crate) const fn has_actions(&self) -> bool {
        self.pending != 0
    }

    /// Whether the attempt's end waits to be reported.
    pub(crate) const fn ended_pending(&self) -> bool {
        self.pending & ENDED != 0
    }

    /// Whether the limit of `rules` forbids another attempt after the current streak (a state
    /// made under another policy, waiting for an attempt this one does not allow).
    #[inline]
    pub(crate) fn limit_reached(&self, rules: &FailureRules) -> bool {
        u64::from(self.backoff.failures()) > rules.retries_allowed || !self.has_next_number()
    }

    /// Whether another attempt can have a number of its own: past `u64::MAX` attempts there is
    /// no new number, and the next attempt would reuse one.
    #[inline]
    pub(crate) const fn has_next_number(&self) -> bool {
        self.attempt != u64::MAX
    }

    /// Ends the operation or task for a `stop` the failure decision gave, with the outcome
    /// `ends` names for it.
    #[inline]
    pub(crate) fn stop(&mut self, stop: Stop, ends: Ends<O>) {
        match stop {
            Stop::Fatal | Stop::DoNotRetry => self.finish(ends.fatal),
            Stop::Canceled => self.finish(ends.canceled),
            Stop::Limit => self.finish(ends.limit),
            Stop::Deferred { retry_at } => self.defer(ends.deferred, retry_at),
        }
    }

    /// Whether a loaded state is one the transitions could have made: `needs_failure(o)` says
    /// which outcomes are reported with the last failure, and `canceled` is the one outcome an
    /// operation may finish with before its first attempt.
    pub(crate) fn validate(&self, needs_failure: impl Fn(O) -> bool, canceled: O) -> Result<(), &'static str>
    where
        O: PartialEq,
    {
        // Every pending set one input can leave, after any number of drains (the attempt's
        // end drains first, so it is never left alone but while a timed-out attempt waits to
        // be dropped).
        let possible: &[u8] = match self.phase {
            Phase::Idle => &[0],
            Phase::Running => &[0, START],
            Phase::Waiting => &[0, WAIT, ENDED | WAIT],
            Phase::Abandoning => &[0, ENDED],
            Phase::Finished(_) => &[0, FINISH, ENDED | FINISH],
        };
        if !possible.contains(&self.pending) {
            return Err("the pending outputs are not ones an input can leave in this phase");
        }
        if !self.backoff.is_valid() {
            return Err("the backoff's schedule restarted after more failures than its streak has");
        }
        // Every failure of the streak belongs to an attempt that has ended: the running one (or
        // the one being abandoned) has not failed yet.
        let ended = match self.phase {
            Phase::Running | Phase::Abandoning => self.attempt.saturating_sub(1),
            _ => self.attempt,
        };
        if u64::from(self.backoff.failures()) > ended {
            return Err("the failure streak is longer than the attempts that ended");
        }
        match self.phase {
            Phase::Idle
                if self.attempt != 0
                    || self.last_failure.is_some()
                    || self.backoff != BackoffState::new()
                    || self.timer != Instant::ZERO
                    || self.last_now != Instant::ZERO =>
            {
                Err("an operation that has not started has a history")
            }
            Phase::Running | Phase::Waiting | Phase::Abandoning if self.attempt == 0 => {
                Err("a started operation has no attempt")
            }
            // Only a cancel finishes an operation before its first attempt.
            Phase::Finished(outcome)
                if self.attempt == 0
                    && (outcome != canceled || self.last_failure.is_some() || self.backoff.failures() != 0) =>
            {
                Err("an operation that finished without an attempt was not canceled, or has a failure")
            }
            Phase::Abandoning if self.last_failure.is_none() => Err("a timed-out attempt has no failure"),
            // A wait follows a failure (streak and failure both kept) or, for a periodic task, a
            // success (both cleared).
            Phase::Waiting if (self.backoff.failures() == 0) != self.last_failure.is_none() => {
                Err("a wait's failure streak and last failure disagree")
            }
            Phase::Finished(outcome)
                if self.pending & FINISH != 0 && needs_failure(outcome) && self.last_failure.is_none() =>
            {
                Err("an outcome that reports a failure has none")
            }
            _ => Ok(()),
        }
    }
}

/// The outcome a machine gives each way the failure decision can stop it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ends<O> {
    /// `Fatal` or `DoNotRetry`.
    pub(crate) fatal: O,
    /// `Canceled`.
    pub(crate) canceled: O,
    /// The streak passed the limit.
    pub(crate) limit: O,
    /// A hint past what the policy waits.
    pub(crate) deferred: O,
}

/// What [`Attempts::due`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    Nothing,
    /// The running attempt passed its deadline.
    Deadline,
    /// The wait is over: the next attempt starts.
    WaitOver,
}
