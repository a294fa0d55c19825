//! The locks and atomics the driver synchronises with, std's or loom's (see [`shared`]); the
//! supervisor's and the scheduler's signals are in `signals`.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, ignoring poisoning: nothing the driver does under its locks can panic in the
/// middle of a transition (user code never runs under them).
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The primitives the shared [`Breaker`](crate::Breaker) and [`Budget`](crate::Budget), and
/// the signals of `signals`, synchronise with: std's, or loom's when the crate is built with
/// `--cfg persevere_loom` for the model-checking tests (`driver/tests/loom.rs` and this
/// module's), which explore every interleaving of their locks and atomics.
pub(crate) mod shared {
    #[cfg(persevere_loom)]
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
    #[cfg(persevere_loom)]
    pub(crate) use loom::sync::{Mutex, MutexGuard};
    #[cfg(not(persevere_loom))]
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    #[cfg(not(persevere_loom))]
    pub(crate) use std::sync::{Mutex, MutexGuard};

    #[cfg(not(persevere_loom))]
    pub(crate) use super::lock;

    /// Locks `mutex`, ignoring poisoning (see [`super::lock`]).
    #[cfg(persevere_loom)]
    pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
