//! Phase 2 of one stack of runs: the checks that they may train together, the trainee for the mode,
//! the loop from where they stand, the attention maps before and after.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};

use super::epochs::EpochPlan;
use super::head::HeadTrainee;
use super::query_key::LastLayerTrainee;
use super::record::Records;
use super::runs::{RunContext, RunData, StackShared};
use super::trainee::Trainee;
use crate::rng::Shuffle;
use crate::train::attention_maps::{self, PER_KIND, Picks, Snapshot};
use crate::train::checkpoint::{Checkpoint, StartPoint};
use crate::train::metrics::EpochMetrics;
use crate::train::run::Mode;

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
pub(in crate::train) fn phase_two(
    shared: &StackShared,
    runs: &[RunContext],
) -> Result<Vec<Phase2Log>> {
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
        let distinct = |samples: Vec<super::runs::Samples>| {
            let copies = super::runs::copies(&samples);
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
pub(super) fn train(trainee: &mut dyn Trainee, runs: &[RunContext]) -> Result<Vec<Phase2Log>> {
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
    super::epochs::train(trainee, &plan, &mut records)?;
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
