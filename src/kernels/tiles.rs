//! The register tiles of [`super::packed`]'s products, one per vector arm and precision, and the
//! one loop that walks a packed matrix's panels with any of them.
//!
//! A tile takes a block of up to [`Tile::ROWS`] rows against [`Tile::PANELS`] panels of 16
//! columns, one step of k at a time (f32: one term; bf16: a pair of terms in one 32-bit lane),
//! with the block's accumulators in registers. AVX2 has 16 registers: 6 rows × 2 eight-lane
//! halves of one panel. AVX-512 has 32: 12 rows × 2 panels of one sixteen-lane register each, so
//! each panel row loaded serves 12 rows and each broadcast two panels. Every output is summed
//! over k in order, one fused multiply-add (f32) or one `vdpbf16ps` lane (bf16) a step, in every
//! tile and every block size: the arms agree bit for bit, and a row's numbers do not depend on
//! the rows beside it.

use super::bf16::dot_step;

/// Columns of a panel.
pub(super) const PANEL: usize = 16;
/// Rows the largest tile holds.
pub(super) const MAX_ROWS: usize = 12;

/// A block's sums: row r, columns of the step's panels.
pub(super) type Sums = [[f32; 2 * PANEL]; MAX_ROWS];

/// What a block asks for while it works: lines `line..end` of the next step's panels (16 lanes,
/// 64 bytes each), one every `every` steps (the module doc of `packed`).
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    pub next: *const u8,
    pub line: usize,
    pub end: usize,
    pub every: usize,
}

impl Ahead {
    pub const NONE: Ahead = Ahead {
        next: std::ptr::null(),
        line: 0,
        end: 0,
        every: 1,
    };
}

/// One register tile.
pub(super) trait Tile {
    /// A packed lane: f32, or two bf16 in a u32.
    type Lane: Copy;
    const ROWS: usize;
    const PANELS: usize;

    /// `rows` (R of them, `steps` lanes each) times `panels` (1 ..= PANELS) consecutive panels
    /// at `w` (`panel_len` lanes apart) into `out[..R]`.
    ///
    /// # Safety
    /// The pointers hold what the loads read; the CPU has the tile's features.
    unsafe fn block<const R: usize>(
        w: *const Self::Lane,
        panels: (usize, usize),
        steps: usize,
        rows: [*const Self::Lane; R],
        out: &mut Sums,
        ahead: Ahead,
    );
}

/// Runs `$body` with `R` a constant equal to `$rows` (1 ..= 12).
macro_rules! with_rows {
    ($rows:expr, $R:ident => $body:expr) => {
        match $rows {
            12 => {
                const $R: usize = 12;
                $body
            }
            11 => {
                const $R: usize = 11;
                $body
            }
            10 => {
                const $R: usize = 10;
                $body
            }
            9 => {
                const $R: usize = 9;
                $body
            }
            8 => {
                const $R: usize = 8;
                $body
            }
            7 => {
                const $R: usize = 7;
                $body
            }
            6 => {
                const $R: usize = 6;
                $body
            }
            5 => {
                const $R: usize = 5;
                $body
            }
            4 => {
                const $R: usize = 4;
                $body
            }
            3 => {
                const $R: usize = 3;
                $body
            }
            2 => {
                const $R: usize = 2;
                $body
            }
            _ => {
                const $R: usize = 1;
                $body
            }
        }
    };
}

/// Rows of the next block when `left` rows remain: the fewest blocks of at most `most`, as even
/// as they can be. A block of 2 rows has too few accumulators to cover the multiply-add's
/// latency and reads the panels as often as a full one: a phase-2 chunk's 8 rows go as 4 + 4 on
/// AVX2, not 6 + 2. The split does not change the numbers.
pub(super) fn next_block_rows(left: usize, most: usize) -> usize {
    left.div_ceil(left.div_ceil(most))
}

