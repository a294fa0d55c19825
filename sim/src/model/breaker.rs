//! A circuit breaker's closed window (K2), written once for the breaker fuzz target and the
//! breaker family: which calls it holds, in the shape its policy counts in, and whether a trip
//! rule holds after each call.

use std::collections::VecDeque;

use persevere::{Instant, WindowCounts};

/// Parts per million: a rate of 1.
pub(crate) const PPM: u64 = 1_000_000;

/// A breaker's trip rules (K2) and probe rules (K4), as a model reads them: a count of
/// `u64::MAX` and a rate above [`PPM`] for a rule that is off.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    pub(crate) consecutive: u64,
    pub(crate) failure_ppm: u64,
    pub(crate) slow_ppm: u64,
    pub(crate) slow_ns: u64,
    /// `Some(n)`: the last `n` calls; `None`: a time window.
    pub(crate) calls: Option<u32>,
    pub(crate) width_ns: u64,
    pub(crate) buckets: u32,
    pub(crate) minimum: u32,
    pub(crate) permits: u32,
    pub(crate) close_after: u32,
    pub(crate) probe_ns: u64,
}

impl Rules {
    /// Whether a rate rule is on (the window counts calls only then).
    pub(crate) fn rates(&self) -> bool {
        self.failure_ppm <= PPM || self.slow_ppm <= PPM
    }

    /// The shape of window these rules count in: none without a rate rule (K2).
    pub(crate) fn shape(&self) -> Shape {
        match (self.rates(), self.calls) {
            (false, _) => Shape::None,
            (true, Some(n)) => Shape::Calls(n),
            (true, None) => Shape::Time { width_ns: self.width_ns, buckets: self.buckets },
        }
    }
}

/// What a closed window counts in: nothing (consecutive failures only), the last `n` calls, or
/// `buckets` buckets of `width_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Shape {
    #[default]
    None,
    Calls(u32),
    Time {
        width_ns: u64,
        buckets: u32,
    },
}

/// A closed breaker's window: every call in it, in a plain list, in the shape it was made for.
#[derive(Clone, Debug, Default)]
pub(crate) struct Window {
    shape: Shape,
    consecutive: u32,
    /// `(epoch, failed, slow)`; the epoch is 0 for a count window.
    calls: VecDeque<(u64, bool, bool)>,
    latest_epoch: u64,
}

impl Window {
    /// An empty window for `rules`.
    pub(crate) fn new(rules: &Rules) -> Self {
        Window { shape: rules.shape(), ..Window::default() }
    }

    /// Counts a call; returns whether a trip rule holds (K2). A window made for another shape
    /// (under another policy) starts over empty in this one's, keeping the consecutive
    /// failures: calls counted in one shape are never read in another.
    pub(crate) fn push(&mut self, rules: &Rules, now: Instant, failed: bool, slow: bool) -> bool {
        if self.shape != rules.shape() {
            *self = Window { consecutive: self.consecutive, ..Window::new(rules) };
        }
        self.consecutive = if failed { self.consecutive.wrapping_add(1) } else { 0 };
        match self.shape {
            Shape::None => {}
            Shape::Calls(n) => {
                self.calls.push_back((0, failed, slow));
                if self.calls.len() > n as usize {
                    self.calls.pop_front();
                }
            }
            Shape::Time { width_ns, buckets } => {
                // A call is counted in the bucket of its time, or of the latest time seen
                // when it comes earlier; a bucket leaves the window whole.
                self.latest_epoch = self.latest_epoch.max(now.as_nanos() / width_ns);
                self.calls.push_back((self.latest_epoch, failed, slow));
                let latest = self.latest_epoch;
                self.calls.retain(|&(epoch, _, _)| latest - epoch < u64::from(buckets));
            }
        }
        let counts = self.counts();
        let calls = u64::from(counts.calls);
        u64::from(self.consecutive) >= rules.consecutive
            || (counts.calls >= rules.minimum
                && (u64::from(counts.failures) * PPM >= rules.failure_ppm * calls
                    || u64::from(counts.slow) * PPM >= rules.slow_ppm * calls))
    }

    /// What the window holds, as the breaker reports it.
    pub(crate) fn counts(&self) -> WindowCounts {
        WindowCounts {
            calls: self.calls.len() as u32,
            failures: self.calls.iter().filter(|c| c.1).count() as u32,
            slow: self.calls.iter().filter(|c| c.2).count() as u32,
            consecutive_failures: self.consecutive,
        }
    }
}
