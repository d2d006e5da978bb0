//! Phase 2 (docs/protocol.md §3) of a stack of runs: the last layer's query and key
//! re-initialised and trained on each run's noisy samples (the paper), or the card's
//! token-selection head on the frozen final tokens, with the query-key diagnostics (§5) at every
//! scored epoch. A lone run is a stack of one. Read in this order:
//!
//! - [`runs`]: the runs trained together, each with its explicit context (job, classifier,
//!   labels, sets, checkpoints), and which samples they share;
//! - [`trainee`]: what phase 2 trains, as one trait: each batch's gradients, the optimizer, the
//!   evaluations an epoch's end completes;
//! - [`objective`]: the stack's loss and its gradients through autograd;
//! - [`epochs`]: the loop over a trainee (batches, gradients, update; evaluations; checkpoints);
//! - [`record`]: each evaluated epoch's metrics, log, progress and checkpoint, run by run;
//! - [`query_key`] and its [`look_ahead`]: the paper's trainee; [`head`]: the card's.
//!
//! [`phase_two`] puts them together.

pub mod epochs;
pub mod head;
pub mod look_ahead;
pub mod objective;
pub mod query_key;
pub mod record;
pub mod runs;
pub mod trainee;

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use candle_core::{Tensor, Var};

use self::epochs::EpochPlan;
use self::head::HeadTrainee;
use self::query_key::LastLayerTrainee;
use self::record::Records;
use self::runs::{RunContext, RunData, Shared};
use self::trainee::Trainee;
use super::attention_maps::{self, PER_KIND, Picks, Snapshot};
use super::checkpoint::{Checkpoint, StartPoint};
use super::metrics::EpochMetrics;
use super::optim::AdamW;
use super::run::{Mode, RunConfig};
use crate::diagnostics::{Spectrum, head_spectrum, mean_over_heads, spectrum};
use crate::encoder::Model;
use crate::rng::Shuffle;

/// One run's phase 2: every epoch's metrics, and the attention maps' samples right after the
/// reset and at the end.
pub struct Phase2Log {
    pub epochs: Vec<EpochMetrics>,
    pub picks: Picks,
    pub reset: Snapshot,
    pub last: Snapshot,
}

/// Trains the stack `runs` and returns each run's log, in their order. The runs must agree on
/// everything but η and the seed ([`crate::train::run::RunConfig::stack_key`]) and have done the
/// same number of epochs.
pub(super) fn phase_two(shared: &Shared, runs: &[RunContext]) -> Result<Vec<Phase2Log>> {
    let first = runs.first().context("phase 2 of no runs")?;
    let key = first.job.config.stack_key();
    let data: Vec<&RunData> = runs.iter().map(|run| &run.data).collect();
    let start = |run: &RunContext| StartPoint::of(run.resumed);
    for run in runs {
        ensure!(
            run.job.config.stack_key() == key
                && run.job.checkpoint_every == first.job.checkpoint_every,
            "{} and {} differ in more than η and the seed: they cannot train together",
            first.job.config.run_name()?,
            run.job.config.run_name()?
        );
        ensure!(
            start(run) == start(first),
            "{} resumes at {:?} and {} at {:?}: runs train together from the same start",
            first.job.config.run_name()?,
            start(first),
            run.job.config.run_name()?,
            start(run)
        );
    }
    if runs.len() > 1 {
        let distinct = |samples: Vec<runs::Samples>| {
            let copies = runs::copies(&samples);
            copies.iter().enumerate().filter(|(k, c)| *k == **c).count()
        };
        first.progress.note(&format!(
            "phase 2 of {} runs together: {} fine-tune set(s) and {} test set(s) between them",
            runs.len(),
            distinct(data.iter().map(|d| d.finetune_samples).collect()),
            distinct(data.iter().map(|d| d.test_samples).collect()),
        ));
    }
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(first.job.sample_threads)
            .build()
            .context("building phase 2's sample thread pool")?,
    );
    match first.job.config.mode {
        Mode::LastLayer => {
            let mut trainee = LastLayerTrainee::new(shared, &data, Arc::clone(&pool))?;
            if !trainee.has_host_pass() {
                // Autograd's small ops stay on the training pool (`--train-threads`).
                return train(&mut trainee, runs);
            }
            // The host pass's whole loop on one of the pool's threads, not only its parallel
            // parts: the serial work between them (the optimizer, the metrics) then runs beside
            // idle pool threads rather than on a third busy one (docs/design.md, threads).
            pool.install(|| train(&mut trainee, runs))
        }
        Mode::Head => train(&mut HeadTrainee::new(shared, &data)?, runs),
    }
}

