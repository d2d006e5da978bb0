//! The SNR dose on the paper's synthetic model: the check that the dose analysis can say Yes where
//! the theorem holds (docs/design.md, "The SNR dose"). A dose k multiplies the noise's variance by
//! 1 + k (σ_ε = √(1 + k)), so SNR² → SNR²/(1 + k) while ‖μ‖, d, T, n, the step size and the step
//! count stay, as `finetune --token-noise k` does to real tokens.
//!
//! Each run is kept in `<out>/runs/<name>.json` with its whole config, so a stopped check resumes;
//! a file whose config is not the run's is an error naming it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::engine::EngineKind;
use super::model::Regime;
use super::train::run;
use super::trajectory::Trace;
use crate::io::{ensure_dir, read_input_text, write_json};

/// The folder of the run files under the check's output folder.
pub const RUNS: &str = "runs";

/// One (d, ‖μ‖) of the check: a "dataset" of the analysis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DoseSetting {
    pub name: String,
    pub embed_dim: usize,
    pub signal_norm: f64,
}

/// The axes of the check; every other hyper-parameter is `base`'s.
#[derive(Clone, Debug)]
pub struct DoseGrid {
    pub base: SyntheticConfig,
    pub settings: Vec<DoseSetting>,
    pub ns: Vec<usize>,
    pub doses: Vec<f64>,
    pub etas: Vec<f64>,
    pub seeds: Vec<u64>,
}

/// One run of the grid: where it sits and its config.
#[derive(Clone, Debug)]
pub struct DosePoint {
    pub setting: String,
    pub k: f64,
    pub config: SyntheticConfig,
}

/// A finished run as the analysis reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DoseOutcome {
    pub setting: String,
    pub k: f64,
    pub config: SyntheticConfig,
    pub regime: Regime,
    pub train_acc: f64,
    pub test_acc: f64,
    pub noisy_fitted: usize,
    pub noisy_total: usize,
}

impl DoseOutcome {
    /// The share of the flipped labels fitted.
    pub fn memorization(&self) -> f64 {
        if self.noisy_total == 0 {
            f64::NAN
        } else {
            self.noisy_fitted as f64 / self.noisy_total as f64
        }
    }
}

impl DoseGrid {
    /// Every run, settings outermost, then n, dose, η and seed.
    pub fn points(&self) -> Vec<DosePoint> {
        let mut points = Vec::new();
        for setting in &self.settings {
            for &n in &self.ns {
                for &k in &self.doses {
                    for &eta in &self.etas {
                        for &seed in &self.seeds {
                            let config = SyntheticConfig {
                                embed_dim: setting.embed_dim,
                                signal_norm: setting.signal_norm,
                                noise_std: (1.0 + k).sqrt(),
                                train_n: n,
                                noise_ratio: eta,
                                seed,
                                ..self.base.clone()
                            };
                            points.push(DosePoint {
                                setting: setting.name.clone(),
                                k,
                                config,
                            });
                        }
                    }
                }
            }
        }
        points
    }
}

/// The file of one run.
fn run_file(out: &Path, point: &DosePoint) -> PathBuf {
    let c = &point.config;
    out.join(RUNS).join(format!(
        "{}_n{}_k{}_eta{}_s{}.json",
        point.setting, c.train_n, point.k, c.noise_ratio, c.seed
    ))
}

/// The run's kept outcome, if its file exists; an error if the file is not this run's.
fn kept(path: &Path, point: &DosePoint) -> Result<Option<DoseOutcome>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_input_text(path, crate::io::limits::SMALL_TEXT)?;
    let outcome: DoseOutcome = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a dose-check run file", path.display()))?;
    if outcome.config != point.config || outcome.setting != point.setting || outcome.k != point.k {
        bail!(
            "{}: holds another run's config than this check's (remove the file or choose another \
             --out)",
            path.display()
        );
    }
    Ok(Some(outcome))
}

/// Runs one point with the exact subspace engine, final state only.
fn run_point(point: &DosePoint) -> Result<DoseOutcome> {
    let made = run(
        &point.config,
        EngineKind::Subspace,
        Trace::FinalOnly,
        &mut |_| {},
    )?;
    let s = made.summary;
    Ok(DoseOutcome {
        setting: point.setting.clone(),
        k: point.k,
        config: point.config.clone(),
        regime: s.regime,
        train_acc: s.train_acc,
        test_acc: s.test_acc,
        noisy_fitted: s.noisy_fitted,
        noisy_total: s.noisy_total,
    })
}

/// Every run of `grid`, kept ones read back and the rest made (`jobs` at once) and kept in `out`;
/// `on_done` is called once per run made or found.
pub fn run_grid(
    grid: &DoseGrid,
    out: &Path,
    jobs: usize,
    on_done: &(dyn Fn() + Sync),
) -> Result<Vec<DoseOutcome>> {
    for point in grid.points() {
        point.config.validate_for(EngineKind::Subspace)?;
    }
    ensure_dir(&out.join(RUNS))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1))
        .build()
        .context("starting the dose check's worker threads")?;
    pool.install(|| {
        grid.points()
            .par_iter()
            .map(|point| {
                let path = run_file(out, point);
                let outcome = match kept(&path, point)? {
                    Some(outcome) => outcome,
                    None => {
                        if crate::interrupt::requested().is_some() {
                            bail!(
                                "interrupted: the finished runs are kept in {}",
                                out.display()
                            );
                        }
                        let outcome = run_point(point)?;
                        write_json(&path, &outcome)?;
                        outcome
                    }
                };
                on_done();
                Ok(outcome)
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> DoseGrid {
        DoseGrid {
            base: SyntheticConfig {
                seq_len: 4,
                test_n: 50,
                num_steps: 20,
                log_interval: 20,
                ..Default::default()
            },
            settings: vec![DoseSetting {
                name: "a".into(),
                embed_dim: 30,
                signal_norm: 8.0,
            }],
            ns: vec![10],
            doses: vec![0.0, 3.0],
            etas: vec![0.2],
            seeds: vec![1],
        }
    }

    #[test]
    fn a_dose_scales_the_noise_and_nothing_else() {
        let points = tiny().points();
        assert_eq!(points.len(), 2);
        let (undosed, dosed) = (&points[0].config, &points[1].config);
        assert_eq!(undosed.noise_std, 1.0);
        assert_eq!(dosed.noise_std, 2.0);
        let snr_ratio = (dosed.snr() / undosed.snr()).powi(2);
        assert!(
            (snr_ratio - 0.25).abs() < 1e-12,
            "SNR² → SNR²/(1+k): {snr_ratio}"
        );
        assert_eq!(
            SyntheticConfig {
                noise_std: 1.0,
                ..dosed.clone()
            },
            *undosed
        );
    }

    #[test]
    fn runs_are_kept_and_a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let grid = tiny();
        let first = run_grid(&grid, dir.path(), 1, &|| {}).unwrap();
        let again = run_grid(&grid, dir.path(), 1, &|| {}).unwrap();
        assert_eq!(first, again);
        let mut other = grid.clone();
        other.base.num_steps = 21;
        other.base.log_interval = 21;
        let err = run_grid(&other, dir.path(), 1, &|| {}).unwrap_err();
        assert!(err.to_string().contains("another run's config"), "{err:#}");
    }
}