/// The panels `panels` of a packed matrix (`data`, `panel_len` lanes a panel, `steps` steps of k,
/// `n` columns) against m rows of `a` (`a_stride` lanes apart), into dst (row stride
/// `dst_stride`), added to its values when `ADD`; the next step's panels asked for ahead when
/// `prefetch`.
///
/// # Safety
/// Rows < m and the columns of `panels` of dst lie in memory the caller may write and no other
/// thread touches meanwhile; `a` holds m rows of `steps` lanes; the CPU has T's features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn walk<T: Tile, const ADD: bool>(
    (data, panel_len, steps, n): (&[T::Lane], usize, usize, usize),
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride): (&[T::Lane], usize),
    (dst, dst_stride): (*mut f32, usize),
    prefetch: bool,
) {
    let blocks = m.div_ceil(T::ROWS);
    let mut p = panels.start;
    while p < panels.end {
        let count = T::PANELS.min(panels.end - p);
        let col = p * PANEL;
        let width = (count * PANEL).min(n - col);
        let w = data[p * panel_len..(p + count) * panel_len].as_ptr();
        // The next step's panels of this call: each block of rows asks for its share of them.
        let next = p + count;
        let next_lines = (T::PANELS.min(panels.end.saturating_sub(next)) * panel_len) / PANEL;
        let share = next_lines.div_ceil(blocks.max(1));
        let (mut r0, mut nth) = (0, 0);
        while r0 < m {
            let rows = next_block_rows(m - r0, T::ROWS);
            let ahead = if prefetch && next_lines > 0 {
                let line = nth * share;
                Ahead {
                    next: data[next * panel_len..].as_ptr().cast(),
                    line,
                    end: (line + share).min(next_lines),
                    every: (steps / share.max(1)).max(1),
                }
            } else {
                Ahead::NONE
            };
            let mut out: Sums = [[0f32; 2 * PANEL]; MAX_ROWS];
            let a_rows = &a[r0 * a_stride..];
            with_rows!(rows, R => {
                let rows: [*const T::Lane; R] =
                    std::array::from_fn(|r| a_rows[r * a_stride..][..steps].as_ptr());
                // SAFETY: the caller's; the panels hold `count` panels of `steps` lanes and
                // each row `steps` lanes.
                unsafe { T::block::<R>(w, (count, panel_len), steps, rows, &mut out, ahead) }
            });
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
        p += count;
    }
}

/// f32 in plain Rust: one fused multiply-add a term.
pub(super) struct PortableF32;

impl Tile for PortableF32 {
    type Lane = f32;
    const ROWS: usize = 6;
    const PANELS: usize = 1;

    unsafe fn block<const R: usize>(
        w: *const f32,
        (_, panel_len): (usize, usize),
        steps: usize,
        rows: [*const f32; R],
        out: &mut Sums,
        _: Ahead,
    ) {
        // SAFETY: the caller's: one panel of `panel_len` lanes, rows of `steps` lanes.
        let panel = unsafe { std::slice::from_raw_parts(w, panel_len) };
        for (r, &row) in rows.iter().enumerate() {
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts(row, steps) };
            let mut acc = [0f32; PANEL];
            for (kk, &x) in row.iter().enumerate() {
                for (v, &w) in acc.iter_mut().zip(&panel[kk * PANEL..(kk + 1) * PANEL]) {
                    *v = x.mul_add(w, *v);
                }
            }
            out[r][..PANEL].copy_from_slice(&acc);
        }
    }
}

/// bf16 in plain Rust: [`dot_step`], the instruction's model, a pair of terms.
pub(super) struct PortableBf16;

impl Tile for PortableBf16 {
    type Lane = u32;
    const ROWS: usize = 6;
    const PANELS: usize = 1;

    unsafe fn block<const R: usize>(
        w: *const u32,
        (_, panel_len): (usize, usize),
        steps: usize,
        rows: [*const u32; R],
        out: &mut Sums,
        _: Ahead,
    ) {
        // SAFETY: the caller's: one panel of `panel_len` lanes, rows of `steps` lanes.
        let panel = unsafe { std::slice::from_raw_parts(w, panel_len) };
        for (r, &row) in rows.iter().enumerate() {
            // SAFETY: as above.
            let row = unsafe { std::slice::from_raw_parts(row, steps) };
            let mut acc = [0f32; PANEL];
            for (i, &x) in row.iter().enumerate() {
                for (v, &w) in acc.iter_mut().zip(&panel[i * PANEL..(i + 1) * PANEL]) {
                    *v = dot_step(*v, x, w);
                }
            }
            out[r][..PANEL].copy_from_slice(&acc);
        }
    }
}

/// One prefetch where it is due: called once a step.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ask_ahead(ahead: &mut Ahead, countdown: &mut usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    if ahead.line < ahead.end {
        *countdown -= 1;
        if *countdown == 0 {
            *countdown = ahead.every;
            // SAFETY: a prefetch reads nothing; `line` < the next panels' lines.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.next.add(ahead.line * 64).cast()) };
            ahead.line += 1;
        }
    }
}

/// f32 with AVX2 and FMA: one panel as two 8-lane halves, 6 rows.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2F32;

#[cfg(target_arch = "x86_64")]
impl Tile for Avx2F32 {
    type Lane = f32;
    const ROWS: usize = 6;
    const PANELS: usize = 1;

