//! ViT in the Hugging Face `ViTModel` layout (pre-LayerNorm blocks, final LayerNorm, CLS token at
//! position 0). The patch/CLS/position embeddings are candle-transformers' `vit::Embeddings`; the
//! layers are written out here so that every hidden state and the last layer's weights are
//! reachable.

use candle_core::{Result, Tensor};
use candle_nn::{Activation, Module, VarBuilder};
use candle_transformers::models::vit as ct_vit;
use serde::Deserialize;

use super::layers::{Norm, SelfAttention, first_token};
use super::projections::{Dense, Then};

/// The fields of HF's `ViTConfig` the forward needs; missing keys take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct VitConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    pub qkv_bias: bool,
}

impl Default for VitConfig {
    fn default() -> Self {
        Self {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            hidden_act: Activation::Gelu,
            layer_norm_eps: 1e-12,
            image_size: 224,
            patch_size: 16,
            num_channels: 3,
            qkv_bias: true,
        }
    }
}

impl VitConfig {
    /// Rejects values the forward cannot run with (sizes of 0, heads that do not divide the
    /// width, an image that is not a whole number of patches), naming the config.json field.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("image_size", self.image_size),
            ("patch_size", self.patch_size),
        ] {
            if value == 0 {
                return Err(format!("{field} is 0, expected at least 1"));
            }
        }
        if self.num_channels != 3 {
            return Err(format!(
                "num_channels is {}, expected 3 (images reach the model as RGB)",
                self.num_channels
            ));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(format!(
                "image_size {} is not a multiple of patch_size {}",
                self.image_size, self.patch_size
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return Err(format!(
                "layer_norm_eps is {}, expected a finite number ≥ 0",
                self.layer_norm_eps
            ));
        }
        Ok(())
    }

    /// Tokens per image: the patches plus CLS.
    pub fn seq_len(&self) -> usize {
        (self.image_size / self.patch_size).pow(2) + 1
    }

    fn candle_transformers(&self) -> ct_vit::Config {
        ct_vit::Config {
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            intermediate_size: self.intermediate_size,
            hidden_act: self.hidden_act,
            layer_norm_eps: self.layer_norm_eps,
            image_size: self.image_size,
            patch_size: self.patch_size,
            num_channels: self.num_channels,
            qkv_bias: self.qkv_bias,
        }
    }
}

/// One pre-LN block: h = x + W_o·Attn(LN₁(x)); out = h + MLP(LN₂(h)).
#[derive(Clone, Debug)]
pub struct VitLayer {
    pub layernorm_before: Norm,
    pub attention: SelfAttention,
    /// `attention.output.dense`.
    pub attention_output: Dense,
    pub layernorm_after: Norm,
    pub intermediate: Dense,
    pub output: Dense,
    pub activation: Activation,
}

impl VitLayer {
    fn load(vb: VarBuilder, c: &VitConfig) -> Result<Self> {
        let ln = |name: &str| Norm::load(c.hidden_size, c.layer_norm_eps, vb.pp(name));
        Ok(Self {
            layernorm_before: ln("layernorm_before")?,
            attention: SelfAttention::load(
                vb.pp("attention.attention"),
                c.hidden_size,
                c.num_attention_heads,
                c.qkv_bias,
            )?,
            attention_output: Dense::new(candle_nn::linear(
                c.hidden_size,
                c.hidden_size,
                vb.pp("attention.output.dense"),
            )?),
            layernorm_after: ln("layernorm_after")?,
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

    /// The block after attention, given the attention context: residual, MLP, residual. Shared
    /// by the full forward and the phase-2 last layer, which supplies its own context.
    pub fn after_attention(&self, xs: &Tensor, context: &Tensor) -> Result<Tensor> {
        let hidden = self
            .attention_output
            .forward_then(context, Then::AddTo(xs))?;
        let mlp = self.layernorm_after.forward(&hidden)?;
        let mlp = self
            .intermediate
            .forward_then(&mlp, Then::Activate(self.activation))?;
        self.output.forward_then(&mlp, Then::AddTo(&hidden))
    }

    pub fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let context = self
            .attention
            .forward(&self.layernorm_before.forward(xs)?, None)?;
        self.after_attention(xs, &context)
    }
}

pub struct Vit {
    pub config: VitConfig,
    embeddings: ct_vit::Embeddings,
    pub layers: Vec<VitLayer>,
    /// The final LayerNorm.
    pub layernorm: Norm,
}

impl Vit {
    /// Loads `ViTModel` tensors, with or without the `vit.` prefix of classification checkpoints.
    pub fn load(vb: VarBuilder, config: &VitConfig) -> Result<Self> {
        config.check().map_err(candle_core::Error::msg)?;
        let vb = if vb.contains_tensor("vit.embeddings.cls_token") {
            vb.pp("vit")
        } else {
            vb
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| VitLayer::load(vb.pp(format!("encoder.layer.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config: config.clone(),
            embeddings: ct_vit::Embeddings::new(
                &config.candle_transformers(),
                false,
                vb.pp("embeddings"),
            )?,
            layers,
            layernorm: Norm::load(
                config.hidden_size,
                config.layer_norm_eps,
                vb.pp("layernorm"),
            )?,
        })
    }

    /// Patch, CLS and position embeddings: (B, C, H, W) → (B, T, D).
    pub fn embed(&self, pixel_values: &Tensor) -> Result<Tensor> {
        self.embeddings.forward(pixel_values, None, false)
    }

    /// HF's `hidden_states`: the embeddings, then each layer's output (before the final LN).
    pub fn hidden_states(&self, pixel_values: &Tensor) -> Result<Vec<Tensor>> {
        let mut states = vec![self.embed(pixel_values)?];
        for layer in &self.layers {
            let next = layer.forward(states.last().expect("starts non-empty"))?;
            states.push(next);
        }
        Ok(states)
    }

    /// The hidden states entering the last layer, (B, T, D).
    pub fn last_layer_input(&self, pixel_values: &Tensor) -> Result<Tensor> {
        let rest = &self.layers[..self.layers.len() - 1];
        rest.iter()
            .try_fold(self.embed(pixel_values)?, |xs, layer| layer.forward(&xs))
    }

    pub fn last_layer(&self) -> &VitLayer {
        self.layers.last().expect("a ViT has layers")
    }

    /// The final tokens (after the final LN) from the last layer's input.
    pub fn finish(&self, layer_input: &Tensor) -> Result<Tensor> {
        self.layernorm
            .forward(&self.last_layer().forward(layer_input)?)
    }

    /// The final-LayerNorm CLS feature, (B, D): what ViTForImageClassification classifies.
    pub fn cls_feature(final_tokens: &Tensor) -> Result<Tensor> {
        first_token(final_tokens)
    }
}
