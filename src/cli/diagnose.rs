//! `diagnose`: measurements of a run's data that train nothing past phase 1.

use anyhow::{Result, bail};
use clap::Subcommand;

use super::finetune::FinetuneArgs;
use crate::report::finetune::Bars;

// Parsed once per process: the size of a variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum DiagnoseCommand {
    /// n·SNR² of a run's fine-tune set, and its parts (docs/design.md, "The SNR of real tokens").
    /// The run is chosen by `finetune`'s flags; its features and phase 1 come from the caches
    /// when they are there (else they are made, as `finetune` would), and nothing more is trained.
    /// One JSON line per run on stdout.
    Snr(SnrArgs),
    /// The planted-signal recovery curve: the JSON lines of `diagnose snr --plant-snr` (files,
    /// one or more) as one table (recovery.md) and one figure (recovery.png) in --out, with the
    /// calibration's verdict line.
    PlantReport(PlantReportArgs),
}

#[derive(clap::Args, Debug)]
pub struct PlantReportArgs {
    /// JSON-lines files written by `diagnose snr --plant-snr`
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<std::path::PathBuf>,
    /// Where recovery.md and recovery.png go
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct SnrArgs {
    #[command(flatten)]
    pub run: FinetuneArgs,
    /// Plant a signal of this SNR in the run's real tokens instead of reading their own: K
    /// balanced classes replace the labels, and one token per sample carries its class's signal
    /// of norm S·√tr Σ̂ (docs/design.md, "A planted signal"); several, comma-separated, share
    /// the draw. One JSON line per run and S, the planted S beside the estimate
    #[arg(
        long,
        value_name = "S",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub plant_snr: Vec<f64>,
}

pub fn run(command: DiagnoseCommand) -> Result<()> {
    match command {
        DiagnoseCommand::Snr(args) => snr(args),
        DiagnoseCommand::PlantReport(args) => {
            let done = crate::report::snr_plant::write(&args.files, &args.out)?;
            println!(
                "{} curves, {} of {} judged points within the tolerance → {}",
                done.curves,
                done.within,
                done.judged,
                args.out.join("recovery.md").display()
            );
            Ok(())
        }
    }
}

fn snr(args: SnrArgs) -> Result<()> {
    if !args.plant_snr.is_empty() {
        return planted(args);
    }
    let args = args.run;
    if let Some(out) = &args.out {
        bail!(
            "--out {}: diagnose snr writes no run folder (its result is the line on stdout)",
            out.display()
        );
    }
    let bars = Bars::default();
    for job in args.jobs()? {
        let found = crate::train::run_snr::of_job(&job, &bars)?;
        let e = &found.estimate;
        eprintln!(
            "{}: {} (n {}, effective dimension {:.1} of {}, ‖μ‖ {:.3}, σ_ε√d {:.3} (other tokens {:.3}), SNR {:.4}; relevant token: position {} for {:.0} % of samples)",
            found.run,
            e.headline(),
            e.samples,
            e.effective_dim,
            e.embed_dim,
            e.signal_norm,
            e.noise_norm,
            e.other_noise_norm,
            e.snr,
            e.modal_position,
            100.0 * e.modal_share
        );
        println!("{}", serde_json::to_string(&found)?);
    }
    Ok(())
}

/// `diagnose snr --plant-snr`: each S's estimate on each run's tokens.
fn planted(args: SnrArgs) -> Result<()> {
    if let Some(out) = &args.run.out {
        bail!(
            "--out {}: diagnose snr writes no run folder (its result is the line on stdout)",
            out.display()
        );
    }
    let bars = Bars::default();
    for job in args.run.jobs()? {
        for found in crate::train::snr_plant::of_job(&job, &args.plant_snr, &bars)? {
            let e = &found.estimate;
            eprintln!(
                "{}: planted SNR {:.3} (n·SNR² {:.2}), read {:.4} ({:.4} on the position-centred σ): {} (found {:.0} % of planted tokens)",
                found.run,
                found.planted_snr,
                found.planted_n_snr2,
                e.snr,
                found.snr_position_sigma,
                e.headline(),
                100.0 * found.found_share
            );
            println!("{}", serde_json::to_string(&found)?);
        }
    }
    Ok(())
}
