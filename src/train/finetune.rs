//! The paper's real-data protocol on one dataset, one η, one n, one seed (PAPER.md §3):
//! split and noise → features from the cache → phase 1 (classifier on clean data) → phase 2
//! (the last layer's query/key, or the card's token-selection head, on the noisy samples).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::checkpoint::{self, RunIdentity, RunState};
use super::config::{DatasetConfig, dataset_config};
use super::metrics::evaluate;
use super::optim::AdamW;
use super::phases::{
    EpochMetrics, Forward, Penalty, Phase2Data, Set, steps_per_epoch, train_classifier,
    train_phase2,
};
use crate::data::catalog::{Completeness, Modality};
use crate::data::files::sha256_hex;
use crate::data::noise::NoiseModel;
use crate::data::prepare::{NoiseSpec, prepare};
use crate::data::split::{SplitPlan, TrainSource};
use crate::data::{self, DatasetName};
use crate::diagnostics::locater::{head_symmetric_variance, symmetric_variance};
use crate::diagnostics::{Spectrum, head_spectrum, mean_over_heads, spectrum};
use crate::encoder::cache::{Contents, FeatureCache, Features, cache_root};
use crate::encoder::{Backbone, Model, TextOptions, resolve};
use crate::io::ensure_dir;
use crate::model::attend::KeyValues;
use crate::model::{Classifier, LastLayer, QueryKey, TokenSelectionHead};
use crate::rng::{Stream, stream};

/// Test samples whose full last layer is run at scored epochs for the rank-collapse residual.
const RANK_PROBE: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The paper: re-initialise and train the last layer's query and key.
    LastLayer,
    /// The card: a token-selection head on the final tokens, with a frozen linear classifier.
    Head,
}

#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    pub dataset: DatasetName,
    pub eta: f64,
    pub noise: NoiseModel,
    pub mode: Mode,
    pub seed: u64,
    /// `None`: the dataset config's value.
    pub n: Option<usize>,
    pub pretrain_n: Option<usize>,
    pub epochs: Option<usize>,
    pub pretrain_epochs: Option<usize>,
    /// `None`: the config's preference list.
    pub backbone: Option<String>,
    pub test_n: Option<usize>,
    pub eval_every: usize,
    pub carve_train_from_test: Option<f64>,
    pub data_dir: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub encode_batch: usize,
    pub special_tokens: bool,
    /// Where to write checkpoints (and where `resume` reads one).
    pub out: Option<PathBuf>,
    /// Phase-2 epochs between checkpoints; 0: none.
    pub checkpoint_every: usize,
    /// Continue from the checkpoint in `out`, if there is one.
    pub resume: bool,
    /// Where the backbone and both phases compute.
    pub device: Device,
    /// CPU threads of phases 1 and 2 (extraction uses all cores).
    pub train_threads: usize,
    /// λ of the LocAteR penalty on the trained query-key matrix (`diagnostics::locater`); 0: none.
    pub locater: f64,
}

/// summary.json: everything needed to read and reproduce the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinetuneSummary {
    pub dataset: String,
    pub backbone: String,
    pub backbone_sha256: String,
    pub backbone_source: String,
    pub mode: Mode,
    pub noise: String,
    pub eta: f64,
    pub realised_eta: f64,
    pub n: usize,
    pub pretrain_n: usize,
    pub test_n: usize,
    pub seed: u64,
    pub epochs: usize,
    pub pretrain_epochs: usize,
    /// Phase-1 test accuracy (the paper's "baseline").
    pub baseline_test_acc: f64,
    pub train_loss: f64,
    pub train_acc: f64,
    /// NaN (written null) when no label was flipped.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub memorization: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub clean_train_acc: f64,
    pub test_acc: f64,
    pub test_loss: f64,
    pub max_cls_attention: f64,
    pub attention_entropy: f64,
    /// Query-key eigenspectrum at the end (mean over heads; `diagnostics` has the definitions).
    pub qk_spectrum: Option<Spectrum>,
    /// Rank-collapse residual of the last layer's token outputs at the end (last-layer mode).
    #[serde(default)]
    pub rank_collapse: Option<f64>,
    /// λ of the LocAteR penalty (0: none, the paper's protocol).
    #[serde(default)]
    pub locater: f64,
    pub dataset_completeness: Completeness,
    /// Every way this run departs from the paper's protocol, one sentence each.
    pub deviations: Vec<String>,
    pub wall_seconds: f64,
}

