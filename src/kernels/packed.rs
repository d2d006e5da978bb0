//! Products of rows by a constant matrix packed once: phase 2's frozen dense layers, and
//! extraction's dense layers and per-head attention products (in blocks of rows per thread).
//!
//! A phase-2 step puts 8 or 16 rows through each frozen layer, an evaluation 24 or 48. gemm packs its
//! operands on every call, and for so few rows the packing costs as much as the arithmetic: at
//! ViT-B's 768 → 3072 it ran at 6 G multiply-adds per second for 8 rows on one AVX2 core, 17 G
//! for 24 (25–27 G for ViT-Ti's shapes at 8 rows; a separate probe of gemm alone), and its
//! 6-column kernel took 8 rows as 6 + 2, reading every weight twice. Here the matrix is laid out
//! once in panels of 16 columns, each panel's rows contiguous, and every product streams each
//! panel once: blocks of rows take it in turn while it is in L1/L2, their sums in registers
//! ([`super::tiles`]: 6 rows of one panel on AVX2, 12 rows of two panels on AVX-512).
//!
//! A matrix packed in bf16 ([`Precision::Bf16`], the frozen backbone's products at
//! `--precision bf16`) holds pairs of consecutive rows rounded to bf16 in 32-bit lanes (each
//! panel zero-padded to whole steps of the AMX tiles), and its products round their rows the
//! same way and sum on the AMX tiles where the CPU has them ([`super::amx`]), else with
//! `vdpbf16ps` (f32 accumulators) where it has AVX512-BF16, else with that instruction's model in
//! plain Rust ([`super::bf16`]); each arm bit for bit its model.
//!
//! In [`products_parallel`] (phase 2 at ViT-B's width), while a product takes a
//! panel, each of its blocks of rows asks for a share of the next panel's rows, one cache line
//! every few steps, so that the next panel is in cache when its first block starts. A phase-2
//! step's weights (47 MB at ViT-B's width) come from memory, and without this the first block of
//! every panel waited on them (the probe's figures: docs/design.md, "Process settings").
//! Extraction's products, whose weights serve many blocks of rows in a row and stay in cache, do
//! without: asking there slowed MiniLM's forward.
//!
//! Every output sums its k terms in order, one fused multiply-add each (bf16: one instruction
//! lane a pair), whatever the number of rows, the block a row falls in or the vector arm: a row's
//! numbers do not depend on the batch or the CPU.

use super::amx;
#[cfg(test)]
use super::amx::TILE_STEPS;
use super::arm::{SimdArm, bf16_dot};
use super::bf16::{Precision, pair};
#[cfg(target_arch = "x86_64")]
use super::tiles::{Avx2F32, Avx512Bf16, Avx512F32};
use super::tiles::{PANEL, PortableBf16, PortableF32, walk};

/// A constant k × n matrix in column panels: panel p holds columns 16p..16p+16, the last panel
/// zero-padded, as k rows of 16 f32 or (bf16) k/2 rows of 16 pairs of consecutive rows' values
/// (zero rows after them to a whole number of [`TILE_STEPS`]).
#[derive(Debug)]
pub(crate) struct PackedMatrix {
    panels: Panels,
    k: usize,
    n: usize,
}

/// A packed matrix's values.
#[derive(Debug)]
enum Panels {
    F32(Vec<f32>),
    /// Lane (i, c) of a panel: rows 2i (low half) and 2i + 1 (high half) of column c, rounded to
    /// bf16 ([`pair`]); an odd k's last pair padded with 0.
    Bf16(Vec<u32>),
}

impl PackedMatrix {
    /// B[r][c] = `values[r·row_stride + c·col_stride]` for r < k, c < n, in f32.
    pub(crate) fn new(values: &[f32], dims: (usize, usize), strides: (usize, usize)) -> Self {
        Self::new_in(Precision::F32, values, dims, strides)
    }

