//! Small executor-independent synchronisation pieces shared by the supervisor and the scheduler:
//! a level signal with one waiter, a wake-up flag, and a one-shot slot for a task's final
//! outcome that shares its allocation with the task's control signal.

use std::fmt;
#[cfg(feature = "supervisor")]
use std::future::Future;
#[cfg(feature = "supervisor")]
use std::pin::Pin;
#[cfg(feature = "supervisor")]
use std::sync::Arc;
#[cfg(feature = "supervisor")]
use std::task::Poll;
use std::task::{Context, Waker};

use crate::sync::shared;

/// A level that only rises, watched by one waiter at a time.
///
/// Raising wakes the waiter registered by the last [`poll`](Self::poll); a raise between a poll
/// and the next is never lost, because the level is read under the same lock that registers the
/// waker.
#[cfg(feature = "supervisor")]
#[derive(Default)]
pub(crate) struct Signal {
    inner: shared::Mutex<(u8, Option<Waker>)>,
}

#[cfg(feature = "supervisor")]
impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal").field("level", &self.level()).finish()
    }
}

#[cfg(feature = "supervisor")]
impl Signal {
    /// Raises the level to `level` (never lowers it) and wakes the waiter if it rose.
    pub(crate) fn raise(&self, level: u8) {
        let waker = {
            let mut inner = shared::lock(&self.inner);
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
        shared::lock(&self.inner).0
    }

    /// The current level, registering `cx`'s waker for the next raise.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> u8 {
        let mut inner = shared::lock(&self.inner);
        match &inner.1 {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => inner.1 = Some(cx.waker().clone()),
        }
        inner.0
    }
}

/// A flag that wakes one waiter and is cleared by that waiter: "something changed, look again".
#[cfg(feature = "scheduler")]
#[derive(Default)]
pub(crate) struct Nudge {
    inner: shared::Mutex<(bool, Option<Waker>)>,
}

#[cfg(feature = "scheduler")]
impl fmt::Debug for Nudge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nudge").field("set", &shared::lock(&self.inner).0).finish()
    }
}

#[cfg(feature = "scheduler")]
impl Nudge {
    /// Sets the flag and wakes the waiter.
    pub(crate) fn nudge(&self) {
        let waker = {
            let mut inner = shared::lock(&self.inner);
            inner.0 = true;
            inner.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Clears the flag (call before reading the state the flag is about).
    pub(crate) fn clear(&self) {
        shared::lock(&self.inner).0 = false;
    }

    /// `true` (and clears it) if the flag is set; otherwise registers `cx`'s waker.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> bool {
        let mut inner = shared::lock(&self.inner);
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

#[cfg(feature = "supervisor")]
#[derive(Debug)]
struct Slot<T> {
    value: Option<T>,
    sent: bool,
    waker: Option<Waker>,
}

/// A one-shot slot together with a control [`Signal`], in one allocation: a supervised task's
/// exit and the level its handle, the registry and a shutdown raise.
#[cfg(feature = "supervisor")]
pub(crate) struct TaskCell<T> {
    /// The control level.
    pub(crate) control: Signal,
    slot: shared::Mutex<Slot<T>>,
}

/// The sending half of a one-shot slot.
#[cfg(feature = "supervisor")]
pub(crate) struct OneshotSender<T>(Arc<TaskCell<T>>);

/// The receiving half of a one-shot slot: a future of the value.
#[cfg(feature = "supervisor")]
pub(crate) struct OneshotReceiver<T>(Arc<TaskCell<T>>);

#[cfg(feature = "supervisor")]
impl<T> fmt::Debug for OneshotSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneshotSender").finish_non_exhaustive()
    }
}

#[cfg(feature = "supervisor")]
impl<T> fmt::Debug for OneshotReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneshotReceiver").field("sent", &self.is_sent()).finish()
    }
}

/// A slot written once and awaited once.
#[cfg(feature = "supervisor")]
pub(crate) fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let slot = shared::Mutex::new(Slot { value: None, sent: false, waker: None });
    let cell = Arc::new(TaskCell { control: Signal::default(), slot });
    (OneshotSender(cell.clone()), OneshotReceiver(cell))
}

#[cfg(feature = "supervisor")]
impl<T> OneshotSender<T> {
    /// Fills the slot and wakes the receiver.
    pub(crate) fn send(self, value: T) {
        let waker = {
            let mut slot = shared::lock(&self.0.slot);
            slot.value = Some(value);
            slot.sent = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

#[cfg(feature = "supervisor")]
impl<T> OneshotReceiver<T> {
    /// Whether the value has been sent (taken or not).
    pub(crate) fn is_sent(&self) -> bool {
        shared::lock(&self.0.slot).sent
    }

    /// The cell the slot lives in, with its control signal.
    pub(crate) fn cell(&self) -> &Arc<TaskCell<T>> {
        &self.0
    }
}

#[cfg(feature = "supervisor")]
impl<T> Future for OneshotReceiver<T> {
    /// `None` only if the value was already taken by an earlier poll.
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = shared::lock(&self.0.slot);
        if slot.sent {
            return Poll::Ready(slot.value.take());
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Every interleaving of a wake-up with the poll that waits for it, model-checked: none is
/// lost. Run with the loom cfg (see `crate::sync::shared`):
/// `RUSTFLAGS="--cfg persevere_loom" CARGO_TARGET_DIR=target/loom cargo test -p persevere-driver --lib --release`.
#[cfg(all(test, persevere_loom, feature = "supervisor", feature = "scheduler"))]
mod loom_tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;

    use super::{Nudge, Signal, oneshot};

    /// A waker that remembers it was woken.
    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A waiter that polls once and a waker that acts once, racing: afterwards the waiter either
    /// saw the change in its poll or was woken (its next poll would see it).
    fn no_lost_wake_up<T: Send + 'static>(
        waiter: impl FnOnce(&mut Context<'_>) -> bool + Send + 'static,
        waker: impl FnOnce() -> T + Send + 'static,
    ) {
        let woken = Arc::new(Flag::default());
        let waiting = {
            let woken = woken.clone();
            thread::spawn(move || waiter(&mut Context::from_waker(&Waker::from(woken))))
        };
        let acting = thread::spawn(waker);
        let saw = waiting.join().unwrap();
        let _ = acting.join().unwrap();
        assert!(saw || woken.0.load(Ordering::SeqCst), "the change was neither seen nor woken for");
    }

    #[test]
    fn a_raise_is_seen_or_wakes_the_waiter() {
        loom::model(|| {
            let signal = Arc::new(Signal::default());
            let (waiter, raiser) = (signal.clone(), signal.clone());
            no_lost_wake_up(move |cx| waiter.poll(cx) >= 1, move || raiser.raise(1));
        });
    }

    #[test]
    fn a_nudge_is_taken_or_wakes_the_waiter() {
        loom::model(|| {
            let nudge = Arc::new(Nudge::default());
            let (waiter, nudger) = (nudge.clone(), nudge.clone());
            no_lost_wake_up(move |cx| waiter.poll_take(cx), move || nudger.nudge());
        });
    }

    #[test]
    fn a_sent_value_is_received_or_wakes_the_receiver() {
        loom::model(|| {
            let (tx, rx) = oneshot::<u8>();
            no_lost_wake_up(
                move |cx| {
                    let mut rx = pin!(rx);
                    match rx.as_mut().poll(cx) {
                        Poll::Ready(value) => {
                            assert_eq!(value, Some(7));
                            true
                        }
                        Poll::Pending => false,
                    }
                },
                move || tx.send(7),
            );
        });
    }
}
