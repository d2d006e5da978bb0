//! Phase 2 (docs/protocol.md §3): the last layer's query and key re-initialised and trained on the
//! noisy samples (the paper), or the card's token-selection head on the frozen final tokens, with
//! the query-key diagnostics (§5) at every scored epoch.

use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{Tensor, Var};

use super::attention_maps::{self, PER_KIND, Picks, Snapshot};
use super::checkpoint::Checkpoint;
use super::last_layer_sets::{LastLayerSets, RESIDENT_TEST_BYTES, TestRows};
use super::look_ahead::{EvaluatingStepFn, LookAhead};
use super::loops::{
    EpochMetrics, Forward, Penalty, Phase2Data, Phase2Model, Phase2Schedule, Set, Step,
    autograd_step, steps_per_epoch, train_phase2,
};
use super::optim::AdamW;
use super::progress::Progress;
use super::resume::Checkpoints;
use super::run::{FinetuneJob, Mode};
use super::setup::{RunFeatures, Setup, final_tokens, layer_inputs, text_mask};
use crate::data::prepare::PreparedData;
use crate::diagnostics::locater::{head_symmetric_variance, symmetric_variance};
use crate::diagnostics::{Spectrum, head_spectrum, mean_over_heads, spectrum};
use crate::encoder::Model;
use crate::encoder::layer_rows::LayerRows;
use crate::model::attend::KeyValues;
use crate::model::{LastLayer, QueryKey, TokenSelectionHead};
use crate::rng::Shuffle;

/// Test samples whose full last layer is run at scored epochs for the rank-collapse residual.
const RANK_PROBE: usize = 16;

/// The attention geometry of the last layer (or of the head, which has one D-dim head).
#[derive(Clone, Copy)]
pub(super) struct QkShape {
    pub(super) mode: Mode,
    pub(super) heads: usize,
    pub(super) head_dim: usize,
    pub(super) hidden: usize,
}

impl QkShape {
    pub(super) fn of(model: &Model, mode: Mode, hidden: usize) -> Self {
        let attention = match model {
            Model::Vit(v) => &v.last_layer().attention,
            Model::Bert(b) => &b.last_layer().attention,
        };
        Self {
            mode,
            heads: attention.num_heads,
            head_dim: attention.head_dim,
            hidden,
        }
    }

    pub(super) fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

/// A trained parameter by name, as the optimizer holds it.
pub(super) fn param(opt: &AdamW, name: &str) -> Result<Tensor> {
    Ok(opt
        .param(name)
        .with_context(|| format!("no parameter {name}"))?
        .as_tensor()
        .clone())
}

/// The query-key eigenspectrum (docs/protocol.md §5) of the trained parameters: per head and averaged in
/// last-layer mode; in head mode W itself, whose query is p, as in the synthetic model.
pub(super) fn qk_spectrum(opt: &AdamW, shape: QkShape) -> Result<Spectrum> {
    let host = |name: &str| -> Result<Vec<f32>> { Ok(param(opt, name)?.flatten_all()?.to_vec1()?) };
    Ok(match shape.mode {
        Mode::LastLayer => {
            let (wq, wk) = (host("query.weight")?, host("key.weight")?);
            let rows = shape.head_dim * shape.hidden;
            let per_head: Vec<Spectrum> = (0..shape.heads)
                .map(|h| {
                    head_spectrum(
                        &wq[h * rows..(h + 1) * rows],
                        &wk[h * rows..(h + 1) * rows],
                        shape.head_dim,
                        shape.scale(),
                    )
                })
                .collect();
            mean_over_heads(&per_head)
        }
        Mode::Head => spectrum(&nalgebra::DMatrix::from_row_iterator(
            shape.hidden,
            shape.hidden,
            host("head.w")?.into_iter().map(f64::from),
        )),
    })
}

/// LocAteR on the same query-key matrix the spectrum reads, when λ > 0.
pub(super) fn locater_penalty(
    opt: &AdamW,
    shape: QkShape,
    lambda: f64,
) -> Result<Option<Box<Penalty<'static>>>> {
    if lambda == 0.0 {
        return Ok(None);
    }
    Ok(Some(match shape.mode {
        Mode::LastLayer => {
            let (query, key) = (param(opt, "query.weight")?, param(opt, "key.weight")?);
            let (heads, scale) = (shape.heads, shape.scale());
            Box::new(move || -> Result<Tensor> {
                Ok((head_symmetric_variance(&query, &key, heads, scale)? * lambda)?)
            }) as Box<Penalty<'static>>
        }
        Mode::Head => {
            let w = param(opt, "head.w")?;
            Box::new(move || -> Result<Tensor> { Ok((symmetric_variance(&w)? * lambda)?) })
        }
    }))
}

