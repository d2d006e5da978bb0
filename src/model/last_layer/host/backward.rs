//! The host pass's step: the forward of [`HostLayer::forward`] kept for the backward
//! ([`PartTrace`]), each run's cross-entropy over its rows, and the backward through each run's
//! classifier, the frozen layer and the attention to the run's query and key, with no autograd.
//! The arithmetic of the layer's parts (norms, frozen products, attention kernels) is theirs; this
//! file is the order the step runs them in and the loss.

use std::ops::Range;

use anyhow::{Result, ensure};
use rayon::prelude::*;

use super::forward::*;
use crate::kernels::{gelu_backward, gemm_into as matmul};
use crate::model::token_products::Rows;

impl HostLayer {
    /// Each run's mean cross-entropy of its rows against its `targets`, its gradient for the
    /// run's query and key (written into `grads`), and with a look-ahead the rows evaluated at
    /// those parameters as well, as [`Self::forward`] evaluates them, each sample's tokens read
    /// once for both.
    pub(in crate::model::last_layer) fn step(
        &self,
        runs: &[RunPass],
        targets: &[&[u32]],
        grads: Vec<RunGradients>,
    ) -> Result<Vec<RunStep>> {
        ensure!(
            targets.len() == runs.len() && grads.len() == runs.len(),
            "{} runs with {} target lists and {} gradient buffers",
            runs.len(),
            targets.len(),
            grads.len()
        );
        for (run, targets) in runs.iter().zip(targets) {
            let classes = run.readout.classes();
            ensure!(
                targets.len() == run.rows.len() && targets.iter().all(|&t| (t as usize) < classes),
                "{} targets for {} rows of {classes} classes",
                targets.len(),
                run.rows.len(),
            );
        }
        let parts = self.parts(runs, CHUNK);
        let per_part: Vec<Vec<(usize, RunRows)>> = parts
            .par_iter()
            .map(|part| self.part_gradients(part, runs, targets))
            .collect();
        let mut whole: Vec<RunRows> = runs.iter().map(|_| RunRows::default()).collect();
        for part in per_part {
            for (run, rows) in part {
                whole[run].extend(rows);
            }
        }
        // Each run's query and key gradients are independent sums: on the threads side by side.
        whole
            .par_iter()
            .zip(runs.par_iter())
            .zip(grads.into_par_iter())
            .for_each(|((whole, run), grads)| self.weight_gradients(&run.cls, whole, grads));
        Ok(whole
            .into_iter()
            .zip(runs)
            .map(|(whole, run)| RunStep {
                loss: whole.loss_sum / run.rows.len() as f32,
                evaluated: whole.evaluated,
            })
            .collect())
    }

    /// One part's forward, the losses of its trained rows and the backward through them as far
    /// as each run's query row q₀: every step that is row by row.
    fn part_gradients(
        &self,
        part: &[PartPass],
        runs: &[RunPass],
        targets: &[&[u32]],
    ) -> Vec<(usize, RunRows)> {
        let passes: Vec<RunPass> = part.iter().map(|p| p.pass).collect();
        let layout = RowLayout::of(&passes);
        let mut trace = self.trace(&passes, &layout);
        let ahead_logits = trace.split_off_rows(
            layout.trained_rows,
            layout.sets.last().map_or(0, |s| s.2.end),
        );
        let c = passes.first().map_or(0, |r| r.readout.classes());
        let mut out: Vec<(usize, RunRows)> =
            part.iter().map(|p| (p.run, RunRows::default())).collect();
        let mut grad_logits = Vec::with_capacity(trace.logits.len());
        for (k, _, rows) in layout.trained() {
            let PartPass { run, first, pass } = part[*k];
            let targets = &targets[run][first..first + pass.rows.len()];
            let batch = runs[run].rows.len();
            for (logits, targets) in rows_of(&trace.logits, rows, c)
                .chunks(LOSS_ROWS * c)
                .zip(targets.chunks(LOSS_ROWS))
            {
                let (sum, grad) = cross_entropy(logits, targets, c, batch);
                out[*k].1.loss_sum += sum;
                grad_logits.extend_from_slice(&grad);
            }
        }
        for (s, (k, ahead, rows)) in layout.sets.iter().enumerate() {
            if *ahead {
                let start = layout.trained_rows;
                out[*k].1.evaluated = Some(Evaluated {
                    logits: ahead_logits[(rows.start - start) * c..(rows.end - start) * c].to_vec(),
                    probs: std::mem::take(&mut trace.probs[s]),
                });
            }
        }
        let grad_context =
            self.backward_rest(&trace, &grad_logits, &layout.readouts(&passes, true));
        self.backward_attention(&passes, &layout, &mut trace, &grad_context, &mut out);
        for ((_, rows), q0) in out.iter_mut().zip(trace.q0) {
            rows.q0 = q0;
        }
        out
    }

