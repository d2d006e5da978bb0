//! The paper's real-data protocol on one dataset, one η, one n, one seed (PAPER.md §3), as a
//! list of named steps (see [`finetune`]):
//! setup (data, backbone, split, noise) → features from the cache → phase 1 (the classifier on
//! clean data, shared between runs) → phase 2 (the last layer's query/key, or the card's
//! token-selection head, on the noisy samples) → summary.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::attention_maps::{self, AttentionMaps, PER_KIND, Picks, Snapshot};
use super::checkpoint::{self, Checkpoint, RunIdentity, RunState};
use super::metrics::evaluate;
use super::optim::AdamW;
use super::phases::{
    EpochMetrics, Forward, Penalty, Phase2Data, Schedule, Set, steps_per_epoch, train_classifier,
    train_classifier_on_tokens, train_phase2,
};
pub use super::run::{FinetuneJob, HeadClassifier, Mode, Places, RunConfig, RunFolder};
use crate::data::catalog::{Completeness, Modality};
use crate::data::prepare::{NoiseSpec, PreparedData, prepare};
use crate::data::split::{SplitPlan, TrainSource};
use crate::data::{self, DatasetName};
use crate::diagnostics::locater::{head_symmetric_variance, symmetric_variance};
use crate::diagnostics::{Spectrum, head_spectrum, mean_over_heads, spectrum};
use crate::encoder::cache::{Contents, FeatureCache, Features, cache_root};
use crate::encoder::layer_rows::{LayerBatch, LayerRows, RowsBuilder};
use crate::encoder::{Backbone, Model, TextOptions, resolve};
use crate::model::attend::KeyValues;
use crate::model::{Classifier, LastLayer, QueryKey, TokenSelectionHead};
use crate::rng::{RngChoice, Shuffle, Stream, stream};

/// Test samples whose full last layer is run at scored epochs for the rank-collapse residual.
const RANK_PROBE: usize = 16;

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
    /// Phase-1 mean batch loss per epoch.
    pub pretrain_losses: Vec<f64>,
    pub epochs: Vec<EpochMetrics>,
    /// Token selection on a few fine-tune samples, right after the reset and at the end.
    pub attention_maps: AttentionMaps,
}

/// Progress callbacks (the CLI draws bars; tests pass no-ops).
pub trait Progress: Sync {
    fn stage(&self, _what: &str, _total: usize) {}
    fn advance(&self, _by: usize) {}
    fn epoch(&self, _metrics: &EpochMetrics) {}
    /// A remark about the run, made once (e.g. which steps stay on the host).
    fn note(&self, _line: &str) {}
}

/// What a run off the CPU still computes on the host: small, or without a GPU kernel in candle.
pub const HOST_STEPS: &str = "image resizing, tokenization, the query-key eigenspectrum (nalgebra), the rank-collapse residual and the attention statistics run on the host";

impl Progress for () {}

/// The protocol, step by step.
pub fn finetune(job: &FinetuneJob, progress: &dyn Progress) -> Result<FinetuneRun> {
    let started = Instant::now();
    let mut setup = setup(job)?;
    if !setup.device.is_cpu() {
        progress.note(&format!(
            "--device {}: {HOST_STEPS}",
            device_name(&setup.device)
        ));
    }
    if let Some(out) = &job.out {
        write_config(out, &job.config)?;
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
        let resumed = resumed_checkpoint(job, &identity, &setup.device)?;
        if let Some(saved) = &resumed {
            record_resumed_kernels(&mut setup, saved);
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
        summarize(job, setup, &prepared, phase1, log, maps, &clock)
    })
}

fn device_name(device: &Device) -> &'static str {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu",
        candle_core::DeviceLocation::Cuda { .. } => "cuda",
        candle_core::DeviceLocation::Metal { .. } => "metal",
    }
}

/// What computes the run's floats: the CPU's kernels, or the device beside the host's.
fn float_kernels(device: &Device) -> String {
    let host = crate::runtime::float_kernels();
    match device.location() {
        candle_core::DeviceLocation::Cpu => host.to_string(),
        _ => format!("{} (host: {host})", device_name(device)),
    }
}

/// Writes the resolved configuration into the run folder (the first file a run leaves).
fn write_config(out: &Path, config: &RunConfig) -> Result<()> {
    crate::io::ensure_dir(out)?;
    crate::io::write_json(&RunFolder(out.to_path_buf()).config(), config)
}

/// What a run needs before any feature: its data, backbone and split.
struct Setup {
    root: PathBuf,
    dataset: data::Dataset,
    completeness: Completeness,
    backbone: Backbone,
    device: Device,
    cache: FeatureCache,
    plan: SplitPlan,
    deviations: Vec<String>,
    /// [`crate::runtime::float_kernels`], and on resume those of the earlier sittings.
    float_kernels: String,
}

fn setup(job: &FinetuneJob) -> Result<Setup> {
    job.validate()?;
    let config = &job.config;
    let device = config.device.device()?;
    // An unwritable cache is found now, not after the backbone work.
    let cache = FeatureCache::open(cache_root(job.places.cache_dir.as_deref()))?;
    let root = data::data_root(job.places.data_dir.as_deref());
    let dataset = data::fetch::load_or_fetch(&config.dataset, &root)?;
    let completeness = Completeness::of(&dataset);
    let (backbone, mut deviations) = load_backbone(config, &job.places, &device)?;
    let (plan, notes) = split_plan(config, &dataset, &completeness)?;
    deviations.extend(notes);
    deviations.extend(unofficial_files(&config.dataset, &root)?);
    let float_kernels = float_kernels(&device);
    Ok(Setup {
        root,
        dataset,
        completeness,
        backbone,
        device,
        cache,
        plan,
        deviations,
        float_kernels,
    })
}

