//! The two products of one sample's attention: a few query rows (one per head) against the
//! sample's tokens X (L×D, row-major), and back.
//!
//!   [`row_scores`]:    S (H×L) = R (H×D) · Xᵀ   (scores, and ∂L/∂P in the backward)
//!   [`weighted_sums`]: Y (H×D) = W (H×L) · X    (pooled tokens, and ∂L/∂R in the backward)
//!
//! With H ≤ 12 rows these are far from the shape a general GEMM is built for: gemm re-packed
//! X for each of the four products of every sample and step, which perf put at over a third of a
//! ViT-Ti phase-2 epoch. Here X is streamed once per product, straight from where it lies, and
//! each loaded chunk of it serves a block of rows held in registers (4 rows × 3 tokens for the
//! scores, 6 rows × 16 features for the sums). Both have an AVX2 + FMA form chosen at run time,
//! like the encoder's element-wise kernels, which does the same operations in the same order as
//! the portable one: a row's numbers depend neither on the machine's features nor on the other
//! rows of the call. The phase-2 host pass also sends two trained products through
//! [`row_scores`], whose entries are dot products of rows too (`last_layer::host`).

use crate::kernels::avx2_fma;

/// Width of one accumulator: a 256-bit register of f32.
const LANES: usize = 8;
/// Rows a scores block holds, and tokens it reads at once: 12 accumulators and the 3 loaded
/// token chunks fit AVX2's 16 registers (each row's chunk is an operand straight from memory).
/// A remainder of rows takes one smaller block.
const SCORE_ROWS: usize = 4;
const TOKENS: usize = 3;
/// Rows a sums block holds, and feature chunks (of LANES) it writes at once: 12 accumulators,
/// the 2 loaded chunks and one broadcast weight fit the 16 registers. A 4 × 3 block spilled an
/// accumulator to the stack at every token. A remainder of rows takes one smaller block.
const SUM_ROWS: usize = 6;
const CHUNKS: usize = 2;

/// A matrix operand: its data and row stride (columns are contiguous).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub stride: usize,
}

/// The tokens of one sample: `len` rows of `dim` contiguous features.
#[derive(Clone, Copy)]
pub struct SampleTokens<'a> {
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
pub fn row_scores(heads: usize, r: Rows, x: SampleTokens, s: &mut [f32], s_stride: usize) {
    check(heads, x.dim, r.stride, r.data.len(), "row_scores queries");
    check(x.len, x.dim, x.dim, x.data.len(), "row_scores tokens");
    check(heads, x.len, s_stride, s.len(), "row_scores output");
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(heads: usize, r: Rows, x: SampleTokens, s: &mut [f32], s_stride: usize) {
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
///
/// `next` is what the caller reads after this (the next sample's tokens; empty for none): it is
/// brought into cache a little at every block of rows, while this product works from the cache.
/// The scores are the first product to touch a sample's tokens, and from memory they ran at
/// about half their in-cache speed, however far ahead they asked for their own tokens: 24 rows
/// of ViT-B's scores took 125–145 µs a sample from memory, 77 µs in cache, and 78–86 µs after
/// the sums before them had asked for their tokens (a probe).
pub fn weighted_sums(
    heads: usize,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
    next: &[f32],
) {
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
    fn avx2(heads: usize, w: Rows, x: SampleTokens, y: &mut [f32], y_stride: usize, next: &[f32]) {
        weighted_sums_kernel::<true>(heads, w, x, y, y_stride, next)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(heads, w, x, y, y_stride, next) };
    }
    weighted_sums_kernel::<false>(heads, w, x, y, y_stride, next)
}

/// Token blocks the scores read ahead of the one they work on.
const AHEAD: usize = 4;

/// Asks for tokens `first..first + count` (those that exist) to be brought into L2: the scores
/// are the first product to touch a sample's tokens, and waited on memory at every block. Into L2
/// (T1), not L1 (T0): scores of cold tokens took 70–93 µs against 93–103 for 12 rows, 105–115
/// against 129–157 for 24 (one ViT-B sample, three runs each); from L2 the
/// hardware's own prefetcher keeps L1 fed, and tokens already in cache ran as fast either way.
#[inline(always)]
fn prefetch_tokens(x: SampleTokens, first: usize, count: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = ((first + count).min(x.len)) * x.dim;
        let mut at = first * x.dim;
        while at < end {
            // SAFETY: a prefetch of an address inside the slice; it reads nothing.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T1>(x.data.as_ptr().add(at).cast());
            }
            at += 16; // one 64-byte line
        }
    }
}

