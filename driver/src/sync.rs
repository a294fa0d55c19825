//! Small executor-independent synchronisation pieces shared by the supervisor and the scheduler:
//! a level signal with one waiter, and a one-shot slot for a final outcome.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// Locks `mutex`, ignoring poisoning: nothing the driver does under its locks can panic in the
/// middle of a transition (user code never runs under them).
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A level that only rises, watched by one waiter at a time.
///
/// Raising wakes the waiter registered by the last [`poll`](Self::poll); a raise between a poll
/// and the next is never lost, because the level is read under the same lock that registers the
/// waker.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    inner: Mutex<(u8, Option<Waker>)>,
}

impl Signal {
    /// Raises the level to `level` (never lowers it) and wakes the waiter if it rose.
    pub(crate) fn raise(&self, level: u8) {
        let waker = {
            let mut inner = lock(&self.inner);
            if inner.0 >= level {
                return;
            }
            inner.0 = level;
            inner.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The current level.
    pub(crate) fn level(&self) -> u8 {
        lock(&self.inner).0
    }

    /// The current level, registering `cx`'s waker for the next raise.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> u8 {
        let mut inner = lock(&self.inner);
        match &inner.1 {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => inner.1 = Some(cx.waker().clone()),
        }
        inner.0
    }
}

/// A flag that wakes one waiter and is cleared by that waiter: "something changed, look again".
#[derive(Debug, Default)]
pub(crate) struct Nudge {
    inner: Mutex<(bool, Option<Waker>)>,
}

impl Nudge {
    /// Sets the flag and wakes the waiter.
    pub(crate) fn nudge(&self) {
        let waker = {
            let mut inner = lock(&self.inner);
            inner.0 = true;
            inner.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Clears the flag (call before reading the state the flag is about).
    pub(crate) fn clear(&self) {
        lock(&self.inner).0 = false;
    }

    /// `true` (and clears it) if the flag is set; otherwise registers `cx`'s waker.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> bool {
        let mut inner = lock(&self.inner);
        if inner.0 {
            inner.0 = false;
            return true;
        }
        match &inner.1 {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => inner.1 = Some(cx.waker().clone()),
        }
        false
    }
}

#[derive(Debug)]
struct Slot<T> {
    value: Option<T>,
    sent: bool,
    waker: Option<Waker>,
}

/// The sending half of a one-shot slot.
#[derive(Debug)]
pub(crate) struct OneshotSender<T>(Arc<Mutex<Slot<T>>>);

/// The receiving half of a one-shot slot: a future of the value.
#[derive(Debug)]
pub(crate) struct OneshotReceiver<T>(Arc<Mutex<Slot<T>>>);

/// A slot written once and awaited once.
pub(crate) fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, sent: false, waker: None }));
    (OneshotSender(slot.clone()), OneshotReceiver(slot))
}

impl<T> OneshotSender<T> {
    /// Fills the slot and wakes the receiver.
    pub(crate) fn send(self, value: T) {
        let waker = {
            let mut slot = lock(&self.0);
            slot.value = Some(value);
            slot.sent = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> OneshotReceiver<T> {
    /// Whether the value has been sent (taken or not).
    pub(crate) fn is_sent(&self) -> bool {
        lock(&self.0).sent
    }
}

impl<T> Future for OneshotReceiver<T> {
    /// `None` only if the value was already taken by an earlier poll.
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = lock(&self.0);
        if slot.sent {
            return Poll::Ready(slot.value.take());
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
