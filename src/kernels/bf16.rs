//! bf16 products as the CPU's `vdpbf16ps` makes them, and the precision a frozen backbone's
//! products run in.
//!
//! The instruction takes 32-bit lanes holding two bf16 values each (the even-indexed term in the
//! low half, the odd one in the high half) and adds both products to an f32 accumulator: the odd
//! term first, then the even one, each addition rounded to nearest even, bf16 inputs below the
//! normal range read as zero and results below it flushed to zero (Intel's definition; measured
//! the same on an AMD Zen 4, the unit tests' `dot_step_matches_the_instruction`). A bf16 product
//! is exact in f32 (8-bit significands), so each step is one fused multiply-add followed by the
//! flush: [`dot_step`] is that model in plain Rust, and the packed kernel's portable arm runs it,
//! so that its packing and layout logic is checked on any machine and its AVX-512 arm is checked
//! against it bit for bit where the CPU has AVX512-BF16.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// What the frozen backbone's products are computed in.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// IEEE f32 throughout (HF parity is exact to float rounding).
    #[default]
    F32,
    /// The dense layers' and the attention's products from bf16 operands (rounded to nearest
    /// even) with f32 accumulation, on the CPU's bf16 units; everything else in f32.
    Bf16,
}

impl Precision {
    /// The name in flags, config files and cache keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }

    /// f32, the default: config.json leaves it out, so runs made before the key keep their names.
    pub fn is_f32(&self) -> bool {
        *self == Self::F32
    }

    /// The arithmetic this process computes this precision in, as cache folders, shard keys and
    /// `deviations` name it: "f32"; "bf16" (`vdpbf16ps`'s sums, [`dot_step`]); "bf16-amx" (the
    /// AMX tiles' sums, another order: `super::amx`'s `tile_step`). The two bf16 forms differ in
    /// their last bits, so neither is served the other's cached features.
    pub fn arithmetic(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 if super::arm::SimdArm::detected() == super::arm::SimdArm::Amx => "bf16-amx",
            Self::Bf16 => "bf16",
        }
    }

    /// Whether this process can compute in this precision at speed: bf16 needs the CPU's bf16
    /// dot products; the error names the flag and what the CPU lacks.
    pub fn check_supported(self) -> Result<()> {
        if self == Self::Bf16 && !super::arm::bf16_dot() {
            bail!(
                "--precision bf16: this CPU has no bf16 dot-product instructions (AVX512-BF16 or AMX-BF16); use --precision f32"
            );
        }
        Ok(())
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as the high 16 bits of an f32; values below
/// the normal range become zero of the same sign (the instruction reads them so), NaN stays NaN.
/// Written without branches, so that a loop of it vectorises (a product's rows are converted on
/// every call).
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    // NaN: quiet, with the sign and the top payload bits kept.
    let nan = (bits >> 16) | 0x0040;
    let signed_zero = (bits >> 16) & 0x8000;
    let is_nan = bits & 0x7fff_ffff > 0x7f80_0000;
    let below_normal = bits & 0x7f80_0000 == 0;
    let out = if is_nan { nan } else { rounded };
    (if below_normal { signed_zero } else { out }) as u16
}

