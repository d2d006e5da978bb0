//! The runs phase 2 trains together, each with the explicit context it trains in: its job, its
//! phase-1 classifier, its labels, its sets, and where its checkpoints come from and go.
//!
//! What the runs of a stack share is decided here, by comparing what they read, not by what
//! their configurations say they should read: runs whose fine-tune samples are the same (the
//! same positions of the same split) share one copy of those samples' tokens, and runs whose test
//! samples are the same share the test set's. η-siblings (runs that differ only in η) read the
//! same samples in the same batch order from the same reset; seed-siblings share only the frozen
//! backbone, and the test set where the whole split is scored (docs/design.md, phase 2).

use std::sync::Mutex;

use super::super::checkpoint::Checkpoint;
use super::super::progress::Progress;
use super::super::resume::Checkpoints;
use super::super::run::{FinetuneJob, RunConfig};
use crate::data::split::SplitName;
use crate::encoder::Model;
use crate::encoder::layer_rows::LayerRows;
use crate::model::Classifier;
use candle_core::Device;

/// The labels a run trains on and scores against.
#[derive(Clone, Copy)]
pub struct Labels<'a> {
    /// Noisy labels of the fine-tune set (what is trained on).
    pub labels: &'a [u32],
    pub clean_labels: &'a [u32],
    pub noisy_mask: &'a [bool],
    pub test_labels: &'a [u32],
}

/// Which samples a set holds: the same samples give the same tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Samples<'a> {
    pub split: SplitName,
    /// Positions in the split, in the set's order.
    pub positions: &'a [usize],
    /// The SNR dose on the set's tokens, as (k's bits, seed): the same samples under another
    /// dose, or under the same dose drawn from another seed, are other tokens. `None`: undosed.
    pub token_noise: Option<(u64, u64)>,
}

/// What a trainee reads of one run: its configuration, its phase-1 classifier, its labels and
/// sets, and the stream its reset is drawn from.
pub struct RunData<'a> {
    pub config: &'a RunConfig,
    /// The phase-1 classifier, frozen through phase 2.
    pub classifier: &'a Classifier,
    pub labels: Labels<'a>,
    /// The fine-tune and test sets' last-layer inputs, as the feature cache serves them.
    pub finetune: &'a LayerRows,
    pub test: &'a LayerRows,
    pub finetune_samples: Samples<'a>,
    pub test_samples: Samples<'a>,
    /// Head mode under an SNR dose: the dose, added to the final tokens the head selects from
    /// (in last-layer mode it is in `finetune` and `test` already).
    pub final_token_noise: Option<&'a crate::train::token_noise::TokenNoise>,
    /// The run's initialisation stream, after phase 1: the reset is drawn from it.
    pub init_rng: Mutex<rand_chacha::ChaCha8Rng>,
}

impl RunData<'_> {
    /// `f` with the run's initialisation stream, where its reset is drawn.
    pub fn with_init_rng<R>(&self, f: impl FnOnce(&mut rand_chacha::ChaCha8Rng) -> R) -> R {
        f(&mut self
            .init_rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// One run of a stack, with everything it trains with, passed in rather than reached for: what
/// its trainee reads, and where its progress, metrics and checkpoints go.
pub(in crate::train) struct RunContext<'a> {
    pub(in crate::train) data: RunData<'a>,
    pub(in crate::train) job: &'a FinetuneJob,
    /// Writes the run's checkpoints (phase 1 is in them already).
    pub(in crate::train) checkpoints: &'a Checkpoints<'a>,
    /// The checkpoint the run resumes from.
    pub(in crate::train) resumed: Option<&'a Checkpoint>,
    pub(in crate::train) progress: &'a dyn Progress,
}

/// What every run of a stack reads alike: the frozen backbone, the device and the route a step
/// takes there, and where the test set's final tokens may spill (head mode).
pub struct StackShared<'a> {
    pub model: &'a Model,
    pub device: &'a Device,
    pub route: Route,
    pub hidden: usize,
    pub spill_dir: &'a std::path::Path,
}

/// How a stack steps (docs/design.md, "Where each phase runs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The CPU's own: the tokens in host memory, the last layer's host pass or the fused
    /// attention op, the optimizer's fused update over moments in host memory.
    Host,
    /// candle's generic ops where the tokens are (any device, the CPU's too): every fine-tune
    /// set resident and gathered per step, the runs batched over a run axis, the losses, the
    /// clipping and the moments on the device; nothing is read back inside a step
    /// ([`crate::kernels::host_reads`]).
    Resident,
}

impl Route {
    /// The route a stack on `device` takes: the host's on the CPU, the resident one elsewhere.
    pub fn of(device: &Device) -> Self {
        if device.is_cpu() {
            Self::Host
        } else {
            Self::Resident
        }
    }
}

/// For each run, the first run with the same samples: the index of the copy it reads.
pub fn copies(samples: &[Samples]) -> Vec<usize> {
    samples
        .iter()
        .map(|s| samples.iter().position(|other| other == s).unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_the_same_samples_read_one_copy() {
        let (a, b) = ([1, 2, 3], [1, 2, 4]);
        let of = |positions: &'static [usize]| Samples {
            split: SplitName::Train,
            positions,
            token_noise: None,
        };
        let test = |positions: &'static [usize]| Samples {
            split: SplitName::Test,
            positions,
            token_noise: None,
        };
        let leaked = |v: [usize; 3]| -> &'static [usize] { Box::leak(Box::new(v)) };
        let (a, b) = (leaked(a), leaked(b));
        assert_eq!(copies(&[of(a), of(b), of(a), test(a)]), [0, 1, 0, 3]);
    }
}
