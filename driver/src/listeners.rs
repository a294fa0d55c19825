//! Callbacks that hear a driver's transitions ([`Breaker::on_transition`](crate::Breaker::on_transition),
//! the supervisor's and the scheduler's), kept and called one way for all of them.

use std::sync::Arc;

use crate::sync::shared::{AtomicU64, Mutex, Ordering, lock};

/// One callback.
type Listener<T> = Arc<dyn Fn(&T) + Send + Sync>;

/// The callbacks that hear events of type `T`, called in the order they were added.
///
/// Events far outnumber listeners, so the list is copied on write: telling an event takes no
/// lock when nobody listens (one atomic load), and otherwise the lock only long enough to take
/// a reference to the current list (no allocation per event).
pub(crate) struct Listeners<T> {
    list: Mutex<Arc<Vec<Listener<T>>>>,
    /// How many listeners the list holds.
    count: AtomicU64,
}

impl<T> Listeners<T> {
    pub(crate) fn new() -> Self {
        Listeners { list: Mutex::new(Arc::new(Vec::new())), count: AtomicU64::new(0) }
    }

    /// Adds `listener` after the others.
    pub(crate) fn add(&self, listener: impl Fn(&T) + Send + Sync + 'static) {
        let mut list = lock(&self.list);
        let mut grown = Vec::clone(&list);
        grown.push(Arc::new(listener));
        self.count.store(grown.len() as u64, Ordering::Release);
        *list = Arc::new(grown);
    }

    /// Calls every listener with `event`. A listener's panic is its own: it is caught, and the
    /// call that made the change goes on. Call it without holding the driver's own lock.
    ///
    /// The listeners are called with no lock held (on the list as it was when the event was
    /// told), so a listener may make another transition (reset the flow that just tripped): it
    /// is heard after this one. A listener added while an event is told may miss that event.
    pub(crate) fn tell(&self, event: &T) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let listeners = Arc::clone(&lock(&self.list));
        for listener in listeners.iter() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(event)));
        }
    }
}
