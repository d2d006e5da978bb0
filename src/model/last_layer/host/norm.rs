//! A LayerNorm on host rows: forward with what its backward reads, in place without it, and the
//! backward to its input.

use anyhow::Result;

use crate::encoder::layers::Norm;
use crate::kernels::{mean_and_inv_std, mean_and_inv_std_rows};

/// A LayerNorm's parameters on the host.
pub(super) struct HostNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

/// What a LayerNorm's backward needs of its forward: the normalised rows and 1/σ per row.
#[derive(Default)]
pub(super) struct NormTrace {
    pub(super) normalised: Vec<f32>,
    pub(super) inv_std: Vec<f32>,
}

impl HostNorm {
    pub(super) fn new(norm: &Norm) -> Result<Self> {
        let (weight, bias, eps) = norm.host_parts()?;
        Ok(Self {
            weight,
            bias,
            eps: eps as f32,
        })
    }

    /// y = (x − μ)/√(σ² + ε)·γ + β per row, as candle's `layer_norm_slow`.
    pub(super) fn forward(&self, x: &[f32], y: &mut [f32]) -> NormTrace {
        let d = self.weight.len();
        let rows = x.len() / d;
        let mut trace = NormTrace {
            normalised: vec![0.0; x.len()],
            inv_std: vec![0.0; rows],
        };
        for (((x, y), n), inv) in x
            .chunks_exact(d)
            .zip(y.chunks_exact_mut(d))
            .zip(trace.normalised.chunks_exact_mut(d))
            .zip(trace.inv_std.iter_mut())
        {
            let mean;
            (mean, *inv) = mean_and_inv_std(x, self.eps);
            for k in 0..d {
                n[k] = (x[k] - mean) * *inv;
                y[k] = n[k] * self.weight[k] + self.bias[k];
            }
        }
        trace
    }

    /// [`Self::forward`]'s output in place over rows of `x`, with no trace. The statistics of
    /// four rows at a time, each row's numbers as alone.
    pub(super) fn normalise_in_place(&self, x: &mut [f32]) {
        const ROWS: usize = 4;
        let d = self.weight.len();
        let mut groups = x.chunks_exact_mut(ROWS * d);
        for group in &mut groups {
            let rows: [&[f32]; ROWS] = std::array::from_fn(|i| &group[i * d..(i + 1) * d]);
            let stats = mean_and_inv_std_rows(rows, self.eps);
            for (row, (mean, inv)) in group.chunks_exact_mut(d).zip(stats) {
                self.apply(row, mean, inv);
            }
        }
        for row in groups.into_remainder().chunks_exact_mut(d) {
            let (mean, inv) = mean_and_inv_std(row, self.eps);
            self.apply(row, mean, inv);
        }
    }

    /// (x − μ)·(1/σ)·γ + β over one row, in place.
    fn apply(&self, row: &mut [f32], mean: f32, inv: f32) {
        for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }

    /// ∂L/∂x = (g − mean(g) − n·mean(g⊙n))/σ with g = ∂L/∂y ⊙ γ, into `dx`.
    pub(super) fn backward(&self, trace: &NormTrace, dy: &[f32], dx: &mut [f32]) {
        let d = self.weight.len();
        for (((dy, dx), n), inv) in dy
            .chunks_exact(d)
            .zip(dx.chunks_exact_mut(d))
            .zip(trace.normalised.chunks_exact(d))
            .zip(&trace.inv_std)
        {
            for k in 0..d {
                dx[k] = dy[k] * self.weight[k];
            }
            let mean_g = dx.iter().sum::<f32>() / d as f32;
            let mean_gn = dx.iter().zip(n).map(|(g, n)| g * n).sum::<f32>() / d as f32;
            for k in 0..d {
                dx[k] = (dx[k] - mean_g - n[k] * mean_gn) * inv;
            }
        }
    }
}
