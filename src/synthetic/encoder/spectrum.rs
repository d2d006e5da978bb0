//! The encoder's query-key matrix W_QK = W_qᵀ W_k / √d (the definition of docs/design.md's
//! localization diagnostics): the CLS query scores a token x by LN₁(p)ᵀ W_QK LN₁(x). Its symmetric
//! part's spectrum needs three traces, each a d × d product of the weights (O(d³), so taken at
//! the start and the end of a run, not at every logged step).

use rayon::prelude::*;

use super::params::EncoderParams;
use crate::diagnostics::Traces;
use crate::kernels::gemm_into;

/// Output rows of a product one task computes.
const ROWS_PER_TASK: usize = 256;

/// lhs (m × k) · rhs (k × n), operands as (data, row stride, column stride), rows of the result
/// in parallel (in fixed blocks, so the result does not depend on the threads).
fn product(
    (m, n, k): (usize, usize, usize),
    (lhs, lhs_rs, lhs_cs): (&[f32], usize, usize),
    (rhs, rhs_rs, rhs_cs): (&[f32], usize, usize),
) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    out.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(block, rows)| {
            let first = block * ROWS_PER_TASK;
            gemm_into(
                (rows.len() / n, n, k),
                (rows, n),
                (&lhs[first * lhs_rs..], lhs_rs as isize, lhs_cs as isize),
                (rhs, rhs_rs as isize, rhs_cs as isize),
            );
        });
    out
}

/// tr W_QK, tr W_QK² and ‖W_QK‖_F², from tr(W_qᵀW_k), tr((W_k W_qᵀ)²) and
/// Σ (W_q W_qᵀ) ⊙ (W_k W_kᵀ).
pub fn traces(params: &EncoderParams) -> Traces {
    let d = params.dim;
    let (query, key) = (params.query(), params.key());
    let scale = 1.0 / d as f64;
    let trace = query
        .iter()
        .zip(key)
        .map(|(&q, &k)| f64::from(q) * f64::from(k))
        .sum::<f64>()
        * scale.sqrt();
    let key_query_t = product((d, d, d), (key, d, 1), (query, 1, d));
    let mut trace_square = 0f64;
    for a in 0..d {
        for b in 0..d {
            trace_square += f64::from(key_query_t[a * d + b]) * f64::from(key_query_t[b * d + a]);
        }
    }
    drop(key_query_t);
    let query_gram = product((d, d, d), (query, d, 1), (query, 1, d));
    let key_gram = product((d, d, d), (key, d, 1), (key, 1, d));
    let frobenius2: f64 = query_gram
        .iter()
        .zip(&key_gram)
        .map(|(&q, &k)| f64::from(q) * f64::from(k))
        .sum();
    Traces {
        dim: d,
        trace,
        trace_square: trace_square * scale,
        frobenius2: frobenius2 * scale,
    }
}

/// W_QK, d × d row-major.
pub fn key_query(params: &EncoderParams) -> Vec<f64> {
    let d = params.dim;
    let scale = 1.0 / (d as f64).sqrt();
    product((d, d, d), (params.query(), 1, d), (params.key(), d, 1))
        .into_iter()
        .map(|v| f64::from(v) * scale)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_are_those_of_the_matrix() {
        let params = EncoderParams::init(300, 4, 1);
        let d = params.dim;
        let matrix = key_query(&params);
        // W_QK[a][b] = Σ_c W_q[c][a] W_k[c][b] / √d.
        let direct: f64 = (0..d)
            .map(|c| f64::from(params.query()[c * d + 7]) * f64::from(params.key()[c * d + 11]))
            .sum::<f64>()
            / (d as f64).sqrt();
        assert!((matrix[7 * d + 11] - direct).abs() < 1e-6);
        let expected = Traces::of_row_major(&matrix, d);
        let got = traces(&params);
        for (a, b) in [
            (got.trace, expected.trace),
            (got.trace_square, expected.trace_square),
            (got.frobenius2, expected.frobenius2),
        ] {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}
