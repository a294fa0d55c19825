//! Hedged requests: the driving loop of the core's [`Hedge`] machine (rules X1–X5).

use std::borrow::Borrow;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{Context, Poll};

use persevere::{Failure, FailureClass, FailureKind, Hedge, HedgeAction, HedgePolicy, HedgeStats, Instant, Outcome};
use pin_project_lite::pin_project;

use crate::classify::{Classifier, RetryAll, RetryGate};
use crate::operation::{Operation, poll_attempt, start_attempt};
use crate::refusal::Refusal;
use crate::retry::{GaveUp, final_failure};
use crate::runtime::{Runtime, Timeline};

/// The result of a hedged operation, with its statistics whatever the outcome (X5).
#[derive(Debug)]
#[must_use = "the operation's result is inside"]
pub struct Hedged<T, E> {
    /// The value of the attempt that won, or why the operation gave up.
    pub result: Result<T, GaveUp<E>>,
    /// Attempts started and canceled, which one won, and the time from the first attempt's
    /// first pending poll to the outcome (zero when the first attempt answered at once).
    pub stats: HedgeStats,
}

pin_project! {
    #[project = Projection]
    /// A hedged operation: runs attempts of `op` under a [`HedgePolicy`], a new one every
    /// `delay` while none has answered, until one succeeds (the others are dropped) or the
    /// policy gives up. Created by [`hedge`]; configure it with [`classify`](Self::classify)
    /// and [`gate`](Self::gate), then `.await` it.
    ///
    /// - The first attempt is polled before any clock is read or any timer made: one that
    ///   answers at once costs neither. The hedging delay is counted from its first pending poll.
    /// - Attempt 1 lives inside the future; each hedge (attempt 2 and later) is boxed when it
    ///   starts, so an operation that never hedges allocates nothing.
    /// - Every attempt still running is polled whenever the future is; the first to answer is
    ///   reported first. A panic while creating or polling an attempt is a
    ///   [`FailureKind::Panicked`] failure of that attempt.
    /// - A gate ([`RetryGate`]) is asked before each hedge, as it is before a retry (X4): a
    ///   refusal starts no further hedge, and the attempts that run carry on. A token bucket is
    ///   so charged for each hedge it grants, also when the operation then succeeds (gRPC checks
    ///   its bucket before a hedge and charges failures instead); the operation's request is
    ///   made at its first poll.
    #[must_use = "futures do nothing unless awaited"]
    pub struct HedgeFuture<Rt, P, Op, Fut, E, C = RetryAll, G = ()>
    where
        Rt: Runtime,
        G: RetryGate,
    {
        rt: Rt,
        policy: P,
        op: Op,
        classifier: C,
        gate: G,
        // What the gate keeps for this operation until it ends.
        request: Option<G::Request>,
        machine: Hedge<Option<E>>,
        started: bool,
        done: bool,
        // The machine's time: paused at `Instant::ZERO` until the first wait, then running.
        timeline: Timeline,
        // The gate's refusal of a hedge, which ends the operation `Rejected` if no attempt runs.
        refusal: Option<Refusal>,
        #[pin]
        first: Option<Fut>,
        // Attempt k ≥ 2 at index k − 2, with the gate's ticket for it.
        hedges: Vec<(Option<Pin<Box<Fut>>>, Option<G::Ticket>)>,
        #[pin]
        timer: Option<Rt::Sleep>,
        // The machine's instant the timer is set for.
        timer_at: Option<Instant>,
    }
}

/// Hedges `op` under `policy` on the runtime `rt`: attempt 1 at once, another every
/// `policy.delay()` while none has answered, the first success wins (X1–X5). Every error is a
/// non-fatal failure unless a classifier says otherwise.
///
/// ```
/// use std::time::Duration;
/// use persevere::HedgePolicy;
/// # struct Clock;
/// # impl persevere_driver::Runtime for Clock {
/// #     type Sleep = std::future::Ready<()>;
/// #     fn now(&self) -> persevere::Instant { persevere::Instant::ZERO }
/// #     fn sleep_until(&self, _: persevere::Instant) -> Self::Sleep { std::future::ready(()) }
/// # }
///
/// let policy = HedgePolicy::builder(3, Duration::from_millis(50)).build()?;
/// let done = futures_lite::future::block_on(persevere_driver::hedge(Clock, &policy, || async { Ok::<_, ()>(7) }));
/// assert_eq!(done.result, Ok(7));
/// assert_eq!((done.stats.started, done.stats.winner), (1, Some(1)));
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub fn hedge<Rt, P, Op, Fut, T, E>(rt: Rt, policy: P, op: Op) -> HedgeFuture<Rt, P, Op, Fut, E>
where
    Rt: Runtime,
    P: Borrow<HedgePolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    HedgeFuture::configured(rt, policy, op, RetryAll, ())
}

