//! BERT in the Hugging Face `BertModel` layout (post-LayerNorm blocks, optional tanh pooler on
//! position 0), written out so that every hidden state and the last layer's weights are
//! reachable. The padding mask enters every attention as HF's additive mask.

use candle_core::{DType, Result, Tensor};
use candle_nn::{Activation, Embedding, LayerNorm, Linear, Module, VarBuilder};
use serde::Deserialize;

use super::layers::{Norm, SelfAttention, additive_mask, first_token};
use super::projections::{Dense, Then};

/// The fields of HF's `BertConfig` the forward needs; missing keys take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub pad_token_id: u32,
    pub position_embedding_type: String,
}

impl Default for BertConfig {
    fn default() -> Self {
        Self {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: Activation::Gelu,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            pad_token_id: 0,
            position_embedding_type: "absolute".into(),
        }
    }
}

impl BertConfig {
    /// Rejects values the forward cannot run with (sizes of 0, heads that do not divide the
    /// width, relative positions), naming the config.json field.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if value == 0 {
                return Err(format!("{field} is 0, expected at least 1"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return Err(format!(
                "layer_norm_eps is {}, expected a finite number ≥ 0",
                self.layer_norm_eps
            ));
        }
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        Ok(())
    }
}

struct BertEmbeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    layer_norm: LayerNorm,
}

impl BertEmbeddings {
    fn load(vb: VarBuilder, c: &BertConfig) -> Result<Self> {
        Ok(Self {
            word: candle_nn::embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            position: candle_nn::embedding(
                c.max_position_embeddings,
                c.hidden_size,
                vb.pp("position_embeddings"),
            )?,
            token_type: candle_nn::embedding(
                c.type_vocab_size,
                c.hidden_size,
                vb.pp("token_type_embeddings"),
            )?,
            layer_norm: super::layers::layer_norm(
                c.hidden_size,
                c.layer_norm_eps,
                vb.pp("LayerNorm"),
            )?,
        })
    }

    fn forward(&self, input_ids: &Tensor, token_type_ids: &Tensor) -> Result<Tensor> {
        let (_, t) = input_ids.dims2()?;
        let positions = Tensor::arange(0u32, t as u32, input_ids.device())?;
        let xs = (self.word.forward(input_ids)? + self.token_type.forward(token_type_ids)?)?
            .broadcast_add(&self.position.forward(&positions)?)?;
        self.layer_norm.forward(&xs)
    }
}

/// One post-LN block: a = LN₁(x + W_o·Attn(x)); out = LN₂(a + MLP(a)).
#[derive(Clone, Debug)]
pub struct BertLayer {
    pub attention: SelfAttention,
    /// `attention.output.dense`.
    pub attention_output: Dense,
    /// `attention.output.LayerNorm`.
    pub attention_norm: Norm,
    pub intermediate: Dense,
    pub output: Dense,
    /// `output.LayerNorm`.
    pub output_norm: Norm,
    pub activation: Activation,
}

impl BertLayer {
    fn load(vb: VarBuilder, c: &BertConfig) -> Result<Self> {
        let ln = |name: &str| Norm::load(c.hidden_size, c.layer_norm_eps, vb.pp(name));
        Ok(Self {
            attention: SelfAttention::load(
                vb.pp("attention.self"),
                c.hidden_size,
                c.num_attention_heads,
                true,
            )?,
            attention_output: Dense::new(candle_nn::linear(
                c.hidden_size,
                c.hidden_size,
                vb.pp("attention.output.dense"),
            )?),
            attention_norm: ln("attention.output.LayerNorm")?,
            intermediate: Dense::new(candle_nn::linear(
                c.hidden_size,
                c.intermediate_size,
                vb.pp("intermediate.dense"),
            )?),
            output: Dense::new(candle_nn::linear(
                c.intermediate_size,
                c.hidden_size,
                vb.pp("output.dense"),
            )?),
            output_norm: ln("output.LayerNorm")?,
            activation: c.hidden_act,
        })
    }

    /// This block with its extraction products in `precision`.
    pub fn in_precision(&self, precision: crate::kernels::Precision) -> Self {
        Self {
            attention: self.attention.in_precision(precision),
            attention_output: self.attention_output.in_precision(precision),
            intermediate: self.intermediate.in_precision(precision),
            output: self.output.in_precision(precision),
            ..self.clone()
        }
    }

