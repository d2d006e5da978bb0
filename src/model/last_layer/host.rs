//! The CLS pass of [`LastLayer`] written out by hand on the host: the forward, the cross-entropy
//! and the backward to the query and key, with no autograd.
//!
//! A phase-2 step is a few CLS rows (16 by default) through a dozen small operations. Through
//! candle's autograd every operation allocates its output and its gradient, the LayerNorms take
//! the slow differentiable formula, and the frozen weights' gradients the graph would compute are
//! thrown away; at ViT-Ti that bookkeeping cost more than the arithmetic. Here each operation is a
//! loop or one gemm over flat rows, the backward stops at the query and key, and the tokens are
//! read by the same per-sample kernels as the fused attention op ([`KeyValues`]). The candle route
//! ([`LastLayer::forward_resident`], differentiated) stays the reference: tests/host_step.rs holds
//! the two equal in logits, loss and every gradient.
//!
//! With x̂₀ the normed CLS input, q₀ = x̂₀W_Qᵀ + b_Q; per head rₕ = q₀ₕW_Kₕ and cₕ = q₀ₕ·b_Kₕ; the
//! attention pools the tokens into pooledₕ; context = pooled W_Vᵀ + b_V per head; then the rest
//! of the layer, which differs between the backbones only in where the MLP's residual starts:
//!
//!   ViT (pre-LN):   h = x₀ + O(context);  a = N₁(h);  z = N₂(h + MLP(a))
//!   BERT (post-LN): h = x₀ + O(context);  a = N₁(h);  z = N₂(a + MLP(a))
//!
//! and the classifier (BERT's pooler, tanh, first when the checkpoint has one).

use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use rayon::prelude::*;

use super::{LastLayer, QueryKey, Rest};
use crate::encoder::dense::FrozenLinear;
use crate::encoder::layers::Norm;
use crate::kernels::{
    gelu, gelu_backward, gemm_into as matmul, mean_and_inv_std, mean_and_inv_std_rows,
};
use crate::model::attend::KeyValues;
use crate::model::token_products::{Rows, Tokens, row_scores};

/// A LayerNorm's parameters on the host.
struct HostNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

/// What a LayerNorm's backward needs of its forward: the normalised rows and 1/σ per row.
#[derive(Default)]
struct NormTrace {
    normalised: Vec<f32>,
    inv_std: Vec<f32>,
}

impl HostNorm {
    fn new(norm: &Norm) -> Result<Self> {
        let (weight, bias, eps) = norm.host_parts()?;
        Ok(Self {
            weight,
            bias,
            eps: eps as f32,
        })
    }

    /// y = (x − μ)/√(σ² + ε)·γ + β per row, as candle's `layer_norm_slow`.
    fn forward(&self, x: &[f32], y: &mut [f32]) -> NormTrace {
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
    fn normalise_in_place(&self, x: &mut [f32]) {
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
    fn backward(&self, trace: &NormTrace, dy: &[f32], dx: &mut [f32]) {
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

/// Where the MLP's residual branch starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Residual {
    /// ViT: the sum before the first norm.
    BeforeNorm,
    /// BERT: the first norm's output.
    AfterNorm,
}

/// The frozen layer after the attention, and the classifier, on the host.
pub(super) struct HostLayer {
    /// What the attention reads of its input: ViT's LayerNorm before it; BERT reads X itself.
    pre_norm: Option<HostNorm>,
    value: Arc<FrozenLinear>,
    output: Arc<FrozenLinear>,
    first_norm: HostNorm,
    intermediate: Arc<FrozenLinear>,
    mlp_output: Arc<FrozenLinear>,
    second_norm: HostNorm,
    residual: Residual,
    pooler: Option<Arc<FrozenLinear>>,
    classifier: Arc<FrozenLinear>,
    heads: usize,
    head_dim: usize,
    hidden: usize,
    classes: usize,
    /// How a step's or an evaluation's rows are shared out over the threads.
    pub(super) spread: HostSpread,
}

/// The trained parameters, read in place from their CPU storage.
pub(super) struct HostQk<'a> {
    pub(super) wq: &'a [f32],
    pub(super) bq: &'a [f32],
    pub(super) wk: &'a [f32],
    pub(super) bk: &'a [f32],
}

/// The CLS rows of a batch: the layer input x₀ and what the attention reads of it, x̂₀ (B, D).
pub(super) struct ClsRows<'a> {
    pub(super) inputs: &'a [f32],
    pub(super) normed: &'a [f32],
}

/// How the host pass shares a step's or an evaluation's rows out over the threads. Both give
/// every row the same numbers, bit for bit (tests/last_layer_equivalence.rs), on any number of
/// threads; they differ in what each thread reads from memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostSpread {
    /// Chunks of rows ([`CHUNK`] for a step, [`EVAL_CHUNK`] for an evaluation), each on one
    /// thread from its forward to its backward: a chunk's tokens stay in that core's caches in
    /// between, and each thread reads every frozen weight for its rows. Best while the weights
    /// fit the caches (ViT-Ti: 3 MB with their transposes; a ViT-Ti epoch took 20–25 ms this way
    /// against 22–27 ms the other, two builds alternately on machine E).
    Chunks,
    /// All rows through each operation together, its work shared out: the frozen products by
    /// their columns (each thread reads its part of the weights once for all the rows,
    /// [`crate::kernels::products_parallel`]), the attention by samples, the per-head rₕ by
    /// groups of [`QUERY_ROWS`]. At ViT-B's width the frozen weights (47 MB with their
    /// transposes) fit no cache, and in chunks each thread streamed them all from memory for its 8
    /// rows: a ViT-B-size epoch on 2 threads took a median 0.36 s in chunks and 0.32 s this way
    /// (`scale`'s child, five runs each, two builds alternately on machine E).
    Operations,
}

