//! The CLS pass's forward for a stack of runs: the frozen layer's weights packed once, each run's query and key applied on the host.

use super::spread::HostSpread;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{Result, bail};
use rayon::prelude::*;

use super::super::{LastLayer, Rest};
use super::norm::{HostNorm, NormTrace};
use crate::encoder::projections::FrozenLinear;
use crate::kernels::{gelu, gemm_into as matmul};
use crate::model::attend::KeyValues;
use crate::model::classifier::FrozenClassifier;
use crate::model::token_products::{Rows, SampleTokens, row_scores};

/// Where the MLP's residual branch starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Residual {
    /// ViT: the sum before the first norm.
    BeforeNorm,
    /// BERT: the first norm's output.
    AfterNorm,
}

/// The frozen layer after the attention on the host: what every run of a stack shares.
pub(in crate::model::last_layer) struct HostLayer {
    /// What the attention reads of its input: ViT's LayerNorm before it; BERT reads X itself.
    pub(super) pre_norm: Option<HostNorm>,
    pub(super) value: Arc<FrozenLinear>,
    pub(super) output: Arc<FrozenLinear>,
    pub(super) first_norm: HostNorm,
    pub(super) intermediate: Arc<FrozenLinear>,
    pub(super) mlp_output: Arc<FrozenLinear>,
    pub(super) second_norm: HostNorm,
    pub(super) residual: Residual,
    pub(super) heads: usize,
    pub(super) head_dim: usize,
    pub(super) hidden: usize,
    /// How a step's or an evaluation's rows are shared out over the threads.
    pub(in crate::model::last_layer) spread: HostSpread,
}

/// One run's phase-1 classifier as the host pass reads it: BERT's pooler (when the checkpoint
/// has one), then the classifier.
pub(in crate::model::last_layer) struct HostReadout {
    pub(super) pooler: Option<Arc<FrozenLinear>>,
    pub(super) classifier: Arc<FrozenLinear>,
}

impl HostReadout {
    pub(in crate::model::last_layer) fn new(readout: &FrozenClassifier) -> Self {
        let (pooler, classifier) = readout.parts();
        Self {
            pooler: pooler.cloned(),
            classifier: Arc::clone(classifier),
        }
    }

    pub(super) fn classes(&self) -> usize {
        self.classifier.dims().0
    }
}

/// A run's trained parameters, read in place from their CPU storage.
#[derive(Clone, Copy)]
pub(crate) struct HostQk<'a> {
    pub(crate) wq: &'a [f32],
    pub(crate) bq: &'a [f32],
    pub(crate) wk: &'a [f32],
    pub(crate) bk: &'a [f32],
}

/// The CLS rows of a batch: the layer input x₀ and what the attention reads of it, x̂₀ (B, D).
#[derive(Clone, Copy)]
pub(crate) struct ClsRows<'a> {
    pub(crate) inputs: &'a [f32],
    pub(crate) normed: &'a [f32],
}

impl ClsRows<'_> {
    /// Rows `start..start + len`, of `d` values each.
    pub(super) fn part(&self, start: usize, len: usize, d: usize) -> ClsRows<'_> {
        ClsRows {
            inputs: &self.inputs[start * d..(start + len) * d],
            normed: &self.normed[start * d..(start + len) * d],
        }
    }
}

/// One run of a pass: its parameters, its classifier, and the samples it reads.
#[derive(Clone, Copy)]
pub(in crate::model::last_layer) struct RunPass<'a> {
    pub(in crate::model::last_layer) qk: HostQk<'a>,
    /// Parameters a step also evaluates the run's rows at (the look-ahead); none in an evaluation.
    pub(in crate::model::last_layer) look_ahead: Option<HostQk<'a>>,
    pub(in crate::model::last_layer) readout: &'a HostReadout,
    /// The CLS rows of `rows`, in their order.
    pub(in crate::model::last_layer) cls: ClsRows<'a>,
    pub(in crate::model::last_layer) tokens: &'a KeyValues,
    pub(in crate::model::last_layer) rows: &'a [usize],
}

