//! How a failed attempt's error is classified, who hears about retries, and who may veto them.

use std::io;
use std::time::Duration;

use persevere::{FailureClass, FailureKind, Instant};

use crate::refusal::{Gate, Refusal};

/// Classifies an error by its own type: implement it for your error types and call
/// [`RetryFuture::classified`](crate::RetryFuture::classified).
///
/// ```
/// use persevere::FailureKind;
/// use persevere_driver::Classify;
///
/// enum ApiError { Unavailable, BadRequest }
/// impl Classify for ApiError {
///     fn classify(&self) -> FailureKind {
///         match self {
///             ApiError::Unavailable => FailureKind::Retryable,
///             ApiError::BadRequest => FailureKind::Fatal,
///         }
///     }
/// }
/// assert_eq!(ApiError::BadRequest.classify(), FailureKind::Fatal);
/// ```
pub trait Classify {
    /// The kind of failure this error is.
    fn classify(&self) -> FailureKind;
}

/// `std::io::Error` by its kind: timeouts are [`FailureKind::Timeout`]; connection trouble,
/// interruptions and `WouldBlock` are [`FailureKind::Retryable`]; everything else (not found,
/// permission denied, invalid input, …) is [`FailureKind::Fatal`].
impl Classify for io::Error {
    fn classify(&self) -> FailureKind {
        use io::ErrorKind::*;
        match self.kind() {
            TimedOut => FailureKind::Timeout,
            ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | BrokenPipe | Interrupted
            | WouldBlock | UnexpectedEof | AddrInUse | AddrNotAvailable => FailureKind::Retryable,
            _ => FailureKind::Fatal,
        }
    }
}

/// Chooses the [`FailureKind`] of an attempt's error. Implemented by closures
/// `FnMut(&E) -> FailureKind`, by [`RetryAll`] and by [`ByTrait`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify errors of type `{E}`",
    label = "not a classifier of these errors",
    note = "a classifier is `RetryAll` (every error retryable), `ByTrait` (for an error type that implements `Classify`), or a closure `|error: &E| FailureKind::Retryable` (or another kind)"
)]
pub trait Classifier<E> {
    /// The kind of failure `error` is.
    fn classify(&mut self, error: &E) -> FailureKind;
}

// Not recommended in diagnostics, as for `CallClassifier`'s closures.
#[diagnostic::do_not_recommend]
impl<E, F: FnMut(&E) -> FailureKind> Classifier<E> for F {
    fn classify(&mut self, error: &E) -> FailureKind {
        self(error)
    }
}

/// The default classifier: **every error is retryable** (limits permitting). Errors the caller
/// cannot or does not classify are retried, as with most retry libraries; give a closure or
/// [`Classify`] to stop on permanent errors.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryAll;

impl<E> Classifier<E> for RetryAll {
    fn classify(&mut self, _: &E) -> FailureKind {
        FailureKind::Retryable
    }
}

/// Classifies through the error type's [`Classify`] implementation.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByTrait;

impl<E: Classify> Classifier<E> for ByTrait {
    fn classify(&mut self, error: &E) -> FailureKind {
        error.classify()
    }
}

/// A retry about to be scheduled, as told to a [`Notify`] hook.
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryEvent<'a, E> {
    /// The failed attempt's error; `None` when the attempt timed out or panicked.
    pub error: Option<&'a E>,
    /// How the failure was classified.
    pub class: FailureClass,
    /// The attempt that starts after the delay.
    pub next_attempt: u64,
    /// The delay before it.
    pub delay: Duration,
}