impl HostSpread {
    /// The spread for a layer whose frozen products hold `weight_bytes` (forward and transposed
    /// packs): chunks while they are well inside a last-level cache.
    fn for_weights(weight_bytes: usize) -> Self {
        const CACHED: usize = 16 << 20;
        if weight_bytes <= CACHED {
            Self::Chunks
        } else {
            Self::Operations
        }
    }

    /// Rows a chunk holds when `rows` go through together and chunks of `chunk` rows is the
    /// chunked spread's size.
    fn chunk_rows(self, chunk: usize, rows: usize) -> usize {
        match self {
            Self::Chunks => chunk,
            Self::Operations => rows.max(1),
        }
    }

    /// The fewest items a parallel loop inside an operation hands one thread: all of them in
    /// chunks (the chunks are what run in parallel), one otherwise.
    fn min_len(self) -> usize {
        match self {
            Self::Chunks => usize::MAX,
            Self::Operations => 1,
        }
    }
}

/// Rows a chunk of a step holds ([`HostSpread::Chunks`]). The chunk's size is fixed, not the
/// thread count's, so the products see the same shapes however many threads there are.
const CHUNK: usize = 8;

/// Rows a chunk of an evaluation holds ([`HostSpread::Chunks`]): with no backward to keep tokens
/// in cache for, larger chunks make fewer and larger products. A multiple of 6, the rows a frozen
/// product takes at once ([`crate::kernels::PackedMatrix`]), and half of the 48 rows an
/// evaluation hands over at a time (`train::loops`), so that two cores share them evenly.
const EVAL_CHUNK: usize = 24;

/// Rows whose cross-entropies are summed together before the groups' sums are added, in either
/// spread: a row's share of the loss then does not depend on the spread, the chunk or the threads
/// (the frozen products, the attention, the scores kernel and gemm give a row the same numbers
/// whatever rows are beside it).
const LOSS_ROWS: usize = 8;

/// Rows whose per-head query directions rₕ = q₀ₕ W_Kₕ go through gemm together. gemm gives a row
/// the same numbers whatever rows are beside it, up to 48 of them at the host pass's shapes
/// (`kernels::tests::gemm_rows_do_not_depend_on_the_rows_beside_them`), and re-packs W_Kₕ at every
/// call: a step's 16 rows of ViT-B's rₕ took 296–455 µs in one group against 355–650 µs in two of 8
/// (best of 40 to mean; one thread, a probe cycling over 8 keys, machine G, 2026-11-27). An
/// evaluation's 48 rows go in three groups, which the threads share.
///
/// The two trained products whose entries are dot products of rows (x̂₀ W_Qᵀ, ∂L/∂rₕ W_Kₕ) go
/// through the attention's scores kernel, which reads the weights in place: at 8 rows of ViT-B's
/// width gemm took 410–430 µs for each, re-packing the weight, and the kernel 180–200 µs
/// (machine E, 2026-11-26). Their numbers depend on no group, so they take all the rows at once
/// and read each weight once ([`HostLayer::against_rows`]). rₕ stays with gemm (200–220 µs
/// against the weighted-sums kernel's 280–300). Packing the query and key once per step for the
/// frozen products' kernel was tried too: the same numbers, but three fresh 2.4 MB matrices per
/// step slowed a ViT-B-size epoch (0.52–0.56 → 0.55–0.71 s on one thread, `scale`'s child, two
/// builds alternately).
const QUERY_ROWS: usize = 16;

/// What the backward of one chunk leaves for the weight gradients (or, joined, of the batch).
#[derive(Default)]
struct ChunkGradients {
    /// Σ of the rows' cross-entropies.
    loss_sum: f32,
    /// (rows, D)
    q0: Vec<f32>,
    /// ∂L/∂r (rows, H, D)
    grad_queries: Vec<f32>,
    /// ∂L/∂c (rows, H)
    grad_bias: Vec<f32>,
    /// ∂L/∂q₀ (rows, D)
    grad_q0: Vec<f32>,
    /// The rows evaluated at the look-ahead's parameters.
    evaluated: Option<Evaluated>,
}

