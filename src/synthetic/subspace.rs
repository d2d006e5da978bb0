//! Exact low-rank reformulation of gradient descent on (W, p), from docs/protocol.md §2.6.
//!
//! Let A = [x_{i,t}] ∈ R^{d×M} hold the M = nT training tokens as columns and B = W₀^T A.
//! Every gradient of W is rank one, ∇W = A c p^T with c = dL/da, and every gradient of p is
//! W^T A c. By induction, starting from p₀ = 0:
//!
//!   W_t = W₀ + A Q_t B^T,   p_t = B b_t,   with Q_t ∈ R^{M×M}, b_t ∈ R^M.
//!
//! Then, with G_A = A^T A and G_B = B^T B (both M×M, computed once),
//!
//!   logits   a = A^T W p  = r + G_A Q r,          r = G_B b
//!   update   Q ← Q − η c b^T,   b ← b − η (c + Q^T G_A c)   (both from the old Q, b)
//!
//! so a step costs O(M²) instead of O(d²), and the trajectory is the same one, up to float
//! rounding. u = W p = W₀ (B b) + A (Q r) is formed in O(d² + dM) only when a test set is scored.
//!
//! The spectrum diagnostics need tr W, tr W² and ‖W‖_F² (`diagnostics::Traces`). With Δ = A Q Bᵀ,
//! C = Bᵀ A and K = Bᵀ W₀ A (M×M, K once in O(d²M) on first use):
//!
//!   tr W   = tr W₀  + tr(Q C)
//!   ‖W‖_F² = ‖W₀‖²  + 2 tr(Q G_B) + tr(Qᵀ G_A Q G_B)      (⟨W₀, Δ⟩ = tr(Q Bᵀ W₀ᵀ A) = tr(Q G_B))
//!   tr W²  = tr W₀² + 2 tr(Q K)   + tr(Q C Q C)
//!
//! so a logged step costs three M×M products, never a d×d matrix.

use std::cell::OnceCell;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use super::data::TokenSet;
use super::engine::Engine;
use super::model::Forward;
use crate::diagnostics::Traces;

pub struct SubspaceEngine {
    /// M = n·T.
    rank: usize,
    learning_rate: f64,
    head_values: Vec<f64>,
    labels: Vec<f64>,
    /// A^T: training tokens as rows, (M, d), f64.
    tokens: Tensor,
    /// W₀, (d, d), f64.
    w0: Tensor,
    /// B^T = A^T W₀, (M, d), f64.
    key_basis: Tensor,
    /// G_A = A^T A, (M × M) row-major.
    gram_tokens: Vec<f64>,
    /// G_B = B^T B, (M × M) row-major.
    gram_keys: Vec<f64>,
    /// W = W₀ + A Q B^T.
    q: Vec<f64>,
    /// p = B b.
    b: Vec<f64>,
    /// What the traces of W need besides Q, built on first use.
    trace_terms: OnceCell<TraceTerms>,
}

/// The fixed parts of tr W, tr W², ‖W‖_F² (module doc).
struct TraceTerms {
    initial: Traces,
    /// C = Bᵀ A, K = Bᵀ W₀ A, G_A, G_B as (M, M) tensors.
    cross: Tensor,
    doubled: Tensor,
    gram_tokens: Tensor,
    gram_keys: Tensor,
}

impl SubspaceEngine {
    pub fn new(train: &TokenSet, signal_norm: f64, w0: &[f32], learning_rate: f64) -> Result<Self> {
        let (m, d) = (train.num_samples * train.seq_len, train.embed_dim);
        let dev = Device::Cpu;
        let tokens = Tensor::from_slice(&train.tokens, (m, d), &dev)?.to_dtype(DType::F64)?;
        // One pass from the f32 draws to f64 (no intermediate f32 tensor: W₀ is the big one).
        let w0 = Tensor::from_vec(
            w0.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>(),
            (d, d),
            &dev,
        )?;
        let key_basis = tokens.matmul(&w0)?;
        let gram =
            |x: &Tensor| -> Result<Vec<f64>> { Ok(x.matmul(&x.t()?)?.flatten_all()?.to_vec1()?) };
        let (gram_tokens, gram_keys) = (gram(&tokens)?, gram(&key_basis)?);
        Ok(Self {
            rank: m,
            learning_rate,
            head_values: train.head_values(signal_norm),
            labels: train.labels.clone(),
            tokens,
            w0,
            key_basis,
            gram_tokens,
            gram_keys,
            q: vec![0.0; m * m],
            b: vec![0.0; m],
            trace_terms: OnceCell::new(),
        })
    }

