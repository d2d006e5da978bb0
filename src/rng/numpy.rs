//! Bit-exact replica of `np.random.default_rng(seed).choice(N, k, replace=False)`.
//!
//! Replicates numpy 2.2.3 (the version pinned by the authors' `uv.lock`), from its sources:
//! - `numpy/random/bit_generator.pyx`: `SeedSequence` (`hashmix`, `mix`, `mix_entropy`,
//!   `generate_state`);
//! - `numpy/random/_pcg64.pyx` + `src/pcg64/pcg64.{h,c}`: `PCG64` seeding (`pcg64_set_seed`,
//!   `pcg_setseq_128_srandom_r`), the XSL-RR 128/64 output (`pcg_setseq_128_xsl_rr_64_random_r`)
//!   and the buffered 32-bit draw (`pcg64_next32`);
//! - `src/distributions/distributions.c`: `random_bounded_uint64` ->
//!   `buffered_bounded_lemire_uint32` (Lemire's nearly-divisionless bounded integers);
//! - `numpy/random/_generator.pyx`: `Generator.choice` (replace=False, p=None, shuffle=True) with
//!   its tail-shuffle and Floyd paths, and `Generator._shuffle_int`.
//!
//! The same code is unchanged in numpy 2.4; the fixture `tests/fixtures/authors_rng.json` was
//! produced by real numpy 2.2.3 (see `scripts/authors_rng_fixtures.py`).
//!
//! Preconditions (violations return `Err`, nothing here panics): the seed is a single 32-bit
//! word (`seed < 2^32`, as all the authors' seeds are), `k <= population`, and
//! `population <= 2^32` (so that every bound numpy draws fits its 32-bit Lemire path).

use std::collections::HashSet;

// Constants of numpy's SeedSequence (`bit_generator.pyx`).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
/// `DEFAULT_POOL_SIZE` in `bit_generator.pyx`.
const POOL_SIZE: usize = 4;

/// numpy's `SeedSequence(seed)` for a seed below 2^32, with an empty spawn key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSequence {
    /// The mixed entropy pool (`SeedSequence.pool`).
    pub pool: [u32; POOL_SIZE],
}

/// `hashmix` in `bit_generator.pyx`: note the hash constant is carried across calls.
fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

/// `mix` in `bit_generator.pyx`.
fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

impl SeedSequence {
    /// `SeedSequence(seed)`. The entropy is the single word `seed` (`_coerce_to_uint32_array`
    /// gives one word for 0 <= seed < 2^32, `[0]` for 0), zero-padded to the pool size
    /// (`get_assembled_entropy`), then mixed by `mix_entropy`.
    ///
    /// # Errors
    /// When `seed >= 2^32` (numpy would use two entropy words; not replicated).
    pub fn new(seed: u64) -> Result<Self, String> {
        let word = u32::try_from(seed)
            .map_err(|_| format!("seed {seed} >= 2^32: only single-word seeds are replicated"))?;
        let entropy = [word, 0, 0, 0];
        let mut hash_const = INIT_A;
        let mut pool = [0u32; POOL_SIZE];
        for (slot, &e) in pool.iter_mut().zip(entropy.iter()) {
            *slot = hashmix(e, &mut hash_const);
        }
        // Every word of the pool is mixed into every other one, source-major.
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    let h = hashmix(pool[src], &mut hash_const);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        // (The loop over entropy words beyond the pool size never runs: the entropy is 4 words.)
        Ok(SeedSequence { pool })
    }

    /// `generate_state(n_words, np.uint32)`: cycle over the pool with a second hash constant.
    pub fn generate_state_u32(&self, n_words: usize) -> Vec<u32> {
        let mut hash_const = INIT_B;
        (0..n_words)
            .map(|i| {
                let mut v = self.pool[i % POOL_SIZE] ^ hash_const;
                hash_const = hash_const.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hash_const);
                v ^ (v >> XSHIFT)
            })
            .collect()
    }

    /// `generate_state(n, np.uint64)`: 2n 32-bit words viewed as little-endian u64 pairs.
    pub fn generate_state_u64(&self, n: usize) -> Vec<u64> {
        self.generate_state_u32(2 * n)
            .chunks_exact(2)
            .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
            .collect()
    }
}

/// The 128-bit LCG multiplier `PCG_DEFAULT_MULTIPLIER_128` (`pcg64.h`).
const PCG_MULT: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// numpy's `PCG64` bit generator (XSL-RR 128/64), including its one-word 32-bit buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg64 {
    state: u128,
    inc: u128,
    /// `has_uint32` / `uinteger` of `pcg64_state`: the saved high half of a 64-bit draw.
    buffered: Option<u32>,
}

