//! Dense layers of the frozen backbone, in two forms: candle's `Linear` (extraction: large
//! B·T-row products, threaded, no backward; [`Dense::forward_then`] runs each as one product into
//! a buffer that already holds the bias and the residual) and [`FrozenLinear`] (phase 2: a few
//! CLS rows per step, differentiated with respect to the input only).
//!
//! Phase 2 backpropagates through the last layer's value, output and MLP projections and the
//! classifier, all frozen. candle's matmul backward also computes the gradient of the weight
//! operand, with a zeroed buffer and an add for it, and gemm re-packs a row-major weight on every
//! small product; measured on a TREC run these were over half of a phase-2 step. The frozen form
//! keeps the weight packed once in both orientations, Wᵀ for the forward and W for the backward
//! ([`PackedMatrix`]: gemm re-packed it on every call of a few rows), and its custom op returns
//! the input's gradient alone.

use std::sync::{Arc, OnceLock};

use anyhow::{Result, ensure};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Module, Shape, Tensor};
use candle_nn::{Activation, Linear};
use rayon::prelude::*;

use crate::kernels::{
    GeluErf, PackedMatrix, Precision, ProductPart, contiguous_f32, products_parallel, with_host_f32,
};

/// One of the backbone's dense layers.
#[derive(Clone, Debug)]
pub enum Dense {
    /// As loaded, for extraction.
    Linear(Arc<LoadedLinear>),
    /// Phase 2's form.
    Frozen(Arc<FrozenLinear>),
}

/// A dense layer as loaded: candle's layer, and for products on the host its weights in the
/// packed kernel's form.
#[derive(Debug)]
pub struct LoadedLinear {
    linear: Linear,
    /// What the host products compute in (`--precision`).
    precision: Precision,
    /// Made by the first host product: a second copy of the weight, which CUDA runs and runs
    /// from a warm cache never make.
    host: OnceLock<HostWeights>,
}

/// A layer's weights as every host product reads them.
#[derive(Debug)]
struct HostWeights {
    /// Wᵀ (in × out) in panels.
    packed: PackedMatrix,
    /// b, or zeros.
    bias: Vec<f32>,
}

impl HostWeights {
    fn of(linear: &Linear, precision: Precision) -> candle_core::Result<Self> {
        let (out_dim, in_dim) = linear.weight().dims2()?;
        let weight = linear.weight().contiguous()?;
        // Wᵀ: B[r][c] = W[c][r].
        let packed = with_host_f32(&weight, |w| {
            PackedMatrix::new_in(precision, w, (in_dim, out_dim), (1, in_dim))
        })?;
        let bias = match linear.bias() {
            Some(b) => b.to_vec1::<f32>()?,
            None => vec![0.0; out_dim],
        };
        Ok(Self { packed, bias })
    }
}

impl Module for Dense {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Linear(l) => l.linear.forward(xs),
            Self::Frozen(f) => f.forward(xs),
        }
    }
}

/// What the frozen forward does with a dense layer's output, in the product's own buffer.
#[derive(Clone, Copy, Debug)]
pub enum Then<'a> {
    /// x Wᵀ + b alone: the attention's fused Q, K and V.
    Nothing,
    /// `residual` + x Wᵀ + b: the blocks' skip connections.
    AddTo(&'a Tensor),
    /// `activation`(x Wᵀ + b): the MLP's first layer.
    Activate(Activation),
}

impl Dense {
    /// A layer as loaded.
    pub fn new(linear: Linear) -> Self {
        Self::Linear(Arc::new(LoadedLinear {
            linear,
            precision: Precision::F32,
            host: OnceLock::new(),
        }))
    }

    /// This layer with its extraction products in `precision` (phase 2's form keeps f32).
    pub fn in_precision(&self, precision: Precision) -> Self {
        match self {
            Self::Linear(l) if l.precision != precision => Self::Linear(Arc::new(LoadedLinear {
                linear: l.linear.clone(),
                precision,
                host: OnceLock::new(),
            })),
            other => other.clone(),
        }
    }

    /// x Wᵀ + b followed by `then`. Extraction (CPU, f32, nothing tracking gradients) runs it as
    /// one product into a buffer that starts as the bias (plus the residual), through the
    /// packed kernel in blocks of rows over all threads, with the GELU applied in place after:
    /// candle's path zeroes a fresh output, then reads and writes it again for the bias, the
    /// residual and the activation, each into a new tensor (perf: 6 % of a MiniLM forward in
    /// those passes and their zeroing), and gemm packs the weight on every call. Anything else
    /// (CUDA, phase 2's differentiated last layer) takes candle's ops.
    pub fn forward_then(&self, xs: &Tensor, then: Then) -> candle_core::Result<Tensor> {
        if let Self::Linear(layer) = self
            && let Some(ys) = host_product(layer, xs, then)?
        {
            return Ok(ys);
        }
        let ys = self.forward(xs)?;
        match then {
            Then::Nothing => Ok(ys),
            Then::AddTo(residual) => residual + ys,
            Then::Activate(activation) => activate(activation, &ys),
        }
    }

