//! A circuit breaker, written once for the breaker fuzz target and the breaker family: its
//! closed window (K2: which calls it holds, in the shape its policy counts in, and whether a
//! trip rule holds after each call) and its every transition and permit (`BreakerModel`:
//! K1–K5).

use std::collections::VecDeque;
use std::time::Duration;

use persevere::{
    Breaker, BreakerError, BreakerPolicy, BreakerStatus, CallOutcome, Instant, Permit, Rejected, WindowCounts,
};

use super::Judge;
use super::backoff::{adopt, delay_bounds};

/// The bit that marks a probe's permit id.
const PROBE_BIT: u32 = 1 << 31;

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

/// Where a breaker is, with what each state holds.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    Closed(Window),
    Open { until: Instant },
    HalfOpen { probes: Vec<(u32, Instant)>, successes: u32 },
    Isolated,
    Disabled,
}

/// What a [`persevere::Breaker`] must be, restated from K1–K5.
#[derive(Clone, Debug)]
pub(crate) struct BreakerModel {
    pub(crate) id: u32,
    pub(crate) phase: Phase,
    pub(crate) generation: u32,
    next_id: u32,
    in_flight: u32,
    pub(crate) last_now: Instant,
    pub(crate) openings: u32,
    pub(crate) last_open_ns: u64,
}

/// What the model says a permit must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PermitModel {
    pub(crate) breaker: u32,
    pub(crate) generation: u32,
    pub(crate) id: u32,
    pub(crate) acquired_at: Instant,
}

impl PermitModel {
    /// What `permit` carries.
    pub(crate) fn of(permit: &Permit) -> Self {
        PermitModel {
            breaker: permit.breaker(),
            generation: permit.generation(),
            id: permit.id(),
            acquired_at: permit.acquired_at(),
        }
    }
}

impl BreakerModel {
    /// A new closed breaker with `id`, under `rules`.
    pub(crate) fn new(id: u32, rules: &Rules) -> Self {
        BreakerModel {
            id,
            phase: Phase::Closed(Window::new(rules)),
            generation: 0,
            next_id: 0,
            in_flight: 0,
            last_now: Instant::ZERO,
            openings: 0,
            last_open_ns: 0,
        }
    }

    /// The status the breaker must report.
    pub(crate) fn status(&self) -> BreakerStatus {
        match &self.phase {
            Phase::Closed(_) => BreakerStatus::Closed,
            Phase::Open { until } => BreakerStatus::Open { until: *until },
            Phase::HalfOpen { probes, .. } => BreakerStatus::HalfOpen { permits: probes.len() as u32 },
            Phase::Isolated => BreakerStatus::Isolated,
            Phase::Disabled => BreakerStatus::Disabled,
        }
    }

