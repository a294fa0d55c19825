//! A shared circuit breaker for async calls, driven by the core's [`persevere::Breaker`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use persevere::{
    BreakerError, BreakerEvent, BreakerPolicy, BreakerStatus, CallOutcome, FailureClass, Instant, Permit, SplitMix64,
    WindowCounts,
};

use crate::classify::RetryGate;
use crate::listeners::Listeners;
use crate::refusal::{Gate, Refusal};
use crate::runtime::Runtime;
use crate::sync::shared::{AtomicU64, Mutex, MutexGuard, Ordering, lock};

/// Why [`Breaker::call`] did not return the call's value.
///
/// An [`Error`](std::error::Error) (and, when `E` is `Send + Sync`, one that `?` turns into a
/// `Box<dyn Error + Send + Sync>`, tower's `BoxError`) for any `E` that is `Debug + Display +
/// 'static`, boxed errors included (T4): its [`source`](std::error::Error::source) is the
/// call's error when that is a boxed error; any other error is in the message.
#[derive(Debug, PartialEq, Eq)]
pub enum CallError<E> {
    /// The breaker is open (or isolated): the call was not made.
    Rejected {
        /// How long until a call may be admitted again; `None` while isolated by hand.
        retry_after: Option<Duration>,
    },
    /// The call was made and failed.
    Failed(E),
}

impl<E: fmt::Display> fmt::Display for CallError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Rejected { retry_after: Some(d) } => write!(f, "circuit open: retry after {d:?}"),
            CallError::Rejected { retry_after: None } => write!(f, "circuit isolated by hand"),
            CallError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl<E> CallError<E> {
    /// The breaker's refusal, if it refused the call: [`Gate::Breaker`] and its
    /// `retry_after`.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            CallError::Rejected { retry_after } => Some(Refusal::new(Gate::Breaker, *retry_after)),
            CallError::Failed(_) => None,
        }
    }
}

impl<E: fmt::Debug + fmt::Display + 'static> std::error::Error for CallError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CallError::Failed(e) => boxed_error(e),
            CallError::Rejected { .. } => None,
        }
    }
}

/// `error` as an [`Error`](std::error::Error) when it is a boxed one (tower's `BoxError` and its
/// kin): what an error generic over any `Debug + Display` type can name as its source. (An
/// impl for `E: Error` beside one for boxed errors is refused by coherence: the standard
/// library may one day make `Box<dyn Error>` an `Error`.)
#[doc(hidden)]
pub fn boxed_error<E: 'static>(error: &E) -> Option<&(dyn std::error::Error + 'static)> {
    use std::error::Error;
    let any: &dyn std::any::Any = error;
    if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send + Sync>>() {
        return Some(&**boxed);
    }
    if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send>>() {
        return Some(&**boxed);
    }
    any.downcast_ref::<Box<dyn Error>>().map(|boxed| &**boxed)
}

struct State {
    breaker: persevere::Breaker,
    rng: SplitMix64,
}

struct Shared<Rt> {
    policy: BreakerPolicy,
    runtime: Rt,
    state: Mutex<State>,
    /// Told of each transition, in the order they were added, after the state's lock is
    /// released. Locked only when the state changes.
    listeners: Listeners<BreakerEvent>,
    /// [`clean_token`] of the state's generation while the breaker is clean: closed with no
    /// failure streak and no rate window (or disabled), where a call needs no permit and a
    /// success changes nothing, so neither takes the lock nor reads the clock. [`NOT_CLEAN`]
    /// otherwise. Written under the lock, after every input.
    clean: AtomicU64,
}

/// [`Shared::clean`] when the breaker is not clean.
const NOT_CLEAN: u64 = 0;

/// What [`Shared::clean`] holds while the breaker is clean in state `generation`: never
/// [`NOT_CLEAN`], and different for every generation, so that a call admitted on the clean
/// path can tell, when it ends, whether the state it was admitted in is still the current one.
fn clean_token(generation: u32) -> u64 {
    u64::from(generation) + 1
}