/// A run's pass over one part of its rows.
#[derive(Clone, Copy)]
pub(super) struct PartPass<'a> {
    /// The run, by its place among the passes.
    pub(super) run: usize,
    /// Where the part's rows start among the run's.
    pub(super) first: usize,
    pub(super) pass: RunPass<'a>,
}

/// Where a step writes one run's gradients: four zeroed buffers of the query's and key's shapes.
pub(in crate::model::last_layer) struct RunGradients<'a> {
    pub(in crate::model::last_layer) wq: &'a mut [f32],
    pub(in crate::model::last_layer) bq: &'a mut [f32],
    pub(in crate::model::last_layer) wk: &'a mut [f32],
    pub(in crate::model::last_layer) bk: &'a mut [f32],
}

/// What a step leaves of one run beside its gradients.
pub(in crate::model::last_layer) struct RunStep {
    /// The mean cross-entropy of its batch.
    pub(in crate::model::last_layer) loss: f32,
    /// Its rows evaluated at the look-ahead's parameters, when it had some.
    pub(in crate::model::last_layer) evaluated: Option<Evaluated>,
}

/// Rows evaluated by a forward: logits (B×C) and the attention of each head (B×H×T).
#[derive(Default)]
pub struct Evaluated {
    pub logits: Vec<f32>,
    pub probs: Vec<f32>,
}

/// Rows of each run a part of a step holds ([`HostSpread::Chunks`]). The part's size is fixed,
/// not the thread count's, so the products see the same shapes however many threads there are.
pub(super) const CHUNK: usize = 8;

/// Rows of each run a part of an evaluation holds ([`HostSpread::Chunks`]): with no backward to
/// keep tokens in cache for, larger parts make fewer and larger products. A multiple of 6, the
/// rows a frozen product takes at once ([`crate::kernels::PackedMatrix`]), and half of the 48
/// rows an evaluation hands over at a time, so that two cores share them evenly.
pub(super) const EVAL_CHUNK: usize = 24;

/// Rows whose cross-entropies are summed together before the groups' sums are added, in either
/// spread: a row's share of the loss then depends on neither the spread, the part nor the
/// threads.
pub(super) const LOSS_ROWS: usize = 8;

/// Rows whose per-head query directions rₕ = q₀ₕ W_Kₕ go through gemm together. gemm gives a row
/// the same numbers whatever rows are beside it, up to 48 of them at the host pass's shapes
/// (`kernels::tests::gemm_rows_do_not_depend_on_the_rows_beside_them`), and re-packs W_Kₕ at every
/// call, so fewer, larger groups cost less. An evaluation's 48 rows go in three groups, which the
/// threads share.
///
/// The two trained products whose entries are dot products of rows (x̂₀ W_Qᵀ, ∂L/∂rₕ W_Kₕ) go
/// through the attention's scores kernel instead, which reads the weights in place where gemm
/// re-packed them; their numbers depend on no group, so they take all the rows at once and read
/// each weight once ([`HostLayer::against_rows`]).
pub(super) const QUERY_ROWS: usize = 16;

/// Where each query set's rows sit among the rows of a part: every run's trained rows in run
/// order, then the look-ahead's rows of those that have one, in run order.
pub(super) struct RowLayout {
    /// Per set: the part's run it belongs to, whether it is the look-ahead's, and its rows.
    pub(super) sets: Vec<(usize, bool, Range<usize>)>,
    /// Rows of the trained sets (the first ones).
    pub(super) trained_rows: usize,
}

impl RowLayout {
    pub(super) fn of(part: &[RunPass]) -> Self {
        let mut sets = Vec::new();
        let mut at = 0;
        for ahead in [false, true] {
            for (k, run) in part.iter().enumerate() {
                if !ahead || run.look_ahead.is_some() {
                    sets.push((k, ahead, at..at + run.rows.len()));
                    at += run.rows.len();
                }
            }
        }
        let trained_rows = part.iter().map(|r| r.rows.len()).sum();
        Self { sets, trained_rows }
    }

    pub(super) fn trained(&self) -> impl Iterator<Item = &(usize, bool, Range<usize>)> {
        self.sets.iter().filter(|(_, ahead, _)| !ahead)
    }

