//! The drain every machine that emits actions shares: its outputs, taken in order until none is
//! left, and the instant its `handle_timeout` is next due.

use crate::Instant;

/// The output side of a machine that emits actions ([`Retry`](crate::Retry),
/// [`Supervision`](crate::Supervision), [`Flow`](crate::Flow), [`Delivery`](crate::Delivery),
/// [`Hedge`](crate::Hedge), and the [`Flows`](crate::Flows) and
/// [`Deliveries`](crate::Deliveries) collections). Drivers, tests and the simulator drain any of
/// them through it; each type documents its drain order.
///
/// The breaker, the budgets and the concurrency limits ([`Bulkhead`](crate::Bulkhead),
/// [`Limiter`](crate::Limiter)) are driven by calls whose answer is the output (an admission or
/// a refusal), so they are not `Drain`: the breaker's and the budgets' transitions come out of
/// `poll_event` (O1).
///
/// ```
/// use persevere::{Backoff, Drain, Instant, Retry, RetryAction, RetryPolicy};
/// use core::time::Duration;
///
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build()?).max_attempts(2).build()?;
/// let mut retry = Retry::<()>::new();
/// retry.handle_start(&policy, Instant::ZERO)?;
/// let actions: Vec<_> = retry.drain().collect();
/// assert!(matches!(actions[..], [RetryAction::Start { attempt: 1, .. }]));
/// assert_eq!(retry.poll_action(), None); // drained
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Drain {
    /// What the machine emits.
    type Action;

    /// The next output, in the machine's documented drain order; `None` once every output is
    /// drained.
    fn poll_action(&mut self) -> Option<Self::Action>;

    /// When the machine's `handle_timeout` is next due; `None` when nothing is timed. A pure
    /// query: calling `handle_timeout` before then, or when nothing is due, changes nothing.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The outputs waiting now, in order, each taken as the iterator yields it.
    fn drain(&mut self) -> Drained<'_, Self>
    where
        Self: Sized,
    {
        Drained(self)
    }
}

/// The iterator of [`Drain::drain`]: calls [`Drain::poll_action`] until it returns `None`.
#[derive(Debug)]
pub struct Drained<'a, M>(&'a mut M);

impl<M: Drain> Iterator for Drained<'_, M> {
    type Item = M::Action;

    fn next(&mut self) -> Option<M::Action> {
        self.0.poll_action()
    }
}

/// Implements [`Drain`] by forwarding to the type's inherent `poll_action` and `poll_timeout`.
macro_rules! drain_by_inherent {
    ($(impl[$($generics:tt)*] $ty:ty => $action:ty $(where [$($bounds:tt)*])?;)*) => {$(
        impl<$($generics)*> Drain for $ty $(where $($bounds)*)? {
            type Action = $action;

            #[inline(always)]
            fn poll_action(&mut self) -> Option<Self::Action> {
                <$ty>::poll_action(self)
            }

            #[inline(always)]
            fn poll_timeout(&self) -> Option<Instant> {
                <$ty>::poll_timeout(self)
            }
        }
    )*};
}

drain_by_inherent! {
    impl[E] crate::Retry<E> => crate::RetryAction<E>;
    impl[E] crate::Supervision<E> => crate::SupervisionAction<E>;
    impl[E] crate::Flow<E> => crate::FlowAction;
    impl[E] crate::Hedge<E> => crate::HedgeAction<E>;
    impl[K, W, C, E, R] crate::Delivery<K, W, C, E, R> => crate::DeliveryAction<K, W, C, E, R>
        where [K: Clone, W: Clone, C: Clone, E: Clone, R: Clone];
}

#[cfg(feature = "alloc")]
drain_by_inherent! {
    impl[K: Ord + Clone, E] crate::Flows<K, E> => (K, crate::FlowAction);
    impl[K, T, W, C, E, R] crate::Deliveries<K, T, W, C, E, R> => (K, crate::DeliveryAction<K, W, C, E, R>)
        where [K: Ord + Clone, T: Ord + Clone, W: Ord + Clone, C: Clone, E: Clone, R: Clone];
}
