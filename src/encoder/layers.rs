//! Building blocks shared by the ViT and BERT encoders, in the Hugging Face tensor layout:
//! multi-head self-attention (HF's separate query/key/value weights, run as one fused product and
//! one fused attention pass on the CPU), LayerNorm, GELU and masks.

use candle_core::{CpuStorage, CustomOp1, D, Layout, Result, Shape, Tensor};

use super::projections::{Dense, Then};
use crate::kernels::{PackedMatrix, Precision, contiguous_f32, softmax};
pub use crate::kernels::{additive_mask, unpadded_lengths};
use candle_nn::{Linear, Module, VarBuilder};
use rayon::prelude::*;

/// Multi-head self-attention, `{query,key,value}.{weight,bias}` as in HF's ViT/BERT.
#[derive(Clone, Debug)]
pub struct SelfAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    /// The three projections as one (3D × D) product: one pass over the inputs instead of three.
    qkv: Dense,
    pub num_heads: usize,
    pub head_dim: usize,
    /// What the fused pass's products compute in (`--precision`).
    precision: Precision,
}

impl SelfAttention {
    pub fn load(vb: VarBuilder, hidden_size: usize, num_heads: usize, bias: bool) -> Result<Self> {
        if !hidden_size.is_multiple_of(num_heads) {
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
        let (query, key, value) = (proj("query")?, proj("key")?, proj("value")?);
        let weight = Tensor::cat(&[query.weight(), key.weight(), value.weight()], 0)?;
        let bias = match (query.bias(), key.bias(), value.bias()) {
            (Some(q), Some(k), Some(v)) => Some(Tensor::cat(&[q, k, v], 0)?),
            _ => None,
        };
        Ok(Self {
            qkv: Dense::new(Linear::new(weight, bias)),
            query,
            key,
            value,
            num_heads,
            head_dim: hidden_size / num_heads,
            precision: Precision::F32,
        })
    }

    /// This attention with its fused pass's products (Q, K, V; the scores and the weighted sums)
    /// in `precision`.
    pub fn in_precision(&self, precision: Precision) -> Self {
        Self {
            qkv: self.qkv.in_precision(precision),
            precision,
            ..self.clone()
        }
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

    /// The attention context (B, T, D) before the output projection; `mask` is additive,
    /// (B, 1, 1, T). On the CPU (frozen inputs, f32) one product for Q, K and V, then
    /// [`FusedSelfAttention`]; elsewhere (CUDA, or with gradients) [`Self::forward_reference`].
    /// tests/fused_attention.rs checks the two against each other, also across devices.
    pub fn forward(&self, xs: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        if !(xs.device().is_cpu() && xs.dtype() == candle_core::DType::F32) || xs.track_op() {
            return self.forward_reference(xs, mask);
        }
        let (b, t, _) = xs.dims3()?;
        let qkv = self
            .qkv
            .forward_then(&xs.contiguous()?, Then::Nothing)?
            .contiguous()?; // (B, T, 3D)
        let mask = match mask {
            Some(m) => Some(m.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        if mask.as_ref().is_some_and(|m| m.len() != b * t) {
            candle_core::bail!("attention mask does not fit {b} × {t} tokens");
        }
        qkv.apply_op1_no_bwd(&FusedSelfAttention {
            heads: self.num_heads,
            head_dim: self.head_dim,
            mask,
            precision: self.precision,
        })
    }

    /// The same function from candle's generic ops: separate projections, the (B, H, T, T)
    /// scores, softmax and the weighted sum (any device, differentiable).
    pub fn forward_reference(&self, xs: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let q = self.split_heads(&self.query.forward(xs)?)?;
        let k = self.split_heads(&self.key.forward(xs)?)?;
        let scores = (q.matmul(&k.t()?)? / (self.head_dim as f64).sqrt())?;
        let scores = match mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let v = self.split_heads(&self.value.forward(xs)?)?;
        Self::merge_heads(&probs.matmul(&v)?)
    }
}

/// Self-attention of every query of a sample over its keys in one pass, per sample and head:
/// S = Q_h K_hᵀ/√d_h + mask over the keys up to the last unmasked one (padded keys have
/// probability exactly 0 under HF's most-negative mask), softmax, O_h = P V_h, written straight
/// into the merged (B, T, D) layout. Reads Q, K and V in place from the fused (B, T, 3D)
/// projection: no split or merged copies and no (B, H, T, T) tensor. Inference only.
struct FusedSelfAttention {
    heads: usize,
    head_dim: usize,
    /// Additive, (B·T), when text is padded.
    mask: Option<Vec<f32>>,
    precision: Precision,
}

impl CustomOp1 for FusedSelfAttention {
    fn name(&self) -> &'static str {
        "fused-self-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let qkv = contiguous_f32(storage, layout, self.name())?;
        let (b, t, three_d) = layout.shape().dims3()?;
        let d = self.heads * self.head_dim;
        if three_d != 3 * d {
            candle_core::bail!("fused-self-attention: width {three_d}, expected {}", 3 * d);
        }
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let mut out = vec![0f32; b * t * d];
        out.par_chunks_mut(t * d)
            .zip(qkv.par_chunks(t * three_d))
            .enumerate()
            .for_each(|(i, (out, qkv))| {
                let mask = self.mask.as_ref().map(|m| &m[i * t..(i + 1) * t]);
                // Keys past the last unmasked one get probability exactly 0: skip them.
                let len = mask.map_or(t, |m| {
                    m.iter()
                        .rposition(|&v| v > f32::MIN / 2.0)
                        .map_or(t, |last| last + 1)
                });
                let mut scores = vec![0f32; t * len];
                for h in 0..self.heads {
                    let (q, k, v) = (
                        h * self.head_dim,
                        d + h * self.head_dim,
                        2 * d + h * self.head_dim,
                    );
                    // S (T×L) = Q_h (T×d_h, row stride 3D) · K_hᵀ, K_hᵀ packed once for
                    // all T query rows.
                    let keys = PackedMatrix::new_in(
                        self.precision,
                        &qkv[k..],
                        (self.head_dim, len),
                        (1, three_d),
                    );
                    keys.product(t, (&qkv[q..], three_d), (&mut scores, len));
                    for row in scores.chunks_mut(len) {
                        let mask = mask.map(|m| &m[..len]);
                        softmax(row, scale, mask);
                    }
                    // O_h (T×d_h, row stride D) = P (T×L) · V_h (L×d_h, row stride 3D).
                    let values = PackedMatrix::new_in(
                        self.precision,
                        &qkv[v..],
                        (len, self.head_dim),
                        (three_d, 1),
                    );
                    values.product(t, (&scores, len), (&mut out[h * self.head_dim..], d));
                }
            });
        Ok((CpuStorage::F32(out), Shape::from((b, t, d))))
    }
}

/// A LayerNorm that keeps candle's fused kernel for frozen inference and switches to the
/// differentiable formula when its input tracks gradients (phase 2 trains through the last
/// layer's norms; the fused kernel has no backward).
#[derive(Clone, Debug)]
pub struct Norm {
    fused: candle_nn::LayerNorm,
    eps: f64,
}

impl Norm {
    /// Weight, bias (zeros when absent) and ε on the host, for phase 2's hand-derived pass.
    pub fn host_parts(&self) -> Result<(Vec<f32>, Vec<f32>, f64)> {
        let weight = self.fused.weight().to_vec1::<f32>()?;
        let bias = match self.fused.bias() {
            Some(b) => b.to_vec1::<f32>()?,
            None => vec![0.0; weight.len()],
        };
        Ok((weight, bias, self.eps))
    }

    pub fn load(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            fused: layer_norm(size, eps, vb)?,
            eps,
        })
    }
}

/// A LayerNorm's `weight`/`bias`, or `gamma`/`beta` as in the original bert-base-uncased
/// checkpoint (HF renames them when loading; so must we).
pub fn layer_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<candle_nn::LayerNorm> {
    let (weight, bias) = match (vb.get(size, "weight"), vb.get(size, "bias")) {
        (Ok(w), Ok(b)) => (w, b),
        (Err(err), _) | (_, Err(err)) => match (vb.get(size, "gamma"), vb.get(size, "beta")) {
            (Ok(w), Ok(b)) => (w, b),
            _ => return Err(err),
        },
    };
    Ok(candle_nn::LayerNorm::new(weight, bias, eps))
}

impl Module for Norm {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        if !xs.track_op() {
            return self.fused.forward(xs);
        }
        let bias = match self.fused.bias() {
            Some(b) => b.clone(),
            None => self.fused.weight().zeros_like()?,
        };
        candle_nn::ops::layer_norm_slow(xs, self.fused.weight(), &bias, self.eps as f32)
    }
}

