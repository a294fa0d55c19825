//! The driving loop: a future that runs attempts of an operation under the core's retry machine.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Pending};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::operation::Operation;

use persevere::rand_core::TryRng;
use persevere::{
    Failure, FailureClass, FailureKind, Instant, Outcome, OutcomeKind, Retry, RetryAction, RetryPolicy, SplitMix64,
    Stats,
};
use pin_project_lite::pin_project;

use crate::classify::{ByTrait, Classifier, Classify, Notify, RetryAll, RetryEvent, RetryGate};
use crate::refusal::{Gate, Refusal};
use crate::runtime::Runtime;

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
// The layout is chosen for the success path: `Result<T, GaveUp<E>>` takes its `Ok` tag from the
// niche of `retry_after`'s nanoseconds (a 4-byte store, not the byte of `outcome`), and in this
// field order every copy the caller makes of an `Ok` reads back whole what was stored. Other
// orders, and `retry_after` as `u64` nanoseconds (the tag then in `outcome`'s byte), measured
// 9.6 to 28 ns against 7.8 on the bench: loads straddling narrower stores.
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

/// The statistics of a first attempt that succeeded before any clock was read.
const FIRST_ATTEMPT: Stats = Stats { attempts: 1, slept: Duration::ZERO, elapsed: None };

/// The core machine and what the driver keeps beside it: nothing that mirrors the machine.
/// Its error type is `Option<E>`: `None` for a panic the driver caught (the machine's own
/// timeouts carry no error either).
struct Machine<E> {
    retry: Retry<Option<E>>,
    /// The jitter RNG, seeded on its first draw (a policy without jitter never seeds one).
    rng: Option<SplitMix64>,
    /// Whether the machine's time is the runtime's clock (read at the first attempt's start and
    /// at every event: a policy with a budget or a deadline, or `measure_elapsed`). Otherwise
    /// the machine runs on its own timeline from `Instant::ZERO`, which only the sleeps move
    /// forward, by as long as they really took: no clock is read unless a sleep is.
    timed: bool,
    /// Untimed: the runtime's clock when the current sleep began.
    slept_from: Instant,
    /// The outcome of an operation that gave up, from the machine's `Finish` until the future
    /// returns it (see [`RetryFuture::slow_path`] for why `drive` does not return it).
    gave_up: Option<GaveUp<E>>,
}

impl<E> Machine<E> {
    /// A machine whose attempt 1 started at `now` and is already running.
    #[inline(always)]
    fn started(policy: &RetryPolicy, now: Instant, timed: bool) -> Self {
        let mut retry = Retry::new();
        // A fresh machine accepts its start; its one action is attempt 1's start, which the
        // caller either acts on (timed) or has already acted on (the fast path).
        let _ = retry.handle_start(policy, now);
        Machine { retry, rng: None, timed, slept_from: Instant::ZERO, gave_up: None }
    }

    /// The statistics so far; `elapsed` only if the clock was read from the start.
    #[inline(always)]
    fn stats(&self) -> Stats {
        let stats = self.retry.stats();
        Stats { elapsed: stats.elapsed.filter(|_| self.timed), ..stats }
    }
}

/// The jitter RNG of one operation, seeded (from the future's seed or the runtime's entropy) on
/// its first draw.
struct LazyRng<'a, Rt> {
    slot: &'a mut Option<SplitMix64>,
    // Read only when seeding: a fresh future's `seed` is its tag alone, and copying the whole
    // `Option<u64>` on every call of `drive` was a 16-byte load over that 8-byte store (a
    // store-forwarding stall, 8% of the failure path).
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

/// How an attempt ended without a value.
enum Ended<E> {
    /// It failed: the error's kind and the error, or a caught panic (`None`).
    Failed(FailureKind, Option<E>),
    /// The cancel signal fired.
    Canceled,
}

