//! The project's seeded streams: which generator (ChaCha8 or the authors'), one stream per purpose,
//! and the epochs' batch orders.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Whose random streams draw a real-data run's split, label noise and batch orders.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum RngChoice {
    /// This crate's ChaCha8 streams ([`Stream`]).
    #[default]
    Own,
    /// The authors' draws: numpy `default_rng(seed).choice` for the split, torch's CPU MT19937
    /// for the symmetric label noise and `randperm(n, seed + epoch)` for the batch order.
    Authors,
}

impl RngChoice {
    pub fn name(self) -> &'static str {
        match self {
            RngChoice::Own => "own",
            RngChoice::Authors => "authors",
        }
    }
}

/// The version of the authors' label-noise draw a `--rng authors` run with η > 0 took; part of the
/// run's identity, so that a run made with another draw is never taken for a current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthorsNoiseDraw {
    /// Their line verbatim, `torch.rand_like(labels, dtype=torch.float) < noise_ratio`: a float32
    /// draw, two u32 per fine-tune row ([`super::torch::label_noise`]). Runs made before it (a float64
    /// draw, three u32 per row, other rows flipped) record no version.
    Float32,
}

impl AuthorsNoiseDraw {
    /// The draw this build makes.
    pub const CURRENT: Self = Self::Float32;
}

/// The batch order of a training phase: whose stream, and the run's seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shuffle {
    pub rng: RngChoice,
    pub seed: u64,
}

impl Shuffle {
    /// This crate's streams.
    pub fn own(seed: u64) -> Self {
        Self {
            rng: RngChoice::Own,
            seed,
        }
    }

    /// The sample order of epoch `epoch` (0-based) of the phase whose stream is `phase`. Ours:
    /// [`epoch_order`]. The authors' (accelerate's `SeedableRandomSampler`): epoch e of either
    /// phase is `torch.randperm(n, generator seeded seed + e)`, so `phase` plays no part.
    pub fn order(&self, n: usize, phase: Stream, epoch: usize) -> Vec<usize> {
        match self.rng {
            RngChoice::Own => epoch_order(n, self.seed, phase, epoch),
            RngChoice::Authors => super::torch::randperm(n, self.seed.wrapping_add(epoch as u64)),
        }
    }
}

/// The named streams; their numbers are fixed forever (changing one changes every result).
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    /// Synthetic training tokens (docs/protocol.md §2.1).
    SyntheticTrain = 0,
    /// Synthetic test tokens, unless `--paper-test-seed` reuses `SyntheticTrain`.
    SyntheticTest = 1,
    /// Synthetic initial W.
    SyntheticInit = 2,
    /// Choice of the pretrain + fine-tune indices (docs/protocol.md §3).
    Split = 3,
    /// Carving a training pool out of a test split.
    Carve = 4,
    /// Subsampling the test split (`--test-n`).
    TestSubsample = 5,
    /// Label noise on the fine-tune set.
    LabelNoise = 6,
    /// Mini-batch order of phase 1 (one stream segment per epoch).
    PretrainShuffle = 7,
    /// Mini-batch order of phase 2 (one stream segment per epoch).
    FinetuneShuffle = 8,
    /// Initialisation of the classifier, the re-initialised query/key and the head.
    Init = 9,
    /// Initialisation of the synthetic one-layer encoder's parameters.
    EncoderInit = 10,
    /// The paper's token selector on real tokens (`reproduce reference-map`): the basis, the
    /// tokens drawn, the labels.
    ReferenceMap = 11,
}

/// A fresh permutation of 0..n for epoch `epoch`, which depends only on (seed, stream, epoch):
/// each epoch reads its own 2³²-word segment of the stream, so a resumed run shuffles exactly as
/// an uninterrupted one.
pub fn epoch_order(n: usize, seed: u64, which: Stream, epoch: usize) -> Vec<usize> {
    use rand::seq::SliceRandom;
    let mut rng = stream(seed, which);
    rng.set_word_pos((epoch as u128) << 32);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    order
}

pub fn stream(seed: u64, stream: Stream) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream as u64);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_orders_are_permutations_fixed_by_seed_and_epoch() {
        let a = epoch_order(100, 1, Stream::PretrainShuffle, 5);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(100, 1, Stream::PretrainShuffle, 5));
        assert_ne!(a, epoch_order(100, 1, Stream::PretrainShuffle, 6));
        assert_ne!(a, epoch_order(100, 2, Stream::PretrainShuffle, 5));
        assert_ne!(a, epoch_order(100, 1, Stream::FinetuneShuffle, 5));
    }

    /// docs/protocol.md §3.1: epoch e of both phases is `randperm(n, seed + e)`; randperm(200) seeded 42
    /// and 43 are real torch 2.6.0 outputs.
    #[test]
    fn authors_batch_order_is_randperm_of_seed_plus_epoch() {
        let shuffle = Shuffle {
            rng: RngChoice::Authors,
            seed: 42,
        };
        for phase in [Stream::PretrainShuffle, Stream::FinetuneShuffle] {
            assert_eq!(
                shuffle.order(200, phase, 0)[..10],
                [142, 56, 198, 77, 50, 55, 4, 69, 174, 47]
            );
            assert_eq!(
                shuffle.order(200, phase, 1)[..10],
                [188, 42, 139, 2, 85, 160, 56, 61, 153, 64]
            );
            assert_eq!(
                shuffle.order(1000, phase, 7),
                super::super::torch::randperm(1000, 49)
            );
        }
        assert_eq!(
            Shuffle::own(42).order(200, Stream::FinetuneShuffle, 3),
            epoch_order(200, 42, Stream::FinetuneShuffle, 3)
        );
    }
}