/// A circuit breaker shared by many tasks: cheap to clone, one state behind it (rules K1–K5).
///
/// [`call`](Self::call) asks for admission, runs the call, and records its outcome. While the
/// breaker is closed with no failure streak and the policy has no rate rule, admission and a
/// successful record are one atomic load each: no lock, no clock read. Everything else goes
/// through the core machine under a mutex. Dropping a call's future before it completes
/// releases its permit without counting anything, so a canceled probe cannot wedge the breaker
/// (and a lost one expires at its lease deadline).
pub struct Breaker<Rt> {
    shared: Arc<Shared<Rt>>,
}

impl<Rt> Clone for Breaker<Rt> {
    fn clone(&self) -> Self {
        Breaker { shared: self.shared.clone() }
    }
}

impl<Rt> fmt::Debug for Breaker<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.shared.lock().breaker.status();
        f.debug_struct("Breaker").field("status", &status).finish_non_exhaustive()
    }
}

impl<Rt> Shared<Rt> {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn refresh(&self, state: &State) {
        let clean = match state.breaker.status() {
            BreakerStatus::Closed => state.breaker.consecutive_failures() == 0 && !self.policy.counts_every_call(),
            BreakerStatus::Disabled => true,
            _ => false,
        };
        let token = if clean { clean_token(state.breaker.generation()) } else { NOT_CLEAN };
        self.clean.store(token, Ordering::Release);
    }
}

/// What a call's result says about the dependency behind a [`Breaker`]: the classifier
/// parameter of [`BreakerCall`]. [`Breaker::call`] uses [`ByResult`]; [`Breaker::call_classified`]
/// takes any closure `FnOnce(&Result<T, E>) -> CallOutcome`, which implements this trait.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot say what a `Result<{T}, {E}>` means for a circuit breaker",
    label = "not a breaker classifier for these results",
    note = "a breaker classifier is `ByResult` (every `Err` a failure), `ByStatus` for HTTP responses (persevere-tower), or a closure `|result: &Result<T, E>| CallOutcome::Success` (or `Failure`, `Ignored`)"
)]
pub trait CallClassifier<T, E> {
    /// The outcome to record for `result`.
    fn outcome(self, result: &Result<T, E>) -> CallOutcome;
}

// Not recommended in diagnostics: a type that is no breaker classifier is reported as such,
// with the trait's message, rather than as a closure it is not.
#[diagnostic::do_not_recommend]
impl<T, E, F: FnOnce(&Result<T, E>) -> CallOutcome> CallClassifier<T, E> for F {
    #[inline]
    fn outcome(self, result: &Result<T, E>) -> CallOutcome {
        self(result)
    }
}

/// What [`Breaker::call`] classifies by: every `Ok` is a success and every `Err` a failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByResult;

impl<T, E> CallClassifier<T, E> for ByResult {
    #[inline]
    fn outcome(self, result: &Result<T, E>) -> CallOutcome {
        if result.is_ok() { CallOutcome::Success } else { CallOutcome::Failure }
    }
}

/// How a [`BreakerCall`] reaches its breaker: by borrow ([`Breaker::call`]) or by a counted
/// reference of its own ([`Breaker::call_owned`]).
enum Holder<'a, Rt> {
    Borrowed(&'a Shared<Rt>),
    Owned(Arc<Shared<Rt>>),
}

impl<Rt> Holder<'_, Rt> {
    #[inline(always)]
    fn get(&self) -> &Shared<Rt> {
        match self {
            Holder::Borrowed(shared) => shared,
            Holder::Owned(shared) => shared,
        }
    }
}