/// One deviation per data file that is present but is not the official release (PneumoniaMNIST's
/// offline file is a third-party derivative); partial files are recorded by the completeness.
fn unofficial_files(dataset: &DatasetName, root: &Path) -> Result<Vec<String>> {
    let Some(manifest) = dataset.manifest() else {
        return Ok(Vec::new());
    };
    Ok(data::catalog::verify(&manifest, root)?
        .into_iter()
        .filter_map(|(path, status)| match status {
            data::catalog::FileStatus::Mismatch(why) => Some(format!(
                "{} is not the official release file ({why}): its samples may differ from the paper's",
                path.strip_prefix(root).unwrap_or(&path).display()
            )),
            _ => None,
        })
        .collect())
}

/// The first backbone of the run's preference list that loads, checked against the modality;
/// the paper's backbones that did not load are returned as a deviation.
fn load_backbone(
    config: &RunConfig,
    places: &Places,
    device: &Device,
) -> Result<(Backbone, Vec<String>)> {
    let text = TextOptions {
        special_tokens: config.special_tokens,
        ..Default::default()
    };
    let mut skipped = Vec::new();
    let mut loaded = None;
    for id in &config.backbones {
        match resolve(id, places.models_dir.as_deref())
            .and_then(|files| Backbone::load(files, device, text))
        {
            Ok(backbone) => {
                loaded = Some(backbone);
                break;
            }
            Err(err) => skipped.push(format!("{id}: {err:#}")),
        }
    }
    let Some(backbone) = loaded else {
        bail!("no backbone could be loaded; tried {}", skipped.join(" | "));
    };
    let deviations = config
        .backbones
        .first()
        .filter(|paper| !skipped.is_empty() && **paper != backbone.files.id)
        .map(|paper| {
            format!(
                "backbone {} used instead of the paper's {paper} ({})",
                backbone.files.id,
                skipped[0].split_once(": ").map_or("", |(_, why)| why)
            )
        })
        .into_iter()
        .collect();
    let wanted = if config.dataset.modality() == Modality::Image {
        "vit"
    } else {
        "bert"
    };
    match (&backbone.model, wanted) {
        (Model::Vit(_), "vit") | (Model::Bert(_), "bert") => Ok((backbone, deviations)),
        _ => bail!(
            "{}: a {wanted} backbone is needed for {}",
            backbone.files.id,
            config.dataset
        ),
    }
}

/// The split of a run; pretrain_n shrinks to fit partial data (a deviation), except for the
/// authors' split, which draws the official sizes from the official rows or refuses.
fn split_plan(
    config: &RunConfig,
    dataset: &data::Dataset,
    completeness: &Completeness,
) -> Result<(SplitPlan, Vec<String>)> {
    let mut deviations = Vec::new();
    if config.rng == RngChoice::Authors {
        deviations.push(AUTHORS_RNG_DEVIATION.to_string());
    }
    let plan = SplitPlan {
        pretrain_n: config.pretrain_n,
        n: config.n,
        test_n: config.test_n,
        seed: config.seed,
        carve_train_from_test: config.carve_train_from_test,
        rng: config.rng,
    };
    if config.rng == RngChoice::Authors && config.carve_train_from_test.is_none() {
        return Ok((plan, deviations));
    }
    let n = config.n;
    let pool = match (config.carve_train_from_test, &dataset.train) {
        (Some(f), _) => (f * dataset.test.len() as f64).round() as usize,
        (None, Some(train)) => train.len(),
        (None, None) => 0,
    };
    if pool > 0 && n >= pool {
        bail!(
            "--n {n} exceeds the {} of {}'s {pool} training samples that phase 1 leaves (it needs at least one)",
            pool - 1,
            config.dataset
        );
    }
    let mut pretrain_n = config.pretrain_n;
    if pool > 0 && pretrain_n + n > pool {
        let shrunk = pool - n;
        deviations.push(format!(
            "pretrain_n shrunk from {pretrain_n} to {shrunk}: the training pool holds {pool} samples ({})",
            completeness.line()
        ));
        pretrain_n = shrunk;
    }
    Ok((SplitPlan { pretrain_n, ..plan }, deviations))
}

/// What `--rng authors` leaves ours, recorded with every such run.
pub const AUTHORS_RNG_DEVIATION: &str = "--rng authors: the split, the symmetric label noise and \
    both phases' batch orders are the authors' numpy and torch draws, but the classifier \
    initialisation and the query/key reset (or the head) come from this crate's ChaCha8 stream \
    (the authors' come from torch's CPU stream and from CUDA), and float sums differ in order";

/// The split, the label noise and the three sets.
fn prepare_data(setup: &Setup, job: &FinetuneJob) -> Result<PreparedData> {
    let noise = NoiseSpec {
        model: job.config.noise,
        eta: job.config.eta,
        seed: job.config.seed,
    };
    Ok(prepare(&setup.dataset, &setup.plan, &noise, &setup.root)?)
}

