//! bf16 products on Intel's AMX tiles (Sapphire Rapids and later): [`super::packed`]'s bf16
//! matrices times rows rounded to bf16, with f32 sums, where [`SimdArm::Amx`] was detected.
//!
//! A tile is 16 rows of 64 bytes. `tdpbf16ps C, A, B` takes A as 16 rows of 16 pairs of bf16 (32
//! terms of k), B as 16 rows (pairs of k) of 16 columns' pairs, and adds the 16 × 16 products to
//! C's f32 sums. A bf16 packed panel is already B's layout (16 columns of pairs a row, 64 bytes),
//! so B tiles load straight from the panels, which are zero-padded to whole steps of 16 pairs
//! ([`TILE_STEPS`]); the rows are rounded to bf16 pairs once per product, zero-padded alike and to
//! whole tiles of 16 rows. Each block is 32 rows × 2 panels: 4 sums tiles, 2 row tiles, 2 panel
//! tiles, the 8 the unit has. Rows go in chunks whose bf16 copy stays in L2, each panel pair
//! serving every block of the chunk.
//!
//! The sums: within one instruction the unit adds the even terms' products in order of k, the
//! odd terms' apart, then the two, then that to C, each addition rounded to nearest even (measured
//! on a Xeon with AMX, and checked by `tile_step_matches_the_tiles`): not
//! `vdpbf16ps`'s order, so features made here differ from AVX512-BF16's in their last bits.
//! `tile_step` (the tests') is that model in plain Rust; a zero-padded step adds nothing to it, so neither
//! the padding nor the rows beside a row change its numbers.
//!
//! The instructions are written in `asm!` (stable Rust has no AMX intrinsics); a tile's state is
//! set up and released within each product, so no thread keeps one between calls.

use std::arch::asm;

#[cfg(test)]
use super::bf16::from_bf16;
use super::tiles::PANEL;

/// Pairs of k a tile step takes: one row of an A tile (64 bytes).
pub(super) const TILE_STEPS: usize = 16;
/// Rows of a tile.
const TILE_ROWS: usize = 16;
/// Bytes of rows (in bf16 pairs) a chunk of rows may take: most of a 2 MiB L2, with room for the
/// panels it meets.
const CHUNK_BYTES: usize = 512 << 10;

/// `acc` plus the products of up to [`TILE_STEPS`] pairs of lanes (a row's, a column's), as one
/// `tdpbf16ps` adds them (module doc); a start and results below the normal range read as zero,
/// as the unit does (measured alike).
#[cfg(test)]
pub(crate) fn tile_step(acc: f32, lanes: impl Iterator<Item = (u32, u32)>) -> f32 {
    let half = |lane: u32, high: bool| from_bf16((if high { lane >> 16 } else { lane }) as u16);
    let flush = |x: f32| {
        if x.is_subnormal() {
            0f32.copysign(x)
        } else {
            x
        }
    };
    let (mut even, mut odd) = (0f32, 0f32);
    for (a, w) in lanes {
        even = flush(half(a, false).mul_add(half(w, false), even));
        odd = flush(half(a, true).mul_add(half(w, true), odd));
    }
    flush(flush(acc) + flush(even + odd))
}

/// The tiles' layout: palette 1, all 8 tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut t = 0;
    while t < 8 {
        bytes[16 + 2 * t] = 64;
        bytes[48 + t] = TILE_ROWS as u8;
        t += 1;
    }
    TileConfig(bytes)
};

/// A block's sums: 32 rows × 32 columns (2 × 2 tiles).
#[repr(C, align(64))]
struct BlockSums([[f32; 2 * PANEL]; 2 * TILE_ROWS]);

/// One tile instruction with a literal tile register.
macro_rules! tile_load {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) $stride, options(nostack))
    };
}
macro_rules! tile_store {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) $p, s = in(reg) $stride, options(nostack))
    };
}
macro_rules! tile_dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack)
        )
    };
}
macro_rules! tile_zero {
    ($t:literal) => {
        asm!(concat!("tilezero tmm", $t), options(nostack))
    };
}