    /// Each set's rows with the classifier that reads them, in row order.
    pub(super) fn readouts<'a>(
        &self,
        part: &[RunPass<'a>],
        trained_only: bool,
    ) -> Vec<(Range<usize>, &'a HostReadout)> {
        self.sets
            .iter()
            .filter(|(_, ahead, _)| !(trained_only && *ahead))
            .map(|(k, _, rows)| (rows.clone(), part[*k].readout))
            .collect()
    }
}

/// The sets of a part that attend over the same rows of the same tokens, as indices into the
/// layout's sets, in their order.
pub(super) fn attention_groups(
    part: &[RunPass],
    sets: &[usize],
    layout: &RowLayout,
) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &s in sets {
        let run = &part[layout.sets[s].0];
        let same = |g: &&mut Vec<usize>| {
            let first = &part[layout.sets[g[0]].0];
            std::ptr::eq(first.tokens, run.tokens) && first.rows == run.rows
        };
        match groups.iter_mut().find(same) {
            Some(group) => group.push(s),
            None => groups.push(vec![s]),
        }
    }
    groups
}

/// A part's forward: every set's results, and what the backward of the trained sets reads.
pub(super) struct PartTrace {
    /// q₀ of each trained set (rows×D), in set order.
    pub(super) q0: Vec<Vec<f32>>,
    /// The attention of each set (rows×H×T), in set order.
    pub(super) probs: Vec<Vec<f32>>,
    pub(super) first_norm: NormTrace,
    /// The MLP's pre-activation (rows×M).
    pub(super) pre_activation: Vec<f32>,
    pub(super) second_norm: NormTrace,
    /// tanh of the pooler, when there is one (rows×D).
    pub(super) pooled_features: Option<Vec<f32>>,
    /// (rows×C)
    pub(super) logits: Vec<f32>,
}

impl PartTrace {
    /// The look-ahead's rows (from `b` on) split off: their logits; the trace keeps the trained
    /// rows' parts, for the backward.
    pub(super) fn split_off_rows(&mut self, b: usize, rows: usize) -> Vec<f32> {
        let rows = rows.max(1);
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
        self.logits.split_off(b * c)
    }
}

/// The `b` rows of `rows` against each row of `weights` (N×`d`): B×N dot products, through the
/// scores kernel, which reads the weights where they lie.
pub(super) fn dot_rows(rows: Rows, b: usize, weights: &[f32], d: usize) -> Vec<f32> {
    let len = weights.len() / d;
    let mut block = vec![0f32; b * len];
    let weights = SampleTokens {
        data: weights,
        len,
        dim: d,
    };
    row_scores(b, rows, weights, &mut block, len);
    block
}

/// `a += b` element-wise.
pub(super) fn add_into(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
}

/// The values of `rows` (a range of rows of `width` values) of `all`.
pub(super) fn rows_of<'a, T>(all: &'a [T], rows: &Range<usize>, width: usize) -> &'a [T] {
    &all[rows.start * width..rows.end * width]
}

pub(super) fn rows_of_mut<'a, T>(
    all: &'a mut [T],
    rows: &Range<usize>,
    width: usize,
) -> &'a mut [T] {
    &mut all[rows.start * width..rows.end * width]
}

