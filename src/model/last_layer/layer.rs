//! The last layer of phase 2: the frozen layer around a trained query and key, its CLS pass through candle and its evaluation.

use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::Module;
use rand::RngExt;

use super::super::attend::{KeyValues, row_indices};
use super::super::classifier::{Classifier, FrozenClassifier};
use crate::encoder::Model;
use crate::encoder::bert::BertLayer;
use crate::encoder::layer_rows::LayerRows;
use crate::encoder::layers::{Norm, SelfAttention, first_token};
use crate::encoder::projections::FrozenLinear;
use crate::encoder::vit::VitLayer;

/// The trainable query and key of the last layer: variables of their own
/// ([`QueryKey::reset`]), or one run's views of a stack's ([`QueryKey::of_run`]), through which
/// autograd reaches the stacked variables.
pub struct QueryKey {
    pub wq: Tensor,
    pub bq: Tensor,
    pub wk: Tensor,
    pub bk: Tensor,
}

impl QueryKey {
    /// torch's `nn.Linear.reset_parameters`: weight kaiming_uniform(a = √5) = U(±1/√fan_in),
    /// bias U(±1/√fan_in), for the query then the key, from `rng`.
    pub fn reset(hidden: usize, rng: &mut impl rand::Rng, device: &Device) -> Result<Self> {
        let bound = 1.0 / (hidden as f32).sqrt();
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.random_range(-bound..bound)).collect()
        };
        let var = |values: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
            Ok(Var::from_tensor(&Tensor::from_vec(values, shape, device)?)?
                .as_tensor()
                .clone())
        };
        let (wq, bq) = (draw(hidden * hidden), draw(hidden));
        let (wk, bk) = (draw(hidden * hidden), draw(hidden));
        Ok(Self {
            wq: var(wq, &[hidden, hidden])?,
            bq: var(bq, &[hidden])?,
            wk: var(wk, &[hidden, hidden])?,
            bk: var(bk, &[hidden])?,
        })
    }

    /// The query and key of a pretrained layer (no re-initialisation).
    pub fn from_layer(attention: &SelfAttention) -> Result<Self> {
        let bias = |l: &candle_nn::Linear| -> Result<Tensor> {
            match l.bias() {
                Some(b) => Ok(b.clone()),
                None => Ok(Tensor::zeros(
                    l.weight().dim(0)?,
                    DType::F32,
                    l.weight().device(),
                )?),
            }
        };
        let var = |t: &Tensor| -> Result<Tensor> { Ok(Var::from_tensor(t)?.as_tensor().clone()) };
        Ok(Self {
            wq: var(attention.query.weight())?,
            bq: var(&bias(&attention.query)?)?,
            wk: var(attention.key.weight())?,
            bk: var(&bias(&attention.key)?)?,
        })
    }

    /// The query and key as `params` hold them, in [`Self::named`]'s order.
    pub fn from_params(params: &[Tensor]) -> Result<Self> {
        let [wq, bq, wk, bk] = params else {
            bail!(
                "the query and key take 4 tensors (weights and biases), got {}",
                params.len()
            );
        };
        Ok(Self {
            wq: wq.clone(),
            bq: bq.clone(),
            wk: wk.clone(),
            bk: bk.clone(),
        })
    }

    /// Run `run`'s query and key among `stacked` ([`Self::named`]'s order, each with a leading
    /// run axis): views, so that a loss on them differentiates the stacked tensors.
    pub fn of_run(stacked: &[Tensor], run: usize) -> Result<Self> {
        let views = stacked
            .iter()
            .map(|t| t.get(run))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Self::from_params(&views)
    }

    /// The four tensors in [`Self::named`]'s order.
    pub fn tensors(&self) -> [Tensor; 4] {
        [
            self.wq.clone(),
            self.bq.clone(),
            self.wk.clone(),
            self.bk.clone(),
        ]
    }

    /// The parameters by name, as variables sharing their storage (a tensor that is not one
    /// already is copied into a new variable).
    pub fn named(&self) -> Result<Vec<(String, Var)>> {
        let var = Var::from_tensor;
        Ok(vec![
            ("query.weight".into(), var(&self.wq)?),
            ("query.bias".into(), var(&self.bq)?),
            ("key.weight".into(), var(&self.wk)?),
            ("key.bias".into(), var(&self.bk)?),
        ])
    }
}

