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