/// Where a [`BreakerCall`] stands with the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Not yet asked (before the first poll).
    Asking,
    /// Admitted on the clean path, in the state whose [`clean_token`] this is: no permit. A
    /// failure is recorded as a call of that state; so is a success if the breaker is no longer
    /// clean in that state when it ends (a failure was counted meanwhile).
    Clean(u64),
    /// Admitted with a permit, to be recorded with the outcome (or released if dropped).
    Permit(Permit),
    /// Finished: rejected, or the outcome is recorded.
    Done,
}

pin_project! {
    /// A call through a [`Breaker`], created by [`Breaker::call`] and
    /// [`Breaker::call_classified`]: asks for admission at its first poll, runs the call, and
    /// records the outcome.
    ///
    /// Dropping it before the call completes releases its permit without counting anything
    /// ([`CallOutcome::Ignored`]), so a canceled probe cannot wedge the breaker. The call
    /// future is pinned in place from the start: nothing is moved between polls.
    ///
    /// [`Breaker::call_owned`] returns one that holds the breaker itself (`'static` when the
    /// call and the runtime are), for a future that must outlive the borrow, such as a tower
    /// service's.
    #[must_use = "futures do nothing unless awaited"]
    pub struct BreakerCall<'a, Rt: Runtime, F, C> {
        shared: Holder<'a, Rt>,
        classify: Option<C>,
        admission: Admission,
        #[pin]
        call: F,
    }

    impl<'a, Rt: Runtime, F, C> PinnedDrop for BreakerCall<'a, Rt, F, C> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Admission::Permit(permit) = *this.admission {
                this.shared.get().record(permit, CallOutcome::Ignored);
            }
        }
    }
}

impl<'a, Rt: Runtime, F, C> BreakerCall<'a, Rt, F, C> {
    fn new(shared: Holder<'a, Rt>, call: F, classify: C) -> Self {
        BreakerCall { shared, classify: Some(classify), admission: Admission::Asking, call }
    }
}

impl<Rt, F, C, T, E> Future for BreakerCall<'_, Rt, F, C>
where
    Rt: Runtime,
    F: Future<Output = Result<T, E>>,
    C: CallClassifier<T, E>,
{
    type Output = Result<T, CallError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let shared: &Shared<Rt> = this.shared.get();
        assert!(this.classify.is_some(), "`BreakerCall` polled after it completed");
        if *this.admission == Admission::Asking {
            let token = shared.clean.load(Ordering::Acquire);
            *this.admission = if token != NOT_CLEAN {
                Admission::Clean(token)
            } else {
                match shared.acquire() {
                    Ok(permit) => Admission::Permit(permit),
                    Err(rejected) => {
                        *this.admission = Admission::Done;
                        *this.classify = None;
                        return Poll::Ready(Err(rejected));
                    }
                }
            };
        }
        let result = match this.call.poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => return Poll::Pending,
        };
        let Some(classify) = this.classify.take() else { unreachable!("checked on entry") };
        let outcome = classify.outcome(&result);
        match std::mem::replace(this.admission, Admission::Done) {
            Admission::Permit(permit) => shared.record(permit, outcome),
            // A success while the state it was admitted in is still clean changes nothing.
            Admission::Clean(token)
                if outcome == CallOutcome::Failure
                    || (outcome == CallOutcome::Success && shared.clean.load(Ordering::Acquire) != token) =>
            {
                shared.record_clean(token, outcome)
            }
            _ => {}
        }
        Poll::Ready(result.map_err(CallError::Failed))
    }
}

impl<Rt: Runtime> Shared<Rt> {
    /// Runs `change` on the core machine under the lock, at the clock's `now`, then refreshes
    /// the lock-free flag. Every input to the machine goes through here.
    fn update<X>(
        &self,
        change: impl FnOnce(&mut persevere::Breaker, &BreakerPolicy, Instant, &mut SplitMix64) -> X,
    ) -> X {
        let mut state = self.lock();
        let now = self.runtime.now();
        let State { breaker, rng } = &mut *state;
        let out = change(breaker, &self.policy, now, rng);
        // One input makes at most three events; the core keeps four.
        let events: [Option<BreakerEvent>; 4] = std::array::from_fn(|_| breaker.poll_event());
        self.refresh(&state);
        drop(state);
        for event in events.into_iter().flatten() {
            self.transitioned(event);
        }
        out
    }

