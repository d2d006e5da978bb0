//! One query per head attending over the tokens of a batch: the only part of phase 2 that touches
//! every token, in both modes.
//!
//! Per sample and head h, with a query direction rₕ (D), a scalar bias cₕ and the tokens
//! X (L, D) that are both the keys and what is pooled:
//!
//!   sₜ = scale·(rₕ·xₜ + cₕ),   p = softmax(s),   pooledₕ = Σₜ pₜ xₜ
//!
//! The last layer uses rₕ = q₀ₕ W_Kₕ, cₕ = q₀ₕ·b_Kₕ, scale 1/√dₕ and X = X̂ (what its attention
//! reads); attention is linear in the values, so its context is pooledₕ W_Vₕᵀ + b_Vₕ and neither
//! keys nor values exist per sample. The head mode uses r = Wᵀp, c = 0, scale 1, X = the final
//! tokens, one head.
//!
//! Each sample keeps only its first Lᵢ tokens (its unpadded length: HF pads text on the right,
//! and a padded position has probability exactly 0). On the CPU a fused custom op does the
//! forward and the backward with four matrix products per sample; autograd through candle's
//! generic ops would also compute, and allocate, gradients for the frozen tokens (its matmul
//! backward differentiates both operands). Other devices (CUDA) take the generic route on the
//! device, with the tokens left where they are; `attend_reference` is that route, so the two are
//! tested against each other (tests/fused_attention.rs, also across devices).

use std::sync::Arc;