    /// [`Self::new`] in `precision`: a bf16 matrix's products round their rows to bf16 too.
    pub(crate) fn new_in(
        precision: Precision,
        values: &[f32],
        (k, n): (usize, usize),
        (row_stride, col_stride): (usize, usize),
    ) -> Self {
        let panels = n.div_ceil(PANEL);
        // Column c's place in a panel row: the panel's first lane plus c mod 16. The padding
        // (columns past n, rows past k) stays zero. Each loop reads the source in its own order
        // (a transposed source, such as attention's keys, column by column), with no per-value
        // test: the attention packs two matrices per sample and head.
        let lane = |c: usize, panel_len: usize| (c / PANEL) * panel_len + c % PANEL;
        let column = |c: usize| &values[c * col_stride..];
        let panels = match precision {
            Precision::F32 => {
                let panel_len = k * PANEL;
                let mut data = vec![0f32; panels * panel_len];
                if row_stride == 1 {
                    for c in 0..n {
                        let (at, column) = (lane(c, panel_len), &column(c)[..k]);
                        for (r, &v) in column.iter().enumerate() {
                            data[at + r * PANEL] = v;
                        }
                    }
                } else {
                    for r in 0..k {
                        let row = &values[r * row_stride..];
                        for c in 0..n {
                            data[lane(c, panel_len) + r * PANEL] = row[c * col_stride];
                        }
                    }
                }
                Panels::F32(data)
            }
            Precision::Bf16 => {
                let panel_len = amx::tile_stride(k) * PANEL;
                let mut data = vec![0u32; panels * panel_len];
                let pairs = k / 2;
                if row_stride == 1 {
                    for c in 0..n {
                        let (at, column) = (lane(c, panel_len), &column(c)[..k]);
                        for (i, two) in column.chunks_exact(2).enumerate() {
                            data[at + i * PANEL] = pair(two[0], two[1]);
                        }
                        if k % 2 == 1 {
                            data[at + pairs * PANEL] = pair(column[k - 1], 0.0);
                        }
                    }
                } else {
                    for i in 0..k.div_ceil(2) {
                        let even = &values[2 * i * row_stride..];
                        let odd = (2 * i + 1 < k).then(|| &values[(2 * i + 1) * row_stride..]);
                        for c in 0..n {
                            let high = odd.map_or(0.0, |odd| odd[c * col_stride]);
                            data[lane(c, panel_len) + i * PANEL] = pair(even[c * col_stride], high);
                        }
                    }
                }
                Panels::Bf16(data)
            }
        };
        Self { panels, k, n }
    }

    /// Rows a task of a threaded product should take, `vector_rows` on the vector arms: the AMX
    /// tiles run a panel pair's product some 8 times as fast, so that streaming the panels for
    /// few rows would bound them; 256 rows read each panel pair once from L2 per 8 blocks.
    pub(crate) fn task_rows(&self, vector_rows: usize) -> usize {
        if matches!(self.panels, Panels::Bf16(_)) && SimdArm::detected() == SimdArm::Amx {
            AMX_TASK_ROWS
        } else {
            vector_rows
        }
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
        let modes = (SimdArm::detected(), false);
        // SAFETY: `check` put every row and column written inside dst, borrowed mutably here.
        unsafe { product_panels::<ADD>(self, all, m, (a, a_stride), dst, modes) }
    }
}