    /// Tells the listeners and the log of `transition`, outside the state's lock.
    #[cold]
    fn transitioned(&self, transition: BreakerEvent) {
        #[cfg(feature = "tracing")]
        {
            let open_for_ns = transition.open_for().map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            tracing::info!(
                target: "persevere::breaker",
                from = ?transition.from,
                to = ?transition.to,
                reason = ?transition.reason,
                generation = transition.generation,
                open_for_ns,
                "breaker transition"
            );
        }
        #[cfg(feature = "metrics")]
        {
            let to = match transition.to {
                BreakerStatus::Closed => "closed",
                BreakerStatus::Open { .. } => "open",
                BreakerStatus::HalfOpen { .. } => "half_open",
                BreakerStatus::Isolated => "isolated",
                BreakerStatus::Disabled => "disabled",
                BreakerStatus::MetricsOnly => "metrics_only",
            };
            metrics::counter!("persevere_breaker_transitions_total", "to" => to).increment(1);
        }
        self.listeners.tell(&transition);
    }

    /// Admission through the core machine (every call while the breaker is not clean, e.g.
    /// with a rate rule).
    fn acquire<E>(&self) -> Result<Permit, CallError<E>> {
        self.update(|breaker, policy, now, rng| breaker.try_acquire(policy, now, rng))
            .map_err(|r| CallError::Rejected { retry_after: r.retry_after })
    }

    /// Records the outcome of the call made with `permit`.
    fn record(&self, permit: Permit, outcome: CallOutcome) {
        // A permit from an earlier state (the breaker moved on while the call ran) is refused
        // as stale; that is the documented race, and nothing is lost by ignoring it.
        self.update(|breaker, policy, now, rng| {
            let _ = breaker.record(policy, now, permit, outcome, rng);
        });
    }

    /// The outcome of a call admitted on the clean path in the state whose [`clean_token`] is
    /// `token`: counted as a call of that state, made now (a clean state has no rate rule, so
    /// the call's duration does not count). If the breaker has changed state since, the
    /// outcome is stale and ignored, as a permit from that state would be (K4): a call admitted
    /// before the breaker opened cannot take a later half-open probe.
    #[cold]
    fn record_clean(&self, token: u64, outcome: CallOutcome) {
        self.update(|breaker, policy, now, rng| {
            if clean_token(breaker.generation()) != token {
                return;
            }
            if let Ok(permit) = breaker.try_acquire(policy, now, rng) {
                let _ = breaker.record(policy, now, permit, outcome, rng);
            }
        });
    }
}

impl<Rt: Runtime + Default> Breaker<Rt> {
    /// A breaker with `policy` on the default runtime of its adapter.
    pub fn new(policy: BreakerPolicy) -> Self {
        Breaker::with_runtime(Rt::default(), policy)
    }
}

impl<Rt: Runtime> Breaker<Rt> {
    /// A breaker with `policy` on `runtime`'s clock.
    pub fn with_runtime(runtime: Rt, policy: BreakerPolicy) -> Self {
        let state = State { breaker: persevere::Breaker::new(&policy, 0), rng: SplitMix64::new(runtime.entropy()) };
        let shared = Shared {
            policy,
            runtime,
            state: Mutex::new(state),
            listeners: Listeners::new(),
            clean: AtomicU64::new(NOT_CLEAN),
        };
        shared.refresh(&shared.lock());
        Breaker { shared: Arc::new(shared) }
    }

