//! A shared adaptive concurrency limit for async calls, driven by the core's
//! [`persevere::Limiter`] (L2–L4).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use persevere::{Completion, FailureClass, Instant, LimiterPermit, LimiterPolicy, SplitMix64};

use crate::breaker::boxed_error;
use crate::classify::RetryGate;
use crate::refusal::{Gate, Refusal};
use crate::runtime::Runtime;
use crate::sync::shared::{Mutex, MutexGuard, lock};

/// Why [`Limiter::call`] (or a `LoadShedLayer`'s service) did not return the call's value.
///
/// An [`Error`](std::error::Error) as [`CallError`](crate::CallError) is: its
/// [`source`](std::error::Error::source) is the call's error when that is a boxed error.
#[derive(Debug, PartialEq, Eq)]
pub enum ShedError<E> {
    /// The limit was full: the call was shed, not made.
    Shed {
        /// How long until a place is likely to be free: the minimum RTT the limiter has
        /// measured (Vegas measures it from its completions, any algorithm with a
        /// [`MinRttProbe`](persevere::MinRttProbe) in its windows); zero until one is measured.
        retry_after: Duration,
    },
    /// The call was made and failed.
    Failed(E),
}

impl<E> ShedError<E> {
    /// How long to wait before asking again, when the call was shed.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ShedError::Shed { retry_after } => Some(*retry_after),
            ShedError::Failed(_) => None,
        }
    }

    /// The limiter's refusal, if it shed the call: [`Gate::Limiter`] and its `retry_after`.
    pub fn refusal(&self) -> Option<Refusal> {
        self.retry_after().map(|after| Refusal::new(Gate::Limiter, Some(after)))
    }
}

impl<E: fmt::Display> fmt::Display for ShedError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShedError::Shed { retry_after } => write!(f, "concurrency limit full: shed (retry after {retry_after:?})"),
            ShedError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display + 'static> std::error::Error for ShedError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShedError::Failed(e) => boxed_error(e),
            ShedError::Shed { .. } => None,
        }
    }
}

/// What a call's result says to a [`Limiter`]: the classifier parameter of [`LimiterCall`].
/// [`Limiter::call`] uses [`ByCompletion`]; any closure `FnOnce(&Result<T, E>) -> Completion`
/// implements it.
pub trait CompletionClassifier<T, E> {
    /// The completion to report for `result`.
    fn completion(self, result: &Result<T, E>) -> Completion;
}

impl<T, E, F: FnOnce(&Result<T, E>) -> Completion> CompletionClassifier<T, E> for F {
    #[inline]
    fn completion(self, result: &Result<T, E>) -> Completion {
        self(result)
    }
}

/// What [`Limiter::call`] classifies by: an `Ok` is [`Completion::Success`] (its RTT a sample)
/// and an `Err` [`Completion::Dropped`] (a loss: AIMD backs off). Give a closure to
/// [`Limiter::call_classified`] to report errors that say nothing about load (an invalid
/// request) as [`Completion::Ignored`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByCompletion;

impl<T, E> CompletionClassifier<T, E> for ByCompletion {
    #[inline]
    fn completion(self, result: &Result<T, E>) -> Completion {
        if result.is_ok() { Completion::Success } else { Completion::Dropped }
    }
}

struct State {
    limiter: persevere::Limiter,
    rng: SplitMix64,
}

struct Shared<Rt> {
    policy: LimiterPolicy,
    runtime: Rt,
    state: Mutex<State>,
}

impl<Rt> Shared<Rt> {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl<Rt: Runtime> Shared<Rt> {
    #[inline]
    fn acquire(&self) -> Result<LimiterPermit, Duration> {
        let mut state = self.lock();
        let now = self.runtime.now();
        match state.limiter.try_acquire(&self.policy, now) {
            Ok(permit) => Ok(permit),
            Err(shed) => {
                let limit = state.limiter.admission_limit();
                drop(state);
                shed_event(limit, shed.retry_after);
                Err(shed.retry_after)
            }
        }
    }

    #[inline]
    fn release(&self, permit: LimiterPermit, completion: Completion) {
        let mut state = self.lock();
        let now = self.runtime.now();
        let before = state.limiter.limit();
        let State { limiter, rng } = &mut *state;
        // A permit of this limiter, released once: the core cannot refuse it.
        let _ = limiter.release(&self.policy, now, permit, completion, rng);
        let after = state.limiter.limit();
        drop(state);
        if before != after {
            limit_event(before, after);
        }
    }