    /// When the breaker's timeout is due: the open period's end, or the earliest probe lease.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Open { until } => Some(*until),
            Phase::HalfOpen { probes, .. } => probes.iter().map(|p| p.1).min(),
            _ => None,
        }
    }

    /// A new state, in a new generation (K5: every permit of the old one is stale).
    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.generation = self.generation.wrapping_add(1);
        self.in_flight = 0;
    }

    /// K3: opens for the next open duration, counted from `at` (or the latest time seen), by
    /// an input at `now`. The duration is the one the machine drew ([`adopt`]): `observed` is
    /// where its open period ends after the same input, `None` when it is no longer open (then
    /// the period ended by `now`, so it was at most `now - at`).
    fn open(&mut self, policy: &BreakerPolicy, at: Instant, now: Instant, observed: Option<Instant>) {
        let at = self.last_now.later(at);
        self.openings = self.openings.saturating_add(1);
        let bounds = delay_bounds(policy.open_backoff(), self.openings, self.last_open_ns);
        self.last_open_ns = adopt(Some(observed.unwrap_or(now)), at, bounds, |_| false);
        self.last_now = at;
        self.enter(Phase::Open { until: at.saturating_add(Duration::from_nanos(self.last_open_ns)) });
    }

    /// K4: a lease past its deadline is a failure at that deadline.
    fn expire(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        if let Phase::HalfOpen { probes, .. } = &self.phase
            && let Some(earliest) = probes.iter().map(|p| p.1).min()
            && earliest <= now
        {
            self.open(policy, earliest, now, observed);
            self.last_now = self.last_now.later(now);
        }
    }

    /// Everything due at `now` in one step: overdue leases expire (reopening at the earliest
    /// deadline), then an open period that has ended turns half-open.
    fn settle(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        self.expire(policy, now, observed);
        if let Phase::Open { until } = self.phase
            && until <= now
        {
            self.last_now = now;
            self.enter(Phase::HalfOpen { probes: Vec::new(), successes: 0 });
        }
    }

    /// A closed (or disabled) breaker's permit.
    fn issue(&mut self, now: Instant) -> PermitModel {
        let id = self.next_id;
        self.next_id = (id + 1) & !PROBE_BIT;
        self.in_flight = self.in_flight.wrapping_add(1);
        PermitModel { breaker: self.id, generation: self.generation, id, acquired_at: now }
    }

    /// K1, K4: a call asks to go through at `now`; `observed` is where the breaker's open
    /// period ends after the same input (see [`BreakerModel::open`]).
    pub(crate) fn acquire(
        &mut self,
        policy: &BreakerPolicy,
        rules: &Rules,
        now: Instant,
        observed: Option<Instant>,
    ) -> Result<PermitModel, Rejected> {
        match self.phase {
            Phase::Closed(_) | Phase::Disabled => return Ok(self.issue(now)),
            Phase::Isolated => return Err(Rejected { retry_after: None }),
            Phase::Open { until } if now < until && self.last_now < until => {
                return Err(Rejected { retry_after: Some(until.saturating_duration_since(self.last_now.later(now))) });
            }
            _ => {}
        }
        let now = self.last_now.later(now);
        self.settle(policy, now, observed);
        match &mut self.phase {
            Phase::HalfOpen { probes, .. } => {
                if probes.len() as u32 >= rules.permits {
                    let earliest = probes.iter().map(|p| p.1).min().unwrap_or(now);
                    return Err(Rejected { retry_after: Some(earliest.saturating_duration_since(now)) });
                }
                let id = self.next_id | PROBE_BIT;
                self.next_id = (self.next_id + 1) & !PROBE_BIT;
                probes.push((id, now.saturating_add(Duration::from_nanos(rules.probe_ns))));
                self.last_now = now;
                Ok(PermitModel { breaker: self.id, generation: self.generation, id, acquired_at: now })
            }
            Phase::Open { until } => Err(Rejected { retry_after: Some(until.saturating_duration_since(now)) }),
            _ => unreachable!("only an open or half-open breaker gets here"),
        }
    }

    /// K2, K4, K5: a call's outcome, `elapsed_ns` after it was admitted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        policy: &BreakerPolicy,
        rules: &Rules,
        now: Instant,
        permit: PermitModel,
        outcome: CallOutcome,
        elapsed_ns: u64,
        observed: Option<Instant>,
    ) -> Result<(), BreakerError> {
        if permit.breaker != self.id {
            return Err(BreakerError::Foreign { this: self.id, got: permit.breaker });
        }
        if permit.generation != self.generation {
            return Err(BreakerError::Stale { current: self.generation, got: permit.generation });
        }
        match &mut self.phase {
            Phase::Closed(window) => {
                if self.in_flight == 0 {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                self.in_flight -= 1;
                if outcome != CallOutcome::Ignored
                    && window.push(rules, now, outcome == CallOutcome::Failure, elapsed_ns >= rules.slow_ns)
                {
                    self.open(policy, now, now, observed);
                }
                Ok(())
            }
            Phase::Disabled => {
                if self.in_flight == 0 {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                self.in_flight -= 1;
                Ok(())
            }
            Phase::HalfOpen { probes, .. } => {
                if !probes.iter().any(|p| p.0 == permit.id) {
                    return Err(BreakerError::NotOutstanding { id: permit.id });
                }
                let now = self.last_now.later(now);
                // A lease that ended before its result came already counted as a failure.
                let generation = self.generation;
                self.settle(policy, now, observed);
                self.last_now = now;
                if self.generation != generation {
                    return Ok(());
                }
                let Phase::HalfOpen { probes, successes } = &mut self.phase else { return Ok(()) };
                probes.retain(|p| p.0 != permit.id);
                let failed = match outcome {
                    CallOutcome::Ignored => return Ok(()),
                    CallOutcome::Failure => true,
                    CallOutcome::Success => rules.slow_ppm <= PPM && elapsed_ns >= rules.slow_ns,
                };
                if failed {
                    self.open(policy, now, now, observed);
                } else {
                    *successes = successes.saturating_add(1);
                    if *successes >= rules.close_after {
                        self.openings = 0;
                        self.last_open_ns = 0;
                        self.enter(Phase::Closed(Window::new(rules)));
                    }
                }
                Ok(())
            }
            Phase::Open { .. } | Phase::Isolated => Err(BreakerError::NotOutstanding { id: permit.id }),
        }
    }

    /// Whatever is due at `now`: an expired lease, the end of the open period.
    pub(crate) fn timeout(&mut self, policy: &BreakerPolicy, now: Instant, observed: Option<Instant>) {
        let now = self.last_now.later(now);
        self.settle(policy, now, observed);
    }

    /// K1: isolated by hand: every call is rejected.
    pub(crate) fn isolate(&mut self, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Isolated);
    }

    /// K1: disabled by hand: every call goes through, nothing is counted.
    pub(crate) fn disable(&mut self, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.enter(Phase::Disabled);
    }

    /// K1: reset by hand: closed, with a fresh window and the open backoff from its start.
    pub(crate) fn reset(&mut self, rules: &Rules, now: Instant) {
        self.last_now = self.last_now.later(now);
        self.openings = 0;
        self.last_open_ns = 0;
        self.enter(Phase::Closed(Window::new(rules)));
    }

    /// Permits of closed (or disabled) calls issued in this generation and not recorded.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Probes out, in half-open: their ids and lease deadlines.
    pub(crate) fn probes(&self) -> &[(u32, Instant)] {
        match &self.phase {
            Phase::HalfOpen { probes, .. } => probes,
            _ => &[],
        }
    }
}

