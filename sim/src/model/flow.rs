//! A scheduled flow's dispatch rules, written once for the `flow` family and the flow fuzz
//! target: when an every-flow is due (F5, F10) and why a cron tick is skipped (F6).

use persevere::{Instant, SkipReason};

/// F5, F10: an every-flow is due at `max(run_end + interval, next_eligible)` (`interval_due` is
/// the first); never while a run is in flight or the flow is tripped.
pub fn due(running_or_tripped: bool, interval_due: Instant, next_eligible: Option<Instant>) -> Option<Instant> {
    if running_or_tripped { None } else { Some(next_eligible.map_or(interval_due, |until| until.later(interval_due))) }
}

/// F6: why a cron tick at `tick` is skipped, if it is: a run is in flight, the flow is
/// tripped, or the tick falls before the backoff window's end. Skipped ticks are never replayed.
pub fn tick_skip(running: bool, tripped: bool, next_eligible: Option<Instant>, tick: Instant) -> Option<SkipReason> {
    match next_eligible {
        _ if running => Some(SkipReason::Running),
        _ if tripped => Some(SkipReason::Tripped),
        Some(until) if tick < until => Some(SkipReason::InBackoff { until }),
        _ => None,
    }
}