/// The split the training samples come from, by name (the cache keys on it).
fn train_source(
    dataset: &data::Dataset,
    source: TrainSource,
) -> Result<(&'static str, &data::Split)> {
    Ok(match source {
        TrainSource::Train => (
            "train",
            dataset
                .train
                .as_ref()
                .context("the partition found no training split")?,
        ),
        TrainSource::Test => ("test", &dataset.test),
    })
}

/// Features of `positions` of one split through the cache, with a progress stage.
#[allow(clippy::too_many_arguments)]
fn fetch(
    cache: &FeatureCache,
    backbone: &Backbone,
    dataset: &DatasetName,
    (split_name, split): (&str, &data::Split),
    positions: &[usize],
    contents: Contents,
    encode_batch: usize,
    (what, progress): (&str, &dyn Progress),
) -> Result<Features> {
    progress.stage(what, positions.len());
    let (features, stats) = cache.features(
        backbone,
        dataset.id(),
        split_name,
        split,
        positions,
        contents,
        encode_batch,
        &mut |k| progress.advance(k),
    )?;
    progress.advance(stats.from_cache);
    for warning in stats.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(features)
}

/// The features of the three sets of a run.
struct RunFeatures {
    pretrain: Features,
    finetune: Features,
    test: Features,
}

/// Features: each sample through the backbone at most once, whatever ran before.
fn run_features(
    setup: &Setup,
    prepared: &PreparedData,
    job: &FinetuneJob,
    progress: &dyn Progress,
) -> Result<RunFeatures> {
    let source = train_source(&setup.dataset, prepared.partition.train_source)?;
    let get = |what: &str, split, positions: &[usize], contents| {
        fetch(
            &setup.cache,
            &setup.backbone,
            &job.config.dataset,
            split,
            positions,
            contents,
            job.encode_batch,
            (what, progress),
        )
    };
    Ok(RunFeatures {
        pretrain: get(
            "pretrain features",
            source,
            &prepared.partition.pretrain,
            pretrain_contents(&job.config),
        )?,
        finetune: get(
            "fine-tune features",
            source,
            &prepared.partition.finetune,
            Contents::Full,
        )?,
        test: get(
            "test features",
            ("test", &setup.dataset.test),
            &prepared.partition.test,
            Contents::Full,
        )?,
    })
}

/// What phase 1 reads of the pretrain set: the CLS and mean features, or for head mode's
/// `tokens` classifier every token, from the last layer's inputs.
fn pretrain_contents(config: &RunConfig) -> Contents {
    match config.head_classifier {
        Some(HeadClassifier::Tokens) => Contents::Full,
        _ => Contents::Cls,
    }
}

/// Fills the feature cache for every run of `jobs` (any datasets) at once, so that each sample
/// passes through its backbone once and the runs themselves only read the cache.
pub fn prefetch(jobs: &[FinetuneJob], progress: &dyn Progress) -> Result<()> {
    // Runs that read the same backbone over the same data share one pass.
    let mut groups: Vec<Vec<&FinetuneJob>> = Vec::new();
    let group_key = |j: &FinetuneJob| {
        let c = &j.config;
        (
            c.dataset.clone(),
            c.backbones.clone(),
            c.carve_train_from_test.map(f64::to_bits),
            c.special_tokens,
            c.device,
        )
    };
    for job in jobs {
        match groups
            .iter_mut()
            .find(|g| group_key(g[0]) == group_key(job))
        {
            Some(group) => group.push(job),
            None => groups.push(vec![job]),
        }
    }
    for group in groups {
        let setup = setup(group[0])?;
        // Positions by split: full features (fine-tune and test sets) and CLS only (pretrain).
        let mut wanted: BTreeMap<(&str, Contents), BTreeSet<usize>> = BTreeMap::new();
        for job in &group {
            let (plan, _) = split_plan(&job.config, &setup.dataset, &setup.completeness)?;
            let partition = data::split::partition(&setup.dataset, &plan)?;
            let (source, _) = train_source(&setup.dataset, partition.train_source)?;
            let full = wanted.entry((source, Contents::Full)).or_default();
            full.extend(&partition.finetune);
            wanted
                .entry(("test", Contents::Full))
                .or_default()
                .extend(&partition.test);
            wanted
                .entry((source, pretrain_contents(&job.config)))
                .or_default()
                .extend(&partition.pretrain);
        }
        let first = group[0];
        for ((split_name, contents), positions) in &wanted {
            // Samples that also need full features get them (which hold the CLS too).
            let full = wanted.get(&(*split_name, Contents::Full));
            let positions: Vec<usize> = positions
                .iter()
                .copied()
                .filter(|p| *contents == Contents::Full || !full.is_some_and(|f| f.contains(p)))
                .collect();
            if positions.is_empty() {
                continue;
            }
            let source = match *split_name {
                "train" => TrainSource::Train,
                _ => TrainSource::Test,
            };
            let split = train_source(&setup.dataset, source)?;
            let what = format!("{} {split_name} features", first.config.dataset);
            fetch(
                &setup.cache,
                &setup.backbone,
                &first.config.dataset,
                split,
                &positions,
                *contents,
                first.encode_batch,
                (&what, progress),
            )?;
        }
    }
    Ok(())
}

