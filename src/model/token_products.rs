//! The two products of one sample's attention: a few query rows (one per head) against the
//! sample's tokens X (L×D, row-major), and back.
//!
//!   [`row_scores`]:    S (H×L) = R (H×D) · Xᵀ   (scores, and ∂L/∂P in the backward)
//!   [`weighted_sums`]: Y (H×D) = W (H×L) · X    (pooled tokens, and ∂L/∂R in the backward)
//!
//! With H ≤ 12 rows these are far from the shape a general GEMM is built for: gemm re-packed
//! X for each of the four products of every sample and step, which perf put at over a third of a
//! ViT-Ti phase-2 epoch. Here X is streamed once per product, straight from where it lies, and
//! each loaded chunk of it serves a block of rows held in registers (3 rows × 3 tokens for the
//! scores, 3 rows × 24 features for the sums). Both are compiled for AVX2 + FMA as well and chosen
//! at run time, like the encoder's element-wise kernels.

use crate::kernels::avx2_fma;

/// Width of one accumulator: a 256-bit register of f32.
const LANES: usize = 8;
/// Rows (heads) a block holds; a remainder is done one row at a time.
const ROWS: usize = 3;
/// Tokens a scores block reads at once.
const TOKENS: usize = 3;
/// Feature chunks (of LANES) a sums block writes at once. ROWS × TOKENS (or × CHUNKS)
/// accumulators, the loaded chunks and one row's chunk fit AVX2's 16 registers: a larger block
/// spills its accumulators to the stack on every step.
const CHUNKS: usize = 3;

/// A matrix operand: its data and row stride (columns are contiguous).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub stride: usize,
}

/// The tokens of one sample: `len` rows of `dim` contiguous features.
#[derive(Clone, Copy)]
pub struct Tokens<'a> {
    pub data: &'a [f32],
    pub len: usize,
    pub dim: usize,
}

fn check(rows: usize, cols: usize, stride: usize, len: usize, what: &str) {
    assert!(
        rows == 0 || (stride >= cols && (rows - 1) * stride + cols <= len),
        "{what}: {rows}×{cols} (row stride {stride}) does not fit {len} values"
    );
}

/// S[h][t] = R[h] · X[t] for `heads` rows of R and every token; S's columns past L are left alone.
pub fn row_scores(heads: usize, r: Rows, x: Tokens, s: &mut [f32], s_stride: usize) {
    check(heads, x.dim, r.stride, r.data.len(), "row_scores queries");
    check(x.len, x.dim, x.dim, x.data.len(), "row_scores tokens");
    check(heads, x.len, s_stride, s.len(), "row_scores output");
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(heads: usize, r: Rows, x: Tokens, s: &mut [f32], s_stride: usize) {
        row_scores_kernel::<true>(heads, r, x, s, s_stride)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(heads, r, x, s, s_stride) };
    }
    row_scores_kernel::<false>(heads, r, x, s, s_stride)
}

/// Y[h] = Σₜ W[h][t] X[t] for `heads` rows of W over the L tokens; Y's rows are overwritten.
pub fn weighted_sums(heads: usize, w: Rows, x: Tokens, y: &mut [f32], y_stride: usize) {
    check(
        heads,
        x.len,
        w.stride,
        w.data.len(),
        "weighted_sums weights",
    );
    check(x.len, x.dim, x.dim, x.data.len(), "weighted_sums tokens");
    check(heads, x.dim, y_stride, y.len(), "weighted_sums output");
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(heads: usize, w: Rows, x: Tokens, y: &mut [f32], y_stride: usize) {
        weighted_sums_kernel(heads, w, x, y, y_stride)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(heads, w, x, y, y_stride) };
    }
    weighted_sums_kernel(heads, w, x, y, y_stride)
}

/// Token blocks the scores read ahead of the one they work on.
const AHEAD: usize = 4;

/// Asks for tokens `first..first + count` (those that exist) to be brought into cache: the scores
/// are the first product to touch a sample's tokens, and waited on memory at every block.
#[inline(always)]
fn prefetch_tokens(x: Tokens, first: usize, count: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = ((first + count).min(x.len)) * x.dim;
        let mut at = first * x.dim;
        while at < end {
            // SAFETY: a prefetch of an address inside the slice; it reads nothing.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T0>(x.data.as_ptr().add(at).cast());
            }
            at += 16; // one 64-byte line
        }
    }
}

