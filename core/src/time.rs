//! Time as plain data: the core never reads a clock.
//!
//! Every mutating call on a machine takes `now: Instant`. The driver decides what an `Instant`
//! means: nanoseconds since it started, since the Unix epoch, or a virtual clock in a simulator.
//! Spans are [`core::time::Duration`].
//!
//! **Time never runs backwards inside a machine.** A `now` earlier than the latest one a machine
//! has accepted is treated as that latest one, so a clock that stalls or steps back can delay a
//! decision but never reorder one.

use core::time::Duration;

/// A point in time: whole nanoseconds since an epoch that the driver chooses.
///
/// `u64` nanoseconds cover about 584 years from the epoch. All arithmetic is checked or
/// saturating; nothing here can panic.
///
/// ```
/// use core::time::Duration;
/// use persevere::Instant;
///
/// let start = Instant::from_millis(1_500);
/// let later = start.saturating_add(Duration::from_millis(250));
/// assert_eq!(later.saturating_duration_since(start), Duration::from_millis(250));
/// assert_eq!(start.saturating_duration_since(later), Duration::ZERO);
/// assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Instant(u64);

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant (about 584 years after the epoch).
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// The instant `micros` microseconds after the epoch, saturating at [`Instant::MAX`].
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros.saturating_mul(1_000))
    }

    /// The instant `millis` milliseconds after the epoch, saturating at [`Instant::MAX`].
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// The instant `secs` seconds after the epoch, saturating at [`Instant::MAX`].
    pub const fn from_secs(secs: u64) -> Self {
        Instant(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The span since the epoch.
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + span`, or `None` if the result is later than [`Instant::MAX`].
    pub const fn checked_add(self, span: Duration) -> Option<Instant> {
        match nanos_of(span) {
            Some(n) => match self.0.checked_add(n) {
                Some(t) => Some(Instant(t)),
                None => None,
            },
            None => None,
        }
    }

    /// `self + span`, saturating at [`Instant::MAX`].
    pub const fn saturating_add(self, span: Duration) -> Instant {
        Instant(self.0.saturating_add(saturating_nanos(span)))
    }

    /// `self + nanos` nanoseconds, saturating at [`Instant::MAX`]: the machines' own delays are
    /// whole nanoseconds already, and going through a `Duration` would cost a division.
    #[inline]
    pub(crate) const fn saturating_add_nanos(self, nanos: u64) -> Instant {
        Instant(self.0.saturating_add(nanos))
    }

    /// `self - span`, or `None` if the result is earlier than the epoch.
    pub const fn checked_sub(self, span: Duration) -> Option<Instant> {
        match nanos_of(span) {
            Some(n) => match self.0.checked_sub(n) {
                Some(t) => Some(Instant(t)),
                None => None,
            },
            None => None,
        }
    }

    /// `self - span`, saturating at [`Instant::ZERO`].
    pub const fn saturating_sub(self, span: Duration) -> Instant {
        Instant(self.0.saturating_sub(saturating_nanos(span)))
    }

    /// The span from `earlier` to `self`, or `None` if `earlier` is later than `self`.
    pub const fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        match self.0.checked_sub(earlier.0) {
            Some(n) => Some(Duration::from_nanos(n)),
            None => None,
        }
    }

    /// The span from `earlier` to `self`, or zero if `earlier` is later than `self`.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The later of two instants (`const` twin of [`Ord::max`]).
    pub const fn later(self, other: Instant) -> Instant {
        if self.0 >= other.0 { self } else { other }
    }

    /// The earlier of two instants (`const` twin of [`Ord::min`]).
    pub const fn earlier(self, other: Instant) -> Instant {
        if self.0 <= other.0 { self } else { other }
    }
}

/// `instant + span`, saturating at [`Instant::MAX`] (as [`Instant::saturating_add`]), so that
/// code that moves a clock by hand reads naturally: `now + Duration::from_millis(5)`.
///
/// ```
/// use core::time::Duration;
/// use persevere::Instant;
///
/// let now = Instant::from_secs(1) + Duration::from_millis(500);
/// assert_eq!(now, Instant::from_millis(1_500));
/// assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
/// ```
impl core::ops::Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, span: Duration) -> Instant {
        self.saturating_add(span)
    }
}

/// `instant += span`, saturating at [`Instant::MAX`].
impl core::ops::AddAssign<Duration> for Instant {
    fn add_assign(&mut self, span: Duration) {
        *self = self.saturating_add(span);
    }
}

/// `instant - span`, saturating at [`Instant::ZERO`] (as [`Instant::saturating_sub`]).
///
/// ```
/// use core::time::Duration;
/// use persevere::Instant;
///
/// assert_eq!(Instant::from_secs(2) - Duration::from_secs(1), Instant::from_secs(1));
/// assert_eq!(Instant::ZERO - Duration::from_secs(1), Instant::ZERO);
/// ```
impl core::ops::Sub<Duration> for Instant {
    type Output = Instant;