pub struct FinetuneRun {
    pub summary: FinetuneSummary,
    /// Phase-1 mean batch loss per epoch.
    pub pretrain_losses: Vec<f64>,
    pub epochs: Vec<EpochMetrics>,
}

/// Progress callbacks (the CLI draws bars; tests pass no-ops).
pub trait Progress: Sync {
    fn stage(&self, _what: &str, _total: usize) {}
    fn advance(&self, _by: usize) {}
    fn epoch(&self, _metrics: &EpochMetrics) {}
}

impl Progress for () {}

/// The first backbone of `candidates` that resolves and loads; failures of earlier ones are
/// returned as deviations.
fn pick_backbone(
    candidates: &[String],
    options: &FinetuneOptions,
) -> Result<(Backbone, Vec<String>)> {
    let text = TextOptions {
        special_tokens: options.special_tokens,
        ..Default::default()
    };
    let mut skipped = Vec::new();
    for id in candidates {
        match resolve(id, options.models_dir.as_deref())
            .and_then(|files| Backbone::load(files, &options.device, text))
        {
            Ok(backbone) => {
                let deviations = skipped
                    .iter()
                    .map(|(paper, why): &(String, String)| {
                        format!(
                            "backbone {} used instead of the paper's {paper} ({why})",
                            backbone.files.id
                        )
                    })
                    .take(1)
                    .collect();
                return Ok((backbone, deviations));
            }
            Err(err) => skipped.push((id.clone(), format!("{err:#}"))),
        }
    }
    let tried: Vec<String> = skipped
        .into_iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect();
    bail!("no backbone could be loaded; tried {}", tried.join(" | "))
}

/// Final tokens (N, T, D) from cached last-layer inputs, through the frozen last layer on
/// `device` (the model's).
fn final_tokens(model: &Model, features: &Features, device: &Device) -> Result<Tensor> {
    let inputs = features
        .layer_inputs
        .as_ref()
        .context("full features expected")?;
    let n = inputs.dim(0)?;
    let mut out = Vec::new();
    for start in (0..n).step_by(64) {
        let len = 64.min(n - start);
        let x = inputs.narrow(0, start, len)?.to_device(device)?;
        out.push(match model {
            Model::Vit(vit) => vit.finish(&x)?,
            Model::Bert(bert) => {
                let mask = features
                    .attention_mask
                    .as_ref()
                    .context("text features carry their mask")?;
                bert.finish(&x, &mask.narrow(0, start, len)?.to_device(device)?)?
            }
        });
    }
    Ok(Tensor::cat(&out, 0)?)
}

/// What a run needs before any feature: its data, backbone and split.
struct Setup {
    config: DatasetConfig,
    root: PathBuf,
    dataset: data::Dataset,
    completeness: Completeness,
    backbone: Backbone,
    plan: SplitPlan,
    n: usize,
    pretrain_n: usize,
    epochs: usize,
    pretrain_epochs: usize,
    deviations: Vec<String>,
}