/// The checkpoint of this very run, when resuming; an error when it belongs to another run.
fn resumed_checkpoint(
    job: &FinetuneJob,
    identity: &RunIdentity,
    device: &Device,
) -> Result<Option<Checkpoint>> {
    let (Some(dir), true) = (&job.out, job.resume) else {
        return Ok(None);
    };
    match checkpoint::load(dir, device)? {
        Some(saved) => {
            identity.ensure_same(&saved.state.identity, &checkpoint::path(dir))?;
            Ok(Some(saved))
        }
        None => {
            eprintln!(
                "note: --resume: no checkpoint in {}, starting from the beginning",
                dir.display()
            );
            Ok(None)
        }
    }
}

/// A run resumed on a CPU whose float kernels differ from those of the sittings before: the
/// summary lists each sitting's, and a deviation says that the run equals an uninterrupted one
/// only to float rounding (resuming is bit-exact on the same kind of CPU only).
fn record_resumed_kernels(setup: &mut Setup, saved: &Checkpoint) {
    let Some(history) = kernel_history(&saved.state.float_kernels, &setup.float_kernels) else {
        setup.float_kernels = saved.state.float_kernels.clone();
        return;
    };
    setup.deviations.push(format!(
        "resumed after epoch {} with other float kernels ({history}): float sums differ in \
         order from there on, so the run equals an uninterrupted one only to float rounding",
        saved.state.epochs_done
    ));
    setup.float_kernels = history;
}

/// The sittings' kernels once a sitting with `now` follows those of `before` (empty: not
/// recorded, a checkpoint from before they were kept); None when `now` is what the last sitting
/// ran with.
fn kernel_history(before: &str, now: &str) -> Option<String> {
    let before = if before.is_empty() {
        "unrecorded"
    } else {
        before
    };
    (before.rsplit(", then ").next() != Some(now)).then(|| format!("{before}, then {now}"))
}

/// A run's wall time over its sittings: this one's since it started, plus what the checkpoint it
/// resumed from had recorded (the work a killed sitting did after its last checkpoint is redone,
/// and counted, in the next).
struct WallClock {
    started: Instant,
    earlier_sittings: f64,
}

impl WallClock {
    fn seconds(&self) -> f64 {
        self.earlier_sittings + self.started.elapsed().as_secs_f64()
    }
}

/// The phase-1 classifier and what phase 1 measured.
struct PhaseOne {
    classifier: Classifier,
    baseline_test_acc: f64,
    pretrain_losses: Vec<f64>,
}

/// Writes the run's checkpoint (phase 1, then every `checkpoint_every` phase-2 epochs).
struct Checkpoints<'a> {
    job: &'a FinetuneJob,
    identity: RunIdentity,
    phase1: &'a PhaseOne,
    /// The float kernels of every sitting so far (see [`Resolved::float_kernels`]).
    float_kernels: String,
    clock: &'a WallClock,
}

impl Checkpoints<'_> {
    fn save(
        &self,
        epochs_done: usize,
        optimizer: Option<&AdamW>,
        log: &[EpochMetrics],
        attention_reset: Option<&Snapshot>,
    ) -> Result<()> {
        let Some(dir) = &self.job.out else {
            return Ok(());
        };
        if self.job.checkpoint_every == 0 {
            return Ok(());
        }
        let state = RunState {
            identity: self.identity.clone(),
            baseline_test_acc: self.phase1.baseline_test_acc,
            pretrain_losses: self.phase1.pretrain_losses.clone(),
            epochs_done,
            optimizer_step: optimizer.map_or(0, |o| o.step),
            log: log.to_vec(),
            attention_reset: attention_reset.cloned(),
            float_kernels: self.float_kernels.clone(),
            wall_seconds: self.clock.seconds(),
        };
        let mut tensors = checkpoint::named_tensors("classifier", &self.phase1.classifier.named());
        if let Some(opt) = optimizer {
            tensors.extend(opt.state());
        }
        crate::io::ensure_dir(dir)?;
        checkpoint::save(dir, &state, &tensors)
    }

    fn due(&self, epoch: usize) -> bool {
        epoch.is_multiple_of(self.job.checkpoint_every.max(1)) || epoch == self.job.config.epochs
    }
}

/// Everything phase 1's result depends on: the configuration as phase 1 sees it, and digests of
/// what it reads (the samples, their labels and their features).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Phase1Key {
    version: u32,
    config: RunConfig,
    backbone_sha256: String,
    train_source: String,
    pretrain: Vec<usize>,
    test: Vec<usize>,
    labels_sha256: String,
    features_sha256: String,
}

/// A finished phase 1, as the cache keeps it (with the classifier's tensors).
#[derive(Serialize, Deserialize)]
struct Phase1 {
    key: Phase1Key,
    baseline_test_acc: f64,
    pretrain_losses: Vec<f64>,
}

fn release_indices(split: &data::Split, positions: &[usize]) -> Vec<usize> {
    positions.iter().map(|&p| split.release_index[p]).collect()
}

