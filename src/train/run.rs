//! One description of a `finetune` run. [`RunConfig`] holds everything that decides its numbers,
//! with the paper's defaults filled in; it is written as `config.json` beside the run, and every
//! other description of the run derives from it: the run folder's name ([`RunConfig::run_name`]),
//! the key under which phase 1 is shared between runs ([`RunConfig::phase1_view`]), the identity
//! a checkpoint must match to be resumed, summary.json and the rows of results.csv. A new field is
//! therefore part of all of them at once. Where things are read and written ([`Places`]) and how
//! the run is carried out (checkpoint cadence, batch size of the backbone) are not part of it:
//! they do not change the numbers.

use std::path::PathBuf;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::config::{dataset_config, run_defaults};
use super::optim::OptimizerConfig;
use crate::data::DatasetName;
use crate::data::noise::{NoiseModel, authors_only_symmetric};
use crate::kernels::Precision;
use crate::rng::{AuthorsNoiseDraw, RngChoice};
use crate::runtime::{DeviceKind, Placement};

/// The most samples a set may be asked for (more than any dataset holds, and small enough that
/// sums of sizes cannot overflow).
pub const MAX_SAMPLES: usize = 1_000_000_000;

/// The most threads a flag may ask for: past this a machine runs out of threads, not work.
pub const MAX_THREADS: usize = 1024;

/// The most epochs a phase may be asked for: the paper's longest is 2000; products of epochs and
/// steps stay far from overflow.
pub const MAX_EPOCHS: usize = 10_000_000;

/// The most inputs a backbone batch may hold (`--encode-batch`).
pub const MAX_ENCODE_BATCH: usize = 4096;

/// What phase 2 trains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The paper: re-initialise and train the last layer's query and key.
    #[default]
    LastLayer,
    /// The card: a token-selection head on the final tokens, with a frozen linear classifier.
    Head,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::LastLayer => "last-layer",
            Mode::Head => "head",
        }
    }
}

/// What the head mode's phase-1 classifier C is trained on. The head then feeds C one
/// attention-weighted mixture of final tokens per sample, so C must be meaningful on the tokens
/// it may select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HeadClassifier {
    /// The mean of each sample's final tokens: what the head selects before training (p = 0
    /// makes its softmax uniform).
    Mean,
    /// The CLS / position-0 final token, as the backbone's own classifier reads it.
    Cls,
    /// Every final token, labelled with its sample's label: a classifier of single tokens, as
    /// the paper's fixed head ν scores single tokens.
    Tokens,
}

impl HeadClassifier {
    /// The default of head mode: the paper's fixed head ν scores single tokens, and only a
    /// classifier of single tokens is valid on whatever token the head comes to select. Measured
    /// (docs/results.md, head mode), it is also the one whose training loses no accuracy at η = 0.
    pub const DEFAULT: Self = Self::Tokens;

    /// The value a run of `mode` takes from an optional flag: the default in head mode, and in
    /// last-layer mode the flag as given (which `RunConfig::validate` refuses).
    pub fn for_mode(mode: Mode, flag: Option<Self>) -> Option<Self> {
        match mode {
            Mode::Head => Some(flag.unwrap_or(Self::DEFAULT)),
            Mode::LastLayer => flag,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Tokens => "tokens",
        }
    }
}

