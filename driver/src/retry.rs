//! The driving loop: a future that runs attempts of an operation under the core's retry machine.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Pending};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::operation::{Operation, poll_attempt, start_attempt};

use persevere::rand_core::TryRng;
use persevere::{
    Failure, FailureClass, FailureKind, Instant, Outcome, OutcomeKind, Retry, RetryAction, RetryPolicy, SplitMix64,
    Stats,
};
use pin_project_lite::pin_project;

use crate::classify::{ByTrait, Classifier, Classify, Notify, RetryAll, RetryEvent, RetryGate};
use crate::refusal::{Gate, Refusal};
use crate::runtime::{Runtime, Timeline};

/// The result of a retried operation, with its statistics whatever the outcome.
#[derive(Debug)]
#[must_use = "the operation's result is inside"]
pub struct Retried<T, E> {
    /// The value of the successful attempt, or why the operation gave up.
    pub result: Result<T, GaveUp<E>>,
    /// What it took (R5). `elapsed` is `None` unless the clock was read when the first attempt
    /// started: a policy with a total budget or an attempt timeout, or
    /// [`RetryFuture::measure_elapsed`].
    pub stats: Stats,
}

impl<T, E> Retried<T, E> {
    /// The result alone.
    pub fn into_result(self) -> Result<T, GaveUp<E>> {
        self.result
    }
}

/// Why a retried operation gave up.
// `repr(C)`, this field order and `retry_after` as a `Duration` (whose niche holds the `Ok` tag of
// `Result<T, GaveUp<E>>`) are the layout the success path is measured with (benches/README.md).
#[derive(PartialEq, Eq)]
#[repr(C)]
pub struct GaveUp<E> {
    /// How it ended: `Exhausted`, `Fatal`, `Canceled`, `OutOfTime`, `Rejected` or `Deferred`.
    pub outcome: OutcomeKind,
    /// The class of the last failure, if there was one.
    pub class: Option<FailureClass>,
    /// See [`refused_by`](Self::refused_by).
    refused_by: Option<Gate>,
    /// The last attempt's error; `None` if it timed out or panicked, or none failed.
    pub error: Option<E>,
    /// See [`retry_after`](Self::retry_after); [`NO_RETRY_AFTER`] for none.
    retry_after: Duration,
}

/// `GaveUp::retry_after` when there is none. A hinted instant is `u64` nanoseconds, so no span
/// to it reaches `Duration::MAX` (the longest is `u64::MAX` nanoseconds, about 584 years).
const NO_RETRY_AFTER: Duration = Duration::MAX;

impl<E> GaveUp<E> {
    /// How an operation that finished at `now` with `outcome` (not a success) gave up.
    pub(crate) fn from_outcome(outcome: Outcome<Option<E>>, now: Instant) -> Self {
        let (kind, class) = (outcome.kind(), outcome.last_failure().map(|f| f.class));
        let retry_after_ns = outcome.retry_at().map(|at| at.as_nanos().saturating_sub(now.as_nanos()));
        let error = outcome.into_last_failure().and_then(|f| f.error).flatten();
        GaveUp::new(kind, class, error, retry_after_ns)
    }

    /// How it gave up; `retry_after_ns` is how long after the outcome the hint asked for.
    fn new(outcome: OutcomeKind, class: Option<FailureClass>, error: Option<E>, retry_after_ns: Option<u64>) -> Self {
        let retry_after = retry_after_ns.map_or(NO_RETRY_AFTER, Duration::from_nanos);
        GaveUp { outcome, class, refused_by: None, error, retry_after }
    }

    /// For a `Rejected` outcome, the gate's `refusal` that ended it: its gate and its time.
    pub(crate) fn refused(mut self, refusal: Option<Refusal>) -> Self {
        if let (OutcomeKind::Rejected, Some(refusal)) = (self.outcome, refusal) {
            self.refused_by = Some(refusal.gate());
            self.retry_after = refusal.retry_after().unwrap_or(NO_RETRY_AFTER);
        }
        self
    }

    /// For a [`Rejected`](OutcomeKind::Rejected) outcome: the gate that refused the retry (a
    /// tuple of gates names the one of them that refused).
    pub fn refused_by(&self) -> Option<Gate> {
        self.refused_by
    }

    /// The last attempt's error, if it returned one.
    pub fn into_error(self) -> Option<E> {
        self.error
    }

    /// For a [`Deferred`](OutcomeKind::Deferred) outcome: how long after the outcome the other
    /// side asked to be tried again (its hint, B6), so the caller can come back then. For a
    /// [`Rejected`](OutcomeKind::Rejected) one: how long until the gate that refused may allow
    /// a retry again, if it knows (a breaker's remaining open time; a budget cannot tell).
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_after != NO_RETRY_AFTER).then_some(self.retry_after)
    }
}