    fn trace_terms(&self) -> Result<&TraceTerms> {
        if let Some(terms) = self.trace_terms.get() {
            return Ok(terms);
        }
        let (m, d) = (self.rank, self.w0.dim(0)?);
        let tokens_t = self.tokens.t()?; // A, (d, M)
        let square = |v: &[f64]| Tensor::from_slice(v, (m, m), &Device::Cpu);
        let terms = TraceTerms {
            initial: Traces::of_row_major(&self.w0.flatten_all()?.to_vec1::<f64>()?, d),
            cross: self.key_basis.matmul(&tokens_t)?,
            doubled: self.key_basis.matmul(&self.w0)?.matmul(&tokens_t)?,
            gram_tokens: square(&self.gram_tokens)?,
            gram_keys: square(&self.gram_keys)?,
        };
        Ok(self.trace_terms.get_or_init(|| terms))
    }

    /// r = G_B b and Q r.
    fn reduced_scores(&self) -> (Vec<f64>, Vec<f64>) {
        let r = matvec(&self.gram_keys, &self.b, self.rank);
        let qr = matvec(&self.q, &r, self.rank);
        (r, qr)
    }

    /// The query p = B b (d).
    pub fn query(&self) -> Result<Vec<f64>> {
        self.row_combination(&self.b, &self.key_basis)
    }

    /// Σ_k coeffs_k · rows_k for rows of a (M, d) tensor.
    fn row_combination(&self, coeffs: &[f64], rows: &Tensor) -> Result<Vec<f64>> {
        let c = Tensor::from_slice(coeffs, (1, self.rank), &Device::Cpu)?;
        Ok(c.matmul(rows)?.flatten_all()?.to_vec1()?)
    }
}

impl Engine for SubspaceEngine {
    fn train_logits(&self) -> Result<Vec<f64>> {
        let (r, qr) = self.reduced_scores();
        let g_qr = matvec(&self.gram_tokens, &qr, self.rank);
        Ok(r.iter().zip(&g_qr).map(|(a, b)| a + b).collect())
    }

    fn scoring_direction(&self) -> Result<Vec<f64>> {
        let (_, qr) = self.reduced_scores();
        let d = self.w0.dim(0)?;
        let p = Tensor::from_vec(self.query()?, (d, 1), &Device::Cpu)?;
        let w0p = self.w0.matmul(&p)?.flatten_all()?.to_vec1::<f64>()?;
        let aqr = self.row_combination(&qr, &self.tokens)?;
        Ok(w0p.iter().zip(&aqr).map(|(a, b)| a + b).collect())
    }

    /// W = W₀ + A Q Bᵀ, O(d²M).
    fn key_query(&self) -> Result<Vec<f64>> {
        let q = Tensor::from_slice(&self.q, (self.rank, self.rank), &Device::Cpu)?;
        let w = (&self.w0 + self.tokens.t()?.matmul(&q)?.matmul(&self.key_basis)?)?;
        Ok(w.flatten_all()?.to_vec1()?)
    }

    fn key_query_traces(&self) -> Result<Traces> {
        let terms = self.trace_terms()?;
        let q = Tensor::from_slice(&self.q, (self.rank, self.rank), &Device::Cpu)?;
        // Σ_ij X_ij Y_ij = tr(Xᵀ Y).
        let dot = |x: &Tensor, y: &Tensor| -> Result<f64> { Ok((x * y)?.sum_all()?.to_scalar()?) };
        let qc = q.matmul(&terms.cross)?;
        let base = terms.initial;
        Ok(Traces {
            dim: base.dim,
            trace: base.trace + dot(&q, &terms.cross.t()?)?,
            frobenius2: base.frobenius2
                + 2.0 * dot(&q, &terms.gram_keys)?
                + dot(&terms.gram_tokens.matmul(&q)?, &q.matmul(&terms.gram_keys)?)?,
            trace_square: base.trace_square
                + 2.0 * dot(&q, &terms.doubled.t()?)?
                + dot(&qc, &qc.t()?)?,
        })
    }

