//! Exact uniform draws over integer nanoseconds from a caller's RNG.

use rand_core::Rng;

/// How many times a draw may be rejected before the last one is accepted. Rejection happens
/// with probability below `span / 2^64` per draw, so the bound is never reached in practice;
/// it only keeps the loop bounded.
const MAX_REJECTIONS: u32 = 64;

/// A uniform draw from `[lo, hi]`, both inclusive. Callers pass `lo <= hi`; should they not,
/// the draw is from `[lo, lo + (hi - lo) mod 2^64]`, never a panic.
///
/// Lemire's multiply-shift with rejection: one 64-bit draw and one widening multiply in the
/// common case, no division unless the first draw lands in the biased zone, no floating point.
#[inline]
pub(crate) fn uniform_inclusive<R: Rng + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    let range = hi.wrapping_sub(lo).wrapping_add(1);
    if range == 0 {
        // The whole of u64.
        return rng.next_u64();
    }
    let product = u128::from(rng.next_u64()) * u128::from(range);
    let offset = if (product as u64) < range { redraw_if_biased(rng, range, product) } else { (product >> 64) as u64 };
    lo.wrapping_add(offset)
}

/// The rare end of Lemire's method, kept out of line so the common path stays a few instructions:
/// the first draw landed below `range`, so it may lie in the biased zone (one division decides).
#[cold]
#[inline(never)]
fn redraw_if_biased<R: Rng + ?Sized>(rng: &mut R, range: u64, mut product: u128) -> u64 {
    let threshold = range.wrapping_neg() % range;
    let mut rejections = 0;
    while (product as u64) < threshold && rejections < MAX_REJECTIONS {
        product = u128::from(rng.next_u64()) * u128::from(range);
        rejections += 1;
    }
    (product >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;

    #[test]
    fn draws_stay_inside_the_closed_range_and_reach_both_ends() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (mut saw_lo, mut saw_hi) = (false, false);
        for _ in 0..10_000 {
            let x = uniform_inclusive(&mut rng, 5, 8);
            assert!((5..=8).contains(&x));
            saw_lo |= x == 5;
            saw_hi |= x == 8;
        }
        assert!(saw_lo && saw_hi);
    }

    #[test]
    fn degenerate_and_full_ranges_do_not_panic() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        assert_eq!(uniform_inclusive(&mut rng, 7, 7), 7);
        let _ = uniform_inclusive(&mut rng, 9, 3);
        let _ = uniform_inclusive(&mut rng, 0, u64::MAX);
        assert!(uniform_inclusive(&mut rng, u64::MAX - 1, u64::MAX) >= u64::MAX - 1);
    }

    /// Hands out a fixed sequence, to reach the rare branches on purpose.
    struct Script {
        values: &'static [u64],
        next: usize,
    }

    impl rand_core::TryRng for Script {
        type Error = core::convert::Infallible;

        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            Ok(self.try_next_u64()? as u32)
        }

        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            self.next += 1;
            Ok(self.values[self.next - 1])
        }

        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            dst.fill(0);
            Ok(())
        }
    }

    #[test]
    fn a_draw_in_the_biased_zone_is_redrawn_and_one_just_above_it_is_kept() {
        // Range 3: 2^64 mod 3 = 1, so a low product of 0 is biased and 1 or 2 are not.
        let mut biased = Script { values: &[0, u64::MAX], next: 0 };
        assert_eq!(uniform_inclusive(&mut biased, 0, 2), 2, "the second value decides");
        assert_eq!(biased.next, 2);
        // 3 · 6148914691236517206 = 2^64 + 2: a low product of 2, checked and kept.
        let mut kept = Script { values: &[6_148_914_691_236_517_206], next: 0 };
        assert_eq!(uniform_inclusive(&mut kept, 0, 2), 1);
        assert_eq!(kept.next, 1);
    }

    #[test]
    fn a_draw_at_the_threshold_is_kept_and_rejections_stop_after_the_bound() {
        // 3 · 0xAAAA_AAAA_AAAA_AAAB = 2^65 + 1: a low product of exactly the threshold (1),
        // which is not biased: kept, offset 2.
        let mut at_threshold = Script { values: &[0xAAAA_AAAA_AAAA_AAAB, 0], next: 0 };
        assert_eq!(uniform_inclusive(&mut at_threshold, 0, 2), 2);
        assert_eq!(at_threshold.next, 1);
        // Biased draws forever: one draw and MAX_REJECTIONS redraws, then the last is kept.
        static ZEROS: [u64; 70] = [0; 70];
        let mut biased = Script { values: &ZEROS, next: 0 };
        assert_eq!(uniform_inclusive(&mut biased, 5, 7), 5);
        assert_eq!(biased.next, 1 + MAX_REJECTIONS as usize);
    }

    #[test]
    fn a_small_range_is_close_to_uniform() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[uniform_inclusive(&mut rng, 0, 2) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }
}