/// sha256 over the bytes of every tensor, in order.
fn tensors_sha256(tensors: &[&Tensor]) -> Result<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for t in tensors {
        let values: Vec<f32> = t
            .flatten_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1()?;
        for v in values {
            hasher.update(v.to_le_bytes());
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// One lock per phase-1 file, so that concurrent runs of a grid compute it once. A run that
/// panicked while holding it leaves nothing half-written (the file is written atomically), so a
/// poisoned lock is taken over.
fn phase1_lock(file: &Path) -> Arc<Mutex<()>> {
    static LOCKS: std::sync::OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> =
        std::sync::OnceLock::new();
    let locks = LOCKS.get_or_init(Default::default);
    let mut locks = locks.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(locks.entry(file.to_path_buf()).or_default())
}

/// What the phase-1 classifier trains on, and the test features its baseline is scored on.
enum Phase1Input<'a> {
    /// One feature per sample (N, D).
    Features {
        pretrain: &'a Tensor,
        test: &'a Tensor,
    },
    /// Every final token of the pretrain samples, from their last-layer inputs (head mode's
    /// `tokens`); the baseline scores the mean-pooled test tokens, which for a linear classifier
    /// is the mean of its per-token logits, and what the head selects right after its reset.
    Tokens {
        layer_inputs: &'a LayerRows,
        test: &'a Tensor,
    },
}

impl<'a> Phase1Input<'a> {
    fn of(config: &RunConfig, features: &'a RunFeatures) -> Result<Self> {
        let (pretrain, test) = (&features.pretrain, &features.test);
        Ok(match (config.mode, config.head_classifier) {
            (Mode::LastLayer, _) | (Mode::Head, Some(HeadClassifier::Cls)) => Self::Features {
                pretrain: &pretrain.cls,
                test: &test.cls,
            },
            (Mode::Head, Some(HeadClassifier::Tokens)) => Self::Tokens {
                layer_inputs: layer_inputs(pretrain)?,
                test: &test.mean,
            },
            (Mode::Head, Some(HeadClassifier::Mean) | None) => Self::Features {
                pretrain: &pretrain.mean,
                test: &test.mean,
            },
        })
    }

    fn test(&self) -> &'a Tensor {
        match self {
            Self::Features { test, .. } | Self::Tokens { test, .. } => test,
        }
    }

    /// What phase 1's result depends on beyond the configuration, labels and backbone.
    fn sha256(&self) -> Result<String> {
        match self {
            Self::Features { pretrain, test } => tensors_sha256(&[pretrain, test]),
            // The final tokens are a function of the layer inputs and the backbone (in the key).
            Self::Tokens { layer_inputs, test } => Ok(crate::io::json_digest(&(
                layer_inputs.content_digest(),
                tensors_sha256(&[test])?,
            ))?),
        }
    }
}

/// Phase 1: the classifier on clean features, from the checkpoint, the shared phase-1 cache, or
/// trained here.
fn phase_one(
    setup: &Setup,
    prepared: &PreparedData,
    features: &RunFeatures,
    job: &FinetuneJob,
    resumed: Option<&Checkpoint>,
    init_rng: &mut rand_chacha::ChaCha8Rng,
    progress: &dyn Progress,
) -> Result<PhaseOne> {
    let config = &job.config;
    let device = &setup.device;
    let hidden = setup.backbone.hidden_size();
    let classes = setup.dataset.num_classes();
    // ViT's classifier reads the CLS feature, BERT's its pooler on position 0 (when the
    // checkpoint has one), the head mode's the mean-pooled final tokens.
    let pooler = match (&setup.backbone.model, config.mode) {
        (Model::Bert(bert), Mode::LastLayer) => bert
            .pooler
            .as_ref()
            .map(|p| p.bias().map(|b| (p.weight(), b)))
            .map(|p| p.context("pooler.dense has no bias"))
            .transpose()?,
        _ => None,
    };
    let classifier = Classifier::new(hidden, classes, pooler, init_rng, device)?;
    let input = Phase1Input::of(config, features)?;
    if let Some(saved) = resumed {
        checkpoint::restore_params("classifier", &classifier.named(), &saved.tensors)?;
        return Ok(PhaseOne {
            classifier,
            baseline_test_acc: saved.state.baseline_test_acc,
            pretrain_losses: saved.state.pretrain_losses.clone(),
        });
    }
    let (source_name, source) = train_source(&setup.dataset, prepared.partition.train_source)?;
    let labels: Vec<u32> = prepared
        .pretrain
        .labels
        .iter()
        .chain(&prepared.test.labels)
        .copied()
        .collect();
    let key = Phase1Key {
        version: 2,
        config: config.phase1_view(),
        backbone_sha256: setup.backbone.weights_sha256.clone(),
        train_source: source_name.to_string(),
        pretrain: release_indices(source, &prepared.partition.pretrain),
        test: release_indices(&setup.dataset.test, &prepared.partition.test),
        labels_sha256: crate::io::json_digest(&labels)?,
        features_sha256: input.sha256()?,
    };
    // Phase 1 depends on the pretrain set, not on n or η (the split keeps it fixed across n):
    // runs of a grid share it through the cache, computed once.
    let file = setup.cache.root().join("phase1").join(format!(
        "{}.safetensors",
        &crate::io::json_digest(&key)?[..24]
    ));
    let lock = phase1_lock(&file);
    let _only_one_computes = lock.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(Some((saved, tensors))) = checkpoint::load_state::<Phase1>(&file, device)
        && saved.key == key
    {
        checkpoint::restore_params("classifier", &classifier.named(), &tensors)?;
        return Ok(PhaseOne {
            classifier,
            baseline_test_acc: saved.baseline_test_acc,
            pretrain_losses: saved.pretrain_losses,
        });
    }
    let mut losses = Vec::new();
    progress.stage("phase 1 epochs", config.pretrain_epochs);
    let schedule = Schedule {
        epochs: config.pretrain_epochs,
        batch_size: config.batch_size,
        optimizer: &config.optimizer,
        shuffle: Shuffle {
            rng: config.rng,
            seed: config.seed,
        },
    };
    let mut on_epoch = |_, loss| {
        losses.push(loss);
        progress.advance(1);
    };
    let labels = &prepared.pretrain.labels;
    match &input {
        Phase1Input::Features { pretrain, .. } => train_classifier(
            &classifier,
            &pretrain.to_device(device)?,
            labels,
            &schedule,
            &mut on_epoch,
        )?,
        Phase1Input::Tokens { layer_inputs, .. } => {
            // The final tokens once, spilled beside the cache; every epoch reads them back.
            let model = &setup.backbone.model;
            let tokens = final_tokens(model, layer_inputs, device, Some(setup.cache.root()))?;
            train_classifier_on_tokens(&classifier, &tokens, labels, &schedule, &mut on_epoch)?
        }
    }
    let baseline = evaluate(
        &classifier
            .forward(&input.test().to_device(device)?)?
            .detach(),
        &prepared.test.labels,
    )?
    .accuracy;
    let saved = Phase1 {
        key,
        baseline_test_acc: baseline,
        pretrain_losses: losses.clone(),
    };
    checkpoint::save_state(
        &file,
        &saved,
        &checkpoint::named_tensors("classifier", &classifier.named()),
    )?;
    Ok(PhaseOne {
        classifier,
        baseline_test_acc: baseline,
        pretrain_losses: losses,
    })
}