    /// The refusal a call would meet now, looking only: `None` while a place is free.
    fn refusal(&self) -> Option<Refusal> {
        let state = self.lock();
        if state.limiter.in_flight() < state.limiter.admission_limit() {
            return None;
        }
        let after = state.limiter.min_rtt().unwrap_or(Duration::ZERO);
        Some(Refusal::new(Gate::Limiter, Some(after)))
    }
}

/// A limiter and, once admitted, the place a call holds in it: what [`LimiterGuard`] and
/// [`LimiterCall`] keep. Dropped while it holds the place, it returns it as
/// [`Completion::Ignored`].
struct Place<Rt: Runtime> {
    shared: Arc<Shared<Rt>>,
    permit: Option<LimiterPermit>,
}

impl<Rt: Runtime> Place<Rt> {
    /// Returns the place, if held, with `completion`.
    #[inline]
    fn release(&mut self, completion: Completion) {
        if let Some(permit) = self.permit.take() {
            self.shared.release(permit, completion);
        }
    }

    /// Dropped while holding the place: the call was canceled, or the guard forgotten.
    #[cold]
    fn abandon(&mut self) {
        self.release(Completion::Ignored);
    }
}

impl<Rt: Runtime> Drop for Place<Rt> {
    #[inline]
    fn drop(&mut self) {
        if self.permit.is_some() {
            self.abandon();
        }
    }
}

/// A call was shed: counted, and logged at debug level (sheds come in floods under overload).
#[cold]
fn shed_event(limit: u32, retry_after: Duration) {
    #[cfg(feature = "tracing")]
    {
        let retry_after_ns = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX);
        tracing::debug!(target: "persevere::limiter", limit, retry_after_ns, "call shed");
    }
    #[cfg(feature = "metrics")]
    metrics::counter!("persevere_limiter_shed_total").increment(1);
    let _ = (limit, retry_after);
}

/// The limit moved.
#[cold]
fn limit_event(from: u32, to: u32) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "persevere::limiter", from, to, "limit changed");
    #[cfg(feature = "metrics")]
    metrics::gauge!("persevere_limiter_limit").set(f64::from(to));
    let _ = (from, to);
}

/// An adaptive concurrency limit shared by many tasks: cheap to clone, one state behind a
/// mutex (rules L2–L4). AIMD, Vegas or Gradient2, as its [`LimiterPolicy`] says.
///
/// [`call`](Self::call) asks for a place, runs the call and reports its completion with the
/// RTT measured on the runtime's clock; [`try_acquire`](Self::try_acquire) hands out a
/// [`LimiterGuard`] for code that is not one future. A call that finds the limit full is
/// shed at once with how long to wait. Dropping a call's future (or a guard) before it
/// completes returns its place as [`Completion::Ignored`]: nothing is sampled.
///
/// As a [`RetryGate`] it only looks: a retry (and, in the tower layers, a call) is refused
/// while the limit is full, so retries do not pile onto a saturated dependency.
pub struct Limiter<Rt> {
    shared: Arc<Shared<Rt>>,
}

impl<Rt> Clone for Limiter<Rt> {
    fn clone(&self) -> Self {
        Limiter { shared: self.shared.clone() }
    }
}

impl<Rt> fmt::Debug for Limiter<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Limiter")
            .field("limit", &state.limiter.limit())
            .field("in_flight", &state.limiter.in_flight())
            .finish_non_exhaustive()
    }
}

impl<Rt: Runtime + Default> Limiter<Rt> {
    /// A limiter with `policy` on the default runtime of its adapter.
    pub fn new(policy: LimiterPolicy) -> Self {
        Limiter::with_runtime(Rt::default(), policy)
    }
}

impl<Rt: Runtime> Limiter<Rt> {
    /// A limiter with `policy` on `runtime`'s clock.
    pub fn with_runtime(runtime: Rt, policy: LimiterPolicy) -> Self {
        let state = State { limiter: persevere::Limiter::new(&policy, 0), rng: SplitMix64::new(runtime.entropy()) };
        Limiter { shared: Arc::new(Shared { policy, runtime, state: Mutex::new(state) }) }
    }

    /// A place for one call, held by the returned guard until it reports a completion or is
    /// dropped (then [`Completion::Ignored`]).
    ///
    /// # Errors
    /// The limit is full: a [`Refusal`] naming [`Gate::Limiter`] with how long to wait.
    pub fn try_acquire(&self) -> Result<LimiterGuard<Rt>, Refusal> {
        match self.shared.acquire() {
            Ok(permit) => Ok(LimiterGuard { place: Place { shared: self.shared.clone(), permit: Some(permit) } }),
            Err(after) => Err(Refusal::new(Gate::Limiter, Some(after))),
        }
    }