/// Everything that decides a run's numbers (written as config.json).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    #[serde(with = "crate::io::as_string")]
    pub dataset: DatasetName,
    /// For a dataset given by its files (`folder:`, `csv:`, `jsonl:`), their content digest
    /// ([`crate::data::own::OwnSource::content_digest`]): a run on other files is another run,
    /// and a run folder is refused on files that changed. Absent for the built-in datasets, whose
    /// files the manifests check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_digest: Option<String>,
    pub mode: Mode,
    /// Head mode: what the phase-1 classifier is trained on; absent in last-layer mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_classifier: Option<HeadClassifier>,
    #[serde(with = "crate::io::as_string")]
    pub noise: NoiseModel,
    /// Label-noise rate on the fine-tune set, in [0, 1).
    pub eta: f64,
    /// Fine-tune (noisy) samples.
    pub n: usize,
    /// Clean phase-1 samples asked for (partial data may shrink it: summary.json says by how much).
    pub pretrain_n: usize,
    /// Subsample of the test split; `None`: all of it.
    pub test_n: Option<usize>,
    /// Seed of the split, the label noise, the initialisations and the batch orders.
    pub seed: u64,
    /// Whose streams draw the split, the label noise and the batch orders of both phases
    /// (`authors`: docs/protocol.md §3.1); the initialisations are always ours. Phase 1 depends on it.
    /// Absent from the config.json of runs made before it existed: those drew their own.
    #[serde(default)]
    pub rng: RngChoice,
    /// With `--rng authors` and η > 0, the version of the authors' label-noise draw
    /// ([`AuthorsNoiseDraw`]); absent otherwise. config.json of runs made with the superseded
    /// float64 draw lack it, so they name other folders and are refused on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authors_noise_draw: Option<AuthorsNoiseDraw>,
    pub epochs: usize,
    pub pretrain_epochs: usize,
    pub batch_size: usize,
    pub optimizer: OptimizerConfig,
    /// Score the test set every this many phase-2 epochs (and after the last).
    pub eval_every: usize,
    /// Fraction of the test split carved into a training pool (AG-news offline); a deviation.
    pub carve_train_from_test: Option<f64>,
    /// Backbones in order of preference; the first that loads is used.
    pub backbones: Vec<String>,
    /// Text: [CLS]/[SEP] added when tokenizing (the authors did not).
    pub special_tokens: bool,
    /// λ of the LocAteR penalty on the trained query-key matrix; 0: none (the paper).
    pub locater: f64,
    /// The SNR dose k ([`crate::train::token_noise`]): noise of k times the tokens' own
    /// covariance added to every fine-tune and test token, SNR² → SNR² / (1 + k); 0: none (the
    /// paper), and absent from config.json, so runs made before it keep their names.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub token_noise: f64,
    /// Threads of phases 1 and 2 (float reductions, and so the last bits, depend on it).
    pub train_threads: usize,
    /// Where the backbone makes the features.
    pub device: DeviceKind,
    /// What the backbone's products compute in during extraction (`--precision`); phases 1 and
    /// 2 stay f32. Absent from config.json for f32, so runs made before it keep their names.
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
    /// Where phases 1 and 2 run when not on the host ([`Placement::of`]); absent from a
    /// config.json that leaves them there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_device: Option<DeviceKind>,
}

impl RunConfig {
    /// Where each part of the run computes.
    pub fn placement(&self) -> Placement {
        Placement::of(self.device, self.train_device)
    }

    /// The paper's run on `dataset` (configs/<dataset>.toml) at η = 0, seed 42; callers set what
    /// they change with struct update syntax.
    pub fn paper(dataset: &DatasetName) -> Result<Self> {
        let defaults = dataset_config(dataset)?;
        let every_run = run_defaults();
        let data_digest = dataset.content_digest()?;
        Ok(Self {
            dataset: dataset.clone(),
            data_digest,
            mode: Mode::default(),
            head_classifier: None,
            noise: NoiseModel::Symmetric,
            eta: 0.0,
            n: defaults.n,
            pretrain_n: defaults.pretrain_n,
            test_n: None,
            seed: every_run.seed,
            rng: RngChoice::Own,
            authors_noise_draw: None,
            epochs: defaults.epochs,
            pretrain_epochs: defaults.pretrain_epochs,
            batch_size: defaults.batch_size,
            optimizer: defaults.optimizer(),
            eval_every: every_run.eval_every,
            carve_train_from_test: None,
            backbones: defaults.backbones,
            special_tokens: false,
            locater: 0.0,
            token_noise: 0.0,
            train_threads: every_run.train_threads,
            device: DeviceKind::Cpu,
            precision: Precision::F32,
            train_device: None,
        })
    }