fn setup(options: &FinetuneOptions) -> Result<Setup> {
    if !(0.0..1.0).contains(&options.eta) {
        bail!("--eta must be in [0, 1), got {}", options.eta);
    }
    if !(options.locater.is_finite() && options.locater >= 0.0) {
        bail!(
            "--locater must be a finite number ≥ 0, got {}",
            options.locater
        );
    }
    if options.eval_every == 0 || options.encode_batch == 0 {
        bail!("--eval-every and --encode-batch must be at least 1");
    }
    let config = dataset_config(&options.dataset)?;
    let epochs = options.epochs.unwrap_or(config.epochs);
    let pretrain_epochs = options.pretrain_epochs.unwrap_or(config.pretrain_epochs);
    let root = data::data_root(options.data_dir.as_deref());
    let dataset = data::load(&options.dataset, &root)?;
    let completeness = Completeness::of(&dataset);
    let (backbone, mut deviations) = load_backbone(options, &config)?;
    let (plan, notes) = split_plan(options, &config, &dataset, &completeness)?;
    deviations.extend(notes);
    if epochs == 0 {
        bail!("--epochs must be at least 1");
    }
    Ok(Setup {
        n: plan.n,
        pretrain_n: plan.pretrain_n,
        config,
        root,
        dataset,
        completeness,
        backbone,
        plan,
        epochs,
        pretrain_epochs,
        deviations,
    })
}

/// The first backbone of the run's preference list that loads, checked against the modality.
fn load_backbone(
    options: &FinetuneOptions,
    config: &DatasetConfig,
) -> Result<(Backbone, Vec<String>)> {
    let candidates = match &options.backbone {
        Some(id) => vec![id.clone()],
        None => config.backbones.clone(),
    };
    let (backbone, deviations) = pick_backbone(&candidates, options)?;
    let wanted = if options.dataset.modality() == Modality::Image {
        "vit"
    } else {
        "bert"
    };
    match (&backbone.model, wanted) {
        (Model::Vit(_), "vit") | (Model::Bert(_), "bert") => Ok((backbone, deviations)),
        _ => bail!(
            "{}: a {wanted} backbone is needed for {}",
            backbone.files.id,
            options.dataset
        ),
    }
}

/// The split of a run; pretrain_n shrinks to fit partial data, as the issue asks (a deviation).
fn split_plan(
    options: &FinetuneOptions,
    config: &DatasetConfig,
    dataset: &data::Dataset,
    completeness: &Completeness,
) -> Result<(SplitPlan, Vec<String>)> {
    let n = options.n.unwrap_or(config.n);
    if n == 0 {
        bail!("--n must be at least 1");
    }
    let pool = match (options.carve_train_from_test, &dataset.train) {
        (Some(f), _) => (f * dataset.test.len() as f64).round() as usize,
        (None, Some(train)) => train.len(),
        (None, None) => 0,
    };
    if pool > 0 && n > pool {
        bail!(
            "--n {n} exceeds the {pool} samples of {}'s training pool",
            options.dataset
        );
    }
    let mut deviations = Vec::new();
    let mut pretrain_n = options.pretrain_n.unwrap_or(config.pretrain_n);
    if pool > 0 && pretrain_n + n > pool {
        let shrunk = pool - n;
        deviations.push(format!(
            "pretrain_n shrunk from {pretrain_n} to {shrunk}: the training pool holds {pool} samples ({})",
            completeness.line()
        ));
        pretrain_n = shrunk;
    }
    let plan = SplitPlan {
        pretrain_n,
        n,
        test_n: options.test_n,
        seed: options.seed,
        carve_train_from_test: options.carve_train_from_test,
    };
    Ok((plan, deviations))
}

/// The split the training samples come from, by name (the cache keys on it).
fn train_source(dataset: &data::Dataset, source: TrainSource) -> (&'static str, &data::Split) {
    match source {
        TrainSource::Train => (
            "train",
            dataset
                .train
                .as_ref()
                .expect("the partition found a training split"),
        ),
        TrainSource::Test => ("test", &dataset.test),
    }
}

/// Features of `positions` of one split through the cache, with a progress stage.
fn fetch(
    cache: &FeatureCache,
    backbone: &Backbone,
    options: &FinetuneOptions,
    (split_name, split): (&str, &data::Split),
    positions: &[usize],
    contents: Contents,
    (what, progress): (&str, &dyn Progress),
) -> Result<Features> {
    progress.stage(what, positions.len());
    let (features, stats) = cache.features(
        backbone,
        options.dataset.id(),
        split_name,
        split,
        positions,
        contents,
        options.encode_batch,
        &mut |k| progress.advance(k),
    )?;
    progress.advance(stats.from_cache);
    for warning in stats.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(features)
}