// By hand, to show `retry_after` as the `Option` it stands for.
impl<E: fmt::Debug> fmt::Debug for GaveUp<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GaveUp")
            .field("outcome", &self.outcome)
            .field("class", &self.class)
            .field("refused_by", &self.refused_by)
            .field("error", &self.error)
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

impl<E: fmt::Display> fmt::Display for GaveUp<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.refused_by {
            Some(gate) => write!(f, "gave up: {gate} refused the retry")?,
            None => write!(f, "gave up: {}", self.outcome)?,
        }
        if let Some(after) = self.retry_after() {
            write!(f, " (retry after {after:?})")?;
        }
        match (&self.error, self.class) {
            (Some(error), _) => write!(f, "; last error: {error}"),
            (None, Some(FailureClass::Timeout)) => write!(f, "; the last attempt timed out"),
            (None, Some(FailureClass::Panicked)) => write!(f, "; the last attempt panicked"),
            _ => Ok(()),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for GaveUp<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.as_ref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The core machine and what the driver keeps beside it: nothing that mirrors the machine.
/// Its error type is `Option<E>`: `None` for a panic the driver caught (the machine's own
/// timeouts carry no error either).
struct Machine<E> {
    retry: Retry<Option<E>>,
    /// The jitter RNG, seeded on its first draw (a policy without jitter never seeds one).
    rng: Option<SplitMix64>,
    /// How the machine's time follows the runtime's clock.
    timeline: Timeline,
    /// Whether the machine's time is the runtime's clock from the first attempt's start (a
    /// policy with a budget or a deadline, or `measure_elapsed`): its timeline never pauses,
    /// and its statistics have `elapsed`. Otherwise the timeline runs only while the machine
    /// sleeps, so no clock is read but around a sleep.
    timed: bool,
    /// The outcome of an operation that gave up, from the machine's `Finish` until the future
    /// returns it.
    gave_up: Option<GaveUp<E>>,
}

impl<E> Machine<E> {
    /// A machine whose attempt 1 starts at `now`: its `Start` is the next action.
    #[inline(always)]
    fn started(policy: &RetryPolicy, now: Instant, timed: bool) -> Self {
        let mut retry = Retry::new();
        // A fresh machine accepts its start.
        let _ = retry.handle_start(policy, now);
        let timeline = if timed { Timeline::CLOCK } else { Timeline::PAUSED };
        Machine { retry, rng: None, timeline, timed, gave_up: None }
    }

    /// The machine of an operation whose attempt 1 ran before the machine was made (the
    /// shortcut of [`RetryFuture::poll`]): started at `Instant::ZERO` on a paused timeline,
    /// with its `Start` already acted on. It is told next how that attempt ended.
    #[inline(always)]
    fn after_first_attempt(policy: &RetryPolicy) -> Self {
        let mut machine = Machine::started(policy, Instant::ZERO, false);
        let _ = machine.retry.poll_action();
        machine
    }

    /// The machine's `retry` and its jitter RNG, seeded on its first draw from `seed` or the
    /// runtime's entropy.
    #[inline(always)]
    fn with_rng<'a, Rt: Runtime>(
        &'a mut self,
        seed: &'a Option<u64>,
        rt: &'a Rt,
    ) -> (&'a mut Retry<Option<E>>, LazyRng<'a, Rt>) {
        (&mut self.retry, LazyRng { slot: &mut self.rng, seed, rt })
    }

    /// The statistics so far; `elapsed` only if the clock was read from the start.
    #[inline(always)]
    fn stats(&self) -> Stats {
        let stats = self.retry.stats();
        Stats { elapsed: stats.elapsed.filter(|_| self.timed), ..stats }
    }
}

/// The statistics of a first attempt that succeeded before the machine was made: those of a
/// machine told so, made on the spot (it never leaves the stack, so this costs next to nothing).
#[inline(always)]
fn first_attempt_succeeded(policy: &RetryPolicy) -> Stats {
    let mut machine = Machine::<Infallible>::after_first_attempt(policy);
    // Attempt 1 is the running one, and the machine is drained.
    let _ = machine.retry.handle_success(Instant::ZERO, 1);
    machine.stats()
}

/// The jitter RNG of one operation, seeded (from the future's seed or the runtime's entropy) on
/// its first draw.
struct LazyRng<'a, Rt> {
    slot: &'a mut Option<SplitMix64>,
    /// By reference: read only when seeding.
    seed: &'a Option<u64>,
    rt: &'a Rt,
}

/// A new jitter RNG, from `seed` or the runtime's entropy: out of line (cold), and by value, so
/// that the machine's address does not escape the driving loop.
#[cold]
#[inline(never)]
fn seeded<Rt: Runtime>(seed: &Option<u64>, rt: &Rt) -> SplitMix64 {
    SplitMix64::new(seed.unwrap_or_else(|| rt.entropy()))
}

