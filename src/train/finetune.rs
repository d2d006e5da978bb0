//! The paper's real-data protocol on one dataset, one η, one n, one seed (docs/protocol.md §3), as a
//! list of named steps (see [`finetune`]):
//! setup (data, backbone, split, noise) → features from the cache → phase 1 (the classifier on
//! clean data, shared between runs) → phase 2 (the last layer's query/key, or the card's
//! token-selection head, on the noisy samples) → summary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::attention_maps::{self, AttentionMaps};
use super::checkpoint::RunIdentity;
use super::folder_lock::{FolderLock, ensure_no_other_run};
use super::loops::EpochMetrics;
use super::phase1::{PhaseOne, phase_one};
use super::phase2::{Phase2Log, QkShape, phase_two};
pub use super::progress::{HOST_STEPS, Progress};
use super::resume::{Checkpoints, WallClock, record_resumed_kernels, resumed_checkpoint};
pub use super::run::{FinetuneJob, HeadClassifier, Mode, Places, RunConfig, RunFolder};
pub use super::setup::{AUTHORS_RNG_DEVIATION, prefetch};
use super::setup::{Setup, device_name, prepare_data, run_features, setup, write_config};
use crate::data::catalog::Completeness;
use crate::data::prepare::PreparedData;
use crate::encoder::Model;
use crate::rng::{Stream, stream};

/// What resolving a configuration against the data and checkpoints found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Resolved {
    /// The backbone that loaded (the first of `config.backbones` that did).
    pub backbone: String,
    pub backbone_sha256: String,
    pub backbone_source: String,
    /// Clean phase-1 samples used (`config.pretrain_n`, or fewer on partial data).
    pub pretrain_n: usize,
    pub test_n: usize,
    /// Share of fine-tune labels the noise flipped.
    pub realised_eta: f64,
    pub dataset_completeness: Completeness,
    /// The float kernels the run ran with ([`crate::runtime::float_kernels`]); a run resumed
    /// on another kind of CPU lists each sitting's ("x86_64 avx512f, then x86_64 avx2+fma").
    /// Empty in summaries written before it was recorded.
    #[serde(default)]
    pub float_kernels: String,
}

/// summary.json: the configuration, what it resolved to, and the results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinetuneSummary {
    pub config: RunConfig,
    pub resolved: Resolved,
    /// Phase-1 test accuracy (the paper's "baseline").
    pub baseline_test_acc: f64,
    /// Test accuracy right after the query/key reset (or the head's initialisation), before any
    /// phase-2 step: baseline → reset is the reset's cost, reset → final the noise's.
    #[serde(default)]
    pub reset_test_acc: Option<f64>,
    /// The last phase-2 epoch, test set scored.
    #[serde(rename = "final")]
    pub last: EpochMetrics,
    /// Every way this run departs from the paper's protocol, one sentence each.
    pub deviations: Vec<String>,
    /// The run's wall time, summed over its sittings when it was resumed (each sitting up to its
    /// last checkpoint; summaries written before that was kept count the last sitting only).
    pub wall_seconds: f64,
}

impl FinetuneSummary {
    pub fn test_acc(&self) -> f64 {
        self.last.test_acc.unwrap_or(f64::NAN)
    }

    pub fn test_loss(&self) -> f64 {
        self.last.test_loss.unwrap_or(f64::NAN)
    }
}

pub struct FinetuneRun {
    pub summary: FinetuneSummary,
    /// The run folder's lock, held until the run (and so its files' writing) is dropped.
    pub folder_lock: Option<FolderLock>,
    /// Phase-1 mean batch loss per epoch.
    pub pretrain_losses: Vec<f64>,
    pub epochs: Vec<EpochMetrics>,
    /// Token selection on a few fine-tune samples, right after the reset and at the end.
    pub attention_maps: AttentionMaps,
}

/// The protocol, step by step.
pub fn finetune(job: &FinetuneJob, progress: &dyn Progress) -> Result<FinetuneRun> {
    let started = Instant::now();
    // Before the folder is read (its checkpoint, its config), so that no other process writes it.
    let mut folder_lock = job.out.as_deref().map(FolderLock::acquire).transpose()?;
    let mut setup = setup(job)?;
    if !setup.device.is_cpu() {
        progress.note(&format!(
            "--device {}: {HOST_STEPS}",
            device_name(&setup.device)
        ));
    }
    let prepared = prepare_data(&setup, job)?;
    let features = run_features(&setup, &prepared, job, progress)?;
    // Both phases are chains of small ops: one thread each (by default) beats sharing cores,
    // whose hand-offs dominate such ops, and keeps results independent of the core count.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(job.config.train_threads)
        .build()
        .context("building the training thread pool")?;
    pool.install(|| {
        let identity = RunIdentity {
            config: job.config.clone(),
            backbone_sha256: setup.backbone.weights_sha256.clone(),
            pretrain_n: setup.plan.pretrain_n,
            test_n: prepared.test.len(),
        };
        let resumed = resumed_checkpoint(job, &identity, &setup.device, progress)?;
        if let Some(saved) = &resumed {
            record_resumed_kernels(&mut setup, saved);
        }
        // The run folder is written only once everything about the run has been checked: input
        // refused at set-up, or a checkpoint or config of another run, leaves the folder as it was.
        if let (Some(out), Some(lock)) = (&job.out, folder_lock.as_mut()) {
            ensure_no_other_run(out, &job.config)?;
            lock.create()?;
            write_config(out, &job.config)?;
        }
        match &resumed {
            Some(saved) => {
                progress.series_start(&job.config, &saved.state.pretrain_losses, &saved.state.log)
            }
            None => progress.series_start(&job.config, &[], &[]),
        }
        let clock = WallClock {
            started,
            earlier_sittings: resumed.as_ref().map_or(0.0, |s| s.state.wall_seconds),
        };
        // One initialisation stream: the classifier, then the query/key reset or the head.
        let mut init_rng = stream(job.config.seed, Stream::Init);
        let phase1 = phase_one(
            &setup,
            &prepared,
            &features,
            job,
            resumed.as_ref(),
            &mut init_rng,
            progress,
        )?;
        progress.pretrain_done(&phase1.pretrain_losses);
        let checkpoints = Checkpoints {
            job,
            identity,
            phase1: &phase1,
            float_kernels: setup.float_kernels.clone(),
            clock: &clock,
        };
        if resumed.is_none() {
            checkpoints.save(0, None, &[], None)?;
        }
        let log = phase_two(
            &setup,
            &prepared,
            features,
            &checkpoints,
            resumed.as_ref(),
            &mut init_rng,
            progress,
        )?;
        let maps = attention_maps(job, &setup, &prepared, &log)?;
        let mut run = summarize(job, setup, &prepared, phase1, log, maps, &clock)?;
        run.folder_lock = folder_lock.take();
        Ok(run)
    })
}