/// [`PackedMatrix::task_rows`] on the AMX tiles.
const AMX_TASK_ROWS: usize = 256;

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
    let arm = SimdArm::detected();
    /// dst's first value, shared by the threads, each writing the columns of its own panels.
    struct SharedDst(*mut f32);
    // SAFETY: the threads write disjoint columns of dst (below), and dst outlives them.
    unsafe impl Sync for SharedDst {}
    let shared = SharedDst(dst.as_mut_ptr());
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
                    product_panels::<false>(part.matrix, local, m, a, dst, (arm, true));
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
/// `dst.1`); the sums added to dst's values when `ADD`; the next panels asked for as each is taken
/// when `prefetch` (module doc); through the tile of `arm` (f32) or, for a bf16 matrix, the AMX
/// tiles on [`SimdArm::Amx`], the AVX512-BF16 tile on AVX-512 where the CPU has it, and the
/// instruction's model elsewhere.
///
/// # Safety
/// Rows < m and the columns of `panels` of dst must lie in memory the caller may write, and no
/// other thread may touch them meanwhile; `arm` no wider than the CPU's.
unsafe fn product_panels<const ADD: bool>(
    b: &PackedMatrix,
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride): (&[f32], usize),
    (dst, dst_stride): (*mut f32, usize),
    (arm, prefetch): (SimdArm, bool),
) {
    if m == 0 || b.n == 0 {
        return;
    }
    let (k, n) = (b.k, b.n);
    match &b.panels {
        Panels::F32(data) => {
            let matrix = (&data[..], k * PANEL, k, n);
            let a = (a, a_stride);
            let dst = (dst, dst_stride);
            // SAFETY (each arm): the caller's; the CPU has the arm's features.
            #[cfg(target_arch = "x86_64")]
            match arm.vector() {
                SimdArm::Avx512 | SimdArm::Amx => {
                    return unsafe { walk_avx512::<ADD>(matrix, panels, m, a, dst, prefetch) };
                }
                SimdArm::Avx2 => {
                    return unsafe { walk_avx2::<ADD>(matrix, panels, m, a, dst, prefetch) };
                }
                SimdArm::Portable => {}
            }
            unsafe { walk::<PortableF32, ADD>(matrix, panels, m, a, dst, false) }
        }
        Panels::Bf16(data) => {
            let steps = k.div_ceil(2);
            let panel_len = amx::tile_stride(k) * PANEL;
            let matrix = (&data[..], panel_len, steps, n);
            let a = (a, a_stride);
            let dst = (dst, dst_stride);
            #[cfg(target_arch = "x86_64")]
            if arm == SimdArm::Amx {
                // SAFETY: the caller's; the arm is detected only with the tiles and Linux's leave.
                return unsafe {
                    product_amx::<ADD>((data, panel_len, n), panels, m, (a.0, a.1, k), dst)
                };
            }
            #[cfg(target_arch = "x86_64")]
            if arm == SimdArm::Avx512 && bf16_dot() {
                // SAFETY: the caller's; the CPU has AVX-512F and AVX512-BF16.
                let a = (a.0, a.1, k);
                return unsafe { walk_avx512_bf16::<ADD>(matrix, panels, m, a, dst, prefetch) };
            }
            let pairs = bf16_rows(m, a, k, (m, steps));
            // SAFETY: the caller's.
            unsafe { walk::<PortableBf16, ADD>(matrix, panels, m, (&pairs, steps), dst, false) }
        }
    }
}

/// m rows of k values (`a_stride` apart) as `rows` ≥ m rows of `stride` ≥ k/2 bf16 pairs (an odd
/// k's last pair padded with 0, and zeros after the values). A plain loop, vectorised where it
/// is inlined into a function compiled for AVX-512.
#[inline(always)]
fn bf16_rows(
    m: usize,
    (a, a_stride): (&[f32], usize),
    k: usize,
    (rows, stride): (usize, usize),
) -> Vec<u32> {
    let steps = k.div_ceil(2);
    let mut pairs = vec![0u32; rows * stride];
    for (r, out) in pairs.chunks_exact_mut(stride).take(m).enumerate() {
        let row = &a[r * a_stride..][..k];
        for (o, p) in out.iter_mut().zip(row.chunks_exact(2)) {
            *o = pair(p[0], p[1]);
        }
        if k % 2 == 1 {
            out[steps - 1] = pair(row[k - 1], 0.0);
        }
    }
    pairs
}

/// The matrix of [`walk`]: lanes, lanes per panel, steps of k, columns.
type Matrix<'a, L> = (&'a [L], usize, usize, usize);

/// [`walk`] with the AVX2 tile, compiled for AVX2 and FMA.
///
/// # Safety
/// [`walk`]'s; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn walk_avx2<const ADD: bool>(
    matrix: Matrix<f32>,
    panels: std::ops::Range<usize>,
    m: usize,
    a: (&[f32], usize),
    dst: (*mut f32, usize),
    prefetch: bool,
) {
    // SAFETY: the caller's.
    unsafe { walk::<Avx2F32, ADD>(matrix, panels, m, a, dst, prefetch) }
}

/// [`walk`] with the AVX-512 f32 tile, compiled for AVX-512F.
///
/// # Safety
/// [`walk`]'s; the CPU has AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn walk_avx512<const ADD: bool>(
    matrix: Matrix<f32>,
    panels: std::ops::Range<usize>,
    m: usize,
    a: (&[f32], usize),
    dst: (*mut f32, usize),
    prefetch: bool,
) {
    // SAFETY: the caller's.
    unsafe { walk::<Avx512F32, ADD>(matrix, panels, m, a, dst, prefetch) }
}

/// [`walk`] with the AVX512-BF16 tile, the f32 rows `a` rounded to bf16 pairs first.
///
/// # Safety
/// [`walk`]'s; the CPU has AVX-512F and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
unsafe fn walk_avx512_bf16<const ADD: bool>(
    matrix: Matrix<u32>,
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride, k): (&[f32], usize, usize),
    dst: (*mut f32, usize),
    prefetch: bool,
) {
    let steps = matrix.2;
    let pairs = bf16_rows(m, (a, a_stride), k, (m, steps));
    // SAFETY: the caller's.
    unsafe { walk::<Avx512Bf16, ADD>(matrix, panels, m, (&pairs, steps), dst, prefetch) }
}