/// Phase 2's record: every epoch's metrics, and the attention maps' samples right after the
/// reset and at the end.
pub(super) struct Phase2Log {
    pub(super) epochs: Vec<EpochMetrics>,
    pub(super) picks: Picks,
    pub(super) reset: Snapshot,
    pub(super) last: Snapshot,
}

/// The attention maps' samples right after the reset: as the checkpoint recorded them when it
/// did, else measured now. `forward` must still read the reset parameters, as it does before a
/// resumed optimizer state is restored; the reset is drawn from the run's seed, so a run resumed
/// from a checkpoint without the record measures exactly what the interrupted run did.
pub(super) fn reset_snapshot(
    forward: &Forward,
    picks: &Picks,
    resumed: Option<&Checkpoint>,
) -> Result<Snapshot> {
    if let Some(saved) = resumed.and_then(|c| c.state.attention_reset.as_ref())
        && saved.rows == picks.rows
    {
        return Ok(saved.clone());
    }
    attention_maps::snapshot(forward, picks, 0)
}

/// What every phase-2 mode trains with: the run, its labels, the attention geometry, the samples
/// pictured, and where checkpoints come from and go.
pub(super) struct Phase2Run<'a> {
    job: &'a FinetuneJob,
    data: Phase2Data<'a>,
    shape: QkShape,
    picks: Picks,
    checkpoints: &'a Checkpoints<'a>,
    resumed: Option<&'a Checkpoint>,
    progress: &'a dyn Progress,
}

impl Phase2Run<'_> {
    /// Trains `params` through `forward` with the run's optimizer and loop, resuming the
    /// optimizer from the checkpoint; at scored epochs the diagnostics join the metrics (the
    /// query-key spectrum, and rank collapse through `rank_probe`). Returns the log of every
    /// epoch, with the attention of the pictured samples before the first step and after the last.
    /// `forward` evaluates; `step` is a training step's arithmetic (autograd through a
    /// differentiable forward, or the last layer's host pass).
    fn train(
        &self,
        forward: &Forward,
        step: &Step,
        evaluating_step: Option<&EvaluatingStepFn>,
        params: Vec<(String, Var)>,
        rank_probe: Option<&dyn Fn() -> Result<f64>>,
    ) -> Result<Phase2Log> {
        let Self {
            job,
            data,
            shape,
            picks,
            checkpoints,
            resumed,
            progress,
        } = self;
        let (shape, resumed) = (*shape, *resumed);
        let config = &job.config;
        let total_steps = config.epochs * steps_per_epoch(config.n, config.batch_size);
        let mut opt = AdamW::new(params, config.optimizer.clone(), total_steps)?;
        let penalty = locater_penalty(&opt, shape, config.locater)?;
        let (start_epoch, mut log) = match resumed {
            Some(saved) => (saved.state.epochs_done, saved.state.log.clone()),
            None => (0, Vec::new()),
        };
        let reset = reset_snapshot(forward, picks, resumed)?;
        if let Some(saved) = resumed.filter(|s| s.state.epochs_done > 0) {
            opt.restore(&saved.tensors, saved.state.optimizer_step)?;
        }
        progress.stage("phase 2 epochs", config.epochs);
        progress.advance(start_epoch);
        let kept = |epoch: usize| checkpoints.writes(epoch);
        let look_ahead = evaluating_step.map(|step| LookAhead { step, kept: &kept });
        train_phase2(
            &Phase2Model {
                forward,
                step,
                look_ahead: look_ahead.as_ref(),
                penalty: penalty.as_deref(),
            },
            &mut opt,
            data,
            &Phase2Schedule {
                start_epoch,
                epochs: config.epochs,
                batch_size: config.batch_size,
                shuffle: Shuffle {
                    rng: config.rng,
                    seed: config.seed,
                },
                eval_every: config.eval_every,
                // A fresh run logs epoch 0 (right after the reset) first; a resumed one has it.
                measure_reset: log.is_empty(),
            },
            &mut |m: &EpochMetrics, opt: Option<&AdamW>| {
                let mut m = m.clone();
                if let (Some(opt), true) = (opt, m.test_acc.is_some()) {
                    m.qk_spectrum = Some(qk_spectrum(opt, shape)?);
                    m.rank_collapse = rank_probe.map(|probe| probe()).transpose()?;
                }
                if m.epoch > 0 {
                    progress.epoch(&m);
                }
                let epoch = m.epoch;
                progress.logged(&m);
                log.push(m);
                // An epoch evaluated during the next one: the optimizer has moved on, and that
                // epoch's end is neither kept nor the place to stop.
                let Some(opt) = opt else {
                    return Ok(());
                };
                let stop = crate::interrupt::requested();
                if checkpoints.due(epoch) || stop.is_some() {
                    checkpoints.save(epoch, Some(opt), &log, Some(&reset))?;
                }
                match stop {
                    Some(stop) => Err(checkpoints.stopped_after(epoch, stop)),
                    None => Ok(()),
                }
            },
        )?;
        Ok(Phase2Log {
            epochs: log,
            last: attention_maps::snapshot(forward, picks, config.epochs)?,
            picks: picks.clone(),
            reset,
        })
    }
}

