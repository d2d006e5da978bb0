//! Products of rows by a constant matrix packed once: phase 2's frozen dense layers, and
//! extraction's dense layers and per-head attention products (in blocks of rows per thread).
//!
//! A phase-2 step puts 8 or 16 rows through each frozen layer, an evaluation 24 or 48. gemm packs its
//! operands on every call, and for so few rows the packing costs as much as the arithmetic: at
//! ViT-B's 768 → 3072 it ran at 6 G multiply-adds per second for 8 rows on one AVX2 core, 17 G
//! for 24 (25–27 G for ViT-Ti's shapes at 8 rows; a separate probe of gemm alone), and its
//! 6-column kernel took 8 rows as 6 + 2, reading every weight twice. Here the matrix is laid out
//! once in panels of [`PANEL`] columns, each panel's rows contiguous, and every product streams
//! each panel once: blocks of up to 6 rows take it in turn while it is in L1/L2, with 6 × 2
//! eight-lane accumulators in registers (one panel row: two loads, then a broadcast and two
//! fused multiply-adds per row).
//!
//! In [`products_parallel`] (phase 2 at ViT-B's width), while a product takes a
//! panel, each of its blocks of rows asks for a share of the next panel's rows, one cache line
//! every few steps, so that the next panel is in cache when its first block starts. A phase-2
//! step's weights (47 MB at ViT-B's width) come from memory, and without this the first block of
//! every panel waited on them (the probe's figures: docs/design.md, "Process settings").
//! Extraction's products, whose weights serve many blocks of rows in a row and stay in cache, do
//! without: asking there slowed MiniLM's forward.
//!
//! Every output sums its k terms in order, one fused multiply-add each, whatever the number of
//! rows or the block a row falls in: a row's numbers do not depend on the batch.

use super::avx2_fma;

/// Columns of a panel: two 8-lane registers.
const PANEL: usize = 16;
/// Rows a block holds: 6 × 2 accumulators, two panel loads and a broadcast fit the 16 registers.
const BLOCK_ROWS: usize = 6;

/// A constant k × n matrix in column panels: panel p holds columns 16p..16p+16 as k rows of 16
/// contiguous values, the last panel zero-padded.
#[derive(Debug)]
pub(crate) struct PackedMatrix {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedMatrix {
    /// B[r][c] = `values[r·row_stride + c·col_stride]` for r < k, c < n.
    pub(crate) fn new(
        values: &[f32],
        (k, n): (usize, usize),
        (row_stride, col_stride): (usize, usize),
    ) -> Self {
        let panels = n.div_ceil(PANEL);
        let mut data = vec![0f32; panels * k * PANEL];
        for (p, panel) in data.chunks_exact_mut(k * PANEL).enumerate() {
            for (r, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    let c = p * PANEL + j;
                    if c < n {
                        *v = values[r * row_stride + c * col_stride];
                    }
                }
            }
        }
        Self { data, k, n }
    }

    /// dst (m × n, row stride `dst_stride`) = a (m × k, row stride `a_stride`) · B; dst's
    /// values are overwritten.
    pub(crate) fn product(
        &self,
        m: usize,
        (a, a_stride): (&[f32], usize),
        (dst, dst_stride): (&mut [f32], usize),
    ) {
        self.product_into::<false>(m, (a, a_stride), (dst, dst_stride))
    }

    /// dst += a · B, as [`Self::product`]: each output is its old value plus the finished sum
    /// (extraction starts dst as the bias plus the residual).
    pub(crate) fn product_add(
        &self,
        m: usize,
        (a, a_stride): (&[f32], usize),
        (dst, dst_stride): (&mut [f32], usize),
    ) {
        self.product_into::<true>(m, (a, a_stride), (dst, dst_stride))
    }

    /// The operands' shapes, or a panic naming them.
    fn check(
        &self,
        m: usize,
        (a_len, a_stride): (usize, usize),
        (dst_len, dst_stride): (usize, usize),
    ) {
        let (k, n) = (self.k, self.n);
        let fits =
            |len: usize, stride: usize, cols: usize| m == 0 || (m - 1) * stride + cols <= len;
        assert!(
            a_stride >= k
                && dst_stride >= n
                && fits(a_len, a_stride, k)
                && fits(dst_len, dst_stride, n),
            "packed product: {m} rows of {k} (stride {a_stride}) into {dst_len} values (stride {dst_stride}) for {n} columns",
        );
    }