impl<Rt: Runtime> LazyRng<'_, Rt> {
    #[inline]
    fn rng(&mut self) -> &mut SplitMix64 {
        let (seed, rt) = (self.seed, self.rt);
        self.slot.get_or_insert_with(|| seeded(seed, rt))
    }
}

impl<Rt: Runtime> TryRng for LazyRng<'_, Rt> {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.rng().try_next_u32()
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.rng().try_next_u64()
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.rng().try_fill_bytes(dst)
    }
}

/// How an attempt ended without a value, or that the cancel signal fired.
enum Ended<E> {
    /// It returned an error, not yet classified.
    Failed(E),
    /// It panicked, while being created or polled.
    Panicked,
    /// The cancel signal fired.
    Canceled,
}

/// Where the future is in its own life (not the machine's: that is the machine's to say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Not polled yet.
    Fresh,
    /// Polled: attempt 1 runs before the machine is made (the shortcut of
    /// [`RetryFuture::poll`]), or the machine drives.
    Active,
    /// The output was returned.
    Done,
}

/// How the first poll starts the operation, besides starting attempt 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Start {
    /// Read the clock from the start ([`measure_elapsed`](RetryFuture::measure_elapsed)).
    measure_elapsed: bool,
    /// The gate's request is already made ([`requested`](RetryFuture::requested)).
    requested: bool,
}

pin_project! {
    #[project = Projection]
    /// A retried operation: runs attempts of `op` under a [`RetryPolicy`] until one succeeds or
    /// the policy gives up. Created by [`retry`]; configure it with its builder methods, then
    /// `.await` it.
    ///
    /// It drives the core's [`Retry`] machine and holds nothing the machine knows besides it:
    /// its attempts, phases, time and outcome are the machine's.
    ///
    /// - Zero delays never touch the timer, and no clock is read unless the policy needs one
    ///   (a total budget or an attempt timeout), a sleep is due, or a gate asks.
    /// - An attempt past its deadline is dropped; so are the attempt and any sleep when this
    ///   future is dropped or its [`cancel_on`](Self::cancel_on) signal fires.
    /// - A panic while creating or polling an attempt is caught and counts as a
    ///   [`FailureKind::Panicked`] failure (retried).
    /// - Allocation-free: the future holds everything it needs.
    #[must_use = "futures do nothing unless awaited"]
    pub struct RetryFuture<Rt, P, Op, Fut, E, C = RetryAll, N = (), G = (), S = Pending<()>>
    where
        Rt: Runtime,
        G: RetryGate,
    {
        rt: Rt,
        policy: P,
        op: Op,
        classifier: C,
        notify: N,
        gate: G,
        // The gate's grant of the retry that runs (or waits to), until that attempt ends.
        ticket: Option<G::Ticket>,
        // What the gate keeps for this operation, from its start until it ends (its default
        // before the start and after the end).
        request: G::Request,
        seed: Option<u64>,
        stage: Stage,
        start: Start,
        // The machine, made when the shortcut's attempt 1 ends without a value, or at the start
        // when the clock is read from the start (see `poll`).
        machine: Option<Machine<E>>,
        #[pin]
        running: Option<Fut>,
        #[pin]
        timer: Option<Rt::Sleep>,
        #[pin]
        cancel: S,
    }
}

/// Retries `op` under `policy` on the runtime `rt`.
///
/// Every error is retried (see [`RetryAll`]) unless a classifier says otherwise; see
/// [`RetryFuture`] for the options.
///
/// ```
/// # use std::time::Duration;
/// # use persevere::{Backoff, RetryPolicy};
/// # struct Clock;
/// # impl persevere_driver::Runtime for Clock {
/// #     type Sleep = std::future::Ready<()>;
/// #     fn now(&self) -> persevere::Instant { persevere::Instant::ZERO }
/// #     fn sleep_until(&self, _: persevere::Instant) -> Self::Sleep { std::future::ready(()) }
/// # }
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(3).build()?;
/// let mut calls = 0;
/// let done = futures_lite::future::block_on(
///     persevere_driver::retry(Clock, &policy, || {
///         calls += 1;
///         let fail = calls < 3;
///         async move { if fail { Err("busy") } else { Ok(calls) } }
///     })
///     .notify(|e| println!("retry {} after {:?}", e.next_attempt, e.delay)),
/// );
/// assert_eq!(done.result, Ok(3));
/// assert_eq!(done.stats.attempts, 3);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub fn retry<Rt, P, Op, Fut, T, E>(rt: Rt, policy: P, op: Op) -> RetryFuture<Rt, P, Op, Fut, E>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
{
    RetryFuture {
        rt,
        policy,
        op,
        classifier: RetryAll,
        notify: (),
        gate: (),
        ticket: None,
        request: Default::default(),
        seed: None,
        stage: Stage::Fresh,
        start: Start::default(),
        machine: None,
        running: None,
        timer: None,
        cancel: std::future::pending(),
    }
}

