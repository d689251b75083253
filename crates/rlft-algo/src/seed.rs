//! Seeds and small deterministic generators, shared by every crate so that one formula is
//! written once.
//!
//! Every random choice in rlft is a function of the recipe's seed and a position (a step, an
//! epoch, an example index): [`spread`] turns consecutive positions into far-apart `u64`s before
//! they are combined with a seed, [`mix64`] scrambles a `u64` (SplitMix64's finaliser),
//! [`unit_hash`] gives a uniform number in `[0, 1)` for a `(seed, index)` pair, [`SplitMix64`]
//! is a stream of such numbers, and [`xorshift64`] is the one-line generator used for
//! permutations and test data.
//!
//! These formulas fix the numbers a run draws: changing one changes every run's results.

/// 2⁶⁴ / φ (the golden ratio), odd: SplitMix64's increment, and the multiplier of Fibonacci
/// hashing ([`spread`]).
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// `x · GOLDEN_GAMMA` (wrapping): consecutive integers land far apart in the `u64` range, so
/// `seed ^ spread(step)` differs in many bits from one step to the next.
#[inline]
pub const fn spread(x: u64) -> u64 {
    x.wrapping_mul(GOLDEN_GAMMA)
}

/// SplitMix64's finaliser (Stafford's variant 13): a bijection of `u64` whose every output bit
/// depends on every input bit.
#[inline]
pub const fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A number in `[0, 1)` that depends only on `seed` and `index`: [`mix64`] of
/// `seed ^ spread(index)`, divided by 2⁶⁴.
#[inline]
pub fn unit_hash(seed: u64, index: u64) -> f64 {
    mix64(seed ^ spread(index)) as f64 / 18_446_744_073_709_551_616.0
}

/// One step of Marsaglia's xorshift64 (shifts 13, 7, 17): the next state, which is also the
/// output. A zero state stays zero, so seed it with an odd number (e.g. `spread(seed) | 1`).
#[inline]
pub const fn xorshift64(mut s: u64) -> u64 {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    s
}

/// The SplitMix64 generator (Steele, Lea and Flood 2014): the state advances by
/// [`GOLDEN_GAMMA`] and each output is [`mix64`] of it. Host-side and portable, so the same
/// seed draws the same numbers on every device.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is `mix64(seed + GOLDEN_GAMMA)`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A uniform number in the open interval `(0, 1)` from the top 53 bits of
    /// [`SplitMix64::next_u64`] (never 0, so its logarithm is finite).
    #[inline]
    pub fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUTS: [u64; 6] = [0, 1, 2, 42, 0xDEAD_BEEF, u64::MAX];

    /// The formula `unit_hash` replaced (rlft-train's trainer), verbatim.
    fn old_unit_hash(seed: u64, index: u64) -> f64 {
        let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / 18_446_744_073_709_551_616.0
    }

    /// The generator `SplitMix64` replaced (rlft-model's `init_seeded`), verbatim.
    fn old_uniforms(seed: u64, n: usize) -> Vec<f64> {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut uniform = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n).map(|_| uniform()).collect()
    }

    /// The xorshift step `xorshift64` replaced (learn.rs, gpu_bench, tests/backends), verbatim.
    fn old_xorshift(mut s: u64) -> u64 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }

    #[test]
    fn unit_hash_matches_the_old_formula() {
        for seed in INPUTS {
            for index in INPUTS {
                assert_eq!(
                    unit_hash(seed, index).to_bits(),
                    old_unit_hash(seed, index).to_bits()
                );
            }
        }
    }

    #[test]
    fn splitmix_matches_the_old_generator() {
        for seed in INPUTS {
            let mut g = SplitMix64::new(seed ^ GOLDEN_GAMMA);
            let new: Vec<u64> = (0..20).map(|_| g.next_open01().to_bits()).collect();
            let old: Vec<u64> = old_uniforms(seed, 20).iter().map(|u| u.to_bits()).collect();
            assert_eq!(new, old);
        }
    }

    #[test]
    fn xorshift_and_spread_match_the_old_formulas() {
        for x in INPUTS {
            assert_eq!(xorshift64(x), old_xorshift(x));
            assert_eq!(spread(x), x.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
    }

    /// The published SplitMix64 reference outputs for seed 1234567.
    #[test]
    fn splitmix_reference_values() {
        let mut g = SplitMix64::new(1234567);
        let want = [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for w in want {
            assert_eq!(g.next_u64(), w);
        }
    }

    #[test]
    fn unit_hash_is_uniform_and_depends_on_the_seed() {
        let below = |seed| {
            (0..20_000u64)
                .filter(|&i| unit_hash(seed, i) < 0.75)
                .count()
        };
        for seed in [0, 7] {
            let share = below(seed) as f64 / 20_000.0;
            assert!((share - 0.75).abs() < 0.015, "seed {seed}: {share}");
        }
        assert_ne!(unit_hash(0, 5), unit_hash(1, 5));
        assert!((0..1000).all(|i| (0.0..1.0).contains(&unit_hash(3, i))));
    }

    #[test]
    fn open01_stays_inside_the_interval() {
        let mut g = SplitMix64::new(7);
        assert!((0..10_000).all(|_| {
            let u = g.next_open01();
            u > 0.0 && u < 1.0
        }));
    }
}