    /// The label-noise draw a run of this configuration takes: [`AuthorsNoiseDraw::CURRENT`]
    /// with `--rng authors` and η > 0 (their draw), none otherwise (no draw, or ours).
    pub fn noise_draw(&self) -> Option<AuthorsNoiseDraw> {
        (self.rng == RngChoice::Authors && self.eta > 0.0).then_some(AuthorsNoiseDraw::CURRENT)
    }

    /// The configuration with [`Self::noise_draw`] recorded and η normalised (−0 is 0: one run,
    /// one name); every constructor of a run ends here.
    pub fn with_noise_draw(self) -> Self {
        Self {
            authors_noise_draw: self.noise_draw(),
            eta: self.eta + 0.0,
            ..self
        }
    }

    /// Every value a run cannot start with, named by its flag.
    pub fn validate(&self) -> Result<()> {
        if let Some(why) = crate::data::noise::eta_out_of_range(self.eta) {
            bail!("--eta {why}");
        }
        self.precision.check_supported()?;
        let at_least_one = [
            ("--n", self.n),
            ("--pretrain-n", self.pretrain_n),
            ("--test-n", self.test_n.unwrap_or(1)),
            ("--epochs", self.epochs),
            ("--pretrain-epochs", self.pretrain_epochs),
            ("--eval-every", self.eval_every),
            ("--train-threads", self.train_threads),
            ("batch_size", self.batch_size),
        ];
        for (flag, value) in at_least_one {
            if value == 0 {
                bail!("{flag} must be at least 1, got 0");
            }
        }
        let at_most = [
            ("--n", self.n, MAX_SAMPLES),
            ("--pretrain-n", self.pretrain_n, MAX_SAMPLES),
            ("--test-n", self.test_n.unwrap_or(1), MAX_SAMPLES),
            ("--train-threads", self.train_threads, MAX_THREADS),
            ("--epochs", self.epochs, MAX_EPOCHS),
            ("--pretrain-epochs", self.pretrain_epochs, MAX_EPOCHS),
            ("--eval-every", self.eval_every, MAX_EPOCHS),
        ];
        for (flag, value, limit) in at_most {
            if value > limit {
                bail!("{flag} must be at most {limit}, got {value}");
            }
        }
        self.check_real_values()?;
        self.optimizer.check()?;
        if self.backbones.is_empty() {
            bail!("--backbone: no backbone to try");
        }
        self.check_digest_recorded()?;
        match (self.mode, self.head_classifier) {
            (Mode::Head, None) => {
                bail!("--mode head needs --head-classifier (mean, cls or tokens)")
            }
            (Mode::LastLayer, Some(_)) => {
                bail!("--head-classifier applies to --mode head only")
            }
            _ => {}
        }
        if self.rng == RngChoice::Authors {
            if self.noise != NoiseModel::Symmetric {
                bail!("{}", authors_only_symmetric(self.noise));
            }
            if self.seed > u64::from(u32::MAX) {
                bail!(
                    "--seed {} with --rng authors: numpy's draw is replicated for seeds below 2^32 only",
                    self.seed
                );
            }
        }
        if self.authors_noise_draw != self.noise_draw() {
            bail!(
                "authors_noise_draw: this configuration records {:?} where this build draws {:?}; a run \
                 made with --rng authors and η > 0 before the float32 noise draw flipped other labels \
                 than the authors' and cannot be resumed or passed off as current: run it again in a new folder",
                self.authors_noise_draw,
                self.noise_draw()
            );
        }
        Ok(())
    }