/// The AMX tiles' product ([`amx::product`]), the f32 rows `a` rounded to bf16 pairs in the
/// tiles' layout first.
///
/// # Safety
/// [`amx::product`]'s, but for the rows' layout, which this makes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
unsafe fn product_amx<const ADD: bool>(
    matrix: (&[u32], usize, usize),
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride, k): (&[f32], usize, usize),
    dst: (*mut f32, usize),
) {
    let stride = amx::tile_stride(k);
    let pairs = bf16_rows(m, (a, a_stride), k, (m.next_multiple_of(16), stride));
    // SAFETY: the caller's; `pairs` has the tiles' layout.
    unsafe { amx::product::<ADD>(matrix, panels, m, (&pairs, stride), dst) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::bf16::dot_step;
    use crate::kernels::test_values as values;
    use crate::kernels::tiles::next_block_rows;

    /// Rows split into the fewest blocks of at most 6 (12), as even as they can be.
    #[test]
    fn rows_split_into_even_blocks() {
        let split_by = |mut m: usize, most: usize| {
            let mut blocks = Vec::new();
            while m > 0 {
                blocks.push(next_block_rows(m, most));
                m -= blocks.last().unwrap();
            }
            blocks
        };
        let split = |m| split_by(m, 6);
        assert_eq!(split_by(48, 12), [12, 12, 12, 12]);
        assert_eq!(split_by(8, 12), [8]);
        assert_eq!(split_by(13, 12), [7, 6]);
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
                // The row alone, through every arm this CPU has.
                for arm in SimdArm::available() {
                    let alone = row_alone(&packed, &a[r * a_stride..][..k], arm);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&alone),
                        bits(&dst[r * dst_stride..r * dst_stride + n]),
                        "{m}×{k}×{n} row {r}, {arm:?}"
                    );
                }
                // Added to a start value: the start plus the same sum, bit for bit.
                let start = values(n, 3);
                let mut added = start.clone();
                packed.product_add(1, (&a[r * a_stride..], a_stride), (&mut added, n));
                for c in 0..n {
                    let sum = dst[r * dst_stride + c];
                    assert_eq!(added[c].to_bits(), (start[c] + sum).to_bits());
                }
            }
        }
    }

    /// A matrix packed from its rows (row stride > 1, columns adjacent: attention's values) and
    /// from its transpose (columns contiguous: the keys, the dense weights) is the same packed
    /// matrix, in both precisions, odd k and a partial panel included.
    #[test]
    fn either_source_order_packs_the_same_matrix() {
        for (k, n) in [(1, 1), (5, 3), (13, 17), (64, 40), (33, 70)] {
            let source = values(n * k, 8); // (n × k): B = sourceᵀ
            let row_stride = n + 2;
            let mut rows = vec![f32::NAN; k * row_stride];
            for r in 0..k {
                for c in 0..n {
                    rows[r * row_stride + c] = source[c * k + r];
                }
            }
            for precision in [Precision::F32, Precision::Bf16] {
                let by_columns = PackedMatrix::new_in(precision, &source, (k, n), (1, k));
                let by_rows = PackedMatrix::new_in(precision, &rows, (k, n), (row_stride, 1));
                let same = match (&by_columns.panels, &by_rows.panels) {
                    (Panels::F32(a), Panels::F32(b)) => a
                        .iter()
                        .map(|v| v.to_bits())
                        .eq(b.iter().map(|v| v.to_bits())),
                    (Panels::Bf16(a), Panels::Bf16(b)) => a == b,
                    _ => false,
                };
                assert!(same, "{k}×{n} {precision:?}");
            }
        }
    }

    /// One row through all of a matrix's panels on `arm`.
    fn row_alone(packed: &PackedMatrix, row: &[f32], arm: SimdArm) -> Vec<f32> {
        let n = packed.n;
        let mut alone = vec![0f32; n];
        // SAFETY: one row of n values into `alone`, all panels, an arm this CPU has.
        unsafe {
            product_panels::<false>(
                packed,
                0..n.div_ceil(PANEL),
                1,
                (row, row.len()),
                (alone.as_mut_ptr(), n),
                (arm, false),
            )
        };
        alone
    }

    /// bf16 products are the instruction's model summed over the pairs of k in order (the AMX
    /// tiles': [`amx::tile_step`] over each 16 pairs), written here without panels (so the
    /// packing, the odd k's padding, the partial last panel and the rows' layout are what is
    /// checked), bit for bit: on every arm this CPU has (the AVX512-BF16 tile and the AMX tiles
    /// where it has them), every block size, strided rows, added to a start or not, and on 1 to
    /// 3 threads; and within bf16's rounding of the f64 product.
    #[test]
    fn bf16_products_are_the_instruction_model() {
        for (m, k, n) in [
            (1, 5, 3),
            (2, 9, 20),
            (7, 13, 17),
            (13, 64, 40),
            (24, 33, 48),
            (25, 192, 80),
            (40, 70, 50),
        ] {
            let source = values(n * k, 4); // (n × k): B = sourceᵀ
            let packed = PackedMatrix::new_in(Precision::Bf16, &source, (k, n), (1, k));
            let a_stride = k + 1;
            let a = values(m * a_stride, 5);
            let b_at = |r: usize, c: usize| if r < k { source[c * k + r] } else { 0.0 };
            let a_at = |i: usize, t: usize| if t < k { a[i * a_stride + t] } else { 0.0 };
            let lanes = |i: usize, c: usize, s: usize| {
                let x = pair(a_at(i, 2 * s), a_at(i, 2 * s + 1));
                (x, pair(b_at(2 * s, c), b_at(2 * s + 1, c)))
            };
            let steps = k.div_ceil(2);
            let dot_model: Vec<f32> = (0..m * n)
                .map(|at| {
                    let (i, c) = (at / n, at % n);
                    (0..steps).fold(0.0, |acc, s| {
                        let (x, w) = lanes(i, c, s);
                        dot_step(acc, x, w)
                    })
                })
                .collect();
            let tiles_model: Vec<f32> = (0..m * n)
                .map(|at| {
                    let (i, c) = (at / n, at % n);
                    (0..steps).step_by(TILE_STEPS).fold(0.0, |acc, s0| {
                        let chunk = s0..(s0 + TILE_STEPS).min(steps);
                        amx::tile_step(acc, chunk.map(|s| lanes(i, c, s)))
                    })
                })
                .collect();
            let model_of = |arm: SimdArm| {
                if arm == SimdArm::Amx {
                    &tiles_model
                } else {
                    &dot_model
                }
            };
            let model = model_of(SimdArm::detected());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let mut dst = vec![f32::NAN; m * n];
            packed.product(m, (&a, a_stride), (&mut dst, n));
            assert_eq!(bits(&dst), bits(model), "{m}×{k}×{n}");
            for arm in SimdArm::available() {
                for r in 0..m {
                    let alone = row_alone(&packed, &a[r * a_stride..][..k], arm);
                    assert_eq!(
                        bits(&alone),
                        bits(&model_of(arm)[r * n..(r + 1) * n]),
                        "{m}×{k}×{n} {arm:?}"
                    );
                }
            }
            let start = values(m * n, 6);
            let mut added = start.clone();
            packed.product_add(m, (&a, a_stride), (&mut added, n));
            let expected: Vec<f32> = start.iter().zip(model).map(|(s, v)| s + v).collect();
            assert_eq!(bits(&added), bits(&expected));
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut shared = vec![f32::NAN; m * n];
                let part = ProductPart {
                    matrix: &packed,
                    a: &a,
                    column: 0,
                };
                pool.install(|| products_parallel(&[part], m, a_stride, (&mut shared, n)));
                assert_eq!(
                    bits(&shared),
                    bits(model),
                    "{m}×{k}×{n} on {threads} threads"
                );
            }
            // bf16 rounds each operand by at most 2^-9 relative: the sum is within 2^-7 of
            // Σ|a||b| of the exact one.
            for (at, &got) in dot_model.iter().chain(&tiles_model).enumerate() {
                let at = at % (m * n);
                let (i, c) = (at / n, at % n);
                let exact: f64 = (0..k)
                    .map(|t| f64::from(a_at(i, t)) * f64::from(b_at(t, c)))
                    .sum();
                let scale: f64 = (0..k)
                    .map(|t| f64::from(a_at(i, t) * b_at(t, c)).abs())
                    .sum();
                assert!(
                    (f64::from(got) - exact).abs() <= scale / 128.0 + 1e-6,
                    "{got} vs {exact}"
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