    /// The host form of a layer already in phase 2's form.
    pub fn as_frozen(&self) -> Option<&Arc<FrozenLinear>> {
        match self {
            Self::Frozen(f) => Some(f),
            Self::Linear(_) => None,
        }
    }

    /// The phase-2 form of this layer.
    pub fn frozen(&self) -> Result<Self> {
        Ok(match self {
            Self::Linear(l) => Self::Frozen(Arc::new(FrozenLinear::new(&l.linear, 1)?)),
            Self::Frozen(f) => Self::Frozen(Arc::clone(f)),
        })
    }
}

/// The block activation. HF's "gelu" is the exact (erf) GELU; on CPU it runs as [`GeluErf`]
/// (parallel, vectorisable) instead of candle's scalar single-threaded map.
pub fn activate(activation: Activation, xs: &Tensor) -> candle_core::Result<Tensor> {
    match activation {
        Activation::Gelu if xs.device().is_cpu() && xs.dtype() == candle_core::DType::F32 => {
            xs.apply_op1(GeluErf)
        }
        other => other.forward(xs),
    }
}

/// [`Dense::forward_then`] on the host, or None where it does not apply.
fn host_product(
    layer: &LoadedLinear,
    xs: &Tensor,
    then: Then,
) -> candle_core::Result<Option<Tensor>> {
    let linear = &layer.linear;
    let host = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32 && !t.track_op();
    let (out_dim, in_dim) = linear.weight().dims2()?;
    let Some((&last, batch_dims)) = xs.dims().split_last() else {
        return Ok(None);
    };
    let out_dims = [batch_dims, &[out_dim]].concat();
    let applies = last == in_dim
        && host(xs)
        && host(linear.weight())
        && linear.bias().is_none_or(host)
        && match then {
            Then::Nothing => true,
            Then::AddTo(residual) => host(residual) && residual.dims() == out_dims,
            Then::Activate(activation) => matches!(activation, Activation::Gelu),
        };
    if !applies {
        return Ok(None);
    }
    let rows: usize = batch_dims.iter().product();
    let weights = match layer.host.get() {
        Some(weights) => weights,
        // Two threads may pack at once; the first one's copy is kept.
        None => {
            let weights = HostWeights::of(linear, layer.precision)?;
            layer.host.get_or_init(|| weights)
        }
    };
    let mut ys = match then {
        Then::AddTo(residual) => with_host_f32(&residual.contiguous()?, |r| {
            product_start(&weights.bias, Some(r), rows)
        })?,
        _ => product_start(&weights.bias, None, rows),
    };
    let xs = xs.contiguous()?;
    with_host_f32(&xs, |x| {
        // Blocks of rows are independent: a row's numbers do not depend on the threads.
        let task_rows = weights.packed.task_rows(HOST_ROWS);
        x.par_chunks(task_rows * in_dim)
            .zip(ys.par_chunks_mut(task_rows * out_dim))
            .for_each(|(x, y)| {
                let rows = x.len() / in_dim;
                weights.packed.product_add(rows, (x, in_dim), (y, out_dim));
                if let Then::Activate(_) = then {
                    gelu_in_place(y);
                }
            })
    })?;
    Tensor::from_vec(ys, out_dims, xs.device()).map(Some)
}

/// Rows a task of an extraction product takes: each streams the packed weight once per block
/// of rows, whose inputs stay in L1/L2 meanwhile. In a probe on one AVX2 machine, 48 and 24
/// ran alike on one thread (each ahead at some shapes), and 48 on two threads beat gemm's
/// threaded product at every ViT-Ti, MiniLM and ViT-B shape. The AMX tiles take more
/// ([`PackedMatrix::task_rows`]).
const HOST_ROWS: usize = 48;

/// The exact GELU over `values` in place, a cache-sized piece at a time.
fn gelu_in_place(values: &mut [f32]) {
    const PIECE: usize = 1024;
    let mut pre_activation = [0f32; PIECE];
    for piece in values.chunks_mut(PIECE) {
        let pre_activation = &mut pre_activation[..piece.len()];
        pre_activation.copy_from_slice(piece);
        crate::kernels::gelu(pre_activation, piece);
    }
}

