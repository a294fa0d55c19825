//! The closed breaker's accounting of recent calls (a ring of two-bit slots or time buckets)
//! and the half-open breaker's probes.

#[allow(clippy::wildcard_imports)]
use super::*;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) struct Bucket {
    pub(super) calls: u32,
    pub(super) failures: u32,
    pub(super) slow: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) enum Ring {
    /// The trip rules need no window (consecutive failures only).
    None,
    /// Bits `2i` (failed) and `2i + 1` (slow) of the bitset are call slot `i` of `len`;
    /// `head` is the next slot to write.
    Calls { head: u32, len: u32, bits: [u64; WORDS] },
    /// Epoch `e` (= `now / width`) has a bucket while `e` is among the `count` newest epochs;
    /// `slot` is the newest epoch's bucket, and `start` the instant (ns) that epoch starts (a
    /// multiple of `width`, so it never overflows), so that a call within the current bucket
    /// costs no division.
    Time { start: u64, slot: u32, width: u64, count: u32, buckets: [Bucket; BUCKETS] },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) struct Window {
    pub(super) consecutive: u32,
    pub(super) calls: u32,
    pub(super) failures: u32,
    pub(super) slow: u32,
    /// The policy's `window_key` this window was built for.
    pub(super) key: u64,
    pub(super) ring: Ring,
}

impl Window {
    pub(super) fn new(policy: &BreakerPolicy) -> Self {
        let ring = if policy.window_key == 0 {
            Ring::None
        } else {
            match policy.window {
                WindowSpec::Calls(n) => Ring::Calls { head: 0, len: n.clamp(1, MAX_WINDOW_CALLS), bits: [0; WORDS] },
                WindowSpec::Time { width_ns, buckets } => Ring::Time {
                    start: 0,
                    slot: 0,
                    width: width_ns.max(1),
                    count: buckets.clamp(1, MAX_WINDOW_BUCKETS),
                    buckets: [Bucket::default(); BUCKETS],
                },
            }
        };
        Window { consecutive: 0, calls: 0, failures: 0, slow: 0, key: policy.window_key, ring }
    }

    /// The window for `policy` after one made under another policy: empty, keeping the
    /// consecutive failures (which no window shape changes).
    #[cold]
    pub(super) fn rebuild(&mut self, policy: &BreakerPolicy) {
        let consecutive = self.consecutive;
        *self = Window::new(policy);
        self.consecutive = consecutive;
    }

    /// The key of this window's own shape (what `key` must say).
    pub(super) fn own_key(&self) -> u64 {
        match self.ring {
            Ring::None => 0,
            Ring::Calls { len, .. } => window_key(WindowSpec::Calls(len)),
            Ring::Time { width, count, .. } => window_key(WindowSpec::Time { width_ns: width, buckets: count }),
        }
    }