impl<Rt: Runtime, P, Op, Fut, E, C, G: RetryGate> HedgeFuture<Rt, P, Op, Fut, E, C, G> {
    /// Classifies errors with a closure `|error| kind` (its argument's type is inferred):
    /// [`FailureKind::Fatal`] ends the operation and cancels the other attempts,
    /// [`FailureKind::Hinted`] delays or stops the next hedge (X3).
    pub fn classify<C2>(self, classifier: C2) -> HedgeFuture<Rt, P, Op, Fut, E, C2, G>
    where
        C2: FnMut(&E) -> FailureKind,
    {
        self.classify_with(classifier)
    }

    /// Classifies errors with any [`Classifier`].
    pub fn classify_with<C2: Classifier<E>>(self, classifier: C2) -> HedgeFuture<Rt, P, Op, Fut, E, C2, G> {
        assert!(!self.started, "configure a hedge before polling it");
        let gate = self.gate;
        HedgeFuture::configured(self.rt, self.policy, self.op, classifier, gate)
    }

    /// Asks `gate` (a retry budget, a breaker, or a tuple of them) before each hedge (X4).
    pub fn gate<G2: RetryGate>(self, gate: G2) -> HedgeFuture<Rt, P, Op, Fut, E, C, G2> {
        assert!(!self.started, "configure a hedge before polling it");
        HedgeFuture::configured(self.rt, self.policy, self.op, self.classifier, gate)
    }

    /// A hedge of `op` that has not been polled (the builder methods assert it is not, and
    /// rebuild it whole).
    fn configured(rt: Rt, policy: P, op: Op, classifier: C, gate: G) -> Self {
        HedgeFuture {
            rt,
            policy,
            op,
            classifier,
            gate,
            request: None,
            machine: Hedge::new(),
            started: false,
            done: false,
            timeline: Timeline::PAUSED,
            refusal: None,
            first: None,
            hedges: Vec::new(),
            timer: None,
            timer_at: None,
        }
    }
}

/// How an attempt ended, as polled.
enum Answer<T, E> {
    Value(T),
    Failed(FailureKind, Option<E>),
}

/// What an attempt's end means: its value, or its failure as `classifier` sees it (`None`: it
/// panicked).
fn judge<T, E, C: Classifier<E>>(ended: Result<T, Option<E>>, classifier: &mut C) -> Answer<T, E> {
    match ended {
        Ok(value) => Answer::Value(value),
        Err(Some(error)) => Answer::Failed(classifier.classify(&error), Some(error)),
        Err(None) => Answer::Failed(FailureKind::Panicked, None),
    }
}

/// An attempt that answered, out of its slot.
struct Answered<T, E, Ticket> {
    /// Its number.
    attempt: u64,
    /// Its value, its error, or `Err(None)` if it panicked.
    ended: Result<T, Option<E>>,
    /// The gate's grant of it (a hedge's).
    ticket: Option<Ticket>,
}

/// What one poll keeps between its turns of the loop.
struct Pass<T, Ticket> {
    /// The winner's value and its ticket, which the gate hears of once the hedge is over.
    won: Option<(T, Option<Ticket>)>,
    /// Attempts whose creation panicked: each is reported failed, one per turn, after the drain
    /// (and after a refusal, which must come right after the drain that named it).
    unborn: Vec<u64>,
}