/// `rows` rows of `bias` (+ the residual's rows): the buffer a product adds to, written once
/// (no zeroing first).
fn product_start(bias: &[f32], residual: Option<&[f32]>, rows: usize) -> Vec<f32> {
    let width = bias.len();
    let mut ys = Vec::with_capacity(rows * width);
    ys.spare_capacity_mut()[..rows * width]
        .par_chunks_mut(width)
        .enumerate()
        .for_each(|(row, y)| match residual {
            Some(r) => {
                let r = &r[row * width..(row + 1) * width];
                for ((y, b), r) in y.iter_mut().zip(bias).zip(r) {
                    y.write(b + r);
                }
            }
            None => {
                for (y, &b) in y.iter_mut().zip(bias) {
                    y.write(b);
                }
            }
        });
    // SAFETY: the loop above wrote all rows·width values.
    unsafe { ys.set_len(rows * width) };
    ys
}

/// y = x Wᵀ + b with W constant, over rows of x; with `groups` G > 1 the input is (…, G, in)
/// and group g meets output rows g·out/G..(g+1)·out/G of W alone (the per-head value projection
/// of pooled tokens).
#[derive(Debug)]
pub struct FrozenLinear {
    /// Per group, W_gᵀ (in × out/G) packed once, read by the forward.
    forward_packed: Vec<PackedMatrix>,
    /// Per group, W_g (out/G × in) packed once, read by the backward: ∂L/∂x = ∂L/∂y W.
    backward_packed: Vec<PackedMatrix>,
    bias: Option<Vec<f32>>,
    in_dim: usize,
    out_dim: usize,
    groups: usize,
    /// The layer as candle holds it: the route on devices other than the CPU.
    linear: Linear,
}

impl FrozenLinear {
    pub fn new(linear: &Linear, groups: usize) -> Result<Self> {
        let (out_dim, in_dim) = linear.weight().dims2()?;
        ensure!(
            groups >= 1 && out_dim % groups == 0,
            "a dense layer of {out_dim} outputs does not split into {groups} groups"
        );
        let weight: Vec<f32> = linear.weight().flatten_all()?.to_vec1()?;
        let o = out_dim / groups;
        // W_g is rows g·o..(g+1)·o of W (out × in, row-major).
        let block = |g: usize| &weight[g * o * in_dim..(g + 1) * o * in_dim];
        let forward_packed = (0..groups)
            .map(|g| PackedMatrix::new(block(g), (in_dim, o), (1, in_dim)))
            .collect();
        let backward_packed = (0..groups)
            .map(|g| PackedMatrix::new(block(g), (o, in_dim), (in_dim, 1)))
            .collect();
        let bias = linear.bias().map(|b| b.to_vec1::<f32>()).transpose()?;
        Ok(Self {
            forward_packed,
            backward_packed,
            bias,
            in_dim,
            out_dim,
            groups,
            linear: linear.clone(),
        })
    }

    /// (…, in) → (…, out); with groups, (…, G, in) → (…, out).
    pub fn forward(self: &Arc<Self>, xs: &Tensor) -> candle_core::Result<Tensor> {
        let dims = xs.dims();
        let grouped_dims = if self.groups > 1 { 2 } else { 1 };
        if dims.len() < grouped_dims
            || dims[dims.len() - 1] != self.in_dim
            || (self.groups > 1 && dims[dims.len() - 2] != self.groups)
        {
            candle_core::bail!(
                "frozen dense layer ({} groups of {} → {}): input {dims:?}",
                self.groups,
                self.in_dim,
                self.out_dim
            )
        }
        let mut out_dims = dims[..dims.len() - grouped_dims].to_vec();
        out_dims.push(self.out_dim);
        if !xs.device().is_cpu() {
            return self.generic(xs, &out_dims);
        }
        let rows: usize = dims[..dims.len() - grouped_dims].iter().product();
        xs.contiguous()?
            .reshape((rows, self.groups * self.in_dim))?
            .apply_op1(FrozenProduct(Arc::clone(self)))?
            .reshape(out_dims)
    }