    /// Runs `call` if the breaker admits it; an `Err` counts as a failure, an `Ok` as a success
    /// (slow if it took at least the policy's slow-call threshold).
    ///
    /// The returned future resolves to [`CallError::Rejected`] while the breaker is open or
    /// isolated (the call is never polled; it is dropped with the returned future), and to
    /// [`CallError::Failed`] with the call's own error.
    pub fn call<T, E, F>(&self, call: F) -> BreakerCall<'_, Rt, F, ByResult>
    where
        F: Future<Output = Result<T, E>>,
    {
        BreakerCall::new(Holder::Borrowed(&self.shared), call, ByResult)
    }

    /// Like [`call`](Self::call), with `classify` deciding what the result says about the
    /// dependency (for example, an invalid-request error is [`CallOutcome::Ignored`]).
    pub fn call_classified<T, E, F, C>(&self, call: F, classify: C) -> BreakerCall<'_, Rt, F, C>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&Result<T, E>) -> CallOutcome,
    {
        BreakerCall::new(Holder::Borrowed(&self.shared), call, classify)
    }

    /// Like [`call_classified`](Self::call_classified), for a future that must not borrow the
    /// breaker: the returned call holds a reference of its own (one more reference count, so
    /// one atomic increment and decrement per call). It is `'static` when the call, the
    /// classifier and the runtime are.
    pub fn call_owned<T, E, F, C>(&self, call: F, classify: C) -> BreakerCall<'static, Rt, F, C>
    where
        Rt: 'static,
        F: Future<Output = Result<T, E>>,
        C: CallClassifier<T, E>,
    {
        BreakerCall::new(Holder::Owned(self.shared.clone()), call, classify)
    }

    /// The breaker's state now.
    pub fn status(&self) -> BreakerStatus {
        self.shared.update(|breaker, policy, now, rng| {
            breaker.handle_timeout(policy, now, rng);
            breaker.status()
        })
    }

    /// Calls admitted with a permit in the breaker's current state whose outcome is not yet
    /// recorded: while closed with a failure streak or a rate rule (or disabled), the calls in
    /// flight; half-open, the probes out; open or isolated, none. A call admitted on the
    /// lock-free clean path (closed, no streak, no rate rule) holds no permit and is not
    /// counted. Every call records or releases its permit when it ends or is dropped, so once
    /// the calls of a state are done this is 0: a figure that stays above 0 is a leak.
    pub fn outstanding_permits(&self) -> u32 {
        self.shared.lock().breaker.outstanding_permits()
    }

