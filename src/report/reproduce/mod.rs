//! The report of `reproduce`: results.csv, report.md (our cells beside the paper's, with every
//! deviation in a header) and the figures: the Fig. 8-style noise sweep, the Fig. 9-style
//! attention curves, memorization against test accuracy over all runs, and one run's attention
//! maps per dataset.

mod figures;
pub use self::figures::{FIG8, FIG8_N, FIG8_SEED, FIG9, SCATTER, attention_file};

mod write;

pub use write::*;
