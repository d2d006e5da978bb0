//! The card's head mode: the paper's token-selection model with K classes on the frozen
//! backbone's final tokens, f(X) = C(Σ_t softmax_t(X Wᵀ p) x_t), with C a linear classifier
//! trained first in phase 1 (by default on every single final token, as ν scores single tokens;
//! `--head-classifier mean|cls` for the mean-pooled or the CLS token) and then frozen while W and
//! p train. W ~ U(±1/√D) and p = 0 as in the synthetic model (docs/protocol.md §2.2).

use anyhow::Result;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};

use super::attend::{KeyValues, broadcast_query};
use rand::RngExt;

pub struct TokenSelectionHead {
    /// (D, D).
    pub w: Var,
    /// (D,).
    pub p: Var,
}

/// The pooled features and the selection (B, T) of a batch.
pub struct Selection {
    pub pooled: Tensor,
    pub attention: Tensor,
}

impl TokenSelectionHead {
    pub fn new(hidden: usize, rng: &mut impl rand::Rng, device: &Device) -> Result<Self> {
        let bound = 1.0 / (hidden as f32).sqrt();
        let w: Vec<f32> = (0..hidden * hidden)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        Ok(Self {
            w: Var::from_tensor(&Tensor::from_vec(w, (hidden, hidden), device)?)?,
            p: Var::zeros(hidden, candle_core::DType::F32, device)?,
        })
    }

    /// Σ_t softmax_t(X Wᵀ p) x_t over samples `rows` of `tokens` (the final tokens, one head,
    /// scale 1, the text padding cut).
    pub fn select(&self, tokens: &Arc<KeyValues>, rows: &[usize]) -> Result<Selection> {
        // X Wᵀ p = X (Wᵀ p): one D-vector per step instead of a (T, D) product per sample.
        let direction = self.p.unsqueeze(0)?.matmul(&self.w)?; // (1, D) = (Wᵀ p)ᵀ
        let queries = broadcast_query(&direction, rows.len())?;
        let bias = Tensor::zeros((rows.len(), 1), DType::F32, queries.device())?;
        let attended = tokens.attend(&queries, &bias, rows)?;
        Ok(Selection {
            pooled: attended.pooled.squeeze(1)?,
            attention: attended.probs.squeeze(1)?,
        })
    }

    pub fn named(&self) -> Vec<(String, Var)> {
        vec![
            ("head.w".into(), self.w.clone()),
            ("head.p".into(), self.p.clone()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn zero_query_pools_the_mean_of_the_attended_tokens() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let head = TokenSelectionHead::new(4, &mut rng, &Device::Cpu).unwrap();
        let tokens = Tensor::new(
            &[[[1f32, 0., 0., 0.], [0., 1., 0., 0.], [0., 0., 1., 9.]]],
            &Device::Cpu,
        )
        .unwrap();
        let tokens = Arc::new(KeyValues::new(&tokens, 1, Some(&[2]), 1.0).unwrap());
        let s = head.select(&tokens, &[0]).unwrap();
        assert_eq!(
            s.pooled.to_vec2::<f32>().unwrap(),
            vec![vec![0.5, 0.5, 0.0, 0.0]]
        );
    }
}