    /// Calls `listener` with each transition from now on (the core's [`BreakerEvent`], with the
    /// rule that made it): opened, half-open, closed, isolated, disabled, metrics-only.
    ///
    /// Listeners are called in the order they were added, by the task whose call (or
    /// `status`, `isolate`, …) made the change, after the breaker's lock is released, one
    /// transition at a time. Two transitions made at nearly the same moment by two tasks may
    /// be heard in either order; [`BreakerEvent::generation`] orders them. A listener
    /// must be quick; it may call the breaker and add listeners (no lock is held while it runs).
    /// A panic in a listener is caught and ignored. The closed path that takes no lock calls
    /// nothing: it makes no transition.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use persevere::{Backoff, BreakerPolicy, BreakerStatus};
    /// use persevere_driver::Breaker;
    /// # #[derive(Default)]
    /// # struct Clock;
    /// # impl persevere_driver::Runtime for Clock {
    /// #     type Sleep = std::future::Ready<()>;
    /// #     fn now(&self) -> persevere::Instant { persevere::Instant::ZERO }
    /// #     fn sleep_until(&self, _: persevere::Instant) -> Self::Sleep { std::future::ready(()) }
    /// # }
    ///
    /// let policy = BreakerPolicy::builder(Backoff::constant(Duration::from_secs(1)).build()?).consecutive_failures(1).build()?;
    /// let breaker = Breaker::with_runtime(Clock, policy);
    /// let heard = Arc::new(Mutex::new(Vec::new()));
    /// let log = heard.clone();
    /// breaker.on_transition(move |t| log.lock().unwrap().push((t.from, t.to)));
    /// breaker.isolate();
    /// breaker.reset();
    /// assert_eq!(*heard.lock().unwrap(), [
    ///     (BreakerStatus::Closed, BreakerStatus::Isolated),
    ///     (BreakerStatus::Isolated, BreakerStatus::Closed),
    /// ]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_transition(&self, listener: impl Fn(&BreakerEvent) + Send + Sync + 'static) {
        self.shared.listeners.add(listener);
    }

    /// Opens the breaker by hand, as a trip rule would: for the next open duration, after
    /// which it turns half-open on its own.
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] when it is open already or metrics-only; nothing
    /// changes.
    pub fn open(&self) -> Result<(), BreakerError> {
        self.shared.update(|breaker, policy, now, rng| breaker.handle_open(policy, now, rng))
    }

    /// Turns an open or isolated breaker half-open by hand: probes are admitted at once.
    ///
    /// # Errors
    /// [`BreakerError::IllegalTransition`] from any other state; nothing changes.
    pub fn half_open(&self) -> Result<(), BreakerError> {
        self.shared.update(|breaker, policy, now, rng| breaker.handle_half_open(policy, now, rng))
    }

    /// Forces the breaker closed but counting (resilience4j's `METRICS_ONLY`): every call is
    /// admitted and counted, nothing trips it, until [`reset`](Self::reset).
    pub fn metrics_only(&self) {
        self.shared.update(|breaker, policy, now, _| breaker.handle_metrics_only(policy, now));
    }

    /// Closed or metrics-only: the calls, failures and slow calls in the window, and the
    /// consecutive failures (see [`persevere::Breaker::window_counts`]).
    pub fn window_counts(&self) -> Option<WindowCounts> {
        self.shared.lock().breaker.window_counts()
    }

    /// Forces the breaker open until [`reset`](Self::reset).
    pub fn isolate(&self) {
        self.shared.update(|breaker, _, now, _| breaker.handle_isolate(now));
    }

    /// Forces the breaker closed, counting nothing, until [`reset`](Self::reset).
    pub fn disable(&self) {
        self.shared.update(|breaker, _, now, _| breaker.handle_disable(now));
    }

    /// Closes the breaker by hand, from any state, and returns it to automatic operation, with
    /// empty counts.
    pub fn reset(&self) {
        self.shared.update(|breaker, policy, now, _| breaker.handle_reset(policy, now));
    }
}

impl<Rt: Runtime> Breaker<Rt> {
    /// The refusal a call would meet now: open (with the time left until it turns half-open)
    /// or isolated by hand; `None` when calls are admitted.
    fn refusal(&self) -> Option<Refusal> {
        self.shared.update(|breaker, policy, now, rng| {
            breaker.handle_timeout(policy, now, rng);
            match breaker.status() {
                BreakerStatus::Open { until } => {
                    Some(Refusal::new(Gate::Breaker, Some(until.saturating_duration_since(now))))
                }
                BreakerStatus::Isolated => Some(Refusal::new(Gate::Breaker, None)),
                _ => None,
            }
        })
    }
}

/// A breaker vetoes retries while it would reject calls: retrying into an open circuit only
/// adds load (U4). Its refusal carries the time left until it turns half-open (T4).
impl<Rt: Runtime> RetryGate for Breaker<Rt> {
    type Ticket = ();
    type Request = ();

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<()> {
        self.try_retry(now, class).ok()
    }

    fn try_retry(&self, _: Option<Instant>, _: FailureClass) -> Result<(), Refusal> {
        self.refusal().map_or(Ok(()), Err)
    }

    /// Refuses while open or isolated. A clean breaker (closed, no failure streak, no rate
    /// rule) admits with one atomic load: no lock, no clock.
    fn admit(&self) -> Result<(), Refusal> {
        if self.shared.clean.load(Ordering::Acquire) != NOT_CLEAN {
            return Ok(());
        }
        self.refusal().map_or(Ok(()), Err)
    }
}