impl<Rt: Runtime, P, Op, Fut, E, C, N, G: RetryGate, S> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S> {
    /// Replaces the hooks before the first poll.
    /// The gate's request, if [`requested`](Self::requested) gave one, is kept when the gate is.
    fn map<C2, N2, G2: RetryGate, S2>(
        self,
        hooks: impl FnOnce(C, N, G, S) -> (C2, N2, G2, S2),
        request: impl FnOnce(G::Request) -> G2::Request,
    ) -> RetryFuture<Rt, P, Op, Fut, E, C2, N2, G2, S2> {
        let (classifier, notify, gate, cancel) = hooks(self.classifier, self.notify, self.gate, self.cancel);
        RetryFuture {
            rt: self.rt,
            policy: self.policy,
            op: self.op,
            classifier,
            notify,
            gate,
            ticket: None,
            request: request(self.request),
            seed: self.seed,
            stage: self.stage,
            start: self.start,
            machine: self.machine,
            running: self.running,
            timer: self.timer,
            cancel,
        }
    }

    /// Classifies errors with a closure `|error| kind` (its argument's type is inferred): return
    /// [`FailureKind::Fatal`] to stop, [`FailureKind::Hinted`] to honour a `Retry-After`.
    pub fn classify<C2>(self, classifier: C2) -> RetryFuture<Rt, P, Op, Fut, E, C2, N, G, S>
    where
        C2: FnMut(&E) -> FailureKind,
    {
        self.classify_with(classifier)
    }

    /// Classifies errors with any [`Classifier`] (a type of your own, [`RetryAll`](crate::RetryAll),
    /// [`ByTrait`]).
    pub fn classify_with<C2: Classifier<E>>(self, classifier: C2) -> RetryFuture<Rt, P, Op, Fut, E, C2, N, G, S> {
        self.map(|_, n, g, s| (classifier, n, g, s), |r| r)
    }

    /// Classifies errors with their [`Classify`] implementation.
    pub fn classified(self) -> RetryFuture<Rt, P, Op, Fut, E, ByTrait, N, G, S>
    where
        E: Classify,
    {
        self.classify_with(ByTrait)
    }

    /// Calls `notify` before each retry with a [`RetryEvent`]: the error, the delay and the next
    /// attempt's number (the closure's argument type is inferred).
    pub fn notify<N2>(self, notify: N2) -> RetryFuture<Rt, P, Op, Fut, E, C, N2, G, S>
    where
        N2: FnMut(&RetryEvent<'_, E>),
    {
        self.notify_with(notify)
    }

    /// Calls any [`Notify`] implementation before each retry.
    pub fn notify_with<N2: Notify<E>>(self, notify: N2) -> RetryFuture<Rt, P, Op, Fut, E, C, N2, G, S> {
        self.map(|c, _, g, s| (c, notify, g, s), |r| r)
    }

    /// Asks `gate` (a retry budget, a breaker, or a tuple of gates such as `(breaker, budget)`,
    /// asked in order) before each retry; a refusal ends the operation with
    /// [`OutcomeKind::Rejected`].
    pub fn gate<G2: RetryGate>(self, gate: G2) -> RetryFuture<Rt, P, Op, Fut, E, C, N, G2, S> {
        // A request kept for the gate replaced ends here: the new gate was never asked.
        let mut replaced = self.map(|c, n, _, s| (c, n, gate, s), |_| G2::Request::default());
        replaced.start.requested = false;
        replaced
    }

    /// Cancels the operation when `signal` completes: the running attempt or sleep is dropped
    /// and the result is [`OutcomeKind::Canceled`], with the statistics so far.
    pub fn cancel_on<S2: Future<Output = ()>>(self, signal: S2) -> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S2> {
        self.map(|c, n, g, _| (c, n, g, signal), |r| r)
    }

    /// Seeds the jitter RNG, for reproducible delays (by default the runtime's
    /// [`entropy`](Runtime::entropy) seeds it on the first draw).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The operation already started with the gate, which kept `request` for it (a layer that
    /// calls the gate itself before handing the operation to this loop): the loop keeps it until
    /// the operation ends and does not call [`RetryGate::on_request`] again.
    pub fn requested(mut self, request: G::Request) -> Self {
        self.request = request;
        self.start.requested = true;
        self
    }

    /// Reads the clock at the first attempt's start so that [`Stats::elapsed`] is always known
    /// (costs one clock read on the success path).
    pub fn measure_elapsed(mut self) -> Self {
        self.start.measure_elapsed = true;
        self
    }
}

/// Emits a `tracing` event when the `tracing` feature is on; compiles to nothing otherwise.
macro_rules! event {
    ($($arg:tt)*) => {
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "persevere", $($arg)*);
    };
}