/// What one chunk of a step reads: the parameters trained, those it evaluates its rows at as
/// well (the look-ahead), and its rows.
#[derive(Clone, Copy)]
struct ChunkStep<'a> {
    qk: &'a HostQk<'a>,
    look_ahead: Option<&'a HostQk<'a>>,
    cls: &'a ClsRows<'a>,
    tokens: &'a KeyValues,
    rows: &'a [usize],
}

impl ClsRows<'_> {
    /// Rows `start..start + len`, of `d` values each.
    fn part(&self, start: usize, len: usize, d: usize) -> ClsRows<'_> {
        ClsRows {
            inputs: &self.inputs[start * d..(start + len) * d],
            normed: &self.normed[start * d..(start + len) * d],
        }
    }
}

/// A forward's results and what its backward reads.
struct Trace {
    rows: usize,
    q0: Vec<f32>,
    /// (B, H, T)
    probs: Vec<f32>,
    first_norm: NormTrace,
    /// The MLP's pre-activation (B, M).
    pre_activation: Vec<f32>,
    second_norm: NormTrace,
    /// tanh of the pooler, when there is one (B, D).
    pooled_features: Option<Vec<f32>>,
    /// (B, C)
    logits: Vec<f32>,
}

impl Trace {
    /// Rows `b..` split off: their logits (what an evaluation keeps of them); the trace keeps
    /// the first `b` rows' parts, for the backward.
    fn split_off_rows(&mut self, b: usize) -> Vec<f32> {
        let rows = self.rows.max(1);
        let width = |v: &[f32]| v.len() / rows;
        let (d, m, c) = (
            width(&self.first_norm.normalised),
            width(&self.pre_activation),
            width(&self.logits),
        );
        for norm in [&mut self.first_norm, &mut self.second_norm] {
            norm.normalised.truncate(b * d);
            norm.inv_std.truncate(b);
        }
        self.pre_activation.truncate(b * m);
        if let Some(y) = &mut self.pooled_features {
            y.truncate(b * d);
        }
        self.rows = b;
        self.logits.split_off(b * c)
    }
}

/// The data loss of a batch and its gradient for each trained parameter.
pub struct HostGradients {
    pub loss: f32,
    pub wq: Vec<f32>,
    pub bq: Vec<f32>,
    pub wk: Vec<f32>,
    pub bk: Vec<f32>,
    /// The batch's rows evaluated at the look-ahead's parameters, when the step was given some.
    pub evaluated: Option<Evaluated>,
}

/// Rows evaluated by a forward: logits (B×C) and the attention of each head (B×H×T).
#[derive(Default)]
pub struct Evaluated {
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
}

/// The `b` rows of `rows` against each row of `weights` (N×`d`): B×N dot products, through the
/// scores kernel, which reads the weights where they lie.
fn dot_rows(rows: Rows, b: usize, weights: &[f32], d: usize) -> Vec<f32> {
    let len = weights.len() / d;
    let mut block = vec![0f32; b * len];
    let weights = Tokens {
        data: weights,
        len,
        dim: d,
    };
    row_scores(b, rows, weights, &mut block, len);
    block
}

/// `a += b` element-wise.
fn add_into(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
}

impl HostLayer {
    /// The host form of `layer`, when it has one: the CPU and the exact (erf) GELU.
    pub(super) fn new(layer: &LastLayer) -> Result<Option<Self>> {
        let attention = layer.attention();
        if !attention.query.weight().device().is_cpu() {
            return Ok(None);
        }
        let (block, residual, first_norm, second_norm) = match &layer.rest {
            Rest::Vit(v, final_norm) => (
                (
                    &v.attention_output,
                    &v.intermediate,
                    &v.output,
                    v.activation,
                ),
                Residual::BeforeNorm,
                &v.layernorm_after,
                final_norm,
            ),
            Rest::Bert(b) => (
                (
                    &b.attention_output,
                    &b.intermediate,
                    &b.output,
                    b.activation,
                ),
                Residual::AfterNorm,
                &b.attention_norm,
                &b.output_norm,
            ),
        };
        let (output, intermediate, mlp_output, activation) = block;
        if activation != candle_nn::Activation::Gelu {
            return Ok(None);
        }
        let frozen = |dense: &crate::encoder::dense::Dense| -> Result<Arc<FrozenLinear>> {
            match dense.as_frozen() {
                Some(f) => Ok(Arc::clone(f)),
                None => bail!("the last layer's dense layers are not in phase 2's form"),
            }
        };
        let (pooler, classifier) = layer.readout.parts();
        let classes = classifier.dims().0;
        let pre_norm = match layer.model {
            crate::encoder::Model::Vit(v) => Some(HostNorm::new(&v.last_layer().layernorm_before)?),
            crate::encoder::Model::Bert(_) => None,
        };
        let (output, intermediate, mlp_output) =
            (frozen(output)?, frozen(intermediate)?, frozen(mlp_output)?);
        let value = Arc::clone(&layer.value);
        let spread = HostSpread::for_weights(
            [&value, &output, &intermediate, &mlp_output]
                .iter()
                .map(|dense| dense.packed_bytes())
                .sum(),
        );
        Ok(Some(Self {
            pre_norm,
            value,
            output,
            first_norm: HostNorm::new(first_norm)?,
            intermediate,
            mlp_output,
            second_norm: HostNorm::new(second_norm)?,
            residual,
            pooler: pooler.cloned(),
            classifier: Arc::clone(classifier),
            heads: attention.num_heads,
            head_dim: attention.head_dim,
            hidden: attention.num_heads * attention.head_dim,
            classes,
            spread,
        }))
    }

