//! What phase 2 keeps of each evaluated epoch, run by run: its metrics (with the query-key
//! diagnostics at scored epochs), the run's log and progress, and its checkpoint when one is due
//! or a signal asked the process to stop.

use anyhow::Result;

use super::epochs::Record;
use super::runs::{Labels, RunContext};
use super::trainee::{EpochEnd, EpochEvaluation, RunEvaluation};
use crate::train::attention_maps::Snapshot;
use crate::train::metrics::{EpochMetrics, accuracy_where, attention_stats, evaluate};
use crate::train::optim::AdamW;

/// Each run's metrics as they are evaluated: what a bench or a test keeps of phase 2, and the
/// first part of [`Records`].
pub struct MetricsLog<'a> {
    labels: Vec<Labels<'a>>,
    pub logs: Vec<Vec<EpochMetrics>>,
}

impl<'a> MetricsLog<'a> {
    /// Runs with these labels, each with its log so far.
    pub fn new(labels: Vec<Labels<'a>>, logs: Vec<Vec<EpochMetrics>>) -> Self {
        Self { labels, logs }
    }
}

impl Record for MetricsLog<'_> {
    fn epoch(
        &mut self,
        evaluation: EpochEvaluation,
        batch_losses: Option<&[Vec<f64>]>,
    ) -> Result<()> {
        let epoch = evaluation.epoch;
        for (k, evaluated) in evaluation.runs.into_iter().enumerate() {
            let losses = batch_losses.map(|l| l[k].as_slice());
            self.logs[k].push(metrics_of(evaluated, &self.labels[k], epoch, losses)?);
        }
        Ok(())
    }
}

/// Every run's log so far, with the attention maps' samples right after its reset; each
/// evaluated epoch also goes to the run's progress, and its checkpoint when one is due.
pub(in crate::train) struct Records<'a> {
    runs: &'a [RunContext<'a>],
    pub(in crate::train) log: MetricsLog<'a>,
    resets: &'a [Snapshot],
}

impl<'a> Records<'a> {
    /// Each run's log as its checkpoint left it (empty for a new run).
    pub(in crate::train) fn new(runs: &'a [RunContext<'a>], resets: &'a [Snapshot]) -> Self {
        let logs = runs
            .iter()
            .map(|run| run.resumed.map_or_else(Vec::new, |c| c.state.log.clone()))
            .collect();
        let labels = runs.iter().map(|run| run.data.labels).collect();
        Self {
            runs,
            log: MetricsLog::new(labels, logs),
            resets,
        }
    }
}

impl Record for Records<'_> {
    fn epoch(
        &mut self,
        evaluation: EpochEvaluation,
        batch_losses: Option<&[Vec<f64>]>,
    ) -> Result<()> {
        self.log.epoch(evaluation, batch_losses)?;
        for (k, run) in self.runs.iter().enumerate() {
            let Some(metrics) = self.log.logs[k].last() else {
                continue;
            };
            // The stack's progress bar advances once an epoch, with its first run's numbers.
            if metrics.epoch > 0 && k == 0 {
                run.progress.epoch(metrics);
            }
            run.progress.logged(metrics);
        }
        Ok(())
    }

    fn kept(&mut self, optimizer: &AdamW, end: &EpochEnd) -> Result<()> {
        let epoch = end.epoch;
        let stop = crate::interrupt::requested();
        for (k, run) in self.runs.iter().enumerate() {
            if run.checkpoints.due(epoch) || stop.is_some() {
                let state = Some((optimizer, k));
                run.checkpoints
                    .save(epoch, state, &self.log.logs[k], Some(&self.resets[k]))?;
            }
        }
        match stop {
            Some(stop) => Err(stopped(self.runs, epoch, stop)),
            None => Ok(()),
        }
    }
}

/// The error of a stack stopped by a signal after `epoch`, its runs' checkpoints written.
fn stopped(
    runs: &[RunContext],
    epoch: usize,
    stop: crate::interrupt::Interrupted,
) -> anyhow::Error {
    match runs {
        [run] => run.checkpoints.stopped_after(epoch, stop),
        _ => {
            let line = format!(
                "{stop} after phase-2 epoch {epoch} of {} runs trained together; {}",
                runs.len(),
                runs[0].checkpoints.kept_where(runs.len())
            );
            anyhow::Error::new(stop).context(line)
        }
    }
}

/// A run's metrics after `epoch` epochs from its evaluation, its labels and the epoch's
/// `batch_losses` (none at epoch 0).
fn metrics_of(
    evaluated: RunEvaluation,
    labels: &Labels,
    epoch: usize,
    batch_losses: Option<&[f64]>,
) -> Result<EpochMetrics> {
    let train = evaluate(&evaluated.finetune.logits, labels.labels)?;
    let (max_cls_attention, attention_entropy) = attention_stats(&evaluated.finetune.attention)?;
    let test = match &evaluated.test_logits {
        Some(logits) => Some(evaluate(logits, labels.test_labels)?),
        None => None,
    };
    let train_loss = batch_losses.map_or(f64::NAN, |l| l.iter().sum::<f64>() / l.len() as f64);
    if epoch > 0 {
        crate::train::metrics::finite_loss("phase-2", epoch, train_loss)?;
        crate::train::metrics::finite_loss("phase-2", epoch, train.loss)?;
    }
    Ok(EpochMetrics {
        epoch,
        train_loss,
        train_eval_loss: train.loss,
        train_acc: train.accuracy,
        memorization: accuracy_where(&train.predictions, labels.labels, |i| labels.noisy_mask[i]),
        clean_train_acc: accuracy_where(&train.predictions, labels.clean_labels, |i| {
            !labels.noisy_mask[i]
        }),
        max_cls_attention,
        attention_entropy,
        test_loss: test.as_ref().map(|t| t.loss),
        test_acc: test.as_ref().map(|t| t.accuracy),
        qk_spectrum: evaluated.spectrum,
        rank_collapse: evaluated.rank_collapse,
    })
}