/// The attention geometry of the last layer (or of the head, which has one D-dim head).
#[derive(Clone, Copy)]
struct QkShape {
    mode: Mode,
    heads: usize,
    head_dim: usize,
    hidden: usize,
}

impl QkShape {
    fn of(model: &Model, mode: Mode, hidden: usize) -> Self {
        let attention = match model {
            Model::Vit(v) => &v.last_layer().attention,
            Model::Bert(b) => &b.last_layer().attention,
        };
        Self {
            mode,
            heads: attention.num_heads,
            head_dim: attention.head_dim,
            hidden,
        }
    }

    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

/// A trained parameter by name, as the optimizer holds it.
fn param(opt: &AdamW, name: &str) -> Result<Tensor> {
    Ok(opt
        .param(name)
        .with_context(|| format!("no parameter {name}"))?
        .as_tensor()
        .clone())
}

/// The query-key eigenspectrum (PAPER.md §5) of the trained parameters: per head and averaged in
/// last-layer mode; in head mode W itself, whose query is p, as in the synthetic model.
fn qk_spectrum(opt: &AdamW, shape: QkShape) -> Result<Spectrum> {
    let host = |name: &str| -> Result<Vec<f32>> { Ok(param(opt, name)?.flatten_all()?.to_vec1()?) };
    Ok(match shape.mode {
        Mode::LastLayer => {
            let (wq, wk) = (host("query.weight")?, host("key.weight")?);
            let rows = shape.head_dim * shape.hidden;
            let per_head: Vec<Spectrum> = (0..shape.heads)
                .map(|h| {
                    head_spectrum(
                        &wq[h * rows..(h + 1) * rows],
                        &wk[h * rows..(h + 1) * rows],
                        shape.head_dim,
                        shape.scale(),
                    )
                })
                .collect();
            mean_over_heads(&per_head)
        }
        Mode::Head => spectrum(&nalgebra::DMatrix::from_row_iterator(
            shape.hidden,
            shape.hidden,
            host("head.w")?.into_iter().map(f64::from),
        )),
    })
}

/// LocAteR on the same query-key matrix the spectrum reads, when λ > 0.
fn locater_penalty(
    opt: &AdamW,
    shape: QkShape,
    lambda: f64,
) -> Result<Option<Box<Penalty<'static>>>> {
    if lambda == 0.0 {
        return Ok(None);
    }
    Ok(Some(match shape.mode {
        Mode::LastLayer => {
            let (query, key) = (param(opt, "query.weight")?, param(opt, "key.weight")?);
            let (heads, scale) = (shape.heads, shape.scale());
            Box::new(move || -> Result<Tensor> {
                Ok((head_symmetric_variance(&query, &key, heads, scale)? * lambda)?)
            }) as Box<Penalty<'static>>
        }
        Mode::Head => {
            let w = param(opt, "head.w")?;
            Box::new(move || -> Result<Tensor> { Ok((symmetric_variance(&w)? * lambda)?) })
        }
    }))
}

/// Phase 2's record: every epoch's metrics, and the attention maps' samples right after the
/// reset and at the end.
struct Phase2Log {
    epochs: Vec<EpochMetrics>,
    picks: Picks,
    reset: Snapshot,
    last: Snapshot,
}

/// The attention maps' samples right after the reset: as the checkpoint recorded them when it
/// did, else measured now. `forward` must still read the reset parameters, as it does before a
/// resumed optimizer state is restored; the reset is drawn from the run's seed, so a run resumed
/// from a checkpoint without the record measures exactly what the interrupted run did.
fn reset_snapshot(
    forward: &Forward,
    picks: &Picks,
    resumed: Option<&Checkpoint>,
) -> Result<Snapshot> {
    if let Some(saved) = resumed.and_then(|c| c.state.attention_reset.as_ref())
        && saved.rows == picks.rows
    {
        return Ok(saved.clone());
    }
    attention_maps::snapshot(forward, picks, 0)
}

