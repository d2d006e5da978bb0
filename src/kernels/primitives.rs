//! Row-level kernels: gemm on raw slices, the vectorisable exp, the erf GELU, LayerNorm's statistics, the softmax row, the CPU feature checks and the padding masks.

use candle_core::{CpuStorage, CustomOp1, D, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// The f32 values of a custom op's contiguous CPU input; an error naming `op` otherwise.
pub(crate) fn contiguous_f32<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op}: f32 only")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op}: contiguous input only")
    };
    Ok(&data[start..end])
}

/// `f` on the f32 values of a contiguous CPU tensor, read in place (no copy).
pub(crate) fn with_host_f32<R>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    super::host_reads::in_place();
    let (storage, layout) = tensor.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!(
            "host values expected, got a tensor on {:?}",
            tensor.device().location()
        )
    };
    Ok(f(contiguous_f32(cpu, layout, "host values")?))
}

/// dst (m×n, row stride `dst_rs`) = lhs (m×k) · rhs (k×n), operands as (data, row stride, column
/// stride): gemm's kernels on one thread (callers parallelise over samples).
pub(crate) fn gemm_into(
    dims: (usize, usize, usize),
    dst: (&mut [f32], usize),
    lhs: (&[f32], isize, isize),
    rhs: (&[f32], isize, isize),
) {
    gemm_scaled(dims, dst, lhs, rhs, 0.0, 1.0);
}

/// dst (m×n, row stride `dst_rs`) = keep · dst + scale · lhs (m×k) · rhs (k×n), operands as
/// (data, row stride, column stride), on one thread; `keep` 0 ignores dst's old values.
pub(crate) fn gemm_scaled(
    (m, n, k): (usize, usize, usize),
    (dst, dst_rs): (&mut [f32], usize),
    (lhs, lhs_rs, lhs_cs): (&[f32], isize, isize),
    (rhs, rhs_rs, rhs_cs): (&[f32], isize, isize),
    keep: f32,
    scale: f32,
) {
    let last = |rs: isize, cs: isize, rows: usize, cols: usize| {
        (rs * (rows as isize - 1) + cs * (cols as isize - 1)) as usize
    };
    assert!(
        m > 0
            && n > 0
            && k > 0
            && dst.len() > last(dst_rs as isize, 1, m, n)
            && lhs.len() > last(lhs_rs, lhs_cs, m, k)
            && rhs.len() > last(rhs_rs, rhs_cs, k, n),
        "matmul operands out of bounds"
    );
    // SAFETY: the assertion keeps every element gemm touches inside the slices; dst is borrowed
    // mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            keep != 0.0,
            lhs.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            keep,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Deterministic values in [−1, 1] for the kernels' tests: `len` of them, varied by `seed`.
#[cfg(test)]
pub(crate) fn test_values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// HF's extended attention mask: 0 where attended, the most negative f32 where padded, (B,1,1,T).
pub fn additive_mask(attention_mask: &Tensor) -> Result<Tensor> {
    let (b, t) = attention_mask.dims2()?;
    let keep = attention_mask.to_dtype(candle_core::DType::F32)?;
    ((1.0 - keep)? * f64::from(f32::MIN))?.reshape((b, 1, 1, t))
}

/// Tokens of each row of a 0/1 padding mask (N, T) up to its last unmasked one (all T when
/// none is unmasked): what is left once the trailing padding is cut.
pub fn unpadded_lengths(attention_mask: &Tensor) -> Result<Vec<usize>> {
    let tokens = attention_mask.dim(D::Minus1)?;
    let mask: Vec<f32> = attention_mask
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    Ok(mask
        .chunks_exact(tokens)
        .map(|row| {
            row.iter()
                .rposition(|&v| v != 0.0)
                .map_or(tokens, |last| last + 1)
        })
        .collect())
}

/// e^x for x ≤ 88 with a relative error below 2e-7, exactly 0 below −87.3 (where e^x is under
/// f32's normal range; HF's most-negative mask must give probability 0): x = n·ln 2 + r with
/// ln 2 in two parts (Cody–Waite, so r keeps its precision), e^r by its degree-7 Taylor polynomial
/// (|r| ≤ ln 2 / 2), 2^n in the exponent bits. Unlike libm's expf it vectorises, which makes the
/// GELU and softmax loops several times faster.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x_in = x.clamp(-87.5, 88.0);
    let rounded = x_in * std::f32::consts::LOG2_E + ROUND;
    let n = rounded - ROUND;
    let r = (x_in - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668
                        + r * (0.008_333_334 + r * (0.001_388_889 + r * 0.000_198_412_7))))));
    // 2^n from the bits of `rounded`, which count n up from ROUND's (one unit per ulp there):
    // `n as i32` is a saturating conversion the compiler did not vectorise for AVX2, which left
    // the GELU and softmax loops scalar (15 % of a ViT-Ti forward in the softmax alone).
    let biased = rounded
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(biased << 23);
    if x < -87.3 { 0.0 } else { p * scale }
}

