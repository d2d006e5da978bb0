//! The paper's phase-2 model as the loops call it: the last layer with its query and key over the
//! fine-tune set held in memory and the test set held or streamed ([`TestRows`]), evaluated and
//! stepped. `finetune`, the benches and the tests share it, so all of them time and check the
//! route a run takes.

use anyhow::{Context, Result};
use candle_core::Tensor;

use super::look_ahead::EvaluatingStep;
use super::loops::{Set, autograd_step};
use crate::encoder::layer_rows::LayerRows;
use crate::model::last_layer::{HostRows, ResidentSet};
use crate::model::{LastLayer, QueryKey};

/// Test-set tokens held in memory, read and normed once, up to this size; past it the set streams,
/// and memory stays bounded whatever `--test-n` is (docs/performance.md, memory of a full-size
/// run: ViT-Ti over MNIST's 10 000 test images takes 1.5 GB and streams). Held: the partial
/// CIFAR-10's 1017 test images at ViT-Ti (154 MB), BreastMNIST's, TREC's. A scored epoch that
/// streams re-reads and re-norms the set: at ViT-Ti over the 1017 a scored epoch took 100 ms
/// streamed by the build before and 69 ms held (machine E, 2026-11-26; docs/performance.md).
pub const RESIDENT_TEST_BYTES: usize = 256 << 20;

/// The test set as the evaluations read it. Both give the same numbers, bit for bit
/// (tests/last_layer_equivalence.rs).
pub enum TestRows<'a> {
    /// Read from the feature cache and normed a chunk at a time, so that no set-sized buffer
    /// exists whatever the set's size.
    Streamed(&'a LayerRows),
    /// Read and normed once, into the host pass's form ([`LastLayer::host_rows`]).
    Resident(HostRows),
}

impl<'a> TestRows<'a> {
    /// Held in memory when the layer has a host pass and the tokens fit `budget` bytes,
    /// streamed otherwise.
    pub fn held_if_within(layer: &LastLayer, rows: &'a LayerRows, budget: usize) -> Result<Self> {
        let width = rows.lengths().iter().copied().max().unwrap_or(0);
        let bytes = rows.len() * width * rows.dim() * size_of::<f32>();
        if bytes <= budget
            && let Some(held) = layer.host_rows(rows)?
        {
            return Ok(Self::Resident(held));
        }
        Ok(Self::Streamed(rows))
    }
}

pub struct LastLayerSets<'a> {
    pub layer: &'a LastLayer<'a>,
    pub qk: &'a QueryKey,
    /// The fine-tune set, normed once ([`LastLayer::resident`]).
    pub finetune: &'a ResidentSet,
    pub test: TestRows<'a>,
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
            Set::Test => match &self.test {
                TestRows::Streamed(test) => self.layer.evaluate_rows(self.qk, test, rows)?,
                TestRows::Resident(test) => self.layer.evaluate_host_rows(self.qk, test, rows)?,
            },
        };
        Ok((out.logits, out.cls_attention))
    }

    /// A training step's loss and gradients on fine-tune samples `rows`: the host pass when the
    /// layer has one, else autograd through the differentiable resident forward.
    pub fn step(&self, rows: &[usize]) -> Result<(f64, Vec<Tensor>)> {
        let targets: Vec<u32> = rows.iter().map(|&i| self.labels[i]).collect();
        if let Some(step) = self.sample_pool.install(|| {
            self.layer
                .host_step(self.qk, self.finetune, rows, &targets, None)
        })? {
            return Ok((step.loss, step.gradients));
        }
        let forward = |_: Set, rows: &[usize]| {
            let out = self.layer.forward_resident(self.qk, self.finetune, rows)?;
            Ok((out.logits, out.cls_attention))
        };
        let vars = self.qk.named().into_iter().map(|(_, v)| v).collect();
        autograd_step(&forward, self.labels, vars)(rows)
    }

    /// [`Self::step`] through the host pass, with the rows also evaluated at `earlier`
    /// parameters (in [`QueryKey::named`]'s order): what [`Self::evaluate`] gives them, bit for
    /// bit, each sample's tokens read once for both ([`crate::train::look_ahead::LookAhead`]).
    /// An error when the layer has no host pass.
    pub fn step_evaluating(&self, rows: &[usize], earlier: &[Tensor]) -> Result<EvaluatingStep> {
        let targets: Vec<u32> = rows.iter().map(|&i| self.labels[i]).collect();
        let earlier = QueryKey::from_params(earlier)?;
        let step = self
            .sample_pool
            .install(|| {
                self.layer
                    .host_step(self.qk, self.finetune, rows, &targets, Some(&earlier))
            })?
            .context("a step that evaluates too needs the host pass")?;
        let evaluated = step
            .evaluated
            .context("the host pass returned no evaluation")?;
        Ok((
            step.loss,
            step.gradients,
            (evaluated.logits, evaluated.cls_attention),
        ))
    }
}
