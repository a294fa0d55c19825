//! Wake-ups without polling (Q8): a [`Doorbell`] a runner waits on, rung when tasks may have
//! become due: by an insert into the same SQLite file in this process, or by a PostgreSQL
//! `NOTIFY` (see [`Store::listen`](crate::Store::listen)).

use core::time::Duration;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};

use persevere::{Backoff, Jitter};

/// A counter and a condition variable: [`ring`](Self::ring) adds one and wakes every waiter;
/// [`wait`](Self::wait) sleeps until the count moves past the one a waiter last saw. A ring
/// is never lost: one that comes before the wait makes the wait return at once.
///
/// Clones ring the same bell. The runner owns one and hands it to its store
/// ([`Store::listen`](crate::Store::listen)), which keeps only a weak reference: what it
/// started for the bell (a listening connection) ends once every clone is gone.
///
/// ```
/// use std::time::Duration;
/// use persevere_queue::Doorbell;
///
/// let bell = Doorbell::new();
/// let seen = bell.rings();
/// let other = bell.clone();
/// std::thread::spawn(move || other.ring());
/// assert_eq!(bell.wait(seen, Duration::from_secs(10)), seen + 1);
/// assert_eq!(bell.wait(seen + 1, Duration::from_millis(1)), seen + 1, "nothing more: it timed out");
/// ```
#[derive(Clone, Debug, Default)]
pub struct Doorbell {
    bell: Arc<Bell>,
}

#[derive(Debug, Default)]
struct Bell {
    rings: Mutex<u64>,
    rung: Condvar,
}

impl Bell {
    fn count(&self) -> MutexGuard<'_, u64> {
        // The count is a plain number: a holder that panicked left it whole.
        self.rings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ring(&self) {
        let mut rings = self.count();
        *rings = rings.wrapping_add(1);
        drop(rings);
        self.rung.notify_all();
    }
}

impl Doorbell {
    /// A bell that has not rung.
    pub fn new() -> Self {
        Doorbell::default()
    }

    /// Adds one to the count and wakes every waiter.
    pub fn ring(&self) {
        self.bell.ring();
    }

    /// How many times it has rung (wrapping).
    pub fn rings(&self) -> u64 {
        *self.bell.count()
    }

    /// Waits until the count differs from `seen` (at once if it already does), or `timeout`
    /// passes; returns the count then.
    pub fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        let rings = self.bell.count();
        let (rings, _) = self
            .bell
            .rung
            .wait_timeout_while(rings, timeout, |rings| *rings == seen)
            .unwrap_or_else(PoisonError::into_inner);
        *rings
    }

    /// A reference that rings this bell while it exists, and does not keep it alive.
    pub(crate) fn downgrade(&self) -> WeakDoorbell {
        WeakDoorbell(Arc::downgrade(&self.bell))
    }
}

/// A [`Doorbell`] that may be gone: what stores, listeners and handlers keep.
#[derive(Clone, Debug)]
pub(crate) struct WeakDoorbell(Weak<Bell>);

impl WeakDoorbell {
    /// Rings the bell; `false` when it is gone.
    pub(crate) fn ring(&self) -> bool {
        self.0.upgrade().map(|bell| bell.ring()).is_some()
    }

    /// Whether the bell still exists.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// The backoff between tries after a store or listening connection fails: 50 ms doubling to
/// 5 s, each delay drawn in its upper half (`Jitter::Equal`), so that workers that lost one
/// database together do not come back together.
pub(crate) fn reconnect_backoff() -> Backoff {
    Backoff::exponential(Duration::from_millis(50), 2.0)
        .max_delay(Duration::from_secs(5))
        .jitter(Jitter::Equal)
        .build()
        .unwrap_or_else(|error| unreachable!("the reconnect backoff's constants are valid: {error}"))
}

/// A seed for the jitter of one thread's backoff: the clock and the thread, so that workers
/// started together draw apart.
pub(crate) fn jitter_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// The bells of the runners on each SQLite file of this process, by the file's canonical path
/// and the queue's name (Q11): an insert into a queue rings them all once it has committed.
/// (Processes do not hear each other: their runners find the tasks at their next poll.)
#[cfg(feature = "sqlite")]
pub(crate) mod files {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{LazyLock, Mutex, PoisonError};

    use super::{Doorbell, WeakDoorbell};

    type Bells = HashMap<(PathBuf, String), Vec<WeakDoorbell>>;

    static BELLS: LazyLock<Mutex<Bells>> = LazyLock::new(Mutex::default);

    /// Rings `bell` after every insert into queue `queue` of the file at `path` (canonical),
    /// while the bell exists.
    pub(crate) fn register(path: &Path, queue: &str, bell: &Doorbell) {
        let mut bells = BELLS.lock().unwrap_or_else(PoisonError::into_inner);
        let list = bells.entry((path.to_owned(), queue.to_owned())).or_default();
        list.retain(WeakDoorbell::is_alive);
        list.push(bell.downgrade());
    }

    /// Rings every bell registered for `queue` in `path`, forgetting the ones that are gone.
    pub(crate) fn ring(path: &Path, queue: &str) {
        let mut bells = BELLS.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (path.to_owned(), queue.to_owned());
        let Some(list) = bells.get_mut(&key) else { return };
        list.retain(WeakDoorbell::ring);
        if list.is_empty() {
            bells.remove(&key);
        }
    }
}
