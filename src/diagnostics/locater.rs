//! LocAteR (Bao et al. 2024, docs/protocol.md §5): a penalty that "minimizes the eigenspectrum scale while
//! maintaining its mean". The paper's exact form is not public; the form implemented here is
//!
//!   λ · v_sym(W),   v_sym = ‖S‖_F² / d − (tr W / d)²,   S = (W + Wᵀ) / 2,
//!
//! the variance of the eigenvalues of W's symmetric part (what [`super::localization::Traces::symmetric`]
//! reports). Its gradient is (2λ/d)(S − m I) with m = tr W / d: it pulls S towards m I, shrinking
//! the spread, and has zero trace, so a gradient step leaves the eigen-mean exactly where it was.
//! §5's ‖W‖_F²/d − m² is the same quantity for a normal W; for a non-normal one it also penalises
//! the skew part, which does not spread the real parts, so S is the faithful choice.
//!
//! Both functions return a differentiable scalar tensor (candle autograd).

use anyhow::Result;
use candle_core::{D, Tensor};

/// Positions of the diagonal in a flattened n × n matrix.
fn diagonal_ids(n: usize, device: &candle_core::Device) -> Result<Tensor> {
    let ids: Vec<u32> = (0..n).map(|i| (i * (n + 1)) as u32).collect();
    Ok(Tensor::from_vec(ids, n, device)?)
}

/// v_sym from tr W, tr W² and ‖W‖_F² (tensors of any equal shape), for width `dim`.
fn symmetric_variance_from_traces(
    trace: &Tensor,
    trace_square: &Tensor,
    frobenius2: &Tensor,
    dim: usize,
) -> Result<Tensor> {
    let d = dim as f64;
    let spread = ((frobenius2 + trace_square)? * (0.5 / d))?;
    Ok((spread - (trace * (1.0 / d))?.sqr()?)?)
}

/// v_sym of a square matrix W (d, d).
pub fn symmetric_variance(w: &Tensor) -> Result<Tensor> {
    let d = w.dim(0)?;
    let trace = w
        .flatten_all()?
        .index_select(&diagonal_ids(d, w.device())?, 0)?
        .sum_all()?;
    let trace_square = (w * w.t()?)?.sum_all()?;
    let frobenius2 = w.sqr()?.sum_all()?;
    symmetric_variance_from_traces(&trace, &trace_square, &frobenius2, d)
}

/// Mean over heads of v_sym(scale · W_qₕᵀ W_kₕ), from torch-layout query and key weights
/// (heads·d_h, d) whose rows are grouped by head. Only d_h × d_h products are formed: the traces
/// of the d × d product are traces of W_kₕ W_qₕᵀ and of W_qₕ W_qₕᵀ · W_kₕ W_kₕᵀ.
pub fn head_symmetric_variance(
    query: &Tensor,
    key: &Tensor,
    heads: usize,
    scale: f64,
) -> Result<Tensor> {
    let (rows, dim) = query.dims2()?;
    let head_dim = rows / heads;
    let split = |w: &Tensor| w.reshape((heads, head_dim, dim));
    let (q, k) = (split(query)?, split(key)?);
    let small = (k.matmul(&q.t()?.contiguous()?)? * scale)?; // (H, d_h, d_h)
    let trace = small
        .reshape((heads, head_dim * head_dim))?
        .index_select(&diagonal_ids(head_dim, query.device())?, 1)?
        .sum(D::Minus1)?;
    let trace_square = (&small * small.t()?)?.sum((1, 2))?;
    let gram = |w: &Tensor| w.matmul(&w.t()?.contiguous()?);
    let frobenius2 = ((gram(&q)? * gram(&k)?)?.sum((1, 2))? * (scale * scale))?;
    Ok(symmetric_variance_from_traces(&trace, &trace_square, &frobenius2, dim)?.mean_all()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::localization::{Traces, head_spectrum};
    use candle_core::{DType, Device, Var};

    fn values(count: usize, salt: usize) -> Vec<f64> {
        (0..count)
            .map(|k| (((k * 31 + salt * 7) % 23) as f64 - 11.0) / 9.0)
            .collect()
    }

    /// The penalty is the reported statistic, and its gradient is (2/d)(S − mI): trace-free.
    #[test]
    fn penalty_is_the_symmetric_variance_and_keeps_the_mean() {
        let d = 7;
        let w = values(d * d, 1);
        let var = Var::from_tensor(&Tensor::from_slice(&w, (d, d), &Device::Cpu).unwrap()).unwrap();
        let penalty = symmetric_variance(var.as_tensor()).unwrap();
        let expected = Traces::of_row_major(&w, d).symmetric().var;
        let got = penalty.to_scalar::<f64>().unwrap();
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");

        let grad: Vec<f64> = penalty
            .backward()
            .unwrap()
            .get(&var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mean = w.iter().step_by(d + 1).sum::<f64>() / d as f64;
        for r in 0..d {
            for c in 0..d {
                let sym = (w[r * d + c] + w[c * d + r]) / 2.0 - if r == c { mean } else { 0.0 };
                let closed = 2.0 / d as f64 * sym;
                assert!((grad[r * d + c] - closed).abs() < 1e-12, "({r},{c})");
            }
        }
        let grad_trace: f64 = grad.iter().step_by(d + 1).sum();
        assert!(
            grad_trace.abs() < 1e-12,
            "the gradient moves the mean: {grad_trace}"
        );
    }

    #[test]
    fn head_penalty_is_the_mean_of_the_heads_symmetric_variances() {
        let (heads, head_dim, d) = (3, 2, 6);
        let (wq, wk) = (
            values(heads * head_dim * d, 2),
            values(heads * head_dim * d, 5),
        );
        let scale = 1.0 / (head_dim as f64).sqrt();
        let tensor = |w: &[f64]| Tensor::from_slice(w, (heads * head_dim, d), &Device::Cpu);
        let penalty =
            head_symmetric_variance(&tensor(&wq).unwrap(), &tensor(&wk).unwrap(), heads, scale)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
        let rows = head_dim * d;
        let as_f32 = |w: &[f64]| w.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let (wq32, wk32) = (as_f32(&wq), as_f32(&wk));
        let expected = (0..heads)
            .map(|h| {
                head_spectrum(
                    &wq32[h * rows..(h + 1) * rows],
                    &wk32[h * rows..(h + 1) * rows],
                    head_dim,
                    scale,
                )
                .sym_var
            })
            .sum::<f64>()
            / heads as f64;
        // head_spectrum reads f32 weights.
        assert!(
            (penalty - expected).abs() < 1e-6 * (1.0 + expected),
            "{penalty} vs {expected}"
        );
    }
}