use anyhow::{Result, ensure};
use candle_core::{CpuStorage, CustomOp2, D, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::token_products::{Rows, SampleTokens, row_scores, weighted_sums};
use crate::kernels::contiguous_f32;
pub use crate::kernels::unpadded_lengths;

/// The tokens of a batch: in host memory for the fused CPU op, or a tensor on another device.
pub struct KeyValues {
    /// (N, T, D) values when the tokens are on the CPU; empty otherwise.
    tokens_data: Vec<f32>,
    /// The tokens when they are on another device (CUDA), read by the generic ops there.
    on_device: Option<Tensor>,
    /// SampleTokens of each sample up to its last unpadded one; later positions are never read.
    lengths: Vec<usize>,
    samples: usize,
    tokens: usize,
    dim: usize,
    heads: usize,
    scale: f32,
}

/// What one batch's attention produced.
pub struct Attended {
    /// (B, H, D): Σₜ pₜ xₜ per head.
    pub pooled: Tensor,
    /// (B, H, T).
    pub probs: Tensor,
}

impl KeyValues {
    /// `tokens` (N, T, D) attended by `heads` queries per sample; `lengths` the unpadded tokens
    /// per sample (all T when `None`).
    pub fn new(
        tokens: &Tensor,
        heads: usize,
        lengths: Option<&[usize]>,
        scale: f64,
    ) -> Result<Self> {
        if !tokens.device().is_cpu() {
            return Self::kept(tokens, heads, lengths, scale);
        }
        let (samples, t, dim) = tokens.dims3()?;
        let lengths = lengths.map_or_else(|| vec![t; samples], <[usize]>::to_vec);
        let values = crate::kernels::host_reads::flat::<f32>(tokens)?;
        Self::from_host(values, (samples, t, dim), heads, lengths, scale)
    }

    /// The same with the tokens kept as a tensor where they are, on the CPU too: every attention
    /// gathers its rows there with the generic ops ([`Self::attend_reference`]), and nothing is
    /// read back (phase 2's device-resident route).
    pub fn kept(
        tokens: &Tensor,
        heads: usize,
        lengths: Option<&[usize]>,
        scale: f64,
    ) -> Result<Self> {
        let (samples, t, dim) = tokens.dims3()?;
        let lengths = lengths.map_or_else(|| vec![t; samples], <[usize]>::to_vec);
        let mut kv = Self::from_host(Vec::new(), (samples, t, dim), heads, lengths, scale)?;
        kv.on_device = Some(tokens.contiguous()?);
        Ok(kv)
    }

    /// The same from host values (N·T·D, row-major) taken as they are; an empty `values` when
    /// the tokens stay on another device.
    pub fn from_host(
        values: Vec<f32>,
        (samples, t, dim): (usize, usize, usize),
        heads: usize,
        lengths: Vec<usize>,
        scale: f64,
    ) -> Result<Self> {
        ensure!(
            lengths.len() == samples && lengths.iter().all(|&len| (1..=t).contains(&len)),
            "lengths {lengths:?} do not fit {samples} samples of {t} tokens"
        );
        ensure!(heads >= 1, "attention needs at least one head");
        ensure!(
            values.is_empty() || values.len() == samples * t * dim,
            "{} token values for {samples} × {t} × {dim}",
            values.len()
        );
        Ok(Self {
            tokens_data: values,
            on_device: None,
            lengths,
            samples,
            tokens: t,
            dim,
            heads,
            scale: scale as f32,
        })
    }

    /// The host values it was made from ([`Self::from_host`]), for a buffer to be used again.
    pub fn into_host_values(self) -> Vec<f32> {
        self.tokens_data
    }

    fn sample_tokens(&self, i: usize) -> &[f32] {
        let len = self.tokens * self.dim;
        &self.tokens_data[i * len..(i + 1) * len]
    }

    /// Sample `i`'s first Lᵢ tokens, all that its attention reads.
    fn unpadded(&self, i: usize) -> SampleTokens<'_> {
        let (len, dim) = (self.lengths[i], self.dim);
        SampleTokens {
            data: &self.sample_tokens(i)[..len * dim],
            len,
            dim,
        }
    }

    /// Attention of `queries` (B, H, D) with `bias` (B, H) over samples `rows`, differentiable in
    /// both. CPU: the fused op; elsewhere: [`Self::attend_reference`].
    pub fn attend(
        self: &Arc<Self>,
        queries: &Tensor,
        bias: &Tensor,
        rows: &[usize],
    ) -> Result<Attended> {
        if !queries.device().is_cpu() || self.on_device.is_some() {
            return self.attend_reference(queries, bias, rows);
        }
        self.check(queries, bias, rows)?;
        let out = queries.contiguous()?.apply_op2(
            &bias.contiguous()?,
            FusedAttend {
                store: Arc::clone(self),
                rows: rows.to_vec(),
            },
        )?;
        Ok(Attended {
            pooled: out.narrow(D::Minus1, 0, self.dim)?,
            probs: out.narrow(D::Minus1, self.dim, self.tokens)?,
        })
    }

    /// The same function from candle's generic ops on a gathered batch (any device).
    pub fn attend_reference(
        &self,
        queries: &Tensor,
        bias: &Tensor,
        rows: &[usize],
    ) -> Result<Attended> {
        self.check(queries, bias, rows)?;
        let device = queries.device();
        let b = rows.len();
        let (t, d) = (self.tokens, self.dim);
        let tokens = match &self.on_device {
            // Rows 0..B in order (every phase-2 batch) need no gather.
            Some(all) if rows.iter().copied().eq(0..all.dim(0)?) => all.to_device(device)?,
            Some(all) => {
                let index = row_indices(rows, all.device())?;
                all.index_select(&index, 0)?.to_device(device)?
            }
            None => {
                let data: Vec<f32> = rows
                    .iter()
                    .flat_map(|&i| self.sample_tokens(i).to_vec())
                    .collect();
                Tensor::from_vec(data, (b, t, d), device)?
            }
        };
        let scores = queries
            .matmul(&tokens.transpose(1, 2)?)?
            .broadcast_add(&bias.unsqueeze(2)?)?;
        let scores = (scores * f64::from(self.scale))?;
        // Padded positions: the most negative f32, as HF's additive mask.
        let mask: Vec<f32> = rows
            .iter()
            .flat_map(|&i| (0..t).map(move |k| if k < self.lengths[i] { 0.0 } else { f32::MIN }))
            .collect();
        let scores = scores.broadcast_add(&Tensor::from_vec(mask, (b, 1, t), device)?)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?; // (B, H, T)
        let pooled = probs.matmul(&tokens)?; // (B, H, D)
        Ok(Attended { pooled, probs })
    }

    fn check(&self, queries: &Tensor, bias: &Tensor, rows: &[usize]) -> Result<()> {
        let (b, h, d) = queries.dims3()?;
        ensure!(
            (h, d) == (self.heads, self.dim) && bias.dims() == [b, h] && rows.len() == b,
            "attend: queries {:?}, bias {:?} and {} rows do not fit tokens of {} heads × {d}",
            queries.dims(),
            bias.dims(),
            rows.len(),
            self.heads,
        );
        if let Some(&bad) = rows.iter().find(|&&i| i >= self.samples) {
            anyhow::bail!("attend: row {bad} out of {} samples", self.samples);
        }
        Ok(())
    }

    /// Probabilities of the query rows of sample `i` in `probs` (one row of T per query in
    /// `queries`, R×D): scores R Xᵀ over its first L tokens, then softmax(scale·s); the padding is
    /// set to exactly 0. softmax(scale·(s + c)) is the same function: a head's bias c shifts its
    /// every score alike (which is also why its gradient is 0), so it does not enter here.
    fn probabilities(&self, i: usize, queries: &[f32], probs: &mut [f32]) {
        let (t, d, len) = (self.tokens, self.dim, self.lengths[i]);
        // S (R×T, columns past L unwritten) = R (R×D) · Xᵀ.
        row_scores(
            queries.len() / d,
            Rows {
                data: queries,
                stride: d,
            },
            self.unpadded(i),
            probs,
            t,
        );
        for row in probs.chunks_mut(t).take(queries.len() / d) {
            let (row, padding) = row.split_at_mut(len);
            padding.fill(0.0);
            // The vectorised softmax the encoder's attention uses.
            crate::kernels::softmax(row, self.scale, None);
        }
    }

    /// Sample `i`'s attention for its H `queries` (H×D) (any bias c drops out: see
    /// `probabilities`): the probabilities into `probs` (H×T, padding 0) and Σₜ pₜ xₜ into
    /// `pooled` (H rows of row stride `pooled_stride`). Any whole number of heads' rows may come
    /// at once (the host pass's look-ahead evaluation sends the queries of two parameter sets):
    /// each row's numbers are those it gets alone, and the sample's tokens are read once for all.
    /// `next` is the sample the caller goes on to, if it knows: its tokens are brought into cache
    /// meanwhile ([`weighted_sums`]).
    pub(crate) fn sample_forward(
        &self,
        i: usize,
        queries: &[f32],
        probs: &mut [f32],
        pooled: &mut [f32],
        pooled_stride: usize,
        next: Option<usize>,
    ) {
        self.probabilities(i, queries, probs);
        // Pooled (R×D) = P (R×L) · X (L×D).
        weighted_sums(
            queries.len() / self.dim,
            Rows {
                data: probs,
                stride: self.tokens,
            },
            self.unpadded(i),
            pooled,
            pooled_stride,
            self.upcoming(next),
        );
    }

    /// The tokens of sample `next` a product prefetches, when there is one on the CPU.
    fn upcoming(&self, next: Option<usize>) -> &[f32] {
        next.filter(|&n| n < self.samples)
            .map_or(&[], |n| self.unpadded(n).data)
    }

    /// The backward of [`Self::sample_forward`]. With g = ∂L/∂pooled and γ = ∂L/∂p (none: 0):
    /// ∂L/∂pₜ = g·xₜ + γₜ, ∂L/∂sₜ = pₜ(∂L/∂pₜ − Σᵤ pᵤ ∂L/∂pᵤ), ∂L/∂r = scale Σₜ (∂L/∂sₜ) xₜ into
    /// `grad_queries` (R×D), ∂L/∂c = scale Σₜ ∂L/∂sₜ into `grad_bias` (R). `probs`, g and γ are
    /// R rows each, R the length of `grad_bias`: any whole number of heads' rows, as for the
    /// forward, each row's numbers those it gets alone. `next` as for [`Self::sample_forward`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sample_backward(
        &self,
        i: usize,
        probs: Rows,
        grad_pooled: Rows,
        grad_probs: Option<Rows>,
        grad_queries: &mut [f32],
        grad_bias: &mut [f32],
        next: Option<usize>,
    ) {
        let (h, t) = (grad_bias.len(), self.tokens);
        // Past L every probability is 0, and so is every ∂L/∂s.
        let len = self.lengths[i];
        let tokens = self.unpadded(i);
        // ∂L/∂P (H×L) = G (H×D) · Xᵀ.
        let mut dscores = vec![0f32; h * t];
        row_scores(h, grad_pooled, tokens, &mut dscores, t);
        for k in 0..h {
            let p = &probs.data[k * probs.stride..k * probs.stride + len];
            let ds = &mut dscores[k * t..k * t + len];
            if let Some(gamma) = grad_probs {
                let gamma = &gamma.data[k * gamma.stride..k * gamma.stride + len];
                ds.iter_mut().zip(gamma).for_each(|(d, g)| *d += g);
            }
            let weighted: f32 = p.iter().zip(ds.iter()).map(|(p, d)| p * d).sum();
            let mut sum = 0.0;
            for (d, p) in ds.iter_mut().zip(p) {
                *d = self.scale * p * (*d - weighted);
                sum += *d;
            }
            grad_bias[k] = sum;
        }
        // ∂L/∂R (H×D) = ∂L/∂S (H×L) · X (L×D).
        weighted_sums(
            h,
            Rows {
                data: &dscores,
                stride: t,
            },
            tokens,
            grad_queries,
            self.dim,
            self.upcoming(next),
        );
    }

    /// Heads, feature width and (padded) tokens per sample.
    pub(crate) fn geometry(&self) -> (usize, usize, usize) {
        (self.heads, self.dim, self.tokens)
    }
}