    /// From ∂L/∂logits of the trained rows back to ∂L/∂context (rows×D) through each set's
    /// classifier and the frozen layer.
    fn backward_rest(
        &self,
        trace: &PartTrace,
        grad_logits: &[f32],
        readouts: &[(Range<usize>, &HostReadout)],
    ) -> Vec<f32> {
        let d = self.hidden;
        let b = trace.first_norm.inv_std.len();
        let c = readouts.first().map_or(0, |r| r.1.classes());
        let mut grad_features = vec![0f32; b * d];
        for (rows, readout) in readouts {
            readout.classifier.backward_rows(
                rows_of(grad_logits, rows, c),
                rows_of_mut(&mut grad_features, rows, d),
                self.across_threads(),
            );
        }
        if let Some(y) = &trace.pooled_features {
            // tanh' = 1 − y².
            grad_features
                .iter_mut()
                .zip(y)
                .for_each(|(g, y)| *g *= 1.0 - y * y);
            let mut grad_in = vec![0f32; b * d];
            for (rows, readout) in readouts {
                if let Some(pooler) = &readout.pooler {
                    pooler.backward_rows(
                        rows_of(&grad_features, rows, d),
                        rows_of_mut(&mut grad_in, rows, d),
                        self.across_threads(),
                    );
                }
            }
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

    /// From ∂L/∂context of the trained rows through the attention to each run's query rows:
    /// ∂L/∂r, ∂L/∂c and ∂L/∂q₀ into `out` (one entry per trained set, in set order).
    fn backward_attention(
        &self,
        part: &[RunPass],
        layout: &RowLayout,
        trace: &mut PartTrace,
        grad_context: &[f32],
        out: &mut [(usize, RunRows)],
    ) {
        let (h, d) = (self.heads, self.hidden);
        let b = layout.trained_rows;
        let mut grad_pooled = vec![0f32; b * h * d];
        self.value
            .backward_rows(grad_context, &mut grad_pooled, self.across_threads());
        let trained: Vec<usize> = (0..layout.sets.len())
            .filter(|&s| !layout.sets[s].1)
            .collect();
        for group in attention_groups(part, &trained, layout) {
            let run = &part[layout.sets[group[0]].0];
            let probs: Vec<&[f32]> = group.iter().map(|&s| trace.probs[s].as_slice()).collect();
            let grads: Vec<&[f32]> = group
                .iter()
                .map(|&s| rows_of(&grad_pooled, &layout.sets[s].2, h * d))
                .collect();
            let results = super::attention::attend_backward(
                run.tokens,
                run.rows,
                &probs,
                &grads,
                self.spread.min_len(),
            );
            for (s, (grad_queries, grad_bias)) in group.into_iter().zip(results) {
                let k = layout.sets[s].0;
                let rows = &mut out[k].1;
                rows.grad_q0 = self.grad_q0(&part[k].qk, &grad_queries, &grad_bias);
                rows.grad_queries = grad_queries;
                rows.grad_bias = grad_bias;
            }
        }
    }

    /// ∂L/∂q₀ₕ (B×dₕ) = ∂L/∂rₕ (B×D) · W_Kₕᵀ + ∂L/∂cₕ b_Kₕ: dot products of rows again, the first
    /// term through the scores kernel, a head at a time for all the rows.
    fn grad_q0(&self, qk: &HostQk, grad_queries: &[f32], grad_bias: &[f32]) -> Vec<f32> {
        let (h, dh, d) = (self.heads, self.head_dim, self.hidden);
        let b = grad_bias.len() / h;
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
        grad_q0
    }

    /// One run's query and key gradients from every row's ∂L/∂r, ∂L/∂c and ∂L/∂q₀: sums over its
    /// batch, done once over all its rows in a fixed order, into `grads` (zeroed).
    fn weight_gradients(&self, cls: &ClsRows, whole: &RunRows, grads: RunGradients) {
        let (h, dh, d) = (self.heads, self.head_dim, self.hidden);
        let b = whole.grad_bias.len() / h;
        let (q0, grad_queries) = (&whole.q0, &whole.grad_queries);
        let RunGradients { wq, bq, wk, bk } = grads;
        // The key's and the query's gradients are independent: one on each of two threads.
        let key = || {
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
        };
        let query = || {
            // ∂L/∂W_Q (D×D) = ∂L/∂q₀ᵀ (D×B) · x̂₀ (B×D); ∂L/∂b_Q = Σ_b ∂L/∂q₀.
            matmul(
                (d, d, b),
                (wq, d),
                (&whole.grad_q0, 1, d as isize),
                (cls.normed, d as isize, 1),
            );
            whole
                .grad_q0
                .chunks_exact(d)
                .for_each(|row| add_into(bq, row));
        };
        rayon::join(key, query);
    }
}

/// What the backward of one part leaves of one run for its weight gradients (or, joined over
/// the parts, of its batch).
#[derive(Default)]
struct RunRows {
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

impl RunRows {
    /// `part`'s rows appended after these.
    fn extend(&mut self, part: RunRows) {
        self.loss_sum += part.loss_sum;
        self.q0.extend_from_slice(&part.q0);
        self.grad_queries.extend_from_slice(&part.grad_queries);
        self.grad_bias.extend_from_slice(&part.grad_bias);
        self.grad_q0.extend_from_slice(&part.grad_q0);
        if let Some(part) = part.evaluated {
            let all = self.evaluated.get_or_insert_with(Evaluated::default);
            all.logits.extend_from_slice(&part.logits);
            all.probs.extend_from_slice(&part.probs);
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