    /// All panels on this thread, with no panel asked for ahead: the weights of extraction's
    /// products and of phase 2's chunks stay in cache (module doc).
    fn product_into<const ADD: bool>(
        &self,
        m: usize,
        (a, a_stride): (&[f32], usize),
        (dst, dst_stride): (&mut [f32], usize),
    ) {
        self.check(m, (a.len(), a_stride), (dst.len(), dst_stride));
        let all = 0..self.n.div_ceil(PANEL);
        let dst = (dst.as_mut_ptr(), dst_stride);
        let modes = (avx2_fma(), false);
        // SAFETY: `check` put every row and column written inside dst, borrowed mutably here.
        unsafe { product_panels::<ADD>(self, all, m, (a, a_stride), dst, modes) }
    }
}

/// Multiply-adds below which [`products_parallel`] stays on one thread: a fork and join costs
/// more than it saves (phase 2's classifier backward at ViT-B's width: 16 × 10 × 768, 123 k,
/// some 3 µs of work).
const SHARED_MACS: usize = 1 << 20;

/// One of several products that write side by side into one destination: `matrix` against
/// rows of `a`, into the destination's columns from `column` on.
pub(crate) struct ProductPart<'a> {
    pub matrix: &'a PackedMatrix,
    pub a: &'a [f32],
    pub column: usize,
}

/// Each part's product (as [`PackedMatrix::product`], m rows of row stride `a_stride`) into its
/// columns of dst, the parts' panels laid end to end and shared out over the threads of the
/// current rayon pool, each thread a run of them: each thread reads its share of the weights once
/// for all m rows. Rows split over threads instead each read all of them: at ViT-B's width a
/// phase-2 layer's weights (47 MB with their transposes) do not fit any cache, and each thread
/// streamed them all from memory. Since they come from memory, each block of rows asks for its
/// share of the next panel (module doc), on one thread too.
///
/// A grouped layer's products (phase 2's per-head value projection: 12 products of 4 panels at
/// ViT-B's width, and 12 of 48 back) cost one fork and join, not one per group. The parts'
/// columns must not overlap. The numbers are [`PackedMatrix::product`]'s, bit for bit, on any
/// number of threads.
pub(crate) fn products_parallel(
    parts: &[ProductPart],
    m: usize,
    a_stride: usize,
    (dst, dst_stride): (&mut [f32], usize),
) {
    use rayon::prelude::*;
    let mut columns: Vec<_> = parts
        .iter()
        .map(|p| p.column..p.column + p.matrix.n)
        .collect();
    columns.sort_by_key(|c| c.start);
    assert!(
        columns.windows(2).all(|w| w[0].end <= w[1].start),
        "products into overlapping columns"
    );
    for part in parts {
        let dst_len = dst.len().saturating_sub(part.column);
        part.matrix
            .check(m, (part.a.len(), a_stride), (dst_len, dst_stride));
    }
    let panels: Vec<usize> = parts.iter().map(|p| p.matrix.n.div_ceil(PANEL)).collect();
    let total: usize = panels.iter().sum();
    let macs: usize = m * parts.iter().map(|p| p.matrix.k * p.matrix.n).sum::<usize>();
    let threads = if macs < SHARED_MACS {
        1
    } else {
        rayon::current_num_threads().min(total)
    };
    let avx2 = avx2_fma();
    /// dst's first value, shared by the threads, each writing the columns of its own panels.
    struct Shared(*mut f32);
    // SAFETY: the threads write disjoint columns of dst (below), and dst outlives them.
    unsafe impl Sync for Shared {}
    let shared = Shared(dst.as_mut_ptr());
    // Panels `share` of the parts laid end to end, on this thread.
    let run = |share: std::ops::Range<usize>| {
        let mut first = 0;
        for (part, &count) in parts.iter().zip(&panels) {
            let own = share.start.max(first)..share.end.min(first + count);
            if !own.is_empty() {
                // The whole wrapper (Sync), not its field (a raw pointer, which is not).
                let shared = &shared;
                // SAFETY: `check` put rows < m and the part's columns inside dst; this thread
                // writes only the columns of its own panels, which no other thread writes, and
                // no two parts share a column.
                unsafe {
                    let dst = (shared.0.add(part.column), dst_stride);
                    let local = own.start - first..own.end - first;
                    let a = (part.a, a_stride);
                    product_panels::<false>(part.matrix, local, m, a, dst, (avx2, true));
                }
            }
            first += count;
        }
    };
    if threads <= 1 || m == 0 {
        return run(0..total);
    }
    (0..threads)
        .into_par_iter()
        .for_each(|t| run(total * t / threads..total * (t + 1) / threads));
}

