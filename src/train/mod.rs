//! Training: the per-dataset paper defaults (`config`), the optimizer of the authors' Trainer
//! defaults (`optim`) and the metrics the runs report (`metrics`).

pub mod config;
pub mod finetune;
pub mod metrics;
pub mod optim;
pub mod phases;
