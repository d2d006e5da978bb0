//! The paper's real-data protocol on one dataset, one η, one n, one seed (docs/protocol.md §3), as a
//! list of named steps, for one run or a stack of runs that train together (see
//! [`finetune_stack`]): setup (data, backbone, split, noise) → features from the cache → phase 1
//! (the classifier on clean data, shared between runs) → phase 2 (the last layer's query/key, or
//! the card's token-selection head, on the noisy samples; every run of the stack at once) →
//! attention maps and summary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::attention_maps::{self, AttentionMaps};
use super::checkpoint::{Checkpoint, RunIdentity, StartPoint};
use super::folder_lock::{RunFolderLock, ensure_no_other_run};
use super::metrics::EpochMetrics;
use super::phase1::{Phase1Outcome, phase1_from_init};
use super::phase2::runs::{Labels, Route, RunContext, RunData, Samples, StackShared};
use super::phase2::{Phase2Log, QkShape, phase_two};
use super::progress::{HOST_STEPS, Progress};
use super::resume::{Checkpoints, WallClock, record_resumed_kernels, resumed_checkpoint};
use super::run::{FinetuneJob, Mode, Places, RunConfig};
use super::setup::{Setup, prepare_data, run_features, setup, setup_sibling, write_config};
use super::token_noise::{DosedSets, TokenNoise, run_token_noise};
use crate::data::catalog::Completeness;
use crate::data::prepare::PreparedData;
use crate::data::split::SplitName;
use crate::diagnostics::snr::SnrEstimate;
use crate::encoder::Model;
use crate::encoder::layer_rows::LayerRows;

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
    /// The classes, by label index: for a dataset the user brings, the documented order its
    /// labels were mapped in (docs/data.md). Absent in summaries written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub class_names: Vec<String>,
    /// The float kernels the run ran with ([`crate::runtime::float_kernels`]); a run resumed
    /// on another kind of CPU lists each sitting's ("x86_64 avx512f, then x86_64 avx2+fma").
    /// Empty (and not written back) in summaries written before it was recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub float_kernels: String,
    /// Where the backbone and each phase ran ([`crate::runtime::Placement`]); absent in
    /// summaries written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::runtime::Placement>,
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
    /// Where the fine-tune set sits on the paper's n·SNR² axis ([`super::run_snr`]); absent in
    /// summaries written before it was measured, or where the estimate could not be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snr: Option<SnrEstimate>,
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
    pub folder_lock: Option<RunFolderLock>,
    /// Phase-1 mean batch loss per epoch.
    pub pretrain_losses: Vec<f64>,
    pub epochs: Vec<EpochMetrics>,
    /// Token selection on a few fine-tune samples, right after the reset and at the end.
    pub attention_maps: AttentionMaps,
}

/// The protocol for one run: a stack of one ([`finetune_stack`]).
pub fn finetune(job: &FinetuneJob, progress: &dyn Progress) -> Result<FinetuneRun> {
    finetune_stack(std::slice::from_ref(job), &[progress])?
        .pop()
        .context("a stack of one run gave no result")?
}

/// The protocol for runs that train together in one stack (`finetune --eta 0,0.1,0.2`, a grid's
/// stack): every run set up, its features read and its phase 1 had as if alone, then phase 2 of
/// all of them at once ([`super::phase2`]), each run with `progress[k]`. The runs must agree on
/// everything but η and the seed ([`RunConfig::stack_key`]).
///
/// Each run's result, in order: a run refused at set-up (its folder taken, a checkpoint of
/// another run) fails alone. Runs resumed from different epochs train as separate stacks, one
/// after another. An error of phase 2 (a signal among them) stops every run still training, and
/// is the error of the whole call.
pub fn finetune_stack(
    jobs: &[FinetuneJob],
    progress: &[&dyn Progress],
) -> Result<Vec<Result<FinetuneRun>>> {
    let started = Instant::now();
    ensure!(
        !jobs.is_empty() && jobs.len() == progress.len(),
        "{} runs with {} progress reporters",
        jobs.len(),
        progress.len()
    );
    let key = jobs[0].config.stack_key();
    if let Some(other) = jobs.iter().find(|j| j.config.stack_key() != key) {
        bail!(
            "{} and {} differ in more than η and the seed: they cannot train together",
            jobs[0].config.run_name()?,
            other.config.run_name()?
        );
    }
    // Set-up, the data and the backbone, once for the stack: what is refused here is refused
    // for every run, before any run folder is touched.
    let template = setup(&jobs[0])?;
    let placement = template.placement;
    if placement != crate::runtime::Placement::of(crate::runtime::DeviceKind::Cpu, None) {
        progress[0].note(&format!("{}; {HOST_STEPS}", placement.describe()));
    }
    // Both phases are chains of small ops: one thread each (by default) beats sharing cores,
    // whose hand-offs dominate such ops, and keeps results independent of the core count.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs[0].config.train_threads)
        .build()
        .context("building the training thread pool")?;
    pool.install(|| {
        let mut ready: Vec<Option<Result<ReadyRun>>> = jobs
            .iter()
            .zip(progress)
            .map(|(job, progress)| Some(prepare_run(&template, job, *progress, started)))
            .collect();
        let mut results: Vec<Option<Result<FinetuneRun>>> = jobs.iter().map(|_| None).collect();
        for group in resume_groups(&ready) {
            let members: Vec<ReadyRun> = group
                .iter()
                .map(|&k| {
                    ready[k]
                        .take()
                        .and_then(Result::ok)
                        .context("a run taken twice")
                })
                .collect::<Result<_>>()?;
            let jobs_of: Vec<&FinetuneJob> = group.iter().map(|&k| &jobs[k]).collect();
            let progress_of: Vec<&dyn Progress> = group.iter().map(|&k| progress[k]).collect();
            let finished = train_stack(members, &jobs_of, &progress_of)?;
            for (&k, run) in group.iter().zip(finished) {
                results[k] = Some(run);
            }
        }
        // What is left failed before phase 2.
        for (k, left) in ready.into_iter().enumerate() {
            if let Some(Err(err)) = left {
                results[k] = Some(Err(err));
            }
        }
        results
            .into_iter()
            .map(|r| r.context("a run neither trained nor failed"))
            .collect()
    })
}