/// Where the future is in its own life (not the machine's: that is the machine's to say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Not polled yet.
    Fresh,
    /// Not polled yet, and [`measure_elapsed`](RetryFuture::measure_elapsed) asked for the clock
    /// from the start (one stage rather than a flag beside it: the fast path tests one byte).
    FreshMeasured,
    /// `Fresh`, with the gate's request already made ([`requested`](RetryFuture::requested)).
    FreshRequested,
    /// `FreshMeasured`, with the gate's request already made.
    FreshMeasuredRequested,
    /// Polled: an attempt runs (the first, on the fast path, if there is no machine yet), or
    /// the machine is sleeping.
    Active,
    /// The output was returned.
    Done,
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
        // The machine, created at the first failure (or at the start when the clock is read
        // from the start): a first attempt that succeeds needs none, and creating and moving a
        // fresh future writes a few bytes rather than the machine.
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
        replaced.stage = match replaced.stage {
            Stage::FreshRequested => Stage::Fresh,
            Stage::FreshMeasuredRequested => Stage::FreshMeasured,
            stage => stage,
        };
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
        self.stage = match self.stage {
            Stage::Fresh => Stage::FreshRequested,
            Stage::FreshMeasured => Stage::FreshMeasuredRequested,
            stage => stage,
        };
        self
    }

    /// Reads the clock at the first attempt's start so that [`Stats::elapsed`] is always known
    /// (costs one clock read on the success path).
    pub fn measure_elapsed(mut self) -> Self {
        self.stage = match self.stage {
            Stage::Fresh => Stage::FreshMeasured,
            Stage::FreshRequested => Stage::FreshMeasuredRequested,
            stage => stage,
        };
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

/// Starts a new attempt of `op`, catching a panic raised while creating it.
#[inline(always)]
fn create<Op: Operation>(op: &mut Op) -> Option<Op::Future> {
    catch_unwind(AssertUnwindSafe(|| op.attempt())).ok()
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
        // The slow path is handed the future itself, not this projection: a projection passed
        // by reference is a struct of eight pointers that LLVM builds before the first branch.
        let mut this = self.as_mut().project();
        // The hot path, kept small enough to inline: a first attempt on a policy that needs no
        // clock, polled to success, with no machine. Everything else is `drive`.
        match *this.stage {
            Stage::Fresh | Stage::FreshRequested => {
                let policy: &RetryPolicy = (*this.policy).borrow();
                if policy.needs_clock() {
                    return self.slow_path(cx, None);
                }
                if *this.stage == Stage::Fresh {
                    *this.request = this.gate.on_request(None);
                }
                event!(attempt = 1u64, "attempt starting");
                metric!(metrics::counter!("persevere_attempts_total").increment(1));
                *this.stage = Stage::Active;
                match create(this.op) {
                    Some(fut) => this.running.set(Some(fut)),
                    None => return self.slow_path(cx, Some(Ended::Failed(FailureKind::Panicked, None))),
                }
            }
            // The first attempt still runs, with no machine yet.
            Stage::Active if this.machine.is_none() => {}
            _ => return self.slow_path(cx, None),
        }
        if this.cancel.as_mut().poll(cx).is_ready() {
            return self.slow_path(cx, Some(Ended::Canceled));
        }
        let Some(fut) = this.running.as_mut().as_pin_mut() else { return self.slow_path(cx, None) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(Ok(value))) => {
                this.running.set(None);
                // Over before the gate hears of it: polled again after a panic in the gate, the
                // future says it completed rather than starting over.
                *this.stage = Stage::Done;
                this.gate.on_success(None);
                *this.request = G::Request::default();
                event!(attempts = 1u64, "operation succeeded");
                metric!(metrics::counter!("persevere_operations_total", "outcome" => "succeeded").increment(1));
                Poll::Ready(Retried { result: Ok(value), stats: FIRST_ATTEMPT })
            }
            // No machine and no deadline yet: nothing else can wake this attempt.
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(Err(error))) => {
                // The finished attempt goes before the classifier runs: polled again after a
                // panic in it, the future must not poll that attempt again (and retry it).
                this.running.set(None);
                let failed = Ended::Failed(this.classifier.classify(&error), Some(error));
                self.slow_path(cx, Some(failed))
            }
            Err(_panic) => self.slow_path(cx, Some(Ended::Failed(FailureKind::Panicked, None))),
        }
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
    /// Runs [`drive`](Self::drive) and builds the future's output from what it left.
    ///
    /// `drive` returns only the value (`Some`) or that the operation gave up (`None`, the
    /// [`GaveUp`] left in the machine), which fits in registers for a small `T`; the statistics
    /// are read from the machine here. When `drive` returned the whole output (72 bytes,
    /// through memory), the fast path's output shared that memory at the merge, and the
    /// caller's copies of it stalled on store forwarding (success 28 ns; a third of the failure
    /// path).
    #[inline(always)]
    fn slow_path(mut self: Pin<&mut Self>, cx: &mut Context<'_>, fast_end: Option<Ended<E>>) -> Poll<Retried<T, E>> {
        let Poll::Ready(value) = self.as_mut().drive(cx, fast_end) else { return Poll::Pending };
        // `drive` leaves the machine in place whenever it returns.
        let Some(machine) = self.project().machine.as_mut() else {
            unreachable!("the driver holds a machine when it is done")
        };
        let stats = machine.stats();
        let result = match value {
            Some(value) => Ok(value),
            None => {
                let GaveUp { outcome, class, refused_by, error, retry_after } =
                    machine.gave_up.take().unwrap_or_else(|| unreachable!("the driver kept how it gave up"));
                // Rebuilt field by field: moved whole, the bytes between the two fields an `Ok`
                // writes became one 16-byte block, stored as one and read back by the caller
                // as two 8-byte loads (a store-forwarding stall on the success path,
                // 8.2 → 7.8 ns).
                Err(GaveUp { outcome, class, refused_by, error, retry_after })
            }
        };
        Poll::Ready(Retried { result, stats })
    }

    /// The whole driving loop ([`run`]): drains the machine, runs attempts under their
    /// deadlines, sleeps, and feeds results back. `fast_end` is how the fast path's attempt
    /// ended, if it did.
    ///
    /// Returns the successful attempt's value, or `None` when the operation gave up (how, in
    /// [`Machine::gave_up`]).
    #[inline(never)]
    fn drive(self: Pin<&mut Self>, cx: &mut Context<'_>, fast_end: Option<Ended<E>>) -> Poll<Option<T>> {
        let this = self.project();
        let hooks = Hooks {
            op: &mut *this.op,
            classifier: &mut *this.classifier,
            notify: &mut *this.notify,
            gate: &*this.gate,
            ticket: &mut *this.ticket,
            request: &mut *this.request,
        };
        run(
            (*this.policy).borrow(),
            &*this.rt,
            &*this.seed,
            hooks,
            this.stage,
            this.machine,
            this.running,
            this.timer,
            this.cancel,
            cx,
            fast_end,
        )
    }
}