/// A set held in memory as phase 2 reads it every step.
pub struct ResidentSet {
    /// The CLS row of the layer inputs X, (N, D): the residual stream.
    pub(super) cls_inputs: Tensor,
    /// That row as the attention reads it, (N, D): the query's input.
    pub(super) cls_normed: Tensor,
    /// Both on the host, (N, D) row-major, for the host pass.
    pub(super) cls_inputs_host: Vec<f32>,
    pub(super) cls_normed_host: Vec<f32>,
    /// The normed tokens of every sample.
    pub(super) tokens: Arc<KeyValues>,
}

/// The logits and the CLS attention (B, H, T) of a batch.
pub struct Output {
    pub logits: Tensor,
    pub cls_attention: Tensor,
}

pub struct LastLayer<'a> {
    pub(super) model: &'a Model,
    pub(super) classifier: &'a Classifier,
    /// The frozen parts a step differentiates through, in phase 2's form
    /// (`encoder::projections`): the value projection per head, the rest of the layer and the
    /// classifier.
    pub(super) value: Arc<FrozenLinear>,
    pub(super) rest: Rest,
    pub(super) readout: FrozenClassifier,
    /// The same pass written out by hand (`host`), on the CPU: the frozen layer, shared by the
    /// layers of one stack ([`Self::with_classifier`]), and this layer's classifier.
    pub(super) host: Option<Arc<super::host::HostLayer>>,
    pub(super) host_readout: Option<super::host::HostReadout>,
    /// The last streamed batch's values, the next one's buffer ([`LayerRows::host_batch_then`]).
    pub(super) streamed_buffer: Mutex<Vec<f32>>,
}

/// The last layer after its attention, and for ViT the final LayerNorm.
#[derive(Clone)]
pub(super) enum Rest {
    Vit(VitLayer, Norm),
    Bert(BertLayer),
}

/// The last layer's self-attention of either backbone.
pub(super) fn last_attention(model: &Model) -> &SelfAttention {
    match model {
        Model::Vit(v) => &v.last_layer().attention,
        Model::Bert(b) => &b.last_layer().attention,
    }
}

impl<'a> LastLayer<'a> {
    /// Phase 2 on `model`'s last layer read out through `classifier`, both frozen as they are now.
    pub fn new(model: &'a Model, classifier: &'a Classifier) -> Result<Self> {
        let rest = match model {
            Model::Vit(v) => Rest::Vit(v.last_layer().frozen()?, v.layernorm.clone()),
            Model::Bert(b) => Rest::Bert(b.last_layer().frozen()?),
        };
        let attention = last_attention(model);
        let mut layer = Self {
            model,
            classifier,
            value: Arc::new(FrozenLinear::new(&attention.value, attention.num_heads)?),
            rest,
            readout: classifier.frozen()?,
            host: None,
            host_readout: None,
            streamed_buffer: Mutex::new(Vec::new()),
        };
        layer.host = super::host::HostLayer::new(&layer)?.map(Arc::new);
        layer.host_readout = layer
            .host
            .as_ref()
            .map(|_| super::host::HostReadout::new(&layer.readout));
        Ok(layer)
    }

    /// The same frozen layer read out through another run's `classifier`: the frozen weights are
    /// shared, not copied, so a stack's runs read one copy of them.
    pub fn with_classifier(&self, classifier: &'a Classifier) -> Result<Self> {
        let readout = classifier.frozen()?;
        Ok(Self {
            model: self.model,
            classifier,
            value: Arc::clone(&self.value),
            rest: self.rest.clone(),
            host_readout: self
                .host
                .as_ref()
                .map(|_| super::host::HostReadout::new(&readout)),
            readout,
            host: self.host.clone(),
            streamed_buffer: Mutex::new(Vec::new()),
        })
    }

    /// The same layer without its host pass: every step and evaluation through candle's generic
    /// ops on the layer's device, the CPU's included (phase 2's device-resident route).
    pub fn without_host_pass(mut self) -> Self {
        self.host = None;
        self.host_readout = None;
        self
    }

    pub(super) fn attention(&self) -> &SelfAttention {
        last_attention(self.model)
    }

    /// The layer's output at the CLS position through to the logits, given the attention context
    /// of the CLS query, (B, D).
    pub(super) fn head(&self, x0: &Tensor, context: &Tensor) -> Result<Tensor> {
        self.readout.forward(&self.cls_output(x0, context)?)
    }

    /// The layer's (and for ViT the final LayerNorm's) output at the CLS position, (B, D), given
    /// its input x0 and the attention context of the CLS query: the frozen part every run shares.
    pub(super) fn cls_output(&self, x0: &Tensor, context: &Tensor) -> Result<Tensor> {
        let (x0, context) = (x0.unsqueeze(1)?, context.unsqueeze(1)?);
        let out0 = match &self.rest {
            Rest::Vit(layer, layernorm) => {
                layernorm.forward(&layer.after_attention(&x0, &context)?)?
            }
            Rest::Bert(layer) => layer.after_attention(&x0, &context)?,
        };
        Ok(out0.squeeze(1)?)
    }