/// erf by Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7), the formula of PyTorch's vectorised CPU erf.
#[inline(always)]
pub(super) fn erf_as(x: f32) -> f32 {
    let (a1, a2, a3, a4, a5, p) = (
        0.254_829_6_f32,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152,
        1.061_405_4,
        0.327_591_1,
    );
    let ax = x.abs();
    let t = 1.0 / (1.0 + p * ax);
    let y = 1.0 - ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t * fast_exp(-ax * ax);
    y.copysign(x)
}

/// Whether the CPU has AVX2 and FMA: the crate's baseline target is SSE2, so the element-wise
/// kernels below are also compiled for AVX2 + FMA and chosen at run time (gemm dispatches its own).
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512F as well as AVX2 and FMA: element-wise loops compiled for it run
/// 16 lanes at a time (the same IEEE operations in the same order per element, so the same
/// results as their AVX2 and scalar forms).
pub(crate) fn avx512_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2_fma() && is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// x·Φ(x) over a slice.
#[inline(always)]
pub(super) fn gelu_kernel(src: &[f32], dst: &mut [f32]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = 0.5 * x * (1.0 + erf_as(x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// [`gelu_kernel`], vectorised for the CPU at hand.
pub(crate) fn gelu(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn avx512(src: &[f32], dst: &mut [f32]) {
        gelu_kernel(src, dst)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(src: &[f32], dst: &mut [f32]) {
        gelu_kernel(src, dst)
    }
    #[cfg(target_arch = "x86_64")]
    if avx512_fma() {
        // SAFETY: the CPU has the features `avx512` is compiled for.
        return unsafe { avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(src, dst) };
    }
    gelu_kernel(src, dst)
}

/// dy·(Φ(x) + x·φ(x)), the GELU's backward, into `dy` in place over `x`.
#[inline(always)]
pub(super) fn gelu_backward_kernel(x: &[f32], dy: &mut [f32]) {
    // φ(x) = e^(−x²/2)/√(2π)
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    for (g, &x) in dy.iter_mut().zip(x) {
        let cdf = 0.5 * (1.0 + erf_as(x * std::f32::consts::FRAC_1_SQRT_2));
        *g *= cdf + x * INV_SQRT_2PI * fast_exp(-0.5 * x * x);
    }
}

/// [`gelu_backward_kernel`], vectorised for the CPU at hand.
pub(crate) fn gelu_backward(x: &[f32], dy: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn avx512(x: &[f32], dy: &mut [f32]) {
        gelu_backward_kernel(x, dy)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(x: &[f32], dy: &mut [f32]) {
        gelu_backward_kernel(x, dy)
    }
    #[cfg(target_arch = "x86_64")]
    if avx512_fma() {
        // SAFETY: the CPU has the features `avx512` is compiled for.
        return unsafe { avx512(x, dy) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(x, dy) };
    }
    gelu_backward_kernel(x, dy)
}

/// The mean of a row and 1/√(variance + ε), its sums in eight independent lanes so that they
/// vectorise (the host pass's LayerNorms; the test set's tokens are normalised at every scoring).
pub(crate) fn mean_and_inv_std(x: &[f32], eps: f32) -> (f32, f32) {
    let [stats] = mean_and_inv_std_rows([x], eps);
    stats
}

/// [`mean_and_inv_std`] of `R` rows of one length at once: each row's sums are the same
/// operations in the same order, so its numbers are the one-row call's, bit for bit. A row's
/// sums are a chain of dependent additions, each waiting on the one before; `R` chains side by
/// side keep the adder busy (a ViT-Ti token row of 192 values took about 80 ns alone).
pub(crate) fn mean_and_inv_std_rows<const R: usize>(
    rows: [&[f32]; R],
    eps: f32,
) -> [(f32, f32); R] {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2<const R: usize>(rows: [&[f32]; R], eps: f32) -> [(f32, f32); R] {
        // SAFETY: this function runs only where the CPU has AVX2.
        unsafe { mean_and_inv_std_avx2(rows, eps) }
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(rows, eps) };
    }
    mean_and_inv_std_kernel(rows, eps)
}

#[inline(always)]
pub(super) fn mean_and_inv_std_kernel<const R: usize>(
    rows: [&[f32]; R],
    eps: f32,
) -> [(f32, f32); R] {
    let full = whole_chunks(&rows);
    let mut lanes = [[0f32; LANES]; R];
    for c in (0..full).step_by(LANES) {
        for (lanes, row) in lanes.iter_mut().zip(&rows) {
            for (lane, &v) in lanes.iter_mut().zip(&row[c..c + LANES]) {
                *lane += v;
            }
        }
    }
    let means = row_means(&rows, full, &lanes);
    let mut lanes = [[0f32; LANES]; R];
    for c in (0..full).step_by(LANES) {
        for ((lanes, row), &mean) in lanes.iter_mut().zip(&rows).zip(&means) {
            for (lane, &v) in lanes.iter_mut().zip(&row[c..c + LANES]) {
                *lane += (v - mean) * (v - mean);
            }
        }
    }
    row_statistics(&rows, full, means, &lanes, eps)
}

/// The values of `rows` (all of one length) that fill whole chunks of LANES.
#[inline(always)]
pub(super) fn whole_chunks<const R: usize>(rows: &[&[f32]; R]) -> usize {
    let len = rows.first().map_or(0, |row| row.len());
    assert!(
        rows.iter().all(|row| row.len() == len),
        "rows of one length"
    );
    len - len % LANES
}

/// Each row's mean from its lanes' sums, plus the values from `full` (past the last whole
/// chunk).
#[inline(always)]
pub(super) fn row_means<const R: usize>(
    rows: &[&[f32]; R],
    full: usize,
    lanes: &[[f32; LANES]; R],
) -> [f32; R] {
    std::array::from_fn(|i| {
        let len = rows[i].len() as f32;
        (lanes[i].iter().sum::<f32>() + rows[i][full..].iter().sum::<f32>()) / len
    })
}

/// Each row's (mean, 1/√(variance + ε)) from its lanes' squared deviations, plus the values
/// from `full` (past the last whole chunk).
#[inline(always)]
pub(super) fn row_statistics<const R: usize>(
    rows: &[&[f32]; R],
    full: usize,
    means: [f32; R],
    lanes: &[[f32; LANES]; R],
    eps: f32,
) -> [(f32, f32); R] {
    std::array::from_fn(|i| {
        let (mean, len) = (means[i], rows[i].len() as f32);
        let rest: f32 = rows[i][full..]
            .iter()
            .map(|v| (v - mean) * (v - mean))
            .sum();
        let var = (lanes[i].iter().sum::<f32>() + rest) / len;
        (mean, 1.0 / (var + eps).sqrt())
    })
}

/// [`mean_and_inv_std_kernel`] in AVX2 registers: the same operations in the same order (a
/// lane's sums are vector additions, the squares a multiply then an add, never fused), so the
/// same bits. The portable form of several rows kept its lanes on the stack.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn mean_and_inv_std_avx2<const R: usize>(rows: [&[f32]; R], eps: f32) -> [(f32, f32); R] {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_sub_ps,
    };
    let full = whole_chunks(&rows);
    let starts = rows.map(<[f32]>::as_ptr);
    // SAFETY: an __m256 is eight f32.
    let lanes = |v: __m256| -> [f32; LANES] { unsafe { std::mem::transmute(v) } };
    // SAFETY (the intrinsics): the caller's CPU has AVX2; every load reads LANES values at
    // c ≤ full − LANES of a row of at least `full` values.
    let mut sums = [unsafe { _mm256_setzero_ps() }; R];
    for c in (0..full).step_by(LANES) {
        for i in 0..R {
            sums[i] = unsafe { _mm256_add_ps(sums[i], _mm256_loadu_ps(starts[i].add(c))) };
        }
    }
    let means = row_means(&rows, full, &sums.map(lanes));
    let centres = means.map(|mean| unsafe { _mm256_set1_ps(mean) });
    let mut squares = [unsafe { _mm256_setzero_ps() }; R];
    for c in (0..full).step_by(LANES) {
        for i in 0..R {
            unsafe {
                let v = _mm256_sub_ps(_mm256_loadu_ps(starts[i].add(c)), centres[i]);
                squares[i] = _mm256_add_ps(squares[i], _mm256_mul_ps(v, v));
            }
        }
    }
    row_statistics(&rows, full, means, &squares.map(lanes), eps)
}

/// Σ x² in f64, in eight independent lanes so that it vectorises (the optimizer's gradient norm).
pub(crate) fn squared_norm(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(x: &[f32]) -> f64 {
        squared_norm_kernel(x)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(x) };
    }
    squared_norm_kernel(x)
}

#[inline(always)]
pub(super) fn squared_norm_kernel(x: &[f32]) -> f64 {
    let chunks = x.chunks_exact(LANES);
    let rest: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum();
    let mut lanes = [0f64; LANES];
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f64::from(v) * f64::from(v);
        }
    }
    lanes.iter().sum::<f64>() + rest
}

