//! Training: the per-dataset paper defaults (`config`), one run's description (`run`), the
//! optimizer of the authors' Trainer defaults (`optim`), the metrics the runs report (`metrics`),
//! the two phases (`phases`, `finetune`), their checkpoints (`checkpoint`) and the samples
//! whose token selection the run pictures (`attention_maps`).

pub mod attention_maps;
pub mod checkpoint;
pub mod config;
pub mod finetune;
pub mod metrics;
pub mod optim;
pub mod phases;
pub mod run;
