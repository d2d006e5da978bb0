//! Training: the per-dataset paper defaults (`config`), one run's description (`run`), the
//! optimizer of the authors' Trainer defaults (`optim`), the metrics the runs report (`metrics`),
//! the two phases (`phases`, `finetune`) and their checkpoints (`checkpoint`).

pub mod checkpoint;
pub mod config;
pub mod finetune;
pub mod metrics;
pub mod optim;
pub mod phases;
pub mod run;