    /// What the attention reads: LN(X) for ViT (pre-LN), X for BERT.
    pub(super) fn normed(&self, inputs: &Tensor) -> Result<Tensor> {
        attention_inputs(self.model, inputs)
    }

    /// The cheap path: CLS query row only, on a batch of layer inputs (B, L, D) whose samples
    /// have `lengths` unpadded tokens (the streamed test set).
    pub fn forward(&self, qk: &QueryKey, inputs: &Tensor, lengths: &[usize]) -> Result<Output> {
        let normed = self.normed(inputs)?;
        let tokens = Arc::new(KeyValues::new(
            &normed,
            self.attention().num_heads,
            Some(lengths),
            self.scale(),
        )?);
        let rows: Vec<usize> = (0..lengths.len()).collect();
        self.attend(
            qk,
            &first_token(inputs)?,
            &first_token(&normed)?,
            &tokens,
            &rows,
        )
    }

    /// The normed tokens and CLS rows of a set held in memory (the fine-tune set), derived once
    /// so that a step reads them in place: in host memory for the host pass and the fused
    /// attention (on the CPU), as tensors elsewhere.
    pub fn resident(&self, rows: &LayerRows, device: &Device) -> Result<ResidentSet> {
        Ok(self.held(&[rows], device, false)?.0)
    }

    /// The sets `sets` held as one on the layer's device, for the device-resident route: their
    /// CLS rows and normed tokens (padded to the longest sample of any) one after another, kept as
    /// tensors (nothing on the host, on the CPU too), with where each set's first sample is.
    pub fn resident_stack(
        &self,
        sets: &[&LayerRows],
        device: &Device,
    ) -> Result<(ResidentSet, Vec<usize>)> {
        self.held(sets, device, true)
    }

    /// [`Self::resident`] and [`Self::resident_stack`]: the sets one after another, `kept` as
    /// tensors or also read into host memory.
    pub(super) fn held(
        &self,
        sets: &[&LayerRows],
        device: &Device,
        kept: bool,
    ) -> Result<(ResidentSet, Vec<usize>)> {
        let width = sets
            .iter()
            .flat_map(|rows| rows.lengths().iter().copied())
            .max()
            .unwrap_or(0);
        let mut parts = SetParts::default();
        let (mut lengths, mut offsets) = (Vec::new(), Vec::with_capacity(sets.len()));
        for rows in sets {
            offsets.push(lengths.len());
            lengths.extend_from_slice(rows.lengths());
            parts.add(self, rows, width, device)?;
        }
        ensure!(!parts.tokens.is_empty(), "a set of no samples");
        let cls_inputs = Tensor::cat(&parts.cls_inputs, 0)?.contiguous()?;
        let cls_normed = Tensor::cat(&parts.cls_normed, 0)?.contiguous()?;
        let tokens = Tensor::cat(&parts.tokens, 0)?;
        let (heads, scale) = (self.attention().num_heads, self.scale());
        let set = if kept {
            ResidentSet {
                cls_inputs_host: Vec::new(),
                cls_normed_host: Vec::new(),
                tokens: Arc::new(KeyValues::kept(&tokens, heads, Some(&lengths), scale)?),
                cls_inputs,
                cls_normed,
            }
        } else {
            ResidentSet {
                cls_inputs_host: crate::kernels::host_reads::flat(&cls_inputs)?,
                cls_normed_host: crate::kernels::host_reads::flat(&cls_normed)?,
                tokens: Arc::new(KeyValues::new(&tokens, heads, Some(&lengths), scale)?),
                cls_inputs,
                cls_normed,
            }
        };
        Ok((set, offsets))
    }

