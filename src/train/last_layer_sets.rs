//! The paper's phase-2 model as the loops call it: the last layer with its query and key over the
//! fine-tune set held in memory and the test set streamed, evaluated and stepped. `finetune`, the
//! benches and the tests share it, so all of them time and check the route a run takes.

use anyhow::Result;
use candle_core::Tensor;

use super::loops::{Set, autograd_step};
use crate::encoder::layer_rows::LayerRows;
use crate::model::last_layer::ResidentSet;
use crate::model::{LastLayer, QueryKey};

pub struct LastLayerSets<'a> {
    pub layer: &'a LastLayer<'a>,
    pub qk: &'a QueryKey,
    /// The fine-tune set, normed once ([`LastLayer::resident`]).
    pub finetune: &'a ResidentSet,
    pub test: &'a LayerRows,
    /// The fine-tune set's (noisy) labels, what a step trains on.
    pub labels: &'a [u32],
    /// Where the host pass's per-sample work runs ([`crate::train::run::FinetuneJob::sample_threads`]).
    pub sample_pool: &'a rayon::ThreadPool,
}

impl LastLayerSets<'_> {
    /// Logits and CLS attention of samples `rows` of `set`, detached (the host pass on the CPU).
    pub fn evaluate(&self, set: Set, rows: &[usize]) -> Result<(Tensor, Tensor)> {
        self.sample_pool.install(|| self.evaluate_here(set, rows))
    }

    fn evaluate_here(&self, set: Set, rows: &[usize]) -> Result<(Tensor, Tensor)> {
        let out = match set {
            Set::Finetune => self.layer.evaluate_resident(self.qk, self.finetune, rows)?,
            Set::Test => self.layer.evaluate_rows(self.qk, self.test, rows)?,
        };
        Ok((out.logits, out.cls_attention))
    }

    /// A training step's loss and gradients on fine-tune samples `rows`: the host pass when the
    /// layer has one, else autograd through the differentiable resident forward.
    pub fn step(&self, rows: &[usize]) -> Result<(f64, Vec<Tensor>)> {
        let targets: Vec<u32> = rows.iter().map(|&i| self.labels[i]).collect();
        if let Some(step) = self
            .sample_pool
            .install(|| self.layer.host_step(self.qk, self.finetune, rows, &targets))?
        {
            return Ok(step);
        }
        let forward = |_: Set, rows: &[usize]| {
            let out = self.layer.forward_resident(self.qk, self.finetune, rows)?;
            Ok((out.logits, out.cls_attention))
        };
        let vars = self.qk.named().into_iter().map(|(_, v)| v).collect();
        autograd_step(&forward, self.labels, vars)(rows)
    }
}