    /// Runs `call` if a place is free, and reports its completion: `Ok` a success, `Err` a
    /// drop ([`ByCompletion`]). The returned future holds a reference of its own (`'static`
    /// when the call and the runtime are); it asks for the place at its first poll.
    pub fn call<T, E, F>(&self, call: F) -> LimiterCall<Rt, F, ByCompletion>
    where
        F: Future<Output = Result<T, E>>,
    {
        self.call_classified(call, ByCompletion)
    }

    /// Like [`call`](Self::call), with `classify` choosing the [`Completion`] of a result.
    pub fn call_classified<T, E, F, C>(&self, call: F, classify: C) -> LimiterCall<Rt, F, C>
    where
        F: Future<Output = Result<T, E>>,
        C: CompletionClassifier<T, E>,
    {
        LimiterCall { place: Place { shared: self.shared.clone(), permit: None }, classify: Some(classify), call }
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.shared.lock().limiter.limit()
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> u32 {
        self.shared.lock().limiter.in_flight()
    }

    /// The smallest RTT measured, once a call has completed.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.shared.lock().limiter.min_rtt()
    }
}

/// A place taken from a [`Limiter`] by [`Limiter::try_acquire`]. Report how the call ended
/// with [`success`](Self::success), [`dropped`](Self::dropped) or [`complete`](Self::complete)
/// (the RTT is the time since the place was taken); dropped without one, it returns the place
/// as [`Completion::Ignored`].
#[must_use = "a guard holds a place until it completes or is dropped"]
pub struct LimiterGuard<Rt: Runtime> {
    place: Place<Rt>,
}

impl<Rt: Runtime> fmt::Debug for LimiterGuard<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterGuard").field("permit", &self.place.permit).finish_non_exhaustive()
    }
}

impl<Rt: Runtime> LimiterGuard<Rt> {
    /// The call ended with `completion`, now.
    pub fn complete(mut self, completion: Completion) {
        self.place.release(completion);
    }

    /// The call was answered: its RTT is a sample.
    pub fn success(self) {
        self.complete(Completion::Success);
    }

    /// The call was dropped or timed out: a loss.
    pub fn dropped(self) {
        self.complete(Completion::Dropped);
    }
}

pin_project! {
    /// A call through a [`Limiter`], created by [`Limiter::call`] and
    /// [`Limiter::call_classified`]: asks for a place at its first poll, runs the call, and
    /// reports its completion. Dropped before the call completes, it returns the place as
    /// [`Completion::Ignored`].
    #[must_use = "futures do nothing unless awaited"]
    pub struct LimiterCall<Rt: Runtime, F, C> {
        place: Place<Rt>,
        classify: Option<C>,
        #[pin]
        call: F,
    }
}

impl<Rt: Runtime, F, C> fmt::Debug for LimiterCall<Rt, F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterCall").field("permit", &self.place.permit).finish_non_exhaustive()
    }
}

impl<Rt, F, C, T, E> Future for LimiterCall<Rt, F, C>
where
    Rt: Runtime,
    F: Future<Output = Result<T, E>>,
    C: CompletionClassifier<T, E>,
{
    type Output = Result<T, ShedError<E>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        assert!(this.classify.is_some(), "`LimiterCall` polled after it completed");
        let place = this.place;
        if place.permit.is_none() {
            match place.shared.acquire() {
                Ok(permit) => place.permit = Some(permit),
                Err(retry_after) => {
                    *this.classify = None;
                    return Poll::Ready(Err(ShedError::Shed { retry_after }));
                }
            }
        }
        let result = match this.call.poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => return Poll::Pending,
        };
        let Some(classify) = this.classify.take() else { unreachable!("checked on entry") };
        place.release(classify.completion(&result));
        Poll::Ready(result.map_err(ShedError::Failed))
    }
}

/// A limiter vetoes retries while its limit is full: a retry would only be shed, or add to
/// the queue that filled it. Its refusal carries the minimum RTT as the time to wait (T4).
impl<Rt: Runtime> RetryGate for Limiter<Rt> {
    type Ticket = ();
    type Request = ();

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<()> {
        self.try_retry(now, class).ok()
    }

    fn try_retry(&self, _: Option<Instant>, _: FailureClass) -> Result<(), Refusal> {
        self.shared.refusal().map_or(Ok(()), Err)
    }

    /// Refuses while the limit is full (it takes no place: the call takes its own through
    /// [`Limiter::call`] or a `LoadShedLayer`).
    fn admit(&self) -> Result<(), Refusal> {
        self.shared.refusal().map_or(Ok(()), Err)
    }
}
