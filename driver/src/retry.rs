//! The driving loop: a future that runs attempts of an operation under the core's retry machine.

use std::borrow::Borrow;
use std::fmt;
use std::future::{Future, Pending};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use persevere::{Action, Failure, FailureClass, FailureKind, Instant, OutcomeKind, Retry, RetryPolicy};
use pin_project_lite::pin_project;

use crate::classify::{ByTrait, Classifier, Classify, Notify, RetryAll, RetryEvent, RetryGate};
use crate::runtime::Runtime;
use persevere::SplitMix64;

/// What an operation took (rule R5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Stats {
    /// Attempts started.
    pub attempts: u32,
    /// Time spent waiting between attempts.
    pub slept: Duration,
    /// Time from the first attempt's start to the outcome. `None` when the clock was not read
    /// at the first attempt's start: the success path reads no clock unless the policy has a
    /// total budget or an attempt timeout, or [`RetryFuture::measure_elapsed`] asks for it.
    pub elapsed: Option<Duration>,
}

impl Stats {
    /// A first attempt that succeeded without the clock being read.
    const FIRST_ATTEMPT: Stats = Stats { attempts: 1, slept: Duration::ZERO, elapsed: None };
}

/// The result of a retried operation, with its statistics whatever the outcome.
// `repr(C)`, result first: a layout that differs from `Finished`'s for certain (see there).
#[derive(Debug)]
#[must_use = "the operation's result is inside"]
#[repr(C)]
pub struct Retried<T, E> {
    /// The value of the successful attempt, or why the operation gave up.
    pub result: Result<T, GaveUp<E>>,
    /// What it took.
    pub stats: Stats,
}

impl<T, E> Retried<T, E> {
    /// The result alone.
    pub fn into_result(self) -> Result<T, GaveUp<E>> {
        self.result
    }
}

/// Why a retried operation gave up.
#[derive(Debug, PartialEq, Eq)]
pub struct GaveUp<E> {
    /// How it ended: `Exhausted`, `Fatal`, `Canceled`, `OutOfTime` or `Rejected`.
    pub outcome: OutcomeKind,
    /// The class of the last failure, if there was one.
    pub class: Option<FailureClass>,
    /// The last attempt's error; `None` if it timed out or panicked, or none failed.
    pub error: Option<E>,
}

impl<E> GaveUp<E> {
    /// The last attempt's error, if it returned one.
    pub fn into_error(self) -> Option<E> {
        self.error
    }
}

impl<E: fmt::Display> fmt::Display for GaveUp<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.outcome {
            OutcomeKind::Exhausted => "attempt limit reached",
            OutcomeKind::Fatal => "the failure must not be retried",
            OutcomeKind::Canceled => "canceled",
            OutcomeKind::OutOfTime => "the total time budget would be overrun",
            OutcomeKind::Rejected => "a retry budget or breaker refused the retry",
            OutcomeKind::Succeeded => "succeeded",
        };
        write!(f, "gave up: {why}")?;
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

/// The state of an operation that has failed at least once (or reads the clock from its start).
struct Slow<E> {
    machine: Retry<()>,
    rng: Option<SplitMix64>,
    last_error: Option<E>,
    clock_at_start: bool,
    attempt: u32,
    now: Instant,
}

