//! Theory meets data (docs/design.md, "The SNR of real tokens" and "Theory against data"): every
//! verdict cell of the report on the paper's n·SNR² axis, with what a reader needs to judge it.
//!
//! - **Placement.** Per cell the raw n·SNR², the permutation floor, the calibrated value over
//!   seeds (mean ± spread, and the widest of the seeds' bootstrap intervals) and how many seeds
//!   rise above the floor; a cell none of whose seeds does is shown as a bound, never a number.
//! - **Synthetic twin.** The token selector at the cell's T, effective dimension, n and calibrated
//!   SNR, run at its base step, at half and twice the step and at five times the steps. Its regime
//!   counts only when all four agree; a run that underfits or has not settled is "undecided".
//! - **Boundaries.** The same setting run along n·SNR², where its regime changes, drawn at each
//!   point's height.
//! - **Statistics that could say no.** Cohen's κ of twin against verdict; Spearman's ρ per mode
//!   with a seeds-only and a cells-then-seeds bootstrap and a permutation p-value; ρ with the SNR
//!   within each n, with a permutation test that keeps every n's cells together.

mod cells;
mod correlation;
mod figures;
mod pooled;
mod stats;
mod twins;
pub use correlation::Correlation;
pub use figures::{DELTA_FIGURE, MEMORIZATION_FIGURE};
pub use pooled::{PooledSnr, TwinTarget};
pub use stats::{
    Kappa, cohen_kappa, percentile_interval, permutation_p, pooled_rho, spearman,
    stratified_permutation_p,
};
pub use twins::{SYNTHETIC_RUNS, twin_config};

mod section;

pub use section::*;
