//! The encoder's parameters, named and shaped as the authors' torch module names them
//! (`OneLayerEncoder.state_dict()`), and their initialisation: torch's defaults, drawn from this
//! crate's seeded stream (the authors' script leaves the model unseeded).

use rand::RngExt;
use rand_distr::{StandardNormal, Uniform};

use crate::rng::{Stream, stream};

/// LayerNorm's ε (torch's default).
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// A LayerNorm's scale and shift (d each).
#[derive(Clone, Debug, PartialEq)]
pub struct NormParams {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

impl NormParams {
    fn identity(dim: usize) -> Self {
        Self {
            weight: vec![1.0; dim],
            bias: vec![0.0; dim],
        }
    }
}

/// A Linear layer: weight (out × in, row-major, torch's layout) and bias (out).
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub outputs: usize,
    pub inputs: usize,
}

impl Linear {
    /// torch's `nn.Linear` reset: weight and bias ~ U(±1/√in) (kaiming_uniform_ with a = √5).
    fn torch_default(outputs: usize, inputs: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Self {
        let bound = 1.0 / (inputs as f32).sqrt();
        let uniform = Uniform::new(-bound, bound).expect("the bound is finite and positive");
        let weight = (0..outputs * inputs).map(|_| rng.sample(uniform)).collect();
        let bias = (0..outputs).map(|_| rng.sample(uniform)).collect();
        Self {
            weight,
            bias,
            outputs,
            inputs,
        }
    }
}

/// Every trained parameter of the one-layer encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderParams {
    pub dim: usize,
    pub mlp_dim: usize,
    /// The learnable CLS token p (d), prepended to every sample.
    pub cls: Vec<f32>,
    /// `attn.norm`: the pre-attention LayerNorm.
    pub attn_norm: NormParams,
    /// `attn.to_qkv.weight` (3d × d, no bias): the query, key and value rows in turn.
    pub qkv: Vec<f32>,
    /// `ff.net.0`: the FFN's LayerNorm.
    pub ff_norm: NormParams,
    /// `ff.net.1`: d → mlp_dim.
    pub ff_in: Linear,
    /// `ff.net.4`: mlp_dim → d.
    pub ff_out: Linear,
    /// `norm`: the final LayerNorm.
    pub final_norm: NormParams,
    /// `head`: d → 1 on the CLS position.
    pub head: Linear,
}

impl EncoderParams {
    /// torch's default initialisation of every module, in the order the authors' constructor
    /// builds them (to_qkv, the FFN's two Linears, the head, then the CLS token ~ N(0, 1)), from
    /// stream `Stream::EncoderInit` of `seed`.
    pub fn init(dim: usize, mlp_dim: usize, seed: u64) -> Self {
        let mut rng = stream(seed, Stream::EncoderInit);
        let qkv = Linear::torch_default(3 * dim, dim, &mut rng).weight;
        let ff_in = Linear::torch_default(mlp_dim, dim, &mut rng);
        let ff_out = Linear::torch_default(dim, mlp_dim, &mut rng);
        let head = Linear::torch_default(1, dim, &mut rng);
        let cls = (0..dim)
            .map(|_| rng.sample::<f32, _>(StandardNormal))
            .collect();
        Self {
            dim,
            mlp_dim,
            cls,
            attn_norm: NormParams::identity(dim),
            qkv,
            ff_norm: NormParams::identity(dim),
            ff_in,
            ff_out,
            final_norm: NormParams::identity(dim),
            head,
        }
    }

    /// The query rows W_q (d × d) of `to_qkv`.
    pub fn query(&self) -> &[f32] {
        &self.qkv[..self.dim * self.dim]
    }

    /// The key rows W_k (d × d).
    pub fn key(&self) -> &[f32] {
        &self.qkv[self.dim * self.dim..2 * self.dim * self.dim]
    }

    /// The value rows W_v (d × d).
    pub fn value(&self) -> &[f32] {
        &self.qkv[2 * self.dim * self.dim..]
    }

    /// Every parameter by its name in the authors' `state_dict()`, with its torch shape.
    pub fn named(&self) -> Vec<(&'static str, Vec<usize>, &[f32])> {
        let (d, m) = (self.dim, self.mlp_dim);
        vec![
            ("cls_token", vec![1, 1, d], &self.cls[..]),
            ("attn.norm.weight", vec![d], &self.attn_norm.weight[..]),
            ("attn.norm.bias", vec![d], &self.attn_norm.bias[..]),
            ("attn.to_qkv.weight", vec![3 * d, d], &self.qkv[..]),
            ("ff.net.0.weight", vec![d], &self.ff_norm.weight[..]),
            ("ff.net.0.bias", vec![d], &self.ff_norm.bias[..]),
            ("ff.net.1.weight", vec![m, d], &self.ff_in.weight[..]),
            ("ff.net.1.bias", vec![m], &self.ff_in.bias[..]),
            ("ff.net.4.weight", vec![d, m], &self.ff_out.weight[..]),
            ("ff.net.4.bias", vec![d], &self.ff_out.bias[..]),
            ("norm.weight", vec![d], &self.final_norm.weight[..]),
            ("norm.bias", vec![d], &self.final_norm.bias[..]),
            ("head.weight", vec![1, d], &self.head.weight[..]),
            ("head.bias", vec![1], &self.head.bias[..]),
        ]
    }

    /// [`named`](Self::named), mutable, in the same order.
    pub fn named_mut(&mut self) -> Vec<(&'static str, &mut Vec<f32>)> {
        vec![
            ("cls_token", &mut self.cls),
            ("attn.norm.weight", &mut self.attn_norm.weight),
            ("attn.norm.bias", &mut self.attn_norm.bias),
            ("attn.to_qkv.weight", &mut self.qkv),
            ("ff.net.0.weight", &mut self.ff_norm.weight),
            ("ff.net.0.bias", &mut self.ff_norm.bias),
            ("ff.net.1.weight", &mut self.ff_in.weight),
            ("ff.net.1.bias", &mut self.ff_in.bias),
            ("ff.net.4.weight", &mut self.ff_out.weight),
            ("ff.net.4.bias", &mut self.ff_out.bias),
            ("norm.weight", &mut self.final_norm.weight),
            ("norm.bias", &mut self.final_norm.bias),
            ("head.weight", &mut self.head.weight),
            ("head.bias", &mut self.head.bias),
        ]
    }

    /// Number of trained scalars.
    pub fn len(&self) -> usize {
        self.named().iter().map(|(_, _, v)| v.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.dim == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_init_follow_torch() {
        let p = EncoderParams::init(16, 12, 3);
        for (name, shape, values) in p.named() {
            assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
        }
        assert_eq!(
            p.len(),
            16 + 3 * 16 * 16 + 6 * 16 + 2 * 12 * 16 + 12 + 16 + 16 + 1
        );
        assert!(p.qkv.iter().all(|v| v.abs() <= 0.25));
        assert!(
            p.ff_out
                .weight
                .iter()
                .all(|v| v.abs() <= 1.0 / 12f32.sqrt())
        );
        assert_eq!(p, EncoderParams::init(16, 12, 3));
        assert_ne!(p.cls, EncoderParams::init(16, 12, 4).cls);
    }
}
