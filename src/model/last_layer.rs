//! Phase 2 of the paper (docs/protocol.md §3): the last layer's query and key re-initialised and trained,
//! everything else frozen, evaluated from the cached hidden states entering that layer.
//!
//! Only the CLS / position-0 output reaches the classifier, and every part of the layer after the
//! attention is token-wise, so only the CLS query row matters. Per head h:
//!
//!   scores_h = (q₀ₕ · Kₕᵀ)/√dₕ  with  q₀ = x̂₀ W_Qᵀ + b_Q,  Kₕ = X̂ W_Kₕᵀ + b_Kₕ
//!            = ((q₀ₕ W_Kₕ) X̂ᵀ + q₀ₕ · b_Kₕ)/√dₕ
//!
//! so a step costs O(B(D² + H·T·D)) instead of the full layer's O(B·T·D²). Attention is linear in
//! the values, so the context is (Σₜ pₜ x̂ₜ) W_Vₕᵀ + b_Vₕ: phase 2 needs nothing per sample but
//! the layer inputs X (x̂ = LN(X) is recomputed per batch for ViT), and the attention over them is
//! `attend::KeyValues`. It is the same function as the full forward; `full_forward_logits`
//! computes that one for the equivalence test.

mod host;

pub use host::HostSpread;

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Result, bail, ensure};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::Module;
use rand::RngExt;

use super::attend::{KeyValues, row_indices};
use super::classifier::{Classifier, FrozenClassifier};
use crate::encoder::Model;
use crate::encoder::bert::BertLayer;
use crate::encoder::dense::FrozenLinear;
use crate::encoder::layer_rows::LayerRows;
use crate::encoder::layers::{Norm, SelfAttention, first_token};
use crate::encoder::vit::VitLayer;

/// The trainable query and key of the last layer.
pub struct QueryKey {
    pub wq: Var,
    pub bq: Var,
    pub wk: Var,
    pub bk: Var,
}

impl QueryKey {
    /// torch's `nn.Linear.reset_parameters`: weight kaiming_uniform(a = √5) = U(±1/√fan_in),
    /// bias U(±1/√fan_in), for the query then the key, from `rng`.
    pub fn reset(hidden: usize, rng: &mut impl rand::Rng, device: &Device) -> Result<Self> {
        let bound = 1.0 / (hidden as f32).sqrt();
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.random_range(-bound..bound)).collect()
        };
        let var = |values: Vec<f32>, shape: &[usize]| {
            Var::from_tensor(&Tensor::from_vec(values, shape, device)?)
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
        Ok(Self {
            wq: Var::from_tensor(attention.query.weight())?,
            bq: Var::from_tensor(&bias(&attention.query)?)?,
            wk: Var::from_tensor(attention.key.weight())?,
            bk: Var::from_tensor(&bias(&attention.key)?)?,
        })
    }

    /// The query and key as `params` hold them, in [`Self::named`]'s order: earlier values
    /// kept by the training loop.
    pub fn from_params(params: &[Tensor]) -> Result<Self> {
        let [wq, bq, wk, bk] = params else {
            bail!(
                "the query and key take 4 tensors (weights and biases), got {}",
                params.len()
            );
        };
        Ok(Self {
            wq: Var::from_tensor(wq)?,
            bq: Var::from_tensor(bq)?,
            wk: Var::from_tensor(wk)?,
            bk: Var::from_tensor(bk)?,
        })
    }

    pub fn named(&self) -> Vec<(String, Var)> {
        vec![
            ("query.weight".into(), self.wq.clone()),
            ("query.bias".into(), self.bq.clone()),
            ("key.weight".into(), self.wk.clone()),
            ("key.bias".into(), self.bk.clone()),
        ]
    }
}

/// What [`LastLayer::host_step`] gives: the batch's mean loss, its gradient for each of
/// [`QueryKey::named`] in that order, and the rows evaluated at the look-ahead's parameters
/// when it was given some.
pub struct HostStep {
    pub loss: f64,
    pub gradients: Vec<Tensor>,
    pub evaluated: Option<Output>,
}

/// A set held in memory as phase 2 reads it every step.
pub struct ResidentSet {
    /// The CLS row of the layer inputs X, (N, D): the residual stream.
    cls_inputs: Tensor,
    /// That row as the attention reads it, (N, D): the query's input.
    cls_normed: Tensor,
    /// Both on the host, (N, D) row-major, for the host pass.
    cls_inputs_host: Vec<f32>,
    cls_normed_host: Vec<f32>,
    /// The normed tokens of every sample.
    tokens: Arc<KeyValues>,
}