/// A run ready for phase 2: set up, its data split and labelled, its phase 1 had, its folder
/// written, its checkpoint (if it resumes) read and checked.
struct ReadyRun {
    setup: Setup,
    prepared: PreparedData,
    /// The fine-tune and test sets' last-layer inputs (read lazily from the cache).
    finetune_rows: LayerRows,
    test_rows: LayerRows,
    identity: RunIdentity,
    resumed: Option<Checkpoint>,
    folder_lock: Option<RunFolderLock>,
    clock: WallClock,
    phase1: Phase1Outcome,
    snr: Option<SnrEstimate>,
    /// The SNR dose, where the run has one: in `finetune_rows` and `test_rows` already in
    /// last-layer mode, added to the final tokens by the head in head mode.
    token_noise: Option<TokenNoise>,
    /// The initialisation stream after phase 1's draws: the reset comes next.
    init_rng: rand_chacha::ChaCha8Rng,
}

/// The ready runs' indices, grouped by where each picks phase 2 up ([`StartPoint`]: the epochs
/// its own checkpoint proves done, and whether it logged epoch 0): runs train together from the
/// same start. Failed runs are in no group.
fn resume_groups(ready: &[Option<Result<ReadyRun>>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(StartPoint, Vec<usize>)> = Vec::new();
    for (k, run) in ready.iter().enumerate() {
        let Some(Ok(run)) = run else { continue };
        let done = StartPoint::of(run.resumed.as_ref());
        match groups.iter_mut().find(|(d, _)| *d == done) {
            Some((_, group)) => group.push(k),
            None => groups.push((done, vec![k])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// One run of a stack through to phase 2: its split and labels, its checkpoint and folder
/// (everything a run can be refused for), then its features and phase 1.
fn prepare_run(
    template: &Setup,
    job: &FinetuneJob,
    progress: &dyn Progress,
    started: Instant,
) -> Result<ReadyRun> {
    // Before the folder is read (its checkpoint, its config), so that no other process writes it.
    let mut folder_lock = job.out.as_deref().map(RunFolderLock::acquire).transpose()?;
    let mut setup = setup_sibling(template, job)?;
    let prepared = prepare_data(&setup, job)?;
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
    // Features last: what a run is refused for is found before any sample meets the backbone.
    let features =
        extraction_pool(job)?.install(|| run_features(&setup, &prepared, job, progress))?;
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
    let (phase1, init_rng) = phase1_from_init(
        &setup,
        &prepared,
        &features,
        job,
        resumed.as_ref(),
        progress,
    )?;
    progress.pretrain_done(&phase1.pretrain_losses);
    let DosedRun {
        token_noise,
        finetune_rows,
        test_rows,
        snr,
    } = dosed_sets_and_estimate(&setup, &prepared, &features, &phase1, job, progress)?;
    Ok(ReadyRun {
        finetune_rows,
        test_rows,
        token_noise,
        setup,
        prepared,
        identity,
        resumed,
        folder_lock,
        clock,
        phase1,
        snr,
        init_rng,
    })
}

/// What phase 2 and the summary read of a run's sets: the dose, the fine-tune and test sets
/// (dosed in last-layer mode) and the estimate on them.
struct DosedRun {
    token_noise: Option<TokenNoise>,
    finetune_rows: LayerRows,
    test_rows: LayerRows,
    snr: Option<SnrEstimate>,
}

/// The run's [`DosedRun`]; a failed estimate is a note, not the run's failure.
fn dosed_sets_and_estimate(
    setup: &Setup,
    prepared: &PreparedData,
    features: &super::setup::RunFeatures,
    phase1: &Phase1Outcome,
    job: &FinetuneJob,
    progress: &dyn Progress,
) -> Result<DosedRun> {
    let token_noise = run_token_noise(setup, features, &job.config)?;
    let sets = DosedSets::of(
        setup,
        prepared,
        features,
        job.config.mode,
        token_noise.as_ref(),
    )?;
    let snr = super::run_snr::of_run(setup, &sets, prepared, phase1)
        .map_err(|err| {
            progress.note(&format!(
                "no n·SNR² estimate: {}",
                crate::errors::one_line(&err)
            ))
        })
        .ok();
    let (finetune_rows, test_rows) = (sets.finetune, sets.test);
    Ok(DosedRun {
        token_noise,
        finetune_rows,
        test_rows,
        snr,
    })
}

/// The threads the backbone extracts features on: the job's sample threads (every core for a
/// run alone), not the training pool that `prepare_run` runs in, whose one thread would leave the
/// other cores idle through the longest step of a cold run. A sample's features are the same
/// on any number of threads (`extract` fills the same cache on every core).
fn extraction_pool(job: &FinetuneJob) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(job.sample_threads)
        .build()
        .context("building the feature extraction thread pool")
}

/// Phase 2 of ready runs that resume from the same epoch, then each one's attention maps and
/// summary.
fn train_stack(
    runs: Vec<ReadyRun>,
    jobs: &[&FinetuneJob],
    progress: &[&dyn Progress],
) -> Result<Vec<Result<FinetuneRun>>> {
    let checkpoints: Vec<Checkpoints> = runs
        .iter()
        .zip(jobs)
        .map(|(run, job)| Checkpoints {
            job,
            identity: run.identity.clone(),
            phase1: &run.phase1,
            float_kernels: run.setup.float_kernels.clone(),
            clock: &run.clock,
        })
        .collect();
    for (run, checkpoints) in runs.iter().zip(&checkpoints) {
        if run.resumed.is_none() {
            checkpoints.save(0, None, &[], None)?;
        }
    }
    let contexts: Vec<RunContext> = runs
        .iter()
        .zip(jobs)
        .zip(progress)
        .zip(&checkpoints)
        .map(|(((run, job), progress), checkpoints)| run.context(job, *progress, checkpoints))
        .collect();
    let first = &runs[0].setup;
    let shared = StackShared {
        model: &first.backbone.model,
        device: &first.device,
        route: Route::of(&first.device),
        hidden: first.backbone.hidden_size(),
        spill_dir: first.cache.root(),
    };
    let logs = phase_two(&shared, &contexts)?;
    drop(contexts);
    drop(checkpoints);
    Ok(runs
        .into_iter()
        .zip(jobs)
        .zip(logs)
        .map(|((run, job), log)| run.finish(job, log))
        .collect())
}

impl ReadyRun {
    /// The context phase 2 trains this run in.
    fn context<'a>(
        &'a self,
        job: &'a FinetuneJob,
        progress: &'a dyn Progress,
        checkpoints: &'a Checkpoints<'a>,
    ) -> RunContext<'a> {
        let partition = &self.prepared.partition;
        let noise_key = self
            .token_noise
            .as_ref()
            .map(|noise| (noise.k.to_bits(), job.config.seed));
        let data = RunData {
            config: &job.config,
            classifier: &self.phase1.classifier,
            labels: Labels {
                labels: &self.prepared.labels.labels,
                clean_labels: &self.prepared.labels.clean_labels,
                noisy_mask: &self.prepared.labels.noisy_mask,
                test_labels: &self.prepared.test.labels,
            },
            finetune: &self.finetune_rows,
            test: &self.test_rows,
            finetune_samples: Samples {
                split: partition.train_source,
                positions: &partition.finetune,
                token_noise: noise_key,
            },
            test_samples: Samples {
                split: SplitName::Test,
                positions: &partition.test,
                token_noise: noise_key,
            },
            final_token_noise: match job.config.mode {
                Mode::Head => self.token_noise.as_ref(),
                Mode::LastLayer => None,
            },
            init_rng: std::sync::Mutex::new(self.init_rng.clone()),
        };
        RunContext {
            data,
            job,
            checkpoints,
            resumed: self.resumed.as_ref(),
            progress,
        }
    }

    /// The run's attention maps and summary once phase 2 has ended.
    fn finish(mut self, job: &FinetuneJob, log: Phase2Log) -> Result<FinetuneRun> {
        let maps = attention_maps(job, &self.setup, &self.prepared, &log)?;
        let folder_lock = self.folder_lock.take();
        let mut run = summarize(
            job,
            self.setup,
            &self.prepared,
            (self.phase1, self.snr),
            log,
            maps,
            &self.clock,
        )?;
        run.folder_lock = folder_lock;
        Ok(run)
    }
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
    (phase1, snr): (Phase1Outcome, Option<SnrEstimate>),
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
            class_names: setup.dataset.class_names.clone(),
            float_kernels: setup.float_kernels,
            placement: Some(setup.placement),
        },
        baseline_test_acc: phase1.baseline_test_acc,
        reset_test_acc: log.iter().find(|m| m.epoch == 0).and_then(|m| m.test_acc),
        snr,
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
