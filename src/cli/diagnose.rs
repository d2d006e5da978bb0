//! `diagnose`: measurements of a run's data that train nothing past phase 1.

use anyhow::{Result, bail};
use clap::Subcommand;

use super::finetune::FinetuneArgs;
use crate::report::finetune::Bars;

#[derive(Subcommand, Debug)]
pub enum DiagnoseCommand {
    /// n·SNR² of a run's fine-tune set, and its parts (docs/design.md, "The SNR of real tokens").
    /// The run is chosen by `finetune`'s flags; its features and phase 1 come from the caches
    /// when they are there (else they are made, as `finetune` would), and nothing more is trained.
    /// One JSON line per run on stdout.
    Snr(FinetuneArgs),
}

pub fn run(command: DiagnoseCommand) -> Result<()> {
    match command {
        DiagnoseCommand::Snr(args) => snr(args),
    }
}

fn snr(args: FinetuneArgs) -> Result<()> {
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