/// The user's code that [`run`] calls, and the gate's ticket.
struct Hooks<'a, Op, C, N, G: RetryGate> {
    op: &'a mut Op,
    classifier: &'a mut C,
    notify: &'a mut N,
    gate: &'a G,
    ticket: &'a mut Option<G::Ticket>,
    request: &'a mut G::Request,
}

/// [`RetryFuture::drive`]'s body, with the policy, the machine and each part of the future as
/// its own argument rather than one projection struct in memory.
///
/// The loop drains the machine after each input, acting on each action as it comes, then
/// waits for the attempt, the timer or the cancel signal, and feeds what happened back. The
/// machine is worked on in place: its `poll_action`, `handle_failure` and `handle_timeout`
/// inline here, so a zero-delay failure is a straight run of loads, tests and stores with no
/// call. (Out of line, `poll_action` read the fields that `handle_timeout` had just stored one
/// by one back with a 16-byte load: a store-forwarding stall, most of its 35% of the time.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn run<Rt, Op, Fut, T, E, C, N, G, S>(
    policy: &RetryPolicy,
    rt: &Rt,
    seed: &Option<u64>,
    hooks: Hooks<'_, Op, C, N, G>,
    stage: &mut Stage,
    slot: &mut Option<Machine<E>>,
    mut running: Pin<&mut Option<Fut>>,
    mut timer: Pin<&mut Option<Rt::Sleep>>,
    mut cancel: Pin<&mut S>,
    cx: &mut Context<'_>,
    fast_end: Option<Ended<E>>,
) -> Poll<Option<T>>
where
    Rt: Runtime,
    Op: Operation<Future = Fut>,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    let Hooks { op, classifier, notify, gate, ticket, request } = hooks;
    if *stage == Stage::Done {
        panic!("`RetryFuture` polled after it completed");
    }
    if slot.is_none() {
        if matches!(*stage, Stage::Fresh | Stage::FreshMeasured | Stage::FreshRequested | Stage::FreshMeasuredRequested)
        {
            // The clock is read from the start: a budget, a deadline, or `measure_elapsed`.
            let now = rt.now();
            if matches!(*stage, Stage::Fresh | Stage::FreshMeasured) {
                *request = gate.on_request(Some(now));
            }
            *stage = Stage::Active;
            *slot = Some(Machine::started(policy, now, true));
        } else {
            // The fast path's first attempt ended (or the cancel fired): from now on the
            // machine decides, on its own timeline.
            let machine = slot.insert(Machine::started(policy, Instant::ZERO, false));
            // Attempt 1's start: already acted on by the fast path.
            let _ = machine.retry.poll_action();
        }
    }
    // The machine is worked on where it is. (Moved into a local for the call, to be kept in
    // registers, it took more instructions, not fewer: it does not fit in them.)
    let Some(Machine { retry, rng, timed, slept_from, gave_up }) = slot else { unreachable!() };
    let timed = *timed;
    let mut rng = LazyRng { slot: rng, seed, rt };
    let rng = &mut rng;
    // The `now` of an event: the clock on a timed machine, the machine's own time otherwise.
    macro_rules! now {
        () => {
            if timed { rt.now() } else { retry.now() }
        };
    }

    // The attempt ended without a value, or the cancel fired: drop the attempt, any timer and
    // its retry's ticket, and tell the machine (which is drained, and runs that attempt).
    macro_rules! end {
        ($ended:expr) => {{
            running.set(None);
            timer.set(None);
            *ticket = None;
            end_attempt(retry, policy, now!(), rng, $ended);
        }};
    }

    if let Some(ended) = fast_end {
        end!(ended);
    }
    // The gate's refusal of the retry the machine asked for, which ends the operation.
    let mut refused: Option<Refusal> = None;
    loop {
        // Drain what the last input left, acting on each action in turn.
        while let Some(action) = retry.poll_action() {
            match action {
                RetryAction::Start { attempt, deadline } => {
                    event!(attempt, "attempt starting");
                    metric!(metrics::counter!("persevere_attempts_total").increment(1));
                    let _ = attempt;
                    match create(op) {
                        Some(fut) => {
                            running.set(Some(fut));
                            // No timer runs when an attempt starts: every input that leads to
                            // a start (the start itself, a sleep's end, a failure) left none.
                            // Not `set(deadline.map(..))`, which copies a whole
                            // `Option<Sleep>`, payload and all, also for `None`.
                            debug_assert!(timer.is_none());
                            if let Some(deadline) = deadline {
                                timer.set(Some(rt.sleep_until(deadline)));
                            }
                        }
                        None => end!(Ended::Failed(FailureKind::Panicked, None)),
                    }
                }
                RetryAction::Abandon { attempt } => {
                    event!(attempt, "attempt abandoned");
                    let _ = attempt;
                    running.set(None);
                    timer.set(None);
                    *ticket = None;
                }
                RetryAction::Sleep { next_attempt, delay, until } => {
                    let failure = retry.last_failure();
                    let class = failure.map_or(FailureClass::Retryable, |f| f.class);
                    // What the gate is told about the time: the machine's `now` when it is the
                    // clock's.
                    match gate.try_retry(timed.then(|| retry.now()), class) {
                        Ok(granted) => *ticket = Some(granted),
                        Err(refusal) => {
                            // The machine finishes on the refusal in this same drain.
                            refused = Some(refusal);
                            event!(next_attempt, "retry refused by the gate");
                            metric!(metrics::counter!("persevere_retries_refused_total").increment(1));
                            // The machine is sleeping and drained, so it accepts the refusal.
                            let _ = retry.handle_rejected(policy, retry.now());
                            continue;
                        }
                    }
                    event!(next_attempt, delay_ns = delay.as_nanos() as u64, "retry scheduled");
                    metric!(metrics::counter!("persevere_retries_total").increment(1));
                    metric!(metrics::histogram!("persevere_retry_delay_seconds").record(delay.as_secs_f64()));
                    notify.notify(&RetryEvent {
                        error: failure.and_then(|f| f.error.as_ref()).and_then(Option::as_ref),
                        class,
                        next_attempt,
                        delay,
                    });
                    // `delay` is `until - now`, so a zero delay is an `until` not past `now`:
                    // the same test, without reading the `Duration` back.
                    let now = retry.now();
                    if until <= now {
                        // A zero delay: straight to the next attempt, no timer, no clock.
                        retry.handle_timeout(policy, now, rng);
                    } else if timed {
                        timer.set(Some(rt.sleep_until(until)));
                    } else {
                        *slept_from = rt.now();
                        timer.set(Some(rt.sleep_until(slept_from.saturating_add(delay))));
                    }
                }
                RetryAction::Finish { outcome, stats } => {
                    *stage = Stage::Done;
                    running.set(None);
                    timer.set(None);
                    // A ticket still held: the last failure's retry was granted (and charged),
                    // and the operation ended waiting for it (its total budget ran out).
                    let retry_granted = ticket.take().is_some();
                    *request = G::Request::default();
                    let _ = stats;
                    event!(outcome = ?outcome.kind(), attempts = stats.attempts, "operation finished");
                    metric!(
                        metrics::counter!("persevere_operations_total", "outcome" => outcome_label(outcome.kind()))
                            .increment(1)
                    );
                    if let Some(class) = final_failure(&outcome)
                        && !retry_granted
                    {
                        gate.on_final_failure(timed.then(|| retry.now()), class);
                    }
                    *gave_up = Some(GaveUp::from_outcome(outcome, retry.now()).refused(refused));
                    return Poll::Ready(None);
                }
            }
        }
        // Drained: wait for the running attempt or the sleep (or the cancel signal).
        if cancel.as_mut().poll(cx).is_ready() {
            end!(Ended::Canceled);
            continue;
        }
        if let Some(fut) = running.as_mut().as_pin_mut() {
            match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                Ok(Poll::Ready(Ok(value))) => {
                    running.set(None);
                    timer.set(None);
                    // Over before the gate hears of it (as on the fast path).
                    *stage = Stage::Done;
                    gate.on_success(ticket.take());
                    *request = G::Request::default();
                    let attempt = retry.attempt();
                    // The attempt is the running one and the machine is drained.
                    let _ = retry.handle_success(policy, now!(), attempt);
                    event!(attempts = retry.attempt(), "operation succeeded");
                    metric!(metrics::counter!("persevere_operations_total", "outcome" => "succeeded").increment(1));
                    return Poll::Ready(Some(value));
                }
                Ok(Poll::Ready(Err(error))) => {
                    end!(Ended::Failed(classifier.classify(&error), Some(error)));
                    continue;
                }
                Err(_panic) => {
                    end!(Ended::Failed(FailureKind::Panicked, None));
                    continue;
                }
                Ok(Poll::Pending) => {}
            }
        }
        let Some(sleep) = timer.as_mut().as_pin_mut() else {
            // Drained, with neither an attempt nor a sleep: only a panic in code the loop
            // called (a classifier, notify, gate or runtime), caught by the caller, leaves it
            // here. Waiting would be waiting forever.
            if running.is_none() {
                panic!(
                    "`RetryFuture` polled again after a panic in code it called (classifier, notify, gate or runtime)"
                );
            }
            return Poll::Pending;
        };
        if sleep.poll(cx).is_pending() {
            return Poll::Pending;
        }
        timer.set(None);
        // The deadline or the sleep is over: whatever `poll_timeout` named is due.
        let due = retry.poll_timeout().unwrap_or(Instant::ZERO);
        let now = if timed {
            rt.now().later(due)
        } else {
            // The sleep took as long as it really took, and at least its delay.
            let slept = rt.now().saturating_duration_since(*slept_from);
            retry.now().saturating_add(slept).later(due)
        };
        retry.handle_timeout(policy, now, rng);
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

/// The running attempt ended without a value at `now`, or the cancel signal fired (the attempt,
/// if any, is already dropped): tell the machine, which is drained and runs that attempt.
#[inline(always)]
fn end_attempt<Rt: Runtime, E>(
    retry: &mut Retry<Option<E>>,
    policy: &RetryPolicy,
    now: Instant,
    rng: &mut LazyRng<'_, Rt>,
    ended: Ended<E>,
) {
    match ended {
        Ended::Canceled => {
            event!(attempt = retry.attempt(), "operation canceled");
            // A started, unfinished, drained machine accepts a cancel.
            let _ = retry.handle_cancel(policy, now);
        }
        Ended::Failed(kind, error) => {
            event!(attempt = retry.attempt(), class = ?kind.class(), "attempt failed");
            let attempt = retry.attempt();
            // The failed attempt is the running one, and the machine is drained.
            let _ = retry.handle_failure(policy, now, attempt, Failure::new(kind, error), rng);
        }
    }
}