    /// Whether one operation's work is shared out over the threads.
    fn across_threads(&self) -> bool {
        self.spread == HostSpread::Operations
    }

    /// The `b` rows of `rows` against every row of `weights` (N×D, D = the hidden width): the
    /// B×N dot products, through the scores kernel. Across threads, each takes a share of the
    /// weights' rows for all of `rows`, so the weights are read once.
    fn against_rows(&self, rows: Rows, b: usize, weights: &[f32]) -> Vec<f32> {
        let d = self.hidden;
        let n = weights.len() / d;
        let parts = if self.across_threads() {
            rayon::current_num_threads().clamp(1, n.max(1))
        } else {
            1
        };
        let part_len = n.div_ceil(parts);
        let blocks: Vec<Vec<f32>> = weights
            .par_chunks(part_len * d)
            .map(|part| dot_rows(rows, b, part, d))
            .collect();
        let mut out = vec![0f32; b * n];
        for (k, block) in blocks.iter().enumerate() {
            let len = block.len() / b.max(1);
            for (row, from) in out.chunks_exact_mut(n).zip(block.chunks_exact(len.max(1))) {
                row[k * part_len..k * part_len + len].copy_from_slice(from);
            }
        }
        out
    }

    /// An element-wise `f` (GELU or its backward) over rows of `width` values of `x` and `y`;
    /// across threads, the rows shared out. Between two products shared out, a step on one
    /// thread leaves the other idle (32 rows of ViT-B's MLP: 98 304 GELUs).
    fn by_rows(&self, width: usize, x: &[f32], y: &mut [f32], f: fn(&[f32], &mut [f32])) {
        if !self.across_threads() {
            return f(x, y);
        }
        let rows = x.len() / width.max(1);
        let share = rows.div_ceil(rayon::current_num_threads()).max(1) * width;
        x.par_chunks(share)
            .zip(y.par_chunks_mut(share))
            .for_each(|(x, y)| f(x, y));
    }

    /// What the attention reads of one sample's layer inputs (its unpadded token rows), in place.
    pub(super) fn normalise_sample(&self, tokens: &mut [f32]) {
        if let Some(norm) = &self.pre_norm {
            norm.normalise_in_place(tokens);
        }
    }

    /// Logits (B×C) and the CLS attention (B×H×T) of samples `rows` of `tokens`.
    pub(super) fn forward(
        &self,
        qk: &HostQk,
        cls: &ClsRows,
        tokens: &KeyValues,
        rows: &[usize],
    ) -> (Vec<f32>, Vec<f32>) {
        let chunk = self.spread.chunk_rows(EVAL_CHUNK, rows.len());
        let parts: Vec<Trace> = rows
            .par_chunks(chunk)
            .enumerate()
            .map(|(c, rows)| {
                self.trace(
                    qk,
                    &cls.part(c * chunk, rows.len(), self.hidden),
                    tokens,
                    rows,
                    None,
                )
                .0
            })
            .collect();
        let (mut logits, mut probs) = (Vec::new(), Vec::new());
        for part in parts {
            logits.extend_from_slice(&part.logits);
            probs.extend_from_slice(&part.probs);
        }
        (logits, probs)
    }