    fn step(&mut self, forward: &Forward) -> Result<()> {
        let m = self.rank;
        let lr = self.learning_rate;
        let c = forward.logit_grads(&self.head_values, &self.labels);
        let gc = matvec(&self.gram_tokens, &c, m);
        let qt_gc = matvec_transposed(&self.q, &gc, m);
        // ΔQ uses the old b, Δb the old Q: simultaneous updates as in SGD.
        for (i, &ci) in c.iter().enumerate() {
            let row = &mut self.q[i * m..(i + 1) * m];
            row.iter_mut()
                .zip(&self.b)
                .for_each(|(qij, bj)| *qij -= lr * ci * bj);
        }
        for ((bk, ck), gk) in self.b.iter_mut().zip(&c).zip(&qt_gc) {
            *bk -= lr * (ck + gk);
        }
        Ok(())
    }
}

/// y = M x for a row-major (n × n) matrix.
fn matvec(matrix: &[f64], x: &[f64], n: usize) -> Vec<f64> {
    matrix
        .chunks_exact(n)
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

/// y = M^T x for a row-major (n × n) matrix.
fn matvec_transposed(matrix: &[f64], x: &[f64], n: usize) -> Vec<f64> {
    let mut y = vec![0.0; n];
    for (row, xi) in matrix.chunks_exact(n).zip(x) {
        y.iter_mut().zip(row).for_each(|(acc, a)| *acc += a * xi);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::config::SyntheticConfig;
    use crate::synthetic::data::{initial_key_query, train_and_test};
    use crate::synthetic::dense::DenseEngine;

    fn max_rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
            / scale
    }

    /// A few steps on a tiny problem: W, p and the logits agree with the dense engine.
    #[test]
    fn parameters_track_the_dense_engine_step_by_step() {
        let config = SyntheticConfig {
            embed_dim: 30,
            train_n: 6,
            seq_len: 4,
            test_n: 1,
            learning_rate: 0.5,
            ..Default::default()
        };
        let (train, _) = train_and_test(&config);
        let w0 = initial_key_query(config.embed_dim, config.seed);
        let mut dense = DenseEngine::new(
            &train,
            config.signal_norm,
            &w0,
            config.learning_rate,
            DType::F64,
        )
        .unwrap();
        let mut fast =
            SubspaceEngine::new(&train, config.signal_norm, &w0, config.learning_rate).unwrap();
        let values = train.head_values(config.signal_norm);
        for step in 0..25 {
            let (ld, lf) = (dense.train_logits().unwrap(), fast.train_logits().unwrap());
            if step > 0 {
                assert!(
                    max_rel(&lf, &ld) < 1e-10,
                    "step {step}: logits {}",
                    max_rel(&lf, &ld)
                );
            }
            let fwd = Forward::new(&lf, &values, &train.labels, config.seq_len);
            dense.step(&fwd).unwrap();
            fast.step(&fwd).unwrap();
        }
        assert!(max_rel(&fast.key_query().unwrap(), &dense.key_query().unwrap()) < 1e-10);
        // The traces from M×M products equal those of the formed W.
        let (ours, formed) = (
            fast.key_query_traces().unwrap(),
            Traces::of_row_major(&dense.key_query().unwrap(), config.embed_dim),
        );
        for (a, b) in [
            (ours.trace, formed.trace),
            (ours.trace_square, formed.trace_square),
            (ours.frobenius2, formed.frobenius2),
        ] {
            assert!(
                (a - b).abs() < 1e-10 * (1.0 + b.abs()),
                "{ours:?} vs {formed:?}"
            );
        }
        assert!(max_rel(&fast.query().unwrap(), &dense.query().unwrap()) < 1e-10);
        assert!(
            max_rel(
                &fast.scoring_direction().unwrap(),
                &dense.scoring_direction().unwrap()
            ) < 1e-10
        );
    }
}