impl Pcg64 {
    /// `PCG64(SeedSequence(seed))`, i.e. the bit generator of `np.random.default_rng(seed)`.
    ///
    /// # Errors
    /// When `seed >= 2^32` (see [`SeedSequence::new`]).
    pub fn new(seed: u64) -> Result<Self, String> {
        let s = SeedSequence::new(seed)?.generate_state_u64(4);
        Ok(Self::from_state_words(s[0], s[1], s[2], s[3]))
    }

    /// `pcg64_set_seed(state, &val[0], &val[2])` -> `pcg_setseq_128_srandom_r`:
    /// initstate = s0:s1 (high:low), initseq = s2:s3; inc = initseq << 1 | 1;
    /// state = 0, step, state += initstate, step.
    pub fn from_state_words(s0: u64, s1: u64, s2: u64, s3: u64) -> Self {
        let initstate = (u128::from(s0) << 64) | u128::from(s1);
        let initseq = (u128::from(s2) << 64) | u128::from(s3);
        let mut g = Pcg64 {
            state: 0,
            inc: (initseq << 1) | 1,
            buffered: None,
        };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }

    /// `pcg_setseq_128_step_r`.
    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// `pcg_setseq_128_xsl_rr_64_random_r`: step first, then output
    /// rotr64(high ^ low, state >> 122) of the new state. Does not touch the 32-bit buffer
    /// (numpy's `random_raw` / `next_uint64` do not either).
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let xored = ((self.state >> 64) as u64) ^ (self.state as u64);
        let rot = (self.state >> 122) as u32;
        xored.rotate_right(rot)
    }

    /// `pcg64_next32`: the low half of a fresh 64-bit draw, the high half saved for the next call.
    pub fn next_u32(&mut self) -> u32 {
        if let Some(hi) = self.buffered.take() {
            return hi;
        }
        let next = self.next_u64();
        self.buffered = Some((next >> 32) as u32);
        next as u32
    }
}

/// `random_bounded_uint64(bitgen, 0, rng, 0, use_masked=0)` for `rng < 2^32`: a uniform integer
/// in `[0, rng]` (inclusive). `rng == 0` returns 0 without a draw; `rng == 2^32 - 1` returns a raw
/// `next_uint32`; otherwise `buffered_bounded_lemire_uint32` (its local buffer is empty on entry,
/// so every 32-bit draw goes to the generator's own `next_uint32` buffer).
pub fn bounded(g: &mut Pcg64, rng: u32) -> u32 {
    if rng == 0 {
        return 0;
    }
    if rng == u32::MAX {
        return g.next_u32();
    }
    let rng_excl = rng + 1;
    let mut m = u64::from(g.next_u32()) * u64::from(rng_excl);
    let mut leftover = m as u32;
    if leftover < rng_excl {
        // Reject the (2^32 mod rng_excl) low products that would bias the result.
        let threshold = (u32::MAX - rng) % rng_excl;
        while leftover < threshold {
            m = u64::from(g.next_u32()) * u64::from(rng_excl);
            leftover = m as u32;
        }
    }
    (m >> 32) as u32
}

/// `Generator._shuffle_int(n, first, data)`: for i = n-1 down to `first`,
/// swap data[i] with data[random_bounded_uint64(0, i)].
/// Callers guarantee every bound fits in 32 bits and every index is in range.
fn shuffle_int(g: &mut Pcg64, data: &mut [usize], first: usize) {
    for i in (first..data.len()).rev() {
        let j = bounded(g, i as u32) as usize;
        data.swap(i, j);
    }
}