/// Hears about each scheduled retry. Implemented by closures `FnMut(&RetryEvent<'_, E>)` and by
/// `()` (nothing).
pub trait Notify<E> {
    /// A retry is scheduled.
    fn notify(&mut self, event: &RetryEvent<'_, E>);
}

impl<E> Notify<E> for () {
    fn notify(&mut self, _: &RetryEvent<'_, E>) {}
}

impl<E, F: FnMut(&RetryEvent<'_, E>)> Notify<E> for F {
    fn notify(&mut self, event: &RetryEvent<'_, E>) {
        self(event)
    }
}

/// Something shared that may veto a retry: a retry budget or a breaker (rule U4).
///
/// `retry` calls [`on_request`](RetryGate::on_request) once per operation,
/// [`try_retry`](RetryGate::try_retry) whenever the machine wants to retry (a refusal ends
/// the operation with `Rejected`, and [`GaveUp`](crate::GaveUp) names the gate that refused),
/// [`on_success`](RetryGate::on_success) when an attempt
/// succeeds, with the [`Ticket`](RetryGate::Ticket) of the retry that made that attempt, and
/// [`on_final_failure`](RetryGate::on_final_failure) when a failure ends the operation without
/// a retry being asked for. `()` allows everything.
///
/// # Tickets
/// A granted retry is a ticket, kept by the operation until its next attempt ends: handed back
/// to `on_success` if that attempt succeeds, dropped if it fails, if the operation ends, or if
/// its future is dropped. A token bucket's ticket is its [`Grant`](persevere::Grant), so a
/// successful retry gives back what it cost when the policy says so (the AWS SDKs' refund); a
/// gate that counts retries in flight can release one in its ticket's `Drop`, which runs exactly
/// once whatever happens. A gate that keeps nothing uses `()`.
///
/// # Requests
/// What [`on_request`](RetryGate::on_request) returns is kept by the operation until it ends:
/// dropped when it succeeds or gives up, or when its future is dropped. A gate that counts the
/// operations in flight (an Envoy-style [`Budget::concurrency`](crate::Budget::concurrency))
/// ends one in its request's `Drop`. A gate that keeps nothing uses `()`.
///
/// # Several gates
/// A tuple of up to four gates is a gate: every gate hears of each request and success, and a
/// retry is allowed when every gate allows it (the ticket is the tuple of theirs). The gates
/// are asked in order and the first refusal stops the asking, so a gate that spends on a grant
/// (a [`Budget`](crate::Budget)) belongs after one that only looks (a
/// [`Breaker`](crate::Breaker)): then no token is spent on a retry the breaker refuses. (A
/// grant made before a later gate refused is dropped at once.) The refusal is the refusing gate's
/// own: a tuple's says whether its breaker or its budget refused.
///
/// ```
/// use std::time::Duration;
/// use persevere::{Backoff, BreakerPolicy, RatioBudgetPolicy};
/// use persevere_driver::{Breaker, Budget, RetryGate};
/// # use persevere::{FailureClass, Instant};
/// # #[derive(Clone, Default)]
/// # struct Clock;
/// # impl persevere_driver::Runtime for Clock {
/// #     type Sleep = std::future::Ready<()>;
/// #     fn now(&self) -> Instant { Instant::ZERO }
/// #     fn sleep_until(&self, _: Instant) -> Self::Sleep { std::future::ready(()) }
/// # }
///
/// let open_for = Backoff::constant(Duration::from_secs(1)).build()?;
/// let breaker = Breaker::with_runtime(Clock, BreakerPolicy::builder(open_for).consecutive_failures(5).build()?);
/// let budget = Budget::ratio(Clock, RatioBudgetPolicy::builder(0.1).build()?);
/// // The breaker first: an open breaker refuses before the budget spends anything.
/// let gates = (breaker.clone(), budget.clone());
/// // `retry(..).gate(gates)` asks both before each retry.
/// # gates.on_request(None);
/// # assert!(gates.allow_retry(None, FailureClass::Retryable).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait RetryGate {
    /// What a granted retry holds until its attempt ends (see [Tickets](RetryGate#tickets)).
    type Ticket;

    /// What an operation holds from its start until it ends, whatever ends it (see
    /// [Requests](RetryGate#requests)); `()` for a gate that does not count operations in
    /// flight.
    type Request: Default;

    /// An operation starts (its first attempt). `now` is `None` on the clock-free fast path.
    /// What it returns is kept until the operation ends.
    fn on_request(&self, now: Option<Instant>) -> Self::Request {
        let _ = now;
        Self::Request::default()
    }

    /// May a retry after a failure of `class` be scheduled? `Some(ticket)` if so. `now` is
    /// `None` when the operation runs without reading the clock (its policy has no budget and
    /// no deadline); a gate that needs the time reads its own clock then.
    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<Self::Ticket>;

    /// [`allow_retry`](Self::allow_retry), with what a refusal means: which gate refused, and
    /// how long until it may allow one again (T4). The driving loops ask this one. By default,
    /// `allow_retry`'s answer, a refusal naming [`Gate::Other`] and no time; a `Breaker`, a
    /// `Budget` and a tuple of gates say theirs.
    ///
    /// # Errors
    /// The [`Refusal`] when the retry must not be scheduled.
    fn try_retry(&self, now: Option<Instant>, class: FailureClass) -> Result<Self::Ticket, Refusal> {
        self.allow_retry(now, class).ok_or(Refusal::new(Gate::Other, None))
    }

    /// May a call start at all? The tower layers (`persevere-tower`) ask before a call's first
    /// attempt is sent: a call an open breaker would refuse is refused there, with nothing
    /// sent and no attempt counted (T4). A `Breaker` refuses while open or isolated; a `Budget`
    /// never does (it limits retries, not calls). By default every call may start. The
    /// driver's own [`retry`](crate::retry) does not ask: its attempts go through
    /// [`Breaker::call`](crate::Breaker::call).
    ///
    /// # Errors
    /// The [`Refusal`] when no call may start now.
    fn admit(&self) -> Result<(), Refusal> {
        Ok(())
    }