    /// The mean cross-entropy of samples `rows` against `targets` and its gradient for the
    /// query and key; with `look_ahead`, the same rows evaluated at those parameters as well,
    /// as [`Self::forward`] evaluates them (a row's numbers do not depend on the rows beside it),
    /// reading each sample's tokens once for both.
    pub(super) fn loss_and_gradients(
        &self,
        qk: &HostQk,
        cls: &ClsRows,
        tokens: &KeyValues,
        rows: &[usize],
        targets: &[u32],
        look_ahead: Option<&HostQk>,
    ) -> Result<HostGradients> {
        ensure!(
            targets.len() == rows.len() && targets.iter().all(|&t| (t as usize) < self.classes),
            "{} targets for {} rows of {} classes",
            targets.len(),
            rows.len(),
            self.classes
        );
        let chunk = self.spread.chunk_rows(CHUNK, rows.len());
        let parts: Vec<ChunkGradients> = rows
            .par_chunks(chunk)
            .zip(targets.par_chunks(chunk))
            .enumerate()
            .map(|(c, (chunk_rows, chunk_targets))| {
                let cls = cls.part(c * chunk, chunk_rows.len(), self.hidden);
                let step = ChunkStep {
                    qk,
                    look_ahead,
                    cls: &cls,
                    tokens,
                    rows: chunk_rows,
                };
                self.chunk_gradients(&step, chunk_targets, rows.len())
            })
            .collect();
        let mut whole = ChunkGradients::default();
        let mut evaluated = look_ahead.map(|_| Evaluated::default());
        for part in parts {
            whole.loss_sum += part.loss_sum;
            whole.q0.extend_from_slice(&part.q0);
            whole.grad_queries.extend_from_slice(&part.grad_queries);
            whole.grad_bias.extend_from_slice(&part.grad_bias);
            whole.grad_q0.extend_from_slice(&part.grad_q0);
            if let (Some(all), Some(part)) = (&mut evaluated, part.evaluated) {
                all.logits.extend_from_slice(&part.logits);
                all.probs.extend_from_slice(&part.probs);
            }
        }
        let mut gradients = self.weight_gradients(cls, &whole, rows.len());
        gradients.loss = whole.loss_sum / rows.len() as f32;
        gradients.evaluated = evaluated;
        Ok(gradients)
    }

    /// One chunk's forward, its share of the loss (the batch has `batch` rows) and the backward
    /// through its rows as far as the query row q₀: every step that is row by row.
    fn chunk_gradients(&self, step: &ChunkStep, targets: &[u32], batch: usize) -> ChunkGradients {
        let ChunkStep {
            qk,
            look_ahead,
            cls,
            tokens,
            rows,
        } = *step;
        let (trace, evaluated) = self.trace(qk, cls, tokens, rows, look_ahead);
        let c = self.classes;
        let mut grad_logits = Vec::with_capacity(trace.logits.len());
        let mut loss_sum = 0f32;
        for (logits, targets) in trace
            .logits
            .chunks(LOSS_ROWS * c)
            .zip(targets.chunks(LOSS_ROWS))
        {
            let (sum, grad) = cross_entropy(logits, targets, c, batch);
            loss_sum += sum;
            grad_logits.extend_from_slice(&grad);
        }
        let grad_context = self.backward_rest(&trace, &grad_logits);
        let mut part = self.backward_attention(qk, tokens, rows, &trace, &grad_context);
        part.loss_sum = loss_sum;
        part.q0 = trace.q0;
        part.evaluated = evaluated;
        part
    }

    /// The forward, keeping what the backward reads; with `look_ahead`, the same rows at those
    /// parameters as well, returned as an evaluation. Both share each sample's read of its tokens
    /// and the frozen products, whose rows are then twice as many.
    fn trace(
        &self,
        qk: &HostQk,
        cls: &ClsRows,
        tokens: &KeyValues,
        rows: &[usize],
        look_ahead: Option<&HostQk>,
    ) -> (Trace, Option<Evaluated>) {
        let b = rows.len();
        let Some(look_ahead) = look_ahead else {
            let (q0, queries) = self.query_rows(qk, cls.normed);
            let (probs, pooled) = self.attend(tokens, rows, &queries);
            return (self.trace_rest(q0, probs, &pooled, cls.inputs), None);
        };
        // Across threads, the two sets of queries side by side: each thread takes one set's
        // weights, with one fork and join where each set's products had two.
        let trained = || self.query_rows(qk, cls.normed);
        let ahead = || self.query_rows(look_ahead, cls.normed);
        let ((q0, queries), (_, ahead_queries)) = if self.across_threads() {
            rayon::join(trained, ahead)
        } else {
            (trained(), ahead())
        };
        let (probs, ahead_probs, pooled) = self.attend_both(tokens, rows, &queries, &ahead_queries);
        // Each evaluated row's residual is its sample's input, as the trained row's.
        let inputs = [cls.inputs, cls.inputs].concat();
        let mut trace = self.trace_rest(q0, probs, &pooled, &inputs);
        let logits = trace.split_off_rows(b);
        let evaluated = Evaluated {
            logits,
            probs: ahead_probs,
        };
        (trace, Some(evaluated))
    }

