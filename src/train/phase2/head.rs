//! The card's head mode as a [`Trainee`]: each run's token-selection head (W, p) over the frozen
//! final tokens, read by the run's frozen phase-1 classifier, f(X) = C(Σₜ softmax(X Wᵀ p)ₜ xₜ).
//!
//! Through candle's autograd, the whole stack at once: the heads stacked as W (S, D, D) and
//! p (S, D), every run's query Wᵀp from one batched product, and one attention op per distinct
//! fine-tune set over the rows of every run that reads it. Each run's loss is its own batch's
//! mean, and the stack's objective is their sum, so each run's gradient is that of its own loss.
//! On the resident route ([`Route::Resident`]) the fine-tune tokens stay a tensor on the device,
//! gathered per step, and the optimizer's moments are there too: a step reads nothing back.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};

use super::objective::{self, Gradients};
use super::parameters::{QkShape, qk_spectrum, stacked_optimizer};
use super::runs::{Route, RunData, StackShared, copies};
use super::trainee::{EpochEnd, EpochEvaluation, RunEvaluation, SetOutput, Trainee, eval_chunks};
use crate::encoder::layer_rows::LayerRows;
use crate::model::attend::{KeyValues, broadcast_query};
use crate::model::{Classifier, TokenSelectionHead};
use crate::train::optim::AdamW;
use crate::train::setup::final_tokens;

/// A stack of head-mode runs.
pub struct HeadTrainee<'a> {
    classifiers: Vec<&'a Classifier>,
    /// The distinct fine-tune sets' final tokens as the head reads them, and the one each run
    /// reads.
    finetune: Vec<Arc<KeyValues>>,
    run_finetune: Vec<usize>,
    finetune_len: usize,
    /// The distinct test sets' final tokens (in memory, or in a temporary file beside the cache),
    /// and the one each run reads.
    test: Vec<LayerRows>,
    run_test: Vec<usize>,
    labels: Vec<&'a [u32]>,
    optimizer: AdamW,
    shape: QkShape,
    locater: f64,
    device: Device,
}

/// The tokens of rows `rows` of `tokens`, as the head reads them (one head, scale 1).
fn as_keys(tokens: &LayerRows, rows: &[usize], device: &Device) -> Result<Arc<KeyValues>> {
    let batch = tokens.batch(rows, device)?;
    Ok(Arc::new(KeyValues::new(
        &batch.inputs,
        1,
        Some(&batch.lengths),
        1.0,
    )?))
}

impl<'a> HeadTrainee<'a> {
    /// The stack of `runs`, each head drawn from the run's own stream.
    pub fn new(shared: &StackShared, runs: &[&'a RunData<'a>]) -> Result<Self> {
        let first = runs.first().context("a stack of no runs")?;
        let (model, device) = (shared.model, shared.device);
        let finetune_copies = copies(&runs.iter().map(|r| r.finetune_samples).collect::<Vec<_>>());
        let test_copies = copies(&runs.iter().map(|r| r.test_samples).collect::<Vec<_>>());
        let (mut finetune, mut test) = (Vec::new(), Vec::new());
        let mut finetune_len = 0;
        for (k, run) in runs.iter().enumerate() {
            if finetune_copies[k] == k {
                // The fine-tune set's final tokens once, in memory, as the head reads them.
                let mut tokens = final_tokens(model, &run.finetune.resident()?, device, None)?;
                if let Some(noise) = run.final_token_noise {
                    let samples = run.finetune_samples;
                    tokens = noise.apply(&tokens, samples.split, samples.positions, None)?;
                }
                let all: Vec<usize> = (0..tokens.len()).collect();
                finetune_len = tokens.len();
                finetune.push(match shared.route {
                    Route::Host => as_keys(&tokens, &all, device)?,
                    Route::Resident => {
                        // Kept where they are, gathered per step by the generic ops.
                        let batch = tokens.batch(&all, device)?;
                        Arc::new(KeyValues::kept(
                            &batch.inputs,
                            1,
                            Some(&batch.lengths),
                            1.0,
                        )?)
                    }
                });
            }
            if test_copies[k] == k {
                let mut tokens = final_tokens(model, run.test, device, Some(shared.spill_dir))?;
                if let Some(noise) = run.final_token_noise {
                    let samples = run.test_samples;
                    tokens = noise.apply(
                        &tokens,
                        samples.split,
                        samples.positions,
                        Some(shared.spill_dir),
                    )?;
                }
                test.push(tokens);
            }
        }
        let heads = runs
            .iter()
            .map(|run| run.with_init_rng(|rng| TokenSelectionHead::new(shared.hidden, rng, device)))
            .collect::<Result<Vec<_>>>()?;
        let named: Vec<_> = heads.iter().map(TokenSelectionHead::named).collect();
        let config = first.config;
        let optimizer = stacked_optimizer(config, &named, shared.route)?;
        Ok(Self {
            classifiers: runs.iter().map(|r| r.classifier).collect(),
            finetune,
            run_finetune: super::query_key::index_of_copies(&finetune_copies),
            finetune_len,
            test,
            run_test: super::query_key::index_of_copies(&test_copies),
            labels: runs.iter().map(|r| r.labels.labels).collect(),
            optimizer,
            shape: QkShape::of(model, config.mode, shared.hidden),
            locater: config.locater,
            device: device.clone(),
        })
    }