/// [`PackedMatrix::product`] over panels `panels` only, into dst at `dst.0` (row stride
/// `dst.1`); the sums added to dst's values when `ADD`; the next panel asked for as each is
/// taken when `prefetch` (module doc).
///
/// # Safety
/// Rows < m and the columns of `panels` of dst must lie in memory the caller may write, and no
/// other thread may touch them meanwhile; `avx2` only where the CPU has AVX2 and FMA.
unsafe fn product_panels<const ADD: bool>(
    b: &PackedMatrix,
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride): (&[f32], usize),
    (dst, dst_stride): (*mut f32, usize),
    (avx2, prefetch): (bool, bool),
) {
    if m == 0 || b.n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn with_avx2<const ADD: bool>(
        b: &PackedMatrix,
        panels: std::ops::Range<usize>,
        m: usize,
        a: (&[f32], usize),
        dst: (*mut f32, usize),
        prefetch: bool,
    ) {
        // SAFETY: the caller's.
        unsafe { product_kernel::<true, ADD>(b, panels, m, a, dst, prefetch) }
    }
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller's; the CPU has the features `with_avx2` is compiled for.
        return unsafe {
            with_avx2::<ADD>(b, panels, m, (a, a_stride), (dst, dst_stride), prefetch)
        };
    }
    let _ = avx2;
    // SAFETY: the caller's.
    unsafe {
        product_kernel::<false, ADD>(b, panels, m, (a, a_stride), (dst, dst_stride), prefetch)
    }
}

/// Panel by panel; in each, blocks of up to 6 rows. `AVX2`: compiled into a function with AVX2
/// and FMA enabled, where the blocks use their intrinsics. `ADD`: the sums are added to dst.
///
/// # Safety
/// As [`product_panels`].
#[inline(always)]
unsafe fn product_kernel<const AVX2: bool, const ADD: bool>(
    b: &PackedMatrix,
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride): (&[f32], usize),
    (dst, dst_stride): (*mut f32, usize),
    prefetch: bool,
) {
    let k = b.k;
    let chunks = b.data.chunks_exact(k * PANEL).enumerate();
    let blocks = m.div_ceil(BLOCK_ROWS);
    for (p, panel) in chunks.skip(panels.start).take(panels.len()) {
        let col = p * PANEL;
        let width = PANEL.min(b.n - col);
        // The next panel of this call: each block of rows asks for its share of its rows.
        let next =
            (prefetch && p + 1 < panels.end).then(|| &b.data[(p + 1) * k * PANEL..][..k * PANEL]);
        let mut r0 = 0;
        let mut nth = 0;
        while r0 < m {
            let rows = next_block_rows(m - r0);
            let mut out = [[0f32; PANEL]; BLOCK_ROWS];
            let a_rows = &a[r0 * a_stride..];
            let ahead = next.map(|next| Ahead {
                next,
                first: nth * k / blocks,
                every: blocks,
            });
            match rows {
                6 => block::<6, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
                5 => block::<5, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
                4 => block::<4, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
                3 => block::<3, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
                2 => block::<2, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
                _ => block::<1, AVX2>(panel, k, a_rows, a_stride, &mut out, ahead),
            }
            nth += 1;
            for (r, values) in out[..rows].iter().enumerate() {
                let at = (r0 + r) * dst_stride + col;
                // SAFETY: the caller's contract (in bounds, and no other thread's columns).
                let dst = unsafe { std::slice::from_raw_parts_mut(dst.add(at), width) };
                if ADD {
                    dst.iter_mut().zip(values).for_each(|(d, v)| *d += v);
                } else {
                    dst.copy_from_slice(&values[..width]);
                }
            }
            r0 += rows;
        }
    }
}

/// Rows of the next block when `left` rows remain: the fewest blocks of at most [`BLOCK_ROWS`],
/// as even as they can be. A block of 2 rows has 4 accumulators, too few to cover the fused
/// multiply-add's latency, and it reads the panel as often as a block of 6: a phase-2 chunk's 8
/// rows go as 4 + 4, not 6 + 2. The split does not change the numbers (module doc).
fn next_block_rows(left: usize) -> usize {
    left.div_ceil(left.div_ceil(BLOCK_ROWS))
}

/// What a block asks for while it works: rows `first`, `first + 1`, … of the next panel (each
/// 64 bytes, one cache line), one every `every` steps.
#[derive(Clone, Copy)]
struct Ahead<'a> {
    next: &'a [f32],
    first: usize,
    every: usize,
}