    /// y = x Wᵀ + b on host rows: x (rows, G·in) → y (rows, out), y overwritten.
    pub(crate) fn forward_rows(&self, x: &[f32], y: &mut [f32], across_threads: bool) {
        let (g, i, out) = (self.groups, self.in_dim, self.out_dim);
        let o = out / g;
        let rows = x.len() / (g * i);
        debug_assert_eq!(y.len(), rows * out);
        // y[:, group] (rows×o, row stride out) = x[:, group] (rows×in) · W_groupᵀ.
        let parts = self
            .forward_packed
            .iter()
            .enumerate()
            .map(|(group, packed)| ProductPart {
                matrix: packed,
                a: &x[group * i..],
                column: group * o,
            });
        products(parts, rows, g * i, (y, out), across_threads);
        if let Some(bias) = &self.bias {
            for row in y.chunks_exact_mut(out) {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
        }
    }

    /// ∂L/∂x from ∂L/∂y on host rows: dy (rows, out) → dx (rows, G·in), dx overwritten.
    pub(crate) fn backward_rows(&self, dy: &[f32], dx: &mut [f32], across_threads: bool) {
        let (g, i, out) = (self.groups, self.in_dim, self.out_dim);
        let o = out / g;
        let rows = dy.len() / out;
        debug_assert_eq!(dx.len(), rows * g * i);
        // ∂L/∂x[:, group] (rows×in, row stride G·in) = ∂L/∂y[:, group] (rows×o) · W_group (o×in).
        let parts = self
            .backward_packed
            .iter()
            .enumerate()
            .map(|(group, packed)| ProductPart {
                matrix: packed,
                a: &dy[group * o..],
                column: group * i,
            });
        products(parts, rows, out, (dx, g * i), across_threads);
    }

    /// Bytes of its packed weights, forward and transposed: what a product over all of its
    /// columns reads.
    pub(crate) fn packed_bytes(&self) -> usize {
        2 * self.out_dim * self.in_dim * std::mem::size_of::<f32>()
    }

    /// Rows of the output, (G·)in of the input.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.out_dim, self.groups * self.in_dim)
    }

    /// The same function from candle's ops (any device).
    fn generic(&self, xs: &Tensor, out_dims: &[usize]) -> candle_core::Result<Tensor> {
        if self.groups == 1 {
            return self.linear.forward(xs);
        }
        let (g, o, i) = (self.groups, self.out_dim / self.groups, self.in_dim);
        let rows: usize = out_dims[..out_dims.len() - 1].iter().product();
        // (G, rows, in) × (G, in, out/G) → (rows, G, out/G).
        let w = self.linear.weight().reshape((g, o, i))?.transpose(1, 2)?;
        let mut ys = xs
            .reshape((rows, g, i))?
            .transpose(0, 1)?
            .contiguous()?
            .matmul(&w.contiguous()?)?
            .transpose(0, 1)?
            .reshape((rows, g * o))?;
        if let Some(b) = self.linear.bias() {
            ys = ys.broadcast_add(b)?;
        }
        ys.reshape(out_dims)
    }
}

/// The product of a [`FrozenLinear`] as candle's custom op.
struct FrozenProduct(Arc<FrozenLinear>);

/// The groups' products into their columns of dst, group by group on this thread, or all their
/// columns shared out over the pool's threads in one go.
fn products<'a>(
    parts: impl Iterator<Item = ProductPart<'a>>,
    rows: usize,
    a_stride: usize,
    (dst, dst_stride): (&mut [f32], usize),
    across_threads: bool,
) {
    if across_threads {
        let parts: Vec<ProductPart> = parts.collect();
        products_parallel(&parts, rows, a_stride, (dst, dst_stride));
    } else {
        for part in parts {
            let dst = (&mut dst[part.column..], dst_stride);
            part.matrix.product(rows, (part.a, a_stride), dst);
        }
    }
}