/// A set's layer inputs on the host as the host pass reads them, read and normed once
/// ([`LastLayer::host_rows`]).
pub struct HostRows {
    /// The CLS row of the layer inputs and that row normed, (N, D) each.
    cls_inputs: Vec<f32>,
    cls_normed: Vec<f32>,
    /// The normed tokens of every sample.
    tokens: KeyValues,
    dim: usize,
}

impl HostRows {
    /// Rows `which` of `all` (N, D).
    fn gather(&self, all: &[f32], which: &[usize]) -> Vec<f32> {
        let d = self.dim;
        which
            .iter()
            .flat_map(|&i| all[i * d..(i + 1) * d].iter().copied())
            .collect()
    }
}

/// The logits and the CLS attention (B, H, T) of a batch.
pub struct Output {
    pub logits: Tensor,
    pub cls_attention: Tensor,
}

pub struct LastLayer<'a> {
    model: &'a Model,
    classifier: &'a Classifier,
    /// The frozen parts a step differentiates through, in phase 2's form
    /// (`encoder::dense`): the value projection per head, the rest of the layer and the
    /// classifier.
    value: Arc<FrozenLinear>,
    rest: Rest,
    readout: FrozenClassifier,
    /// The same pass written out by hand (`host`), on the CPU.
    host: Option<host::HostLayer>,
    /// The last streamed batch's values, the next one's buffer ([`LayerRows::host_batch_then`]).
    streamed_buffer: Mutex<Vec<f32>>,
}

/// The last layer after its attention, and for ViT the final LayerNorm.
enum Rest {
    Vit(VitLayer, Norm),
    Bert(BertLayer),
}