    /// The settings that are real numbers, each in its range.
    fn check_real_values(&self) -> Result<()> {
        if !(self.locater.is_finite() && self.locater >= 0.0) {
            bail!(
                "--locater must be a finite number ≥ 0, got {}",
                self.locater
            );
        }
        if let Some(why) = token_noise_out_of_range(self.token_noise) {
            bail!("--token-noise {why}");
        }
        if let Some(f) = self.carve_train_from_test
            && !(f > 0.0 && f < 1.0)
        {
            bail!("--carve-train-from-test must be in (0, 1), got {f}");
        }
        Ok(())
    }

    /// A dataset given by its files records their digest; a built-in one records none.
    fn check_digest_recorded(&self) -> Result<()> {
        match (self.dataset.given_by_files(), &self.data_digest) {
            (true, None) => bail!(
                "data_digest: a run on {} records its files' content digest; none is given",
                self.dataset
            ),
            (true, Some(_)) | (false, None) => Ok(()),
            (false, Some(_)) => bail!(
                "data_digest applies to datasets given by their files (folder:, csv:, jsonl:, hf:), not to {}",
                self.dataset
            ),
        }
    }

    /// The mode as folder names and reports print it: `last-layer`, or `head-<classifier>`,
    /// with the SNR dose after a `+` where the run has one (`head-tokens+k3`), so that the
    /// runs of one dose form a cell of their own in every table.
    pub fn mode_label(&self) -> String {
        let mode = match self.head_classifier {
            Some(c) => format!("{}-{}", self.mode.name(), c.name()),
            None => self.mode.name().to_string(),
        };
        if self.token_noise > 0.0 {
            format!("{mode}+k{}", self.token_noise)
        } else {
            mode
        }
    }

    /// The run folder's name: readable (dataset, mode, n, η, seed) and unique (a hash of the
    /// whole configuration, so two configurations never share a folder).
    pub fn run_name(&self) -> Result<String> {
        Ok(format!(
            "{}_{}_n{}_eta{}_seed{}_{}",
            self.dataset_key(),
            self.mode_label(),
            self.n,
            self.eta,
            self.seed,
            &crate::io::json_digest(self)?[..10]
        ))
    }

    /// The dataset as run names and feature caches file it: its id, and for a dataset given by
    /// its files the start of their digest (`folder-pets-1a2b3c4d`).
    pub fn dataset_key(&self) -> String {
        match &self.data_digest {
            Some(digest) => format!("{}-{}", self.dataset.id(), &digest[..digest.len().min(8)]),
            None => self.dataset.id().to_string(),
        }
    }

    /// What runs that train together in one stack agree on: everything but η and the seed (and
    /// the noise draw's version, which follows η). Runs of equal keys read the same number of
    /// samples in batches of the same size for as many epochs, at the same cadence, through the
    /// same backbone and optimizer.
    pub fn stack_key(&self) -> Self {
        Self {
            eta: 0.0,
            seed: 0,
            authors_noise_draw: None,
            ..self.clone()
        }
    }

