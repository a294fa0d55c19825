//! The tiny trait an executor implements to drive persevere's machines.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use persevere::{Epoch, Instant};

/// A clock and a timer: all that the driving loop needs from an executor.
///
/// Each value defines its own epoch: [`now`](Runtime::now) and
/// [`sleep_until`](Runtime::sleep_until) speak of the same [`Instant`]s. Implementations read
/// their clock lazily, so a value can be created on every call for free; the success path of
/// [`retry`](crate::retry) never calls `now` unless the policy has a deadline or a budget.
pub trait Runtime {
    /// The future returned by [`sleep_until`](Runtime::sleep_until); its output is ignored.
    type Sleep: Future;

    /// The current instant on this runtime's clock.
    fn now(&self) -> Instant;

    /// A future that completes at or after `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Self::Sleep;

    /// A seed for the jitter RNG of one operation. The default mixes the process's random
    /// hash keys; a simulator returns a value drawn from its own seed.
    fn entropy(&self) -> u64 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(0x9e37_79b9_7f4a_7c15);
        hasher.finish()
    }
}

impl<R: Runtime + ?Sized> Runtime for &R {
    type Sleep = R::Sleep;

    fn now(&self) -> Instant {
        (**self).now()
    }

    fn sleep_until(&self, deadline: Instant) -> Self::Sleep {
        (**self).sleep_until(deadline)
    }

    fn entropy(&self) -> u64 {
        (**self).entropy()
    }
}

/// An [`Epoch`] fixed by the first clock reading, for [`Runtime`] implementations whose clock
/// speaks `std::time::Instant`: creating one reads no clock.
///
/// ```
/// use persevere::Instant;
/// use persevere_driver::LazyEpoch;
///
/// let epoch = LazyEpoch::new();
/// let first = std::time::Instant::now();
/// assert_eq!(epoch.instant(|| first), Instant::ZERO);
/// let later = first + std::time::Duration::from_millis(3);
/// assert_eq!(epoch.instant(|| later), Instant::from_millis(3));
/// assert_eq!(epoch.to_std(Instant::from_millis(3)), Some(later));
/// ```
#[derive(Default)]
pub struct LazyEpoch {
    // Never dropped: an `Epoch` is a plain `std` instant with nothing to free, and dropping a
    // `OnceLock` reads its state atomically, a load the compiler keeps. A runtime is cloned
    // and dropped with every call of a tower retry layer; that load, of a state just stored,
    // was a fifth of the layer's success path.
    epoch: ManuallyDrop<OnceLock<Epoch>>,
}

// By hand, to show the epoch as before, without the `ManuallyDrop` around it.
impl std::fmt::Debug for LazyEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyEpoch").field("epoch", &*self.epoch).finish()
    }
}

// What `LazyEpoch` never drops has nothing to drop.
const _: () = assert!(!std::mem::needs_drop::<Epoch>());

impl LazyEpoch {
    /// An epoch not yet fixed.
    pub const fn new() -> Self {
        LazyEpoch { epoch: ManuallyDrop::new(OnceLock::new()) }
    }

    /// The instant of a clock reading taken by `read`; the first reading becomes the epoch.
    pub fn instant(&self, read: impl FnOnce() -> std::time::Instant) -> Instant {
        let reading = read();
        self.epoch.get_or_init(|| Epoch::new(reading)).instant(reading)
    }

    /// The `std` instant of `instant`, or `None` if it is beyond the platform's range or the
    /// epoch is not fixed yet (no reading has been taken, so nothing can be due).
    pub fn to_std(&self, instant: Instant) -> Option<std::time::Instant> {
        self.epoch.get()?.to_std(instant)
    }
}

/// How a driving loop turns its runtime's clock into its machine's [`Instant`]s: the one time
/// model of the retry, hedge, supervisor and scheduler loops.
///
/// A timeline is a stopwatch over the runtime's clock. While it runs, the machine's time is the
/// clock's, shifted so that it went on from where it stood when the timeline last resumed;
/// while it is paused, the machine's time stands still and no clock is read. The supervisor, the
/// scheduler and a retry that reads the clock from the start (a deadline, a budget, or
/// `measure_elapsed`) run on [`Timeline::CLOCK`]: their instants are the runtime's, as their
/// events and statistics show them. Any other retry's timeline runs only while it sleeps, so
/// that it reads the clock only around its sleeps; a hedge's resumes at its first wait and runs
/// from then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    /// While running: a clock reading; `Instant::MAX` while paused.
    clock: Instant,
    /// While running: the machine's instant at that reading.
    machine: Instant,
}

impl Timeline {
    /// Running since the runtime's epoch: the machine's instants are the runtime's.
    pub(crate) const CLOCK: Timeline = Timeline { clock: Instant::ZERO, machine: Instant::ZERO };

    /// Paused: the machine's time stands still until [`resume`](Self::resume).
    pub(crate) const PAUSED: Timeline = Timeline { clock: Instant::MAX, machine: Instant::ZERO };

    /// Whether the machine's time follows the clock.
    #[inline]
    pub(crate) fn is_running(&self) -> bool {
        self.clock != Instant::MAX
    }

    /// Goes on from the machine's instant `stood` with the clock (read once); a running
    /// timeline is left as it is.
    #[inline]
    pub(crate) fn resume<Rt: Runtime>(&mut self, rt: &Rt, stood: Instant) {
        if !self.is_running() {
            *self = Timeline { clock: rt.now(), machine: stood };
        }
    }

    /// Stops the machine's time where it is.
    #[inline]
    pub(crate) fn pause(&mut self) {
        self.clock = Instant::MAX;
    }

    /// The machine's time now, never earlier than `stood` (the latest instant it accepted):
    /// the clock's reading while running, `stood` while paused.
    #[inline]
    pub(crate) fn now<Rt: Runtime>(&self, rt: &Rt, stood: Instant) -> Instant {
        if !self.is_running() {
            return stood;
        }
        self.machine.saturating_add(rt.now().saturating_duration_since(self.clock)).later(stood)
    }

    /// The machine's time after a timer set for its instant `due` fired: whatever was due is.
    #[inline]
    pub(crate) fn woken<Rt: Runtime>(&self, rt: &Rt, stood: Instant, due: Instant) -> Instant {
        self.now(rt, stood).later(due)
    }

    /// A timer for the machine's instant `at`, on the runtime's clock. Only a running timeline
    /// can set one: a paused one does not know when `at` will come.
    #[inline]
    pub(crate) fn sleep_until<Rt: Runtime>(&self, rt: &Rt, at: Instant) -> Rt::Sleep {
        debug_assert!(self.is_running(), "a timer on a paused timeline");
        rt.sleep_until(self.clock.saturating_add(at.saturating_duration_since(self.machine)))
    }
}