/// Trains `params` through `forward` with the run's optimizer and loop, resuming the optimizer
/// from the checkpoint; at scored epochs the diagnostics join the metrics (the query-key
/// spectrum, and rank collapse through `rank_probe`). Returns the log of every epoch, with the
/// attention of `picks` before the first step and after the last.
#[allow(clippy::too_many_arguments)]
fn train_trainable(
    job: &FinetuneJob,
    data: &Phase2Data,
    forward: &Forward,
    params: Vec<(String, Var)>,
    shape: QkShape,
    rank_probe: Option<&dyn Fn() -> Result<f64>>,
    picks: &Picks,
    checkpoints: &Checkpoints,
    resumed: Option<&Checkpoint>,
    progress: &dyn Progress,
) -> Result<Phase2Log> {
    let config = &job.config;
    let total_steps = config.epochs * steps_per_epoch(config.n, config.batch_size);
    let mut opt = AdamW::new(params, config.optimizer.clone(), total_steps)?;
    let penalty = locater_penalty(&opt, shape, config.locater)?;
    let (start_epoch, mut log) = match resumed {
        Some(saved) => (saved.state.epochs_done, saved.state.log.clone()),
        None => (0, Vec::new()),
    };
    let reset = reset_snapshot(forward, picks, resumed)?;
    if let Some(saved) = resumed.filter(|s| s.state.epochs_done > 0) {
        opt.restore(&saved.tensors, saved.state.optimizer_step)?;
    }
    progress.stage("phase 2 epochs", config.epochs);
    progress.advance(start_epoch);
    train_phase2(
        forward,
        &mut opt,
        data,
        start_epoch,
        config.epochs,
        config.batch_size,
        Shuffle {
            rng: config.rng,
            seed: config.seed,
        },
        config.eval_every,
        penalty.as_deref(),
        // A fresh run logs epoch 0 (right after the reset) first; a resumed one has it.
        log.is_empty(),
        &mut |m: &EpochMetrics, opt: &AdamW| {
            let mut m = m.clone();
            if m.test_acc.is_some() {
                m.qk_spectrum = Some(qk_spectrum(opt, shape)?);
                m.rank_collapse = rank_probe.map(|probe| probe()).transpose()?;
            }
            if m.epoch > 0 {
                progress.epoch(&m);
            }
            let epoch = m.epoch;
            log.push(m);
            if checkpoints.due(epoch) {
                checkpoints.save(epoch, Some(opt), &log, Some(&reset))?;
            }
            Ok(())
        },
    )?;
    Ok(Phase2Log {
        epochs: log,
        last: attention_maps::snapshot(forward, picks, config.epochs)?,
        picks: picks.clone(),
        reset,
    })
}

/// Phase 2 on the noisy samples, in the run's mode.
fn phase_two(
    setup: &Setup,
    prepared: &PreparedData,
    features: RunFeatures,
    checkpoints: &Checkpoints,
    resumed: Option<&Checkpoint>,
    init_rng: &mut rand_chacha::ChaCha8Rng,
    progress: &dyn Progress,
) -> Result<Phase2Log> {
    let (job, phase1) = (checkpoints.job, checkpoints.phase1);
    let data = Phase2Data {
        labels: &prepared.labels.labels,
        clean_labels: &prepared.labels.clean_labels,
        noisy_mask: &prepared.labels.noisy_mask,
        test_labels: &prepared.test.labels,
    };
    let hidden = setup.backbone.hidden_size();
    let shape = QkShape::of(&setup.backbone.model, job.config.mode, hidden);
    let picks = Picks::choose(
        &prepared.labels.noisy_mask,
        layer_inputs(&features.finetune)?.lengths(),
        PER_KIND,
    );
    let train = |forward: &Forward, params, probe: Option<&dyn Fn() -> Result<f64>>| {
        train_trainable(
            job,
            &data,
            forward,
            params,
            shape,
            probe,
            &picks,
            checkpoints,
            resumed,
            progress,
        )
    };
    let device = &setup.device;
    // The n ≤ 1000 fine-tune samples are read once into memory; the test set streams from the
    // cache a chunk at a time, so no set-sized tensor exists whatever its size.
    let train_rows = layer_inputs(&features.finetune)?.resident()?;
    let test_rows = layer_inputs(&features.test)?.clone();
    drop(features);
    match job.config.mode {
        Mode::LastLayer => {
            let layer = LastLayer::new(&setup.backbone.model, &phase1.classifier)?;
            // Rank collapse is read on the first test samples' full layer (every token's query).
            let probe_rows: Vec<usize> = (0..RANK_PROBE.min(test_rows.len())).collect();
            let probe = test_rows.batch(&probe_rows, device)?;
            let probe_mask = text_mask(&setup.backbone.model, &probe)?;
            let qk = QueryKey::reset(hidden, init_rng, device)?;
            let rank_probe = || layer.rank_collapse(&qk, &probe.inputs, probe_mask.as_ref());
            let resident = layer.resident(&train_rows, device)?;
            drop(train_rows);
            let forward = |set: Set, rows: &[usize]| {
                let out = match set {
                    Set::Finetune => layer.forward_resident(&qk, &resident, rows)?,
                    Set::Test => {
                        let batch = test_rows.batch(rows, device)?;
                        layer.forward(&qk, &batch.inputs, &batch.lengths)?
                    }
                };
                Ok((out.logits, out.cls_attention))
            };
            train(&forward, qk.named(), Some(&rank_probe))
        }
        Mode::Head => {
            // The final tokens are what the head selects from: the fine-tune set's in memory, the
            // test set's in a temporary file beside the cache, each computed once.
            let model = &setup.backbone.model;
            let train_tokens = final_tokens(model, &train_rows, device, None)?;
            let test_tokens = final_tokens(model, &test_rows, device, Some(setup.cache.root()))?;
            drop(train_rows);
            // The fine-tune set's tokens once as the head reads them; test batches as they come.
            let as_keys = |tokens: &LayerRows, rows: &[usize]| -> Result<Arc<KeyValues>> {
                let batch = tokens.batch(rows, device)?;
                Ok(Arc::new(KeyValues::new(
                    &batch.inputs,
                    1,
                    Some(&batch.lengths),
                    1.0,
                )?))
            };
            let all_train: Vec<usize> = (0..train_tokens.len()).collect();
            let train_keys = as_keys(&train_tokens, &all_train)?;
            drop(train_tokens);
            let head = TokenSelectionHead::new(hidden, init_rng, device)?;
            let classifier = &phase1.classifier;
            let forward = |set: Set, rows: &[usize]| {
                let selection = match set {
                    Set::Finetune => head.select(&train_keys, rows)?,
                    Set::Test => {
                        let keys = as_keys(&test_tokens, rows)?;
                        head.select(&keys, &(0..rows.len()).collect::<Vec<_>>())?
                    }
                };
                Ok((classifier.forward(&selection.pooled)?, selection.attention))
            };
            train(&forward, head.named(), None)
        }
    }
}