    /// The configuration as phase 1 sees it: fields that only phase 2 reads are set to fixed
    /// values, so that runs differing in them share one phase 1. Every other field, including any
    /// added later, keeps phase 1 apart (it is safer to recompute than to share wrongly).
    pub fn phase1_view(&self) -> Self {
        Self {
            eta: 0.0,
            noise: NoiseModel::Symmetric,
            // Phase 1 sees no noise: runs of either draw share it.
            authors_noise_draw: None,
            n: 0,
            epochs: 0,
            eval_every: 0,
            locater: 0.0,
            // Phase 1 reads the undosed pretrain tokens: every dose shares it.
            token_noise: 0.0,
            // The mode stays: it decides what the classifier reads (CLS or mean-pooled tokens).
            ..self.clone()
        }
    }
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// Where a run finds its data and checkpoints and caches features.
#[derive(Clone, Debug, Default)]
pub struct Places {
    /// [default: $BENIGN_DATA_DIR, else ./datasets]
    pub data_dir: Option<PathBuf>,
    /// Base URL tried first for files that must be downloaded [default: $BENIGN_DATA_MIRROR]
    pub data_mirror: Option<String>,
    /// [default: $BENIGN_MODELS_DIR]
    pub models_dir: Option<PathBuf>,
    /// [default: $BENIGN_CACHE_DIR, else the platform cache folder]
    pub cache_dir: Option<PathBuf>,
}

/// A run and how to carry it out.
#[derive(Clone, Debug)]
pub struct FinetuneJob {
    pub config: RunConfig,
    pub places: Places,
    /// Where config.json, checkpoints and the outputs go.
    pub out: Option<PathBuf>,
    /// Phase-2 epochs between checkpoints; 0: none.
    pub checkpoint_every: usize,
    /// Continue from the checkpoint in `out`, if there is one.
    pub resume: bool,
    /// Inputs per backbone batch when filling the feature cache.
    pub encode_batch: usize,
    /// Threads of phase 2's per-sample attention in the last layer's host pass. Each sample's
    /// arithmetic is the same on any thread, so the numbers do not depend on them (unlike
    /// `config.train_threads`): a run alone takes every core, a grid's runs share them.
    pub sample_threads: usize,
}

impl FinetuneJob {
    /// Phase-2 epochs between checkpoints, unless asked otherwise.
    pub const CHECKPOINT_EVERY: usize = 100;
    /// Inputs per backbone batch when filling the cache, unless asked otherwise.
    pub const ENCODE_BATCH: usize = 32;

    /// The run `config` as a job with the default settings: no folder, nothing resumed, the
    /// process's every thread for its samples. Every driver starts from this one.
    pub fn new(config: RunConfig, places: Places) -> Self {
        Self {
            config,
            places,
            out: None,
            checkpoint_every: Self::CHECKPOINT_EVERY,
            resume: false,
            encode_batch: Self::ENCODE_BATCH,
            sample_threads: rayon::current_num_threads(),
        }
    }

    /// Checks the configuration and the settings, each error naming its flag.
    pub fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.sample_threads == 0 {
            bail!("phase 2 needs at least one thread for its samples, got 0");
        }
        if self.encode_batch == 0 {
            bail!("--encode-batch must be at least 1, got 0");
        }
        if self.encode_batch > MAX_ENCODE_BATCH {
            bail!(
                "--encode-batch must be at most {MAX_ENCODE_BATCH}, got {}",
                self.encode_batch
            );
        }
        if self.resume && self.out.is_none() {
            bail!("--resume needs --out (the folder holding the checkpoint)");
        }
        Ok(())
    }
}

/// The folder of a result folder that holds its runs' folders (a grid's, or a stack's made by
/// `finetune`), each named by [`RunConfig::run_name`].
pub const RUNS: &str = "runs";

/// The files of a run folder, named in this one place.
#[derive(Clone, Debug)]
pub struct RunFolder(pub PathBuf);

impl RunFolder {
    /// The folder of `config`'s run among the runs of the result folder `out`:
    /// `out/runs/<run name>`.
    pub fn among_runs(out: &std::path::Path, config: &RunConfig) -> Result<Self> {
        Ok(Self(out.join(RUNS).join(config.run_name()?)))
    }

    /// The resolved [`RunConfig`], written when the run starts.
    pub fn config(&self) -> PathBuf {
        self.0.join("config.json")
    }

    /// Written last: its presence means the run finished.
    pub fn summary(&self) -> PathBuf {
        self.0.join("summary.json")
    }