/// The last layer's self-attention of either backbone.
fn last_attention(model: &Model) -> &SelfAttention {
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
            streamed_buffer: Mutex::new(Vec::new()),
        };
        layer.host = host::HostLayer::new(&layer)?;
        Ok(layer)
    }

    fn attention(&self) -> &SelfAttention {
        last_attention(self.model)
    }

    /// The layer's output at the CLS position through to the logits, given the attention context
    /// of the CLS query, (B, D).
    fn head(&self, x0: &Tensor, context: &Tensor) -> Result<Tensor> {
        let (x0, context) = (x0.unsqueeze(1)?, context.unsqueeze(1)?);
        let out0 = match &self.rest {
            Rest::Vit(layer, layernorm) => {
                layernorm.forward(&layer.after_attention(&x0, &context)?)?
            }
            Rest::Bert(layer) => layer.after_attention(&x0, &context)?,
        };
        self.readout.forward(&out0.squeeze(1)?)
    }

    /// What the attention reads: LN(X) for ViT (pre-LN), X for BERT.
    fn normed(&self, inputs: &Tensor) -> Result<Tensor> {
        Ok(match self.model {
            Model::Vit(v) => v.last_layer().layernorm_before.forward(inputs)?,
            Model::Bert(_) => inputs.clone(),
        })
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
    /// so that a step reads them in place.
    pub fn resident(&self, rows: &LayerRows, device: &Device) -> Result<ResidentSet> {
        let all: Vec<usize> = (0..rows.len()).collect();
        let width = rows.lengths().iter().copied().max().unwrap_or(0);
        let (mut cls_inputs, mut cls_normed, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
        for chunk in all.chunks(64) {
            let batch = rows.batch(chunk, device)?;
            let normed = self.normed(&batch.inputs)?;
            cls_inputs.push(first_token(&batch.inputs)?);
            cls_normed.push(first_token(&normed)?);
            // Every chunk padded to the set's longest sample (padding is never attended).
            let pad = width - normed.dim(1)?;
            tokens.push(normed.pad_with_zeros(1, 0, pad)?);
        }
        let (cls_inputs, cls_normed) = (
            Tensor::cat(&cls_inputs, 0)?.contiguous()?,
            Tensor::cat(&cls_normed, 0)?.contiguous()?,
        );
        Ok(ResidentSet {
            cls_inputs_host: cls_inputs.flatten_all()?.to_vec1()?,
            cls_normed_host: cls_normed.flatten_all()?.to_vec1()?,
            cls_inputs,
            cls_normed,
            tokens: Arc::new(KeyValues::new(
                &Tensor::cat(&tokens, 0)?,
                self.attention().num_heads,
                Some(rows.lengths()),
                self.scale(),
            )?),
        })
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

    /// Whether [`Self::host_step`] and the evaluations run the host pass (the CPU, GELU).
    pub fn has_host_pass(&self) -> bool {
        self.host.is_some()
    }

    /// How the host pass shares rows out over the threads, when the layer has one (chosen from
    /// the size of its frozen weights).
    pub fn host_spread(&self) -> Option<HostSpread> {
        self.host.as_ref().map(|host| host.spread)
    }

    /// Sets the host pass's spread (the tests run both; the numbers do not depend on it).
    pub fn set_host_spread(&mut self, spread: HostSpread) {
        if let Some(host) = &mut self.host {
            host.spread = spread;
        }
    }

    /// [`Self::forward_resident`] for evaluation: the same logits and attention, detached, from
    /// the host pass when the layer has one.
    pub fn evaluate_resident(
        &self,
        qk: &QueryKey,
        set: &ResidentSet,
        rows: &[usize],
    ) -> Result<Output> {
        let Some(host) = &self.host else {
            return detached(self.forward_resident(qk, set, rows)?);
        };
        self.host_output(host, qk, set.cls_rows(rows), &set.tokens, rows)
    }

    /// [`Self::forward`] for evaluation, on samples `which` of cached layer inputs: detached, and
    /// read straight into the host pass when the layer has one (the streamed test set: no tensor,
    /// no copy of its tokens).
    pub fn evaluate_rows(
        &self,
        qk: &QueryKey,
        rows: &LayerRows,
        which: &[usize],
    ) -> Result<Output> {
        let Some(host) = &self.host else {
            let batch = rows.batch(which, self.value_device())?;
            return detached(self.forward(qk, &batch.inputs, &batch.lengths)?);
        };
        let buffer = std::mem::take(
            &mut *self
                .streamed_buffer
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let set = self.host_rows_of(host, rows, which, buffer)?;
        let all: Vec<usize> = (0..which.len()).collect();
        let out = self.evaluate_host_rows(qk, &set, &all);
        *self
            .streamed_buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = set.tokens.into_host_values();
        out
    }

    /// Every sample of `rows` read and normed once for the host pass (the test set, when it fits
    /// in memory), or `None` when the layer has no host pass. Its evaluations
    /// ([`Self::evaluate_host_rows`]) give [`Self::evaluate_rows`]'s numbers bit for bit: the
    /// same reads and the same norm, row by row, and the host pass gives a row the same numbers
    /// whatever rows are beside it.
    pub fn host_rows(&self, rows: &LayerRows) -> Result<Option<HostRows>> {
        let Some(host) = self.host.as_ref().filter(|_| !rows.is_empty()) else {
            return Ok(None);
        };
        let all: Vec<usize> = (0..rows.len()).collect();
        Ok(Some(self.host_rows_of(host, rows, &all, Vec::new())?))
    }

    /// Samples `which` of `rows` in the form of the layer's host pass, written into `buffer`:
    /// each sample's CLS row kept, then its tokens normed, right after it is read.
    fn host_rows_of(
        &self,
        host: &host::HostLayer,
        rows: &LayerRows,
        which: &[usize],
        buffer: Vec<f32>,
    ) -> Result<HostRows> {
        let d = rows.dim();
        let (batch, cls_inputs) = rows.host_batch_then(which, buffer, |tokens| {
            let cls_input = tokens[..d].to_vec();
            host.normalise_sample(tokens);
            cls_input
        })?;
        let width = batch.width;
        let cls_normed = batch
            .values
            .chunks_exact(width * d)
            .flat_map(|sample| sample[..d].iter().copied())
            .collect();
        let tokens = KeyValues::from_host(
            batch.values,
            (which.len(), width, d),
            self.attention().num_heads,
            batch.lengths,
            self.scale(),
        )?;
        Ok(HostRows {
            cls_inputs: cls_inputs.concat(),
            cls_normed,
            tokens,
            dim: d,
        })
    }

    /// Logits and CLS attention of samples `which` of a [`HostRows`] set, detached.
    pub fn evaluate_host_rows(
        &self,
        qk: &QueryKey,
        set: &HostRows,
        which: &[usize],
    ) -> Result<Output> {
        let Some(host) = &self.host else {
            bail!("held rows are evaluated by the host pass, and this layer has none");
        };
        let held = set.cls_inputs.len() / set.dim.max(1);
        if let Some(&bad) = which.iter().find(|&&i| i >= held) {
            bail!("held rows: sample {bad} of {held}");
        }
        let cls_rows = (
            set.gather(&set.cls_inputs, which),
            set.gather(&set.cls_normed, which),
        );
        self.host_output(host, qk, cls_rows, &set.tokens, which)
    }

    /// The host pass's logits and CLS attention of samples `rows` of `tokens`, given their CLS
    /// rows (the layer inputs', and normed), detached.
    fn host_output(
        &self,
        host: &host::HostLayer,
        qk: &QueryKey,
        (inputs, normed): (Vec<f32>, Vec<f32>),
        tokens: &KeyValues,
        rows: &[usize],
    ) -> Result<Output> {
        let cls = host::ClsRows {
            inputs: &inputs,
            normed: &normed,
        };
        let (logits, probs) = qk.on_host(|qk| host.forward(qk, &cls, tokens, rows))?;
        self.output(logits, probs, rows.len(), tokens)
    }

    /// The mean cross-entropy of resident samples `rows` against `targets`, and its gradient for
    /// each of [`QueryKey::named`] in that order, from the host pass; `None` when the layer has
    /// none (then autograd through [`Self::forward_resident`] is the route). With `look_ahead`,
    /// the step also evaluates its rows at those parameters: the logits and attention
    /// [`Self::evaluate_resident`] gives them, bit for bit, with each sample's tokens read once
    /// for both.
    pub fn host_step(
        &self,
        qk: &QueryKey,
        set: &ResidentSet,
        rows: &[usize],
        targets: &[u32],
        look_ahead: Option<&QueryKey>,
    ) -> Result<Option<HostStep>> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        let (inputs, normed) = set.cls_rows(rows);
        let cls = host::ClsRows {
            inputs: &inputs,
            normed: &normed,
        };
        let tokens = &set.tokens;
        let grads = qk.on_host(|qk| match look_ahead {
            None => host.loss_and_gradients(qk, &cls, tokens, rows, targets, None),
            Some(ahead) => ahead.on_host(|ahead| {
                host.loss_and_gradients(qk, &cls, tokens, rows, targets, Some(ahead))
            })?,
        })??;
        let device = qk.wq.device();
        let d = grads.bq.len();
        let evaluated = match grads.evaluated {
            Some(e) => Some(self.output(e.logits, e.probs, rows.len(), tokens)?),
            None => None,
        };
        Ok(Some(HostStep {
            loss: f64::from(grads.loss),
            gradients: vec![
                Tensor::from_vec(grads.wq, (d, d), device)?,
                Tensor::from_vec(grads.bq, d, device)?,
                Tensor::from_vec(grads.wk, (d, d), device)?,
                Tensor::from_vec(grads.bk, d, device)?,
            ],
            evaluated,
        }))
    }

    /// The host pass's logits (B×C) and attention (B×H×T) as an [`Output`].
    fn output(
        &self,
        logits: Vec<f32>,
        probs: Vec<f32>,
        rows: usize,
        tokens: &KeyValues,
    ) -> Result<Output> {
        let (h, _, t) = tokens.geometry();
        let device = self.value_device();
        ensure!(
            logits.len().is_multiple_of(rows.max(1)),
            "host pass: logits do not split into {rows} rows"
        );
        let classes = logits.len() / rows.max(1);
        Ok(Output {
            logits: Tensor::from_vec(logits, (rows, classes), device)?,
            cls_attention: Tensor::from_vec(probs, (rows, h, t), device)?,
        })
    }

    fn value_device(&self) -> &Device {
        self.attention().value.weight().device()
    }

    fn scale(&self) -> f64 {
        1.0 / (self.attention().head_dim as f64).sqrt()
    }

    /// The CLS query of rows `rows` of `tokens`, given their CLS input x0 and its normed x̂0
    /// (B, D): attention, value projection, the rest of the layer and the classifier.
    fn attend(
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
        let values: Vec<f32> = contexts.flatten_all()?.to_vec1()?;
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
    /// The CLS inputs and normed rows of samples `rows`, gathered (B×D each).
    fn cls_rows(&self, rows: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let d = self.cls_inputs.dims()[1];
        let gather = |all: &[f32]| -> Vec<f32> {
            rows.iter()
                .flat_map(|&i| all[i * d..(i + 1) * d].iter().copied())
                .collect()
        };
        (gather(&self.cls_inputs_host), gather(&self.cls_normed_host))
    }
}

/// An output with its autograd history dropped.
fn detached(out: Output) -> Result<Output> {
    Ok(Output {
        logits: out.logits.detach(),
        cls_attention: out.cls_attention.detach(),
    })
}
