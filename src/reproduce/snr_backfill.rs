//! `reproduce snr`: the n·SNR² estimate ([`crate::train::run_snr`]) of every finished run of a result
//! folder whose summary.json lacks one (runs made before runs recorded it), written into that
//! summary.json as the run itself would have written it. Nothing is trained past phase 1.
//!
//! η-siblings share their fine-tune samples (the split depends on the seed, not on η), so the
//! estimate is made once for them all. Each estimate must come from the run's own phase 1: the
//! phase-1 classifier it used must score the run's recorded baseline test accuracy, else the run
//! is left without one and named.
//!
//! Every run is checked before any estimate is made, and a failed check stops the command: its
//! folder a real folder inside the result folder (no link, which would have this command rewrite
//! another folder's summary), its summary's config a run's config, equal to its config.json and
//! named by its folder (so an edited seed or dataset cannot pass for the run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::report::results::{ResultRow, collect};
use crate::train::progress::Progress;
use crate::train::run::{FinetuneJob, Mode, Places, RunConfig, RunFolder};
use crate::train::run_snr::{RunSnr, of_job};

/// What a backfill did.
#[derive(Debug, Default)]
pub struct Backfill {
    /// Runs whose summary.json now holds the estimate.
    pub filled: usize,
    /// Runs that had one already.
    pub present: usize,
    /// Estimates made (one per group of η-siblings).
    pub estimates: usize,
    /// Runs left without one, each with why.
    pub refused: Vec<String>,
}

/// Fills the missing estimates of the finished runs under `out/runs`.
pub fn backfill(out: &Path, places: &Places, progress: &dyn Progress) -> Result<Backfill> {
    let mut done = Backfill::default();
    // Keyed by (head mode, samples): the last-layer groups, whose phase 1 on CLS features takes
    // seconds, before the head-mode ones, whose phase 1 on every token may take many minutes, so
    // that a sitting stopped early has given the most runs their estimate.
    let mut siblings: BTreeMap<(bool, String), Vec<(ResultRow, PathBuf)>> = BTreeMap::new();
    no_links(out)?;
    for (row, dir) in collect(&[out.to_path_buf()])? {
        if row.snr.is_some() {
            done.present += 1;
            continue;
        }
        check_run(&row, &dir)?;
        siblings
            .entry((row.config.mode == Mode::Head, samples_key(&row.config)?))
            .or_default()
            .push((row, dir));
    }
    for runs in siblings.values() {
        crate::interrupt::check()?;
        let first = &runs[0].0;
        let found = match of_job(&estimate_job(&first.config, places), progress) {
            Ok(found) => found,
            Err(e) => {
                let why = refusal(e)?;
                done.refused
                    .extend(runs.iter().map(|(r, _)| format!("{}: {why}", r.run)));
                continue;
            }
        };
        done.estimates += 1;
        eprintln!(
            "{}: {} (phase-1 test acc {})",
            first.run,
            found.estimate.headline(),
            found.phase1_test_acc
        );
        for (row, dir) in runs {
            match fill(row, dir, &found) {
                Ok(()) => done.filled += 1,
                Err(why) => done.refused.push(format!("{}: {why:#}", row.run)),
            }
        }
    }
    Ok(done)
}

/// Why an estimate failed, for the list of runs left without one; a stop asked for by a signal
/// is no refusal: it ends the command (the groups after it would only be stopped in turn).
fn refusal(e: anyhow::Error) -> Result<String> {
    if e.chain()
        .any(|cause| cause.is::<crate::interrupt::Interrupted>())
    {
        return Err(e);
    }
    Ok(format!("{e:#}"))
}

