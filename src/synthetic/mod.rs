//! The paper's synthetic reference experiment (docs/protocol.md §2): the token distribution, the
//! token-selection model with a fixed head, gradient descent on (W, p), and the SNR grid.
//!
//! Read in order: `config` → `data` → `model` → `engine` (`dense`, `subspace`) → `train` → `sweep`.

pub mod config;
pub mod data;
pub mod dense;
pub mod encoder;
pub mod engine;
pub mod model;
pub mod subspace;
pub mod sweep;
pub mod train;

pub use config::SyntheticConfig;
pub use engine::EngineKind;
pub use model::Regime;
pub use sweep::{Grid, SweepRow, sweep};
pub use train::{RunSummary, StepMetrics, SyntheticRun, Trace, run, run_with_engine};
