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

/// Listeners added and told from threads at once, model-checked: no add is lost, and a listener
/// added before an event is told hears it exactly once. Run with the loom cfg (see
/// `crate::sync::shared`):
/// `RUSTFLAGS="--cfg persevere_loom" CARGO_TARGET_DIR=target/loom cargo test -p persevere-driver --lib --release`.
#[cfg(all(test, persevere_loom))]
mod loom_tests {
    use std::sync::Arc;

    use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use loom::thread;

    use super::Listeners;

    /// A listener that counts what it heard into `heard`.
    fn counting(listeners: &Listeners<u64>, heard: &Arc<AtomicU64>) {
        let heard = heard.clone();
        listeners.add(move |event| {
            heard.fetch_add(*event, Ordering::SeqCst);
        });
    }

    #[test]
    fn o1_two_listeners_added_at_once_are_both_kept() {
        loom::model(|| {
            let listeners = Arc::new(Listeners::new());
            let (a, b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let adders: Vec<_> = [a.clone(), b.clone()]
                .into_iter()
                .map(|heard| {
                    let listeners = listeners.clone();
                    thread::spawn(move || counting(&listeners, &heard))
                })
                .collect();
            for adder in adders {
                adder.join().unwrap();
            }
            listeners.tell(&1);
            assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 1), "an add was lost");
        });
    }

    #[test]
    fn o1_a_listener_added_before_an_event_hears_it_exactly_once() {
        loom::model(|| {
            let listeners = Arc::new(Listeners::new());
            let heard = Arc::new(AtomicU64::new(0));
            let added = Arc::new(AtomicBool::new(false));
            let adder = {
                let (listeners, heard, added) = (listeners.clone(), heard.clone(), added.clone());
                thread::spawn(move || {
                    counting(&listeners, &heard);
                    added.store(true, Ordering::Release);
                })
            };
            // The teller looks whether the add has finished, then tells one event.
            let was_added = added.load(Ordering::Acquire);
            listeners.tell(&1);
            let told = heard.load(Ordering::SeqCst);
            adder.join().unwrap();
            assert!(told <= 1, "one event heard {told} times");
            assert!(!was_added || told == 1, "a listener added before the event did not hear it");
        });
    }
}
