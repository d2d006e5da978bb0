//! Products by a trained matrix that a step both reads and updates: the synthetic encoder's
//! weights (up to 3d² + 2·2000·d ≈ 95 M floats at d = 5000) meet only n ≈ 20 rows per step, so a
//! step is bound by the weights' memory traffic, not by arithmetic. The backward pass and the SGD
//! update of a weight are fused: each block of the weight's rows is read once, serves the input
//! gradient while it is in cache, and is updated there.
//!
//! The work is cut into parts of a fixed size whatever the thread count, partial sums (where a
//! product sums over parts) are added in part order, and gemm sees the same shapes: results do
//! not depend on the threads.

use rayon::prelude::*;

/// Rows of a weight one task handles (the unit of parallelism and of the fixed summation order).
const PART_ROWS: usize = 256;

/// What the backward pass does with a weight's gradient.
pub(crate) enum WeightGradient<'a> {
    /// Plain gradient descent in place: W −= lr · ∇W.
    Descend(f32),
    /// Writes ∇W here (the weight's shape) and leaves W as it is.
    Store(&'a mut [f32]),
}

/// [`super::primitives::gemm_scaled`] with the strides this file's row-major operands have (all positive).
fn gemm_scaled(
    dims: (usize, usize, usize),
    dst: (&mut [f32], usize),
    (lhs, lhs_rs, lhs_cs): (&[f32], usize, usize),
    (rhs, rhs_rs, rhs_cs): (&[f32], usize, usize),
    keep: f32,
    scale: f32,
) {
    super::primitives::gemm_scaled(
        dims,
        dst,
        (lhs, lhs_rs as isize, lhs_cs as isize),
        (rhs, rhs_rs as isize, rhs_cs as isize),
        keep,
        scale,
    );
}

/// y = x Wᵀ for x (n × cols) and W (rows × cols): y is (n × rows). Parts of W's rows in parallel.
pub(crate) fn linear_forward(
    w: &[f32],
    (rows, cols): (usize, usize),
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    assert_eq!(
        (w.len(), x.len()),
        (rows * cols, n * cols),
        "linear_forward shapes"
    );
    // Each part computes its rows' outputs transposed (part × n), so parts write apart.
    let parts: Vec<Vec<f32>> = w
        .par_chunks(PART_ROWS * cols)
        .map(|part| {
            let part_rows = part.len() / cols;
            let mut out_t = vec![0f32; part_rows * n];
            gemm_scaled(
                (part_rows, n, cols),
                (&mut out_t, n),
                (part, cols, 1),
                (x, 1, cols),
                0.0,
                1.0,
            );
            out_t
        })
        .collect();
    let mut y = vec![0f32; n * rows];
    for (p, out_t) in parts.iter().enumerate() {
        for (r, row) in out_t.chunks_exact(n).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                y[i * rows + p * PART_ROWS + r] = v;
            }
        }
    }
    y
}