/// ROWS tiles of rows (1 or 2: 16 or 32 rows at `a`, `a_bytes` apart) times P panels (1 or 2, at
/// `w`, `panel_bytes` apart) over `chunks` tile steps, into `out`.
///
/// # Safety
/// The tiles are configured ([`CONFIG`]); the rows hold `chunks` · 16 lanes each and the panels
/// `chunks` · 16 rows of 16 lanes; the CPU has AMX-BF16.
#[inline(always)]
unsafe fn block<const ROWS: usize, const P: usize>(
    (a, a_bytes): (*const u32, usize),
    (w, panel_bytes): (*const u32, usize),
    chunks: usize,
    out: &mut BlockSums,
) {
    const W_BYTES: usize = PANEL * 4;
    const OUT_BYTES: usize = 2 * PANEL * 4;
    let a_next = a.wrapping_byte_add(TILE_ROWS * a_bytes);
    let w_next = w.wrapping_byte_add(panel_bytes);
    // SAFETY (every instruction): the caller's; each load reads 16 rows of 64 bytes inside the
    // rows or panels, each store 16 rows of 64 bytes inside `out`.
    unsafe {
        tile_zero!("0");
        tile_zero!("1");
        tile_zero!("2");
        tile_zero!("3");
        for c in 0..chunks {
            tile_load!("4", a.add(c * TILE_STEPS), a_bytes);
            if ROWS == 2 {
                tile_load!("5", a_next.add(c * TILE_STEPS), a_bytes);
            }
            tile_load!("6", w.add(c * TILE_STEPS * PANEL), W_BYTES);
            if P == 2 {
                tile_load!("7", w_next.add(c * TILE_STEPS * PANEL), W_BYTES);
            }
            tile_dot!("0", "4", "6");
            if P == 2 {
                tile_dot!("1", "4", "7");
            }
            if ROWS == 2 {
                tile_dot!("2", "5", "6");
                if P == 2 {
                    tile_dot!("3", "5", "7");
                }
            }
        }
        let out = out.0.as_mut_ptr().cast::<f32>();
        tile_store!("0", out, OUT_BYTES);
        if P == 2 {
            tile_store!("1", out.add(PANEL), OUT_BYTES);
        }
        if ROWS == 2 {
            tile_store!("2", out.add(TILE_ROWS * 2 * PANEL), OUT_BYTES);
            if P == 2 {
                tile_store!("3", out.add(TILE_ROWS * 2 * PANEL + PANEL), OUT_BYTES);
            }
        }
    }
}

/// Panels `panels` of a bf16 packed matrix (`data`, `panel_len` lanes a panel, a whole number
/// of tile steps; `n` columns) against m rows of bf16 pairs (`a`: [`tile_rows`]'s layout, `a_stride`
/// lanes apart), into dst (row stride `dst_stride`), added to its values when `ADD`.
///
/// # Safety
/// Rows < m and the columns of `panels` of dst lie in memory the caller may write and no other
/// thread touches meanwhile; `a` holds m rounded up to 16 rows of `a_stride` ≥ panel_len / 16
/// lanes; the CPU has AMX-BF16 and Linux's permission ([`super::arm::amx_permitted`]). Inlined into its caller,
/// which is compiled for AVX-512: the copies of the sums into dst are vector loops there.
#[inline(always)]
pub(super) unsafe fn product<const ADD: bool>(
    (data, panel_len, n): (&[u32], usize, usize),
    panels: std::ops::Range<usize>,
    m: usize,
    (a, a_stride): (&[u32], usize),
    (dst, dst_stride): (*mut f32, usize),
) {
    let steps = panel_len / PANEL;
    debug_assert!(steps.is_multiple_of(TILE_STEPS) && a_stride >= steps);
    let chunks = steps / TILE_STEPS;
    let padded_rows = m.next_multiple_of(TILE_ROWS);
    assert!(a.len() >= padded_rows * a_stride && data.len() >= panels.end * panel_len);
    let chunk_rows =
        (CHUNK_BYTES / (4 * a_stride)).max(2 * TILE_ROWS) / (2 * TILE_ROWS) * (2 * TILE_ROWS);
    let mut sums = BlockSums([[0f32; 2 * PANEL]; 2 * TILE_ROWS]);
    // SAFETY: CONFIG is 64 aligned bytes of a valid palette-1 layout; the CPU has AMX.
    unsafe { asm!("ldtilecfg [{c}]", c = in(reg) CONFIG.0.as_ptr(), options(nostack)) };
    for r0 in (0..padded_rows).step_by(chunk_rows) {
        let r_end = (r0 + chunk_rows).min(padded_rows);
        let mut p = panels.start;
        while p < panels.end {
            let two = p + 1 < panels.end;
            let w = (data[p * panel_len..].as_ptr(), panel_len * 4);
            let mut r = r0;
            while r < r_end {
                let rows2 = r + TILE_ROWS < r_end;
                let rows = (a[r * a_stride..].as_ptr(), a_stride * 4);
                // SAFETY: tiles configured above; the rows and panels hold `chunks` steps (the
                // assert); the caller's CPU.
                unsafe {
                    match (rows2, two) {
                        (true, true) => block::<2, 2>(rows, w, chunks, &mut sums),
                        (true, false) => block::<2, 1>(rows, w, chunks, &mut sums),
                        (false, true) => block::<1, 2>(rows, w, chunks, &mut sums),
                        (false, false) => block::<1, 1>(rows, w, chunks, &mut sums),
                    }
                }
                let col = p * PANEL;
                let width = ((1 + usize::from(two)) * PANEL).min(n - col);
                let height = ((1 + usize::from(rows2)) * TILE_ROWS).min(m.saturating_sub(r));
                for (i, values) in sums.0[..height].iter().enumerate() {
                    // SAFETY: the caller's contract (in bounds, and no other thread's columns).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(dst.add((r + i) * dst_stride + col), width)
                    };
                    if ADD {
                        dst.iter_mut().zip(values).for_each(|(d, v)| *d += v);
                    } else {
                        dst.copy_from_slice(&values[..width]);
                    }
                }
                r += (1 + usize::from(rows2)) * TILE_ROWS;
            }
            p += 1 + usize::from(two);
        }
    }
    // SAFETY: releases the tiles configured above.
    unsafe { asm!("tilerelease", options(nostack)) };
}