/// Row 0 of every sequence: (B, T, D) → (B, D), as its own contiguous tensor. A view would do on
/// the CPU, whose gemm takes any row stride, but candle's CUDA matmul refuses a left operand whose
/// rows are T·D apart ("matmul is only supported for contiguous tensors"), and every CLS row
/// ends in a product (the query row, the pooler, the classifier). The copy is B·D floats.
pub fn first_token(xs: &Tensor) -> Result<Tensor> {
    xs.narrow(1, 0, 1)?.squeeze(1)?.contiguous()
}

/// Mean over the attended positions: (B, T, D), mask (B, T) → (B, D).
pub fn masked_mean(xs: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
    let mask = attention_mask.to_dtype(xs.dtype())?.unsqueeze(D::Minus1)?;
    let summed = xs.broadcast_mul(&mask)?.sum(1)?;
    summed.broadcast_div(&mask.sum(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The CLS rows come back as their own tensor: CUDA's matmul, which every CLS row meets,
    /// refuses the strided view that CPU tests would pass with (docs/cuda.md).
    #[test]
    fn first_token_is_a_contiguous_copy_of_row_zero() {
        let xs = Tensor::arange(0f32, 24.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3, 4))
            .unwrap();
        let cls = first_token(&xs).unwrap();
        assert!(cls.is_contiguous());
        assert_eq!(
            cls.to_vec2::<f32>().unwrap(),
            [[0.0, 1.0, 2.0, 3.0], [12.0, 13.0, 14.0, 15.0]]
        );
    }
}