    /// Every run's query direction Wᵀp, (S, 1, D), from one batched product: differentiable in
    /// the stacked parameters for a step (`tracked`), detached for an evaluation (the same
    /// numbers, no graph).
    fn directions(&self, tracked: bool) -> Result<Tensor> {
        let params = self.optimizer.tensors();
        let (w, p) = if tracked {
            (params[0].clone(), params[1].clone())
        } else {
            (params[0].detach(), params[1].detach())
        };
        // X Wᵀ p = X (Wᵀ p): one D-vector per run and step instead of a (T, D) product per sample.
        Ok(p.unsqueeze(1)?.matmul(&w)?)
    }

    /// The runs `members` selecting from `keys` along `directions` ([`Self::directions`]), run
    /// `members[i]` on rows `rows[i]`: each one's logits (B, C) and selection (B, T).
    fn select(
        &self,
        directions: &Tensor,
        keys: &Arc<KeyValues>,
        members: &[usize],
        rows: &[&[usize]],
    ) -> Result<Vec<SetOutput>> {
        let queries = members
            .iter()
            .zip(rows)
            .map(|(&k, rows)| broadcast_query(&directions.get(k)?, rows.len()))
            .collect::<Result<Vec<_>>>()?;
        let queries = Tensor::cat(&queries, 0)?;
        let all_rows: Vec<usize> = rows.concat();
        let bias = Tensor::zeros((all_rows.len(), 1), DType::F32, queries.device())?;
        let attended = keys.attend(&queries, &bias, &all_rows)?;
        let (pooled, attention) = (attended.pooled.squeeze(1)?, attended.probs.squeeze(1)?);
        let mut at = 0;
        members
            .iter()
            .zip(rows)
            .map(|(&k, rows)| {
                let (pooled, attention) = (
                    pooled.narrow(0, at, rows.len())?,
                    attention.narrow(0, at, rows.len())?,
                );
                at += rows.len();
                Ok(SetOutput {
                    logits: self.classifiers[k].forward(&pooled)?,
                    attention,
                })
            })
            .collect()
    }

    /// The runs that read fine-tune copy `copy`.
    fn readers(&self, of: &[usize], copy: usize) -> Vec<usize> {
        (0..self.runs()).filter(|&k| of[k] == copy).collect()
    }