/// The backward pass of y = x Wᵀ: returns dx = dy W (n × cols) and hands ∇W = dyᵀ x to
/// `gradient`, W read once (see the module). W is taken in blocks of whole columns, each small
/// enough to stay in cache between its two products: dx's columns of the block come from one
/// product over all of W's rows (no partial sums), then the block is updated in place. Blocks
/// touch disjoint columns, so they run in parallel.
pub(crate) fn linear_backward(
    w: &mut [f32],
    (rows, cols): (usize, usize),
    x: &[f32],
    dy: &[f32],
    n: usize,
    gradient: WeightGradient,
) -> Vec<f32> {
    assert_eq!(
        (w.len(), x.len(), dy.len()),
        (rows * cols, n * cols, n * rows),
        "linear_backward shapes"
    );
    let (descend, stored) = split(gradient, rows * cols);
    let block_cols = column_block(rows);
    let mut dx = vec![0f32; n * cols];
    let (w_at, dx_at) = (SharedBuffer(w.as_mut_ptr()), SharedBuffer(dx.as_mut_ptr()));
    let grad_at = stored.map(|grad| SharedBuffer(grad.as_mut_ptr()));
    (0..cols.div_ceil(block_cols))
        .into_par_iter()
        .for_each(|b| {
            let first = b * block_cols;
            let width = block_cols.min(cols - first);
            // SAFETY: block b reads and writes only columns first..first + width of W, dx and the
            // stored gradient, which no other block touches; the slices outlive the loop and every
            // index gemm forms stays inside them (rows × cols, n × cols).
            unsafe {
                // dx[:, block] = dy · W[:, block], before the block changes.
                gemm::gemm(
                    n,
                    width,
                    rows,
                    dx_at.at(first),
                    1,
                    cols as isize,
                    false,
                    dy.as_ptr(),
                    1,
                    rows as isize,
                    w_at.at(first),
                    1,
                    cols as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
                // ∇W[:, block] = dyᵀ · x[:, block], stored or descended along.
                let (target, keep, scale) = match grad_at {
                    Some(grad) => (grad.at(first), 0.0, 1.0),
                    None => (w_at.at(first), 1.0, -descend),
                };
                gemm::gemm(
                    rows,
                    width,
                    n,
                    target,
                    1,
                    cols as isize,
                    keep != 0.0,
                    dy.as_ptr(),
                    rows as isize,
                    1,
                    x.as_ptr().add(first),
                    1,
                    cols as isize,
                    keep,
                    scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
    dx
}

/// Columns of a weight with `rows` rows that fit in about 1 MiB (a core's L2 on the machines
/// measured, docs/performance.md), at least 16: the unit of [`linear_backward`]'s blocks. It
/// depends on the shape only, so results do not depend on the threads.
fn column_block(rows: usize) -> usize {
    ((256 * 1024 / rows.max(1)) / 16 * 16).max(16)
}

/// A pointer shared by parallel tasks that touch disjoint parts of its buffer.
#[derive(Clone, Copy)]
struct SharedBuffer(*mut f32);

impl SharedBuffer {
    /// The pointer `offset` elements on.
    ///
    /// # Safety
    /// `offset` must stay inside the buffer.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller keeps `offset` inside the buffer.
        unsafe { self.0.add(offset) }
    }
}

// SAFETY: only used where each task writes elements no other task reads or writes.
unsafe impl Send for SharedBuffer {}
unsafe impl Sync for SharedBuffer {}

/// y = x W for x (n × rows) and W (rows × cols): y is (n × cols), a sum over W's rows.
pub(crate) fn transposed_forward(
    w: &[f32],
    (rows, cols): (usize, usize),
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    assert_eq!(
        (w.len(), x.len()),
        (rows * cols, n * rows),
        "transposed_forward shapes"
    );
    let partials: Vec<Vec<f32>> = w
        .par_chunks(PART_ROWS * cols)
        .enumerate()
        .map(|(p, part)| {
            let part_rows = part.len() / cols;
            let mut y = vec![0f32; n * cols];
            gemm_scaled(
                (n, cols, part_rows),
                (&mut y, cols),
                (&x[p * PART_ROWS..], rows, 1),
                (part, cols, 1),
                0.0,
                1.0,
            );
            y
        })
        .collect();
    sum_in_order(partials)
}

/// The backward pass of y = x W (W: rows × cols): returns dx = dy Wᵀ (n × rows) and hands
/// ∇W = xᵀ dy to `gradient`, W read once. Each row of W gives its own column of dx: no sums
/// across parts.
pub(crate) fn transposed_backward(
    w: &mut [f32],
    (rows, cols): (usize, usize),
    x: &[f32],
    dy: &[f32],
    n: usize,
    gradient: WeightGradient,
) -> Vec<f32> {
    assert_eq!(
        (w.len(), x.len(), dy.len()),
        (rows * cols, n * rows, n * cols),
        "transposed_backward shapes"
    );
    let (descend, stored) = split(gradient, rows * cols);
    let backward_part = |p: usize, part: &mut [f32], stored: Option<&mut [f32]>| {
        let part_rows = part.len() / cols;
        // dx[:, part]ᵀ = W[part] · dyᵀ, (part × n), before W[part] changes.
        let mut dx_t = vec![0f32; part_rows * n];
        gemm_scaled(
            (part_rows, n, cols),
            (&mut dx_t, n),
            (part, cols, 1),
            (dy, 1, cols),
            0.0,
            1.0,
        );
        // ∇W[part] = x[:, part]ᵀ · dy, stored or descended along.
        let (target, keep, scale) = match stored {
            Some(grad) => (grad, 0.0, 1.0),
            None => (part, 1.0, -descend),
        };
        gemm_scaled(
            (part_rows, cols, n),
            (target, cols),
            (&x[p * PART_ROWS..], 1, rows),
            (dy, cols, 1),
            keep,
            scale,
        );
        dx_t
    };
    let parts = by_parts(w, stored, PART_ROWS * cols, backward_part);
    let mut dx = vec![0f32; n * rows];
    for (p, dx_t) in parts.iter().enumerate() {
        for (r, row) in dx_t.chunks_exact(n).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                dx[i * rows + p * PART_ROWS + r] = v;
            }
        }
    }
    dx
}

/// The step size of a descent (0 when the gradient is stored) and the stored gradient's buffer.
fn split<'a>(gradient: WeightGradient<'a>, len: usize) -> (f32, Option<&'a mut [f32]>) {
    match gradient {
        WeightGradient::Descend(lr) => (lr, None),
        WeightGradient::Store(grad) => {
            assert_eq!(grad.len(), len, "gradient shape");
            (0.0, Some(grad))
        }
    }
}

/// `backward_part(p, rows of part p, its gradient rows)` over the parts of `w` in parallel. A
/// stored gradient leaves `w` alone: the parts then work on a copy.
fn by_parts<F>(
    w: &mut [f32],
    stored: Option<&mut [f32]>,
    part_len: usize,
    backward_part: F,
) -> Vec<Vec<f32>>
where
    F: Fn(usize, &mut [f32], Option<&mut [f32]>) -> Vec<f32> + Sync,
{
    match stored {
        None => w
            .par_chunks_mut(part_len)
            .enumerate()
            .map(|(p, part)| backward_part(p, part, None))
            .collect(),
        Some(grad) => {
            let mut copy = w.to_vec();
            copy.par_chunks_mut(part_len)
                .zip(grad.par_chunks_mut(part_len))
                .enumerate()
                .map(|(p, (part, grad))| backward_part(p, part, Some(grad)))
                .collect()
        }
    }
}

/// The element-wise sum of equal-length partial results, in their order.
fn sum_in_order(partials: Vec<Vec<f32>>) -> Vec<f32> {
    let mut partials = partials.into_iter();
    let mut total = partials.next().expect("at least one part");
    for partial in partials {
        total.iter_mut().zip(&partial).for_each(|(t, p)| *t += p);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values;

    /// Reference products in f64.
    fn product(a: &[f32], (m, k): (usize, usize), b: &[f32], n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|l| a[i * k + l] as f64 * b[l * n + j] as f64)
                    .sum();
            }
        }
        out
    }

    fn transpose(a: &[f32], (m, n): (usize, usize)) -> Vec<f32> {
        (0..n)
            .flat_map(|j| (0..m).map(move |i| a[i * n + j]))
            .collect()
    }

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn products_and_fused_updates_match_the_reference() {
        // Rows across several parts and blocks, the last of each partial.
        let (rows, cols, n, lr) = (PART_ROWS + 37, 45, 3, 0.25f32);
        let w = test_values(rows * cols, 1);
        let x = test_values(n * cols, 2);
        let dy = test_values(n * rows, 3);
        // y = x Wᵀ and its backward.
        close(
            &linear_forward(&w, (rows, cols), &x, n),
            &product(&x, (n, cols), &transpose(&w, (rows, cols)), rows),
        );
        let mut grad = vec![0f32; rows * cols];
        let mut kept = w.clone();
        let dx = linear_backward(
            &mut kept,
            (rows, cols),
            &x,
            &dy,
            n,
            WeightGradient::Store(&mut grad),
        );
        assert_eq!(kept, w, "Store leaves W alone");
        close(&dx, &product(&dy, (n, rows), &w, cols));
        let expected = product(&transpose(&dy, (n, rows)), (rows, n), &x, cols);
        close(&grad, &expected);
        let mut descended = w.clone();
        let dx2 = linear_backward(
            &mut descended,
            (rows, cols),
            &x,
            &dy,
            n,
            WeightGradient::Descend(lr),
        );
        assert_eq!(dx, dx2);
        let stepped: Vec<f64> = w
            .iter()
            .zip(&expected)
            .map(|(w, g)| *w as f64 - lr as f64 * g)
            .collect();
        close(&descended, &stepped);

        // y = x W (x: n × rows) and its backward.
        let xt = test_values(n * rows, 4);
        let dyt = test_values(n * cols, 5);
        close(
            &transposed_forward(&w, (rows, cols), &xt, n),
            &product(&xt, (n, rows), &w, cols),
        );
        let mut grad = vec![0f32; rows * cols];
        let mut kept = w.clone();
        let dx = transposed_backward(
            &mut kept,
            (rows, cols),
            &xt,
            &dyt,
            n,
            WeightGradient::Store(&mut grad),
        );
        assert_eq!(kept, w);
        close(
            &dx,
            &product(&dyt, (n, cols), &transpose(&w, (rows, cols)), rows),
        );
        let expected = product(&transpose(&xt, (n, rows)), (rows, n), &dyt, cols);
        close(&grad, &expected);
        let mut descended = w.clone();
        let dx2 = transposed_backward(
            &mut descended,
            (rows, cols),
            &xt,
            &dyt,
            n,
            WeightGradient::Descend(lr),
        );
        assert_eq!(dx, dx2);
        let stepped: Vec<f64> = w
            .iter()
            .zip(&expected)
            .map(|(w, g)| *w as f64 - lr as f64 * g)
            .collect();
        close(&descended, &stepped);
    }
}