    /// q₀ (B×D) = x̂₀ W_Qᵀ + b_Q of the CLS rows `normed`, and the query directions rₕ (B×H×D)
    /// = q₀ₕ (B×dₕ) · W_Kₕ (dₕ×D); cₕ = q₀ₕ·b_Kₕ drops out of the softmax
    /// (`KeyValues::sample_forward`).
    fn query_rows(&self, qk: &HostQk, normed: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (h, dh, d) = (self.heads, self.head_dim, self.hidden);
        let b = normed.len() / d;
        // Each entry of x̂₀ W_Qᵀ is a dot product of two rows, as a score is: the scores kernel
        // reads W_Q where it lies, where gemm re-packed it on every call, and once for all the
        // rows (a row's numbers do not depend on the rows beside it).
        let mut q0 = self.against_rows(
            Rows {
                data: normed,
                stride: d,
            },
            b,
            qk.wq,
        );
        q0.chunks_exact_mut(d).for_each(|row| add_into(row, qk.bq));
        let mut queries = vec![0f32; b * h * d];
        queries
            .par_chunks_mut(QUERY_ROWS * h * d)
            .zip(q0.par_chunks(QUERY_ROWS * d))
            .with_min_len(self.spread.min_len())
            .for_each(|(queries, q0)| {
                let rows = q0.len() / d;
                for head in 0..h {
                    matmul(
                        (rows, d, dh),
                        (&mut queries[head * d..], h * d),
                        (&q0[head * dh..], d as isize, 1),
                        (&qk.wk[head * dh * d..], d as isize, 1),
                    );
                }
            });
        (q0, queries)
    }

    /// The attention of samples `rows` for their `queries` (B×H×D), a sample at a time: the
    /// probabilities (B×H×T) and the pooled tokens (B×H×D).
    fn attend(&self, tokens: &KeyValues, rows: &[usize], queries: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (h, d) = (self.heads, self.hidden);
        let (_, _, t) = tokens.geometry();
        let b = rows.len();
        let mut probs = vec![0f32; b * h * t];
        let mut pooled = vec![0f32; b * h * d];
        probs
            .par_chunks_mut(h * t)
            .zip(pooled.par_chunks_mut(h * d))
            .enumerate()
            .with_min_len(self.spread.min_len())
            .for_each(|(bi, (p, y))| {
                let next = rows.get(bi + 1).copied();
                tokens.sample_forward(
                    rows[bi],
                    &queries[bi * h * d..(bi + 1) * h * d],
                    p,
                    y,
                    d,
                    next,
                )
            });
        (probs, pooled)
    }

    /// [`Self::attend`] for two sets of queries of the same samples, each sample's tokens read
    /// once for both: the probabilities of each (B×H×T), and the pooled tokens of the first set's
    /// rows followed by the second's (2B×H×D).
    fn attend_both(
        &self,
        tokens: &KeyValues,
        rows: &[usize],
        queries: &[f32],
        ahead_queries: &[f32],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (h, d) = (self.heads, self.hidden);
        let (_, _, t) = tokens.geometry();
        let b = rows.len();
        let (mut probs, mut ahead_probs) = (vec![0f32; b * h * t], vec![0f32; b * h * t]);
        let mut pooled = vec![0f32; 2 * b * h * d];
        let (first, second) = pooled.split_at_mut(b * h * d);
        probs
            .par_chunks_mut(h * t)
            .zip(ahead_probs.par_chunks_mut(h * t))
            .zip(first.par_chunks_mut(h * d))
            .zip(second.par_chunks_mut(h * d))
            .enumerate()
            .with_min_len(self.spread.min_len())
            .for_each_init(
                || {
                    (
                        vec![0f32; 2 * h * d],
                        vec![0f32; 2 * h * t],
                        vec![0f32; 2 * h * d],
                    )
                },
                |(both_queries, both_probs, both_pooled), (bi, (((p, ahead_p), y), ahead_y))| {
                    let one = bi * h * d..(bi + 1) * h * d;
                    both_queries[..h * d].copy_from_slice(&queries[one.clone()]);
                    both_queries[h * d..].copy_from_slice(&ahead_queries[one]);
                    let next = rows.get(bi + 1).copied();
                    tokens.sample_forward(rows[bi], both_queries, both_probs, both_pooled, d, next);
                    p.copy_from_slice(&both_probs[..h * t]);
                    ahead_p.copy_from_slice(&both_probs[h * t..]);
                    y.copy_from_slice(&both_pooled[..h * d]);
                    ahead_y.copy_from_slice(&both_pooled[h * d..]);
                },
            );
        (probs, ahead_probs, pooled)
    }