    /// Whether a loaded window is one `push` could have made.
    pub(super) fn validate(&self) -> Result<(), &'static str> {
        if self.key != self.own_key() {
            return Err("a window's key does not describe its shape");
        }
        let (calls, failures, slow) = match &self.ring {
            Ring::None => (0, 0, 0),
            Ring::Calls { head, len, bits } => {
                if *len == 0 || *len > MAX_WINDOW_CALLS || *head >= *len || self.calls > *len {
                    return Err("a count window's length, head or call count is out of range");
                }
                if self.calls < *len && *head != self.calls {
                    return Err("a count window that is not full does not continue where it stopped");
                }
                let (mut failed, mut slow) = (0u64, 0u64);
                for slot in 0..MAX_WINDOW_CALLS {
                    let pair = (bits[(slot >> 5) as usize] >> ((slot & 31) * 2)) & 3;
                    if slot >= self.calls && pair != 0 {
                        return Err("a count window holds a call in a slot it never wrote");
                    }
                    failed += pair & 1;
                    slow += pair >> 1;
                }
                (u64::from(self.calls), failed, slow)
            }
            Ring::Time { start, slot, width, count, buckets } => {
                if *width == 0 || *width > MAX_BUCKET_WIDTH_NS || *count == 0 || *count > MAX_WINDOW_BUCKETS {
                    return Err("a time window's width or bucket count is out of range");
                }
                if *slot >= *count || !start.is_multiple_of(*width) {
                    return Err("a time window's current bucket is out of range");
                }
                let (mut calls, mut failed, mut slow) = (0u64, 0u64, 0u64);
                for (i, b) in buckets.iter().enumerate() {
                    if (i as u32 >= *count && *b != Bucket::default()) || b.failures > b.calls || b.slow > b.calls {
                        return Err("a time window's bucket holds counts it cannot have");
                    }
                    calls += u64::from(b.calls);
                    failed += u64::from(b.failures);
                    slow += u64::from(b.slow);
                }
                (calls, failed, slow)
            }
        };
        // Totals saturate at `u32::MAX` (more calls than that in one window are counted as
        // that many), so a sum past it stands for a saturated total.
        let saturated = |sum: u64| sum.min(u64::from(u32::MAX));
        if (u64::from(self.calls), u64::from(self.failures), u64::from(self.slow))
            != (saturated(calls), saturated(failures), saturated(slow))
        {
            return Err("a window's totals are not the sums of its calls");
        }
        Ok(())
    }

    /// Which trip rule holds, once [`push`](Self::push) said one does.
    #[cold]
    pub(super) fn trip_reason(&self, policy: &BreakerPolicy) -> BreakerReason {
        if u64::from(self.consecutive) >= policy.consecutive {
            BreakerReason::ConsecutiveFailures
        } else if u64::from(self.failures) * PPM >= policy.failure_ppm * u64::from(self.calls) {
            BreakerReason::FailureRate
        } else {
            BreakerReason::SlowCallRate
        }
    }

    /// Counts one call; returns whether a trip rule now holds. O(1) for a count window, O(1)
    /// amortised for a time window (a division only when the call opens a new bucket).
    #[inline]
    pub(super) fn push(&mut self, policy: &BreakerPolicy, now: Instant, failed: bool, slow: bool) -> bool {
        // Wraps to 0 only after 2^32 failures with no consecutive limit set (a limit trips first).
        self.consecutive = self.consecutive.wrapping_add(1).wrapping_mul(u32::from(failed));
        let (f, s) = (u32::from(failed), u32::from(slow));
        match &mut self.ring {
            Ring::None => return u64::from(self.consecutive) >= policy.consecutive,
            Ring::Calls { head, len, bits } => {
                let slot = *head & (MAX_WINDOW_CALLS - 1);
                let (word, shift) = ((slot >> 5) as usize & (WORDS - 1), (slot & 31) * 2);
                let w = bits[word];
                let old = (w >> shift) as u32;
                bits[word] = (w & !(3 << shift)) | (u64::from(f | (s << 1)) << shift);
                // A set bit was counted when it was set, so these never underflow.
                self.failures = self.failures.wrapping_add(f).wrapping_sub(old & 1);
                self.slow = self.slow.wrapping_add(s).wrapping_sub((old >> 1) & 1);
                self.calls += u32::from(self.calls < *len);
                *head = if slot + 1 >= *len { 0 } else { slot + 1 };
            }
            Ring::Time { start, slot, width, count, buckets } => {
                let now = now.as_nanos();
                // An earlier `now` than the newest epoch's start is read as in that epoch.
                if now.saturating_sub(*start) >= *width {
                    let epoch = now / *width;
                    let current = *start / *width;
                    let gap = epoch.saturating_sub(current).min(u64::from(*count)) as u32;
                    for _ in 0..gap {
                        *slot = if *slot + 1 >= *count { 0 } else { *slot + 1 };
                        let b = &mut buckets[*slot as usize & (BUCKETS - 1)];
                        self.calls = self.calls.saturating_sub(b.calls);
                        self.failures = self.failures.saturating_sub(b.failures);
                        self.slow = self.slow.saturating_sub(b.slow);
                        *b = Bucket::default();
                    }
                    *start = epoch * *width;
                }
                let b = &mut buckets[*slot as usize & (BUCKETS - 1)];
                b.calls = b.calls.saturating_add(1);
                b.failures = b.failures.saturating_add(f);
                b.slow = b.slow.saturating_add(s);
                self.calls = self.calls.saturating_add(1);
                self.failures = self.failures.saturating_add(f);
                self.slow = self.slow.saturating_add(s);
            }
        }
        let calls = u64::from(self.calls);
        u64::from(self.consecutive) >= policy.consecutive
            || (self.calls >= policy.minimum_calls
                && (u64::from(self.failures) * PPM >= policy.failure_ppm * calls
                    || u64::from(self.slow) * PPM >= policy.slow_ppm * calls))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub(super) struct Probes {
    pub(super) successes: u32,
    /// Bit `i` set: lease slot `i` is held.
    pub(super) busy: u16,
    pub(super) ids: [u32; LEASES],
    pub(super) deadlines: [Instant; LEASES],
    /// Under [`HalfOpenRule::Rates`]: probes that answered (recorded, or expired as failures),
    /// and how many of them failed and how many were slow.
    #[cfg_attr(feature = "serde", serde(default))]
    pub(super) answered: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub(super) failed: u32,
    #[cfg_attr(feature = "serde", serde(default))]
    pub(super) slow: u32,
}

impl Probes {
    pub(super) const fn new() -> Self {
        Probes {
            successes: 0,
            busy: 0,
            ids: [0; LEASES],
            deadlines: [Instant::ZERO; LEASES],
            answered: 0,
            failed: 0,
            slow: 0,
        }
    }

    pub(super) const fn held(&self) -> u32 {
        self.busy.count_ones()
    }

    pub(super) fn slot_of(&self, id: u32) -> Option<usize> {
        (0..LEASES).find(|&i| self.busy & (1 << i) != 0 && self.ids[i] == id)
    }

    /// The earliest deadline among held leases.
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.earliest_slot().map(|(_, deadline)| deadline)
    }

    /// The latest deadline among held leases.
    pub(super) fn latest(&self) -> Option<Instant> {
        (0..LEASES).filter(|&i| self.busy & (1 << i) != 0).map(|i| self.deadlines[i]).max()
    }

    /// The held lease with the earliest deadline, and that deadline.
    pub(super) fn earliest_slot(&self) -> Option<(usize, Instant)> {
        (0..LEASES).filter(|&i| self.busy & (1 << i) != 0).map(|i| (i, self.deadlines[i])).min_by_key(|&(_, d)| d)
    }

    /// Counts an answer under [`HalfOpenRule::Rates`].
    pub(super) fn answer(&mut self, failed: bool, slow: bool) {
        self.answered = self.answered.saturating_add(1);
        self.failed = self.failed.saturating_add(u32::from(failed));
        self.slow = self.slow.saturating_add(u32::from(slow));
    }
}

/// The counts of a closed breaker's window; see [`Breaker::window_counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WindowCounts {
    /// Calls in the window.
    pub calls: u32,
    /// Failed calls in the window.
    pub failures: u32,
    /// Slow calls in the window.
    pub slow: u32,
    /// Consecutive failures, ending with the latest call.
    pub consecutive_failures: u32,
}