    /// This block with its dense layers in phase 2's form ([`Dense::frozen`]).
    pub fn frozen(&self) -> anyhow::Result<Self> {
        Ok(Self {
            attention_output: self.attention_output.frozen()?,
            intermediate: self.intermediate.frozen()?,
            output: self.output.frozen()?,
            ..self.clone()
        })
    }

    /// The block after attention, given the attention context (shared with the phase-2 layer).
    pub fn after_attention(&self, xs: &Tensor, context: &Tensor) -> Result<Tensor> {
        let attended = self.attention_norm.forward(
            &self
                .attention_output
                .forward_then(context, Then::AddTo(xs))?,
        )?;
        let mlp = self
            .intermediate
            .forward_then(&attended, Then::Activate(self.activation))?;
        self.output_norm
            .forward(&self.output.forward_then(&mlp, Then::AddTo(&attended))?)
    }

    pub fn forward(&self, xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let context = self.attention.forward(xs, Some(mask))?;
        self.after_attention(xs, &context)
    }
}

pub struct Bert {
    pub config: BertConfig,
    embeddings: BertEmbeddings,
    pub layers: Vec<BertLayer>,
    /// `pooler.dense`; absent in checkpoints saved without a pooler.
    pub pooler: Option<Linear>,
}

/// Token ids, token types and the padding mask of a batch, all (B, T) u32.
pub struct TextBatch {
    pub input_ids: Tensor,
    pub token_type_ids: Tensor,
    pub attention_mask: Tensor,
}

impl Bert {
    /// Loads `BertModel` tensors, with or without the `bert.` prefix of task checkpoints.
    pub fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        config.check().map_err(candle_core::Error::msg)?;
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| BertLayer::load(vb.pp(format!("encoder.layer.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        let pooler = if vb.contains_tensor("pooler.dense.weight") {
            Some(candle_nn::linear(
                config.hidden_size,
                config.hidden_size,
                vb.pp("pooler.dense"),
            )?)
        } else {
            None
        };
        Ok(Self {
            config: config.clone(),
            embeddings: BertEmbeddings::load(vb.pp("embeddings"), config)?,
            layers,
            pooler,
        })
    }

    /// HF's `hidden_states`: the embeddings, then each layer's output.
    pub fn hidden_states(&self, batch: &TextBatch) -> Result<Vec<Tensor>> {
        let mask = additive_mask(&batch.attention_mask)?;
        let mut states = vec![
            self.embeddings
                .forward(&batch.input_ids, &batch.token_type_ids)?,
        ];
        for layer in &self.layers {
            let next = layer.forward(states.last().expect("starts non-empty"), &mask)?;
            states.push(next);
        }
        Ok(states)
    }

    /// The hidden states entering the last layer, (B, T, D).
    pub fn last_layer_input(&self, batch: &TextBatch) -> Result<Tensor> {
        let mask = additive_mask(&batch.attention_mask)?;
        let rest = &self.layers[..self.layers.len() - 1];
        rest.iter().try_fold(
            self.embeddings
                .forward(&batch.input_ids, &batch.token_type_ids)?,
            |xs, layer| layer.forward(&xs, &mask),
        )
    }

    pub fn last_layer(&self) -> &BertLayer {
        self.layers.last().expect("a BERT has layers")
    }

    /// The final tokens from the last layer's input and the padding mask (B, T).
    pub fn finish(&self, layer_input: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        self.last_layer()
            .forward(layer_input, &additive_mask(attention_mask)?)
    }

    /// tanh(W·h₀ + b) on position 0, or `None` without a pooler.
    pub fn pooled(&self, final_tokens: &Tensor) -> Result<Option<Tensor>> {
        match &self.pooler {
            Some(dense) => Ok(Some(dense.forward(&first_token(final_tokens)?)?.tanh()?)),
            None => Ok(None),
        }
    }
}

/// (B, T) token ids as u32, from i64 fixtures or tokenizer output.
pub fn ids_tensor(ids: &[Vec<u32>], device: &candle_core::Device) -> Result<Tensor> {
    let (b, t) = (ids.len(), ids.first().map_or(0, Vec::len));
    Tensor::from_iter(ids.iter().flatten().copied(), device)?
        .reshape((b, t))?
        .to_dtype(DType::U32)
}
