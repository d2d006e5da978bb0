//! Building blocks shared by the ViT and BERT encoders, in the Hugging Face tensor layout:
//! multi-head self-attention with separate query/key/value projections, and config parsing.

use candle_core::{D, Result, Tensor};
use candle_nn::{Linear, Module, VarBuilder};

/// Multi-head self-attention, `{query,key,value}.{weight,bias}` as in HF's ViT/BERT.
#[derive(Clone, Debug)]
pub struct SelfAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub num_heads: usize,
    pub head_dim: usize,
}

impl SelfAttention {
    pub fn load(vb: VarBuilder, hidden_size: usize, num_heads: usize, bias: bool) -> Result<Self> {
        if hidden_size % num_heads != 0 {
            candle_core::bail!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"
            );
        }
        let proj = |name: &str| {
            if bias {
                candle_nn::linear(hidden_size, hidden_size, vb.pp(name))
            } else {
                candle_nn::linear_no_bias(hidden_size, hidden_size, vb.pp(name))
            }
        };
        Ok(Self {
            query: proj("query")?,
            key: proj("key")?,
            value: proj("value")?,
            num_heads,
            head_dim: hidden_size / num_heads,
        })
    }

    /// (B, T, D) → (B, H, T, d_h).
    pub fn split_heads(&self, xs: &Tensor) -> Result<Tensor> {
        let (b, t, _) = xs.dims3()?;
        xs.reshape((b, t, self.num_heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// (B, H, T, d_h) → (B, T, D).
    pub fn merge_heads(xs: &Tensor) -> Result<Tensor> {
        let (b, h, t, d) = xs.dims4()?;
        xs.transpose(1, 2)?.contiguous()?.reshape((b, t, h * d))
    }

    /// Attention probabilities (B, H, T, T) for `xs` (B, T, D); `mask` is additive, (B, 1, 1, T).
    pub fn probabilities(&self, xs: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let q = self.split_heads(&self.query.forward(xs)?)?;
        let k = self.split_heads(&self.key.forward(xs)?)?;
        let scores = (q.matmul(&k.t()?)? / (self.head_dim as f64).sqrt())?;
        let scores = match mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        candle_nn::ops::softmax_last_dim(&scores)
    }

    /// The attention context (B, T, D) before the output projection.
    pub fn forward(&self, xs: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let probs = self.probabilities(xs, mask)?;
        let v = self.split_heads(&self.value.forward(xs)?)?;
        Self::merge_heads(&probs.matmul(&v)?)
    }
}

/// HF's extended attention mask: 0 where attended, the most negative f32 where padded, (B,1,1,T).
pub fn additive_mask(attention_mask: &Tensor) -> Result<Tensor> {
    let (b, t) = attention_mask.dims2()?;
    let keep = attention_mask.to_dtype(candle_core::DType::F32)?;
    ((1.0 - keep)? * f64::from(f32::MIN))?.reshape((b, 1, 1, t))
}

/// Row 0 of every sequence: (B, T, D) → (B, D).
pub fn first_token(xs: &Tensor) -> Result<Tensor> {
    xs.narrow(1, 0, 1)?.squeeze(1)
}

/// Mean over the attended positions: (B, T, D), mask (B, T) → (B, D).
pub fn masked_mean(xs: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
    let mask = attention_mask.to_dtype(xs.dtype())?.unsqueeze(D::Minus1)?;
    let summed = xs.broadcast_mul(&mask)?.sum(1)?;
    summed.broadcast_div(&mask.sum(1)?)
}
