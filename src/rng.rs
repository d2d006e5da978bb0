//! Every random draw of the project comes from a ChaCha8 stream of a user seed. Streams of one
//! seed are independent generators, so e.g. the label noise does not change when the split does.
//! ChaCha8 is portable: the same seed gives the same draws on every platform and version of this
//! crate's lock file.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The named streams; their numbers are fixed forever (changing one changes every result).
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    /// Synthetic training tokens (PAPER.md §2.1).
    SyntheticTrain = 0,
    /// Synthetic test tokens, unless `--paper-test-seed` reuses `SyntheticTrain`.
    SyntheticTest = 1,
    /// Synthetic initial W.
    SyntheticInit = 2,
    /// Choice of the pretrain + fine-tune indices (PAPER.md §3).
    Split = 3,
    /// Carving a training pool out of a test split.
    Carve = 4,
    /// Subsampling the test split (`--test-n`).
    TestSubsample = 5,
    /// Label noise on the fine-tune set.
    LabelNoise = 6,
}

pub fn stream(seed: u64, stream: Stream) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream as u64);
    rng
}
