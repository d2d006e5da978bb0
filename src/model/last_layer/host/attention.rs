//! The attention of a pass's query sets, a sample at a time. Sets that attend over the same rows
//! of the same tokens (the runs of a stack that read the same samples, and the look-ahead's
//! evaluation beside a step) go through each sample together, so its tokens are read once for
//! all of them; every row's numbers are those it gets alone ([`KeyValues::sample_forward`]).

use rayon::prelude::*;

use crate::model::attend::KeyValues;
use crate::model::token_products::Rows;

/// Per query set, in the order given: the probabilities (B×H×T) and the pooled tokens (B×H×D) of
/// samples `rows` of `tokens`, each set's queries B×H×D. `min_len` is the fewest samples a thread
/// takes ([`super::spread::HostSpread::min_len`]).
pub(super) fn attend(
    tokens: &KeyValues,
    rows: &[usize],
    sets: &[&[f32]],
    min_len: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (h, d, t) = tokens.geometry();
    let b = rows.len();
    if let [queries] = sets {
        let (mut probs, mut pooled) = (vec![0f32; b * h * t], vec![0f32; b * h * d]);
        probs
            .par_chunks_mut(h * t)
            .zip(pooled.par_chunks_mut(h * d))
            .enumerate()
            .with_min_len(min_len)
            .for_each(|(bi, (p, y))| {
                let next = rows.get(bi + 1).copied();
                let own = &queries[bi * h * d..(bi + 1) * h * d];
                tokens.sample_forward(rows[bi], own, p, y, d, next)
            });
        return vec![(probs, pooled)];
    }
    // Sample-major: sample b's block holds every set's rows, set after set.
    let r = sets.len();
    let (mut probs, mut pooled) = (vec![0f32; b * r * h * t], vec![0f32; b * r * h * d]);
    probs
        .par_chunks_mut(r * h * t)
        .zip(pooled.par_chunks_mut(r * h * d))
        .enumerate()
        .with_min_len(min_len)
        .for_each_init(
            || vec![0f32; r * h * d],
            |queries, (bi, (p, y))| {
                for (s, set) in sets.iter().enumerate() {
                    queries[s * h * d..(s + 1) * h * d]
                        .copy_from_slice(&set[bi * h * d..(bi + 1) * h * d]);
                }
                let next = rows.get(bi + 1).copied();
                tokens.sample_forward(rows[bi], queries, p, y, d, next);
            },
        );
    (0..r)
        .into_par_iter()
        .map(|s| {
            (
                apart(&probs, b, r, s, h * t),
                apart(&pooled, b, r, s, h * d),
            )
        })
        .collect()
}

/// The backward of [`attend`] for sets whose forward kept `probs` (B×H×T each) and whose pooled
/// tokens have the gradient `grad_pooled` (B×H×D each): per set, ∂L/∂r (B×H×D) and ∂L/∂c (B×H).
pub(super) fn attend_backward(
    tokens: &KeyValues,
    rows: &[usize],
    probs: &[&[f32]],
    grad_pooled: &[&[f32]],
    min_len: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (h, d, t) = tokens.geometry();
    let b = rows.len();
    let r = probs.len();
    let (mut grad_queries, mut grad_bias) = (vec![0f32; b * r * h * d], vec![0f32; b * r * h]);
    // Last sample first: its tokens are the forward's most recent reads, the likeliest to be in
    // cache still (where one thread takes the samples in this order).
    let backward = |bi: usize, p: Rows, g: Rows, gq: &mut [f32], gc: &mut [f32]| {
        // The samples go last to first.
        let next = bi.checked_sub(1).map(|b| rows[b]);
        tokens.sample_backward(rows[bi], p, g, None, gq, gc, next);
    };
    if let ([p], [g]) = (probs, grad_pooled) {
        grad_queries
            .par_chunks_mut(h * d)
            .zip(grad_bias.par_chunks_mut(h))
            .enumerate()
            .rev()
            .with_min_len(min_len)
            .for_each(|(bi, (gq, gc))| {
                let p = Rows {
                    data: &p[bi * h * t..(bi + 1) * h * t],
                    stride: t,
                };
                let g = Rows {
                    data: &g[bi * h * d..(bi + 1) * h * d],
                    stride: d,
                };
                backward(bi, p, g, gq, gc);
            });
        return vec![(grad_queries, grad_bias)];
    }
    grad_queries
        .par_chunks_mut(r * h * d)
        .zip(grad_bias.par_chunks_mut(r * h))
        .enumerate()
        .rev()
        .with_min_len(min_len)
        .for_each_init(
            || (vec![0f32; r * h * t], vec![0f32; r * h * d]),
            |(p, g), (bi, (gq, gc))| {
                for s in 0..r {
                    p[s * h * t..(s + 1) * h * t]
                        .copy_from_slice(&probs[s][bi * h * t..(bi + 1) * h * t]);
                    g[s * h * d..(s + 1) * h * d]
                        .copy_from_slice(&grad_pooled[s][bi * h * d..(bi + 1) * h * d]);
                }
                let p = Rows { data: p, stride: t };
                let g = Rows { data: g, stride: d };
                backward(bi, p, g, gq, gc);
            },
        );
    (0..r)
        .into_par_iter()
        .map(|s| {
            (
                apart(&grad_queries, b, r, s, h * d),
                apart(&grad_bias, b, r, s, h),
            )
        })
        .collect()
}

/// Set `s`'s rows of a sample-major buffer (`b` samples of `r` sets of `width` values each).
fn apart(values: &[f32], b: usize, r: usize, s: usize, width: usize) -> Vec<f32> {
    let mut own = Vec::with_capacity(b * width);
    for bi in 0..b {
        let at = (bi * r + s) * width;
        own.extend_from_slice(&values[at..at + width]);
    }
    own
}
