//! Callbacks that hear a driver's transitions ([`Breaker::on_transition`](crate::Breaker::on_transition),
//! the supervisor's and the scheduler's), kept and called one way for all of them.

use std::sync::Arc;

use crate::sync::shared::{Mutex, lock};

/// One callback.
type Listener<T> = Arc<dyn Fn(&T) + Send + Sync>;

/// The callbacks that hear events of type `T`, called in the order they were added.
pub(crate) struct Listeners<T> {
    list: Mutex<Vec<Listener<T>>>,
}

impl<T> Listeners<T> {
    pub(crate) fn new() -> Self {
        Listeners { list: Mutex::new(Vec::new()) }
    }

    /// Adds `listener` after the others.
    pub(crate) fn add(&self, listener: impl Fn(&T) + Send + Sync + 'static) {
        lock(&self.list).push(Arc::new(listener));
    }

    /// Calls every listener with `event`. A listener's panic is its own: it is caught, and the
    /// call that made the change goes on. Call it without holding the driver's own lock.
    ///
    /// The listeners are called with no lock held (a copy of the list is taken first), so a
    /// listener may make another transition (reset the flow that just tripped): it is heard
    /// after this one. No listener, no copy.
    pub(crate) fn tell(&self, event: &T) {
        let listeners: Vec<Listener<T>> = {
            let list = lock(&self.list);
            if list.is_empty() {
                return;
            }
            list.clone()
        };
        for listener in &listeners {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(event)));
        }
    }
}