/// The lanes a row of the tiles' rows takes: k's pairs rounded up to whole tile steps.
pub(super) fn tile_stride(k: usize) -> usize {
    k.div_ceil(2).next_multiple_of(TILE_STEPS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::arm::SimdArm;
    use crate::kernels::bf16::pair;

    /// The model against the instruction itself, where the CPU has the tiles: 16 × 16 sums from
    /// random starts, after 1 to 16 pairs (the rest zero), with terms of very different sizes so
    /// that the order of the additions shows, and sums that fall below the normal range.
    #[test]
    fn tile_step_matches_the_tiles() {
        if SimdArm::detected() != SimdArm::Amx {
            eprintln!("skipped: this CPU (or Linux) gives no AMX tiles");
            return;
        }
        let values = crate::kernels::test_values(3 * 256 * 16, 12);
        let tiny = f32::MIN_POSITIVE;
        for active in [1, 2, 3, 5, 8, 16] {
            for scale in [1.0f32, 1e3] {
                let lane = |i: usize, s: f32| pair(values[2 * i] * s, values[2 * i + 1]);
                let a: Vec<u32> = (0..256)
                    .map(|i| if i % 16 < active { lane(i, scale) } else { 0 })
                    .collect();
                let mut w: Vec<u32> = (0..256).map(|i| lane(256 + i, 1.0)).collect();
                let mut start: Vec<f32> = values[1024..1280].to_vec();
                // Row 0: sums that cancel to below the normal range, and a start there.
                w[0] = pair(tiny, tiny);
                start[0] = 0.75 * tiny;
                let mut got = start.clone();
                // SAFETY: the CPU has AMX and the permission (detected); 16 rows of 16 lanes each.
                unsafe { one_instruction(&a, &w, &mut got) };
                for (at, &g) in got.iter().enumerate() {
                    let (r, c) = (at / 16, at % 16);
                    let model =
                        tile_step(start[at], (0..16).map(|s| (a[r * 16 + s], w[s * 16 + c])));
                    assert_eq!(
                        g.to_bits(),
                        model.to_bits(),
                        "{active} pairs ×{scale} [{r}][{c}]: {g} vs {model}"
                    );
                }
            }
        }
    }

    /// C (16 × 16 f32) += A (16 × 16 pairs) · B (16 pairs × 16 columns) in one instruction.
    unsafe fn one_instruction(a: &[u32], w: &[u32], c: &mut [f32]) {
        assert!(a.len() >= 256 && w.len() >= 256 && c.len() >= 256);
        // SAFETY: the caller's CPU; each tile is 16 rows of 64 bytes inside its slice.
        unsafe {
            asm!("ldtilecfg [{c}]", c = in(reg) CONFIG.0.as_ptr(), options(nostack));
            tile_load!("0", c.as_ptr(), 64usize);
            tile_load!("4", a.as_ptr(), 64usize);
            tile_load!("6", w.as_ptr(), 64usize);
            tile_dot!("0", "4", "6");
            tile_store!("0", c.as_mut_ptr(), 64usize);
            asm!("tilerelease", options(nostack));
        }
    }
}