/// `np.random.default_rng(seed).choice(population, k, replace=False)` (p=None, shuffle=True).
///
/// The two paths of `Generator.choice`:
/// - tail shuffle when `population > 10000 and k > population // 50`: `idx = arange(N)`,
///   `_shuffle_int(N, max(N - k, 1), idx)`, result `idx[N-k:]`;
/// - otherwise Floyd's algorithm: for j in N-k..N draw v = bounded(j); keep v unless it was
///   already chosen, in which case keep j (numpy's open-addressing hash set is only a lookup
///   structure and does not affect the draws), then `_shuffle_int(k, 1, out)`.
///
/// # Errors
/// When `k > population` (numpy raises `ValueError`), `population > 2^32`, or `seed >= 2^32`.
pub fn choice(seed: u64, population: usize, k: usize) -> Result<Vec<usize>, String> {
    if k > population {
        return Err(format!(
            "Cannot take a larger sample ({k}) than population ({population}) when replace=False"
        ));
    }
    if population as u128 > 1u128 << 32 {
        return Err(format!(
            "population {population} > 2^32: numpy's 64-bit Lemire path is not replicated"
        ));
    }
    let mut g = Pcg64::new(seed)?;
    if population > 10_000 && k > population / 50 {
        let mut idx: Vec<usize> = (0..population).collect();
        shuffle_int(&mut g, &mut idx, population.saturating_sub(k).max(1));
        Ok(idx.split_off(population - k))
    } else {
        let mut out = Vec::with_capacity(k);
        let mut chosen = HashSet::with_capacity(k);
        for j in (population - k)..population {
            let v = bounded(&mut g, j as u32) as usize;
            // All earlier picks are < j, so j itself is never already chosen.
            let pick = if chosen.insert(v) { v } else { j };
            chosen.insert(pick);
            out.push(pick);
        }
        shuffle_int(&mut g, &mut out, 1);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // docs/protocol.md §3.1 test vectors (seed 42).

    #[test]
    fn seed_sequence_state_seed42() {
        let s = SeedSequence::new(42).unwrap().generate_state_u64(4);
        assert_eq!(
            s,
            [
                0x9f1e2e6dcd540ab7,
                0xd57873dc79fb94b6,
                0x7d282a1b64d420b7,
                0x336579714692d5ff
            ]
        );
    }

    #[test]
    fn random_raw_seed42() {
        let mut g = Pcg64::new(42).unwrap();
        let raw: Vec<u64> = (0..4).map(|_| g.next_u64()).collect();
        assert_eq!(
            raw,
            [
                0xc621fbcd16d92688,
                0x705a5661a791ffc1,
                0xdbcd12c26eda1624,
                0xb286b60e1600888d
            ]
        );
    }

    #[test]
    fn next_u32_is_buffered_low_then_high() {
        let mut a = Pcg64::new(42).unwrap();
        let mut b = Pcg64::new(42).unwrap();
        let w = a.next_u64();
        assert_eq!(b.next_u32(), w as u32);
        assert_eq!(b.next_u32(), (w >> 32) as u32);
    }

    #[test]
    fn choice_mnist_seed42() {
        let r = choice(42, 60000, 10200).unwrap();
        assert_eq!(
            r[..10],
            [
                54981, 48518, 41233, 30189, 32047, 44867, 34335, 743, 54777, 1126
            ]
        );
        // Fine-tune part = r[P:] with P = 10000.
        assert_eq!(r[10000..10005], [57522, 20269, 7057, 20488, 5241]);
    }

    #[test]
    fn choice_trec_seed42() {
        let r = choice(42, 5452, 3200).unwrap();
        assert_eq!(
            r[..10],
            [2495, 2268, 1160, 1503, 4849, 1897, 353, 2564, 256, 1218]
        );
        // Fine-tune part = r[P:] with P = 3000.
        assert_eq!(r[3000..3005], [1396, 2109, 5136, 3615, 4051]);
    }

    #[test]
    fn choice_cifar10_seed42() {
        let r = choice(42, 50000, 10200).unwrap();
        assert_eq!(r[..5], [34301, 38776, 32953, 24127, 25613]);
    }

    #[test]
    fn choice_agnews_seed42() {
        let r = choice(42, 120000, 10200).unwrap();
        assert_eq!(r[..5], [25410, 94630, 106973, 90909, 66560]);
    }

    #[test]
    fn choice_pneumoniamnist_seed42() {
        let r = choice(42, 4708, 3200).unwrap();
        assert_eq!(r[..5], [1945, 1833, 2969, 1090, 4105]);
    }

    #[test]
    fn choice_breastmnist_seed42() {
        let r = choice(42, 546, 400).unwrap();
        assert_eq!(r[..5], [253, 184, 287, 65, 113]);
    }

    #[test]
    fn choice_is_a_sample_without_replacement() {
        for &(n, k) in &[(60000, 10200), (5452, 3200), (546, 546), (20000, 10)] {
            let r = choice(7, n, k).unwrap();
            assert_eq!(r.len(), k);
            let set: HashSet<usize> = r.iter().copied().collect();
            assert_eq!(set.len(), k);
            assert!(r.iter().all(|&i| i < n));
        }
    }

    #[test]
    fn choice_edge_cases_and_errors() {
        assert_eq!(choice(42, 0, 0).unwrap(), Vec::<usize>::new());
        assert_eq!(choice(42, 1, 1).unwrap(), vec![0]);
        assert!(choice(42, 10, 11).is_err());
        assert!(choice(1 << 32, 10, 5).is_err());
        assert!(SeedSequence::new(u64::MAX).is_err());
    }
}
