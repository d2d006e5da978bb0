//! Building blocks shared by the ViT and BERT encoders, in the Hugging Face tensor layout:
//! multi-head self-attention (HF's separate query/key/value weights, run as one fused product and
//! one fused attention pass on the CPU), LayerNorm, GELU and masks.

use candle_core::{CpuStorage, CustomOp1, D, Layout, Result, Shape, Tensor};
use candle_nn::{Activation, Linear, Module, VarBuilder};
use rayon::prelude::*;

/// Multi-head self-attention, `{query,key,value}.{weight,bias}` as in HF's ViT/BERT.
#[derive(Clone, Debug)]
pub struct SelfAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    /// The three projections as one (3D × D) product: one pass over the inputs instead of three.
    qkv: Linear,
    pub num_heads: usize,
    pub head_dim: usize,
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
            qkv: Linear::new(weight, bias),
            query,
            key,
            value,
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

    /// The attention context (B, T, D) before the output projection; `mask` is additive,
    /// (B, 1, 1, T). On the CPU (frozen inputs, f32) one product for Q, K and V, then
    /// [`FusedSelfAttention`]; elsewhere (CUDA, or with gradients) [`Self::forward_reference`].
    /// tests/fused_attention.rs checks the two against each other, also across devices.
    pub fn forward(&self, xs: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        if !(xs.device().is_cpu() && xs.dtype() == candle_core::DType::F32) || xs.track_op() {
            return self.forward_reference(xs, mask);
        }
        let (b, t, _) = xs.dims3()?;
        let qkv = self.qkv.forward(&xs.contiguous()?)?.contiguous()?; // (B, T, 3D)
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
                    // S (T×L) = Q_h (T×d_h, row stride 3D) · K_hᵀ.
                    gemm_into(
                        (t, len, self.head_dim),
                        (&mut scores, len),
                        (&qkv[q..], three_d as isize, 1),
                        (&qkv[k..], 1, three_d as isize),
                    );
                    for row in scores.chunks_mut(len) {
                        let mask = mask.map(|m| &m[..len]);
                        softmax(row, scale, mask);
                    }
                    // O_h (T×d_h, row stride D) = P (T×L) · V_h (L×d_h, row stride 3D).
                    gemm_into(
                        (t, self.head_dim, len),
                        (&mut out[h * self.head_dim..], d),
                        (&scores, len as isize, 1),
                        (&qkv[v..], three_d as isize, 1),
                    );
                }
            });
        Ok((CpuStorage::F32(out), Shape::from((b, t, d))))
    }
}

/// The f32 values of a custom op's contiguous CPU input; an error naming `op` otherwise.
pub(crate) fn contiguous_f32<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op}: f32 only")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op}: contiguous input only")
    };
    Ok(&data[start..end])
}

