//! Command-line flags and dispatch; the library does the work. Every error is one line on stderr
//! and exit status 2.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::data::noise::NoiseModel;
use crate::data::prepare::{NoiseSpec, prepare};
use crate::data::split::SplitPlan;
use crate::data::{self, DatasetName};
use crate::encoder::{
    self,
    cache::{Contents, FeatureCache, cache_root},
};
use crate::report;
use crate::reproduce;
use crate::synthetic::{self, EngineKind, Grid, SyntheticConfig, Trace};
use crate::train::finetune::{FinetuneOptions, Mode};

#[derive(Parser, Debug)]
#[command(
    name = "benign-attention",
    version,
    about = "Benign overfitting in token selection of attention: the paper's experiments"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// One run of the synthetic token-selection experiment (paper §2).
    Synthetic(SyntheticArgs),
    /// The Fig. 5 grid over d × ‖μ‖, one run per cell, on all cores.
    SyntheticSweep(SweepArgs),
    /// Attention localization (PAPER.md §5) across the synthetic SNR grid: final eigen-mean and
    /// -variance of W, attention entropy of clean and noisy samples, regime; CSV and plots.
    LocalizationSweep(LocalizationSweepArgs),
    /// Real datasets: what is present, checksums, downloads, and the paper's split.
    #[command(subcommand)]
    Data(DataCommand),
    /// Run a dataset through a frozen backbone once and fill the feature cache.
    Extract(ExtractArgs),
    /// The paper's real-data protocol: phase 1 on clean data, phase 2 on noisy labels (§3).
    Finetune(FinetuneArgs),
    /// The paper's real-data table and figures as grids of finetune runs, with a report.
    #[command(subcommand)]
    Reproduce(ReproduceCommand),
}

#[derive(Subcommand, Debug)]
pub enum ReproduceCommand {
    /// Table 2: datasets × n (20, 200, 1000) × η (0, 0.2) × seeds (42, 314, 2718).
    Table2(GridArgs),
    /// Fig. 8: η from 0 to 0.2 in steps of 0.01 at n = 200, seed 42.
    Fig8(GridArgs),
    /// Fig. 9: per-epoch max CLS attention, n = 200, η = 0.1, seed 42.
    Fig9(GridArgs),
    /// Merge the result folders of many shards (or runs) into one report.
    Report(ReportArgs),
    /// Write a Slurm job-array script whose tasks run one shard each.
    Slurm(SlurmArgs),
}

#[derive(Args, Debug, Clone)]
pub struct GridArgs {
    /// Datasets, comma-separated [default: the six of Table 2]
    #[arg(long, value_delimiter = ',')]
    pub datasets: Option<Vec<DatasetName>>,
    /// Seeds, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',')]
    pub seeds: Option<Vec<u64>>,
    /// Fine-tune sizes n, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',')]
    pub ns: Option<Vec<usize>>,
    /// Label-noise rates η, comma-separated [default: the experiment's]
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub etas: Option<Vec<f64>>,
    /// paper: the paper's sizes and epochs; quick: pretrain_n ≤ 500, test_n ≤ 500, 300/50 epochs
    #[arg(long, value_enum, default_value_t = reproduce::Budget::Paper)]
    pub budget: reproduce::Budget,
    /// What phase 2 trains (see finetune --mode)
    #[arg(long, value_enum, default_value_t = Mode::LastLayer)]
    pub mode: Mode,
    /// Result folder: runs/<run>/ and the report [default: results/<experiment>]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Runs at once, sharing the cores [default: the number of cores]
    #[arg(long, value_name = "J")]
    pub jobs: Option<usize>,
    /// Run only the K-th of N interleaved parts of the grid (1 ≤ K ≤ N)
    #[arg(long, value_name = "K/N")]
    pub shard: Option<reproduce::Shard>,
    #[command(flatten)]
    pub places: Places,
}

/// Where a real-data run finds its data and checkpoints, caches features and computes.
#[derive(Args, Debug, Clone)]
pub struct Places {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Folder holding checkpoints as <org>/<name>/ [default: $BENIGN_MODELS_DIR]
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Feature cache [default: $BENIGN_CACHE_DIR, else the platform cache folder/benign-attention]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Where the backbone and the training compute (cuda needs a build with `--features cuda`)
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    pub device: DeviceChoice,
}

