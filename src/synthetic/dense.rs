//! The reference engine: W (d×d) and p (d) as candle variables, the loss built as a graph,
//! gradients by candle's autograd (the chain through the token logits by hand, to the same bits:
//! [`DenseEngine::gradients`]) and plain SGD, exactly as the authors' torch code
//! (`main.py::Attention`, full-batch `torch.optim.SGD`). O(d²) per step.
//!
//! The one engine that can add the LocAteR penalty (`diagnostics::locater`): its gradient has W₀
//! and identity components, which leave the subspace the low-rank engine trains in.

use anyhow::{Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{Optimizer, SGD};

use super::data::TokenSet;
use super::engine::Engine;
use super::model::Forward;
use crate::diagnostics::{Traces, locater};

pub struct DenseEngine {
    seq_len: usize,
    /// Training tokens, (n·T, d).
    tokens: Tensor,
    /// ν^T x of every training token, (n, T): ν is fixed, so this is a constant of the run.
    values: Tensor,
    /// Observed labels ±1, (n,).
    labels: Tensor,
    w: Var,
    p: Var,
    optimizer: SGD,
    /// λ of the LocAteR penalty; 0: none.
    locater: f64,
}

impl DenseEngine {
    /// Starts from W = `w0` (d×d row-major) and p = 0.
    pub fn new(
        train: &TokenSet,
        signal_norm: f64,
        w0: &[f32],
        learning_rate: f64,
        dtype: DType,
    ) -> Result<Self> {
        let p0 = vec![0f32; train.embed_dim];
        Self::from_parameters(train, signal_norm, w0, &p0, learning_rate, dtype)
    }

    pub fn from_parameters(
        train: &TokenSet,
        signal_norm: f64,
        w: &[f32],
        p: &[f32],
        learning_rate: f64,
        dtype: DType,
    ) -> Result<Self> {
        let (n, t, d) = (train.num_samples, train.seq_len, train.embed_dim);
        let dev = Device::Cpu;
        let tokens = Tensor::from_slice(&train.tokens, (n * t, d), &dev)?.to_dtype(dtype)?;
        let mut nu = vec![0f64; d];
        let scale = 1.0 / (std::f64::consts::SQRT_2 * signal_norm);
        (nu[0], nu[1]) = (scale, -scale);
        let head = Tensor::from_vec(nu, (d, 1), &dev)?.to_dtype(dtype)?;
        let values = tokens.matmul(&head)?.reshape((n, t))?;
        let labels = Tensor::from_slice(&train.labels, n, &dev)?.to_dtype(dtype)?;
        let w = Var::from_tensor(&Tensor::from_slice(w, (d, d), &dev)?.to_dtype(dtype)?)?;
        let p = Var::from_tensor(&Tensor::from_slice(p, (d, 1), &dev)?.to_dtype(dtype)?)?;
        let optimizer = SGD::new(vec![w.clone(), p.clone()], learning_rate)?;
        Ok(Self {
            seq_len: t,
            tokens,
            values,
            labels,
            w,
            p,
            optimizer,
            locater: 0.0,
        })
    }

    /// Adds λ · v_sym(W) to the loss that is descended (not to the logged data loss).
    pub fn with_locater(mut self, lambda: f64) -> Self {
        self.locater = lambda;
        self
    }

    /// The loss as one candle graph over W and p, autograd all the way: the reference
    /// [`grad_store`](Self::grad_store) is tested against.
    #[cfg(test)]
    fn loss(&self) -> Result<Tensor> {
        // The authors compute (X W) p; X (W p) is the same function at O(d²) instead of O(nTd²).
        let u = self.w.matmul(self.p.as_tensor())?; // (d, 1)
        self.loss_at(&self.tokens.matmul(&u)?)
    }

    /// Mean logistic loss at the token logits a = X u, (n·T, 1), plus the LocAteR penalty when
    /// λ > 0.
    fn loss_at(&self, logits: &Tensor) -> Result<Tensor> {
        let n = self.labels.dim(0)?;
        let logits = logits.reshape((n, self.seq_len))?;
        let attention = candle_nn::ops::softmax(&logits, D::Minus1)?;
        let outputs = (attention * &self.values)?.sum(D::Minus1)?; // (n,)
        let margins = (outputs * &self.labels)?.neg()?;
        // log(1 + e^z) = max(z, 0) + log(1 + e^{−|z|}), stable for any z.
        let softplus = (margins.relu()? + (margins.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        let data_loss = softplus.mean_all()?;
        if self.locater > 0.0 {
            let penalty = locater::symmetric_variance(self.w.as_tensor())?;
            return Ok((data_loss + (penalty * self.locater)?)?);
        }
        Ok(data_loss)
    }

    /// The gradients of the loss with respect to W and p: candle's autograd, with
    /// the chain through the logits a = X u taken by hand. Autograd through `X.matmul(u)` would
    /// also form ∂L/∂X, an (n·T × d) tensor nothing reads, at every step (about half of a step's
    /// time at T 197, n 1000); ∂L/∂u = Xᵀ ∂L/∂a is the same product autograd makes.
    fn grad_store(&self) -> Result<GradStore> {
        let u = self.w.matmul(self.p.as_tensor())?; // (d, 1)
        let logits = Var::from_tensor(&self.tokens.matmul(&u.detach())?)?;
        let mut grads = self.loss_at(logits.as_tensor())?.backward()?;
        let logit_grads = grads
            .remove(logits.as_tensor())
            .context("no gradient reached the logits")?;
        let u_grads = self.tokens.t()?.matmul(&logit_grads)?.detach();
        let through_u = (u * u_grads)?.sum_all()?.backward()?;
        for var in [&self.w, &self.p] {
            let Some(g) = through_u.get(var) else {
                continue;
            };
            // W's other path is the LocAteR penalty; p has none.
            let total = match grads.get(var) {
                Some(other) => (other + g)?,
                None => g.clone(),
            };
            grads.insert(var, total);
        }
        Ok(grads)
    }

    /// (∂L/∂W, ∂L/∂p), as f64 row-major vectors.
    pub fn gradients(&self) -> Result<(Vec<f64>, Vec<f64>)> {
        let grads = self.grad_store()?;
        let flat = |var: &Var| -> Result<Vec<f64>> {
            let g = grads
                .get(var)
                .ok_or_else(|| anyhow::anyhow!("no gradient reached a parameter"))?;
            Ok(g.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
        };
        Ok((flat(&self.w)?, flat(&self.p)?))
    }

    pub fn query(&self) -> Result<Vec<f64>> {
        Ok(self.p.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
    }
}

impl Engine for DenseEngine {
    fn train_logits(&self) -> Result<Vec<f64>> {
        let u = self.w.matmul(self.p.as_tensor())?;
        Ok(self
            .tokens
            .matmul(&u)?
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1()?)
    }

    fn scoring_direction(&self) -> Result<Vec<f64>> {
        Ok(self
            .w
            .matmul(self.p.as_tensor())?
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1()?)
    }

    fn key_query(&self) -> Result<Vec<f64>> {
        Ok(self.w.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
    }

    fn key_query_traces(&self) -> Result<Traces> {
        Ok(Traces::of_row_major(&self.key_query()?, self.w.dim(0)?))
    }

    fn step(&mut self, _forward: &Forward) -> Result<()> {
        let grads = self.grad_store()?;
        self.optimizer.step(&grads)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::config::SyntheticConfig;
    use crate::synthetic::data::{initial_key_query, train_and_test};
    use rand::{RngExt, SeedableRng};

    /// §2.6: with u = W p, g_i = −y_i σ(−y_i f_i)/n, ga = g s (v − f), gu = Σ ga x:
    /// ∇W = gu p^T and ∇p = W^T gu. Checked against candle's autograd at a point with p ≠ 0.
    #[test]
    fn autograd_matches_the_closed_form_gradients() {
        let config = SyntheticConfig {
            embed_dim: 12,
            train_n: 6,
            seq_len: 4,
            test_n: 1,
            ..Default::default()
        };
        let (train, _) = train_and_test(&config);
        let d = config.embed_dim;
        let w = initial_key_query(d, 3);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let p: Vec<f32> = (0..d).map(|_| rng.random_range(-0.3f32..0.3)).collect();
        let engine =
            DenseEngine::from_parameters(&train, config.signal_norm, &w, &p, 0.1, DType::F64)
                .unwrap();
        let (grad_w, grad_p) = engine.gradients().unwrap();

        // Closed form, in plain f64.
        let w: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let p: Vec<f64> = p.iter().map(|&v| v as f64).collect();
        let u: Vec<f64> = (0..d)
            .map(|r| (0..d).map(|c| w[r * d + c] * p[c]).sum())
            .collect();
        let tokens: Vec<f64> = train.tokens.iter().map(|&v| v as f64).collect();
        let logits: Vec<f64> = tokens
            .chunks_exact(d)
            .map(|x| x.iter().zip(&u).map(|(a, b)| a * b).sum())
            .collect();
        let values = train.head_values(config.signal_norm);
        let fwd = Forward::new(&logits, &values, &train.labels, config.seq_len);
        let ga = fwd.logit_grads(&values, &train.labels);
        let mut gu = vec![0.0; d];
        for (x, g) in tokens.chunks_exact(d).zip(&ga) {
            gu.iter_mut().zip(x).for_each(|(acc, xk)| *acc += g * xk);
        }
        let closed_w: Vec<f64> = (0..d * d).map(|k| gu[k / d] * p[k % d]).collect();
        let closed_p: Vec<f64> = (0..d)
            .map(|c| (0..d).map(|r| w[r * d + c] * gu[r]).sum())
            .collect();

        let rel = |a: &[f64], b: &[f64]| {
            let diff: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            diff / b.iter().map(|y| y * y).sum::<f64>().sqrt()
        };
        assert!(
            rel(&grad_w, &closed_w) < 1e-4,
            "∇W relative error {}",
            rel(&grad_w, &closed_w)
        );
        assert!(
            rel(&grad_p, &closed_p) < 1e-4,
            "∇p relative error {}",
            rel(&grad_p, &closed_p)
        );
        assert!(
            closed_w.iter().any(|g| g.abs() > 1e-6),
            "degenerate test point"
        );
        // Element-wise too, on the largest entries.
        for (a, b) in grad_w.iter().zip(&closed_w).filter(|(_, b)| b.abs() > 1e-3) {
            assert!((a - b).abs() <= 1e-4 * b.abs(), "{a} vs {b}");
        }
    }

    /// The chain through the logits taken by hand gives autograd's gradients to the bit, with
    /// the LocAteR penalty (W's second path) and without.
    #[test]
    fn hand_chain_is_autograd_to_the_bit() {
        let config = SyntheticConfig {
            embed_dim: 12,
            train_n: 6,
            seq_len: 5,
            test_n: 1,
            ..Default::default()
        };
        let (train, _) = train_and_test(&config);
        let d = config.embed_dim;
        let w = initial_key_query(d, 3);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let p: Vec<f32> = (0..d).map(|_| rng.random_range(-0.3f32..0.3)).collect();
        for locater in [0.0, 0.7] {
            let engine =
                DenseEngine::from_parameters(&train, config.signal_norm, &w, &p, 0.1, DType::F32)
                    .unwrap()
                    .with_locater(locater);
            let expected = engine.loss().unwrap().backward().unwrap();
            let got = engine.grad_store().unwrap();
            for var in [&engine.w, &engine.p] {
                let bits = |g: &Tensor| -> Vec<u32> {
                    let v: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
                    v.iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(
                    bits(got.get(var).unwrap()),
                    bits(expected.get(var).unwrap()),
                    "λ {locater}"
                );
            }
        }
    }

    #[test]
    fn first_step_moves_only_p() {
        // With p = 0, ∂L/∂W = gu p^T = 0: W first moves at the second step (docs/protocol.md §2.3).
        let config = SyntheticConfig {
            embed_dim: 10,
            train_n: 4,
            seq_len: 3,
            test_n: 1,
            ..Default::default()
        };
        let (train, _) = train_and_test(&config);
        let w0 = initial_key_query(10, 1);
        let engine = DenseEngine::new(&train, config.signal_norm, &w0, 0.1, DType::F64).unwrap();
        let (grad_w, grad_p) = engine.gradients().unwrap();
        assert!(grad_w.iter().all(|g| *g == 0.0));
        assert!(grad_p.iter().any(|g| *g != 0.0));
    }
}