/// `LANES` values from `at` (the caller keeps `at + LANES` in bounds).
#[inline(always)]
fn chunk(data: &[f32], at: usize) -> [f32; LANES] {
    data[at..at + LANES]
        .try_into()
        .expect("a chunk of LANES values")
}

/// A block of tokens at a time, every row against it while it is in L1: X is read from memory
/// once however many rows there are (ViT-B has 12 heads, and 197 × 768 tokens overflow L1).
/// `AVX2`: compiled into a function with AVX2 and FMA enabled, where the 3 × 3 block may use
/// their intrinsics.
#[inline(always)]
fn row_scores_kernel<const AVX2: bool>(
    heads: usize,
    r: Rows,
    x: Tokens,
    s: &mut [f32],
    s_stride: usize,
) {
    let mut t0 = 0;
    while t0 + TOKENS <= x.len {
        prefetch_tokens(x, t0 + AHEAD * TOKENS, TOKENS);
        scores_all_rows::<TOKENS, AVX2>(heads, t0, r, x, s, s_stride);
        t0 += TOKENS;
    }
    while t0 < x.len {
        scores_all_rows::<1, AVX2>(heads, t0, r, x, s, s_stride);
        t0 += 1;
    }
}

/// Columns t0..t0+T of S, a block of rows at a time.
#[inline(always)]
fn scores_all_rows<const T: usize, const AVX2: bool>(
    heads: usize,
    t0: usize,
    r: Rows,
    x: Tokens,
    s: &mut [f32],
    s_stride: usize,
) {
    let mut h0 = 0;
    while h0 + ROWS <= heads {
        #[cfg(target_arch = "x86_64")]
        if AVX2 && T == TOKENS {
            // SAFETY: `AVX2` is set only in a function compiled for AVX2 and FMA, which runs
            // on a CPU that has them.
            unsafe { scores_3x3_avx2(h0, t0, r, x, s, s_stride) };
            h0 += ROWS;
            continue;
        }
        scores_block::<ROWS, T>(h0, t0, r, x, s, s_stride);
        h0 += ROWS;
    }
    while h0 < heads {
        scores_block::<1, T>(h0, t0, r, x, s, s_stride);
        h0 += 1;
    }
}

/// S[h0..h0+H][t0..t0+T]: H·T running dot products of LANES lanes each, over the features.
#[inline(always)]
fn scores_block<const H: usize, const T: usize>(
    h0: usize,
    t0: usize,
    r: Rows,
    x: Tokens,
    s: &mut [f32],
    s_stride: usize,
) {
    let (rows, tokens) = block_operands::<H, T>(h0, t0, r, x);
    // Every operand cut to exactly `chunks` chunks, read unchecked below: a bounds check in the
    // loop made the compiler store every accumulator on every step.
    let chunks = x.dim / LANES;
    let row_chunks = rows.map(|row| &row.as_chunks::<LANES>().0[..chunks]);
    let token_chunks = tokens.map(|token| &token.as_chunks::<LANES>().0[..chunks]);
    let mut acc = [[[0f32; LANES]; T]; H];
    for c in 0..chunks {
        // SAFETY (both reads): every slice holds exactly `chunks` chunks and c < chunks.
        let xs: [[f32; LANES]; T] =
            std::array::from_fn(|j| unsafe { *token_chunks[j].get_unchecked(c) });
        for i in 0..H {
            let q = unsafe { *row_chunks[i].get_unchecked(c) };
            for j in 0..T {
                for l in 0..LANES {
                    acc[i][j][l] = q[l].mul_add(xs[j][l], acc[i][j][l]);
                }
            }
        }
    }
    store_scores((h0, t0), (rows, tokens), &acc, s, s_stride);
}

/// A scores block's operands: rows h0..h0+H of R and tokens t0..t0+T, `dim` values each.
#[inline(always)]
fn block_operands<'a, const H: usize, const T: usize>(
    h0: usize,
    t0: usize,
    r: Rows<'a>,
    x: Tokens<'a>,
) -> ([&'a [f32]; H], [&'a [f32]; T]) {
    let dim = x.dim;
    (
        std::array::from_fn(|i| &r.data[(h0 + i) * r.stride..][..dim]),
        std::array::from_fn(|j| &x.data[(t0 + j) * dim..][..dim]),
    )
}