impl<Rt, P, Op, Fut, T, E, C, G> Future for HedgeFuture<Rt, P, Op, Fut, E, C, G>
where
    Rt: Runtime,
    P: Borrow<HedgePolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    G: RetryGate,
{
    type Output = Hedged<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Hedged<T, E>> {
        // Drains the machine, then feeds back one thing per turn: the gate's refusal of a hedge,
        // an attempt that could not be created, the first attempt to answer, or the timer of the
        // next hedge; until the hedge is over or nothing is ready.
        let mut this = self.project();
        assert!(!*this.done, "`HedgeFuture` polled after it completed, or after a panic in code it called");
        if !*this.started {
            this.begin();
        }
        let mut pass = Pass { won: None, unborn: Vec::new() };
        loop {
            let refused = match this.drain(&mut pass) {
                ControlFlow::Break(hedged) => return Poll::Ready(hedged),
                ControlFlow::Continue(refused) => refused,
            };
            if let Some(attempt) = refused {
                this.reject(attempt);
            } else if !pass.unborn.is_empty() {
                this.fail_unborn(pass.unborn.remove(0));
            } else if let Some(answered) = this.poll_attempts(cx) {
                this.answer(answered, &mut pass.won);
            } else if this.wait(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl<Rt, P, Op, Fut, T, E, C, G> Projection<'_, Rt, P, Op, Fut, E, C, G>
where
    Rt: Runtime,
    P: Borrow<HedgePolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    G: RetryGate,
{
    /// The first poll: the gate hears of the operation, and the machine starts at
    /// `Instant::ZERO`.
    fn begin(&mut self) {
        *self.started = true;
        *self.request = Some(self.gate.on_request(None));
        // A fresh machine accepts its start.
        let _ = self.machine.handle_start((*self.policy).borrow(), Instant::ZERO);
    }

    /// Drains the machine, acting on each action. `Break` with the output once the hedge is
    /// over; otherwise the hedge the gate refused in this drain, if it refused one (the later
    /// starts of that drain never start).
    fn drain(&mut self, pass: &mut Pass<T, G::Ticket>) -> ControlFlow<Hedged<T, E>, Option<u64>> {
        let mut refused = None;
        while let Some(action) = self.machine.poll_action() {
            match action {
                HedgeAction::Start { attempt } if refused.is_none() => {
                    if !self.start(attempt, &mut pass.unborn) {
                        refused = Some(attempt);
                    }
                }
                HedgeAction::Start { .. } => {}
                HedgeAction::Cancel { attempt } => self.cancel(attempt),
                HedgeAction::Finish { outcome, stats } => {
                    return ControlFlow::Break(self.finish(outcome, stats, pass.won.take()));
                }
            }
        }
        ControlFlow::Continue(refused)
    }

    /// Starts attempt `attempt`: the first at once, a hedge only once the gate grants it
    /// (`false` when it refuses; the refusal is kept). An attempt whose creation panics is
    /// `unborn`.
    fn start(&mut self, attempt: u64, unborn: &mut Vec<u64>) -> bool {
        if attempt == 1 {
            match start_attempt(&mut *self.op) {
                Some(first) => self.first.set(Some(first)),
                None => unborn.push(1),
            }
            return true;
        }
        let class = self.machine.last_failure().map_or(FailureClass::Retryable, |f| f.class);
        let ticket = match self.gate.try_retry(self.gate_now(), class) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                *self.refusal = Some(refusal);
                return false;
            }
        };
        match start_attempt(&mut *self.op) {
            Some(hedge) => self.hedges.push((Some(Box::pin(hedge)), Some(ticket))),
            None => {
                // Never ran: its place is given back at once.
                drop(ticket);
                unborn.push(attempt);
                self.hedges.push((None, None));
            }
        }
        true
    }

    /// Drops attempt `attempt`, which the machine canceled.
    fn cancel(&mut self, attempt: u64) {
        if attempt == 1 {
            self.first.set(None);
        } else if let Some(hedge) = self.hedges.get_mut(attempt as usize - 2) {
            *hedge = (None, None);
        }
    }

    /// The hedge is over: every attempt and the timer are dropped, the gate hears of the
    /// success or the final failure, and the operation's request ends (after a success is
    /// told, before a final failure is, as in `retry`).
    fn finish(
        &mut self,
        outcome: Outcome<Option<E>>,
        stats: HedgeStats,
        won: Option<(T, Option<G::Ticket>)>,
    ) -> Hedged<T, E> {
        *self.done = true;
        self.first.set(None);
        self.hedges.clear();
        self.timer.set(None);
        let result = match (outcome, won) {
            // Told when the hedge is over: polled again after a panic in the gate, it says it
            // completed rather than hedging on.
            (Outcome::Succeeded, Some((value, ticket))) => {
                self.gate.on_success(ticket);
                *self.request = None;
                Ok(value)
            }
            (outcome, _) => {
                *self.request = None;
                if let Some(class) = final_failure(&outcome) {
                    self.gate.on_final_failure(None, class);
                }
                Err(GaveUp::from_outcome(outcome, self.now()).refused(*self.refusal))
            }
        };
        Hedged { result, stats }
    }

    /// The gate refused hedge `attempt`, the newest; the machine is drained.
    fn reject(&mut self, attempt: u64) {
        let now = self.now();
        let _ = self.machine.handle_rejected(now, attempt);
    }

    /// Attempt `attempt` could not be created: a panicked failure. It is in flight in the
    /// machine, which is drained.
    fn fail_unborn(&mut self, attempt: u64) {
        let now = self.now();
        let _ = self.machine.handle_failure((*self.policy).borrow(), now, attempt, Failure::panicked(None));
    }

    /// Polls every running attempt, attempt 1 first. The first to answer is taken out of its
    /// slot and returned.
    fn poll_attempts(&mut self, cx: &mut Context<'_>) -> Option<Answered<T, E, G::Ticket>> {
        if let Some(first) = self.first.as_mut().as_pin_mut()
            && let Poll::Ready(ended) = poll_attempt(first, cx)
        {
            self.first.set(None);
            return Some(Answered { attempt: 1, ended, ticket: None });
        }
        for (index, (slot, ticket)) in self.hedges.iter_mut().enumerate() {
            if let Some(hedge) = slot.as_mut()
                && let Poll::Ready(ended) = poll_attempt(hedge.as_mut(), cx)
            {
                *slot = None;
                return Some(Answered { attempt: index as u64 + 2, ended, ticket: ticket.take() });
            }
        }
        None
    }

    /// An attempt answered: the machine hears of its value, kept in `won` with its ticket, or
    /// of its failure. While the classifier runs the hedge counts as over, so that polled again
    /// after a panic in it, it says so rather than hedging on.
    fn answer(&mut self, answered: Answered<T, E, G::Ticket>, won: &mut Option<(T, Option<G::Ticket>)>) {
        let Answered { attempt, ended, ticket } = answered;
        *self.done = true;
        let answer = judge(ended, &mut *self.classifier);
        *self.done = false;
        let now = self.now();
        let policy = (*self.policy).borrow();
        // A running attempt that answered is in flight, and the machine is drained.
        match answer {
            Answer::Value(value) => {
                *won = Some((value, ticket));
                let _ = self.machine.handle_success(now, attempt);
            }
            Answer::Failed(kind, error) => {
                let _ = self.machine.handle_failure(policy, now, attempt, Failure::new(kind, error));
            }
        }
    }

    /// Nothing answered: waits for the next hedge's time, if there is one. The machine's time
    /// starts running at the first wait (one clock read, only for an operation that waits).
    /// Ready once the timer fired and the machine has been told.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.timeline.resume(&*self.rt, self.machine.now());
        let Some(due) = self.machine.poll_timeout() else { return Poll::Pending };
        if *self.timer_at != Some(due) {
            self.timer.set(Some(self.timeline.sleep_until(&*self.rt, due)));
            *self.timer_at = Some(due);
        }
        let Some(sleep) = self.timer.as_mut().as_pin_mut() else { return Poll::Pending };
        if sleep.poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timer.set(None);
        *self.timer_at = None;
        let now = self.timeline.woken(&*self.rt, self.machine.now(), due);
        // A hedge draws no jitter: any RNG will do, and none is kept.
        self.machine.handle_timeout((*self.policy).borrow(), now);
        Poll::Ready(())
    }

    /// The machine's time for an input (see [`Timeline::now`]).
    fn now(&self) -> Instant {
        self.timeline.now(&*self.rt, self.machine.now())
    }

    /// What a gate is told about the time: the machine's now once it runs on the clock.
    fn gate_now(&self) -> Option<Instant> {
        self.timeline.is_running().then(|| self.now())
    }
}
