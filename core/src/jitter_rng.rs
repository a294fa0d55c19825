//! A small jitter RNG for callers that have none: SplitMix64, eight bytes of state.
//!
//! Jitter needs speed and spread, not secrecy. SplitMix64 (Steele, Lea & Flood 2014) passes
//! BigCrush, costs a few instructions per draw and fits in one `u64`, so it can live inside every
//! retried operation and be persisted with it. The core still owns no entropy: the caller picks
//! the seed (the adapters take it from the runtime's entropy, or from a fixed seed for replays).

use core::convert::Infallible;

use rand_core::{SeedableRng, TryRng};

/// SplitMix64: a 64-bit counter passed through a bijective mixer. Not cryptographic.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, BackoffState, Jitter, SplitMix64};
///
/// let backoff = Backoff::exponential(Duration::from_millis(10), 2.0).jitter(Jitter::Full).build()?;
/// let mut rng = SplitMix64::new(42);
/// let delay = BackoffState::new().next_delay(&backoff, &mut rng);
/// assert!(delay <= Duration::from_millis(10));
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose first output is determined by `seed` alone (any value, zero included).
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
}

impl SeedableRng for SplitMix64 {
    type Seed = [u8; 8];

    fn from_seed(seed: [u8; 8]) -> Self {
        SplitMix64(u64::from_le_bytes(seed))
    }

    fn seed_from_u64(state: u64) -> Self {
        SplitMix64(state)
    }
}

impl TryRng for SplitMix64 {
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng;

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (reference implementation, Vigna).
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
        let mut bytes = [0u8; 11];
        rng.fill_bytes(&mut bytes);
        assert_ne!(bytes, [0u8; 11]);
    }

    #[test]
    fn every_way_of_seeding_gives_the_same_generator() {
        let seed = 0x0123_4567_89ab_cdef_u64;
        let by_bytes = SplitMix64::from_seed(seed.to_le_bytes());
        assert_eq!(by_bytes, SplitMix64::new(seed));
        assert_eq!(SplitMix64::seed_from_u64(seed), SplitMix64::new(seed));
        assert_ne!(SplitMix64::new(seed), SplitMix64::new(seed + 1));
    }
}