    /// Every run's logits on its rows of `set` (run r, reading through `layers[r]`, on rows
    /// `rows[r]`, all of one size B), the runs' query and key stacked along a leading run axis in
    /// `params` ([`QueryKey::named`]'s order): the query and key products of all runs as batched
    /// products over the run axis, one attention over all R·B rows, the frozen rest of the layer
    /// once; only the readout is each run's own (its phase-1 classifier).
    pub fn forward_stack(
        layers: &[&LastLayer],
        params: &[Tensor],
        set: &ResidentSet,
        rows: &[&[usize]],
    ) -> Result<Vec<Tensor>> {
        let first = layers.first().context("a stack of no runs")?;
        let (runs, b) = (layers.len(), rows.first().map_or(0, |r| r.len()));
        ensure!(
            rows.len() == runs && rows.iter().all(|r| r.len() == b),
            "a batched step takes one batch of one size per run"
        );
        let attention = first.attention();
        let (h, dh) = (attention.num_heads, attention.head_dim);
        let qk = QueryKey::from_params(params)?;
        let d = qk.wq.dim(D::Minus1)?;
        let all: Vec<usize> = rows.concat();
        let index = row_indices(&all, set.cls_inputs.device())?;
        let x0 = set.cls_inputs.index_select(&index, 0)?; // (R·B, D)
        let x0_hat = set
            .cls_normed
            .index_select(&index, 0)?
            .reshape((runs, b, d))?;
        let q0 = x0_hat
            .matmul(&qk.wq.transpose(1, 2)?)?
            .broadcast_add(&qk.bq.unsqueeze(1)?)?
            .reshape((runs, b, h, dh))?;
        // r_h = q₀ₕ W_Kₕ: (R, H, B, d_h) × (R, H, d_h, D) → (R, B, H, D).
        let wk = qk.wk.reshape((runs, h, dh, d))?;
        let r = q0
            .transpose(1, 2)?
            .contiguous()?
            .matmul(&wk)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((runs * b, h, d))?;
        // The key's bias adds q₀ₕ·b_Kₕ to every score of a head alike and drops out of the
        // softmax, as in the host pass: left out, its gradient is exactly 0, not rounding noise
        // that AdamW would scale up to steps of the learning rate's size.
        let no_bias = Tensor::zeros((runs * b, h), r.dtype(), r.device())?;
        let attended = set.tokens.attend(&r, &no_bias, &all)?;
        let out0 = first.cls_output(&x0, &first.value.forward(&attended.pooled)?)?;
        layers
            .iter()
            .enumerate()
            .map(|(k, layer)| layer.readout.forward(&out0.narrow(0, k * b, b)?))
            .collect()
    }

    /// The cheap path on samples `rows` of a resident set.
    pub fn forward_resident(
        &self,
        qk: &QueryKey,
        set: &ResidentSet,
        rows: &[usize],
    ) -> Result<Output> {
        let index = row_indices(rows, set.cls_inputs.device())?;
        self.attend(
            qk,
            &set.cls_inputs.index_select(&index, 0)?,
            &set.cls_normed.index_select(&index, 0)?,
            &set.tokens,
            rows,
        )
    }

    pub(super) fn value_device(&self) -> &Device {
        self.attention().value.weight().device()
    }

    pub(super) fn scale(&self) -> f64 {
        1.0 / (self.attention().head_dim as f64).sqrt()
    }

    /// The CLS query of rows `rows` of `tokens`, given their CLS input x0 and its normed x̂0
    /// (B, D): attention, value projection, the rest of the layer and the classifier.
    pub(super) fn attend(
        &self,
        qk: &QueryKey,
        x0: &Tensor,
        x0_hat: &Tensor,
        tokens: &Arc<KeyValues>,
        rows: &[usize],
    ) -> Result<Output> {
        let attention = self.attention();
        let (h, dh) = (attention.num_heads, attention.head_dim);
        let (b, d) = x0_hat.dims2()?;
        let q0 = x0_hat
            .matmul(&qk.wq.t()?)?
            .broadcast_add(&qk.bq)?
            .reshape((b, h, dh))?; // (B, H, d_h)
        // r_h = q₀ₕ W_Kₕ for every head at once: (H, B, d_h) × (H, d_h, D) → (B, H, D).
        let wk = qk.wk.reshape((h, dh, d))?;
        let r = q0
            .transpose(0, 1)?
            .contiguous()?
            .matmul(&wk)?
            .transpose(0, 1)?
            .contiguous()?;
        let key_bias = q0
            .broadcast_mul(&qk.bk.reshape((1, h, dh))?)?
            .sum(D::Minus1)?; // (B, H)
        let attended = tokens.attend(&r, &key_bias, rows)?;
        // context_h = pooled_h W_Vₕᵀ + b_Vₕ: (B, H, D) → (B, H·d_h), head h by its rows of W_V.
        let context = self.value.forward(&attended.pooled)?;
        Ok(Output {
            logits: self.head(x0, &context)?,
            cls_attention: attended.probs,
        })
    }