/// A counter or histogram of the `metrics` facade, compiled only with the `metrics` feature
/// (docs/guide.md's Observability section names them).
macro_rules! metric {
    ($($body:tt)*) => {
        #[cfg(feature = "metrics")]
        {
            $($body)*;
        }
    };
}

/// The `outcome` label of `persevere_operations_total`.
#[cfg(feature = "metrics")]
fn outcome_label(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Succeeded => "succeeded",
        OutcomeKind::Exhausted => "exhausted",
        OutcomeKind::Fatal => "fatal",
        OutcomeKind::Canceled => "canceled",
        OutcomeKind::OutOfTime => "out_of_time",
        OutcomeKind::Rejected => "rejected",
        OutcomeKind::Deferred => "deferred",
        _ => "other",
    }
}

impl<Rt, P, Op, Fut, T, E, C, N, G, S> Future for RetryFuture<Rt, P, Op, Fut, E, C, N, G, S>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    type Output = Retried<T, E>;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The one shortcut: on a policy that needs no clock, attempt 1 starts and is polled
        // before the machine is made, so that a first attempt that succeeds costs no machine,
        // no clock and no timer (its statistics are still a machine's: `first_attempt_succeeded`).
        // When it ends any other way, or the cancel signal fires, the machine is made as if it
        // had started it (`Machine::after_first_attempt`) and `drive` takes over. Everything
        // else is `drive`'s from the start.
        let this = self.as_mut().project();
        match *this.stage {
            Stage::Fresh if !this.start.measure_elapsed && !(*this.policy).borrow().needs_clock() => {
                if let Err(ended) = self.as_mut().start_first_attempt() {
                    return self.slow_path(cx, Some(ended));
                }
            }
            // Attempt 1 still runs, with no machine yet.
            Stage::Active if this.machine.is_none() => {}
            _ => return self.slow_path(cx, None),
        }
        self.poll_first_attempt(cx)
    }
}

impl<Rt, P, Op, Fut, T, E, C, N, G, S> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    /// The shortcut's start: the gate hears of the operation, and attempt 1 starts (a panic
    /// while creating it is how it ended).
    #[inline(always)]
    fn start_first_attempt(self: Pin<&mut Self>) -> Result<(), Ended<E>> {
        let mut this = self.project();
        if !this.start.requested {
            *this.request = this.gate.on_request(None);
        }
        event!(attempt = 1u64, "attempt starting");
        metric!(metrics::counter!("persevere_attempts_total").increment(1));
        *this.stage = Stage::Active;
        let attempt = start_attempt(this.op).ok_or(Ended::Panicked)?;
        this.running.set(Some(attempt));
        Ok(())
    }

    /// Polls the shortcut's attempt 1 (the cancel signal first). A success ends the operation
    /// here; any other end hands it to the machine.
    #[inline(always)]
    fn poll_first_attempt(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Retried<T, E>> {
        let mut this = self.as_mut().project();
        if this.cancel.as_mut().poll(cx).is_ready() {
            return self.slow_path(cx, Some(Ended::Canceled));
        }
        let Some(attempt) = this.running.as_mut().as_pin_mut() else { return self.slow_path(cx, None) };
        let ended = match poll_attempt(attempt, cx) {
            // No machine and no deadline yet: nothing else can wake this attempt.
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(value)) => {
                this.running.set(None);
                succeeded(this.stage, this.gate, None, this.request);
                event!(attempts = 1u64, "operation succeeded");
                let stats = first_attempt_succeeded((*this.policy).borrow());
                return Poll::Ready(Retried { result: Ok(value), stats });
            }
            Poll::Ready(Err(Some(error))) => Ended::Failed(error),
            Poll::Ready(Err(None)) => Ended::Panicked,
        };
        // The finished attempt goes before the classifier runs: polled again after a panic in
        // it, the future must not poll that attempt again (and retry it).
        this.running.set(None);
        self.slow_path(cx, Some(ended))
    }

    /// Runs [`drive`](Self::drive) and builds the future's output from what it left: the value,
    /// or how the operation gave up, and the machine's statistics.
    #[inline(always)]
    fn slow_path(mut self: Pin<&mut Self>, cx: &mut Context<'_>, first_end: Option<Ended<E>>) -> Poll<Retried<T, E>> {
        let Poll::Ready(value) = self.as_mut().drive(cx, first_end) else { return Poll::Pending };
        // `drive` leaves the machine in place whenever it returns.
        let Some(machine) = self.project().machine.as_mut() else {
            unreachable!("the driver holds a machine when it is done")
        };
        let result = match value {
            Some(value) => Ok(value),
            None => Err(machine.gave_up.take().unwrap_or_else(|| unreachable!("the driver kept how it gave up"))),
        };
        Poll::Ready(Retried { result, stats: machine.stats() })
    }

    /// The driving loop, out of line: makes the machine if there is none yet, tells it how the
    /// shortcut's attempt 1 ended (`first_end`), and runs the [`Driver`].
    ///
    /// Returns the successful attempt's value, or `None` when the operation gave up (how, in
    /// [`Machine::gave_up`]).
    #[inline(never)]
    fn drive(self: Pin<&mut Self>, cx: &mut Context<'_>, first_end: Option<Ended<E>>) -> Poll<Option<T>> {
        let this = self.project();
        if *this.stage == Stage::Done {
            panic!("`RetryFuture` polled after it completed");
        }
        let policy: &RetryPolicy = (*this.policy).borrow();
        let rt = &*this.rt;
        let machine = match this.machine {
            Some(machine) => machine,
            None => this.machine.insert(make_machine(policy, rt, this.stage, *this.start, &*this.gate, this.request)),
        };
        let mut driver = Driver {
            policy,
            rt,
            seed: &*this.seed,
            op: this.op,
            classifier: this.classifier,
            notify: this.notify,
            gate: &*this.gate,
            ticket: this.ticket,
            request: this.request,
            stage: this.stage,
            machine,
            running: this.running,
            timer: this.timer,
            cancel: this.cancel,
            refused: None,
        };
        if let Some(ended) = first_end {
            driver.end_attempt(ended);
        }
        driver.run(cx)
    }
}

