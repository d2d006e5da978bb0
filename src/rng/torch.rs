//! Bit-exact replica of the torch CPU generator draws the authors' code makes.
//!
//! Replicates torch 2.6.0 (the version pinned by the authors' `uv.lock`), from its sources:
//! - `aten/src/ATen/core/MT19937RNGEngine.h`: `mt19937` (`init_with_uint32`, `next_state`,
//!   tempering in `operator()`), seeded by `CPUGeneratorImpl::set_current_seed` for both
//!   `torch.manual_seed(seed)` and `torch.Generator().manual_seed(seed)`;
//! - `aten/src/ATen/CPUGeneratorImpl.cpp`: `random()` (one u32) and `random64()` (two u32,
//!   first one high);
//! - `aten/src/ATen/core/TransformationHelper.h` + `DistributionsHelper.h`:
//!   `uniform_real_distribution` / `uniform_real` (float32: one u32, 24 bits; float64: one
//!   `random64()`, 53 bits) and `uniform_int_from_to` (`base + u32 % range` for range < 2^32);
//! - `aten/src/ATen/native/cpu/DistributionTemplates.h`: `uniform_kernel`, `random_from_to_kernel`
//!   (both serial, one draw per element);
//! - `aten/src/ATen/native/TensorFactories.cpp`: `randperm_cpu`.
//!
//! The fixture `tests/fixtures/authors_rng.json` was produced by real torch 2.6.0 (CPU); see
//! `scripts/authors_rng_fixtures.py`.

/// Degree of recurrence of MT19937.
const N: usize = 624;
/// Middle word offset.
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// torch's CPU `mt19937` engine (standard MT19937 output).
#[derive(Debug, Clone)]
pub struct Mt19937 {
    state: [u32; N],
    /// Index of the next word of `state` to temper and return; `N` means "regenerate first".
    next: usize,
}