/// Fills the feature cache for every run of `runs` (any datasets) at once, so that each sample
/// passes through its backbone once and the runs themselves only read the cache.
pub fn prefetch(runs: &[FinetuneOptions], progress: &dyn Progress) -> Result<()> {
    let mut groups: Vec<Vec<&FinetuneOptions>> = Vec::new();
    for run in runs {
        match groups.iter_mut().find(|g| {
            let first = g[0];
            (
                first.dataset.id(),
                &first.backbone,
                first.carve_train_from_test,
            ) == (run.dataset.id(), &run.backbone, run.carve_train_from_test)
        }) {
            Some(group) => group.push(run),
            None => groups.push(vec![run]),
        }
    }
    for group in groups {
        let first = group[0];
        let config = dataset_config(&first.dataset)?;
        let root = data::data_root(first.data_dir.as_deref());
        let dataset = data::load(&first.dataset, &root)?;
        let completeness = Completeness::of(&dataset);
        let (backbone, _) = load_backbone(first, &config)?;
        // Positions by split: full features (fine-tune and test sets) and CLS only (pretrain).
        let mut wanted: BTreeMap<(&str, Contents), BTreeSet<usize>> = BTreeMap::new();
        for run in &group {
            let (plan, _) = split_plan(run, &config, &dataset, &completeness)?;
            let partition = data::split::partition(&dataset, &plan)?;
            let (source, _) = train_source(&dataset, partition.train_source);
            let full = wanted.entry((source, Contents::Full)).or_default();
            full.extend(&partition.finetune);
            wanted
                .entry(("test", Contents::Full))
                .or_default()
                .extend(&partition.test);
            wanted
                .entry((source, Contents::Cls))
                .or_default()
                .extend(&partition.pretrain);
        }
        let cache = FeatureCache::new(cache_root(first.cache_dir.as_deref()));
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
            let split = match *split_name {
                "train" => dataset.train.as_ref().expect("a train source exists"),
                _ => &dataset.test,
            };
            let what = format!("{} {split_name} features", first.dataset);
            fetch(
                &cache,
                &backbone,
                first,
                (split_name, split),
                &positions,
                *contents,
                (&what, progress),
            )?;
        }
    }
    Ok(())
}

/// Everything phase 1's result depends on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Phase1Key {
    version: u32,
    dataset: String,
    backbone_sha256: String,
    /// What the classifier reads: "cls" or "mean" (head mode).
    features: String,
    pooler: bool,
    pretrain: Vec<usize>,
    test: Vec<usize>,
    train_source: String,
    seed: u64,
    pretrain_epochs: usize,
    batch_size: usize,
    optimizer: String,
    train_threads: usize,
    device: String,
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

/// One lock per phase-1 file, so that concurrent runs of a grid compute it once.
fn phase1_lock(file: &std::path::Path) -> Arc<std::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<
        std::sync::Mutex<HashMap<PathBuf, Arc<std::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    let locks = LOCKS.get_or_init(Default::default);
    let mut locks = locks.lock().expect("phase-1 lock table");
    Arc::clone(locks.entry(file.to_path_buf()).or_default())
}