    /// The attention output of every token, (N, T, D) before the output projection, with this
    /// query/key: what the rank-collapse diagnostic reads and the full forward continues from.
    pub fn token_contexts(
        &self,
        qk: &QueryKey,
        inputs: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let attention = self.attention();
        let normed = match self.model {
            Model::Vit(v) => v.last_layer().layernorm_before.forward(inputs)?,
            Model::Bert(_) => inputs.clone(),
        };
        let q = attention.split_heads(
            &normed
                .broadcast_matmul(&qk.wq.t()?)?
                .broadcast_add(&qk.bq)?,
        )?;
        let k = attention.split_heads(
            &normed
                .broadcast_matmul(&qk.wk.t()?)?
                .broadcast_add(&qk.bk)?,
        )?;
        let v = attention.split_heads(&attention.value.forward(&normed)?)?;
        let scores = (q.matmul(&k.t()?)? / (attention.head_dim as f64).sqrt())?;
        let scores = match attention_mask {
            Some(m) => scores.broadcast_add(&crate::kernels::additive_mask(m)?)?,
            None => scores,
        };
        Ok(SelfAttention::merge_heads(
            &candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(&v)?,
        )?)
    }

    /// Mean over samples of the rank-collapse residual ‖Y − 1ȳᵀ‖_F / ‖Y‖_F of the attention
    /// output Y of every (unpadded) token (`diagnostics::rank_collapse_residual`).
    pub fn rank_collapse(
        &self,
        qk: &QueryKey,
        inputs: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<f64> {
        let contexts = self.token_contexts(qk, inputs, attention_mask)?;
        let (n, t, d) = contexts.dims3()?;
        let lengths = match attention_mask {
            Some(m) => crate::kernels::unpadded_lengths(m)?,
            None => vec![t; n],
        };
        let values: Vec<f32> = crate::kernels::host_reads::flat(&contexts)?;
        let total: f64 = values
            .chunks_exact(t * d)
            .zip(&lengths)
            // The trailing padding is cut (HF pads text on the right).
            .map(|(y, &len)| crate::diagnostics::rank_collapse_residual(&y[..len * d], len, d))
            .sum();
        Ok(total / n.max(1) as f64)
    }

    /// The reference: the whole last layer with this query/key on every token, as a full
    /// forward through the model computes it, then the CLS output. For equivalence tests.
    pub fn full_forward_logits(
        &self,
        qk: &QueryKey,
        inputs: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let context = self.token_contexts(qk, inputs, attention_mask)?;
        let tokens = match self.model {
            Model::Vit(vit) => vit
                .layernorm
                .forward(&vit.last_layer().after_attention(inputs, &context)?)?,
            Model::Bert(bert) => bert.last_layer().after_attention(inputs, &context)?,
        };
        self.classifier.forward(&first_token(&tokens)?)
    }
}

impl ResidentSet {
    /// Samples in the set.
    pub fn len(&self) -> usize {
        self.cls_inputs.dims()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A set's CLS rows, normed CLS rows and normed tokens, a chunk of samples at a time.
#[derive(Default)]
pub(super) struct SetParts {
    pub(super) cls_inputs: Vec<Tensor>,
    pub(super) cls_normed: Vec<Tensor>,
    pub(super) tokens: Vec<Tensor>,
}

impl SetParts {
    /// The chunks of `rows`, through `layer`'s norm, their tokens padded to `width` (padding is
    /// never attended).
    pub(super) fn add(
        &mut self,
        layer: &LastLayer,
        rows: &LayerRows,
        width: usize,
        device: &Device,
    ) -> Result<()> {
        let all: Vec<usize> = (0..rows.len()).collect();
        for chunk in all.chunks(64) {
            let batch = rows.batch(chunk, device)?;
            let normed = layer.normed(&batch.inputs)?;
            self.cls_inputs.push(first_token(&batch.inputs)?);
            self.cls_normed.push(first_token(&normed)?);
            let pad = width - normed.dim(1)?;
            self.tokens.push(normed.pad_with_zeros(1, 0, pad)?);
        }
        Ok(())
    }
}

/// An output with its autograd history dropped.
pub(super) fn detached(out: Output) -> Result<Output> {
    Ok(Output {
        logits: out.logits.detach(),
        cls_attention: out.cls_attention.detach(),
    })
}

/// The tokens the last layer's attention selects from, given the layer's inputs (B, L, D): LN(X)
/// for ViT (pre-LN), X itself for BERT (post-LN: its inputs are already normed).
pub fn attention_inputs(model: &Model, inputs: &Tensor) -> Result<Tensor> {
    Ok(match model {
        Model::Vit(v) => v.last_layer().layernorm_before.forward(inputs)?,
        Model::Bert(_) => inputs.clone(),
    })
}
