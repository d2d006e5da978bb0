//! Phase 2's loop over a stack of runs, with the Trainer's conventions (docs/protocol.md §3):
//! each epoch, every run's fine-tune set in its own shuffled order, in batches of `batch_size` (the
//! last one smaller), one AdamW step of every run per batch (its gradients, then the update); then
//! the evaluations the epoch's end completes recorded, and a kept end's state saved. The loop reads
//! in full in docs/design.md, "Phase 2: a stack of runs".

use anyhow::{Context, Result};

use super::objective::Gradients;
use super::trainee::{EpochEnd, EpochEvaluation, Trainee};
use crate::rng::{Shuffle, Stream};
use crate::train::classifier_loop::steps_per_epoch;
use crate::train::optim::AdamW;

/// When and in what order a stack steps.
pub struct EpochPlan<'a> {
    /// Epochs `start_epoch..epochs` (0-based) run; `epochs` is the runs' whole length.
    pub start_epoch: usize,
    pub epochs: usize,
    pub batch_size: usize,
    /// Fine-tune samples of every run.
    pub n: usize,
    /// Each run's batch order.
    pub shuffles: Vec<Shuffle>,
    /// The test set is scored every `eval_every` epochs and after the last one.
    pub eval_every: usize,
    /// Epoch 0 (right after the reset, before any step) is measured and recorded first.
    pub measure_reset: bool,
    /// Whether an epoch's end state is kept by some run (a checkpoint is written there).
    pub kept: &'a (dyn Fn(usize) -> bool + Sync),
}

impl EpochPlan<'_> {
    /// The end of epoch `done` (1-based): scored or not, kept or not. An interrupt asked for
    /// keeps it too: the run stops there with a checkpoint.
    fn end_of(&self, done: usize) -> EpochEnd {
        EpochEnd {
            epoch: done,
            score_test: done == self.epochs || done.is_multiple_of(self.eval_every.max(1)),
            kept: (self.kept)(done) || crate::interrupt::requested().is_some(),
        }
    }

    /// Epoch `epoch`'s batches (0-based): at step k, every run's batch k of its own order.
    fn batches(&self, epoch: usize) -> Vec<Vec<Vec<usize>>> {
        let orders: Vec<Vec<usize>> = self
            .shuffles
            .iter()
            .map(|shuffle| shuffle.order(self.n, Stream::FinetuneShuffle, epoch))
            .collect();
        let size = self.batch_size;
        (0..steps_per_epoch(self.n, size))
            .map(|k| {
                orders
                    .iter()
                    .map(|order| order[k * size..order.len().min((k + 1) * size)].to_vec())
                    .collect()
            })
            .collect()
    }
}

/// Where the loop sends what it evaluated: every run's metrics of one epoch.
pub trait Record {
    /// `batch_losses` holds each run's batch losses of that epoch (none for epoch 0).
    fn epoch(
        &mut self,
        evaluation: EpochEvaluation,
        batch_losses: Option<&[Vec<f64>]>,
    ) -> Result<()>;

    /// The end of a kept epoch, every evaluation up to it recorded: the place for a checkpoint,
    /// and for a stop a signal asked for.
    fn kept(&mut self, _optimizer: &AdamW, _end: &EpochEnd) -> Result<()> {
        Ok(())
    }
}

/// Trains the stack for the plan's epochs and records every epoch's evaluation in order. The
/// trainee's optimizer must have been built for all the plan's epochs (and restored on resume).
pub fn train(trainee: &mut dyn Trainee, plan: &EpochPlan, record: &mut dyn Record) -> Result<()> {
    // Each epoch's batch losses, until its evaluation is recorded.
    let mut losses = EpochLosses::default();
    if plan.measure_reset {
        // Epoch 0, with the test set scored, so that the reset's cost and the noise's are two
        // numbers.
        let reset = EpochEnd {
            epoch: 0,
            score_test: true,
            kept: true,
        };
        end_epoch(trainee, &reset, &mut losses, record)?;
    }
    for epoch in plan.start_epoch..plan.epochs {
        let batches = plan.batches(epoch);
        // The steps fork and join dozens of times each: the pool's other threads stay awake
        // through them, and sleep again for the evaluation.
        let step_losses = crate::runtime::with_workers_awake(|| {
            let mut step_losses = Vec::with_capacity(batches.len());
            for batch in &batches {
                let rows: Vec<&[usize]> = batch.iter().map(Vec::as_slice).collect();
                let Gradients { losses, gradients } = trainee.gradients(&rows)?;
                trainee.optimizer_mut().apply(gradients)?;
                step_losses.push(losses);
            }
            anyhow::Ok(step_losses)
        })?;
        // Every run's batch losses of the epoch, (runs, steps), in one read.
        let epoch_losses =
            crate::kernels::host_reads::rows::<f64>(&candle_core::Tensor::stack(&step_losses, 1)?)?;
        losses.waiting.push((epoch + 1, epoch_losses));
        end_epoch(trainee, &plan.end_of(epoch + 1), &mut losses, record)?;
    }
    Ok(())
}

/// Each run's batch losses of the epochs whose evaluation is still to come.
#[derive(Default)]
struct EpochLosses {
    waiting: Vec<(usize, Vec<Vec<f64>>)>,
}

impl EpochLosses {
    /// Epoch `epoch`'s losses, which leave the waiting ones; none for epoch 0 (no step).
    fn take(&mut self, epoch: usize) -> Result<Option<Vec<Vec<f64>>>> {
        if epoch == 0 {
            return Ok(None);
        }
        let at = self
            .waiting
            .iter()
            .position(|(e, _)| *e == epoch)
            .with_context(|| format!("epoch {epoch} evaluated twice"))?;
        Ok(Some(self.waiting.remove(at).1))
    }
}

/// The end of an epoch: the evaluations it completes recorded with their epochs' batch losses,
/// then, where the epoch is kept, its state.
fn end_epoch(
    trainee: &mut dyn Trainee,
    end: &EpochEnd,
    losses: &mut EpochLosses,
    record: &mut dyn Record,
) -> Result<()> {
    for evaluation in trainee.evaluations(end)? {
        let batch_losses = losses.take(evaluation.epoch)?;
        record.epoch(evaluation, batch_losses.as_deref())?;
    }
    if end.kept {
        record.kept(trainee.optimizer(), end)?;
    }
    Ok(())
}