impl Mt19937 {
    /// `mt19937(seed)` -> `init_with_uint32(seed)`: only the low 32 bits of the seed are used
    /// (`state[0] = seed & 0xffffffff`), then the standard Knuth initialisation.
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; N];
        state[0] = seed as u32;
        for j in 1..N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Mt19937 { state, next: N }
    }

    /// `next_state()`: regenerate all 624 words at once.
    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.state[i] = self.state[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.next = 0;
    }

    /// `operator()` / `CPUGeneratorImpl::random()`: one tempered 32-bit word.
    pub fn next_u32(&mut self) -> u32 {
        if self.next >= N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `CPUGeneratorImpl::random64()`: two words, the first one in the high half
    /// (`make64BitsFrom32Bits(random1, random2)`).
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32();
        let lo = self.next_u32();
        (u64::from(hi) << 32) | u64::from(lo)
    }

    /// One element of `torch.rand(..., dtype=torch.float32)`: `uniform_real<float>` keeps the low
    /// 24 bits of one `random()` and scales by 2^-24.
    pub fn rand_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// One element of `torch.rand(..., dtype=torch.float64)`: `uniform_real<double>` keeps the low
    /// 53 bits of one `random64()` (so two u32 draws) and scales by 2^-53.
    pub fn rand_f64(&mut self) -> f64 {
        (self.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One element of `torch.randint(low, high)` for `high - low < 2^32`
    /// (`random_from_to_kernel` -> `uniform_int_from_to`): `low + random() % (high - low)`.
    /// Callers guarantee `low < high`.
    fn randint(&mut self, low: u64, high: u64) -> u64 {
        low + u64::from(self.next_u32()) % (high - low)
    }
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on CPU (`randperm_cpu`).
///
/// For `n < 2^32 / 20` (every size the authors use): r = 0..n; for i in 0..n-1,
/// z = random() % (n - i), swap(r[i], r[i + z]). Larger n take torch's other branch, the
/// "inside-out" Fisher-Yates with `random64() % (i + 1)`, replicated from the source but not
/// covered by the fixture (it needs over 2 * 10^8 elements).
pub fn randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut g = Mt19937::new(seed);
    if (n as u64) < u64::from(u32::MAX / 20) {
        let mut r: Vec<usize> = (0..n).collect();
        for i in 0..n.saturating_sub(1) {
            let z = (u64::from(g.next_u32()) % (n - i) as u64) as usize;
            r.swap(i, i + z);
        }
        r
    } else {
        let mut r = vec![0usize; n];
        for i in 0..n {
            let z = (g.next_u64() % (i as u64 + 1)) as usize;
            r[i] = r[z];
            r[z] = i;
        }
        r
    }
}

/// The authors' label noise: `torch.manual_seed(seed)`, then for each fine-tune row j in order,
/// on the 0-d int64 tensor `label = clean[j]` (`add_label_noise` in their
/// `src/datasets/utils.py`, called once per row by `datasets.map`):
///
/// ```python
/// mask = torch.rand_like(labels, dtype=torch.float) < noise_ratio   # torch.float = float32
/// new  = (labels + torch.randint_like(labels, low=1, high=C)) % C
/// ```
///
/// Both draws are made for every row, flipped or not. In float32 `rand_like` consumes one u32
/// (`uniform_real<float>`: its low 24 bits), and `randint_like` one more, so row j uses u32 #2j
/// (flip iff that float32 is below η rounded to float32, as torch compares a float32 tensor with
/// a Python float) and #2j+1 (offset 1 + u % (C - 1)). When `eta == 0` the authors skip the map
/// and no draw happens: the clean labels are returned. Checked against real torch evaluating the
/// authors' line verbatim (`scripts/authors_rng_fixtures.py`, `tests/authors_rng.rs`).
///
pub fn label_noise(clean: &[u32], classes: u32, eta: f64, seed: u64) -> Result<Vec<u32>, String> {
    if eta == 0.0 {
        return Ok(clean.to_vec());
    }
    if classes < 2 {
        return Err(format!(
            "randint_like(label, 1, {classes}): 'from' must be less than 'to' (need classes >= 2)"
        ));
    }
    let c = u64::from(classes);
    let threshold = eta as f32;
    let mut g = Mt19937::new(seed);
    Ok(clean
        .iter()
        .map(|&y| {
            let flip = g.rand_f32() < threshold;
            let offset = g.randint(1, c);
            if flip {
                // (y + offset) % C in int64; y < 2^32 and offset < 2^32, so no overflow.
                ((u64::from(y) + offset) % c) as u32
            } else {
                y
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // docs/protocol.md §3.1 test vectors (seed 42), checked against real torch 2.6.0.

    #[test]
    fn mt19937_first_words_seed42() {
        let mut g = Mt19937::new(42);
        let w: Vec<u32> = (0..5).map(|_| g.next_u32()).collect();
        assert_eq!(
            w,
            [1608637542, 3421126067, 4083286876, 787846414, 3143890026]
        );
    }

    #[test]
    fn mt19937_uses_low_32_bits_of_seed() {
        let mut a = Mt19937::new(42);
        let mut b = Mt19937::new(42 + (1 << 32));
        assert_eq!(a.next_u32(), b.next_u32());
    }

    #[test]
    fn mt19937_reference_after_twist() {
        // std::mt19937 with the default seed 5489: the 10000th output is 4123659995 (C++11 spec).
        let mut g = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10000 {
            last = g.next_u32();
        }
        assert_eq!(last, 4123659995);
    }

    #[test]
    fn torch_rand_float32_seed42() {
        let mut g = Mt19937::new(42);
        let v: Vec<f32> = (0..5).map(|_| g.rand_f32()).collect();
        // torch.rand(5) after torch.manual_seed(42), printed to 4 decimals in docs/protocol.md.
        let expect = [0.8823f32, 0.9150, 0.3829, 0.9593, 0.3904];
        for (a, b) in v.iter().zip(expect.iter()) {
            assert!((a - b).abs() < 5e-5, "{a} vs {b}");
        }
        // Exact value: (1608637542 & 0xffffff) / 2^24.
        assert_eq!(v[0], (1608637542u32 & 0xff_ffff) as f32 / 16_777_216.0);
    }

    #[test]
    fn torch_rand_float64_seed42() {
        // torch.rand(5, dtype=torch.float64) after torch.manual_seed(42) (real torch 2.6.0):
        // each value takes two u32 (random64), so the stream advances twice as fast as float32.
        let mut g = Mt19937::new(42);
        let v: Vec<f64> = (0..5).map(|_| g.rand_f64()).collect();
        assert_eq!(
            v,
            [
                0.05815448596142969,
                0.06291016742457756,
                0.12358607277440903,
                0.05258016436107704,
                0.5261718968547618
            ]
        );
    }

    /// Rows flipped by the authors' line for S = 200, eta = 0.1, C = 10, seed 42, with all-zero
    /// clean labels (so a flipped row's label is its offset): the vector of docs/protocol.md,
    /// from real torch 2.6.0 evaluating `torch.rand_like(labels, dtype=torch.float) < 0.1`.
    #[test]
    fn noise_s200_eta01_c10_seed42() {
        let rows = [
            25, 37, 53, 54, 66, 68, 100, 106, 112, 115, 119, 138, 143, 146, 152, 156, 172, 177,
            181, 184, 193, 198,
        ];
        let offsets = [
            1, 3, 2, 4, 5, 2, 9, 5, 7, 5, 7, 4, 2, 1, 9, 1, 2, 1, 4, 2, 2, 1,
        ];
        let noisy = label_noise(&[0; 200], 10, 0.1, 42).unwrap();
        let flipped: Vec<usize> = (0..200).filter(|&j| noisy[j] != 0).collect();
        assert_eq!(flipped, rows);
        let got: Vec<u32> = rows.iter().map(|&j| noisy[j]).collect();
        assert_eq!(got, offsets);
    }

    #[test]
    fn noise_eta0_is_identity_and_errors() {
        let clean = [3, 1, 4, 1, 5];
        assert_eq!(label_noise(&clean, 10, 0.0, 42).unwrap(), clean);
        assert!(label_noise(&clean, 1, 0.1, 42).is_err());
        assert_eq!(label_noise(&clean, 1, 0.0, 42).unwrap(), clean);
    }

    #[test]
    fn randperm_200_seeds_42_43() {
        assert_eq!(
            randperm(200, 42)[..10],
            [142, 56, 198, 77, 50, 55, 4, 69, 174, 47]
        );
        assert_eq!(
            randperm(200, 43)[..10],
            [188, 42, 139, 2, 85, 160, 56, 61, 153, 64]
        );
    }

    #[test]
    fn randperm_small() {
        assert_eq!(randperm(0, 42), Vec::<usize>::new());
        assert_eq!(randperm(1, 42), vec![0]);
        let mut p = randperm(1000, 7);
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
    }
}