impl CustomOp1 for FrozenProduct {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    /// x (rows, G·in) → y (rows, out).
    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(storage, layout, self.name())?;
        let layer = &self.0;
        let rows = x.len() / (layer.groups * layer.in_dim);
        let mut y = vec![0f32; rows * layer.out_dim];
        layer.forward_rows(x, &mut y, false);
        Ok((CpuStorage::F32(y), Shape::from((rows, layer.out_dim))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let layer = &self.0;
        let mut grad_x = vec![0f32; grad.len() / layer.out_dim * layer.groups * layer.in_dim];
        layer.backward_rows(&grad, &mut grad_x, false);
        Ok(Some(Tensor::from_vec(grad_x, arg.shape(), arg.device())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn random(shape: &[usize], seed: u64) -> Tensor {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Normal};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let len = shape.iter().product();
        let values: Vec<f32> = (0..len)
            .map(|_| Normal::new(0.0f32, 1.0).unwrap().sample(&mut rng))
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn linear(out: usize, inp: usize) -> Linear {
        Linear::new(random(&[out, inp], 1), Some(random(&[out], 2)))
    }

    fn close(a: &Tensor, b: &Tensor) {
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        let diff = diff.to_scalar::<f32>().unwrap();
        assert!(diff < 1e-4, "max difference {diff}");
    }

    /// Extraction's one-buffer product computes candle's ops: the residual added, the GELU
    /// applied, with and without a bias; inputs that track gradients keep candle's ops.
    #[test]
    fn then_matches_candles_ops_and_leaves_gradients_to_them() {
        // 122 rows: two full blocks of HOST_ROWS and a partial one.
        let x = random(&[2, 61, 32], 7);
        let residual = random(&[2, 61, 48], 8);
        for layer in [
            linear(48, 32),
            Linear::new(linear(48, 32).weight().clone(), None),
        ] {
            let plain = layer.forward(&x).unwrap();
            let dense = Dense::new(layer);
            close(&dense.forward_then(&x, Then::Nothing).unwrap(), &plain);
            let added = dense.forward_then(&x, Then::AddTo(&residual)).unwrap();
            close(&added, &(&residual + &plain).unwrap());
            let activated = dense
                .forward_then(&x, Then::Activate(Activation::Gelu))
                .unwrap();
            assert_eq!(activated.dims(), [2, 61, 48]);
            close(&activated, &plain.gelu_erf().unwrap());
        }
        let bad = random(&[2, 61, 47], 9);
        assert!(
            Dense::new(linear(48, 32))
                .forward_then(&x, Then::AddTo(&bad))
                .is_err(),
            "a residual of the wrong shape is an error, not a wrong sum"
        );
        let tracked = Var::from_tensor(&x).unwrap();
        let y = Dense::new(linear(48, 32))
            .forward_then(tracked.as_tensor(), Then::AddTo(&residual))
            .unwrap();
        assert!(y.track_op(), "a differentiated input keeps its gradient");
    }

    /// The frozen form computes candle's `Linear` and its input gradient, on (B, 1, D) rows as
    /// the last layer feeds it.
    #[test]
    fn matches_linear_and_its_input_gradient() {
        let dense = Dense::new(linear(48, 32));
        let frozen = dense.frozen().unwrap();
        let x = Var::from_tensor(&random(&[5, 1, 32], 3)).unwrap();
        let weights = random(&[5, 1, 48], 4);
        let grad = |layer: &Dense| {
            let y = layer.forward(x.as_tensor()).unwrap();
            let loss = (&y * &weights).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            (y, grads.get(x.as_tensor()).unwrap().clone())
        };
        let (y_ref, g_ref) = grad(&dense);
        let (y, g) = grad(&frozen);
        assert_eq!(y.dims(), [5, 1, 48]);
        close(&y, &y_ref);
        close(&g, &g_ref);
    }

    /// With groups, group g meets its own block of output rows: the per-head value projection.
    #[test]
    fn groups_project_each_head_by_its_block() {
        let (heads, dh, d) = (3, 4, 6);
        let layer = Arc::new(FrozenLinear::new(&linear(heads * dh, d), heads).unwrap());
        let x = Var::from_tensor(&random(&[2, heads, d], 5)).unwrap();
        let weights = random(&[2, heads * dh], 6);
        let run = |forward: &dyn Fn(&Tensor) -> Tensor| {
            let y = forward(x.as_tensor());
            let grads = (&y * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            (y, grads.get(x.as_tensor()).unwrap().clone())
        };
        let (y, g) = run(&|x| layer.forward(x).unwrap());
        let (y_ref, g_ref) = run(&|x| layer.generic(x, &[2, heads * dh]).unwrap());
        close(&y, &y_ref);
        close(&g, &g_ref);
        // Head 1's output block depends on head 1's input alone.
        let block = y.narrow(1, dh, dh).unwrap();
        let by_hand = x
            .as_tensor()
            .narrow(1, 1, 1)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .matmul(
                &layer
                    .linear
                    .weight()
                    .narrow(0, dh, dh)
                    .unwrap()
                    .t()
                    .unwrap(),
            )
            .unwrap()
            .broadcast_add(&layer.linear.bias().unwrap().narrow(0, dh, dh).unwrap())
            .unwrap();
        close(&block, &by_hand);
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
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        };
        let ours: Vec<f32> = activate(Activation::Gelu, &xs).unwrap().to_vec1().unwrap();
        let exact: Vec<f32> = xs.gelu_erf().unwrap().to_vec1().unwrap();
        let values = worst(&ours, &exact);
        assert!(values < 1e-6, "max |Δ| {values}");
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
        let gradients = worst(&ours, &exact);
        assert!(gradients < 1e-5, "gradient max |Δ| {gradients}");
    }
}
