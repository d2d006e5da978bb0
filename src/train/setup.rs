//! Set-up of a run, before any training: its data, backbone, split and noisy labels, and the
//! features both phases read from the cache (docs/protocol.md §3).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use candle_core::{Device, Tensor};

use super::progress::Progress;
use super::run::{FinetuneJob, HeadClassifier, Places, RunConfig, RunFolder};
use crate::data::catalog::{Completeness, Modality};
use crate::data::prepare::{NoiseSpec, PreparedData, prepare};
use crate::data::split::{SplitName, SplitPlan};
use crate::data::{self, DatasetName};
use crate::encoder::cache::{Contents, FeatureCache, Features, cache_root};
use crate::encoder::layer_rows::{LayerBatch, LayerRows, RowsBuilder};
use crate::encoder::{Backbone, Model, TextOptions, resolve};
use crate::rng::RngChoice;
use crate::runtime::Placement;

pub(super) fn device_name(device: &Device) -> &'static str {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu",
        candle_core::DeviceLocation::Cuda { .. } => "cuda",
        candle_core::DeviceLocation::Metal { .. } => "metal",
    }
}

/// What computes the run's floats: the CPU's kernels, or the device beside the host's; and the
/// device that made the features where it is not the phases'.
pub(super) fn float_kernels(device: &Device, placement: Placement) -> String {
    let host = crate::runtime::float_kernels();
    let phases = match device.location() {
        candle_core::DeviceLocation::Cpu => host.to_string(),
        _ => format!("{} (host: {host})", device_name(device)),
    };
    if placement.is_split() {
        format!("{phases}; features from {}", placement.backbone.name())
    } else {
        phases
    }
}

/// Writes the resolved configuration into the run folder (the first file a run leaves).
pub(super) fn write_config(out: &Path, config: &RunConfig) -> Result<()> {
    crate::io::ensure_dir(out)?;
    crate::io::write_json(&RunFolder(out.to_path_buf()).config(), config)
}