impl HostLayer {
    /// The host form of `layer`'s frozen part, when it has one: the CPU and the exact (erf) GELU.
    pub(in crate::model::last_layer) fn new(layer: &LastLayer) -> Result<Option<Self>> {
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
        let frozen = |dense: &crate::encoder::projections::Dense| -> Result<Arc<FrozenLinear>> {
            match dense.as_frozen() {
                Some(f) => Ok(Arc::clone(f)),
                None => bail!("the last layer's dense layers are not in phase 2's form"),
            }
        };
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
            heads: attention.num_heads,
            head_dim: attention.head_dim,
            hidden: attention.num_heads * attention.head_dim,
            spread,
        }))
    }

    /// Whether `other` reads the very same frozen weights (runs of one stack must).
    pub(in crate::model::last_layer) fn shares_weights_with(&self, other: &HostLayer) -> bool {
        [
            (&self.value, &other.value),
            (&self.output, &other.output),
            (&self.intermediate, &other.intermediate),
            (&self.mlp_output, &other.mlp_output),
        ]
        .iter()
        .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Whether one operation's work is shared out over the threads.
    pub(super) fn across_threads(&self) -> bool {
        self.spread == HostSpread::Operations
    }

    /// The `b` rows of `rows` against every row of `weights` (N×D, D = the hidden width): the
    /// B×N dot products, through the scores kernel. Across threads, each takes a share of the
    /// weights' rows for all of `rows`, so the weights are read once.
    pub(super) fn against_rows(&self, rows: Rows, b: usize, weights: &[f32]) -> Vec<f32> {
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
    pub(super) fn by_rows(
        &self,
        width: usize,
        x: &[f32],
        y: &mut [f32],
        f: fn(&[f32], &mut [f32]),
    ) {
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
    pub(in crate::model::last_layer) fn normalise_sample(&self, tokens: &mut [f32]) {
        if let Some(norm) = &self.pre_norm {
            norm.normalise_in_place(tokens);
        }
    }

    /// Each run's logits (B×C) and CLS attention (B×H×T) over its rows.
    pub(in crate::model::last_layer) fn forward(&self, runs: &[RunPass]) -> Vec<Evaluated> {
        let parts = self.parts(runs, EVAL_CHUNK);
        let traced: Vec<(PartTrace, RowLayout)> = parts
            .par_iter()
            .map(|part| {
                let passes: Vec<RunPass> = part.iter().map(|p| p.pass).collect();
                let layout = RowLayout::of(&passes);
                (self.trace(&passes, &layout), layout)
            })
            .collect();
        let mut out: Vec<Evaluated> = runs.iter().map(|_| Evaluated::default()).collect();
        let c = runs.first().map_or(0, |r| r.readout.classes());
        for (part, (trace, layout)) in parts.iter().zip(traced) {
            for (s, (k, _, rows)) in layout.sets.iter().enumerate() {
                let own = &mut out[part[*k].run];
                own.logits
                    .extend_from_slice(rows_of(&trace.logits, rows, c));
                own.probs.extend_from_slice(&trace.probs[s]);
            }
        }
        out
    }

    /// The passes cut into parts of `chunk` rows of each run (one part of all rows across
    /// threads), each pass with the run it comes from and where its rows start in the run's.
    pub(super) fn parts<'a>(
        &self,
        runs: &'a [RunPass<'a>],
        chunk: usize,
    ) -> Vec<Vec<PartPass<'a>>> {
        let longest = runs.iter().map(|r| r.rows.len()).max().unwrap_or(0);
        let size = self.spread.part_rows(chunk, longest);
        (0..longest.div_ceil(size))
            .map(|c| {
                runs.iter()
                    .enumerate()
                    .filter(|(_, run)| c * size < run.rows.len())
                    .map(|(run, pass)| {
                        let first = c * size;
                        let rows = &pass.rows[first..pass.rows.len().min(first + size)];
                        let cls = pass.cls.part(first, rows.len(), self.hidden);
                        PartPass {
                            run,
                            first,
                            pass: RunPass { rows, cls, ..*pass },
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// The forward of every set of a part, keeping what the backward of the trained sets reads.
    pub(super) fn trace(&self, part: &[RunPass], layout: &RowLayout) -> PartTrace {
        let d = self.hidden;
        // q₀ and rₕ of each set; across threads, the sets side by side.
        let query_set = |(k, ahead, _): &(usize, bool, Range<usize>)| {
            let run = &part[*k];
            let qk = if *ahead {
                run.look_ahead.as_ref()
            } else {
                Some(&run.qk)
            };
            self.query_rows(
                qk.expect("a look-ahead set has its parameters"),
                run.cls.normed,
            )
        };
        let queries: Vec<(Vec<f32>, Vec<f32>)> = if self.across_threads() && layout.sets.len() > 1 {
            layout.sets.par_iter().map(query_set).collect()
        } else {
            layout.sets.iter().map(query_set).collect()
        };
        let all: Vec<usize> = (0..layout.sets.len()).collect();
        let mut attended: Vec<(Vec<f32>, Vec<f32>)> = Vec::with_capacity(layout.sets.len());
        attended.resize_with(layout.sets.len(), Default::default);
        for group in attention_groups(part, &all, layout) {
            let run = &part[layout.sets[group[0]].0];
            let sets: Vec<&[f32]> = group.iter().map(|&s| queries[s].1.as_slice()).collect();
            let results =
                super::attention::attend(run.tokens, run.rows, &sets, self.spread.min_len());
            for (s, result) in group.into_iter().zip(results) {
                attended[s] = result;
            }
        }
        let rows = layout.sets.last().map_or(0, |s| s.2.end);
        let (mut probs, mut pooled) = (Vec::with_capacity(attended.len()), Vec::new());
        let mut inputs = Vec::with_capacity(rows * d);
        for ((k, _, _), (p, y)) in layout.sets.iter().zip(attended) {
            probs.push(p);
            if pooled.is_empty() && layout.sets.len() == 1 {
                pooled = y;
            } else {
                pooled.extend_from_slice(&y);
            }
            // Each row's residual is its sample's input, whichever parameters it is evaluated at.
            inputs.extend_from_slice(part[*k].cls.inputs);
        }
        let q0 = queries
            .into_iter()
            .zip(&layout.sets)
            .filter(|(_, (_, ahead, _))| !ahead)
            .map(|((q0, _), _)| q0)
            .collect();
        self.trace_rest(q0, probs, &pooled, &inputs, &layout.readouts(part, false))
    }

    /// q₀ (B×D) = x̂₀ W_Qᵀ + b_Q of the CLS rows `normed`, and the query directions rₕ (B×H×D)
    /// = q₀ₕ (B×dₕ) · W_Kₕ (dₕ×D); cₕ = q₀ₕ·b_Kₕ drops out of the softmax
    /// (`KeyValues::sample_forward`).
    pub(super) fn query_rows(&self, qk: &HostQk, normed: &[f32]) -> (Vec<f32>, Vec<f32>) {
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

    /// The layer after the attention and each set's classifier, over the rows of `pooled`
    /// (rows×H×D) with their residual `inputs` (rows×D), keeping what the backward reads.
    pub(super) fn trace_rest(
        &self,
        q0: Vec<Vec<f32>>,
        probs: Vec<Vec<f32>>,
        pooled: &[f32],
        inputs: &[f32],
        readouts: &[(Range<usize>, &HostReadout)],
    ) -> PartTrace {
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
        let (pooled_features, logits) = self.readout_forward(&features, readouts);
        PartTrace {
            q0,
            probs,
            first_norm,
            pre_activation,
            second_norm,
            pooled_features,
            logits,
        }
    }

    /// Each set's classifier on its rows of `features`: tanh of the pooler, when there is one,
    /// and the logits.
    pub(super) fn readout_forward(
        &self,
        features: &[f32],
        readouts: &[(Range<usize>, &HostReadout)],
    ) -> (Option<Vec<f32>>, Vec<f32>) {
        let d = self.hidden;
        let b = features.len() / d;
        let pooled_features = readouts.first().and_then(|r| r.1.pooler.as_ref()).map(|_| {
            let mut y = vec![0f32; b * d];
            for (rows, readout) in readouts {
                if let Some(pooler) = &readout.pooler {
                    pooler.forward_rows(
                        rows_of(features, rows, d),
                        rows_of_mut(&mut y, rows, d),
                        self.across_threads(),
                    );
                }
            }
            y.iter_mut().for_each(|v| *v = v.tanh());
            y
        });
        let c = readouts.first().map_or(0, |r| r.1.classes());
        let mut logits = vec![0f32; b * c];
        let source = pooled_features.as_deref().unwrap_or(features);
        for (rows, readout) in readouts {
            readout.classifier.forward_rows(
                rows_of(source, rows, d),
                rows_of_mut(&mut logits, rows, c),
                self.across_threads(),
            );
        }
        (pooled_features, logits)
    }
}