/// The machine, made by the first poll that reaches the loop: from the start when the clock is
/// read from the start (a budget, a deadline, or `measure_elapsed`; the gate's request is made
/// then, unless it was), or after the shortcut's attempt 1.
#[inline(always)]
fn make_machine<Rt: Runtime, G: RetryGate, E>(
    policy: &RetryPolicy,
    rt: &Rt,
    stage: &mut Stage,
    start: Start,
    gate: &G,
    request: &mut G::Request,
) -> Machine<E> {
    if *stage != Stage::Fresh {
        return Machine::after_first_attempt(policy);
    }
    let now = rt.now();
    if !start.requested {
        *request = gate.on_request(Some(now));
    }
    *stage = Stage::Active;
    Machine::started(policy, now, true)
}

/// The operation succeeded: it is over before the gate hears of it (polled again after a panic
/// in the gate, the future says it completed rather than starting over), then the gate's
/// request for it ends.
#[inline(always)]
fn succeeded<G: RetryGate>(stage: &mut Stage, gate: &G, ticket: Option<G::Ticket>, request: &mut G::Request) {
    *stage = Stage::Done;
    gate.on_success(ticket);
    *request = G::Request::default();
    metric!(metrics::counter!("persevere_operations_total", "outcome" => "succeeded").increment(1));
}

/// The driving loop over one poll: the policy, the machine, and each part of the future it
/// works on, borrowed.
struct Driver<'a, Rt: Runtime, Op, Fut, E, C, N, G: RetryGate, S> {
    policy: &'a RetryPolicy,
    rt: &'a Rt,
    seed: &'a Option<u64>,
    op: &'a mut Op,
    classifier: &'a mut C,
    notify: &'a mut N,
    gate: &'a G,
    /// The gate's grant of the retry that runs (or waits to), until that attempt ends.
    ticket: &'a mut Option<G::Ticket>,
    request: &'a mut G::Request,
    stage: &'a mut Stage,
    machine: &'a mut Machine<E>,
    running: Pin<&'a mut Option<Fut>>,
    timer: Pin<&'a mut Option<Rt::Sleep>>,
    cancel: Pin<&'a mut S>,
    /// The gate's refusal of the retry the machine asked for, which ends the operation.
    refused: Option<Refusal>,
}

/// What ended a wait of the loop.
enum Woken<T, E> {
    /// The running attempt succeeded.
    Succeeded(T),
    /// The running attempt ended otherwise, or the cancel signal fired.
    Ended(Ended<E>),
    /// The timer fired.
    Timer,
}