    /// The layer after the attention and the classifier, over the rows of `pooled` (B×H×D) with
    /// their residual `inputs` (B×D), keeping what the backward reads.
    fn trace_rest(&self, q0: Vec<f32>, probs: Vec<f32>, pooled: &[f32], inputs: &[f32]) -> Trace {
        let d = self.hidden;
        let b = inputs.len() / d;
        let mut context = vec![0f32; b * d];
        self.value
            .forward_rows(pooled, &mut context, self.across_threads());
        // h = x₀ + O(context); a = N₁(h).
        let mut sum = vec![0f32; b * d];
        self.output
            .forward_rows(&context, &mut sum, self.across_threads());
        add_into(&mut sum, inputs);
        let mut normed = vec![0f32; b * d];
        let first_norm = self.first_norm.forward(&sum, &mut normed);
        // z = N₂(residual + MLP(a)).
        let m = self.intermediate.dims().0;
        let mut pre_activation = vec![0f32; b * m];
        self.intermediate
            .forward_rows(&normed, &mut pre_activation, self.across_threads());
        let mut activation = vec![0f32; b * m];
        self.by_rows(m, &pre_activation, &mut activation, gelu);
        let mut out = vec![0f32; b * d];
        self.mlp_output
            .forward_rows(&activation, &mut out, self.across_threads());
        add_into(
            &mut out,
            match self.residual {
                Residual::BeforeNorm => &sum,
                Residual::AfterNorm => &normed,
            },
        );
        let mut features = vec![0f32; b * d];
        let second_norm = self.second_norm.forward(&out, &mut features);
        let pooled_features = self.pooler.as_ref().map(|pooler| {
            let mut y = vec![0f32; b * d];
            pooler.forward_rows(&features, &mut y, self.across_threads());
            y.iter_mut().for_each(|v| *v = v.tanh());
            y
        });
        let mut logits = vec![0f32; b * self.classes];
        self.classifier.forward_rows(
            pooled_features.as_ref().unwrap_or(&features),
            &mut logits,
            self.across_threads(),
        );
        Trace {
            rows: b,
            q0,
            probs,
            first_norm,
            pre_activation,
            second_norm,
            pooled_features,
            logits,
        }
    }

    /// From ∂L/∂logits back to ∂L/∂context (B×D) through the frozen classifier and layer.
    fn backward_rest(&self, trace: &Trace, grad_logits: &[f32]) -> Vec<f32> {
        let (b, d) = (trace.rows, self.hidden);
        let mut grad_features = vec![0f32; b * d];
        self.classifier
            .backward_rows(grad_logits, &mut grad_features, self.across_threads());
        if let (Some(pooler), Some(y)) = (&self.pooler, &trace.pooled_features) {
            // tanh' = 1 − y².
            grad_features
                .iter_mut()
                .zip(y)
                .for_each(|(g, y)| *g *= 1.0 - y * y);
            let mut grad_in = vec![0f32; b * d];
            pooler.backward_rows(&grad_features, &mut grad_in, self.across_threads());
            grad_features = grad_in;
        }
        let mut grad_out = vec![0f32; b * d];
        self.second_norm
            .backward(&trace.second_norm, &grad_features, &mut grad_out);
        let m = self.intermediate.dims().0;
        let mut grad_activation = vec![0f32; b * m];
        self.mlp_output
            .backward_rows(&grad_out, &mut grad_activation, self.across_threads());
        self.by_rows(
            m,
            &trace.pre_activation,
            &mut grad_activation,
            gelu_backward,
        );
        let mut grad_normed = vec![0f32; b * d];
        self.intermediate
            .backward_rows(&grad_activation, &mut grad_normed, self.across_threads());
        let mut grad_sum = vec![0f32; b * d];
        match self.residual {
            Residual::BeforeNorm => {
                self.first_norm
                    .backward(&trace.first_norm, &grad_normed, &mut grad_sum);
                add_into(&mut grad_sum, &grad_out);
            }
            Residual::AfterNorm => {
                add_into(&mut grad_normed, &grad_out);
                self.first_norm
                    .backward(&trace.first_norm, &grad_normed, &mut grad_sum);
            }
        }
        let mut grad_context = vec![0f32; b * d];
        self.output
            .backward_rows(&grad_sum, &mut grad_context, self.across_threads());
        grad_context
    }

    /// From ∂L/∂context through the attention to the query row of each row of a chunk: ∂L/∂r,
    /// ∂L/∂c and ∂L/∂q₀.
    fn backward_attention(
        &self,
        qk: &HostQk,
        tokens: &KeyValues,
        rows: &[usize],
        trace: &Trace,
        grad_context: &[f32],
    ) -> ChunkGradients {
        let (h, dh, d) = (self.heads, self.head_dim, self.hidden);
        let (_, _, t) = tokens.geometry();
        let b = trace.rows;
        let mut grad_pooled = vec![0f32; b * h * d];
        self.value
            .backward_rows(grad_context, &mut grad_pooled, self.across_threads());
        let mut grad_queries = vec![0f32; b * h * d];
        let mut grad_bias = vec![0f32; b * h];
        // Last sample first: its tokens are the forward's most recent reads, the likeliest to
        // be in cache still (in chunks, where one thread takes them in this order).
        grad_queries
            .par_chunks_mut(h * d)
            .zip(grad_bias.par_chunks_mut(h))
            .enumerate()
            .rev()
            .with_min_len(self.spread.min_len())
            .for_each(|(bi, (gq, gc))| {
                tokens.sample_backward(
                    rows[bi],
                    Rows {
                        data: &trace.probs[bi * h * t..(bi + 1) * h * t],
                        stride: t,
                    },
                    Rows {
                        data: &grad_pooled[bi * h * d..(bi + 1) * h * d],
                        stride: d,
                    },
                    None,
                    gq,
                    gc,
                    // The samples go last to first.
                    bi.checked_sub(1).map(|b| rows[b]),
                );
            });
        // ∂L/∂q₀ₕ (B×dₕ) = ∂L/∂rₕ (B×D) · W_Kₕᵀ + ∂L/∂cₕ b_Kₕ: dot products of rows again, the
        // first term through the scores kernel, a head at a time for all the rows.
        let per_head: Vec<Vec<f32>> = (0..h)
            .into_par_iter()
            .with_min_len(self.spread.min_len())
            .map(|head| {
                let grad_r = Rows {
                    data: &grad_queries[head * d..],
                    stride: h * d,
                };
                dot_rows(grad_r, b, &qk.wk[head * dh * d..(head + 1) * dh * d], d)
            })
            .collect();
        let mut grad_q0 = vec![0f32; b * d];
        for (head, block) in per_head.iter().enumerate() {
            let bias_k = &qk.bk[head * dh..(head + 1) * dh];
            for bi in 0..b {
                let c = grad_bias[bi * h + head];
                let row = &mut grad_q0[bi * d + head * dh..bi * d + (head + 1) * dh];
                row.copy_from_slice(&block[bi * dh..(bi + 1) * dh]);
                row.iter_mut().zip(bias_k).for_each(|(g, k)| *g += c * k);
            }
        }
        ChunkGradients {
            grad_queries,
            grad_bias,
            grad_q0,
            ..Default::default()
        }
    }