impl Ahead<'_> {
    /// Nothing to ask for.
    const NONE: Ahead<'static> = Ahead {
        next: &[],
        first: 0,
        every: 1,
    };
}

/// R rows of `a` (row stride `a_stride`, k values each) times one panel into `out[..R]`.
#[inline(always)]
fn block<const R: usize, const AVX2: bool>(
    panel: &[f32],
    k: usize,
    a: &[f32],
    a_stride: usize,
    out: &mut [[f32; PANEL]; BLOCK_ROWS],
    ahead: Option<Ahead>,
) {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a[r * a_stride..][..k]);
    let panel = &panel[..k * PANEL];
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only inside a function compiled for AVX2 and FMA, on a CPU that
        // has them; the slices above hold what the loads read.
        unsafe {
            match ahead {
                Some(ahead) => block_avx2::<R, true>(panel, k, rows, out, ahead),
                None => block_avx2::<R, false>(panel, k, rows, out, Ahead::NONE),
            }
        }
        return;
    }
    let _ = ahead;
    for (r, row) in rows.iter().enumerate() {
        let mut acc = [0f32; PANEL];
        for (kk, &x) in row.iter().enumerate() {
            for (v, &w) in acc.iter_mut().zip(&panel[kk * PANEL..(kk + 1) * PANEL]) {
                *v = x.mul_add(w, *v);
            }
        }
        out[r] = acc;
    }
}

