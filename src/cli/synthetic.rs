//! `synthetic`, `synthetic-sweep` and `localization-sweep`: the reference model's flags.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::report;
use crate::synthetic::{self, EncoderSettings, EngineKind, GridSize, SyntheticConfig, Trace};

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
    /// the training noise, docs/protocol.md §2.1); by default the test set is independent.
    #[arg(long)]
    pub paper_test_seed: bool,
    /// Log (and evaluate on the test set) every this many steps [default: 10]
    #[arg(long, value_name = "STEPS")]
    pub log_interval: Option<usize>,
    /// The model: the paper's `token-selector`, or the one-layer Transformer `encoder` of
    /// Figs. 6/7 (every parameter trained) [default: the config file's, else token-selector]
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// The encoder's FFN width [default: 2000]
    #[arg(long, value_name = "WIDTH")]
    pub mlp_dim: Option<usize>,
    /// Seed of the encoder's initialisation (the data keep --seed) [default: 0]
    #[arg(long, value_name = "SEED")]
    pub init_seed: Option<u64>,
    /// The token selector's training computation: the exact low-rank `subspace` reformulation, or
    /// the plain `dense` d×d candle autograd of the authors' code (same updates, O(d²) per step)
    /// [default: subspace]
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
    /// λ of the LocAteR penalty λ·v_sym(W), the variance of the eigenvalues of W's symmetric part
    /// (keeps their mean; docs/design.md, localization diagnostics); needs --engine dense [default: 0, none]
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
        match self.model {
            Some(ModelKind::Encoder) => {
                c.encoder.get_or_insert_with(EncoderSettings::default);
            }
            Some(ModelKind::TokenSelector) => c.encoder = None,
            None => {}
        }
        match &mut c.encoder {
            Some(encoder) => {
                if let Some(width) = self.mlp_dim {
                    encoder.mlp_dim = width;
                }
                if let Some(seed) = self.init_seed {
                    encoder.init_seed = seed;
                }
                if self.engine.is_some() {
                    bail!(
                        "--engine: the encoder has one computation; the flag is the token selector's"
                    );
                }
            }
            None => {
                if self.mlp_dim.is_some() || self.init_seed.is_some() {
                    bail!("--mlp-dim and --init-seed are the encoder's: add --model encoder");
                }
            }
        }
        Ok(c)
    }

    /// The token selector's engine (ignored by the encoder).
    fn engine(&self) -> EngineKind {
        self.engine.unwrap_or(EngineKind::Subspace)
    }
}

/// Which synthetic model a command trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// f(X) = νᵀ Xᵀ softmax(X Wᵀ p): W and p trained, the head ν fixed.
    TokenSelector,
    /// The one-layer Transformer encoder of Figs. 6/7 (the authors' `main_one_layer.py`).
    Encoder,
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
    /// σ_ε, the noise tokens' scale (> 0; not one of the authors' flags) [default: 1]
    #[arg(long, value_name = "SIGMA", allow_negative_numbers = true)]
    pub noise_std: Option<f64>,
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
    #[arg(long, value_enum, default_value_t = GridSize::Full)]
    pub grid: GridSize,
    /// Output folder for sweep.csv and the heat maps; each finished cell is kept in its cells/,
    /// so the same command resumes a stopped sweep.
    #[arg(long, value_name = "DIR", default_value = "results/synthetic-sweep")]
    pub out: PathBuf,
    #[command(flatten)]
    pub flags: GridFlags,
}

#[derive(Args, Debug)]
pub struct LocalizationSweepArgs {
    #[command(flatten)]
    pub shared: SharedHyperParams,
    /// `coarse`: 9 × 9 cells of the Fig. 5 grid; `full`: all 39 × 39.
    #[arg(long, value_enum, default_value_t = GridSize::Coarse)]
    pub grid: GridSize,
    /// Output folder for localization.csv and entropy_vs_eigen_variance.png; each finished cell
    /// is kept in its cells/, so the same command resumes a stopped sweep.
    #[arg(long, value_name = "DIR", default_value = "results/localization-sweep")]
    pub out: PathBuf,
    #[command(flatten)]
    pub flags: GridFlags,
}