    /// The query's and key's gradients from every row's ∂L/∂r, ∂L/∂c and ∂L/∂q₀: sums over the
    /// batch, done once over all its rows in a fixed order.
    fn weight_gradients(&self, cls: &ClsRows, whole: &ChunkGradients, b: usize) -> HostGradients {
        let (h, dh, d) = (self.heads, self.head_dim, self.hidden);
        let (q0, grad_queries) = (&whole.q0, &whole.grad_queries);
        // The key's and the query's gradients are independent: one on each of two threads.
        let key = || {
            let (mut wk, mut bk) = (vec![0f32; d * d], vec![0f32; d]);
            for head in 0..h {
                // ∂L/∂W_Kₕ (dₕ×D) = q₀ₕᵀ (dₕ×B) · ∂L/∂rₕ (B×D).
                matmul(
                    (dh, d, b),
                    (&mut wk[head * dh * d..], d),
                    (&q0[head * dh..], 1, d as isize),
                    (&grad_queries[head * d..], (h * d) as isize, 1),
                );
                for bi in 0..b {
                    let c = whole.grad_bias[bi * h + head];
                    for j in 0..dh {
                        bk[head * dh + j] += c * q0[bi * d + head * dh + j];
                    }
                }
            }
            (wk, bk)
        };
        let query = || {
            // ∂L/∂W_Q (D×D) = ∂L/∂q₀ᵀ (D×B) · x̂₀ (B×D); ∂L/∂b_Q = Σ_b ∂L/∂q₀.
            let mut wq = vec![0f32; d * d];
            matmul(
                (d, d, b),
                (&mut wq, d),
                (&whole.grad_q0, 1, d as isize),
                (cls.normed, d as isize, 1),
            );
            let mut bq = vec![0f32; d];
            whole
                .grad_q0
                .chunks_exact(d)
                .for_each(|row| add_into(&mut bq, row));
            (wq, bq)
        };
        let ((wk, bk), (wq, bq)) = rayon::join(key, query);
        HostGradients {
            loss: 0.0,
            wq,
            bq,
            wk,
            bk,
            evaluated: None,
        }
    }
}

/// The summed cross-entropy of `logits` (rows×C) against `targets`, and the gradient of the
/// batch's mean, (softmax − one-hot)/B, for a batch of `b` rows.
fn cross_entropy(logits: &[f32], targets: &[u32], classes: usize, b: usize) -> (f32, Vec<f32>) {
    let mut grad = vec![0f32; logits.len()];
    let mut total = 0f32;
    for ((row, g), &target) in logits
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .zip(targets)
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (g, &l) in g.iter_mut().zip(row) {
            *g = (l - max).exp();
            sum += *g;
        }
        total += sum.ln() + max - row[target as usize];
        for g in g.iter_mut() {
            *g /= sum * b as f32;
        }
        g[target as usize] -= 1.0 / b as f32;
    }
    (total, grad)
}

impl QueryKey {
    /// `f` with the query and key read in place.
    pub(super) fn on_host<R>(&self, f: impl FnOnce(&HostQk) -> R) -> Result<R> {
        use crate::kernels::with_host_f32 as host;
        Ok(host(self.wq.as_tensor(), |wq| {
            host(self.bq.as_tensor(), |bq| {
                host(self.wk.as_tensor(), |wk| {
                    host(self.bk.as_tensor(), |bk| f(&HostQk { wq, bq, wk, bk }))
                })
            })
        })????)
    }
}