impl<E> Slow<E> {
    /// The machine started at `now` with attempt 1 running.
    fn started(policy: &RetryPolicy, now: Instant, clock_at_start: bool) -> Self {
        let mut machine = Retry::new();
        // A fresh machine accepts its start; its Start action is attempt 1, already running
        // on the fast path and drained by the caller otherwise.
        let _ = machine.handle_start(policy, now);
        Slow { machine, rng: None, last_error: None, clock_at_start, attempt: 1, now }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Fresh,
    Draining,
    Running,
    Sleeping { until: Instant },
    Done,
}

pin_project! {
    #[project = Projection]
    /// A retried operation: runs attempts of `op` under a [`RetryPolicy`] until one succeeds or
    /// the policy gives up. Created by [`retry`]; configure it with its builder methods, then
    /// `.await` it.
    ///
    /// - Zero delays never touch the timer, and the success path reads no clock unless the
    ///   policy needs one.
    /// - An attempt past its deadline is dropped; so are the attempt and any sleep when this
    ///   future is dropped or its [`cancel_on`](Self::cancel_on) signal fires.
    /// - A panic while creating or polling an attempt is caught and counts as a
    ///   [`FailureKind::Panicked`] failure (retried).
    /// - Allocation-free: the future holds everything it needs.
    #[must_use = "futures do nothing unless awaited"]
    pub struct RetryFuture<Rt, P, Op, Fut, E, C = RetryAll, N = (), G = (), S = Pending<()>>
    where
        Rt: Runtime,
    {
        rt: Rt,
        policy: P,
        op: Op,
        classifier: C,
        notify: N,
        gate: G,
        seed: Option<u64>,
        measure_elapsed: bool,
        phase: Phase,
        // Everything the success path does not need, created at the first failure (or at the
        // start when the policy needs the clock). Kept out of the constructor so that creating
        // and moving a fresh future writes a few bytes, not the machine.
        slow: Option<Slow<E>>,
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
///     .notify(|e: &persevere_driver::RetryEvent<'_, &str>| println!("retry {} after {:?}", e.next_attempt, e.delay)),
/// );
/// assert_eq!(done.result, Ok(3));
/// assert_eq!(done.stats.attempts, 3);
/// # Ok::<(), persevere::PolicyError>(())
/// ```
pub fn retry<Rt, P, Op, Fut, T, E>(rt: Rt, policy: P, op: Op) -> RetryFuture<Rt, P, Op, Fut, E>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    RetryFuture {
        rt,
        policy,
        op,
        classifier: RetryAll,
        notify: (),
        gate: (),
        seed: None,
        measure_elapsed: false,
        phase: Phase::Fresh,
        slow: None,
        running: None,
        timer: None,
        cancel: std::future::pending(),
    }
}

impl<Rt: Runtime, P, Op, Fut, E, C, N, G, S> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S> {
    /// Replaces the hooks before the first poll.
    fn map<C2, N2, G2, S2>(
        self,
        hooks: impl FnOnce(C, N, G, S) -> (C2, N2, G2, S2),
    ) -> RetryFuture<Rt, P, Op, Fut, E, C2, N2, G2, S2> {
        let (classifier, notify, gate, cancel) = hooks(self.classifier, self.notify, self.gate, self.cancel);
        RetryFuture {
            rt: self.rt,
            policy: self.policy,
            op: self.op,
            classifier,
            notify,
            gate,
            seed: self.seed,
            measure_elapsed: self.measure_elapsed,
            phase: self.phase,
            slow: self.slow,
            running: self.running,
            timer: self.timer,
            cancel,
        }
    }

    /// Classifies errors with a closure (or any [`Classifier`]): return
    /// [`FailureKind::Fatal`] to stop, [`FailureKind::Hinted`] to honour a `Retry-After`.
    pub fn classify<C2: Classifier<E>>(self, classifier: C2) -> RetryFuture<Rt, P, Op, Fut, E, C2, N, G, S> {
        self.map(|_, n, g, s| (classifier, n, g, s))
    }

    /// Classifies errors with their [`Classify`] implementation.
    pub fn classified(self) -> RetryFuture<Rt, P, Op, Fut, E, ByTrait, N, G, S>
    where
        E: Classify,
    {
        self.classify(ByTrait)
    }

    /// Calls `notify` before each retry with the error, the delay and the next attempt's number.
    pub fn notify<N2: Notify<E>>(self, notify: N2) -> RetryFuture<Rt, P, Op, Fut, E, C, N2, G, S> {
        self.map(|c, _, g, s| (c, notify, g, s))
    }

    /// Asks `gate` (a retry budget, a breaker) before each retry; a refusal ends the operation
    /// with [`OutcomeKind::Rejected`].
    pub fn gate<G2: RetryGate>(self, gate: G2) -> RetryFuture<Rt, P, Op, Fut, E, C, N, G2, S> {
        self.map(|c, n, _, s| (c, n, gate, s))
    }

    /// Cancels the operation when `signal` completes: the running attempt or sleep is dropped
    /// and the result is [`OutcomeKind::Canceled`], with the statistics so far.
    pub fn cancel_on<S2: Future<Output = ()>>(self, signal: S2) -> RetryFuture<Rt, P, Op, Fut, E, C, N, G, S2> {
        self.map(|c, n, g, _| (c, n, g, signal))
    }

    /// Seeds the jitter RNG, for reproducible delays (by default the runtime's
    /// [`entropy`](Runtime::entropy) seeds it on the first failure).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Reads the clock at the first attempt's start so that [`Stats::elapsed`] is always known
    /// (costs one clock read on the success path).
    pub fn measure_elapsed(mut self) -> Self {
        self.measure_elapsed = true;
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

fn rng_of<'a, Rt: Runtime>(slot: &'a mut Option<SplitMix64>, seed: Option<u64>, rt: &Rt) -> &'a mut SplitMix64 {
    slot.get_or_insert_with(|| SplitMix64::new(seed.unwrap_or_else(|| rt.entropy())))
}

/// Calls `op` for a new attempt, catching a panic raised while creating it.
fn create<Op: FnMut() -> Fut, Fut>(op: &mut Op) -> Option<Fut> {
    catch_unwind(AssertUnwindSafe(op)).ok()
}

impl<Rt, P, Op, Fut, T, E, C, N, G, S> Future for RetryFuture<Rt, P, Op, Fut, E, C, N, G, S>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    type Output = Retried<T, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The hot path, kept small enough to inline: a first attempt on a policy that needs no
        // clock, polled to success. Everything else is `drive`.
        let policy: &RetryPolicy = (*this.policy).borrow();
        if *this.phase == Phase::Fresh && !policy.needs_clock() && !*this.measure_elapsed {
            this.gate.on_request(None);
            event!(attempt = 1u32, "attempt starting");
            match create(this.op) {
                Some(fut) => {
                    this.running.set(Some(fut));
                    *this.phase = Phase::Running;
                }
                None => return slow_path(drive(this, cx, Some((FailureKind::Panicked, None)), false)),
            }
        }
        if *this.phase != Phase::Running || this.slow.is_some() {
            return slow_path(drive(this, cx, None, false));
        }
        if this.cancel.as_mut().poll(cx).is_ready() {
            return slow_path(drive(this, cx, None, true));
        }
        let Some(fut) = this.running.as_mut().as_pin_mut() else { return slow_path(drive(this, cx, None, false)) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(Ok(value))) => {
                this.running.set(None);
                this.gate.on_success();
                *this.phase = Phase::Done;
                event!(attempts = 1u32, "operation succeeded");
                Poll::Ready(Retried { result: Ok(value), stats: Stats::FIRST_ATTEMPT })
            }
            // No machine and no deadline yet: nothing else can wake this attempt.
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(Err(error))) => {
                let failed = (this.classifier.classify(&error), Some(error));
                slow_path(drive(this, cx, Some(failed), false))
            }
            Err(_panic) => slow_path(drive(this, cx, Some((FailureKind::Panicked, None)), false)),
        }
    }
}