/// The attention maps' samples as the picture shows them, with their attention.
fn attention_maps(
    job: &FinetuneJob,
    setup: &Setup,
    prepared: &PreparedData,
    log: &Phase2Log,
) -> Result<AttentionMaps> {
    let config = &job.config;
    let samples = attention_maps::shown_samples(
        &setup.backbone,
        &prepared.finetune.inputs,
        &log.picks,
        (&prepared.labels.clean_labels, &prepared.labels.labels),
    )?;
    let heads = QkShape::of(&setup.backbone.model, config.mode, 0).heads;
    let image = matches!(setup.backbone.model, Model::Vit(_));
    Ok(AttentionMaps {
        dataset: config.dataset.to_string(),
        mode: config.mode_label(),
        n: config.n,
        eta: config.eta,
        seed: config.seed,
        class_names: setup.dataset.class_names.clone(),
        selector: attention_maps::selector(config.mode, heads, image, config.special_tokens),
        samples,
        reset: log.reset.clone(),
        last: log.last.clone(),
    })
}

/// summary.json from the configuration, what it resolved to and the last epoch.
fn summarize(
    job: &FinetuneJob,
    setup: Setup,
    prepared: &PreparedData,
    phase1: PhaseOne,
    log: Phase2Log,
    attention_maps: AttentionMaps,
    clock: &WallClock,
) -> Result<FinetuneRun> {
    let log = log.epochs;
    let last = log.last().context("phase 2 ran no epoch")?.clone();
    let roots = portable_roots(&job.places, &setup);
    let deviations = setup
        .deviations
        .iter()
        .chain(&prepared.partition.deviations)
        .map(|line| portable(line, &roots))
        .collect();
    let summary = FinetuneSummary {
        config: job.config.clone(),
        resolved: Resolved {
            backbone: setup.backbone.files.id.clone(),
            backbone_sha256: setup.backbone.weights_sha256.clone(),
            backbone_source: portable(&setup.backbone.files.source, &roots),
            pretrain_n: setup.plan.pretrain_n,
            test_n: prepared.test.len(),
            realised_eta: prepared.labels.rate(),
            dataset_completeness: setup.completeness,
            float_kernels: setup.float_kernels,
        },
        baseline_test_acc: phase1.baseline_test_acc,
        reset_test_acc: log.iter().find(|m| m.epoch == 0).and_then(|m| m.test_acc),
        last,
        deviations,
        wall_seconds: clock.seconds(),
    };
    Ok(FinetuneRun {
        summary,
        folder_lock: None,
        pretrain_losses: phase1.pretrain_losses,
        epochs: log,
        attention_maps,
    })
}

/// The folders a run read, each with the name a user sets it by: summaries and the reports made
/// from them are kept and shared, so they name `$BENIGN_MODELS_DIR/...`, not this machine's path.
fn portable_roots(places: &Places, setup: &Setup) -> Vec<(PathBuf, &'static str)> {
    let mut roots = vec![
        (setup.root.clone(), "$BENIGN_DATA_DIR"),
        (setup.cache.root().to_path_buf(), "$BENIGN_CACHE_DIR"),
        (hf_hub::Cache::from_env().path().clone(), "$HF_HOME/hub"),
    ];
    if let Some(models) = crate::encoder::hub::models_root(places.models_dir.as_deref()) {
        roots.push((models, "$BENIGN_MODELS_DIR"));
    }
    // The longest first, so that a root inside another is named by its own variable.
    roots.sort_by_key(|(path, _)| std::cmp::Reverse(path.as_os_str().len()));
    roots
}

/// `line` with every absolute root of `roots` written as its variable (a relative one, such as
/// the default `datasets`, is already portable).
fn portable(line: &str, roots: &[(PathBuf, &str)]) -> String {
    roots.iter().fold(line.to_string(), |line, (path, name)| {
        match path.to_str().filter(|p| path.is_absolute() && p.len() > 1) {
            Some(path) => line.replace(path.trim_end_matches('/'), name),
            None => line,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deviations_name_roots_by_their_variables() {
        let roots = vec![
            (PathBuf::from("/data/models/"), "$BENIGN_MODELS_DIR"),
            (PathBuf::from("/data"), "$BENIGN_DATA_DIR"),
            (PathBuf::from("datasets"), "$BENIGN_DATA_DIR"),
        ];
        assert_eq!(
            portable(
                "x: /data/models/org/name has no config.json; /data/trec; datasets",
                &roots
            ),
            "x: $BENIGN_MODELS_DIR/org/name has no config.json; $BENIGN_DATA_DIR/trec; datasets"
        );
    }
}