    /// Phase 2, one JSON line per epoch.
    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.jsonl")
    }

    /// Phase 1's loss per epoch.
    pub fn pretrain(&self) -> PathBuf {
        self.0.join("pretrain.jsonl")
    }

    /// What `--resume` continues from.
    pub fn checkpoint(&self) -> PathBuf {
        self.0.join("checkpoint.safetensors")
    }

    /// Token selection on a few fine-tune samples, right after the reset and at the end.
    pub fn attention_maps(&self) -> PathBuf {
        self.0.join("attention_maps.png")
    }

    /// TensorBoard's event file: the run's scalars, configuration and attention maps, written as
    /// it trains (`report::tensorboard`). TensorBoard reads every file whose name holds
    /// "tfevents"; the run keeps exactly one.
    pub fn events(&self) -> PathBuf {
        self.0.join("events.out.tfevents.benign-attention")
    }

    /// Held locked by the process writing the folder ([`super::folder_lock`]).
    pub fn lock(&self) -> PathBuf {
        self.0.join(".lock")
    }

    /// Refuses an `--out` laid out for the other kind of command: a folder holds either one run
    /// (its files at the top) or several (each under `runs/`), never both.
    pub fn check_layout(out: &std::path::Path, several: bool) -> Result<()> {
        let holds_stack = out.join(RUNS).is_dir();
        let holds_run = Self(out.to_path_buf()).config().exists();
        if several && holds_run {
            bail!(
                "--out {}: holds a single run (config.json at the top); several runs need a folder \
                 of their own",
                out.display()
            );
        }
        if !several && holds_stack {
            bail!(
                "--out {}: holds several runs (runs/); give one run a folder of its own, or repeat \
                 the stack's --eta and --seed lists to resume it",
                out.display()
            );
        }
        Ok(())
    }
}

/// The largest dose a run takes: SNR² divided by 10⁶ is no signal at any n this crate runs.
pub const MAX_TOKEN_NOISE: f64 = 1e6;