/// What [`drive`] hands back: a [`Retried`] in another layout (`repr(C)`, stats first), on
/// purpose.
///
/// Were `drive` to return the future's own output type, LLVM would have it write straight into
/// the caller's output slot, which makes that slot memory on the success fast path too: the
/// fast path then stores its result field by field and the caller's wide copies stall on
/// store forwarding (≈ 12 ns per call on the bench). A different layout keeps the conversion
/// (and so the fast path's output) in registers.
#[repr(C)]
struct Finished<T, E> {
    stats: Stats,
    result: Result<T, GaveUp<E>>,
}

/// The slow path's output, moved field by field into the future's.
#[inline(always)]
fn slow_path<T, E>(finished: Poll<Finished<T, E>>) -> Poll<Retried<T, E>> {
    match finished {
        Poll::Ready(Finished { stats, result }) => Poll::Ready(Retried { result, stats }),
        Poll::Pending => Poll::Pending,
    }
}

/// The whole driving loop: drains the machine, runs attempts under their deadlines, sleeps,
/// and feeds results back. `failed` and `canceled` are what the fast path already saw.
#[inline(never)]
fn drive<Rt, P, Op, Fut, T, E, C, N, G, S>(
    mut this: Projection<'_, Rt, P, Op, Fut, E, C, N, G, S>,
    cx: &mut Context<'_>,
    mut failed: Option<(FailureKind, Option<E>)>,
    mut canceled: bool,
) -> Poll<Finished<T, E>>
where
    Rt: Runtime,
    P: Borrow<RetryPolicy>,
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    C: Classifier<E>,
    N: Notify<E>,
    G: RetryGate,
    S: Future<Output = ()>,
{
    let policy: &RetryPolicy = (*this.policy).borrow();
    loop {
        // A failure or cancel the fast path saw is handled before anything else.
        if failed.is_none() && !canceled {
            match *this.phase {
                Phase::Fresh => {
                    // Only a policy that needs the clock gets here fresh; `poll` started the
                    // clock-free fast path itself.
                    let now = this.rt.now();
                    this.gate.on_request(Some(now));
                    *this.slow = Some(Slow::started(policy, now, true));
                    *this.phase = Phase::Draining;
                }
                Phase::Draining => {
                    let Some(slow) = this.slow.as_mut() else { unreachable!("a draining operation has started") };
                    match slow.machine.poll_action() {
                        Some(Action::Start { attempt, deadline }) => {
                            slow.attempt = attempt;
                            event!(attempt, "attempt starting");
                            match create(this.op) {
                                Some(fut) => {
                                    this.running.set(Some(fut));
                                    this.timer.set(deadline.map(|d| this.rt.sleep_until(d)));
                                    *this.phase = Phase::Running;
                                }
                                None => failed = Some((FailureKind::Panicked, None)),
                            }
                        }
                        Some(Action::Abandon { attempt }) => {
                            event!(attempt, "attempt abandoned at its deadline");
                            let _ = attempt;
                            this.running.set(None);
                            this.timer.set(None);
                            slow.last_error = None;
                        }
                        Some(Action::Sleep { next_attempt, delay, until }) => {
                            let class = slow.machine.last_failure().map_or(FailureClass::Retryable, |f| f.class);
                            if !this.gate.allow_retry(slow.now, class) {
                                event!(next_attempt, "retry refused by the gate");
                                // The machine is sleeping, so it accepts the refusal.
                                let _ = slow.machine.handle_rejected(slow.now);
                                continue;
                            }
                            event!(next_attempt, delay_ns = delay.as_nanos() as u64, "retry scheduled");
                            this.notify.notify(&RetryEvent {
                                error: slow.last_error.as_ref(),
                                class,
                                next_attempt,
                                delay,
                            });
                            if until <= slow.now {
                                // A zero delay: straight to the next attempt, no timer.
                                let rng = rng_of(&mut slow.rng, *this.seed, this.rt);
                                slow.machine.handle_timeout(policy, slow.now, rng);
                            } else {
                                this.timer.set(Some(this.rt.sleep_until(until)));
                                *this.phase = Phase::Sleeping { until };
                            }
                        }
                        Some(Action::Finish { outcome, stats }) => {
                            *this.phase = Phase::Done;
                            this.running.set(None);
                            this.timer.set(None);
                            event!(outcome = ?outcome.kind(), attempts = stats.attempts, "operation finished");
                            let stats = Stats {
                                attempts: stats.attempts,
                                slept: stats.slept,
                                elapsed: slow.clock_at_start.then_some(stats.elapsed),
                            };
                            let gave_up = GaveUp {
                                outcome: outcome.kind(),
                                class: outcome.last_failure().map(|f| f.class),
                                error: slow.last_error.take(),
                            };
                            return Poll::Ready(Finished { stats, result: Err(gave_up) });
                        }
                        None => unreachable!("a drained retry machine always ends with Start, Sleep or Finish"),
                    }
                }
                Phase::Running => {
                    if this.cancel.as_mut().poll(cx).is_ready() {
                        canceled = true;
                    } else {
                        let Some(fut) = this.running.as_mut().as_pin_mut() else {
                            unreachable!("an attempt is running in the Running phase")
                        };
                        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                            Ok(Poll::Ready(Ok(value))) => {
                                this.running.set(None);
                                this.timer.set(None);
                                this.gate.on_success();
                                *this.phase = Phase::Done;
                                let stats = match this.slow.as_mut() {
                                    Some(slow) => {
                                        let now = this.rt.now();
                                        // The attempt is the running one, so the machine accepts it.
                                        let _ = slow.machine.handle_success(now, slow.attempt);
                                        let s = slow.machine.stats();
                                        Stats {
                                            attempts: s.attempts,
                                            slept: s.slept,
                                            elapsed: slow.clock_at_start.then_some(s.elapsed),
                                        }
                                    }
                                    None => Stats::FIRST_ATTEMPT,
                                };
                                event!(attempts = stats.attempts, "operation succeeded");
                                return Poll::Ready(Finished { stats, result: Ok(value) });
                            }
                            Ok(Poll::Ready(Err(error))) => {
                                failed = Some((this.classifier.classify(&error), Some(error)));
                            }
                            Err(_panic) => failed = Some((FailureKind::Panicked, None)),
                            Ok(Poll::Pending) => {
                                let Some(timer) = this.timer.as_mut().as_pin_mut() else { return Poll::Pending };
                                if timer.poll(cx).is_pending() {
                                    return Poll::Pending;
                                }
                                // Only a started machine sets an attempt deadline.
                                let Some(slow) = this.slow.as_mut() else { unreachable!("a deadline needs a machine") };
                                this.timer.set(None);
                                let deadline = slow.machine.poll_timeout().unwrap_or(Instant::ZERO);
                                slow.now = this.rt.now().later(deadline);
                                let rng = rng_of(&mut slow.rng, *this.seed, this.rt);
                                slow.machine.handle_timeout(policy, slow.now, rng);
                                *this.phase = Phase::Draining;
                            }
                        }
                    }
                }
                Phase::Sleeping { until } => {
                    if this.cancel.as_mut().poll(cx).is_ready() {
                        canceled = true;
                    } else {
                        let Some(timer) = this.timer.as_mut().as_pin_mut() else {
                            unreachable!("a timer runs in the Sleeping phase")
                        };
                        if timer.poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        let Some(slow) = this.slow.as_mut() else { unreachable!("a sleeping operation has started") };
                        this.timer.set(None);
                        slow.now = this.rt.now().later(until);
                        let rng = rng_of(&mut slow.rng, *this.seed, this.rt);
                        slow.machine.handle_timeout(policy, slow.now, rng);
                        *this.phase = Phase::Draining;
                    }
                }
                Phase::Done => panic!("`RetryFuture` polled after it completed"),
            }
        }
        if failed.is_none() && !canceled {
            continue;
        }
        // The attempt (if any) is over: drop it, read the clock, and start the machine if
        // the fast path had not.
        this.running.set(None);
        this.timer.set(None);
        let now = this.rt.now();
        let slow = this.slow.get_or_insert_with(|| {
            let mut slow = Slow::started(policy, now, false);
            let _ = slow.machine.poll_action();
            slow
        });
        slow.now = now;
        *this.phase = Phase::Draining;
        if canceled {
            event!(attempt = slow.attempt, "operation canceled");
            // A started, unfinished machine accepts a cancel.
            let _ = slow.machine.handle_cancel(now);
        } else if let Some((kind, error)) = failed.take() {
            event!(attempt = slow.attempt, class = ?kind.class(), "attempt failed");
            slow.last_error = error;
            let rng = rng_of(&mut slow.rng, *this.seed, this.rt);
            // The failed attempt is the running one, so the machine accepts its result.
            let _ = slow.machine.handle_failure(policy, now, slow.attempt, Failure::new(kind, ()), rng);
        }
        canceled = false;
    }
}