pub fn run(args: SyntheticArgs) -> Result<()> {
    let mut config = args.shared.config()?;
    if let Some(d) = args.embed_dim {
        config.embed_dim = d;
    }
    if let Some(norm) = args.signal_norm {
        config.signal_norm = norm;
    }
    if let Some(sigma) = args.noise_std {
        config.noise_std = sigma;
    }
    config.validate_for(args.shared.engine())?;
    let bar = crate::progress_bar::bar(config.num_steps as u64 + 1, "steps");
    let run = synthetic::run(&config, args.shared.engine(), Trace::Full, &mut |_| {
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
         entropy clean {:.3} / noisy {}, query-key eigen-variance (symmetric part) {} ({:.2} s){}",
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
            (Some(a), Some(b)) => format!("{} → {}", four_places(a.var), four_places(b.var)),
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

/// The flags of a grid run: which cells, where they are kept, on how many threads.
#[derive(Args, Debug)]
pub struct GridFlags {
    /// Parallel runs [default: all cores]
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Run only the K-th of N interleaved parts of the grid (a job array's task); the parts
    /// share --out, and the table and figures are drawn once every cell is there.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<crate::shard::JobShard>,
}

/// The cells of `grid` not yet finished under `out` (of `shard`'s part), on `jobs` threads, with a
/// progress bar: the validated base config, where the grid stands and the wall time in seconds.
fn run_grid(
    shared: &SharedHyperParams,
    grid: GridSize,
    flags: &GridFlags,
    out: &std::path::Path,
    trace: Trace,
) -> Result<(SyntheticConfig, synthetic::GridProgress, f64)> {
    let base = shared.config()?;
    base.validate_for(shared.engine())?;
    super::common_args::check_jobs(flags.jobs)?;
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(jobs) = flags.jobs {
        pool = pool.num_threads(jobs);
    }
    let pool = pool.build().context("cannot start the worker threads")?;
    let store = synthetic::cells::CellStore::open(
        out,
        (&base, grid),
        trace == Trace::FinalWithSpectrum,
        flags.shard,
    )?;
    let pending = synthetic::sweep::pending(&base, grid, &store, flags.shard)?;
    let bar = crate::progress_bar::bar(pending as u64, "runs");
    let started = std::time::Instant::now();
    let progress = pool.install(|| {
        synthetic::sweep_into(
            &base,
            grid,
            (shared.engine(), trace),
            &store,
            flags.shard,
            &|| bar.inc(1),
        )
    })?;
    bar.finish_and_clear();
    Ok((base, progress, started.elapsed().as_secs_f64()))
}

/// One line on what a grid command did; `None` when the grid is not complete yet.
fn grid_outcome(
    progress: &synthetic::GridProgress,
    seconds: f64,
) -> Option<Vec<synthetic::SweepRow>> {
    let missing = progress.rows.iter().filter(|r| r.is_none()).count();
    eprint!(
        "{} cells run in {seconds:.1} s, {} found finished",
        progress.ran, progress.reused
    );
    if missing > 0 {
        eprintln!(
            "; {missing} of {} still to run (the other shards, or this command again)",
            progress.rows.len()
        );
    }
    progress.complete()
}

pub fn sweep(args: SweepArgs) -> Result<()> {
    let (base, progress, seconds) = run_grid(
        &args.shared,
        args.grid,
        &args.flags,
        &args.out,
        Trace::FinalOnly,
    )?;
    if let Some(rows) = grid_outcome(&progress, seconds) {
        report::synthetic::write_sweep(&args.out, args.grid, &base, &rows)?;
        eprintln!("; sweep.csv and heat maps in {}", args.out.display());
    }
    Ok(())
}

pub fn localization_sweep(args: LocalizationSweepArgs) -> Result<()> {
    let (base, progress, seconds) = run_grid(
        &args.shared,
        args.grid,
        &args.flags,
        &args.out,
        Trace::FinalWithSpectrum,
    )?;
    if let Some(rows) = grid_outcome(&progress, seconds) {
        report::synthetic::write_localization(&args.out, args.grid, &base, &rows)?;
        eprintln!(
            "; localization.csv and entropy_vs_eigen_variance.png in {}",
            args.out.display()
        );
    }
    Ok(())
}

/// Four decimals, or four significant digits where those would show only zeros (the encoder's
/// query-key spectrum is of order 1e-5).
fn four_places(value: f64) -> String {
    if value != 0.0 && value.abs() < 1e-3 {
        format!("{value:.3e}")
    } else {
        format!("{value:.4}")
    }
}
