//! The paper's synthetic reference experiments (docs/protocol.md §2): the token distribution, the
//! token-selection model with a fixed head trained by gradient descent on (W, p), the one-layer
//! Transformer encoder of Figs. 6/7 with every parameter trained, and the SNR grid.
//!
//! Read in order: `config` → `data` → `model` → `engine` (`dense`, `subspace`) → `trajectory` (the
//! loop every model runs and what it records) → `train` (the token selector's run) → `encoder` →
//! `grid` (the axes and a cell's row) → `sweep` (and `cells`, its record on disk).

pub mod cells;
pub mod config;
pub mod data;
pub mod dense;
pub mod dose;
pub mod encoder;
pub mod engine;
pub mod grid;
pub mod model;
pub mod subspace;
pub mod sweep;
pub mod train;
pub mod trajectory;

pub use config::EncoderSettings;
pub use config::SyntheticConfig;
pub use engine::EngineKind;
pub use model::Regime;
pub use sweep::{GridProgress, GridSize, SweepRow, sweep, sweep_into};
pub use train::{run, run_on_sets, run_with_engine};
pub use trajectory::{RunSummary, StepMetrics, SyntheticRun, Trace};