/// dst (m×n, row stride `dst_rs`) = lhs (m×k) · rhs (k×n), operands as (data, row stride, column
/// stride): gemm's kernels on one thread (callers parallelise over samples).
pub(crate) fn gemm_into(
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

/// A LayerNorm that keeps candle's fused kernel for frozen inference and switches to the
/// differentiable formula when its input tracks gradients (phase 2 trains through the last
/// layer's norms; the fused kernel has no backward).
#[derive(Clone, Debug)]
pub struct Norm {
    fused: candle_nn::LayerNorm,
    eps: f64,
}

impl Norm {
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

/// HF's extended attention mask: 0 where attended, the most negative f32 where padded, (B,1,1,T).
pub fn additive_mask(attention_mask: &Tensor) -> Result<Tensor> {
    let (b, t) = attention_mask.dims2()?;
    let keep = attention_mask.to_dtype(candle_core::DType::F32)?;
    ((1.0 - keep)? * f64::from(f32::MIN))?.reshape((b, 1, 1, t))
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

/// The block activation. HF's "gelu" is the exact (erf) GELU; on CPU it runs as [`GeluErf`]
/// (parallel, vectorisable) instead of candle's scalar single-threaded map.
pub fn activate(activation: Activation, xs: &Tensor) -> Result<Tensor> {
    match activation {
        Activation::Gelu if xs.device().is_cpu() && xs.dtype() == candle_core::DType::F32 => {
            xs.apply_op1(GeluErf)
        }
        other => other.forward(xs),
    }
}

/// e^x for x ≤ 88 with a relative error below 2e-7, exactly 0 below −87.3 (where e^x is under
/// f32's normal range; HF's most-negative mask must give probability 0): x = n·ln 2 + r with
/// ln 2 in two parts (Cody–Waite, so r keeps its precision), e^r by its degree-7 Taylor polynomial
/// (|r| ≤ ln 2 / 2), 2^n in the exponent bits. Unlike libm's expf it vectorises, which makes the
/// GELU and softmax loops several times faster.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x_in = x.clamp(-87.5, 88.0);
    let n = (x_in * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (x_in - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_668
                        + r * (0.008_333_334 + r * (0.001_388_889 + r * 0.000_198_412_7))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.3 { 0.0 } else { p * scale }
}

/// erf by Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7), the formula of PyTorch's vectorised CPU erf.
#[inline(always)]
fn erf_as(x: f32) -> f32 {
    let (a1, a2, a3, a4, a5, p) = (
        0.254_829_6_f32,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152,
        1.061_405_4,
        0.327_591_1,
    );
    let ax = x.abs();
    let t = 1.0 / (1.0 + p * ax);
    let y = 1.0 - ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t * fast_exp(-ax * ax);
    y.copysign(x)
}

/// Whether the CPU has AVX2 and FMA: the crate's baseline target is SSE2, so the element-wise
/// kernels below are also compiled for AVX2 + FMA and chosen at run time (gemm dispatches its own).
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// x·Φ(x) over a slice.
#[inline(always)]
fn gelu_kernel(src: &[f32], dst: &mut [f32]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = 0.5 * x * (1.0 + erf_as(x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// [`gelu_kernel`], vectorised for the CPU at hand.
fn gelu(src: &[f32], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(src: &[f32], dst: &mut [f32]) {
        gelu_kernel(src, dst)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(src, dst) };
    }
    gelu_kernel(src, dst)
}

/// [`softmax_kernel`], vectorised for the CPU at hand.
fn softmax(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
        softmax_kernel(row, scale, mask)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features `avx2` is compiled for.
        return unsafe { avx2(row, scale, mask) };
    }
    softmax_kernel(row, scale, mask)
}

/// Independent accumulators of the softmax's reductions: a running max or sum in one variable
/// is a serial chain the compiler may not reorder (float addition is not associative), which
/// left this kernel at 15 % of a ViT-Ti forward; eight lanes vectorise.
const LANES: usize = 8;

/// A softmax row in place: its scores times `scale` plus the additive `mask`, then normalised.
#[inline(always)]
fn softmax_kernel(row: &mut [f32], scale: f32, mask: Option<&[f32]>) {
    match mask {
        Some(m) => row.iter_mut().zip(m).for_each(|(s, m)| *s = *s * scale + m),
        None => row.iter_mut().for_each(|s| *s *= scale),
    }
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail_max = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, larger);
    for chunk in chunks {
        maxima.iter_mut().zip(chunk).for_each(|(m, &s)| *m = larger(*m, s));
    }
    let max = maxima.into_iter().fold(tail_max, larger);
    let mut sums = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (total, s) in sums.iter_mut().zip(chunk) {
            *s = fast_exp(*s - max);
            *total += *s;
        }
    }
    let mut total: f32 = sums.iter().sum();
    for s in chunks.into_remainder() {
        *s = fast_exp(*s - max);
        total += *s;
    }
    let inv = 1.0 / total;
    row.iter_mut().for_each(|s| *s *= inv);
}

/// x·Φ(x) with Φ(x) = (1 + erf(x/√2))/2, element-wise on f32, in parallel chunks, vectorised.
pub struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "gelu-erf-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let src = contiguous_f32(storage, layout, self.name())?;
        let mut dst = vec![0f32; src.len()];
        dst.par_chunks_mut(1 << 14)
            .zip(src.par_chunks(1 << 14))
            .for_each(|(out, xs)| gelu(xs, out));
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }

    /// d/dx x·Φ(x) = Φ(x) + x·φ(x).
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let cdf = ((arg * std::f64::consts::FRAC_1_SQRT_2)?.erf()? + 1.0)? * 0.5;
        let pdf = ((arg.sqr()? * -0.5)?.exp()?
            * (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2))?;
        Ok(Some(grad_res.mul(&(cdf? + (arg * pdf)?)?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn fast_exp_is_within_2e7_of_exp_and_zero_far_below() {
        let mut worst = 0f64;
        for k in 0..=200_000 {
            let x = -87.0 + 175.0 * k as f32 / 200_000.0;
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(fast_exp(x)) - exact).abs() / exact);
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(fast_exp(f32::MIN), 0.0);
        assert_eq!(fast_exp(-90.0), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }

    #[test]
    fn parallel_gelu_matches_candles_exact_gelu_and_its_gradient() {
        let xs = Tensor::new(
            (0..10_001)
                .map(|k| -6.0 + 12.0 * k as f32 / 10_000.0)
                .collect::<Vec<f32>>(),
            &Device::Cpu,
        )
        .unwrap();
        let ours: Vec<f32> = activate(Activation::Gelu, &xs).unwrap().to_vec1().unwrap();
        let exact: Vec<f32> = xs.gelu_erf().unwrap().to_vec1().unwrap();
        let worst = ours
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "max |Δ| {worst}");
        let var = Var::from_tensor(&xs).unwrap();
        let grads = activate(Activation::Gelu, var.as_tensor())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let ours: Vec<f32> = grads.get(&var).unwrap().to_vec1().unwrap();
        let grads = var
            .as_tensor()
            .gelu_erf()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let exact: Vec<f32> = grads.get(&var).unwrap().to_vec1().unwrap();
        let worst = ours
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "gradient max |Δ| {worst}");
    }
}
