//! The classification head of phase 1 (docs/protocol.md §3): ViT's `classifier` on the final-LayerNorm CLS
//! token; BERT's `pooler` (tanh, initialised from the checkpoint) and `classifier` on position 0,
//! or the classifier alone when the checkpoint has no pooler. Initialised as HF does: weights
//! N(0, 0.02²), biases 0.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};

use crate::encoder::projections::FrozenLinear;
use rand::RngExt;
use rand_distr::Normal;

pub struct Classifier {
    /// (weight (D, D), bias (D)) of BERT's pooler.
    pub pooler: Option<(Var, Var)>,
    /// (C, D).
    pub weight: Var,
    /// (C,).
    pub bias: Var,
}

/// HF's `initializer_range`.
const INIT_STD: f64 = 0.02;

impl Classifier {
    /// A fresh classifier for `classes` classes on `hidden`-wide features, optionally behind a
    /// pooler initialised from `pooler` (weight, bias).
    pub fn new(
        hidden: usize,
        classes: usize,
        pooler: Option<(&Tensor, &Tensor)>,
        rng: &mut impl rand::Rng,
        device: &Device,
    ) -> Result<Self> {
        let normal = Normal::new(0.0, INIT_STD).expect("std is positive");
        let weight: Vec<f32> = (0..classes * hidden)
            .map(|_| rng.sample::<f64, _>(normal) as f32)
            .collect();
        Ok(Self {
            pooler: match pooler {
                Some((w, b)) => {
                    Some((Var::from_tensor(&w.copy()?)?, Var::from_tensor(&b.copy()?)?))
                }
                None => None,
            },
            weight: Var::from_tensor(&Tensor::from_vec(weight, (classes, hidden), device)?)?,
            bias: Var::zeros(classes, candle_core::DType::F32, device)?,
        })
    }

    /// Logits (B, C) from features (B, D).
    pub fn forward(&self, features: &Tensor) -> Result<Tensor> {
        let features = match &self.pooler {
            Some((w, b)) => features.matmul(&w.t()?)?.broadcast_add(b)?.tanh()?,
            None => features.clone(),
        };
        Ok(features
            .matmul(&self.weight.t()?)?
            .broadcast_add(&self.bias)?)
    }

    /// The mean cross-entropy of `features` (B, D) against `targets` (B), and its gradients with
    /// respect to the parameters, as `loss.backward()` gives them. Without a pooler the chain
    /// through z = x Wᵀ is taken by hand: autograd would also form ∂L/∂x, a (B, D) tensor of the
    /// fixed features that nothing reads, at every step (about a fifth of a head-mode phase-1
    /// step, whose B is every token of the batch). ∂L/∂W is autograd's own product, added to zeros as
    /// autograd adds it, so the step is the same to the bit.
    pub fn cross_entropy_gradients(
        &self,
        features: &Tensor,
        targets: &Tensor,
    ) -> Result<(Tensor, GradStore)> {
        if self.pooler.is_some() {
            let loss = candle_nn::loss::cross_entropy(&self.forward(features)?, targets)?;
            let grads = loss.backward()?;
            return Ok((loss, grads));
        }
        let weight = self.weight.as_tensor();
        let products = Var::from_tensor(&features.matmul(&weight.detach().t()?)?)?;
        let logits = products.as_tensor().broadcast_add(&self.bias)?;
        let loss = candle_nn::loss::cross_entropy(&logits, targets)?;
        let mut grads = loss.backward()?;
        let product_grads = grads
            .remove(products.as_tensor())
            .context("no gradient reached the logits")?;
        let weight_grads = features.t()?.matmul(&product_grads)?.t()?;
        grads.insert(weight, weight.zeros_like()?.add(&weight_grads)?);
        Ok((loss, grads))
    }

    /// The classifier as phase 2 reads it: its parameters at this moment, frozen, differentiated
    /// with respect to the features only.
    pub fn frozen(&self) -> Result<FrozenClassifier> {
        let dense = |w: &Var, b: &Var| -> Result<Arc<FrozenLinear>> {
            let linear = candle_nn::Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
            Ok(Arc::new(FrozenLinear::new(&linear, 1)?))
        };
        Ok(FrozenClassifier {
            pooler: self.pooler.as_ref().map(|(w, b)| dense(w, b)).transpose()?,
            classifier: dense(&self.weight, &self.bias)?,
        })
    }

    pub fn named(&self) -> Vec<(String, Var)> {
        let mut params = Vec::new();
        if let Some((w, b)) = &self.pooler {
            params.push(("pooler.weight".into(), w.clone()));
            params.push(("pooler.bias".into(), b.clone()));
        }
        params.push(("classifier.weight".into(), self.weight.clone()));
        params.push(("classifier.bias".into(), self.bias.clone()));
        params
    }
}

/// A [`Classifier`] frozen for phase 2 (the same function).
pub struct FrozenClassifier {
    pooler: Option<Arc<FrozenLinear>>,
    classifier: Arc<FrozenLinear>,
}

impl FrozenClassifier {
    /// The pooler, when there is one, and the classifier.
    pub fn parts(&self) -> (Option<&Arc<FrozenLinear>>, &Arc<FrozenLinear>) {
        (self.pooler.as_ref(), &self.classifier)
    }

    /// Logits (B, C) from features (B, D).
    pub fn forward(&self, features: &Tensor) -> Result<Tensor> {
        let features = match &self.pooler {
            Some(pooler) => pooler.forward(features)?.tanh()?,
            None => features.clone(),
        };
        Ok(self.classifier.forward(&features)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    /// The hand-taken chain gives autograd's loss and gradients to the bit, with and without a
    /// pooler.
    #[test]
    fn cross_entropy_gradients_are_autograds_to_the_bit() {
        let device = Device::Cpu;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let features = Tensor::randn(0f32, 1.0, (37, 24), &device).unwrap();
        let targets = Tensor::from_vec((0..37u32).map(|i| i % 5).collect(), 37, &device).unwrap();
        let pooler_w = Tensor::randn(0f32, 0.1, (24, 24), &device).unwrap();
        let pooler_b = Tensor::randn(0f32, 0.1, 24, &device).unwrap();
        for pooler in [None, Some((&pooler_w, &pooler_b))] {
            let classifier = Classifier::new(24, 5, pooler, &mut rng, &device).unwrap();
            // A bias away from zero, so that its path is tested too.
            classifier
                .bias
                .set(&Tensor::randn(0f32, 0.5, 5, &device).unwrap())
                .unwrap();
            let loss =
                candle_nn::loss::cross_entropy(&classifier.forward(&features).unwrap(), &targets)
                    .unwrap();
            let expected = loss.backward().unwrap();
            let (got_loss, got) = classifier
                .cross_entropy_gradients(&features, &targets)
                .unwrap();
            assert_eq!(bits(&got_loss), bits(&loss));
            for (name, var) in classifier.named() {
                assert_eq!(
                    bits(got.get(&var).unwrap()),
                    bits(expected.get(&var).unwrap()),
                    "{name}"
                );
            }
        }
    }
}
