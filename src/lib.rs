//! benign-attention: the experiments of "Benign Overfitting in Token Selection of Attention
//! Mechanism" (Sakamoto & Sato, ICML 2025) and attention-localization diagnostics.
//!
//! Modules follow the data flow; `synthetic` is the paper's reference model, `report` writes what
//! a run leaves behind, `cli` only parses flags and dispatches.

pub mod cli;
pub mod data;
pub mod diagnostics;
pub mod encoder;
pub mod errors;
pub mod excerpt;
pub mod interrupt;
pub mod io;
pub mod kernels;
pub mod limits;
pub mod model;
pub mod progress_bar;
pub mod report;
pub mod reproduce;
pub mod rng;
pub mod runtime;
pub mod shard;
pub mod synthetic;
pub mod train;