/// [`softmax_kernel`], vectorised for the CPU at hand.
pub(crate) fn softmax(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
        softmax_kernel(row, scale, mask)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(row, scale, mask) };
    }
    softmax_kernel(row, scale, mask)
}

/// Independent accumulators of the softmax's reductions: a running max or sum in one variable
/// is a serial chain the compiler may not reorder (float addition is not associative), which
/// left this kernel at 15 % of a ViT-Ti forward; eight lanes vectorise.
pub(super) const LANES: usize = 8;

/// A softmax row in place: its scores times `scale` plus the additive `mask`, then normalised.
#[inline(always)]
pub(super) fn softmax_kernel(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
    match mask {
        Some(m) => row.iter_mut().zip(m).for_each(|(s, m)| *s = *s * scale + m),
        None => row.iter_mut().for_each(|s| *s *= scale),
    }
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail_max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, larger);
    for chunk in chunks {
        maxima
            .iter_mut()
            .zip(chunk)
            .for_each(|(m, &s)| *m = larger(*m, s));
    }
    let max = maxima.into_iter().fold(tail_max, larger);
    // The exponentials in a loop of their own: fused with the sums below, the compiler left
    // them scalar.
    row.iter_mut().for_each(|s| *s = fast_exp(*s - max));
    let mut sums = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        sums.iter_mut()
            .zip(chunk)
            .for_each(|(total, &e)| *total += e);
    }
    let total = tail
        .iter()
        .fold(sums.iter().sum::<f32>(), |total, &e| total + e);
    let inv = 1.0 / total;
    row.iter_mut().for_each(|s| *s *= inv);
}