    /// An attempt succeeded; `ticket` is the grant of the retry it was (`None` for a first
    /// attempt). Called after the driver has recorded that the operation succeeded: if it
    /// panics, the panic reaches the caller's poll, and nothing is retried or sent again.
    fn on_success(&self, ticket: Option<Self::Ticket>) {
        drop(ticket);
    }

    /// A failure of `class` ended the operation and no retry was asked for: its attempts were
    /// used up ([`Exhausted`](persevere::OutcomeKind::Exhausted)), its hint asked for longer
    /// than the policy waits ([`Deferred`](persevere::OutcomeKind::Deferred)), its retry would
    /// have run past the total budget ([`OutOfTime`](persevere::OutcomeKind::OutOfTime); not
    /// when the budget ran out during a granted retry's wait), or the other side said not to
    /// retry ([`FailureClass::DoNotRetry`]). Not called for a failure that is
    /// not worth retrying (fatal, canceled), nor when a retry was refused (`allow_retry` heard
    /// that one). A token bucket that charges every failed attempt, as gRPC's does, charges
    /// this one here.
    fn on_final_failure(&self, now: Option<Instant>, class: FailureClass) {
        let _ = (now, class);
    }
}

impl RetryGate for () {
    type Ticket = ();
    type Request = ();

    fn allow_retry(&self, _: Option<Instant>, _: FailureClass) -> Option<()> {
        Some(())
    }
}

macro_rules! tuple_gate {
    ($($gate:ident . $index:tt),+) => {
        impl<$($gate: RetryGate),+> RetryGate for ($($gate,)+) {
            type Ticket = ($($gate::Ticket,)+);
            type Request = ($($gate::Request,)+);

            fn on_request(&self, now: Option<Instant>) -> Self::Request {
                ($(self.$index.on_request(now),)+)
            }

            fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<Self::Ticket> {
                self.try_retry(now, class).ok()
            }

            fn try_retry(&self, now: Option<Instant>, class: FailureClass) -> Result<Self::Ticket, Refusal> {
                // In order; `?` stops at the first refusal and drops the grants made before it.
                Ok(($(self.$index.try_retry(now, class)?,)+))
            }

            fn admit(&self) -> Result<(), Refusal> {
                $(self.$index.admit()?;)+
                Ok(())
            }

            fn on_success(&self, ticket: Option<Self::Ticket>) {
                match ticket {
                    Some(ticket) => { $(self.$index.on_success(Some(ticket.$index));)+ }
                    None => { $(self.$index.on_success(None);)+ }
                }
            }

            fn on_final_failure(&self, now: Option<Instant>, class: FailureClass) {
                $(self.$index.on_final_failure(now, class);)+
            }
        }
    };
}

tuple_gate!(A.0, B.1);
tuple_gate!(A.0, B.1, C.2);
tuple_gate!(A.0, B.1, C.2, D.3);

impl<G: RetryGate + ?Sized> RetryGate for &G {
    type Ticket = G::Ticket;
    type Request = G::Request;

    fn on_request(&self, now: Option<Instant>) -> G::Request {
        (**self).on_request(now)
    }

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<G::Ticket> {
        (**self).allow_retry(now, class)
    }

    fn try_retry(&self, now: Option<Instant>, class: FailureClass) -> Result<G::Ticket, Refusal> {
        (**self).try_retry(now, class)
    }

    fn admit(&self) -> Result<(), Refusal> {
        (**self).admit()
    }

    fn on_success(&self, ticket: Option<G::Ticket>) {
        (**self).on_success(ticket)
    }

    fn on_final_failure(&self, now: Option<Instant>, class: FailureClass) {
        (**self).on_final_failure(now, class)
    }
}

impl<G: RetryGate + ?Sized> RetryGate for std::sync::Arc<G> {
    type Ticket = G::Ticket;
    type Request = G::Request;

    fn on_request(&self, now: Option<Instant>) -> G::Request {
        (**self).on_request(now)
    }

    fn allow_retry(&self, now: Option<Instant>, class: FailureClass) -> Option<G::Ticket> {
        (**self).allow_retry(now, class)
    }

    fn try_retry(&self, now: Option<Instant>, class: FailureClass) -> Result<G::Ticket, Refusal> {
        (**self).try_retry(now, class)
    }

    fn admit(&self) -> Result<(), Refusal> {
        (**self).admit()
    }

    fn on_success(&self, ticket: Option<G::Ticket>) {
        (**self).on_success(ticket)
    }

    fn on_final_failure(&self, now: Option<Instant>, class: FailureClass) {
        (**self).on_final_failure(now, class)
    }
}
