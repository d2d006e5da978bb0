//! What carries a run across sittings: the checkpoint it resumes from (refused when it belongs to
//! another run), the float kernels of each sitting, the wall clock summed over them, and the
//! writer of the next checkpoint.

use std::time::Instant;

use anyhow::Result;
use candle_core::Device;

use super::attention_maps::Snapshot;
use super::checkpoint::{self, Checkpoint, RunIdentity, RunState};
use super::classifier_loop::steps_per_epoch;
use super::metrics::EpochMetrics;
use super::optim::AdamW;
use super::phase1::Phase1Outcome;
use super::progress::Progress;
use super::run::FinetuneJob;
use super::setup::Setup;
use crate::interrupt::Interrupted;

/// The checkpoint of this very run, when resuming; an error when it belongs to another run.
pub(super) fn resumed_checkpoint(
    job: &FinetuneJob,
    identity: &RunIdentity,
    device: &Device,
    progress: &dyn Progress,
) -> Result<Option<Checkpoint>> {
    let (Some(dir), true) = (&job.out, job.resume) else {
        return Ok(None);
    };
    match checkpoint::load(dir, device)? {
        Some(saved) => {
            let file = checkpoint::path(dir);
            identity.ensure_same(&saved.state.identity, &file)?;
            let config = &identity.config;
            saved
                .state
                .ensure_consistent(steps_per_epoch(config.n, config.batch_size), &file)?;
            Ok(Some(saved))
        }
        None => {
            progress.note(&format!(
                "--resume: no checkpoint in {}, starting from the beginning",
                dir.display()
            ));
            Ok(None)
        }
    }
}

/// A run resumed on a CPU whose float kernels differ from those of the sittings before: the
/// summary lists each sitting's, and a deviation says that the run equals an uninterrupted one
/// only to float rounding (resuming is bit-exact on the same kind of CPU only).
pub(super) fn record_resumed_kernels(setup: &mut Setup, saved: &Checkpoint) {
    let Some(history) = kernel_history(&saved.state.float_kernels, &setup.float_kernels) else {
        setup.float_kernels = saved.state.float_kernels.clone();
        return;
    };
    setup.deviations.push(format!(
        "resumed after epoch {} with other float kernels ({history}): float sums differ in \
         order from there on, so the run equals an uninterrupted one only to float rounding",
        saved.state.epochs_done
    ));
    setup.float_kernels = history;
}

/// The sittings' kernels once a sitting with `now` follows those of `before` (empty: not
/// recorded, a checkpoint from before they were kept); None when `now` is what the last sitting
/// ran with.
pub(super) fn kernel_history(before: &str, now: &str) -> Option<String> {
    let before = if before.is_empty() {
        "unrecorded"
    } else {
        before
    };
    (before.rsplit(", then ").next() != Some(now)).then(|| format!("{before}, then {now}"))
}

/// A run's wall time over its sittings: this one's since it started, plus what the checkpoint it
/// resumed from had recorded (the work a killed sitting did after its last checkpoint is redone,
/// and counted, in the next).
pub(super) struct WallClock {
    pub(super) started: Instant,
    pub(super) earlier_sittings: f64,
}

impl WallClock {
    pub(super) fn seconds(&self) -> f64 {
        self.earlier_sittings + self.started.elapsed().as_secs_f64()
    }
}

/// Writes the run's checkpoint (phase 1, then every `checkpoint_every` phase-2 epochs).
pub(super) struct Checkpoints<'a> {
    pub(super) job: &'a FinetuneJob,
    pub(super) identity: RunIdentity,
    pub(super) phase1: &'a Phase1Outcome,
    /// The float kernels of every sitting so far (see [`Resolved::float_kernels`]).
    pub(super) float_kernels: String,
    pub(super) clock: &'a WallClock,
}

impl Checkpoints<'_> {
    /// The checkpoint after `epochs_done` phase-2 epochs: phase 1, and with `optimizer` run `k`'s
    /// parameters and moments among a stack's (a lone run is run 0 of its own).
    pub(super) fn save(
        &self,
        epochs_done: usize,
        optimizer: Option<(&AdamW, usize)>,
        log: &[EpochMetrics],
        attention_reset: Option<&Snapshot>,
    ) -> Result<()> {
        let Some(dir) = &self.job.out else {
            return Ok(());
        };
        if self.job.checkpoint_every == 0 {
            return Ok(());
        }
        let state = RunState {
            identity: self.identity.clone(),
            baseline_test_acc: self.phase1.baseline_test_acc,
            pretrain_losses: self.phase1.pretrain_losses.clone(),
            epochs_done,
            optimizer_step: optimizer.map_or(0, |(o, _)| o.step),
            log: log.to_vec(),
            attention_reset: attention_reset.cloned(),
            float_kernels: self.float_kernels.clone(),
            wall_seconds: self.clock.seconds(),
        };
        let mut tensors = checkpoint::named_tensors("classifier", &self.phase1.classifier.named());
        if let Some((opt, run)) = optimizer {
            tensors.extend(opt.run_state(run)?);
        }
        crate::io::ensure_dir(dir)?;
        checkpoint::save(dir, &state, &tensors)
    }

    /// The error of a run stopped by a signal after phase-2 epoch `epoch`, its checkpoint written.
    pub(super) fn stopped_after(&self, epoch: usize, stop: Interrupted) -> anyhow::Error {
        let kept = match &self.job.out {
            Some(dir) if self.job.checkpoint_every > 0 => format!(
                "its checkpoint is in {}: the same command with --resume continues it",
                dir.display()
            ),
            _ => "nothing was kept (no --out, or --checkpoint-every 0)".into(),
        };
        let line = format!("{stop} after phase-2 epoch {epoch}; {kept}");
        anyhow::Error::new(stop).context(line)
    }

    /// Where the checkpoints of a stack of `runs` runs, this one among them, were kept.
    pub(super) fn kept_where(&self, runs: usize) -> String {
        match (&self.job.out, self.job.checkpoint_every) {
            (Some(dir), every) if every > 0 => format!(
                "each run's checkpoint is in its folder (the {runs} folders beside {}): the same command with --resume continues them",
                dir.display()
            ),
            _ => "nothing was kept (no --out, or --checkpoint-every 0)".into(),
        }
    }

    /// Whether [`Self::save`] writes a checkpoint after `epoch` epochs (no interrupt asked).
    pub(super) fn writes(&self, epoch: usize) -> bool {
        self.job.out.is_some() && self.job.checkpoint_every > 0 && self.due(epoch)
    }

    pub(super) fn due(&self, epoch: usize) -> bool {
        epoch.is_multiple_of(self.job.checkpoint_every.max(1)) || epoch == self.job.config.epochs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sitting on the same kernels as the last one adds nothing; another kind of CPU, or a
    /// checkpoint that never recorded its kernels, is listed after them.
    #[test]
    fn a_resumed_run_lists_each_sittings_float_kernels() {
        let (a, b) = ("x86_64 avx512f", "x86_64 avx2+fma");
        assert_eq!(kernel_history(a, a), None);
        assert_eq!(
            kernel_history(a, b).as_deref(),
            Some("x86_64 avx512f, then x86_64 avx2+fma")
        );
        let twice = kernel_history(a, b).unwrap();
        assert_eq!(kernel_history(&twice, b), None);
        assert_eq!(
            kernel_history(&twice, a).as_deref(),
            Some("x86_64 avx512f, then x86_64 avx2+fma, then x86_64 avx512f")
        );
        assert_eq!(
            kernel_history("", a).as_deref(),
            Some("unrecorded, then x86_64 avx512f")
        );
    }
}