impl GridArgs {
    /// The flags that define the grid, as a shard task would repeat them.
    fn grid_flags(&self) -> Vec<String> {
        fn list<T: ToString>(flag: &str, values: &Option<Vec<T>>) -> Vec<String> {
            values.as_ref().map_or(Vec::new(), |v| {
                vec![
                    flag.to_string(),
                    v.iter().map(T::to_string).collect::<Vec<_>>().join(","),
                ]
            })
        }
        let mut flags = Vec::new();
        flags.extend(list("--datasets", &self.datasets));
        flags.extend(list("--seeds", &self.seeds));
        flags.extend(list("--ns", &self.ns));
        flags.extend(list("--etas", &self.etas));
        fn value(v: &impl clap::ValueEnum) -> String {
            v.to_possible_value()
                .map_or(String::new(), |p| p.get_name().to_string())
        }
        flags.extend(["--budget".into(), value(&self.budget)]);
        flags.extend(["--mode".into(), value(&self.mode)]);
        if let Some(j) = self.jobs {
            flags.extend(["--jobs".into(), j.to_string()]);
        }
        flags.extend(["--device".into(), value(&self.places.device)]);
        flags
    }
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Result folders (each holding runs/)
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Where to write results.csv, report.md and the figures
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct SlurmArgs {
    /// Which grid
    #[arg(value_enum)]
    pub experiment: reproduce::Experiment,
    /// Array tasks (shards)
    #[arg(long, value_name = "N")]
    pub shards: usize,
    #[command(flatten)]
    pub grid: GridArgs,
    /// Wall-time limit per task
    #[arg(long, default_value = "24:00:00")]
    pub time: String,
    /// Cores per task
    #[arg(long, default_value_t = 8)]
    pub cpus_per_task: usize,
    /// Memory per task
    #[arg(long, default_value = "32G")]
    pub mem: String,
    /// Slurm partition
    #[arg(long)]
    pub partition: Option<String>,
}

#[derive(Args, Debug)]
pub struct FinetuneArgs {
    /// Dataset name (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec)
    #[arg(long)]
    pub dataset: DatasetName,
    /// Label-noise rate η ∈ [0, 1) on the fine-tune set
    #[arg(long, allow_negative_numbers = true)]
    pub eta: f64,
    /// Fine-tune (noisy) samples [default: configs/<dataset>.toml, 200]
    #[arg(long)]
    pub n: Option<usize>,
    /// Clean phase-1 samples [default: configs/<dataset>.toml; shrunk to fit partial data]
    #[arg(long, value_name = "N")]
    pub pretrain_n: Option<usize>,
    /// Phase-2 epochs [default: 2000]
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Phase-1 epochs [default: 300]
    #[arg(long, value_name = "EPOCHS")]
    pub pretrain_epochs: Option<usize>,
    /// Seed of the split, the label noise, the initialisations and the batch order
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Backbone hub id or folder [default: the config's preference list, paper's first]
    #[arg(long, value_name = "ID")]
    pub backbone: Option<String>,
    /// `last-layer`: the paper (query/key of the last layer); `head`: the card's token-selection head
    #[arg(long, value_enum, default_value_t = Mode::LastLayer)]
    pub mode: Mode,
    /// symmetric, pair, or cifar10n:aggre|random1|random2|random3|worse
    #[arg(long, default_value = "symmetric")]
    pub noise: NoiseModel,
    /// Subsample the test split to this many samples [default: all]
    #[arg(long, value_name = "M")]
    pub test_n: Option<usize>,
    /// Score the test set every K epochs (and after the last)
    #[arg(long, value_name = "K", default_value_t = 50)]
    pub eval_every: usize,
    /// Split the test file into disjoint train and test pools (for AG-news offline); a deviation
    #[arg(long, value_name = "F")]
    pub carve_train_from_test: Option<f64>,
    /// Write metrics.jsonl, pretrain.jsonl and summary.json here
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub places: Places,
    /// Inputs per backbone batch when filling the cache
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub encode_batch: usize,
    /// Add [CLS]/[SEP] when tokenizing (the authors did not)
    #[arg(long)]
    pub special_tokens: bool,
    /// Write a checkpoint to --out every K phase-2 epochs (and after phase 1 and the last epoch); 0: none
    #[arg(long, value_name = "K", default_value_t = 100)]
    pub checkpoint_every: usize,
    /// Continue from the checkpoint in --out (bit for bit); starts afresh if there is none
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// CPU threads for phases 1 and 2 (small ops: one is fastest on few cores; extraction uses all)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub train_threads: usize,
    /// λ of the LocAteR penalty on the trained query-key matrix: the variance of the eigenvalues of
    /// its symmetric part, mean over heads (README "Localization") [default: 0, the paper: none]
    #[arg(
        long,
        value_name = "LAMBDA",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub locater: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    Cpu,
    Cuda,
}

impl DeviceChoice {
    /// The device, or one line on how to get it.
    pub fn device(self) -> Result<candle_core::Device> {
        match self {
            DeviceChoice::Cpu => Ok(candle_core::Device::Cpu),
            DeviceChoice::Cuda if !cfg!(feature = "cuda") => anyhow::bail!(
                "--device cuda: this binary was built without CUDA; rebuild with `cargo build --release --features cuda` (needs the CUDA toolkit and an NVIDIA driver)"
            ),
            DeviceChoice::Cuda => candle_core::Device::new_cuda(0)
                .map_err(|e| anyhow::anyhow!("--device cuda: no usable GPU 0 ({e})")),
        }
    }
}

/// Where a backbone and its features come from.
#[derive(Args, Debug)]
pub struct BackboneArgs {
    /// Hub id (org/name) or a checkpoint folder in Hugging Face layout
    #[arg(long, value_name = "ID")]
    pub backbone: String,
    /// Folder holding checkpoints as <org>/<name>/ [default: $BENIGN_MODELS_DIR]
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Feature cache [default: $BENIGN_CACHE_DIR, else the platform cache folder/benign-attention]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Add [CLS]/[SEP] when tokenizing (the authors did not)
    #[arg(long)]
    pub special_tokens: bool,
    /// Inputs per backbone batch
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub batch_size: usize,
}

impl BackboneArgs {
    fn load(&self) -> Result<encoder::Backbone> {
        if self.batch_size == 0 {
            anyhow::bail!("--batch-size must be at least 1, got 0");
        }
        let files = encoder::resolve(&self.backbone, self.models_dir.as_deref())?;
        let text = encoder::TextOptions {
            special_tokens: self.special_tokens,
            ..Default::default()
        };
        encoder::Backbone::load(files, &candle_core::Device::Cpu, text)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SplitChoice {
    Train,
    Test,
    All,
}

#[derive(Args, Debug)]
pub struct ExtractArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    #[command(flatten)]
    pub backbone: BackboneArgs,
    /// Dataset name
    #[arg(long)]
    pub dataset: DatasetName,
    /// Which split(s)
    #[arg(long, value_enum, default_value_t = SplitChoice::All)]
    pub split: SplitChoice,
    /// `cls`: the final CLS/position-0 feature only (phase 1); `full`: also the last layer's
    /// input hidden states (phase 2; about T·D·4 bytes per sample)
    #[arg(long, value_enum, default_value_t = Contents::Cls)]
    pub contents: Contents,
    /// Only the first N samples of each split
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// What each dataset folder holds against the official release ("cifar10: 8068/50000 train, …").
    List(DataDirArg),
    /// Checksums of the files against the official releases (datasets/*.toml); exit 1 if a present
    /// file differs.
    Verify(DatasetsArgs),
    /// Download the canonical release files, checking their checksums.
    Fetch(DatasetsArgs),
    /// Draw the paper's split and label noise and print its summary as JSON.
    Split(SplitArgs),
}

#[derive(Args, Debug, Clone)]
pub struct DataDirArg {
    /// Folder holding one folder per dataset [default: $BENIGN_DATA_DIR, else ./datasets]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DatasetsArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Datasets (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec, cifar10n) [default: all]
    pub datasets: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SplitArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Dataset name (mnist, cifar10, pneumoniamnist, breastmnist, ag_news, trec, or another 2D MedMNIST task)
    #[arg(long)]
    pub dataset: DatasetName,
    /// Clean phase-1 samples
    #[arg(long, value_name = "N")]
    pub pretrain_n: usize,
    /// Noisy phase-2 (fine-tune) samples
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub n: usize,
    /// Subsample the test split to this many samples [default: all]
    #[arg(long, value_name = "M")]
    pub test_n: Option<usize>,
    /// Seed of the split
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// symmetric, pair, or cifar10n:aggre|random1|random2|random3|worse (real human labels)
    #[arg(long, default_value = "symmetric")]
    pub noise: NoiseModel,
    /// Label-noise rate η ∈ [0, 1) (ignored for cifar10n, whose rate is realised)
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub eta: f64,
    /// Seed of the label noise [default: --seed; a separate stream either way]
    #[arg(long)]
    pub noise_seed: Option<u64>,
    /// Split the test file into disjoint train (this fraction) and test pools, for datasets whose
    /// training split is absent; recorded as a deviation
    #[arg(long, value_name = "F")]
    pub carve_train_from_test: Option<f64>,
}

/// Hyper-parameters shared by a single run and the grid, named after the authors' config keys.
/// Unset flags take the value from --config, else the authors' final config.
#[derive(Args, Debug)]
pub struct SharedHyperParams {
    /// TOML file with any of the config keys (seq_len, embed_dim, …); flags given on the command
    /// line override it. Presets: configs/synthetic/*.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Tokens per sample T (≥ 3) [default: 8]
    #[arg(long, value_name = "T")]
    pub seq_len: Option<usize>,
    /// Training samples n (≥ 2) [default: 20]
    #[arg(long, value_name = "N")]
    pub train_n: Option<usize>,
    /// Test samples (clean labels) [default: 1000]
    #[arg(long, value_name = "N")]
    pub test_n: Option<usize>,
    /// ρ, signal strength of the weakly relevant tokens x₂, x₃ [default: 0.1]
    #[arg(long, allow_negative_numbers = true)]
    pub rho: Option<f64>,
    /// η, label-flip ratio in [0, 0.5]; 2·⌊⌈nη⌉/2⌋ labels flip, half per class [default: 0.2]
    #[arg(long, alias = "eta", value_name = "ETA", allow_negative_numbers = true)]
    pub noise_ratio: Option<f64>,
    /// Gradient-descent step size (> 0) [default: 0.005]
    #[arg(long, value_name = "LR", allow_negative_numbers = true)]
    pub learning_rate: Option<f64>,
    /// Number of full-batch gradient-descent updates [default: 1000]
    #[arg(long, value_name = "STEPS")]
    pub num_steps: Option<usize>,
    /// Seed of the data and of W's initialisation [default: 42]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Build the test set from the training seed as the authors did (its first n samples share
    /// the training noise, PAPER.md §2.1); by default the test set is independent.
    #[arg(long)]
    pub paper_test_seed: bool,
    /// Log (and evaluate on the test set) every this many steps [default: 10]
    #[arg(long, value_name = "STEPS")]
    pub log_interval: Option<usize>,
    /// Training computation: the exact low-rank `subspace` reformulation, or the plain `dense`
    /// d×d candle autograd of the authors' code (same updates, O(d²) per step).
    #[arg(long, value_enum, default_value_t = EngineKind::Subspace)]
    pub engine: EngineKind,
    /// λ of the LocAteR penalty λ·v_sym(W), the variance of the eigenvalues of W's symmetric part
    /// (keeps their mean; README "Localization"); needs --engine dense [default: 0, none]
    #[arg(long, value_name = "LAMBDA", allow_negative_numbers = true)]
    pub locater: Option<f64>,
}

impl SharedHyperParams {
    /// The config file (or the paper defaults) with the flags given on the command line on top.
    fn config(&self) -> Result<SyntheticConfig> {
        let mut c = match &self.config {
            Some(path) => SyntheticConfig::from_toml_file(path)?,
            None => SyntheticConfig::default(),
        };
        let set = |slot: &mut usize, flag: Option<usize>| flag.into_iter().for_each(|v| *slot = v);
        set(&mut c.seq_len, self.seq_len);
        set(&mut c.train_n, self.train_n);
        set(&mut c.test_n, self.test_n);
        set(&mut c.num_steps, self.num_steps);
        set(&mut c.log_interval, self.log_interval);
        let set = |slot: &mut f64, flag: Option<f64>| flag.into_iter().for_each(|v| *slot = v);
        set(&mut c.rho, self.rho);
        set(&mut c.noise_ratio, self.noise_ratio);
        set(&mut c.learning_rate, self.learning_rate);
        set(&mut c.locater, self.locater);
        if let Some(seed) = self.seed {
            c.seed = seed;
        }
        c.paper_test_seed |= self.paper_test_seed;
        Ok(c)
    }
}

#[derive(Args, Debug)]
pub struct SyntheticArgs {
    #[command(flatten)]
    pub shared: SharedHyperParams,
    /// Token dimension d (≥ 2) [default: 2000]
    #[arg(long, value_name = "D")]
    pub embed_dim: Option<usize>,
    /// ‖μ‖, norm of the class signals (> 0) [default: 20]
    #[arg(long, value_name = "NORM", allow_negative_numbers = true)]
    pub signal_norm: Option<f64>,
    /// Write metrics.jsonl, summary.json, token_probs.png and selected_tokens.png here; without
    /// it the metrics and the summary go to stdout as JSON lines.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub shared: SharedHyperParams,
    /// `full`: the authors' 39 × 39 grid (d 250..5000 step 125, ‖μ‖ 5..100 step 2.5);
    /// `coarse`: a 9 × 9 subset of it.
    #[arg(long, value_enum, default_value_t = Grid::Full)]
    pub grid: Grid,
    /// Output folder for sweep.csv and the heat maps.
    #[arg(long, value_name = "DIR", default_value = "results/synthetic-sweep")]
    pub out: PathBuf,
    /// Parallel runs [default: all cores]
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct LocalizationSweepArgs {
    #[command(flatten)]
    pub shared: SharedHyperParams,
    /// `coarse`: 9 × 9 cells of the Fig. 5 grid; `full`: all 39 × 39.
    #[arg(long, value_enum, default_value_t = Grid::Coarse)]
    pub grid: Grid,
    /// Output folder for localization.csv and entropy_vs_eigen_variance.png.
    #[arg(long, value_name = "DIR", default_value = "results/localization-sweep")]
    pub out: PathBuf,
    /// Parallel runs [default: all cores]
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind::*;
            if matches!(err.kind(), DisplayHelp | DisplayVersion) {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            if err.kind() == DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = err.print();
                return ExitCode::from(2);
            }
            let rendered = err.render().to_string();
            eprintln!(
                "{}",
                rendered
                    .lines()
                    .next()
                    .unwrap_or("error: invalid arguments")
            );
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            let message = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Runs a parsed command; `Ok` carries the exit status of a command that ran to its end (0, or 1
/// for a negative answer such as `data verify` finding a mismatch).
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Synthetic(args) => synthetic_run(args).map(|()| ExitCode::SUCCESS),
        Command::SyntheticSweep(args) => synthetic_sweep(args).map(|()| ExitCode::SUCCESS),
        Command::LocalizationSweep(args) => localization_sweep(args).map(|()| ExitCode::SUCCESS),
        Command::Data(command) => data_command(command),
        Command::Extract(args) => extract(args).map(|()| ExitCode::SUCCESS),
        Command::Finetune(args) => finetune(args).map(|()| ExitCode::SUCCESS),
        Command::Reproduce(command) => reproduce_command(command),
    }
}

fn experiment_name(e: reproduce::Experiment) -> &'static str {
    match e {
        reproduce::Experiment::Table2 => "table2",
        reproduce::Experiment::Fig8 => "fig8",
        reproduce::Experiment::Fig9 => "fig9",
    }
}

fn grid_of(experiment: reproduce::Experiment, args: &GridArgs) -> Result<reproduce::Grid> {
    reproduce::Grid::new(
        experiment,
        args.datasets.clone(),
        args.seeds.clone(),
        args.ns.clone(),
        args.etas.clone(),
        args.budget,
        args.mode,
    )
}

fn reproduce_command(command: ReproduceCommand) -> Result<ExitCode> {
    let (experiment, args) = match command {
        ReproduceCommand::Table2(args) => (reproduce::Experiment::Table2, args),
        ReproduceCommand::Fig8(args) => (reproduce::Experiment::Fig8, args),
        ReproduceCommand::Fig9(args) => (reproduce::Experiment::Fig9, args),
        ReproduceCommand::Report(args) => {
            let runs = reproduce::merge(&args.dirs, &args.out)?;
            println!("{runs} runs → {}", args.out.join("report.md").display());
            return Ok(ExitCode::SUCCESS);
        }
        ReproduceCommand::Slurm(args) => {
            if args.shards == 0 {
                anyhow::bail!("--shards must be at least 1");
            }
            if args.grid.shard.is_some() {
                anyhow::bail!("--shard: the script gives each task its own shard; drop the flag");
            }
            grid_of(args.experiment, &args.grid)?;
            let name = experiment_name(args.experiment);
            let out = args
                .grid
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("results").join(name));
            let out = std::path::absolute(&out).unwrap_or(out);
            let env = [
                ("BENIGN_DATA_DIR", args.grid.places.root.data_dir.clone()),
                ("BENIGN_MODELS_DIR", args.grid.places.models_dir.clone()),
                ("BENIGN_CACHE_DIR", args.grid.places.cache_dir.clone()),
            ]
            .into_iter()
            .filter_map(|(k, flag)| {
                flag.map(|p| p.display().to_string())
                    .or_else(|| std::env::var(k).ok())
                    .map(|v| (k.to_string(), v))
            })
            .collect();
            let script = reproduce::slurm::SlurmScript {
                experiment: name.into(),
                grid_args: args.grid.grid_flags(),
                shards: args.shards,
                out: out.clone(),
                binary: std::env::current_exe().context("locating this binary")?,
                time: args.time,
                cpus_per_task: args.cpus_per_task,
                mem: args.mem,
                partition: args.partition,
                env,
            };
            let path = out.join(format!("reproduce-{name}.sbatch"));
            crate::io::ensure_dir(&out.join("logs"))?;
            crate::io::write_atomic(&path, |w| Ok(w.write_all(script.render().as_bytes())?))?;
            println!("{}", path.display());
            eprintln!(
                "submit with `sbatch {}`; then merge with `{} reproduce report {}/shard-* --out {}/report`",
                path.display(),
                script.binary.display(),
                out.display(),
                out.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
    };
    if args.jobs == Some(0) {
        anyhow::bail!("--jobs must be at least 1");
    }
    let grid = grid_of(experiment, &args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(experiment_name(experiment)));
    let options = reproduce::DriverOptions {
        grid,
        out: out.clone(),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        shard: args.shard,
        data_dir: args.places.root.data_dir.clone(),
        models_dir: args.places.models_dir.clone(),
        cache_dir: args.places.cache_dir.clone(),
        device: args.places.device.device()?,
    };
    let started = std::time::Instant::now();
    let outcome = {
        let bars = report::finetune::Bars::default();
        reproduce::run(&options, &bars)?
    };
    for note in &outcome.left_out {
        eprintln!("left out: {note}");
    }
    eprintln!(
        "{} runs done, {} were already finished, {} failed ({:.0} s); report: {}",
        outcome.ran - outcome.failed.len(),
        outcome.skipped,
        outcome.failed.len(),
        started.elapsed().as_secs_f64(),
        out.join("report.md").display()
    );
    if outcome.failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for (id, err) in &outcome.failed {
            eprintln!("failed: {id}: {err}");
        }
        Ok(ExitCode::from(1))
    }
}

fn finetune(args: FinetuneArgs) -> Result<()> {
    let options = FinetuneOptions {
        dataset: args.dataset,
        eta: args.eta,
        noise: args.noise,
        mode: args.mode,
        seed: args.seed,
        n: args.n,
        pretrain_n: args.pretrain_n,
        epochs: args.epochs,
        pretrain_epochs: args.pretrain_epochs,
        backbone: args.backbone,
        test_n: args.test_n,
        eval_every: args.eval_every,
        carve_train_from_test: args.carve_train_from_test,
        data_dir: args.places.root.data_dir,
        models_dir: args.places.models_dir,
        cache_dir: args.places.cache_dir,
        encode_batch: args.encode_batch,
        special_tokens: args.special_tokens,
        out: args.out.clone(),
        checkpoint_every: args.checkpoint_every,
        resume: args.resume,
        device: args.places.device.device()?,
        train_threads: args.train_threads,
        locater: args.locater,
    };
    let run = {
        let bars = report::finetune::Bars::default();
        crate::train::finetune::finetune(&options, &bars)?
    };
    for deviation in &run.summary.deviations {
        eprintln!("note: {deviation}");
    }
    if let Some(out) = &args.out {
        report::finetune::write_run(out, &run)?;
    }
    println!("{}", serde_json::to_string(&run.summary)?);
    let s = &run.summary;
    eprintln!(
        "{} {} η {}: baseline {:.3}, train loss {:.3}, memorization {:.3}, test {:.3} ({:.0} s)",
        s.dataset,
        s.backbone,
        s.eta,
        s.baseline_test_acc,
        s.train_loss,
        s.memorization,
        s.test_acc,
        s.wall_seconds
    );
    Ok(())
}

fn extract(args: ExtractArgs) -> Result<()> {
    let root = data::data_root(args.root.data_dir.as_deref());
    let dataset = data::load(&args.dataset, &root)?;
    for warning in &dataset.warnings {
        eprintln!("warning: {warning}");
    }
    let backbone = args.backbone.load()?;
    let cache = FeatureCache::new(cache_root(args.backbone.cache_dir.as_deref()));
    let mut splits = Vec::new();
    if args.split != SplitChoice::Test {
        match &dataset.train {
            Some(train) => splits.push(("train", train)),
            None => anyhow::bail!(
                "{}: the training split is absent; use --split test",
                dataset.name
            ),
        }
    }
    if args.split != SplitChoice::Train {
        splits.push(("test", &dataset.test));
    }
    for (name, split) in splits {
        let count = args.limit.map_or(split.len(), |l| l.min(split.len()));
        let positions: Vec<usize> = (0..count).collect();
        let bar = report::progress::bar(count as u64, "samples");
        let started = std::time::Instant::now();
        let (_, stats) = cache.features(
            &backbone,
            dataset.name.id(),
            name,
            split,
            &positions,
            args.contents,
            args.backbone.batch_size,
            &mut |k| bar.inc(k as u64),
        )?;
        bar.finish_and_clear();
        for warning in &stats.warnings {
            eprintln!("warning: {warning}");
        }
        println!(
            "{} {name}: {count} samples, {} computed, {} from cache ({:.1} s)",
            dataset.name,
            stats.computed,
            stats.from_cache,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Manifest names from the command line, or all of them.
fn manifest_names(requested: &[String]) -> Result<Vec<String>> {
    if requested.is_empty() {
        return Ok(data::catalog::manifest_names().map(String::from).collect());
    }
    requested
        .iter()
        .map(|name| {
            let id = if name == "cifar10n" {
                name.clone()
            } else {
                name.parse::<DatasetName>()
                    .map_err(anyhow::Error::msg)?
                    .id()
                    .to_string()
            };
            match data::catalog::manifest(&id) {
                Some(_) => Ok(id),
                None => anyhow::bail!(
                    "{name}: no manifest in datasets/ (known: {})",
                    data::catalog::manifest_names()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect()
}

fn data_command(command: DataCommand) -> Result<ExitCode> {
    match command {
        DataCommand::List(args) => {
            let root = data::data_root(args.data_dir.as_deref());
            println!("data root: {}", root.display());
            for name in DatasetName::paper() {
                match data::load(&name, &root) {
                    Ok(dataset) => println!("{}", data::catalog::Completeness::of(&dataset).line()),
                    Err(err) => println!("{name}: unavailable: {err}"),
                }
            }
            let annotations = root.join("cifar10n").join(data::cifar10n::FILE_NAME);
            match data::cifar10n::load(&annotations, data::cifar10n::HumanLabels::Aggre) {
                Ok(a) => println!(
                    "cifar10n: {}/{} annotations, complete",
                    a.human.len(),
                    data::cifar10n::TRAIN_IMAGES
                ),
                Err(err) => println!("cifar10n: unavailable: {err}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Verify(args) => {
            let root = data::data_root(args.root.data_dir.as_deref());
            let mut failures = 0;
            for name in manifest_names(&args.datasets)? {
                let manifest = data::catalog::manifest(&name).expect("listed names have manifests");
                for (path, status) in data::catalog::verify(&manifest, &root)? {
                    let shown = path.strip_prefix(&root).unwrap_or(&path);
                    println!("{name}: {}: {status}", shown.display());
                    failures += usize::from(matches!(
                        status,
                        data::catalog::FileStatus::Mismatch(_)
                            | data::catalog::FileStatus::Partial { .. }
                    ));
                }
            }
            if failures > 0 {
                println!("{failures} file(s) differ from the official releases");
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Fetch(args) => {
            let root = data::data_root(args.root.data_dir.as_deref());
            for name in manifest_names(&args.datasets)? {
                let manifest = data::catalog::manifest(&name).expect("listed names have manifests");
                let report = data::fetch::fetch(&manifest, &root)?;
                println!(
                    "{name}: {} downloaded, {} already present",
                    report.downloaded.len(),
                    report.already_present.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Split(args) => {
            let root = data::data_root(args.root.data_dir.as_deref());
            let dataset = data::load(&args.dataset, &root)?;
            for warning in &dataset.warnings {
                eprintln!("warning: {warning}");
            }
            let plan = SplitPlan {
                pretrain_n: args.pretrain_n,
                n: args.n,
                test_n: args.test_n,
                seed: args.seed,
                carve_train_from_test: args.carve_train_from_test,
            };
            let noise = NoiseSpec {
                model: args.noise,
                eta: args.eta,
                seed: args.noise_seed.unwrap_or(args.seed),
            };
            let prepared = prepare(&dataset, &plan, &noise, &root)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&report::data::split_summary(
                    &dataset, &prepared, &noise
                ))?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn synthetic_run(args: SyntheticArgs) -> Result<()> {
    let mut config = args.shared.config()?;
    if let Some(d) = args.embed_dim {
        config.embed_dim = d;
    }
    if let Some(norm) = args.signal_norm {
        config.signal_norm = norm;
    }
    config.validate()?;
    let bar = report::progress::bar(config.num_steps as u64 + 1, "steps");
    let run = synthetic::run(&config, args.shared.engine, Trace::Full, &mut |_| {
        bar.inc(1)
    })?;
    bar.finish_and_clear();
    if let Some(dir) = &args.out {
        report::synthetic::write_run(dir, &run)?;
    }
    let mut stdout = std::io::stdout().lock();
    report::synthetic::print_run(&mut stdout, &run, args.out.is_none())?;
    stdout.flush()?;
    let s = &run.summary;
    eprintln!(
        "{}: train acc {:.3}, test acc {:.3}, noisy fitted {}/{}, clean x₁ prob {:.3}, \
         entropy clean {:.3} / noisy {}, W eigen-variance (symmetric part) {} ({:.2} s){}",
        s.regime.name(),
        s.train_acc,
        s.test_acc,
        s.noisy_fitted,
        s.noisy_total,
        s.clean_x1_prob,
        s.clean_entropy,
        s.noisy_entropy
            .map_or("-".to_string(), |e| format!("{e:.3}")),
        match (s.qk_symmetric_init, s.qk_symmetric) {
            (Some(a), Some(b)) => format!("{:.4} → {:.4}", a.var, b.var),
            _ => "-".to_string(),
        },
        s.wall_seconds,
        args.out
            .as_ref()
            .map(|d| format!(", outputs in {}", d.display()))
            .unwrap_or_default(),
    );
    Ok(())
}

/// Every cell of `grid` on `jobs` threads, with a progress bar: the validated base config, the
/// rows and the wall time in seconds.
fn run_grid(
    shared: &SharedHyperParams,
    grid: Grid,
    jobs: Option<usize>,
    trace: Trace,
) -> Result<(SyntheticConfig, Vec<synthetic::SweepRow>, f64)> {
    let base = shared.config()?;
    base.validate()?;
    if jobs == Some(0) {
        anyhow::bail!("--jobs must be at least 1, got 0");
    }
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(jobs) = jobs {
        pool = pool.num_threads(jobs);
    }
    let pool = pool.build().context("cannot start the worker threads")?;
    let cells = (grid.embed_dims().len() * grid.signal_norms().len()) as u64;
    let bar = report::progress::bar(cells, "runs");
    let started = std::time::Instant::now();
    let rows =
        pool.install(|| synthetic::sweep(&base, grid, shared.engine, trace, &|| bar.inc(1)))?;
    bar.finish_and_clear();
    Ok((base, rows, started.elapsed().as_secs_f64()))
}

fn synthetic_sweep(args: SweepArgs) -> Result<()> {
    let (base, rows, seconds) = run_grid(&args.shared, args.grid, args.jobs, Trace::FinalOnly)?;
    report::synthetic::write_sweep(&args.out, args.grid, &base, &rows)?;
    eprintln!(
        "{} runs in {seconds:.1} s; sweep.csv and heat maps in {}",
        rows.len(),
        args.out.display()
    );
    Ok(())
}

fn localization_sweep(args: LocalizationSweepArgs) -> Result<()> {
    let (base, rows, seconds) =
        run_grid(&args.shared, args.grid, args.jobs, Trace::FinalWithSpectrum)?;
    report::synthetic::write_localization(&args.out, args.grid, &base, &rows)?;
    eprintln!(
        "{} runs in {seconds:.1} s; localization.csv and entropy_vs_eigen_variance.png in {}",
        rows.len(),
        args.out.display()
    );
    Ok(())
}