fn layer_inputs(features: &Features) -> Result<&LayerRows> {
    features
        .layer_inputs
        .as_ref()
        .context("full features (the last layer's inputs) expected")
}

/// The padding mask of a text batch, on its device (ViT attends to every token: none).
fn text_mask(model: &Model, batch: &LayerBatch) -> Result<Option<Tensor>> {
    Ok(match model {
        Model::Vit(_) => None,
        Model::Bert(_) => Some(batch.mask()?),
    })
}

/// Final tokens from the last layer's inputs, through the frozen last layer on `device`, 64
/// samples at a time: in memory, or in a temporary file under `spill_dir`.
fn final_tokens(
    model: &Model,
    inputs: &LayerRows,
    device: &Device,
    spill_dir: Option<&Path>,
) -> Result<LayerRows> {
    let (tokens, dim) = (inputs.tokens(), inputs.dim());
    let mut out = match spill_dir {
        Some(dir) => RowsBuilder::on_disk(dir, tokens, dim)?,
        None => RowsBuilder::in_memory(tokens, dim),
    };
    let rows: Vec<usize> = (0..inputs.len()).collect();
    for chunk in rows.chunks(64) {
        let batch = inputs.batch(chunk, device)?;
        let finished = match model {
            Model::Vit(vit) => vit.finish(&batch.inputs)?,
            Model::Bert(bert) => bert.finish(&batch.inputs, &batch.mask()?)?,
        };
        out.push(&finished, &batch.lengths)?;
    }
    Ok(out.finish())
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
    let mut deviations = setup.deviations;
    deviations.extend(prepared.partition.deviations.iter().cloned());
    let summary = FinetuneSummary {
        config: job.config.clone(),
        resolved: Resolved {
            backbone: setup.backbone.files.id.clone(),
            backbone_sha256: setup.backbone.weights_sha256.clone(),
            backbone_source: setup.backbone.files.source.clone(),
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
        pretrain_losses: phase1.pretrain_losses,
        epochs: log,
        attention_maps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that panics while holding the phase-1 lock does not take the other runs of a grid
    /// down with it.
    /// A sitting on the same kernels as the last one adds nothing; another kind of CPU, or a
    /// checkpoint that never recorded its kernels, is listed after them.
    #[test]
    fn a_resumed_run_lists_each_sittings_float_kernels() {
        let (a, b) = ("x86_64 avx512f", "x86_64 avx2+fma");
        assert_eq!(kernel_history(a, a), None);
        assert_eq!(
            kernel_history(a, b).as_deref(),
            Some("x86_64 avx512f, then x86_64 avx2+fma")
        );
        let twice = kernel_history(a, b).unwrap();
        assert_eq!(kernel_history(&twice, b), None);
        assert_eq!(
            kernel_history(&twice, a).as_deref(),
            Some("x86_64 avx512f, then x86_64 avx2+fma, then x86_64 avx512f")
        );
        assert_eq!(
            kernel_history("", a).as_deref(),
            Some("unrecorded, then x86_64 avx512f")
        );
    }

    #[test]
    fn a_poisoned_phase1_lock_is_taken_over() {
        let file = Path::new("/nonexistent/phase1-lock-test");
        let lock = phase1_lock(file);
        let poisoned = Arc::clone(&lock);
        let _ = std::thread::spawn(move || {
            let _held = poisoned.lock().unwrap();
            panic!("a run failed while computing phase 1");
        })
        .join();
        assert!(lock.is_poisoned());
        let again = phase1_lock(file);
        let _held = again.lock().unwrap_or_else(|e| e.into_inner());
    }
}