/// A run on files the user brings reads the files it was configured with: their content digest
/// now is the one its configuration records (config.json, and so the run's name).
fn check_files_unchanged(config: &RunConfig) -> Result<()> {
    let Some(now) = config.dataset.content_digest()? else {
        return Ok(());
    };
    if config.data_digest.as_deref() != Some(now.as_str()) {
        bail!(
            "{}: the files changed since this run was configured (their content digest is {now}, the run records {}); \
             run again without --resume, into a new folder",
            config.dataset,
            config.data_digest.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}

/// What a run needs before any feature: its data, backbone and split. The runs of a stack share
/// one dataset and one backbone in memory ([`setup_sibling`]).
pub(super) struct Setup {
    pub(super) root: PathBuf,
    pub(super) dataset: Arc<data::Dataset>,
    pub(super) completeness: Completeness,
    /// The backbone on the phases' device: its last layer is what phase 2 trains through.
    pub(super) backbone: Arc<Backbone>,
    /// The backbone that makes the features, on `--device`: the same one unless the placement
    /// splits them ([`Placement`]).
    pub(super) feature_backbone: Arc<Backbone>,
    /// The phases' device.
    pub(super) device: Device,
    pub(super) placement: Placement,
    pub(super) cache: FeatureCache,
    pub(super) plan: SplitPlan,
    pub(super) deviations: Vec<String>,
    /// The deviations of the backbone and of the data files, which a sibling shares.
    shared_deviations: (Vec<String>, Vec<String>),
    /// [`crate::runtime::float_kernels`], and on resume those of the earlier sittings.
    pub(super) float_kernels: String,
}

pub(super) fn setup(job: &FinetuneJob) -> Result<Setup> {
    job.validate()?;
    let config = &job.config;
    let placement = config.placement();
    // Both devices are checked first: a missing GPU or CUDA build is one line before any work.
    let feature_device = placement.backbone.device()?;
    let device = placement.phases().device_of("--train-device")?;
    // An unwritable cache is found now, not after the backbone work.
    let cache = FeatureCache::open(cache_root(job.places.cache_dir.as_deref()))?;
    let root = data::data_root(job.places.data_dir.as_deref());
    check_files_unchanged(config)?;
    let dataset =
        data::fetch::load_or_fetch(&config.dataset, &root, job.places.data_mirror.as_deref())?;
    let completeness = Completeness::of(&dataset);
    let (backbone, backbone_notes) = load_backbone(config, &job.places, &device)?;
    let backbone = Arc::new(backbone);
    let feature_backbone = if placement.is_split() {
        let text = TextOptions {
            special_tokens: config.special_tokens,
            ..Default::default()
        };
        Arc::new(
            Backbone::load(backbone.files.clone(), &feature_device, text)?
                .in_precision(config.precision)?,
        )
    } else {
        Arc::clone(&backbone)
    };
    let (plan, notes) = split_plan(config, &dataset, &completeness)?;
    let mut file_notes = unofficial_files(&config.dataset, &root)?;
    if config.dataset.given_by_files() {
        // How the source's files became splits (a pool held out, images resized).
        file_notes.extend(dataset.warnings.iter().cloned());
    }
    let deviations = [backbone_notes.clone(), notes, file_notes.clone()].concat();
    let float_kernels = float_kernels(&device, placement);
    Ok(Setup {
        root,
        dataset: Arc::new(dataset),
        completeness,
        backbone,
        feature_backbone,
        device,
        placement,
        cache,
        plan,
        deviations,
        shared_deviations: (backbone_notes, file_notes),
        float_kernels,
    })
}

/// The set-up of `job`, a run of the same stack as `first`'s (the same dataset, backbone and
/// places; [`super::run::RunConfig::stack_key`]): its own split, the data and backbone shared.
pub(super) fn setup_sibling(first: &Setup, job: &FinetuneJob) -> Result<Setup> {
    job.validate()?;
    let (plan, notes) = split_plan(&job.config, &first.dataset, &first.completeness)?;
    let (backbone_notes, file_notes) = &first.shared_deviations;
    Ok(Setup {
        root: first.root.clone(),
        dataset: Arc::clone(&first.dataset),
        completeness: first.completeness.clone(),
        backbone: Arc::clone(&first.backbone),
        feature_backbone: Arc::clone(&first.feature_backbone),
        device: first.device.clone(),
        placement: first.placement,
        cache: first.cache.clone(),
        plan,
        deviations: [backbone_notes.clone(), notes, file_notes.clone()].concat(),
        shared_deviations: first.shared_deviations.clone(),
        float_kernels: first.float_kernels.clone(),
    })
}

/// One deviation per data file that is present but is not the official release (PneumoniaMNIST's
/// offline file is a third-party derivative); partial files are recorded by the completeness.
pub(super) fn unofficial_files(dataset: &DatasetName, root: &Path) -> Result<Vec<String>> {
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
pub(super) fn load_backbone(
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
    let backbone = backbone.in_precision(config.precision)?;
    let mut deviations: Vec<String> = config
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
    if !config.precision.is_f32() {
        deviations.push(format!(
            "--precision {}: the backbone's dense and attention products took {} operands (f32 \
             sums, {}), so its features differ from the f32 forward's in their last bits and beyond",
            config.precision.name(),
            config.precision.name(),
            if config.precision.arithmetic() == "bf16-amx" {
                "on the AMX tiles"
            } else {
                "by vdpbf16ps"
            }
        ));
    }
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
pub(super) fn split_plan(
    config: &RunConfig,
    dataset: &data::Dataset,
    completeness: &Completeness,
) -> Result<(SplitPlan, Vec<String>)> {
    let mut deviations = Vec::new();
    if config.token_noise > 0.0 {
        deviations.push(format!(
            "--token-noise {}: noise of {} times the tokens' own covariance added to every \
             fine-tune and test token (SNR² divided by {}; docs/design.md, \"The SNR dose\")",
            config.token_noise,
            config.token_noise,
            1.0 + config.token_noise
        ));
    }
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
    if pool > 0 && pretrain_n.saturating_add(n) > pool {
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
pub(super) fn prepare_data(setup: &Setup, job: &FinetuneJob) -> Result<PreparedData> {
    let noise = NoiseSpec {
        model: job.config.noise,
        eta: job.config.eta,
        seed: job.config.seed,
    };
    Ok(prepare(&setup.dataset, &setup.plan, &noise, &setup.root)?)
}

/// The split `source` names, with its name (the cache keys on it).
pub(super) fn train_source(
    dataset: &data::Dataset,
    source: SplitName,
) -> Result<(SplitName, &data::Split)> {
    Ok(match source {
        SplitName::Train => (
            source,
            dataset
                .train
                .as_ref()
                .context("the partition found no training split")?,
        ),
        SplitName::Test => (source, &dataset.test),
    })
}

/// Features of `positions` of one split through the cache, with a progress stage.
#[allow(clippy::too_many_arguments)]
pub(super) fn cached_features(
    cache: &FeatureCache,
    backbone: &Backbone,
    dataset: &DatasetName,
    (split_name, split): (SplitName, &data::Split),
    positions: &[usize],
    contents: Contents,
    encode_batch: usize,
    (what, progress): (&str, &dyn Progress),
) -> Result<Features> {
    progress.stage(what, positions.len());
    let (features, stats) = cache.features(
        backbone,
        dataset.id(),
        split_name.name(),
        split,
        positions,
        contents,
        encode_batch,
        &mut |k| progress.advance(k),
    )?;
    progress.advance(stats.from_cache);
    let extracted = positions.len().saturating_sub(stats.from_cache);
    if extracted > 0 {
        // Said because it is a cold run's longest step: on fewer threads than the machine's it
        // is that many times slower.
        progress.line(&format!(
            "{what}: {extracted} samples through the backbone on {} threads",
            rayon::current_num_threads()
        ));
    }
    for warning in stats.warnings {
        progress.warn(&warning);
    }
    Ok(features)
}

/// The features of the three sets of a run.
pub(super) struct RunFeatures {
    pub(super) pretrain: Features,
    pub(super) finetune: Features,
    pub(super) test: Features,
}

/// Features: each sample through the backbone at most once, whatever ran before.
pub(super) fn run_features(
    setup: &Setup,
    prepared: &PreparedData,
    job: &FinetuneJob,
    progress: &dyn Progress,
) -> Result<RunFeatures> {
    let source = train_source(&setup.dataset, prepared.partition.train_source)?;
    let pretrain = cached_features(
        &setup.cache,
        &setup.feature_backbone,
        &job.config.dataset,
        source,
        &prepared.partition.pretrain,
        pretrain_contents(&job.config),
        job.encode_batch,
        ("pretrain features", progress),
    )?;
    let (finetune, test) = evaluation_features(setup, prepared, job, progress)?;
    Ok(RunFeatures {
        pretrain,
        finetune,
        test,
    })
}

/// The fine-tune and test sets' features only (what a model standing in for phase 2 reads, with
/// no phase 1 to train).
pub(super) fn evaluation_features(
    setup: &Setup,
    prepared: &PreparedData,
    job: &FinetuneJob,
    progress: &dyn Progress,
) -> Result<(Features, Features)> {
    let source = train_source(&setup.dataset, prepared.partition.train_source)?;
    let get = |what: &str, split, positions: &[usize]| {
        cached_features(
            &setup.cache,
            &setup.feature_backbone,
            &job.config.dataset,
            split,
            positions,
            Contents::Full,
            job.encode_batch,
            (what, progress),
        )
    };
    Ok((
        get("fine-tune features", source, &prepared.partition.finetune)?,
        get(
            "test features",
            (SplitName::Test, &setup.dataset.test),
            &prepared.partition.test,
        )?,
    ))
}

/// What phase 1 reads of the pretrain set: the CLS and mean features, or for head mode's
/// `tokens` classifier every token, from the last layer's inputs.
pub(super) fn pretrain_contents(config: &RunConfig) -> Contents {
    match config.head_classifier {
        Some(HeadClassifier::Tokens) => Contents::Full,
        _ => Contents::Cls,
    }
}

/// Fills the feature cache for every run of `jobs` (any datasets) at once, so that each sample
/// passes through its backbone once and the runs themselves only read the cache.
pub fn fill_cache(jobs: &[FinetuneJob], progress: &dyn Progress) -> Result<()> {
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
            c.precision,
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
        let mut wanted: BTreeMap<(SplitName, Contents), BTreeSet<usize>> = BTreeMap::new();
        for job in &group {
            let (plan, _) = split_plan(&job.config, &setup.dataset, &setup.completeness)?;
            let partition = data::split::partition(&setup.dataset, &plan)?;
            let (source, _) = train_source(&setup.dataset, partition.train_source)?;
            let full = wanted.entry((source, Contents::Full)).or_default();
            full.extend(&partition.finetune);
            wanted
                .entry((SplitName::Test, Contents::Full))
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
            let split = train_source(&setup.dataset, *split_name)?;
            let what = format!("{} {} features", first.config.dataset, split_name.name());
            cached_features(
                &setup.cache,
                &setup.feature_backbone,
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

pub(crate) fn layer_inputs(features: &Features) -> Result<&LayerRows> {
    features
        .layer_inputs
        .as_ref()
        .context("full features (the last layer's inputs) expected")
}

/// The padding mask of a text batch, on its device (ViT attends to every token: none).
pub(crate) fn text_mask(model: &Model, batch: &LayerBatch) -> Result<Option<Tensor>> {
    Ok(match model {
        Model::Vit(_) => None,
        Model::Bert(_) => Some(batch.mask()?),
    })
}

/// Final tokens from the last layer's inputs, through the frozen last layer on `device`, 64
/// samples at a time: in memory, or in a temporary file under `spill_dir`.
pub(crate) fn final_tokens(
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
