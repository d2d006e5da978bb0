//! The classification head of phase 1 (docs/protocol.md §3): ViT's `classifier` on the final-LayerNorm CLS
//! token; BERT's `pooler` (tanh, initialised from the checkpoint) and `classifier` on position 0,
//! or the classifier alone when the checkpoint has no pooler. Initialised as HF does: weights
//! N(0, 0.02²), biases 0.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{Device, Tensor, Var};

use crate::encoder::dense::FrozenLinear;
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
