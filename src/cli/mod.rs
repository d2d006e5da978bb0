//! Command-line flags and dispatch; the library does the work. Raw flags are parsed once into
//! the library's typed values, one file per command (`synthetic`, `data`, `extract`,
//! `finetune`, `reproduce`). Every error is one line on stderr and exit status 2.

mod common_args;
mod data;
mod diagnose;
mod extract;
mod finetune;
mod reproduce;
mod synthetic;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

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