/// Why `k` is not a dose, if it is not: finite, ≥ 0, at most [`MAX_TOKEN_NOISE`].
pub fn token_noise_out_of_range(k: f64) -> Option<String> {
    (!(k.is_finite() && (0.0..=MAX_TOKEN_NOISE).contains(&k)))
        .then(|| format!("must be a finite number in [0, {MAX_TOKEN_NOISE:e}], got {k}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trec() -> RunConfig {
        RunConfig::paper(&DatasetName::Trec).unwrap()
    }

    #[test]
    fn run_names_are_readable_and_tell_every_configuration_apart() {
        let base = RunConfig { eta: 0.1, ..trec() };
        let name = base.run_name().unwrap();
        assert!(
            name.starts_with("trec_last-layer_n200_eta0.1_seed42_"),
            "{name}"
        );
        let close = RunConfig {
            eta: 0.101,
            ..base.clone()
        };
        let tokens = RunConfig {
            special_tokens: true,
            ..base.clone()
        };
        assert_ne!(name, close.run_name().unwrap());
        assert_ne!(name, tokens.run_name().unwrap());
        assert_eq!(name, base.clone().run_name().unwrap());
    }

    #[test]
    fn phase1_view_ignores_phase2_fields_only() {
        let base = trec();
        let other_phase2 = RunConfig {
            eta: 0.2,
            n: 20,
            epochs: 7,
            locater: 1.0,
            ..base.clone()
        };
        assert_eq!(base.phase1_view(), other_phase2.phase1_view());
        for changed in [
            RunConfig {
                special_tokens: true,
                ..base.clone()
            },
            RunConfig {
                seed: 1,
                ..base.clone()
            },
            RunConfig {
                mode: Mode::Head,
                head_classifier: Some(HeadClassifier::Mean),
                ..base.clone()
            },
            // The split and phase 1's batch order.
            RunConfig {
                rng: RngChoice::Authors,
                ..base.clone()
            },
        ] {
            assert_ne!(base.phase1_view(), changed.phase1_view());
        }
    }

    #[test]
    fn authors_rng_is_recorded_and_refuses_what_is_not_theirs() {
        let authors = RunConfig {
            rng: RngChoice::Authors,
            eta: 0.2,
            ..trec()
        }
        .with_noise_draw();
        authors.validate().unwrap();
        let json = serde_json::to_string(&authors).unwrap();
        assert!(json.contains("\"rng\":\"authors\""), "{json}");
        assert_ne!(
            authors.run_name().unwrap(),
            RunConfig {
                rng: RngChoice::Own,
                ..authors.clone()
            }
            .run_name()
            .unwrap()
        );
        // config.json of runs made before the field: their own streams.
        let old = json.replace(",\"rng\":\"authors\"", "");
        assert_eq!(
            serde_json::from_str::<RunConfig>(&old).unwrap().rng,
            RngChoice::Own
        );
        let pair = RunConfig {
            noise: NoiseModel::Pair,
            ..authors.clone()
        }
        .with_noise_draw();
        let err = pair.validate().unwrap_err().to_string();
        assert!(err.starts_with("--noise pair"), "{err}");
        let big_seed = RunConfig {
            seed: 1 << 32,
            ..authors
        };
        assert!(
            big_seed
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("--seed")
        );
    }

    #[test]
    fn the_authors_noise_draw_is_part_of_a_noisy_runs_identity_only() {
        let noisy = RunConfig {
            rng: RngChoice::Authors,
            eta: 0.2,
            ..trec()
        }
        .with_noise_draw();
        noisy.validate().unwrap();
        let json = serde_json::to_string(&noisy).unwrap();
        assert!(
            json.contains("\"authors_noise_draw\":\"float32\""),
            "{json}"
        );
        // A config.json from before the float32 draw: another folder name, refused to run.
        let before: RunConfig =
            serde_json::from_str(&json.replace(",\"authors_noise_draw\":\"float32\"", "")).unwrap();
        assert_ne!(before.run_name().unwrap(), noisy.run_name().unwrap());
        let err = before.validate().unwrap_err().to_string();
        assert!(err.starts_with("authors_noise_draw"), "{err}");
        // No draw, no version: η = 0 and own-stream runs keep the names they always had, and
        // phase 1 (which sees no noise) is shared across draws.
        for quiet in [
            RunConfig {
                eta: 0.0,
                ..noisy.clone()
            }
            .with_noise_draw(),
            RunConfig {
                rng: RngChoice::Own,
                ..noisy.clone()
            }
            .with_noise_draw(),
        ] {
            assert_eq!(quiet.authors_noise_draw, None);
            assert!(
                !serde_json::to_string(&quiet)
                    .unwrap()
                    .contains("authors_noise_draw")
            );
        }
        assert_eq!(noisy.phase1_view(), before.phase1_view());
        assert_eq!(
            crate::io::json_digest(&noisy.phase1_view()).unwrap(),
            crate::io::json_digest(&before.phase1_view()).unwrap()
        );
    }

    #[test]
    fn config_round_trips_through_json_and_rejects_unknown_keys() {
        let config = RunConfig {
            noise: "cifar10n:worse".parse().unwrap(),
            test_n: Some(3),
            ..trec()
        };
        let json = serde_json::to_string(&config).unwrap();
        assert!(json.contains("\"dataset\":\"trec\"") && json.contains("cifar10n:worse"));
        assert_eq!(serde_json::from_str::<RunConfig>(&json).unwrap(), config);
        let extra = json.replacen('{', "{\"typo\":1,", 1);
        assert!(serde_json::from_str::<RunConfig>(&extra).is_err());
    }

    #[test]
    fn empty_selections_are_refused_by_their_flag() {
        for (config, flag) in [
            (
                RunConfig {
                    pretrain_n: 0,
                    ..trec()
                },
                "--pretrain-n",
            ),
            (
                RunConfig {
                    test_n: Some(0),
                    ..trec()
                },
                "--test-n",
            ),
            (RunConfig { n: 0, ..trec() }, "--n"),
        ] {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
    }
}
