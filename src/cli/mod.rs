//! Command-line flags and dispatch; the library does the work. Raw flags are parsed once into
//! the library's typed values, one file per command (`synthetic`, `data`, `extract`,
//! `finetune`, `reproduce`). Every error is one line on stderr and exit status 2.

mod data;
mod diagnose;
mod extract;
mod finetune;
mod reproduce;
mod synthetic;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::runtime::DeviceKind;

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
    Synthetic(synthetic::SyntheticArgs),
    /// The Fig. 5 grid over d × ‖μ‖, one run per cell, on all cores.
    SyntheticSweep(synthetic::SweepArgs),
    /// Attention localization (docs/protocol.md §5) across the synthetic SNR grid: final eigen-mean and
    /// -variance of W, attention entropy of clean and noisy samples, regime; CSV and plots.
    LocalizationSweep(synthetic::LocalizationSweepArgs),
    /// Real datasets: what is present, checksums, downloads, and the paper's split.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Run a dataset through a frozen backbone once and fill the feature cache.
    Extract(extract::ExtractArgs),
    /// The paper's real-data protocol: phase 1 on clean data, phase 2 on noisy labels (§3).
    Finetune(finetune::FinetuneArgs),
    /// The paper's real-data table and figures as grids of finetune runs, with a report.
    #[command(subcommand)]
    Reproduce(reproduce::ReproduceCommand),
    /// Measurements of a run's data that train nothing past phase 1: `snr`, its fine-tune set on
    /// the paper's n·SNR² axis.
    #[command(subcommand)]
    Diagnose(diagnose::DiagnoseCommand),
}

/// Where a real-data run finds its data and checkpoints, caches features and computes.
#[derive(Args, Debug, Clone)]
pub struct PlaceArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Folder holding checkpoints as <org>/<name>/ [default: $BENIGN_MODELS_DIR]
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Feature cache [default: $BENIGN_CACHE_DIR, else the platform cache folder/benign-attention]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Where the backbone makes the features (cuda needs a build with `--features cuda`)
    /// [default: cpu]
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Where phases 1 and 2 run, whatever --device says [default: the host's cores, where they
    /// run fastest today; docs/design.md, "Placement"]
    #[arg(long, value_enum)]
    pub train_device: Option<DeviceKind>,
}

impl PlaceArgs {
    /// The library's places (the device is part of a run's configuration).
    pub fn places(&self) -> crate::train::run::Places {
        crate::train::run::Places {
            data_dir: self.root.data_dir.clone(),
            data_mirror: self.root.mirror(),
            models_dir: self.models_dir.clone(),
            cache_dir: self.cache_dir.clone(),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct DataDirArg {
    /// Folder holding one folder per dataset [default: $BENIGN_DATA_DIR, else ./datasets]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Base URL tried before a dataset's canonical URLs when a file must be downloaded, laid out
    /// as a data root (<URL>/<dataset folder>/<file>) [default: $BENIGN_DATA_MIRROR]
    #[arg(long, value_name = "URL")]
    pub data_mirror: Option<String>,
}

impl DataDirArg {
    /// The mirror of the flag, else of `$BENIGN_DATA_MIRROR`.
    pub fn mirror(&self) -> Option<String> {
        crate::data::fetch::mirror(self.data_mirror.as_deref())
    }
}

/// The most worker threads `--jobs` may ask for: far beyond any machine's cores, and few enough
/// that starting them is refused at once rather than after seconds of thread creation.
const MAX_JOBS: usize = 4096;

/// `--jobs`: at least 1 and at most [`MAX_JOBS`].
fn check_jobs(jobs: Option<usize>) -> Result<()> {
    match jobs {
        Some(0) => anyhow::bail!("--jobs must be at least 1, got 0"),
        Some(j) if j > MAX_JOBS => {
            anyhow::bail!("--jobs must be at most {MAX_JOBS} (worker threads), got {j}")
        }
        _ => Ok(()),
    }
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
    // The commands whose long loops ask `interrupt::check` between steps end cleanly on the
    // first signal; the others keep the default (the signal ends them at once).
    let stops_cleanly = matches!(
        cli.command,
        Command::Finetune(_)
            | Command::Reproduce(_)
            | Command::Extract(_)
            | Command::Diagnose(_)
            | Command::SyntheticSweep(_)
            | Command::LocalizationSweep(_)
    );
    if stops_cleanly && let Err(err) = crate::interrupt::install() {
        eprintln!("error: cannot install the SIGTERM/SIGINT handlers: {err}");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", crate::errors::one_line(&err));
            match err.downcast_ref::<crate::interrupt::Interrupted>() {
                Some(stop) => ExitCode::from(stop.exit_code()),
                None => ExitCode::from(2),
            }
        }
    }
}

/// Runs a parsed command; `Ok` carries the exit status of a command that ran to its end (0, or 1
/// for a negative answer such as `data verify` finding a mismatch).
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Synthetic(args) => synthetic::run(args).map(|()| ExitCode::SUCCESS),
        Command::SyntheticSweep(args) => synthetic::sweep(args).map(|()| ExitCode::SUCCESS),
        Command::LocalizationSweep(args) => {
            synthetic::localization_sweep(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Data(command) => data::run(command),
        Command::Extract(args) => extract::run(args).map(|()| ExitCode::SUCCESS),
        Command::Finetune(args) => finetune::run(args).map(|()| ExitCode::SUCCESS),
        Command::Reproduce(command) => reproduce::run(command),
        Command::Diagnose(command) => diagnose::run(command).map(|()| ExitCode::SUCCESS),
    }
}