/// [`block`] with AVX2 and FMA: the same fused multiply-adds in the same order. The accumulators
/// are an array of registers that the compiler keeps in registers once R is known (checked in the
/// disassembly: no stack stores in the loop).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_avx2<const R: usize, const AHEAD: bool>(
    panel: &[f32],
    k: usize,
    rows: [&[f32]; R],
    out: &mut [[f32; PANEL]; BLOCK_ROWS],
    ahead: Ahead,
) {
    use std::arch::x86_64::{
        __m256, _MM_HINT_T0, _mm_prefetch, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_setzero_ps, _mm256_storeu_ps,
    };
    // The next panel's rows this block asks for, from `line` to `end`, one every `every` steps.
    let (next, mut line, every) = (ahead.next.as_ptr(), ahead.first, ahead.every.max(1));
    let end = (line + k.div_ceil(every))
        .min(k)
        .min(ahead.next.len() / PANEL);
    let mut countdown = every;
    let rows = rows.map(<[f32]>::as_ptr);
    let w = panel.as_ptr();
    // SAFETY (every intrinsic): the caller's CPU has AVX2 and FMA; the panel holds k·PANEL
    // values and each row k, so every load is in bounds.
    unsafe {
        let mut lo: [__m256; R] = [_mm256_setzero_ps(); R];
        let mut hi: [__m256; R] = [_mm256_setzero_ps(); R];
        for kk in 0..k {
            if AHEAD && line < end {
                countdown -= 1;
                if countdown == 0 {
                    countdown = every;
                    // A prefetch reads nothing; `line` < k rows of the next panel.
                    _mm_prefetch::<_MM_HINT_T0>(next.add(line * PANEL).cast());
                    line += 1;
                }
            }
            let w_lo = _mm256_loadu_ps(w.add(kk * PANEL));
            let w_hi = _mm256_loadu_ps(w.add(kk * PANEL + 8));
            for r in 0..R {
                let x = _mm256_broadcast_ss(&*rows[r].add(kk));
                lo[r] = _mm256_fmadd_ps(x, w_lo, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, w_hi, hi[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), lo[r]);
            _mm256_storeu_ps(out[r].as_mut_ptr().add(8), hi[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values as values;

    /// Rows split into the fewest blocks of at most 6, as even as they can be.
    #[test]
    fn rows_split_into_even_blocks() {
        let split = |mut m: usize| {
            let mut blocks = Vec::new();
            while m > 0 {
                blocks.push(next_block_rows(m));
                m -= blocks.last().unwrap();
            }
            blocks
        };
        assert_eq!(split(8), [4, 4]);
        assert_eq!(split(6), [6]);
        assert_eq!(split(7), [4, 3]);
        assert_eq!(split(13), [5, 4, 4]);
        assert_eq!(split(24), [6, 6, 6, 6]);
        assert_eq!(split(2), [2]);
    }

    /// Every row-block size and a partial last panel, a transposed source and strided rows,
    /// against f64; and each row's values the same bit for bit whatever the rows beside it and
    /// whichever of the two forms computes them.
    #[test]
    fn products_match_f64_and_do_not_depend_on_the_batch() {
        for (m, k, n) in [
            (1, 5, 3),
            (2, 9, 20),
            (8, 192, 768),
            (7, 13, 17),
            (13, 64, 40),
            (24, 33, 16),
        ] {
            let source = values(n * k, 1); // (n × k): B = sourceᵀ, read with strides (1, k)
            let packed = PackedMatrix::new(&source, (k, n), (1, k));
            let a_stride = k + 3;
            let a = values(m * a_stride, 2);
            let dst_stride = n + 2;
            let mut dst = vec![f32::NAN; m * dst_stride];
            packed.product(m, (&a, a_stride), (&mut dst, dst_stride));
            // Through products_parallel on 1, 2 and 3 threads: the same bits, dst's padding
            // columns untouched (these shapes stay on one thread, below SHARED_MACS; larger ones
            // are shared out in `parts_side_by_side_are_their_own_products`).
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut shared = vec![f32::NAN; m * dst_stride];
                let part = ProductPart {
                    matrix: &packed,
                    a: &a,
                    column: 0,
                };
                pool.install(|| products_parallel(&[part], m, a_stride, (&mut shared, dst_stride)));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&shared),
                    bits(&dst),
                    "{m}×{k}×{n} on {threads} threads"
                );
            }
            for r in 0..m {
                for c in 0..n {
                    let exact: f64 = (0..k)
                        .map(|t| f64::from(a[r * a_stride + t]) * f64::from(source[c * k + t]))
                        .sum();
                    let got = f64::from(dst[r * dst_stride + c]);
                    assert!(
                        (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                        "{m}×{k}×{n} [{r}][{c}]: {got} vs {exact}"
                    );
                }
                // The row alone, through the portable form.
                let mut alone = vec![0f32; n];
                // SAFETY: one row of n values into `alone`, all panels, no AVX2.
                unsafe {
                    product_panels::<false>(
                        &packed,
                        0..n.div_ceil(PANEL),
                        1,
                        (&a[r * a_stride..r * a_stride + k], a_stride),
                        (alone.as_mut_ptr(), n),
                        (false, false),
                    )
                };
                // Added to a start value: the start plus the same sum, bit for bit.
                let start = values(n, 3);
                let mut added = start.clone();
                packed.product_add(1, (&a[r * a_stride..], a_stride), (&mut added, n));
                for c in 0..n {
                    let sum = dst[r * dst_stride + c];
                    assert_eq!(added[c].to_bits(), (start[c] + sum).to_bits());
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&alone),
                    bits(&dst[r * dst_stride..r * dst_stride + n]),
                    "{m}×{k}×{n} row {r}"
                );
            }
        }
    }

    /// Parts side by side, each reading its own columns of the rows (a grouped layer), shared
    /// out over 1 to 3 threads: each part's columns hold its own product, bit for bit, and the
    /// columns no part owns are untouched. All three parts, and the largest alone (one matrix
    /// shared out by its panels); both are large enough to be shared out.
    #[test]
    fn parts_side_by_side_are_their_own_products() {
        let (m, k) = (9, 400);
        let widths = [5, 16, 370];
        assert!(m * k * widths[2] >= SHARED_MACS);
        let sources: Vec<Vec<f32>> = widths
            .iter()
            .zip(1..)
            .map(|(&n, seed)| values(n * k, seed))
            .collect();
        let packed: Vec<PackedMatrix> = sources
            .iter()
            .zip(widths)
            .map(|(source, n)| PackedMatrix::new(source, (k, n), (1, k)))
            .collect();
        // Row r of `a` is the parts' inputs one after another; dst leaves a gap after each part.
        let a_stride = k * widths.len();
        let a = values(m * a_stride, 7);
        let columns = [0, 6, 23];
        let dst_stride = 400;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for groups in [0..3, 2..3] {
            let mut alone = vec![f32::NAN; m * dst_stride];
            for g in groups.clone() {
                let dst = (&mut alone[columns[g]..], dst_stride);
                packed[g].product(m, (&a[g * k..], a_stride), dst);
            }
            for threads in 1..=3 {
                let parts: Vec<ProductPart> = groups
                    .clone()
                    .map(|g| ProductPart {
                        matrix: &packed[g],
                        a: &a[g * k..],
                        column: columns[g],
                    })
                    .collect();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut shared = vec![f32::NAN; m * dst_stride];
                let dst = (&mut shared[..], dst_stride);
                pool.install(|| products_parallel(&parts, m, a_stride, dst));
                assert_eq!(
                    bits(&shared),
                    bits(&alone),
                    "{groups:?} on {threads} threads"
                );
            }
        }
    }
}