    fn sub(self, span: Duration) -> Instant {
        self.saturating_sub(span)
    }
}

/// `instant -= span`, saturating at [`Instant::ZERO`].
impl core::ops::SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, span: Duration) {
        *self = self.saturating_sub(span);
    }
}

/// `later - earlier`: the span between two instants, zero if `earlier` is in fact later (as
/// [`Instant::saturating_duration_since`]; time never runs backwards here either).
///
/// ```
/// use core::time::Duration;
/// use persevere::Instant;
///
/// assert_eq!(Instant::from_secs(3) - Instant::from_secs(1), Duration::from_secs(2));
/// assert_eq!(Instant::from_secs(1) - Instant::from_secs(3), Duration::ZERO);
/// ```
impl core::ops::Sub<Instant> for Instant {
    type Output = Duration;

    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// A span in whole nanoseconds, or `None` if it does not fit in `u64` (more than ~584 years).
pub(crate) const fn nanos_of(span: Duration) -> Option<u64> {
    let secs_ns = match span.as_secs().checked_mul(1_000_000_000) {
        Some(n) => n,
        None => return None,
    };
    secs_ns.checked_add(span.subsec_nanos() as u64)
}

/// A span in whole nanoseconds, saturating at `u64::MAX`.
pub(crate) const fn saturating_nanos(span: Duration) -> u64 {
    match nanos_of(span) {
        Some(n) => n,
        None => u64::MAX,
    }
}

/// Converts between [`std::time::Instant`] and the core's [`Instant`], relative to an origin.
///
/// The core never reads a clock; a driver that does keeps one `Epoch` and converts each reading.
/// Readings before the origin map to [`Instant::ZERO`]; readings more than ~584 years after it
/// map to [`Instant::MAX`].
///
/// ```
/// use persevere::{Epoch, Instant};
///
/// let origin = std::time::Instant::now();
/// let epoch = Epoch::new(origin);
/// assert_eq!(epoch.instant(origin), Instant::ZERO);
/// let later = origin + std::time::Duration::from_millis(5);
/// assert_eq!(epoch.instant(later), Instant::from_millis(5));
/// assert_eq!(epoch.to_std(Instant::from_millis(5)), Some(later));
/// ```
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch {
    origin: std::time::Instant,
}

#[cfg(feature = "std")]
impl Epoch {
    /// An epoch whose [`Instant::ZERO`] is `origin`.
    pub const fn new(origin: std::time::Instant) -> Self {
        Epoch { origin }
    }

    /// The `std` instant that is [`Instant::ZERO`].
    pub const fn origin(&self) -> std::time::Instant {
        self.origin
    }

    /// The core instant of a `std` reading.
    pub fn instant(&self, reading: std::time::Instant) -> Instant {
        Instant(saturating_nanos(reading.saturating_duration_since(self.origin)))
    }

    /// The `std` instant of a core instant, or `None` if the platform cannot represent it.
    pub fn to_std(&self, instant: Instant) -> Option<std::time::Instant> {
        self.origin.checked_add(instant.since_epoch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        assert_eq!(Instant::MAX.saturating_add(Duration::MAX), Instant::MAX);
        assert_eq!(Instant::ZERO.saturating_sub(Duration::MAX), Instant::ZERO);
        assert_eq!(Instant::ZERO.checked_add(Duration::MAX), None);
        assert_eq!(Instant::from_secs(1).checked_sub(Duration::from_secs(2)), None);
        assert_eq!(Instant::from_secs(u64::MAX), Instant::MAX);
        assert_eq!(Instant::from_secs(2).checked_duration_since(Instant::from_secs(1)), Some(Duration::from_secs(1)));
        assert_eq!(Instant::from_secs(1).checked_duration_since(Instant::from_secs(2)), None);
    }

    #[test]
    fn nanos_of_rejects_spans_beyond_u64_nanoseconds() {
        assert_eq!(nanos_of(Duration::from_nanos(u64::MAX)), Some(u64::MAX));
        assert_eq!(nanos_of(Duration::from_nanos(u64::MAX) + Duration::from_nanos(1)), None);
        assert_eq!(saturating_nanos(Duration::MAX), u64::MAX);
    }

    #[test]
    fn later_and_earlier_pick_the_right_instant() {
        let (a, b) = (Instant::from_nanos(3), Instant::from_nanos(9));
        assert_eq!(a.later(b), b);
        assert_eq!(b.later(a), b);
        assert_eq!(a.earlier(b), a);
        assert_eq!(b.earlier(a), a);
    }
}