pub fn finetune(options: &FinetuneOptions, progress: &dyn Progress) -> Result<FinetuneRun> {
    let started = Instant::now();
    let Setup {
        config,
        root,
        dataset,
        completeness,
        backbone,
        plan,
        n,
        pretrain_n,
        epochs,
        pretrain_epochs,
        mut deviations,
    } = setup(options)?;
    let noise = NoiseSpec {
        model: options.noise,
        eta: options.eta,
        seed: options.seed,
    };
    let prepared = prepare(&dataset, &plan, &noise, &root)?;
    deviations.extend(prepared.partition.deviations.iter().cloned());

    // Features: each sample through the backbone at most once, whatever ran before.
    let cache = FeatureCache::new(cache_root(options.cache_dir.as_deref()));
    let (source_name, source) = train_source(&dataset, prepared.partition.train_source);
    let features = |what: &str,
                    split: &str,
                    data: &data::Split,
                    positions: &[usize],
                    contents: Contents|
     -> Result<Features> {
        fetch(
            &cache,
            &backbone,
            options,
            (split, data),
            positions,
            contents,
            (what, progress),
        )
    };
    let pretrain = features(
        "pretrain features",
        source_name,
        source,
        &prepared.partition.pretrain,
        Contents::Cls,
    )?;
    let finetune = features(
        "fine-tune features",
        source_name,
        source,
        &prepared.partition.finetune,
        Contents::Full,
    )?;
    let test = features(
        "test features",
        "test",
        &dataset.test,
        &prepared.partition.test,
        Contents::Full,
    )?;

    // Both phases are chains of small ops: one thread each (by default) beats sharing cores,
    // whose hand-offs dominate such ops, and keeps results independent of the core count.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.train_threads.max(1))
        .build()
        .context("building the training thread pool")?;
    pool.install(|| -> Result<FinetuneRun> {
        let device = &options.device;
        let on_device = |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(device)?) };

        // A checkpoint of this very run, when resuming.
        let identity = RunIdentity {
            dataset: options.dataset.to_string(),
            backbone: backbone.files.id.clone(),
            backbone_sha256: backbone.weights_sha256.clone(),
            mode: format!("{:?}", options.mode),
            noise: options.noise.to_string(),
            eta: options.eta,
            n,
            pretrain_n,
            test_n: prepared.test.len(),
            seed: options.seed,
            epochs,
            pretrain_epochs,
            eval_every: options.eval_every,
            locater: options.locater,
        };
        let resumed = match (&options.out, options.resume) {
            (Some(dir), true) => match checkpoint::load(dir, device)? {
                Some(saved) => {
                    identity.ensure_same(&saved.state.identity, &checkpoint::path(dir))?;
                    Some(saved)
                }
                None => {
                    eprintln!(
                        "note: --resume: no checkpoint in {}, starting from the beginning",
                        dir.display()
                    );
                    None
                }
            },
            _ => None,
        };
        let save_checkpoint = |state: &RunState, tensors: &HashMap<String, Tensor>| -> Result<()> {
            match &options.out {
                Some(dir) if options.checkpoint_every > 0 => {
                    ensure_dir(dir)?;
                    checkpoint::save(dir, state, tensors)
                }
                _ => Ok(()),
            }
        };

        // Phase 1: the classifier on clean data.
        let mut init_rng = stream(options.seed, Stream::Init);
        let hidden = backbone.hidden_size();
        let classes = dataset.num_classes();
        let (classifier, pretrain_x, test_x) = match (options.mode, &backbone.model) {
            (Mode::Head, _) => (
                Classifier::new(hidden, classes, None, &mut init_rng, device)?,
                &pretrain.mean,
                &test.mean,
            ),
            (Mode::LastLayer, Model::Bert(bert)) => {
                let pooler = bert
                    .pooler
                    .as_ref()
                    .map(|p| (p.weight(), p.bias().expect("pooler.dense has a bias")));
                (
                    Classifier::new(hidden, classes, pooler, &mut init_rng, device)?,
                    &pretrain.cls,
                    &test.cls,
                )
            }
            (Mode::LastLayer, Model::Vit(_)) => (
                Classifier::new(hidden, classes, None, &mut init_rng, device)?,
                &pretrain.cls,
                &test.cls,
            ),
        };
        let classifier_tensors = || checkpoint::named_tensors("classifier", &classifier.named());
        let (baseline_test_acc, pretrain_losses) = match &resumed {
            Some(saved) => {
                checkpoint::restore_params("classifier", &classifier.named(), &saved.tensors)?;
                (
                    saved.state.baseline_test_acc,
                    saved.state.pretrain_losses.clone(),
                )
            }
            None => {
                // Phase 1 depends on the pretrain set, not on n or η (the split keeps it fixed
                // across n): runs of a grid share it through the cache, computed once.
                let key = Phase1Key {
                    version: 1,
                    dataset: options.dataset.to_string(),
                    backbone_sha256: backbone.weights_sha256.clone(),
                    features: match options.mode {
                        Mode::Head => "mean",
                        Mode::LastLayer => "cls",
                    }
                    .to_string(),
                    pooler: classifier.pooler.is_some(),
                    pretrain: release_indices(source, &prepared.partition.pretrain),
                    test: release_indices(&dataset.test, &prepared.partition.test),
                    train_source: source_name.to_string(),
                    seed: options.seed,
                    pretrain_epochs,
                    batch_size: config.batch_size,
                    optimizer: format!("{:?}", config.optimizer),
                    train_threads: options.train_threads,
                    device: format!("{device:?}"),
                };
                let file = cache_root(options.cache_dir.as_deref())
                    .join("phase1")
                    .join(format!(
                        "{}.safetensors",
                        &sha256_hex(&serde_json::to_vec(&key)?)[..24]
                    ));
                let lock = phase1_lock(&file);
                let _only_one_computes = lock.lock().expect("phase-1 lock");
                let (baseline, losses) = match checkpoint::load_state::<Phase1>(&file, device) {
                    Ok(Some((saved, tensors))) if saved.key == key => {
                        checkpoint::restore_params("classifier", &classifier.named(), &tensors)?;
                        (saved.baseline_test_acc, saved.pretrain_losses)
                    }
                    _ => {
                        let mut losses = Vec::new();
                        progress.stage("phase 1 epochs", pretrain_epochs);
                        train_classifier(
                            &classifier,
                            &on_device(pretrain_x)?,
                            &prepared.pretrain.labels,
                            pretrain_epochs,
                            config.batch_size,
                            &config.optimizer,
                            options.seed,
                            &mut |_, loss| {
                                losses.push(loss);
                                progress.advance(1);
                            },
                        )?;
                        let baseline = evaluate(
                            &classifier.forward(&on_device(test_x)?)?.detach(),
                            &prepared.test.labels,
                        )?
                        .accuracy;
                        let saved = Phase1 {
                            key,
                            baseline_test_acc: baseline,
                            pretrain_losses: losses.clone(),
                        };
                        checkpoint::save_state(&file, &saved, &classifier_tensors())?;
                        (baseline, losses)
                    }
                };
                let state = RunState {
                    identity: identity.clone(),
                    baseline_test_acc: baseline,
                    pretrain_losses: losses.clone(),
                    epochs_done: 0,
                    optimizer_step: 0,
                    log: Vec::new(),
                };
                save_checkpoint(&state, &classifier_tensors())?;
                (baseline, losses)
            }
        };
        drop(pretrain);

        // Phase 2 on the noisy samples.
        let data = Phase2Data {
            labels: &prepared.labels.labels,
            clean_labels: &prepared.labels.clean_labels,
            noisy_mask: &prepared.labels.noisy_mask,
            test_labels: &prepared.test.labels,
        };
        let total_steps = epochs * steps_per_epoch(n, config.batch_size);
        let (start_epoch, mut log) = match &resumed {
            Some(saved) => (saved.state.epochs_done, saved.state.log.clone()),
            None => (0, Vec::new()),
        };
        progress.stage("phase 2 epochs", epochs);
        progress.advance(start_epoch);
        // The query-key eigenspectrum (PAPER.md §5), at the epochs the test set is scored.
        let (heads, head_dim) = {
            let attention = match &backbone.model {
                Model::Vit(v) => &v.last_layer().attention,
                Model::Bert(b) => &b.last_layer().attention,
            };
            (attention.num_heads, attention.head_dim)
        };
        let qk_scale = 1.0 / (head_dim as f64).sqrt();
        // The query-key parameters by name, as the optimizer holds them.
        let param = |opt: &AdamW, name: &str| -> Result<Tensor> {
            Ok(opt
                .param(name)
                .with_context(|| format!("no parameter {name}"))?
                .as_tensor()
                .clone())
        };
        let spectrum_of = |opt: &AdamW| -> Result<Spectrum> {
            let host = |name: &str| -> Result<Vec<f32>> {
                Ok(param(opt, name)?.flatten_all()?.to_vec1()?)
            };
            Ok(match options.mode {
                Mode::LastLayer => {
                    let (wq, wk) = (host("query.weight")?, host("key.weight")?);
                    let rows = head_dim * hidden;
                    let per_head: Vec<Spectrum> = (0..heads)
                        .map(|h| {
                            head_spectrum(
                                &wq[h * rows..(h + 1) * rows],
                                &wk[h * rows..(h + 1) * rows],
                                head_dim,
                                qk_scale,
                            )
                        })
                        .collect();
                    mean_over_heads(&per_head)
                }
                // The head's query-key matrix is W itself (the query is p), as in the synthetic model.
                Mode::Head => spectrum(&nalgebra::DMatrix::from_row_iterator(
                    hidden,
                    hidden,
                    host("head.w")?.into_iter().map(f64::from),
                )),
            })
        };
        let mut on_epoch = |m: &EpochMetrics, opt: &AdamW| -> Result<()> {
            progress.epoch(m);
            log.push(m.clone());
            if m.epoch.is_multiple_of(options.checkpoint_every.max(1)) || m.epoch == epochs {
                let state = RunState {
                    identity: identity.clone(),
                    baseline_test_acc,
                    pretrain_losses: pretrain_losses.clone(),
                    epochs_done: m.epoch,
                    optimizer_step: opt.step,
                    log: log.clone(),
                };
                let mut tensors = classifier_tensors();
                tensors.extend(opt.state());
                save_checkpoint(&state, &tensors)?;
            }
            Ok(())
        };
        // LocAteR on the same query-key matrix the spectrum reads, when asked for.
        let penalty_of = |opt: &AdamW| -> Result<Option<Box<Penalty<'static>>>> {
            if options.locater == 0.0 {
                return Ok(None);
            }
            let find = |name: &str| param(opt, name);
            let lambda = options.locater;
            Ok(Some(match options.mode {
                Mode::LastLayer => {
                    let (query, key) = (find("query.weight")?, find("key.weight")?);
                    Box::new(move || -> Result<Tensor> {
                        Ok((head_symmetric_variance(&query, &key, heads, qk_scale)? * lambda)?)
                    }) as Box<Penalty<'static>>
                }
                Mode::Head => {
                    let w = find("head.w")?;
                    Box::new(move || -> Result<Tensor> { Ok((symmetric_variance(&w)? * lambda)?) })
                }
            }))
        };
        // The same optimizer and loop whatever is trained. At the scored epochs the diagnostics
        // join the metrics: the query-key spectrum, and rank collapse through `rank_probe` (last
        // layer only: the head has one query, no token outputs).
        let mut train = |forward: &Forward,
                         params: Vec<(String, Var)>,
                         rank_probe: Option<&dyn Fn() -> Result<f64>>|
         -> Result<()> {
            let mut opt = AdamW::new(params, config.optimizer.clone(), total_steps)?;
            let penalty = penalty_of(&opt)?;
            if let Some(saved) = resumed.as_ref().filter(|s| s.state.epochs_done > 0) {
                opt.restore(&saved.tensors, saved.state.optimizer_step)?;
            }
            train_phase2(
                forward,
                &mut opt,
                &data,
                start_epoch,
                epochs,
                config.batch_size,
                options.seed,
                options.eval_every,
                penalty.as_deref(),
                &mut |m: &EpochMetrics, opt: &AdamW| {
                    let mut m = m.clone();
                    if m.test_acc.is_some() {
                        m.qk_spectrum = Some(spectrum_of(opt)?);
                        m.rank_collapse = rank_probe.map(|probe| probe()).transpose()?;
                    }
                    on_epoch(&m, opt)
                },
            )
        };
        match options.mode {
            Mode::LastLayer => {
                let layer = LastLayer::new(&backbone.model, &classifier);
                // The caches replace the features they come from (they hold what phase 2 reads).
                let prepare_set = |f: Features| {
                    layer.prepare(
                        &on_device(f.layer_inputs.as_ref().expect("full features"))?,
                        f.attention_mask
                            .map(|m| m.to_device(device))
                            .transpose()?
                            .as_ref(),
                    )
                };
                // Rank collapse is read on the first test samples' full layer (every token's query).
                let probe_n = RANK_PROBE.min(test.cls.dim(0)?);
                let probe_inputs = on_device(
                    &test
                        .layer_inputs
                        .as_ref()
                        .expect("full features")
                        .narrow(0, 0, probe_n)?,
                )?;
                let probe_mask = test
                    .attention_mask
                    .as_ref()
                    .map(|m| m.narrow(0, 0, probe_n)?.to_device(device))
                    .transpose()?;
                let (train_cache, test_cache) = (prepare_set(finetune)?, prepare_set(test)?);
                let qk = QueryKey::reset(hidden, &mut init_rng, device)?;
                let rank_probe = || layer.rank_collapse(&qk, &probe_inputs, probe_mask.as_ref());
                let forward = |set: Set, rows: &[usize]| {
                    let cache = if set == Set::Finetune {
                        &train_cache
                    } else {
                        &test_cache
                    };
                    let out = layer.forward(&qk, cache, rows)?;
                    Ok((out.logits, out.cls_attention))
                };
                train(&forward, qk.named(), Some(&rank_probe))?;
            }
            Mode::Head => {
                // The final tokens are the keys and the values; text keeps HF's padding mask.
                let tokens_of = |f: Features| -> Result<Arc<KeyValues>> {
                    let tokens = final_tokens(&backbone.model, &f, device)?;
                    Ok(Arc::new(KeyValues::new(
                        &tokens,
                        None,
                        f.attention_mask.as_ref(),
                        1.0,
                    )?))
                };
                let (train_tokens, test_tokens) = (tokens_of(finetune)?, tokens_of(test)?);
                let head = TokenSelectionHead::new(hidden, &mut init_rng, device)?;
                let forward = |set: Set, rows: &[usize]| {
                    let tokens = if set == Set::Finetune {
                        &train_tokens
                    } else {
                        &test_tokens
                    };
                    let selection = head.select(tokens, rows)?;
                    Ok((classifier.forward(&selection.pooled)?, selection.attention))
                };
                train(&forward, head.named(), None)?;
            }
        }

        let last = log.last().expect("phase 2 ran at least one epoch").clone();
        let summary = FinetuneSummary {
            dataset: options.dataset.to_string(),
            backbone: backbone.files.id.clone(),
            backbone_sha256: backbone.weights_sha256.clone(),
            backbone_source: backbone.files.source.clone(),
            mode: options.mode,
            noise: options.noise.to_string(),
            eta: options.eta,
            realised_eta: prepared.labels.rate(),
            n,
            pretrain_n,
            test_n: prepared.test.len(),
            seed: options.seed,
            epochs,
            pretrain_epochs,
            baseline_test_acc,
            train_loss: last.train_loss,
            train_acc: last.train_acc,
            memorization: last.memorization,
            clean_train_acc: last.clean_train_acc,
            test_acc: last.test_acc.expect("the last epoch is scored"),
            test_loss: last.test_loss.expect("the last epoch is scored"),
            max_cls_attention: last.max_cls_attention,
            attention_entropy: last.attention_entropy,
            qk_spectrum: last.qk_spectrum,
            rank_collapse: last.rank_collapse,
            locater: options.locater,
            dataset_completeness: completeness,
            deviations,
            wall_seconds: started.elapsed().as_secs_f64(),
        };
        Ok(FinetuneRun {
            summary,
            pretrain_losses,
            epochs: log,
        })
    })
}