/// Phase 2 on the noisy samples, in the run's mode.
pub(super) fn phase_two(
    setup: &Setup,
    prepared: &PreparedData,
    features: RunFeatures,
    checkpoints: &Checkpoints,
    resumed: Option<&Checkpoint>,
    init_rng: &mut rand_chacha::ChaCha8Rng,
    progress: &dyn Progress,
) -> Result<Phase2Log> {
    let job = checkpoints.job;
    let run = Phase2Run {
        job,
        data: Phase2Data {
            labels: &prepared.labels.labels,
            clean_labels: &prepared.labels.clean_labels,
            noisy_mask: &prepared.labels.noisy_mask,
            test_labels: &prepared.test.labels,
        },
        shape: QkShape::of(
            &setup.backbone.model,
            job.config.mode,
            setup.backbone.hidden_size(),
        ),
        picks: Picks::choose(
            &prepared.labels.noisy_mask,
            layer_inputs(&features.finetune)?.lengths(),
            PER_KIND,
        ),
        checkpoints,
        resumed,
        progress,
    };
    // The n ≤ 1000 fine-tune samples are read once into memory; the test set too when it fits
    // `RESIDENT_TEST_BYTES`, else it streams from the cache a chunk at a time, so that no
    // set-sized buffer exists whatever its size.
    let train_rows = layer_inputs(&features.finetune)?.resident()?;
    let test_rows = layer_inputs(&features.test)?.clone();
    drop(features);
    match job.config.mode {
        Mode::LastLayer => train_last_layer(&run, setup, train_rows, &test_rows, init_rng),
        Mode::Head => train_head(&run, setup, train_rows, &test_rows, init_rng),
    }
}

