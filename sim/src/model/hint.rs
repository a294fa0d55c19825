//! B6: what a failure that names its own delay (a hint, `Retry-After`) does, written once for
//! the retry and delivery families and the retry fuzz model (the supervision family and fuzz
//! model keep their own check of it: not yet moved here).

use core::time::Duration;

use persevere::Instant;

/// B6: a hint of `hinted` given at `now` is waited in full when it is within `max_hint` and its
/// instant within the total budget's end (`budget_end`, [`Instant::MAX`] for none); otherwise
/// it ends the operation at once, deferred to that instant. Returns the instant, and whether
/// the hint defers.
pub fn hinted(now: Instant, hinted: Duration, max_hint: Duration, budget_end: Instant) -> (Instant, bool) {
    let retry_at = now.saturating_add(hinted);
    (retry_at, hinted > max_hint || retry_at > budget_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b6_a_hint_is_waited_within_max_hint_and_the_budget_and_defers_past_either() {
        let (ms, at) = (Duration::from_millis, |n: u64| Instant::from_nanos(n * 1_000_000));
        assert_eq!(hinted(at(10), ms(5), ms(5), at(15)), (at(15), false), "both bounds inclusive");
        assert_eq!(hinted(at(10), ms(6), ms(5), Instant::MAX), (at(16), true), "past max_hint");
        assert_eq!(hinted(at(10), ms(5), ms(9), at(14)), (at(15), true), "past the budget");
        assert_eq!(hinted(Instant::MAX, ms(1), Duration::MAX, Instant::MAX), (Instant::MAX, false));
    }
}