/// Where `breaker`'s open period ends, if it is open: what the model adopts as its draw.
pub(crate) fn open_until(breaker: &Breaker) -> Option<Instant> {
    match breaker.status() {
        BreakerStatus::Open { until } => Some(until),
        _ => None,
    }
}

impl BreakerModel {
    /// Holds `breaker` to the model: its status and generation, its openings (K3), its timeout
    /// (K4), its probes (G8; `switched`: it is driven under another policy than the one its
    /// probes were admitted under) and its closed window (K2).
    pub(crate) fn check<J: Judge>(
        &self,
        judge: &mut J,
        policy: &BreakerPolicy,
        switched: bool,
        breaker: &Breaker,
    ) -> Result<(), J::Error> {
        let status = breaker.status();
        judge.check("model", status == self.status(), || {
            format!("status {status:?}, the model expects {:?}", self.status())
        })?;
        judge.check("model", breaker.generation() == self.generation, || {
            format!("generation {}, expected {}", breaker.generation(), self.generation)
        })?;
        judge.check("K3", breaker.openings() == self.openings, || {
            format!("{} openings, the model counts {}", breaker.openings(), self.openings)
        })?;
        let timeout = breaker.poll_timeout();
        judge.check("K4", timeout == self.poll_timeout(), || {
            format!("poll_timeout {timeout:?}, expected {:?}", self.poll_timeout())
        })?;
        match status {
            BreakerStatus::HalfOpen { permits } => {
                // Under a replaced policy with fewer permits, probes admitted before stay out
                // (and no more are admitted).
                judge.check("G8", switched || permits <= policy.half_open_permits(), || {
                    format!("{permits} probes out (permits {})", policy.half_open_permits())
                })?;
                judge.check("K4", permits == 0 || timeout.is_some(), || {
                    "probes are out but nothing times them out: the breaker could wedge".into()
                })?;
            }
            BreakerStatus::Open { until } => {
                judge.check("K4", timeout == Some(until), || {
                    format!("open until {until:?} but poll_timeout is {timeout:?}")
                })?;
            }
            _ => {}
        }
        if let Phase::Closed(window) = &self.phase {
            // A window without a rate rule counts no calls; one made under another policy keeps
            // its counts until its next recorded call rebuilds it.
            let expected = window.counts();
            let got = breaker.window_counts();
            judge.check("K2", got == Some(expected), || format!("window counts {got:?}, the model counts {expected:?}"))
        } else {
            judge.check("K2", breaker.window_counts().is_none(), || "window counts outside the closed state".into())
        }
    }
}