/// The loop over `trainee` from where the runs stand, with the attention maps' samples before
/// the first step and after the last.
fn train(trainee: &mut dyn Trainee, runs: &[RunContext]) -> Result<Vec<Phase2Log>> {
    let config = &runs[0].job.config;
    let picks: Vec<Picks> = runs
        .iter()
        .map(|run| {
            Picks::choose(
                run.data.labels.noisy_mask,
                run.data.finetune.lengths(),
                PER_KIND,
            )
        })
        .collect();
    // Before a resumed state is restored: the reset is what they picture.
    let resets = runs
        .iter()
        .zip(&picks)
        .enumerate()
        .map(|(k, (run, picks))| reset_snapshot(trainee, k, picks, run.resumed))
        .collect::<Result<Vec<_>>>()?;
    let mut start_epoch = 0;
    for (k, run) in runs.iter().enumerate() {
        if let Some(saved) = run.resumed.filter(|s| s.state.epochs_done > 0) {
            let optimizer = trainee.optimizer_mut();
            optimizer.restore_run(k, &saved.tensors, saved.state.optimizer_step)?;
            start_epoch = saved.state.epochs_done;
        }
    }
    runs[0].progress.stage("phase 2 epochs", config.epochs);
    runs[0].progress.advance(start_epoch);
    let kept = |epoch: usize| runs.iter().any(|run| run.checkpoints.writes(epoch));
    let plan = EpochPlan {
        start_epoch,
        epochs: config.epochs,
        batch_size: config.batch_size,
        n: config.n,
        shuffles: runs
            .iter()
            .map(|run| Shuffle {
                rng: run.job.config.rng,
                seed: run.job.config.seed,
            })
            .collect(),
        eval_every: config.eval_every,
        // A fresh run logs epoch 0 (right after the reset) first; a resumed one has it.
        measure_reset: !StartPoint::of(runs[0].resumed).reset_logged,
        kept: &kept,
    };
    let mut records = Records::new(runs, &resets);
    epochs::train(trainee, &plan, &mut records)?;
    let logs = std::mem::take(&mut records.log.logs);
    logs.into_iter()
        .zip(picks)
        .zip(resets)
        .enumerate()
        .map(|(k, ((epochs, picks), reset))| {
            let last = attention_maps::snapshot(&picks, config.epochs, |rows| {
                let out = trainee.pictured(k, rows)?;
                Ok((out.logits, out.attention))
            })?;
            Ok(Phase2Log {
                epochs,
                picks,
                reset,
                last,
            })
        })
        .collect()
}

/// The attention maps' samples right after the reset: as the checkpoint recorded them when it
/// did, else measured now. The trainee must still hold the reset parameters, as it does before a
/// resumed optimizer state is restored; the reset is drawn from the run's seed, so a run resumed
/// from a checkpoint without the record measures exactly what the interrupted run did.
fn reset_snapshot(
    trainee: &dyn Trainee,
    run: usize,
    picks: &Picks,
    resumed: Option<&Checkpoint>,
) -> Result<Snapshot> {
    if let Some(saved) = resumed.and_then(|c| c.state.attention_reset.as_ref())
        && saved.rows == picks.rows
    {
        return Ok(saved.clone());
    }
    attention_maps::snapshot(picks, 0, |rows| {
        let out = trainee.pictured(run, rows)?;
        Ok((out.logits, out.attention))
    })
}

/// The attention geometry of the last layer (or of the head, which has one D-dim head).
#[derive(Clone, Copy)]
pub struct QkShape {
    pub mode: Mode,
    pub heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
}

impl QkShape {
    pub fn of(model: &Model, mode: Mode, hidden: usize) -> Self {
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

    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

/// The stack's optimizer over each run's freshly initialised parameters (`runs`, each run's named
/// parameters in one order), for all of `config`'s epochs.
pub fn stacked_optimizer(
    config: &RunConfig,
    runs: &[Vec<(String, Var)>],
    route: runs::Route,
) -> Result<AdamW> {
    let optimizer = AdamW::stacked(
        stacked_parameters(runs)?,
        runs.len(),
        config.optimizer.clone(),
        config.epochs * epochs::steps_per_epoch(config.n, config.batch_size),
    )?;
    match route {
        runs::Route::Host => Ok(optimizer),
        runs::Route::Resident => optimizer.with_device_moments(),
    }
}

/// Each named parameter of every run stacked along a new first axis, as one variable per name
/// (the runs' lists in the same order).
pub fn stacked_parameters(runs: &[Vec<(String, Var)>]) -> Result<Vec<(String, Var)>> {
    let first = runs.first().context("no runs to stack")?;
    first
        .iter()
        .enumerate()
        .map(|(k, (name, _))| {
            let parts = runs
                .iter()
                .map(|run| {
                    let (other, var) = run.get(k).context("runs of different parameters")?;
                    ensure!(other == name, "runs name their parameters differently");
                    Ok(var.as_tensor().detach())
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((name.clone(), Var::from_tensor(&Tensor::stack(&parts, 0)?)?))
        })
        .collect()
}

/// Run `run`'s query-key eigenspectrum (docs/protocol.md §5): per head and averaged in
/// last-layer mode; in head mode W itself, whose query is p, as in the synthetic model.
pub fn qk_spectrum(opt: &AdamW, run: usize, shape: QkShape) -> Result<Spectrum> {
    let host = |name: &str| -> Result<Vec<f32>> {
        Ok(crate::kernels::host_reads::flat(
            &opt.param_of_run(name, run)?,
        )?)
    };
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