/// The paper's phase 2: the last layer's query and key, reset, trained through the frozen rest of
/// the layer and the phase-1 classifier.
fn train_last_layer(
    run: &Phase2Run,
    setup: &Setup,
    train_rows: LayerRows,
    test_rows: &LayerRows,
    init_rng: &mut rand_chacha::ChaCha8Rng,
) -> Result<Phase2Log> {
    let device = &setup.device;
    let layer = LastLayer::new(&setup.backbone.model, &run.checkpoints.phase1.classifier)?;
    // Rank collapse is read on the first test samples' full layer (every token's query).
    let probe_rows: Vec<usize> = (0..RANK_PROBE.min(test_rows.len())).collect();
    let probe = test_rows.batch(&probe_rows, device)?;
    let probe_mask = text_mask(&setup.backbone.model, &probe)?;
    let qk = QueryKey::reset(setup.backbone.hidden_size(), init_rng, device)?;
    let rank_probe = || layer.rank_collapse(&qk, &probe.inputs, probe_mask.as_ref());
    let resident = layer.resident(&train_rows, device)?;
    drop(train_rows);
    let sample_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(run.job.sample_threads)
        .build()
        .context("building phase 2's sample thread pool")?;
    let sets = LastLayerSets {
        layer: &layer,
        qk: &qk,
        finetune: &resident,
        test: TestRows::held_if_within(&layer, test_rows, RESIDENT_TEST_BYTES)?,
        labels: run.data.labels,
        sample_pool: &sample_pool,
    };
    let forward = |set: Set, rows: &[usize]| sets.evaluate(set, rows);
    let step = |rows: &[usize]| sets.step(rows);
    let evaluating_step = |rows: &[usize], earlier: &[Tensor]| sets.step_evaluating(rows, earlier);
    let train = || {
        // The look-ahead evaluation is the host pass's.
        let evaluating_step = layer
            .has_host_pass()
            .then_some(&evaluating_step as &EvaluatingStepFn);
        run.train(
            &forward,
            &step,
            evaluating_step,
            qk.named(),
            Some(&rank_probe),
        )
    };
    if !layer.has_host_pass() {
        // Autograd's small ops stay on the training pool (`--train-threads`).
        return train();
    }
    // The host pass's whole loop on one of the sample pool's threads, not only its parallel
    // parts: the serial work between them (the optimizer, the metrics) then runs beside idle pool
    // threads rather than on a third busy one, which on a 2-core machine the waiting workers'
    // yields kept preempting (design.md, threads).
    sample_pool.install(train)
}

/// The card's head mode: a token-selection head over the frozen final tokens, read by the frozen
/// phase-1 classifier.
fn train_head(
    run: &Phase2Run,
    setup: &Setup,
    train_rows: LayerRows,
    test_rows: &LayerRows,
    init_rng: &mut rand_chacha::ChaCha8Rng,
) -> Result<Phase2Log> {
    let device = &setup.device;
    // The final tokens are what the head selects from: the fine-tune set's in memory, the test
    // set's in a temporary file beside the cache, each computed once.
    let model = &setup.backbone.model;
    let train_tokens = final_tokens(model, &train_rows, device, None)?;
    let test_tokens = final_tokens(model, test_rows, device, Some(setup.cache.root()))?;
    drop(train_rows);
    // The fine-tune set's tokens once as the head reads them; test batches as they come.
    let as_keys = |tokens: &LayerRows, rows: &[usize]| -> Result<Arc<KeyValues>> {
        let batch = tokens.batch(rows, device)?;
        Ok(Arc::new(KeyValues::new(
            &batch.inputs,
            1,
            Some(&batch.lengths),
            1.0,
        )?))
    };
    let all_train: Vec<usize> = (0..train_tokens.len()).collect();
    let train_keys = as_keys(&train_tokens, &all_train)?;
    drop(train_tokens);
    let head = TokenSelectionHead::new(setup.backbone.hidden_size(), init_rng, device)?;
    let classifier = &run.checkpoints.phase1.classifier;
    let forward = |set: Set, rows: &[usize]| {
        let selection = match set {
            Set::Finetune => head.select(&train_keys, rows)?,
            Set::Test => {
                let keys = as_keys(&test_tokens, rows)?;
                head.select(&keys, &(0..rows.len()).collect::<Vec<_>>())?
            }
        };
        Ok((classifier.forward(&selection.pooled)?, selection.attention))
    };
    let step = autograd_step(&forward, run.data.labels, vars(&head.named()));
    run.train(&forward, &step, None, head.named(), None)
}

/// The variables of named parameters.
fn vars(params: &[(String, Var)]) -> Vec<Var> {
    params.iter().map(|(_, v)| v.clone()).collect()
}