/// Refuses a result folder whose `runs/` holds a link, or anything that is not a folder.
fn no_links(out: &Path) -> Result<()> {
    let runs = out.join(crate::report::results::RUNS);
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("{}: cannot list", runs.display()))?;
        let kind = entry
            .file_type()
            .with_context(|| format!("{}: cannot read", entry.path().display()))?;
        if kind.is_symlink() {
            bail!(
                "{}: a link; reproduce snr writes only the runs inside {}, move the run there \
                 instead",
                entry.path().display(),
                out.display()
            );
        }
        if !kind.is_dir() {
            bail!(
                "{}: not a run folder; {} holds one folder per run",
                entry.path().display(),
                runs.display()
            );
        }
    }
    Ok(())
}

/// Refuses a run whose summary's config is not a run's config, or not this folder's run (its
/// config.json and its folder name say which).
fn check_run(row: &ResultRow, dir: &Path) -> Result<()> {
    let folder = RunFolder(dir.to_path_buf());
    let summary = folder.summary();
    let config = &row.config;
    config
        .validate()
        .with_context(|| format!("{}: its config is not a run's", summary.display()))?;
    let recorded = folder.config();
    let text = crate::io::read_input_text(&recorded, crate::io::limits::SMALL_TEXT)?;
    let started: RunConfig = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a run's config", recorded.display()))?;
    if started != *config {
        bail!(
            "{}: its config differs from {} (the run's, written when it started); the summary was \
             edited or belongs to another run",
            summary.display(),
            recorded.display()
        );
    }
    if config.run_name()? != row.run {
        bail!(
            "{}: its config names the run {}, not its folder's; the summary was edited or moved",
            summary.display(),
            config.run_name()?
        );
    }
    Ok(())
}

/// What decides a run's fine-tune samples and phase 1: its configuration less η (and the version
/// of the noise draw, which only η > 0 records).
fn samples_key(config: &RunConfig) -> Result<String> {
    let samples = RunConfig {
        eta: 0.0,
        authors_noise_draw: None,
        ..config.clone()
    };
    crate::io::json_digest(&samples)
}

/// The run as `diagnose snr` would make it: no folder, nothing resumed.
fn estimate_job(config: &RunConfig, places: &Places) -> FinetuneJob {
    FinetuneJob {
        checkpoint_every: 0,
        ..FinetuneJob::new(config.clone(), places.clone())
    }
}

/// Writes `found` into the run's summary.json once its phase 1 is shown to be the run's own.
fn fill(row: &ResultRow, dir: &Path, found: &RunSnr) -> Result<()> {
    if found.phase1_test_acc != row.baseline_test_acc {
        anyhow::bail!(
            "the phase 1 made now scores test accuracy {}, the run's own scored {}: the estimate \
             would rest on another classifier's choice of tokens",
            found.phase1_test_acc,
            row.baseline_test_acc
        );
    }
    let mut summary = row.summary.clone();
    summary.snr = Some(found.estimate.clone());
    crate::io::write_json(&RunFolder(dir.to_path_buf()).summary(), &summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DatasetName;

    #[test]
    fn a_signal_ends_the_backfill_where_other_failures_only_refuse_a_run() {
        let stopped = anyhow::Error::new(crate::interrupt::Interrupted { signal: 15 })
            .context("phase 1 of trec")
            .context("estimate");
        assert!(refusal(stopped).is_err());
        let failed = anyhow::anyhow!("baseline test accuracy differs").context("estimate");
        assert_eq!(
            refusal(failed).unwrap(),
            "estimate: baseline test accuracy differs"
        );
    }

    #[test]
    fn eta_siblings_share_a_key_and_other_seeds_or_sizes_do_not() {
        let base = RunConfig::paper(&DatasetName::Trec).unwrap();
        let noisy = RunConfig {
            eta: 0.2,
            ..base.clone()
        }
        .with_noise_draw();
        let key = |c: &RunConfig| samples_key(c).unwrap();
        assert_eq!(key(&base), key(&noisy));
        assert_ne!(
            key(&base),
            key(&RunConfig {
                seed: 7,
                ..base.clone()
            })
        );
        assert_ne!(
            key(&base),
            key(&RunConfig {
                n: 21,
                ..base.clone()
            })
        );
    }
}