impl<Rt, Op, Fut, T, E, C, N, G, S> Driver<'_, Rt, Op, Fut, E, C, N, G, S>
where
    Rt: Runtime,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    /// Drains the machine, acting on each action as it comes, then waits for the attempt, the
    /// timer or the cancel signal and feeds back what happened, until the operation ends or
    /// nothing is ready.
    #[inline(always)]
    fn run(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        loop {
            while let Some(action) = self.machine.retry.poll_action() {
                if self.act(action).is_break() {
                    return Poll::Ready(None);
                }
            }
            match self.wait(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Woken::Succeeded(value)) => {
                    self.succeed();
                    return Poll::Ready(Some(value));
                }
                Poll::Ready(Woken::Ended(ended)) => self.end_attempt(ended),
                Poll::Ready(Woken::Timer) => self.wake(),
            }
        }
    }

    /// Acts on one action; `Break` when it is the operation's end (it gave up).
    #[inline(always)]
    fn act(&mut self, action: RetryAction<Option<E>>) -> ControlFlow<()> {
        match action {
            RetryAction::Start { attempt, deadline } => self.start(attempt, deadline),
            RetryAction::Abandon { attempt } => {
                event!(attempt, "attempt abandoned");
                let _ = attempt;
                self.drop_attempt();
            }
            RetryAction::Sleep { next_attempt, delay, until } => self.schedule(next_attempt, delay, until),
            RetryAction::Finish { outcome, stats } => {
                self.finish(outcome, stats);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// Starts attempt `attempt`, with a timer for its deadline if it has one; a panic while
    /// creating it is its failure.
    #[inline(always)]
    fn start(&mut self, attempt: u64, deadline: Option<Instant>) {
        event!(attempt, "attempt starting");
        metric!(metrics::counter!("persevere_attempts_total").increment(1));
        let _ = attempt;
        let Some(future) = start_attempt(self.op) else { return self.end_attempt(Ended::Panicked) };
        self.running.set(Some(future));
        // Every input that leads to a start (the start itself, a sleep's end, a failure) left
        // no timer.
        debug_assert!(self.timer.is_none());
        if let Some(deadline) = deadline {
            let sleep = self.machine.timeline.sleep_until(self.rt, deadline);
            self.timer.set(Some(sleep));
        }
    }

    /// The machine asks for attempt `next_attempt` after `delay`, at `until`: the gate is asked
    /// (a refusal ends the operation in this same drain), `notify` is told, and the machine
    /// sleeps.
    #[inline(always)]
    fn schedule(&mut self, next_attempt: u64, delay: Duration, until: Instant) {
        let class = self.machine.retry.last_failure().map_or(FailureClass::Retryable, |f| f.class);
        match self.gate.try_retry(self.gate_now(), class) {
            Ok(granted) => *self.ticket = Some(granted),
            Err(refusal) => return self.refuse(refusal, next_attempt),
        }
        event!(next_attempt, delay_ns = delay.as_nanos() as u64, "retry scheduled");
        metric!(metrics::counter!("persevere_retries_total").increment(1));
        metric!(metrics::histogram!("persevere_retry_delay_seconds").record(delay.as_secs_f64()));
        let error = self.machine.retry.last_failure().and_then(|f| f.error.as_ref()).and_then(Option::as_ref);
        self.notify.notify(&RetryEvent { error, class, next_attempt, delay });
        self.sleep_until(until);
    }

    /// The gate refused the retry: the machine, sleeping and drained, finishes `Rejected`.
    #[inline(always)]
    fn refuse(&mut self, refusal: Refusal, next_attempt: u64) {
        self.refused = Some(refusal);
        event!(next_attempt, "retry refused by the gate");
        metric!(metrics::counter!("persevere_retries_refused_total").increment(1));
        let _ = next_attempt;
        let retry = &mut self.machine.retry;
        let _ = retry.handle_rejected(retry.now());
    }

    /// Sleeps until the machine's instant `until`. A zero delay (an `until` not past the
    /// machine's now) goes straight to the next attempt: no timer, no clock.
    #[inline(always)]
    fn sleep_until(&mut self, until: Instant) {
        let now = self.machine.retry.now();
        if until <= now {
            let (retry, mut rng) = self.machine.with_rng(self.seed, self.rt);
            retry.handle_timeout(self.policy, now, &mut rng);
            return;
        }
        self.machine.timeline.resume(self.rt, now);
        let sleep = self.machine.timeline.sleep_until(self.rt, until);
        self.timer.set(Some(sleep));
    }

    /// The operation gave up: the attempt and the timer are dropped, the gate hears of the last
    /// failure (unless a retry of it was granted) and its request ends, and how it gave up is
    /// kept for the output.
    #[inline(always)]
    fn finish(&mut self, outcome: Outcome<Option<E>>, stats: Stats) {
        *self.stage = Stage::Done;
        self.running.set(None);
        self.drop_timer();
        // A ticket still held: the last failure's retry was granted (and charged), and the
        // operation ended waiting for it (its total budget ran out).
        let retry_granted = self.ticket.take().is_some();
        *self.request = G::Request::default();
        event!(outcome = ?outcome.kind(), attempts = stats.attempts, "operation finished");
        metric!(
            metrics::counter!("persevere_operations_total", "outcome" => outcome_label(outcome.kind())).increment(1)
        );
        let _ = stats;
        if let Some(class) = final_failure(&outcome)
            && !retry_granted
        {
            self.gate.on_final_failure(self.gate_now(), class);
        }
        let now = self.machine.retry.now();
        self.machine.gave_up = Some(GaveUp::from_outcome(outcome, now).refused(self.refused));
    }

    /// Drained: waits for the cancel signal, then the running attempt, then the timer.
    #[inline(always)]
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Woken<T, E>> {
        if self.cancel.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woken::Ended(Ended::Canceled));
        }
        if let Some(attempt) = self.running.as_mut().as_pin_mut()
            && let Poll::Ready(result) = poll_attempt(attempt, cx)
        {
            return Poll::Ready(match result {
                Ok(value) => Woken::Succeeded(value),
                Err(Some(error)) => Woken::Ended(Ended::Failed(error)),
                Err(None) => Woken::Ended(Ended::Panicked),
            });
        }
        let Some(sleep) = self.timer.as_mut().as_pin_mut() else {
            // Drained, with neither an attempt nor a sleep: only a panic in code the loop
            // called (a classifier, notify, gate or runtime), caught by the caller, leaves it
            // here. Waiting would be waiting forever.
            if self.running.is_none() {
                panic!(
                    "`RetryFuture` polled again after a panic in code it called (classifier, notify, gate or runtime)"
                );
            }
            return Poll::Pending;
        };
        sleep.poll(cx).map(|_| Woken::Timer)
    }

    /// The running attempt succeeded: the operation is over ([`succeeded`]), and the machine
    /// is told.
    #[inline(always)]
    fn succeed(&mut self) {
        self.running.set(None);
        self.drop_timer();
        succeeded(self.stage, self.gate, self.ticket.take(), self.request);
        let now = self.now();
        let retry = &mut self.machine.retry;
        let attempt = retry.attempt();
        // The attempt is the running one and the machine is drained.
        let _ = retry.handle_success(now, attempt);
        event!(attempts = retry.attempt(), "operation succeeded");
    }

    /// The running attempt ended without a value, or the cancel signal fired: drops the
    /// attempt, any timer and its retry's ticket, and tells the machine (which is drained, and
    /// runs that attempt). An error is classified once its attempt is dropped.
    #[inline(always)]
    fn end_attempt(&mut self, ended: Ended<E>) {
        self.drop_attempt();
        let now = self.now();
        let (retry, mut rng) = self.machine.with_rng(self.seed, self.rt);
        let failure = match ended {
            Ended::Canceled => {
                event!(attempt = retry.attempt(), "operation canceled");
                // A started, unfinished, drained machine accepts a cancel.
                let _ = retry.handle_cancel(now);
                return;
            }
            Ended::Failed(error) => Failure::new(self.classifier.classify(&error), Some(error)),
            Ended::Panicked => Failure::new(FailureKind::Panicked, None),
        };
        event!(attempt = retry.attempt(), class = ?failure.kind.class(), "attempt failed");
        let attempt = retry.attempt();
        // The failed attempt is the running one, and the machine is drained.
        let _ = retry.handle_failure(self.policy, now, attempt, failure, &mut rng);
    }

    /// The timer fired: whatever the machine's `poll_timeout` named (the attempt's deadline or
    /// the sleep's end) is due.
    #[inline(always)]
    fn wake(&mut self) {
        self.timer.set(None);
        let retry = &self.machine.retry;
        let due = retry.poll_timeout().unwrap_or(Instant::ZERO);
        let now = self.machine.timeline.woken(self.rt, retry.now(), due);
        self.end_sleep();
        let (retry, mut rng) = self.machine.with_rng(self.seed, self.rt);
        retry.handle_timeout(self.policy, now, &mut rng);
    }

    /// Drops the running attempt, the timer and the running retry's ticket.
    #[inline(always)]
    fn drop_attempt(&mut self) {
        self.running.set(None);
        self.drop_timer();
        *self.ticket = None;
    }

    /// Drops the timer, ending any sleep.
    #[inline(always)]
    fn drop_timer(&mut self) {
        self.timer.set(None);
        self.end_sleep();
    }

    /// A sleep is over or dropped: an untimed machine's timeline pauses (it runs only while
    /// the machine sleeps, and a sleep cut short counts for nothing).
    #[inline(always)]
    fn end_sleep(&mut self) {
        if !self.machine.timed {
            self.machine.timeline.pause();
        }
    }

    /// The machine's time for an input (see [`Timeline::now`]).
    #[inline(always)]
    fn now(&self) -> Instant {
        self.machine.timeline.now(self.rt, self.machine.retry.now())
    }

    /// What a gate is told about the time: the machine's now when it is the clock's.
    #[inline(always)]
    fn gate_now(&self) -> Option<Instant> {
        self.machine.timed.then(|| self.machine.retry.now())
    }
}

/// The class of the failure `outcome` ended on, if no retry of it was asked for (see
/// [`RetryGate::on_final_failure`]; the caller checks that no granted retry was waiting).
pub(crate) fn final_failure<E>(outcome: &Outcome<E>) -> Option<FailureClass> {
    let class = outcome.last_failure()?.class;
    match outcome.kind() {
        OutcomeKind::Exhausted | OutcomeKind::Deferred | OutcomeKind::OutOfTime => Some(class),
        OutcomeKind::Fatal if class == FailureClass::DoNotRetry => Some(class),
        _ => None,
    }
}