/// The fused forward/backward over rows of a [`KeyValues`]. Output (B, H, D + T): the pooled
/// tokens followed by the probabilities, so that both are differentiable outputs of one op.
struct FusedAttend {
    store: Arc<KeyValues>,
    rows: Vec<usize>,
}

impl CustomOp2 for FusedAttend {
    fn name(&self) -> &'static str {
        "fused-token-attention"
    }

    fn cpu_fwd(
        &self,
        queries: &CpuStorage,
        queries_layout: &Layout,
        _bias: &CpuStorage,
        _bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        // The bias is an input for its gradient only: it drops out of the softmax.
        let queries = contiguous_f32(queries, queries_layout, self.name())?;
        let kv = &self.store;
        let (h, d, t) = (kv.heads, kv.dim, kv.tokens);
        let width = d + t;
        let mut out = vec![0f32; self.rows.len() * h * width];
        out.par_chunks_mut(h * width)
            .zip(&self.rows)
            .enumerate()
            .for_each(|(b, (sample_out, &i))| {
                let mut probs = vec![0f32; h * t];
                kv.sample_forward(
                    i,
                    &queries[b * h * d..(b + 1) * h * d],
                    &mut probs,
                    sample_out,
                    width,
                    self.rows.get(b + 1).copied(),
                );
                for (k, head_out) in sample_out.chunks_mut(width).enumerate() {
                    head_out[d..].copy_from_slice(&probs[k * t..(k + 1) * t]);
                }
            });
        Ok((
            CpuStorage::F32(out),
            Shape::from((self.rows.len(), h, width)),
        ))
    }

    /// With g = ∂L/∂pooled and γ = ∂L/∂p: ∂L/∂pₜ = g·xₜ + γₜ, ∂L/∂sₜ = pₜ(∂L/∂pₜ − Σᵤ pᵤ ∂L/∂pᵤ),
    /// ∂L/∂r = scale Σₜ (∂L/∂sₜ) xₜ, ∂L/∂c = scale Σₜ ∂L/∂sₜ.
    fn bwd(
        &self,
        queries: &Tensor,
        _bias: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let kv = &self.store;
        let (h, d, t) = (kv.heads, kv.dim, kv.tokens);
        let width = d + t;
        let res = crate::kernels::host_reads::flat::<f32>(res)?;
        let grad = crate::kernels::host_reads::flat::<f32>(grad_res)?;
        let b = self.rows.len();
        let mut grad_queries = vec![0f32; b * h * d];
        let mut grad_bias = vec![0f32; b * h];
        grad_queries
            .par_chunks_mut(h * d)
            .zip(grad_bias.par_chunks_mut(h))
            .zip(&self.rows)
            .enumerate()
            .for_each(|(bi, ((gq, gc), &i))| {
                let at = bi * h * width;
                kv.sample_backward(
                    i,
                    Rows {
                        data: &res[at + d..],
                        stride: width,
                    },
                    Rows {
                        data: &grad[at..],
                        stride: width,
                    },
                    Some(Rows {
                        data: &grad[at + d..],
                        stride: width,
                    }),
                    gq,
                    gc,
                    self.rows.get(bi + 1).copied(),
                );
            });
        let device = queries.device();
        Ok((
            Some(Tensor::from_vec(grad_queries, (b, h, d), device)?),
            Some(Tensor::from_vec(grad_bias, (b, h), device)?),
        ))
    }
}

/// Queries (H, D) shared by a batch, in the (B, H, D) shape [`KeyValues::attend`] takes.
pub fn broadcast_query(query: &Tensor, batch: usize) -> Result<Tensor> {
    let (h, d) = query.dims2()?;
    Ok(query
        .unsqueeze(0)?
        .broadcast_as((batch, h, d))?
        .contiguous()?)
}

/// Sample indices as a u32 index tensor.
pub fn row_indices(indices: &[usize], device: &Device) -> Result<Tensor> {
    if indices.is_empty() {
        anyhow::bail!("empty batch");
    }
    Ok(Tensor::from_iter(
        indices.iter().map(|&i| i as u32),
        device,
    )?)
}