/// The f32 a bf16 value stands for.
#[inline(always)]
pub(crate) fn from_bf16(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

/// Two consecutive terms as one 32-bit lane: the even-indexed one low, the odd one high.
#[inline(always)]
pub(crate) fn pair(even: f32, odd: f32) -> u32 {
    u32::from(to_bf16(even)) | (u32::from(to_bf16(odd)) << 16)
}

/// `acc` plus the two products of lanes `a` and `w`, as `vdpbf16ps` adds them (module doc).
#[inline(always)]
pub(crate) fn dot_step(acc: f32, a: u32, w: u32) -> f32 {
    let half = |lane: u32, high: bool| from_bf16((if high { lane >> 16 } else { lane }) as u16);
    let flush = |x: f32| {
        if x.is_subnormal() {
            0f32.copysign(x)
        } else {
            x
        }
    };
    let acc = flush(half(a, true).mul_add(half(w, true), acc));
    flush(half(a, false).mul_add(half(w, false), acc))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounding to nearest, ties to even, on both sides of a tie; the specials.
    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to 1 (even); 1 + 3·2^-8 to 1 + 2^-6.
        assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        assert_eq!(
            from_bf16(to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(
            from_bf16(to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20))),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(from_bf16(to_bf16(-3.0)), -3.0);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
        // Below the normal range: a signed zero.
        let tiny = f32::from_bits(0x0040_0000);
        assert_eq!(to_bf16(tiny), 0);
        assert_eq!(to_bf16(-tiny), 0x8000);
        // Every bf16 value converts to itself.
        for h in (0..=u16::MAX).step_by(7) {
            let x = from_bf16(h);
            if x.is_normal() {
                assert_eq!(to_bf16(x), h);
            }
        }
    }

    /// The branch-free rounding against the rule written plainly, over a spread of bit patterns
    /// (every sign, exponent and rounding case, NaNs and values below the normal range).
    #[test]
    fn branch_free_rounding_is_the_plain_rule() {
        let plain = |x: f32| -> u16 {
            let bits = x.to_bits();
            if x.is_nan() {
                ((bits >> 16) | 0x0040) as u16
            } else if bits & 0x7f80_0000 == 0 {
                ((bits >> 16) & 0x8000) as u16
            } else {
                ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
            }
        };
        for bits in (0..=u32::MAX)
            .step_by(4099)
            .chain([0x3f80_8000, 0x3f81_8000, 0x7f7f_ffff])
        {
            let x = f32::from_bits(bits);
            assert_eq!(to_bf16(x), plain(x), "{bits:#x}");
        }
    }

    /// The odd term first, each addition rounded: 1 + 2^-24 + 2^-24 stays 1 (a fused sum of
    /// both would give 1 + 2^-23), and -1 added first leaves the small term whole.
    #[test]
    fn adds_the_odd_term_first_and_rounds_each_addition() {
        let e = 2f32.powi(-24);
        assert_eq!(dot_step(1.0, pair(1.0, 1.0), pair(e, e)), 1.0);
        assert_eq!(dot_step(1.0, pair(1.0, 1.0), pair(e, -1.0)), e);
        // An intermediate below the normal range is flushed before the even term is added.
        let m = f32::MIN_POSITIVE;
        assert_eq!(dot_step(1.5 * m, pair(1.0, 1.0), pair(m, -m)), m);
    }

    /// The model against the instruction itself, where the CPU has it: random lanes and the
    /// edge cases above, bit for bit.
    #[test]
    fn dot_step_matches_the_instruction() {
        if !crate::kernels::arm::bf16_dot() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let values = crate::kernels::test_values(16 * 3 * 64, 11);
        let e = 2f32.powi(-24);
        let m = f32::MIN_POSITIVE;
        let mut cases: Vec<(f32, u32, u32)> = values
            .chunks_exact(5)
            .map(|v| (v[0] * 4.0, pair(v[1], v[2]), pair(v[3] * 1e-3, v[4])))
            .collect();
        cases.extend([
            (1.0, pair(1.0, 1.0), pair(e, e)),
            (1.0, pair(1.0, 1.0), pair(e, -1.0)),
            (1.5 * m, pair(1.0, 1.0), pair(m, -m)),
        ]);
        for chunk in cases.chunks(16) {
            let mut acc = [0f32; 16];
            let mut a = [0u32; 16];
            let mut w = [0u32; 16];
            for (j, &(c, x, y)) in chunk.iter().enumerate() {
                (acc[j], a[j], w[j]) = (c, x, y);
            }
            // SAFETY: the CPU has AVX512-BF16 (checked above).
            let got = unsafe { instruction(acc, a, w) };
            for (j, &(c, x, y)) in chunk.iter().enumerate() {
                assert_eq!(
                    got[j].to_bits(),
                    dot_step(c, x, y).to_bits(),
                    "{c} {x:#x} {y:#x}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn instruction(acc: [f32; 16], a: [u32; 16], w: [u32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        // SAFETY: the caller's CPU has the features; the arrays hold 16 lanes each.
        unsafe {
            let a: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.as_ptr().cast()));
            let w: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.as_ptr().cast()));
            let sum = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), a, w);
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), sum);
            out
        }
    }
}
