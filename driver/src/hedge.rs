//! Hedged requests: the driving loop of the core's [`Hedge`] machine (rules X1–X5).

use std::borrow::Borrow;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use persevere::{
    Failure, FailureClass, FailureKind, Hedge, HedgeAction, HedgePolicy, HedgeStats, Instant, Outcome, SplitMix64,
};
use pin_project_lite::pin_project;

use crate::classify::{Classifier, RetryAll, RetryGate};
use crate::operation::Operation;
use crate::refusal::Refusal;
use crate::retry::{GaveUp, final_failure};
use crate::runtime::Runtime;

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
        // The runtime's clock at the machine's `Instant::ZERO`, read when first needed.
        origin: Option<Instant>,
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
            origin: None,
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

/// Polls an attempt, catching a panic. Its error is classified by the caller, once the attempt
/// is out of its slot (polled again after a panic in the classifier, the hedge must not poll
/// the finished attempt again).
fn poll_attempt<F, T, E>(fut: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<Result<T, Option<E>>>
where
    F: Future<Output = Result<T, E>>,
{
    match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(result)) => Poll::Ready(result.map_err(Some)),
        Err(_panic) => Poll::Ready(Err(None)),
    }
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
        let mut this = self.project();
        assert!(!*this.done, "`HedgeFuture` polled after it completed, or after a panic in code it called");
        let policy: &HedgePolicy = (*this.policy).borrow();
        let rt = &*this.rt;
        // The machine's time: zero until the clock is first needed, then the runtime's clock
        // since that first reading.
        let origin = &mut *this.origin;
        let now = |origin: &Option<Instant>| match origin {
            None => Instant::ZERO,
            Some(o) => Instant::from_nanos(rt.now().as_nanos().saturating_sub(o.as_nanos())),
        };
        if !*this.started {
            *this.started = true;
            *this.request = Some(this.gate.on_request(None));
            // A fresh machine accepts its start.
            let _ = this.machine.handle_start(policy, Instant::ZERO);
        }
        // The winner's value and its ticket, which the gate hears of once the hedge is over.
        let mut won: Option<(T, Option<G::Ticket>)> = None;
        // Attempts whose creation panicked: each is reported failed, one per pass, after the
        // drain (and after a refusal, which must come right after the drain that named it).
        let mut unborn: Vec<u64> = Vec::new();
        loop {
            // Drain, acting on each action.
            let mut refused = None;
            while let Some(action) = this.machine.poll_action() {
                match action {
                    HedgeAction::Start { attempt } if refused.is_none() => {
                        if attempt == 1 {
                            match catch_unwind(AssertUnwindSafe(|| this.op.attempt())) {
                                Ok(fut) => this.first.set(Some(fut)),
                                Err(_) => unborn.push(1),
                            }
                            continue;
                        }
                        let class = this.machine.last_failure().map_or(FailureClass::Retryable, |f| f.class);
                        let ticket = match this.gate.try_retry(origin.map(|_| now(origin)), class) {
                            Ok(ticket) => ticket,
                            Err(refusal) => {
                                *this.refusal = Some(refusal);
                                refused = Some(attempt);
                                continue;
                            }
                        };
                        match catch_unwind(AssertUnwindSafe(|| this.op.attempt())) {
                            Ok(fut) => this.hedges.push((Some(Box::pin(fut)), Some(ticket))),
                            Err(_) => {
                                // Never ran: its place is given back at once.
                                drop(ticket);
                                unborn.push(attempt);
                                this.hedges.push((None, None));
                            }
                        }
                    }
                    // A later start of a drain whose hedge the gate refused: never started.
                    HedgeAction::Start { .. } => {}
                    HedgeAction::Cancel { attempt } => {
                        if attempt == 1 {
                            this.first.set(None);
                        } else if let Some(hedge) = this.hedges.get_mut(attempt as usize - 2) {
                            *hedge = (None, None);
                        }
                    }
                    HedgeAction::Finish { outcome, stats } => {
                        *this.done = true;
                        this.first.set(None);
                        this.hedges.clear();
                        this.timer.set(None);
                        // The gate's request ends with the call, after a success is told and
                        // before a final failure is (as in `retry`).
                        let result = match (outcome, won.take()) {
                            // Told when the hedge is over: polled again after a panic in the
                            // gate, it says it completed rather than hedging on.
                            (Outcome::Succeeded, Some((value, ticket))) => {
                                this.gate.on_success(ticket);
                                *this.request = None;
                                Ok(value)
                            }
                            (outcome, _) => {
                                *this.request = None;
                                if let Some(class) = final_failure(&outcome) {
                                    this.gate.on_final_failure(None, class);
                                }
                                Err(GaveUp::from_outcome(outcome, now(origin)).refused(*this.refusal))
                            }
                        };
                        return Poll::Ready(Hedged { result, stats });
                    }
                }
            }
            if let Some(attempt) = refused {
                // Drained, and `attempt` is the newest hedge.
                let _ = this.machine.handle_rejected(policy, now(origin), attempt);
                continue;
            }
            if !unborn.is_empty() {
                let attempt = unborn.remove(0);
                // It is in flight in the machine, which is drained.
                let _ = this.machine.handle_failure(policy, now(origin), attempt, Failure::panicked(None));
                continue;
            }
            // Poll every running attempt; the first answer is reported.
            let mut answer = None;
            if let Some(fut) = this.first.as_mut().as_pin_mut()
                && let Poll::Ready(a) = poll_attempt(fut, cx)
            {
                this.first.set(None);
                answer = Some((1, a, None));
            }
            if answer.is_none() {
                for (index, (slot, ticket)) in this.hedges.iter_mut().enumerate() {
                    if let Some(fut) = slot.as_mut()
                        && let Poll::Ready(a) = poll_attempt(fut.as_mut(), cx)
                    {
                        *slot = None;
                        answer = Some((index as u64 + 2, a, ticket.take()));
                        break;
                    }
                }
            }
            // The attempt is out of its slot; while the classifier runs, the hedge counts as
            // over, so that polled again after a panic in it, it says so rather than hedging on.
            let answer = match answer {
                Some((attempt, ended, ticket)) => {
                    *this.done = true;
                    let answer = judge(ended, &mut *this.classifier);
                    *this.done = false;
                    Some((attempt, answer, ticket))
                }
                None => None,
            };
            match answer {
                Some((attempt, Answer::Value(value), ticket)) => {
                    won = Some((value, ticket));
                    // A running attempt that answered is in flight, and the machine is drained.
                    let _ = this.machine.handle_success(policy, now(origin), attempt);
                    continue;
                }
                Some((attempt, Answer::Failed(kind, error), _ticket)) => {
                    let _ = this.machine.handle_failure(policy, now(origin), attempt, Failure::new(kind, error));
                    continue;
                }
                None => {}
            }
            // Nothing answered: the clock starts now if it has not (one read, only for an
            // operation that waits), then wait for the next hedge's time, if there is one.
            let origin_at = *origin.get_or_insert_with(|| rt.now());
            let Some(due) = this.machine.poll_timeout() else { return Poll::Pending };
            if *this.timer_at != Some(due) {
                this.timer.set(Some(rt.sleep_until(origin_at.saturating_add(Duration::from_nanos(due.as_nanos())))));
                *this.timer_at = Some(due);
            }
            let Some(sleep) = this.timer.as_mut().as_pin_mut() else { return Poll::Pending };
            if sleep.poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.timer.set(None);
            *this.timer_at = None;
            // A hedge draws no jitter: any RNG will do, and none is kept.
            this.machine.handle_timeout(policy, now(origin).later(due), &mut SplitMix64::new(0));
        }
    }
}