/// Brings a slice into cache in even parts over a fixed number of steps, a few lines at each.
struct SpreadPrefetch<'a> {
    data: &'a [f32],
    steps: usize,
    step: usize,
    /// Into L2 only (the T1 hint), not L1 as well (T0).
    to_l2: bool,
}

impl<'a> SpreadPrefetch<'a> {
    /// 16 f32: one 64-byte line.
    const LINE: usize = 16;

    /// Nothing to bring.
    fn none() -> Self {
        Self::new(&[], 1, false)
    }

    fn new(data: &'a [f32], steps: usize, to_l2: bool) -> Self {
        Self {
            data,
            steps: steps.max(1),
            step: 0,
            to_l2,
        }
    }

    /// Asks for the next part (nothing once all steps are taken).
    #[inline(always)]
    fn advance(&mut self) {
        let lines = self.data.len().div_ceil(Self::LINE);
        let (from, to) = (
            self.step * lines / self.steps,
            (self.step + 1).min(self.steps) * lines / self.steps,
        );
        self.step += 1;
        #[cfg(target_arch = "x86_64")]
        for line in from..to {
            use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
            // SAFETY: a prefetch of an address inside the slice; it reads nothing.
            unsafe {
                let at = self.data.as_ptr().add(line * Self::LINE).cast();
                if self.to_l2 {
                    _mm_prefetch::<_MM_HINT_T1>(at);
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(at);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (from, to);
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
    x: SampleTokens,
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
    x: SampleTokens,
    s: &mut [f32],
    s_stride: usize,
) {
    let mut h0 = 0;
    while h0 + SCORE_ROWS <= heads {
        scores_block_any::<SCORE_ROWS, T, AVX2>(h0, t0, r, x, s, s_stride);
        h0 += SCORE_ROWS;
    }
    match heads - h0 {
        0 => {}
        1 => scores_block_any::<1, T, AVX2>(h0, t0, r, x, s, s_stride),
        2 => scores_block_any::<2, T, AVX2>(h0, t0, r, x, s, s_stride),
        3 => scores_block_any::<3, T, AVX2>(h0, t0, r, x, s, s_stride),
        _ => unreachable!("fewer than SCORE_ROWS rows remain"),
    }
}

/// [`scores_block`] through its AVX2 form when `AVX2` is set.
#[inline(always)]
fn scores_block_any<const H: usize, const T: usize, const AVX2: bool>(
    h0: usize,
    t0: usize,
    r: Rows,
    x: SampleTokens,
    s: &mut [f32],
    s_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only in a function compiled for AVX2 and FMA, which runs on a
        // CPU that has them.
        return unsafe { scores_block_avx2::<H, T>(h0, t0, r, x, s, s_stride) };
    }
    scores_block::<H, T>(h0, t0, r, x, s, s_stride)
}

/// S[h0..h0+H][t0..t0+T]: H·T running dot products of LANES lanes each, over the features.
#[inline(always)]
fn scores_block<const H: usize, const T: usize>(
    h0: usize,
    t0: usize,
    r: Rows,
    x: SampleTokens,
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
    x: SampleTokens<'a>,
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

/// [`scores_block`] with AVX2 and FMA: the same operations in the same order, the H·T
/// accumulators registers (at most 4 × 3: with the 3 loaded token chunks, 15 of AVX2's 16). The
/// portable form kept its array of accumulators on the stack and stored them at every step.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scores_block_avx2<const H: usize, const T: usize>(
    h0: usize,
    t0: usize,
    r: Rows,
    x: SampleTokens,
    s: &mut [f32],
    s_stride: usize,
) {
    use std::arch::x86_64::{__m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    let dim = x.dim;
    let (rows, tokens) = block_operands::<H, T>(h0, t0, r, x);
    let row_ptrs = rows.map(<[f32]>::as_ptr);
    let token_ptrs = tokens.map(<[f32]>::as_ptr);
    // SAFETY (the intrinsics): the caller's CPU has AVX2 and FMA; every load below reads
    // LANES values at c·LANES < dim − LANES + 1 of a slice of `dim` values.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; T]; H];
    for c in 0..dim / LANES {
        let at = c * LANES;
        unsafe {
            let xs: [__m256; T] = std::array::from_fn(|j| _mm256_loadu_ps(token_ptrs[j].add(at)));
            for i in 0..H {
                let q = _mm256_loadu_ps(row_ptrs[i].add(at));
                for j in 0..T {
                    acc[i][j] = _mm256_fmadd_ps(q, xs[j], acc[i][j]);
                }
            }
        }
    }
    // SAFETY: an __m256 is eight f32.
    let lanes = |v: __m256| -> [f32; LANES] { unsafe { std::mem::transmute(v) } };
    let acc = acc.map(|row| row.map(lanes));
    store_scores((h0, t0), (rows, tokens), &acc, s, s_stride);
}

/// A strip of features at a time, every row over it while it is in L1 (as for the scores),
/// then the features past the last whole chunk.
#[inline(always)]
fn weighted_sums_kernel<const AVX2: bool>(
    heads: usize,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
    next: &[f32],
) {
    let dim = x.dim;
    const STRIP: usize = CHUNKS * LANES;
    let (strips_end, chunks_end) = (dim - dim % STRIP, dim - dim % LANES);
    let mut upcoming = SpreadPrefetch::new(
        next,
        x.len.div_ceil(SUM_TOKENS).max(1) * (strips_end / STRIP) * heads.div_ceil(SUM_ROWS),
        heads <= SHORT_SUMS,
    );
    // A block of tokens at a time, read in order, every strip of features and every row over
    // it; the accumulators wait in Y between blocks, so each output still sums its tokens in
    // order. At least one block, which zeroes Y when there are no tokens.
    let mut t0 = 0;
    loop {
        let block = SumTokens {
            start: t0,
            end: (t0 + SUM_TOKENS).min(x.len),
        };
        for d0 in (0..strips_end).step_by(STRIP) {
            sums_all_rows::<CHUNKS, AVX2>(heads, d0, block, w, x, y, y_stride, &mut upcoming);
        }
        for d0 in (strips_end..chunks_end).step_by(LANES) {
            sums_all_rows::<1, AVX2>(
                heads,
                d0,
                block,
                w,
                x,
                y,
                y_stride,
                &mut SpreadPrefetch::none(),
            );
        }
        t0 = block.end;
        if t0 >= x.len {
            break;
        }
    }
    for h in 0..heads {
        let weights = &w.data[h * w.stride..][..x.len];
        for d in chunks_end..dim {
            y[h * y_stride + d] = weights
                .iter()
                .enumerate()
                .map(|(t, &p)| p * x.data[t * dim + d])
                .sum();
        }
    }
}

/// Rows up to which the weighted sums bring the next sample into L2 only (T1), not L1 and L2 (T0).
/// A sum of few rows is short, too short for T0, whose requests each hold one of L1's few miss
/// buffers until memory answers: after 12 rows of ViT-B's sums the next scores took 61–63 µs
/// with T0 and 50–51 µs with T1 (41 µs with their tokens in cache). After 24 rows, T0 did as well
/// as the cache (80 µs) and T1 was slower in four runs of seven (127–131 µs); a probe of the
/// kernels, alternating builds.
const SHORT_SUMS: usize = 12;

/// SampleTokens a weighted-sums block reads: together with a strip of Y's rows, they stay in L1. A
/// block of rows loads its accumulators from Y and stores them back once per block, so a long
/// block spends less on that: 24 rows of ViT-B's sums took 95–100 µs a sample in blocks of 16
/// tokens and 73 µs in blocks of 64, their tokens in cache. The length
/// does not change the numbers: each output still adds its tokens in order.
const SUM_TOKENS: usize = 64;

/// The tokens `start..end` of one block of [`weighted_sums`]; the first block (start 0)
/// overwrites Y, the others add to it.
#[derive(Clone, Copy)]
struct SumTokens {
    start: usize,
    end: usize,
}

/// Features d0..d0+C·LANES of Y, a block of rows at a time, each block first asking for the
/// next part of `upcoming`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn sums_all_rows<const C: usize, const AVX2: bool>(
    heads: usize,
    d0: usize,
    block: SumTokens,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
    upcoming: &mut SpreadPrefetch,
) {
    let mut h0 = 0;
    while h0 + SUM_ROWS <= heads {
        upcoming.advance();
        sums_block_any::<SUM_ROWS, C, AVX2>(h0, d0, block, w, x, y, y_stride);
        h0 += SUM_ROWS;
    }
    match heads - h0 {
        0 => {}
        1 => sums_block_any::<1, C, AVX2>(h0, d0, block, w, x, y, y_stride),
        2 => sums_block_any::<2, C, AVX2>(h0, d0, block, w, x, y, y_stride),
        3 => sums_block_any::<3, C, AVX2>(h0, d0, block, w, x, y, y_stride),
        4 => sums_block_any::<4, C, AVX2>(h0, d0, block, w, x, y, y_stride),
        5 => sums_block_any::<5, C, AVX2>(h0, d0, block, w, x, y, y_stride),
        _ => unreachable!("fewer than SUM_ROWS rows remain"),
    }
}

/// [`sums_block`] through its AVX2 form when `AVX2` is set.
#[inline(always)]
fn sums_block_any<const H: usize, const C: usize, const AVX2: bool>(
    h0: usize,
    d0: usize,
    block: SumTokens,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: as in `scores_block_any`.
        return unsafe { sums_block_avx2::<H, C>(h0, d0, block, w, x, y, y_stride) };
    }
    sums_block::<H, C>(h0, d0, block, w, x, y, y_stride)
}

/// [`sums_block`] with AVX2 and FMA: the same operations in the same order, the accumulators
/// registers.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums_block_avx2<const H: usize, const C: usize>(
    h0: usize,
    d0: usize,
    block: SumTokens,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
) {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    let dim = x.dim;
    assert!(d0 + C * LANES <= dim && x.data.len() >= x.len * dim);
    let weights: [&[f32]; H] = std::array::from_fn(|i| &w.data[(h0 + i) * w.stride..][..x.len]);
    let base = x.data.as_ptr();
    // SAFETY (the intrinsics): the caller's CPU has AVX2 and FMA; token t's chunk c lies at
    // t·dim + d0 + c·LANES, inside x.data by the assertion above.
    let mut acc = [[unsafe { _mm256_setzero_ps() }; C]; H];
    if block.start > 0 {
        for (i, acc_row) in acc.iter_mut().enumerate() {
            let from = &y[(h0 + i) * y_stride + d0..][..C * LANES];
            for (c, a) in acc_row.iter_mut().enumerate() {
                // SAFETY: `from` holds C·LANES values.
                *a = unsafe { _mm256_loadu_ps(from.as_ptr().add(c * LANES)) };
            }
        }
    }
    for t in block.start..block.end {
        unsafe {
            let xs: [__m256; C] =
                std::array::from_fn(|c| _mm256_loadu_ps(base.add(t * dim + d0 + c * LANES)));
            for i in 0..H {
                let p = _mm256_set1_ps(*weights[i].get_unchecked(t));
                for c in 0..C {
                    acc[i][c] = _mm256_fmadd_ps(p, xs[c], acc[i][c]);
                }
            }
        }
    }
    for (i, acc_row) in acc.iter().enumerate() {
        let out = &mut y[(h0 + i) * y_stride + d0..][..C * LANES];
        for (c, a) in acc_row.iter().enumerate() {
            // SAFETY: `out` holds C·LANES values.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c * LANES), *a) };
        }
    }
}

/// Y[h0..h0+H][d0..d0+C·LANES]: one pass over the tokens, each loaded chunk scaled into H rows.
#[inline(always)]
fn sums_block<const H: usize, const C: usize>(
    h0: usize,
    d0: usize,
    block: SumTokens,
    w: Rows,
    x: SampleTokens,
    y: &mut [f32],
    y_stride: usize,
) {
    let dim = x.dim;
    let mut acc = [[[0f32; LANES]; C]; H];
    if block.start > 0 {
        for (i, acc_row) in acc.iter_mut().enumerate() {
            for (c, a) in acc_row.iter_mut().enumerate() {
                *a = chunk(y, (h0 + i) * y_stride + d0 + c * LANES);
            }
        }
    }
    for t in block.start..block.end {
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

    /// A matrix operand of rows `stride` apart.
    fn rows(data: &[f32], stride: usize) -> Rows<'_> {
        Rows { data, stride }
    }

    /// Both kernels' AVX2 forms give the portable forms' numbers bit for bit (the same fused
    /// multiply-adds in the same order), and each row's numbers do not depend on the rows beside
    /// it: a call on all rows equals one call per row. Row counts cover every remainder of both
    /// blocks; token counts cross the sums' token blocks; feature counts have tails.
    #[test]
    fn avx2_and_portable_forms_agree_bit_for_bit_and_rows_are_independent() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for heads in 1..=13 {
            for (len, dim) in [(9, 192), (7, 64), (5, 13), (17, 70), (40, 24), (33, 200)] {
                let r = values(heads * dim, 5);
                let x = values(len * dim, 6);
                let w = values(heads * len, 7);
                let tokens = SampleTokens { data: &x, len, dim };
                let shape = format!("{heads} × {len} × {dim}");

                let mut dispatched = vec![0f32; heads * len];
                let mut portable = vec![0f32; heads * len];
                let mut by_row = vec![0f32; heads * len];
                row_scores(heads, rows(&r, dim), tokens, &mut dispatched, len);
                row_scores_kernel::<false>(heads, rows(&r, dim), tokens, &mut portable, len);
                for h in 0..heads {
                    let one = rows(&r[h * dim..], dim);
                    row_scores(1, one, tokens, &mut by_row[h * len..], len);
                }
                assert_eq!(bits(&dispatched), bits(&portable), "scores {shape}");
                assert_eq!(bits(&dispatched), bits(&by_row), "scores by row {shape}");

                let mut dispatched = vec![0f32; heads * dim];
                let mut portable = vec![0f32; heads * dim];
                let mut by_row = vec![0f32; heads * dim];
                weighted_sums(heads, rows(&w, len), tokens, &mut dispatched, dim, &x);
                weighted_sums_kernel::<false>(
                    heads,
                    rows(&w, len),
                    tokens,
                    &mut portable,
                    dim,
                    &[],
                );
                for h in 0..heads {
                    let one = rows(&w[h * len..], len);
                    weighted_sums(1, one, tokens, &mut by_row[h * dim..], dim, &[]);
                }
                assert_eq!(bits(&dispatched), bits(&portable), "sums {shape}");
                assert_eq!(bits(&dispatched), bits(&by_row), "sums by row {shape}");
            }
        }
    }

    /// Every block shape and remainder (rows 1..=12, tokens 1..=33, features with and without a
    /// tail, strided operands) against the product in f64.
    #[test]
    fn both_products_match_f64_references() {
        for heads in [1, 2, 3, 4, 5, 7, 12] {
            for len in [1, 3, 4, 5, 9, 17, 33] {
                for dim in [1, 5, 8, 13, 40, 64, 70] {
                    let (r_stride, s_stride) = (dim + 3, len + 2);
                    let r = values(heads * r_stride, 1);
                    let x = values(len * dim, 2);
                    let tokens = SampleTokens { data: &x, len, dim };
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
                        &r,
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