/// x·Φ(x) with Φ(x) = (1 + erf(x/√2))/2, element-wise on f32, in parallel chunks, vectorised.
pub struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "gelu-erf-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let src = contiguous_f32(storage, layout, self.name())?;
        let mut dst = vec![0f32; src.len()];
        dst.par_chunks_mut(1 << 14)
            .zip(src.par_chunks(1 << 14))
            .for_each(|(out, xs)| gelu(xs, out));
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }

    /// d/dx x·Φ(x) = Φ(x) + x·φ(x).
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let cdf = ((arg * std::f64::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)? * 0.5;
        let pdf = ((arg.sqr()? * -0.5)?.exp()?
            * (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2))?;
        Ok(Some(grad_res.mul(&(cdf? + (arg * pdf)?)?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gemm gives a row the same numbers whatever rows are beside it and however many, up to
    /// 48, at the shape of the host pass's per-head rₕ = q₀ₕW_Kₕ (k = dₕ: 32 for MiniLM, 64 for
    /// ViT-Ti/B and BERT; D up to 768): a step's rows go through it in groups of up to 16, a
    /// chunk's in 8, an evaluation's 48 in groups of 16, and a row must get the same bits in each.
    #[test]
    fn gemm_rows_do_not_depend_on_the_rows_beside_them() {
        for (d, dh) in [(384, 32), (192, 64), (768, 64)] {
            let (heads, rows) = (d / dh, 48);
            let q0 = test_values(rows * d, 3);
            let wk = test_values(d * d, 5);
            let product = |first: usize, count: usize, head: usize| -> Vec<f32> {
                let mut out = vec![0f32; count * d];
                gemm_into(
                    (count, d, dh),
                    (&mut out, d),
                    (&q0[first * d + head * dh..], d as isize, 1),
                    (&wk[head * dh * d..], d as isize, 1),
                );
                out
            };
            for head in [0, heads - 1] {
                let all = product(0, rows, head);
                for first in 0..rows {
                    for count in 1..=rows - first {
                        let some = product(first, count, head);
                        let same = some
                            .iter()
                            .zip(&all[first * d..(first + count) * d])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "D {d}, dₕ {dh}: rows {first}..{} of {rows}",
                            first + count
                        );
                    }
                }
            }
        }
    }

    /// A row's LayerNorm statistics among four are its own, bit for bit: the norms of the test
    /// set's tokens take four rows at a time, the CLS rows' one.
    #[test]
    fn row_statistics_in_fours_equal_one_row_at_a_time() {
        for len in [192, 197, 5] {
            let rows: Vec<Vec<f32>> = (0..4)
                .map(|r| {
                    (0..len)
                        .map(|k| ((k * 7 + r * 13) % 23) as f32 / 3.0 - 2.5 + r as f32)
                        .collect()
                })
                .collect();
            let together = mean_and_inv_std_rows::<4>(std::array::from_fn(|r| &rows[r][..]), 1e-6);
            for (row, (mean, inv)) in rows.iter().zip(together) {
                let (alone_mean, alone_inv) = mean_and_inv_std(row, 1e-6);
                let (plain_mean, plain_inv) = mean_and_inv_std_kernel([&row[..]], 1e-6)[0];
                assert_eq!(mean.to_bits(), alone_mean.to_bits());
                assert_eq!(inv.to_bits(), alone_inv.to_bits());
                assert_eq!(mean.to_bits(), plain_mean.to_bits());
                assert_eq!(inv.to_bits(), plain_inv.to_bits());
            }
        }
    }

    /// The vectorised forms (AVX-512 or AVX2, whichever this CPU takes) compute what the plain
    /// loops compute, bit for bit: the docs rely on it for results that do not depend on the CPU.
    #[test]
    fn vectorised_gelu_forms_equal_the_plain_loops_bit_for_bit() {
        let xs: Vec<f32> = (0..10_007).map(|k| (k as f32 - 5000.0) / 600.0).collect();
        let (mut plain, mut dispatched) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        gelu_kernel(&xs, &mut plain);
        gelu(&xs, &mut dispatched);
        assert!(
            plain
                .iter()
                .zip(&dispatched)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        let dy: Vec<f32> = xs.iter().map(|x| 1.0 - x / 7.0).collect();
        let (mut plain, mut dispatched) = (dy.clone(), dy);
        gelu_backward_kernel(&xs, &mut plain);
        gelu_backward(&xs, &mut dispatched);
        assert!(
            plain
                .iter()
                .zip(&dispatched)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn vectorised_softmax_equals_the_plain_loop_bit_for_bit_and_f64_closely() {
        for len in [1, 7, 8, 9, 128, 197] {
            let scores: Vec<f32> = (0..len).map(|k| ((k * 37) % 23) as f32 - 11.0).collect();
            // HF's padding mask: the most negative f32 on the last keys.
            let mask: Vec<f32> = (0..len)
                .map(|k| {
                    if k + 2 > len && len > 2 {
                        f32::MIN
                    } else {
                        0.0
                    }
                })
                .collect();
            for mask in [None, Some(mask.as_slice())] {
                let (mut plain, mut dispatched) = (scores.clone(), scores.clone());
                softmax_kernel(&mut plain, 0.3, mask);
                softmax(&mut dispatched, 0.3, mask);
                assert!(
                    plain
                        .iter()
                        .zip(&dispatched)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "length {len}"
                );
                let logits: Vec<f64> = scores
                    .iter()
                    .zip(0..)
                    .map(|(&s, k)| 0.3 * f64::from(s) + mask.map_or(0.0, |m| f64::from(m[k])))
                    .collect();
                let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for (p, l) in dispatched.iter().zip(&logits) {
                    let exact = (l - max).exp() / total;
                    assert!((f64::from(*p) - exact).abs() < 1e-6, "length {len}");
                    if exact == 0.0 {
                        assert_eq!(*p, 0.0, "a masked key keeps probability 0");
                    }
                }
            }
        }
    }

    #[test]
    fn fast_exp_is_within_2e7_of_exp_and_zero_far_below() {
        let mut worst = 0f64;
        for k in 0..=200_000 {
            let x = -87.0 + 175.0 * k as f32 / 200_000.0;
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(fast_exp(x)) - exact).abs() / exact);
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(fast_exp(f32::MIN), 0.0);
        assert_eq!(fast_exp(-90.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }
}