/// S[h0 + i][t0 + j]: the lanes of pair (i, j)'s accumulator summed, plus the features past the
/// last whole chunk.
#[inline(always)]
fn store_scores<const H: usize, const T: usize>(
    (h0, t0): (usize, usize),
    (rows, tokens): ([&[f32]; H], [&[f32]; T]),
    acc: &[[[f32; LANES]; T]; H],
    s: &mut [f32],
    s_stride: usize,
) {
    let dim = rows.first().map_or(0, |row| row.len());
    let full = dim - dim % LANES;
    for i in 0..H {
        for j in 0..T {
            let tail: f32 = (full..dim).map(|d| rows[i][d] * tokens[j][d]).sum();
            s[(h0 + i) * s_stride + t0 + j] = acc[i][j].iter().sum::<f32>() + tail;
        }
    }
}

/// [`scores_block`] of 3 rows × 3 tokens with AVX2 and FMA: the same operations in the same
/// order, the nine accumulators named registers. The portable form kept its array of
/// accumulators on the stack and stored all nine at every step of the loop.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_3x3_avx2(
    h0: usize,
    t0: usize,
    r: Rows,
    x: Tokens,
    s: &mut [f32],
    s_stride: usize,
) {
    use std::arch::x86_64::{__m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    const _: () = assert!(ROWS == 3 && TOKENS == 3);
    let dim = x.dim;
    let (rows, tokens) = block_operands::<3, 3>(h0, t0, r, x);
    let [r0, r1, r2] = rows.map(<[f32]>::as_ptr);
    let [x0, x1, x2] = tokens.map(<[f32]>::as_ptr);
    // SAFETY (the intrinsics): the caller's CPU has AVX2 and FMA; every load below reads
    // LANES values at c·LANES < dim − LANES + 1 of a slice of `dim` values.
    let zero = unsafe { _mm256_setzero_ps() };
    let [
        mut a00,
        mut a01,
        mut a02,
        mut a10,
        mut a11,
        mut a12,
        mut a20,
        mut a21,
        mut a22,
    ] = [zero; 9];
    for c in 0..dim / LANES {
        let at = c * LANES;
        unsafe {
            let (y0, y1, y2) = (
                _mm256_loadu_ps(x0.add(at)),
                _mm256_loadu_ps(x1.add(at)),
                _mm256_loadu_ps(x2.add(at)),
            );
            let q = _mm256_loadu_ps(r0.add(at));
            a00 = _mm256_fmadd_ps(q, y0, a00);
            a01 = _mm256_fmadd_ps(q, y1, a01);
            a02 = _mm256_fmadd_ps(q, y2, a02);
            let q = _mm256_loadu_ps(r1.add(at));
            a10 = _mm256_fmadd_ps(q, y0, a10);
            a11 = _mm256_fmadd_ps(q, y1, a11);
            a12 = _mm256_fmadd_ps(q, y2, a12);
            let q = _mm256_loadu_ps(r2.add(at));
            a20 = _mm256_fmadd_ps(q, y0, a20);
            a21 = _mm256_fmadd_ps(q, y1, a21);
            a22 = _mm256_fmadd_ps(q, y2, a22);
        }
    }
    // SAFETY: an __m256 is eight f32.
    let lanes = |v: __m256| -> [f32; LANES] { unsafe { std::mem::transmute(v) } };
    let acc = [[a00, a01, a02], [a10, a11, a12], [a20, a21, a22]].map(|row| row.map(lanes));
    store_scores((h0, t0), (rows, tokens), &acc, s, s_stride);
}

/// A strip of features at a time, every row over it while it is in L1 (as for the scores),
/// then the features past the last whole chunk.
#[inline(always)]
fn weighted_sums_kernel(heads: usize, w: Rows, x: Tokens, y: &mut [f32], y_stride: usize) {
    let dim = x.dim;
    let mut d0 = 0;
    while d0 + CHUNKS * LANES <= dim {
        sums_all_rows::<CHUNKS>(heads, d0, w, x, y, y_stride);
        d0 += CHUNKS * LANES;
    }
    while d0 + LANES <= dim {
        sums_all_rows::<1>(heads, d0, w, x, y, y_stride);
        d0 += LANES;
    }
    for h in 0..heads {
        let weights = &w.data[h * w.stride..][..x.len];
        for d in d0..dim {
            y[h * y_stride + d] = weights
                .iter()
                .enumerate()
                .map(|(t, &p)| p * x.data[t * dim + d])
                .sum();
        }
    }
}

/// Features d0..d0+C·LANES of Y, a block of rows at a time.
#[inline(always)]
fn sums_all_rows<const C: usize>(
    heads: usize,
    d0: usize,
    w: Rows,
    x: Tokens,
    y: &mut [f32],
    y_stride: usize,
) {
    let mut h0 = 0;
    while h0 + ROWS <= heads {
        sums_block::<ROWS, C>(h0, d0, w, x, y, y_stride);
        h0 += ROWS;
    }
    while h0 < heads {
        sums_block::<1, C>(h0, d0, w, x, y, y_stride);
        h0 += 1;
    }
}

/// Y[h0..h0+H][d0..d0+C·LANES]: one pass over the tokens, each loaded chunk scaled into H rows.
#[inline(always)]
fn sums_block<const H: usize, const C: usize>(
    h0: usize,
    d0: usize,
    w: Rows,
    x: Tokens,
    y: &mut [f32],
    y_stride: usize,
) {
    let dim = x.dim;
    let mut acc = [[[0f32; LANES]; C]; H];
    for t in 0..x.len {
        let xs: [[f32; LANES]; C] =
            std::array::from_fn(|c| chunk(x.data, t * dim + d0 + c * LANES));
        for (i, acc_row) in acc.iter_mut().enumerate() {
            let p = w.data[(h0 + i) * w.stride + t];
            for (a, xc) in acc_row.iter_mut().zip(&xs) {
                for l in 0..LANES {
                    a[l] = p.mul_add(xc[l], a[l]);
                }
            }
        }
    }
    for (i, acc_row) in acc.iter().enumerate() {
        for (c, a) in acc_row.iter().enumerate() {
            let at = (h0 + i) * y_stride + d0 + c * LANES;
            y[at..at + LANES].copy_from_slice(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values as values;

    /// The AVX2 form of the 3 × 3 scores block gives the portable block's numbers bit for bit
    /// (the same fused multiply-adds in the same order), tails and remainders included.
    #[test]
    fn the_avx2_scores_block_equals_the_portable_one_bit_for_bit() {
        for (heads, len, dim) in [(3, 9, 192), (12, 7, 64), (4, 5, 13), (7, 17, 70)] {
            let r = values(heads * dim, 5);
            let x = values(len * dim, 6);
            let tokens = Tokens { data: &x, len, dim };
            let rows = Rows {
                data: &r,
                stride: dim,
            };
            let mut dispatched = vec![0f32; heads * len];
            let mut portable = vec![0f32; heads * len];
            row_scores(heads, rows, tokens, &mut dispatched, len);
            row_scores_kernel::<false>(heads, rows, tokens, &mut portable, len);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&dispatched),
                bits(&portable),
                "{heads} × {len} × {dim}"
            );
        }
    }

    /// Every block shape and remainder (rows 1..=7, tokens 1..=9, features with and without a
    /// tail, strided operands) against the product in f64.
    #[test]
    fn both_products_match_f64_references() {
        for heads in [1, 2, 3, 4, 7, 12] {
            for len in [1, 3, 4, 5, 9, 17] {
                for dim in [1, 5, 8, 13, 40, 64, 70] {
                    let (r_stride, s_stride) = (dim + 3, len + 2);
                    let r = values(heads * r_stride, 1);
                    let x = values(len * dim, 2);
                    let tokens = Tokens { data: &x, len, dim };
                    let mut s = vec![f32::NAN; heads * s_stride];
                    row_scores(
                        heads,
                        Rows {
                            data: &r,
                            stride: r_stride,
                        },
                        tokens,
                        &mut s,
                        s_stride,
                    );
                    let w = values(heads * s_stride, 3);
                    let y_stride = dim + 1;
                    let mut y = vec![f32::NAN; heads * y_stride];
                    weighted_sums(
                        heads,
                        Rows {
                            data: &w,
                            stride: s_stride,
                        },
                        tokens,
                        &mut y,
                        y_stride,
                    );
                    for h in 0..heads {
                        for t in 0..len {
                            let exact: f64 = (0..dim)
                                .map(|d| f64::from(r[h * r_stride + d]) * f64::from(x[t * dim + d]))
                                .sum();
                            let got = f64::from(s[h * s_stride + t]);
                            assert!(
                                (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                                "scores {heads} {len} {dim}: {got} vs {exact}"
                            );
                        }
                        for d in 0..dim {
                            let exact: f64 = (0..len)
                                .map(|t| f64::from(w[h * s_stride + t]) * f64::from(x[t * dim + d]))
                                .sum();
                            let got = f64::from(y[h * y_stride + d]);
                            assert!(
                                (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                                "sums {heads} {len} {dim}: {got} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }
}
