//! Training, in the order a run goes: the per-dataset paper defaults (`config`) and one run's
//! description (`run`); its set-up, data to features (`setup`); phase 1, the clean classifier
//! (`phase1`, with its loop in `classifier_loop`); phase 2, the noisy fine-tune of a stack of runs at once
//! (`phase2`, a module of its own), with the optimizer of the authors' Trainer defaults (`optim`)
//! and the metrics they report (`metrics`); checkpoints (`checkpoint`), what carries a run across
//! sittings (`resume`) and the run folder's one writer (`folder_lock`); the samples whose token
//! selection a run pictures (`attention_maps`); how a run reports progress (`progress`); where a
//! run's fine-tune set sits on the paper's SNR axis (`snr`).
//! `finetune` strings the steps together.

pub mod attention_maps;
pub mod checkpoint;
pub mod classifier_loop;
pub mod config;
pub mod config_file;
pub mod finetune;
pub mod folder_lock;
pub mod metrics;
pub mod optim;
pub mod overrides;
pub mod phase1;
pub mod phase2;
pub mod progress;
pub mod resume;
pub mod run;
pub mod run_snr;
pub mod setup;
pub mod snr_plant;
pub mod stack_plan;
pub mod token_noise;
