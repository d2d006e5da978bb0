//! Phase 2's loop over a stack of runs, with the Trainer's conventions (docs/protocol.md §3):
//! each epoch, every run's fine-tune set in its own shuffled order, in batches of `batch_size` (the
//! last one smaller), one AdamW step of every run per batch; then every run evaluated, and what
//! was evaluated recorded.

use anyhow::{Context, Result};

use super::trainee::{EpochEnd, Evaluation, Trainee};
use crate::rng::{Shuffle, Stream};
pub use crate::train::loops::steps_per_epoch;

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
            now: (self.kept)(done) || crate::interrupt::requested().is_some(),
        }
    }
}

/// Where the loop sends what it evaluated: every run's metrics of one epoch.
pub trait Record {
    /// `batch_losses` holds each run's batch losses of that epoch (none for epoch 0).
    fn epoch(
        &mut self,
        trainee: &dyn Trainee,
        evaluation: Evaluation,
        batch_losses: Option<&[Vec<f64>]>,
    ) -> Result<()>;
}

/// Trains the stack for the plan's epochs and records every epoch's evaluation in order. The
/// trainee's optimizer must have been built for all the plan's epochs (and restored on resume).
pub fn train(trainee: &mut dyn Trainee, plan: &EpochPlan, record: &mut dyn Record) -> Result<()> {
    if plan.measure_reset {
        // Epoch 0, with the test set scored, so that the reset's cost and the noise's are two
        // numbers.
        let reset = EpochEnd {
            epoch: 0,
            score_test: true,
            now: true,
        };
        if let Some(evaluation) = trainee.evaluate(&reset)? {
            record.epoch(trainee, evaluation, None)?;
        }
    }
    // Batch losses of the epochs whose evaluation is still to come.
    let mut losses: Vec<(usize, Vec<Vec<f64>>)> = Vec::new();
    for epoch in plan.start_epoch..plan.epochs {
        let orders: Vec<Vec<usize>> = plan
            .shuffles
            .iter()
            .map(|shuffle| shuffle.order(plan.n, Stream::FinetuneShuffle, epoch))
            .collect();
        // The steps fork and join dozens of times each: the pool's other threads stay awake
        // through them, and sleep again for the evaluation.
        let epoch_losses =
            crate::runtime::with_workers_awake(|| run_steps(trainee, &orders, plan.batch_size))?;
        losses.push((epoch + 1, epoch_losses));
        // The epoch before, if its evaluation rode along these steps, then this one's.
        if let Some(evaluation) = trainee.deferred()? {
            record_epoch(trainee, record, evaluation, &mut losses)?;
        }
        if let Some(evaluation) = trainee.evaluate(&plan.end_of(epoch + 1))? {
            record_epoch(trainee, record, evaluation, &mut losses)?;
        }
    }
    Ok(())
}

/// `evaluation` recorded with its epoch's batch losses, which leave `losses`.
fn record_epoch(
    trainee: &dyn Trainee,
    record: &mut dyn Record,
    evaluation: Evaluation,
    losses: &mut Vec<(usize, Vec<Vec<f64>>)>,
) -> Result<()> {
    let at = losses
        .iter()
        .position(|(e, _)| *e == evaluation.epoch)
        .with_context(|| format!("epoch {} evaluated twice", evaluation.epoch))?;
    let (_, batch_losses) = losses.remove(at);
    record.epoch(trainee, evaluation, Some(&batch_losses))
}

/// One epoch's steps: every run's batch k at step k. Each run's batch losses in order.
fn run_steps(
    trainee: &mut dyn Trainee,
    orders: &[Vec<usize>],
    batch_size: usize,
) -> Result<Vec<Vec<f64>>> {
    let n = orders.first().map_or(0, Vec::len);
    let steps = steps_per_epoch(n, batch_size);
    let mut losses = vec![Vec::with_capacity(steps); orders.len()];
    for k in 0..steps {
        let batches: Vec<&[usize]> = orders
            .iter()
            .map(|order| &order[k * batch_size..order.len().min((k + 1) * batch_size)])
            .collect();
        let step = trainee.step(&batches)?;
        for (run, loss) in losses.iter_mut().zip(step.losses) {
            run.push(loss);
        }
    }
    Ok(losses)
}