    #[inline(always)]
    unsafe fn block<const R: usize>(
        w: *const f32,
        _: (usize, usize),
        steps: usize,
        rows: [*const f32; R],
        out: &mut Sums,
        mut ahead: Ahead,
    ) {
        use std::arch::x86_64::{
            __m256, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
            _mm256_storeu_ps,
        };
        let mut countdown = ahead.every;
        // SAFETY (every intrinsic): the caller's CPU has AVX2 and FMA; the panel holds
        // steps·PANEL lanes and each row `steps`, so every load is in bounds.
        unsafe {
            let mut lo: [__m256; R] = [_mm256_setzero_ps(); R];
            let mut hi: [__m256; R] = [_mm256_setzero_ps(); R];
            for kk in 0..steps {
                ask_ahead(&mut ahead, &mut countdown);
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
}

/// f32 with AVX-512: two panels of one register each, 12 rows.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512F32;

#[cfg(target_arch = "x86_64")]
impl Tile for Avx512F32 {
    type Lane = f32;
    const ROWS: usize = MAX_ROWS;
    const PANELS: usize = 2;

    #[inline(always)]
    unsafe fn block<const R: usize>(
        w: *const f32,
        (panels, panel_len): (usize, usize),
        steps: usize,
        rows: [*const f32; R],
        out: &mut Sums,
        ahead: Ahead,
    ) {
        // SAFETY: the caller's.
        unsafe {
            if panels == 2 {
                avx512_f32::<R, 2>(w, panel_len, steps, rows, out, ahead)
            } else {
                avx512_f32::<R, 1>(w, panel_len, steps, rows, out, ahead)
            }
        }
    }
}

/// [`Avx512F32`]'s block over P panels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn avx512_f32<const R: usize, const P: usize>(
    w: *const f32,
    panel_len: usize,
    steps: usize,
    rows: [*const f32; R],
    out: &mut Sums,
    mut ahead: Ahead,
) {
    use std::arch::x86_64::{
        __m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
        _mm512_storeu_ps,
    };
    let mut countdown = ahead.every;
    // SAFETY (every intrinsic): the caller's CPU has AVX-512F; the P panels hold steps·PANEL
    // lanes each and each row `steps`.
    unsafe {
        let mut acc: [[__m512; P]; R] = [[_mm512_setzero_ps(); P]; R];
        for kk in 0..steps {
            ask_ahead(&mut ahead, &mut countdown);
            let wv: [__m512; P] =
                std::array::from_fn(|q| _mm512_loadu_ps(w.add(q * panel_len + kk * PANEL)));
            for r in 0..R {
                let x = _mm512_set1_ps(*rows[r].add(kk));
                for q in 0..P {
                    acc[r][q] = _mm512_fmadd_ps(x, wv[q], acc[r][q]);
                }
            }
        }
        for (out, acc) in out.iter_mut().zip(&acc) {
            for (q, sums) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(q * PANEL), *sums);
            }
        }
    }
}

/// bf16 with AVX512-BF16: two panels of one register each (16 lanes of two terms), 12 rows.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512Bf16;

#[cfg(target_arch = "x86_64")]
impl Tile for Avx512Bf16 {
    type Lane = u32;
    const ROWS: usize = MAX_ROWS;
    const PANELS: usize = 2;

    #[inline(always)]
    unsafe fn block<const R: usize>(
        w: *const u32,
        (panels, panel_len): (usize, usize),
        steps: usize,
        rows: [*const u32; R],
        out: &mut Sums,
        ahead: Ahead,
    ) {
        // SAFETY: the caller's.
        unsafe {
            if panels == 2 {
                avx512_bf16::<R, 2>(w, panel_len, steps, rows, out, ahead)
            } else {
                avx512_bf16::<R, 1>(w, panel_len, steps, rows, out, ahead)
            }
        }
    }
}

/// [`Avx512Bf16`]'s block over P panels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn avx512_bf16<const R: usize, const P: usize>(
    w: *const u32,
    panel_len: usize,
    steps: usize,
    rows: [*const u32; R],
    out: &mut Sums,
    mut ahead: Ahead,
) {
    use std::arch::x86_64::{
        __m512, __m512bh, _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_set1_epi32,
        _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let mut countdown = ahead.every;
    // SAFETY (every intrinsic): the caller's CPU has AVX-512F and AVX512-BF16; the P panels
    // hold steps·PANEL lanes each and each row `steps`. A __m512bh is 512 bits like __m512i.
    unsafe {
        let mut acc: [[__m512; P]; R] = [[_mm512_setzero_ps(); P]; R];
        for i in 0..steps {
            ask_ahead(&mut ahead, &mut countdown);
            let wv: [__m512bh; P] = std::array::from_fn(|q| {
                std::mem::transmute(_mm512_loadu_si512(w.add(q * panel_len + i * PANEL).cast()))
            });
            for r in 0..R {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*rows[r].add(i) as i32));
                for q in 0..P {
                    acc[r][q] = _mm512_dpbf16_ps(acc[r][q], x, wv[q]);
                }
            }
        }
        for (out, acc) in out.iter_mut().zip(&acc) {
            for (q, sums) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(q * PANEL), *sums);
            }
        }
    }
}
