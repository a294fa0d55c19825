//! The checks a loaded [`Breaker`] passes before it is driven.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Breaker {
    /// Whether a loaded state is one the transitions could have made.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.next_id & PROBE_BIT != 0 || self.settled & PROBE_BIT != 0 {
            return Err("a permit counter has the probe bit set");
        }
        if !self.openings.is_valid() {
            return Err("the open durations' schedule restarted after more openings than it counted");
        }
        match &self.phase {
            Phase::Closed(window) => window.validate(),
            Phase::HalfOpen(probes) => {
                let held = (0..LEASES).filter(|&i| probes.busy & (1 << i) != 0);
                for i in held.clone() {
                    if probes.ids[i] & PROBE_BIT == 0 {
                        return Err("a probe lease holds an id without the probe bit");
                    }
                    if held.clone().any(|j| j != i && probes.ids[j] == probes.ids[i]) {
                        return Err("two probe leases hold the same id");
                    }
                }
                if probes.failed > probes.answered || probes.slow > probes.answered {
                    return Err("more probes failed or were slow than answered");
                }
                Ok(())
            }
            Phase::MetricsOnly(window) => window.validate(),
            Phase::Open { .. } | Phase::Isolated | Phase::Disabled => Ok(()),
        }
    }
}

crate::serde_validated!(Breaker, "a Breaker");
