//! One query per head attending over frozen, cached keys and values: the only part of phase 2
//! that touches every token, in both modes.
//!
//! Per sample and head h, with a query direction rₕ (D), a scalar bias cₕ, keys K (T, D), values
//! Vₕ (T, d_v) and an additive mask m:
//!
//!   sₜ = scale·(rₕ·kₜ + cₕ) + mₜ,   p = softmax(s),   contextₕ = Σₜ pₜ vₕₜ
//!
//! The last layer uses rₕ = q₀ₕ W_Kₕ, cₕ = q₀ₕ·b_Kₕ, scale 1/√dₕ, K = X̂ (what the attention
//! reads) and V its frozen values; the head mode uses r = Wᵀp, c = 0, scale 1, V = K = the final
//! tokens, one head.
//!
//! On the CPU a fused custom op does the forward and the backward in one pass over the cached rows
//! without gathering a batch tensor. Autograd through candle's generic ops would also compute, and
//! allocate, gradients for the frozen keys and values (its matmul backward differentiates both
//! operands), which made that route memory-bound. Other devices take the generic route, which
//! `attend_reference` also is, so the two are tested against each other.

use std::sync::Arc;

use anyhow::{Result, ensure};
use candle_core::{CpuStorage, CustomOp2, D, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::encoder::layers::additive_mask;

/// Frozen keys, values and mask of a whole set, in host memory.
pub struct KeyValues {
    keys: Vec<f32>,
    /// `None`: the values are the keys (one head, d_v = D).
    values: Option<Vec<f32>>,
    /// Additive, (N, T).
    mask: Option<Vec<f32>>,
    /// Tokens of each sample up to its last unmasked one: the trailing padding of text gets
    /// probability exactly 0, so scores, softmax and sums skip it (TREC's questions fill about
    /// a tenth of the 128 positions).
    lengths: Vec<usize>,
    samples: usize,
    tokens: usize,
    dim: usize,
    heads: usize,
    value_dim: usize,
    scale: f32,
}

/// What one batch's attention produced.
pub struct Attended {
    /// (B, H, d_v).
    pub context: Tensor,
    /// (B, H, T).
    pub probs: Tensor,
}

impl KeyValues {
    /// `keys` (N, T, D); `values` (N, H, T, d_v) or `None` to attend over the keys themselves;
    /// `attention_mask` the 0/1 padding mask (N, T) of text, made additive as HF does.
    pub fn new(
        keys: &Tensor,
        values: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        scale: f64,
    ) -> Result<Self> {
        let (samples, tokens, dim) = keys.dims3()?;
        let (heads, value_dim) = match values {
            Some(v) => {
                let (n, h, t, dv) = v.dims4()?;
                ensure!(
                    (n, t) == (samples, tokens),
                    "values {:?} do not match keys {:?}",
                    v.dims(),
                    keys.dims()
                );
                (h, dv)
            }
            None => (1, dim),
        };
        let mask = match attention_mask {
            Some(m) => {
                ensure!(
                    m.dims() == [samples, tokens],
                    "mask {:?} does not match keys {:?}",
                    m.dims(),
                    keys.dims()
                );
                Some(additive_mask(m)?.reshape((samples, tokens))?)
            }
            None => None,
        };
        let host = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let lengths = match attention_mask {
            Some(m) => unpadded_lengths(m)?,
            None => vec![tokens; samples],
        };
        Ok(Self {
            keys: host(keys)?,
            values: values.map(host).transpose()?,
            mask: mask.as_ref().map(host).transpose()?,
            lengths,
            samples,
            tokens,
            dim,
            heads,
            value_dim,
            scale: scale as f32,
        })
    }

    fn sample_keys(&self, i: usize) -> &[f32] {
        let len = self.tokens * self.dim;
        &self.keys[i * len..(i + 1) * len]
    }

    /// Values of sample `i`, head `h`: (T, d_v).
    fn sample_values(&self, i: usize, h: usize) -> &[f32] {
        match &self.values {
            Some(v) => {
                let len = self.tokens * self.value_dim;
                let start = (i * self.heads + h) * len;
                &v[start..start + len]
            }
            None => self.sample_keys(i),
        }
    }

    fn sample_mask(&self, i: usize) -> Option<&[f32]> {
        self.mask
            .as_ref()
            .map(|m| &m[i * self.tokens..(i + 1) * self.tokens])
    }

    /// Attention of `queries` (B, H, D) with `bias` (B, H) over samples `rows`, differentiable in
    /// both. CPU: the fused op; elsewhere: [`Self::attend_reference`].
    pub fn attend(
        self: &Arc<Self>,
        queries: &Tensor,
        bias: &Tensor,
        rows: &[usize],
    ) -> Result<Attended> {
        if !queries.device().is_cpu() {
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
            context: out.narrow(D::Minus1, 0, self.value_dim)?,
            probs: out.narrow(D::Minus1, self.value_dim, self.tokens)?,
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
        let (t, d, h, dv) = (self.tokens, self.dim, self.heads, self.value_dim);
        let gather = |per_row: &dyn Fn(usize) -> Vec<f32>, shape: &[usize]| -> Result<Tensor> {
            let data: Vec<f32> = rows.iter().flat_map(|&i| per_row(i)).collect();
            Ok(Tensor::from_vec(data, shape, device)?)
        };
        let keys = gather(&|i| self.sample_keys(i).to_vec(), &[b, t, d])?;
        let values = gather(
            &|i| {
                (0..h)
                    .flat_map(|k| self.sample_values(i, k).to_vec())
                    .collect()
            },
            &[b, h, t, dv],
        )?;
        let scores = queries
            .matmul(&keys.transpose(1, 2)?)?
            .broadcast_add(&bias.unsqueeze(2)?)?;
        let scores = (scores * f64::from(self.scale))?;
        let scores = match &self.mask {
            Some(_) => scores.broadcast_add(&gather(
                &|i| self.sample_mask(i).unwrap().to_vec(),
                &[b, 1, t],
            )?)?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?; // (B, H, T)
        let context = probs.unsqueeze(2)?.matmul(&values)?.squeeze(2)?; // (B, H, d_v)
        Ok(Attended { context, probs })
    }

    fn check(&self, queries: &Tensor, bias: &Tensor, rows: &[usize]) -> Result<()> {
        let (b, h, d) = queries.dims3()?;
        ensure!(
            (h, d) == (self.heads, self.dim) && bias.dims() == [b, h] && rows.len() == b,
            "attend: queries {:?}, bias {:?} and {} rows do not fit keys of {} heads × {d}",
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

    /// Raw scores rₕ·kₜ of every head of sample `i` for its first `lengths[i]` = L tokens:
    /// (H, D) × (L, D)ᵀ → the first L columns of (H, T), one GEMM.
    fn scores(&self, i: usize, queries: &[f32], scores: &mut [f32]) {
        let (h, t, d) = (self.heads, self.tokens, self.dim);
        // S (row-major H×T) = R (row-major H×D) · Kᵀ, Kᵀ read in place from K (row-major T×D).
        matmul(
            (h, self.lengths[i], d),
            (scores, t),
            (queries, d as isize, 1),
            (self.sample_keys(i), 1, d as isize),
        );
    }

    /// Raw scores → probabilities in place: scale·(s + c) + mask, then softmax over the first
    /// L tokens; the trailing padding is set to exactly 0 (what its −∞ mask gives).
    fn softmax(&self, i: usize, c: f32, probs: &mut [f32]) {
        let (probs, padding) = probs.split_at_mut(self.lengths[i]);
        padding.fill(0.0);
        probs.iter_mut().for_each(|p| *p = self.scale * (*p + c));
        if let Some(mask) = self.sample_mask(i) {
            probs.iter_mut().zip(mask).for_each(|(p, m)| *p += m);
        }
        let max = probs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for p in probs.iter_mut() {
            *p = (*p - max).exp();
            total += *p;
        }
        probs.iter_mut().for_each(|p| *p /= total);
    }
}

/// Tokens of each row of a 0/1 padding mask (N, T) up to its last unmasked one (all T when
/// none is unmasked): what is left once the trailing padding is cut.
pub fn unpadded_lengths(attention_mask: &Tensor) -> Result<Vec<usize>> {
    let tokens = attention_mask.dim(D::Minus1)?;
    let mask: Vec<f32> = attention_mask
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    Ok(mask
        .chunks_exact(tokens)
        .map(|row| {
            row.iter()
                .rposition(|&v| v != 0.0)
                .map_or(tokens, |last| last + 1)
        })
        .collect())
}

/// dst (m×n, row stride `dst_rs`) = lhs (m×k) · rhs (k×n), each operand given as (data, row
/// stride, column stride): gemm's AVX-512/AVX2 kernels, single-threaded (callers parallelise
/// over samples).
fn matmul(
    (m, n, k): (usize, usize, usize),
    (dst, dst_rs): (&mut [f32], usize),
    (lhs, lhs_rs, lhs_cs): (&[f32], isize, isize),
    (rhs, rhs_rs, rhs_cs): (&[f32], isize, isize),
) {
    let last = |rs: isize, cs: isize, rows: usize, cols: usize| {
        (rs * (rows as isize - 1) + cs * (cols as isize - 1)) as usize
    };
    assert!(
        m > 0
            && n > 0
            && k > 0
            && dst.len() > last(dst_rs as isize, 1, m, n)
            && lhs.len() > last(lhs_rs, lhs_cs, m, k)
            && rhs.len() > last(rhs_rs, rhs_cs, k, n),
        "matmul operands out of bounds"
    );
    // SAFETY: the assertion keeps every element gemm touches inside the slices; dst is borrowed
    // mutably, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            false,
            lhs.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A dot product with independent partial sums, so that it vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut partial = [0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for k in 0..LANES {
            partial[k] += x[k] * y[k];
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// y += a·x.
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// The fused forward/backward over rows of a [`KeyValues`]. Output (B, H, d_v + T): the context
/// followed by the probabilities, so that both are differentiable outputs of one op.
struct FusedAttend {
    store: Arc<KeyValues>,
    rows: Vec<usize>,
}

fn contiguous_f32<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("fused attention: f32 only")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("fused attention: contiguous inputs only")
    };
    Ok(&data[start..end])
}

impl CustomOp2 for FusedAttend {
    fn name(&self) -> &'static str {
        "fused-cached-attention"
    }

    fn cpu_fwd(
        &self,
        queries: &CpuStorage,
        queries_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (queries, bias) = (
            contiguous_f32(queries, queries_layout)?,
            contiguous_f32(bias, bias_layout)?,
        );
        let kv = &self.store;
        let (h, d, t, dv) = (kv.heads, kv.dim, kv.tokens, kv.value_dim);
        let width = dv + t;
        let mut out = vec![0f32; self.rows.len() * h * width];
        out.par_chunks_mut(h * width)
            .zip(&self.rows)
            .enumerate()
            .for_each(|(b, (sample_out, &i))| {
                let mut scores = vec![0f32; h * t];
                kv.scores(i, &queries[b * h * d..(b + 1) * h * d], &mut scores);
                for (k, head_out) in sample_out.chunks_mut(width).enumerate() {
                    let (context, probs) = head_out.split_at_mut(dv);
                    probs.copy_from_slice(&scores[k * t..(k + 1) * t]);
                    kv.softmax(i, bias[b * h + k], probs);
                    let values = kv.sample_values(i, k);
                    for (tt, &p) in probs[..kv.lengths[i]].iter().enumerate() {
                        axpy(p, &values[tt * dv..(tt + 1) * dv], context);
                    }
                }
            });
        Ok((
            CpuStorage::F32(out),
            Shape::from((self.rows.len(), h, width)),
        ))
    }

    /// With g = ∂L/∂context and γ = ∂L/∂p: ∂L/∂pₜ = g·vₜ + γₜ, ∂L/∂sₜ = pₜ(∂L/∂pₜ − Σᵤ pᵤ ∂L/∂pᵤ),
    /// ∂L/∂r = scale Σₜ (∂L/∂sₜ) kₜ, ∂L/∂c = scale Σₜ ∂L/∂sₜ.
    fn bwd(
        &self,
        queries: &Tensor,
        _bias: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let kv = &self.store;
        let (h, d, t, dv) = (kv.heads, kv.dim, kv.tokens, kv.value_dim);
        let width = dv + t;
        let res = res.flatten_all()?.to_vec1::<f32>()?;
        let grad = grad_res.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let b = self.rows.len();
        let mut grad_queries = vec![0f32; b * h * d];
        let mut grad_bias = vec![0f32; b * h];
        grad_queries
            .par_chunks_mut(h * d)
            .zip(grad_bias.par_chunks_mut(h))
            .zip(&self.rows)
            .enumerate()
            .for_each(|(bi, ((gq, gc), &i))| {
                let mut dscores = vec![0f32; h * t];
                // Past L every probability is 0, and so is every ∂L/∂s.
                let len = kv.lengths[i];
                for k in 0..h {
                    let at = (bi * h + k) * width;
                    let (g_context, g_probs) = grad[at..at + width].split_at(dv);
                    let probs = &res[at + dv..at + width];
                    let values = kv.sample_values(i, k);
                    let ds = &mut dscores[k * t..(k + 1) * t];
                    let mut weighted = 0.0;
                    for tt in 0..len {
                        ds[tt] = dot(g_context, &values[tt * dv..(tt + 1) * dv]) + g_probs[tt];
                        weighted += probs[tt] * ds[tt];
                    }
                    let mut sum = 0.0;
                    for tt in 0..len {
                        ds[tt] = kv.scale * probs[tt] * (ds[tt] - weighted);
                        sum += ds[tt];
                    }
                    gc[k] = sum;
                }
                // ∂L/∂R (H×D) = ∂L/∂S (H×L) · K (L×D).
                matmul(
                    (h, d, len),
                    (gq, d),
                    (&dscores, t as isize, 1),
                    (kv.sample_keys(i), d as isize, 1),
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    fn random(shape: &[usize], rng: &mut rand_chacha::ChaCha8Rng) -> Tensor {
        let normal = Normal::new(0f32, 1.0).unwrap();
        let len = shape.iter().product();
        let data: Vec<f32> = (0..len).map(|_| normal.sample(rng)).collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        let scale = b.abs().unwrap().max_all().unwrap();
        diff.to_scalar::<f32>().unwrap() / scale.to_scalar::<f32>().unwrap().max(1e-12)
    }

    /// The fused op and the generic ops agree on the outputs and on the gradients of a loss that
    /// reads both the context and the probabilities, with and without separate values and a mask.
    #[test]
    fn fused_matches_generic_ops() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (n, t, d, h, dv) = (5, 7, 20, 2, 6);
        let keys = random(&[n, t, d], &mut rng);
        let values = random(&[n, h, t, dv], &mut rng);
        let mut mask = vec![1f32; n * t];
        mask[t - 1] = 0.0;
        mask[2 * t - 2] = 0.0;
        let mask = Tensor::from_vec(mask, (n, t), &Device::Cpu).unwrap();
        let rows = [3, 0, 1, 0];
        for (values, mask, heads, width) in
            [(Some(&values), Some(&mask), h, dv), (None, None, 1, d)]
        {
            let kv = Arc::new(KeyValues::new(&keys, values, mask, 0.37).unwrap());
            let queries = Var::from_tensor(&random(&[4, heads, d], &mut rng)).unwrap();
            let bias = Var::from_tensor(&random(&[4, heads], &mut rng)).unwrap();
            let weights_c = random(&[4, heads, width], &mut rng);
            let weights_p = random(&[4, heads, t], &mut rng);
            let run = |fused: bool| {
                let out = if fused {
                    kv.attend(&queries, &bias, &rows).unwrap()
                } else {
                    kv.attend_reference(&queries, &bias, &rows).unwrap()
                };
                let loss = ((&out.context * &weights_c).unwrap().sum_all().unwrap()
                    + (&out.probs * &weights_p).unwrap().sum_all().unwrap())
                .unwrap();
                let grads = loss.backward().unwrap();
                (
                    out,
                    grads.get(&queries).unwrap().clone(),
                    grads.get(&bias).unwrap().clone(),
                )
            };
            let (fused, gq, gc) = run(true);
            let (reference, rq, rc) = run(false);
            assert!(max_rel(&fused.context, &reference.context) < 1e-5);
            assert!(max_rel(&fused.probs, &reference.probs) < 1e-5);
            assert!(max_rel(&gq, &rq) < 1e-5, "{}", max_rel(&gq, &rq));
            // Σₜ ∂L/∂sₜ = 0: the bias only shifts the scores, so both are rounding noise.
            let bias_diff = (&gc - &rc).unwrap().abs().unwrap().max_all().unwrap();
            assert!(bias_diff.to_scalar::<f32>().unwrap() < 1e-5);
        }
    }
}