    /// Every run's output on its rows `rows[k]` of its fine-tune set, along `directions`.
    fn select_finetune(&self, directions: &Tensor, rows: &[&[usize]]) -> Result<Vec<SetOutput>> {
        let mut out: Vec<Option<SetOutput>> = (0..self.runs()).map(|_| None).collect();
        for (copy, keys) in self.finetune.iter().enumerate() {
            let members = self.readers(&self.run_finetune, copy);
            let own: Vec<&[usize]> = members.iter().map(|&k| rows[k]).collect();
            for (&k, output) in members
                .iter()
                .zip(self.select(directions, keys, &members, &own)?)
            {
                out[k] = Some(output);
            }
        }
        out.into_iter()
            .map(|o| o.context("a run without its fine-tune set"))
            .collect()
    }

    /// Every run's test logits: each test set's chunks read once for the runs that score on it.
    fn test_logits(&self) -> Result<Vec<Tensor>> {
        let directions = self.directions(false)?;
        let mut chunks: Vec<Vec<Tensor>> = (0..self.runs()).map(|_| Vec::new()).collect();
        for (copy, tokens) in self.test.iter().enumerate() {
            let members = self.readers(&self.run_test, copy);
            for rows in eval_chunks(tokens.len()) {
                let keys = as_keys(tokens, &rows, &self.device)?;
                let local: Vec<usize> = (0..rows.len()).collect();
                let own: Vec<&[usize]> = members.iter().map(|_| local.as_slice()).collect();
                for (&k, output) in
                    members
                        .iter()
                        .zip(self.select(&directions, &keys, &members, &own)?)
                {
                    chunks[k].push(output.logits.detach());
                }
            }
        }
        chunks
            .into_iter()
            .map(|c| Ok(Tensor::cat(&c, 0)?))
            .collect()
    }
}

impl Trainee for HeadTrainee<'_> {
    fn runs(&self) -> usize {
        self.classifiers.len()
    }

    fn gradients(&mut self, batches: &[&[usize]]) -> Result<Gradients> {
        let outputs = self.select_finetune(&self.directions(true)?, batches)?;
        let mut logits = Vec::with_capacity(batches.len());
        let mut targets = Vec::with_capacity(batches.len());
        for (k, (output, rows)) in outputs.into_iter().zip(batches).enumerate() {
            targets.push(objective::targets(
                self.labels[k],
                rows,
                output.logits.device(),
            )?);
            logits.push(output.logits);
        }
        let params = self.optimizer.tensors();
        let mut gradients = objective::cross_entropy(&params, &logits, &targets)?;
        objective::add_locater_penalty(&mut gradients, &params, self.shape, self.locater)?;
        Ok(gradients)
    }

    fn evaluations(&mut self, end: &EpochEnd) -> Result<Vec<EpochEvaluation>> {
        let directions = self.directions(false)?;
        let mut finetune: Vec<Vec<SetOutput>> = (0..self.runs()).map(|_| Vec::new()).collect();
        for chunk in eval_chunks(self.finetune_len) {
            let rows: Vec<&[usize]> = (0..self.runs()).map(|_| chunk.as_slice()).collect();
            for (k, output) in self
                .select_finetune(&directions, &rows)?
                .into_iter()
                .enumerate()
            {
                finetune[k].push(output);
            }
        }
        let test = if end.score_test {
            self.test_logits()?.into_iter().map(Some).collect()
        } else {
            vec![None; self.runs()]
        };
        let runs = finetune
            .into_iter()
            .zip(test)
            .enumerate()
            .map(|(k, (chunks, test_logits))| {
                // The head has no layer around it to collapse.
                RunEvaluation::of(chunks, test_logits, || {
                    Ok((qk_spectrum(&self.optimizer, k, self.shape)?, None))
                })
            })
            .collect::<Result<_>>()?;
        Ok(vec![EpochEvaluation {
            epoch: end.epoch,
            runs,
        }])
    }

    fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optimizer
    }

    fn pictured(&self, run: usize, rows: &[usize]) -> Result<SetOutput> {
        let keys = &self.finetune[self.run_finetune[run]];
        let mut out = self.select(&self.directions(false)?, keys, &[run], &[rows])?;
        out.pop().context("no selection")
    }
}
