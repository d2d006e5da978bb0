//! Delayed generalization: the theorem's time before a benign run generalises again grows like
//! exp(1 / (n·SNR²)) (docs/protocol.md §2). From each η = 0.2 run's metrics.jsonl: the epoch its
//! noisy labels reach their final fit, and the first scored epoch after it at which its test
//! accuracy is back within the cell's seed spread of its final value; the delay is the gap, set
//! against 1 / (n·SNR²) over cells.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::results::{ResultRow, Stat};
use super::theory::{percentile_interval, permutation_p, spearman};
use super::verdict::NOISY_ETA;
use crate::train::metrics::EpochMetrics;

/// Resamples behind the correlation's interval, permutations behind its p-value.
const BOOTSTRAP: usize = 2000;
const PERMUTATIONS: usize = 10_000;

/// When a run's noisy labels were fitted and when its test accuracy came back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Delay {
    /// First epoch whose memorization is the run's final one.
    pub fitted: usize,
    /// First scored epoch from `fitted` on whose test accuracy is within `tolerance` of the final.
    pub back: usize,
}

impl Delay {
    pub fn epochs(&self) -> usize {
        self.back - self.fitted
    }
}

/// The run's delay; None without flipped labels, without fitting any, or without scored epochs.
pub fn delay(metrics: &[EpochMetrics], tolerance: f64) -> Option<Delay> {
    let last = metrics.last()?;
    let (final_memorization, final_test) = (last.memorization, last.test_acc?);
    // NaN: no flipped labels; 0: none fitted.
    if final_memorization.is_nan() || final_memorization <= 0.0 {
        return None;
    }
    let fitted = metrics
        .iter()
        .find(|m| m.memorization >= final_memorization - 1e-12)?
        .epoch;
    let back = metrics
        .iter()
        .filter(|m| m.epoch >= fitted)
        .find(|m| {
            m.test_acc
                .is_some_and(|t| (t - final_test).abs() <= tolerance + 1e-12)
        })?
        .epoch;
    Some(Delay { fitted, back })
}

/// The report's section: a row per (dataset, backbone, mode, n) whose η = 0.2 runs have their
/// metrics.jsonl and an n·SNR² estimate, and Spearman's ρ of the delay with 1 / (n·SNR²) per mode.
pub fn section(
    runs: &[(ResultRow, PathBuf)],
    read_metrics: &dyn Fn(&std::path::Path) -> Result<Vec<EpochMetrics>>,
) -> Result<String> {
    let mut md = String::new();
    writeln!(md, "### Delayed generalization\n")?;
    let mut cells: BTreeMap<CellKey, Vec<(&ResultRow, &PathBuf)>> = BTreeMap::new();
    for (row, dir) in runs {
        if (row.config.eta - NOISY_ETA).abs() < 1e-9 && row.snr.is_some() {
            let key = (
                row.mode(),
                row.dataset(),
                row.resolved.backbone.clone(),
                row.config.n,
            );
            cells.entry(key).or_default().push((row, dir));
        }
    }
    let Measured {
        lines,
        by_mode,
        without_metrics,
    } = measure(&cells, read_metrics);
    if lines.is_empty() {
        if without_metrics > 0 {
            writeln!(
                md,
                "No η = {NOISY_ETA} run with an n·SNR² estimate has its metrics.jsonl here \
                 ({without_metrics} runs without it: per-epoch metrics stay with the runs and are \
                 not committed), so no delay is measured.\n"
            )?;
        } else {
            writeln!(
                md,
                "No η = {NOISY_ETA} run with an n·SNR² estimate and its metrics fitted a flipped \
                 label: no delay to measure.\n"
            )?;
        }
        return Ok(md);
    }
    writeln!(
        md,
        "Per η = {NOISY_ETA} run: the epoch its memorization first reaches its final value, then \
         the first scored epoch from there whose test accuracy is within the cell's seed spread \
         (population std of the final test accuracies) of the run's final one; the delay is the \
         gap (mean ± std over seeds). The theorem has it grow like exp(1 / (n·SNR²)).\n"
    )?;
    writeln!(
        md,
        "| dataset | mode | n | 1 / (n·SNR²) | epoch fitted | delay (epochs) | runs |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    for line in &lines {
        writeln!(md, "{line}")?;
    }
    writeln!(md)?;
    correlation_table(&mut md, &by_mode)?;
    Ok(md)
}

/// What the cells' metrics gave: a table row per cell with a delay, the cells by mode, and how
/// many runs had no metrics.jsonl.
struct Measured {
    lines: Vec<String>,
    by_mode: BTreeMap<String, Vec<CellDelays>>,
    without_metrics: usize,
}

type CellKey = (String, String, String, usize);

/// Each cell's delays from its runs' metrics.jsonl.
fn measure(
    cells: &BTreeMap<CellKey, Vec<(&ResultRow, &PathBuf)>>,
    read_metrics: &dyn Fn(&std::path::Path) -> Result<Vec<EpochMetrics>>,
) -> Measured {
    let mut measured = Measured {
        lines: Vec::new(),
        by_mode: BTreeMap::new(),
        without_metrics: 0,
    };
    for ((mode, dataset, _, n), cell) in cells {
        let spread = Stat::of(cell.iter().map(|(r, _)| r.test_acc())).std;
        let mut delays = Vec::new();
        for (_, dir) in cell {
            match read_metrics(dir) {
                Ok(metrics) => delays.extend(delay(&metrics, spread)),
                Err(_) => measured.without_metrics += 1,
            }
        }
        if delays.is_empty() {
            continue;
        }
        let found = CellDelays {
            n_snr2: cell
                .iter()
                .filter_map(|(r, _)| r.snr.as_ref().map(|s| s.n_snr2))
                .collect(),
            delays: delays.iter().map(|d| d.epochs() as f64).collect(),
        };
        let epochs = Stat::of(found.delays.iter().copied());
        let fitted = Stat::of(delays.iter().map(|d| d.fitted as f64));
        measured.lines.push(format!(
            "| {dataset} | {mode} | {n} | {} | {:.0} | {:.0} ± {:.0} | {} |",
            inverse_text(found.inverse()),
            fitted.mean,
            epochs.mean,
            epochs.std,
            delays.len()
        ));
        measured
            .by_mode
            .entry(mode.clone())
            .or_default()
            .push(found);
    }
    measured
}

/// Spearman's ρ(1 / (n·SNR²), delay) per mode, with its interval and p-value.
fn correlation_table(md: &mut String, by_mode: &BTreeMap<String, Vec<CellDelays>>) -> Result<()> {
    writeln!(
        *md,
        "Spearman's ρ(1 / (n·SNR²), delay) over a mode's cells (a cell with no signal above the \
         floor has 1 / (n·SNR²) = ∞ and ranks last); 95 % interval from {BOOTSTRAP} resamples of \
         the cells, then of each drawn cell's seeds; two-sided permutation p-value \
         ({PERMUTATIONS} permutations). The theorem predicts ρ > 0.\n"
    )?;
    writeln!(*md, "| mode | cells | ρ | interval | p |")?;
    writeln!(*md, "|---|---|---|---|---|")?;
    for (mode, cells) in by_mode {
        let (inverse, delays) = means(cells);
        let (low, high) = bootstrap_rho(cells);
        writeln!(
            *md,
            "| {mode} | {} | {:+.2} | [{low:+.2}, {high:+.2}] | {:.3} |",
            cells.len(),
            spearman(&inverse, &delays),
            permutation_p(&inverse, &delays, PERMUTATIONS, 0)
        )?;
    }
    writeln!(*md)?;
    Ok(())
}

/// One cell's seeds: each one's n·SNR² (calibrated) and each measured delay.
#[derive(Clone, Debug, Default)]
struct CellDelays {
    n_snr2: Vec<f64>,
    delays: Vec<f64>,
}

impl CellDelays {
    /// 1 / (mean n·SNR²): ∞ where no seed has signal above its floor.
    fn inverse(&self) -> f64 {
        1.0 / Stat::of(self.n_snr2.iter().copied()).mean
    }

    fn mean_delay(&self) -> f64 {
        Stat::of(self.delays.iter().copied()).mean
    }

    fn resampled(&self, rng: &mut ChaCha8Rng) -> Self {
        let draw = |values: &[f64], rng: &mut ChaCha8Rng| -> Vec<f64> {
            (0..values.len())
                .map(|_| values[rng.random_range(0..values.len())])
                .collect()
        };
        Self {
            n_snr2: draw(&self.n_snr2, rng),
            delays: draw(&self.delays, rng),
        }
    }
}

fn inverse_text(inverse: f64) -> String {
    if inverse.is_finite() {
        format!("{inverse:.4}")
    } else {
        "∞ (no signal above the floor)".into()
    }
}

/// Per cell, 1 / (n·SNR²) and the mean delay.
fn means(cells: &[CellDelays]) -> (Vec<f64>, Vec<f64>) {
    cells.iter().map(|c| (c.inverse(), c.mean_delay())).unzip()
}

/// The 95 % interval of ρ over resamples of the cells, then of each drawn cell's seeds.
fn bootstrap_rho(cells: &[CellDelays]) -> (f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let draws = (0..BOOTSTRAP)
        .map(|_| {
            let drawn: Vec<CellDelays> = (0..cells.len())
                .map(|_| cells[rng.random_range(0..cells.len())].resampled(&mut rng))
                .collect();
            let (inverse, delays) = means(&drawn);
            spearman(&inverse, &delays)
        })
        .collect();
    percentile_interval(draws)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(epoch: usize, memorization: f64, test_acc: Option<f64>) -> EpochMetrics {
        EpochMetrics {
            epoch,
            train_loss: f64::NAN,
            train_eval_loss: f64::NAN,
            train_acc: 1.0,
            memorization,
            clean_train_acc: 1.0,
            max_cls_attention: 0.5,
            attention_entropy: 1.0,
            test_loss: test_acc.map(|_| 1.0),
            test_acc,
            qk_spectrum: None,
            rank_collapse: None,
        }
    }

    #[test]
    fn the_delay_runs_from_the_fit_to_the_test_accuracys_return() {
        // Fitted at epoch 20; test accuracy dips and is back within 0.01 of 0.90 at epoch 40.
        let metrics = [
            epoch(0, 0.0, Some(0.9)),
            epoch(10, 0.5, Some(0.85)),
            epoch(20, 1.0, Some(0.80)),
            epoch(30, 1.0, Some(0.86)),
            epoch(35, 1.0, None),
            epoch(40, 1.0, Some(0.895)),
            epoch(50, 1.0, Some(0.90)),
        ];
        let d = delay(&metrics, 0.01).unwrap();
        assert_eq!(
            d,
            Delay {
                fitted: 20,
                back: 40
            }
        );
        assert_eq!(d.epochs(), 20);
        // With no spread only the final value counts.
        assert_eq!(delay(&metrics, 0.0).unwrap().back, 50);
        // Nothing fitted: no delay.
        assert!(delay(&[epoch(0, 0.0, Some(0.9)), epoch(10, 0.0, Some(0.9))], 0.0).is_none());
    }

    #[test]
    fn the_delay_correlation_has_an_interval_and_a_p_value() {
        // Delays that grow with 1 / (n·SNR²) in every seed; the last cell has no signal.
        let cells: Vec<CellDelays> = [
            (100.0, 10.0),
            (50.0, 40.0),
            (10.0, 90.0),
            (5.0, 150.0),
            (0.0, 400.0),
        ]
        .iter()
        .map(|&(n_snr2, delay)| CellDelays {
            n_snr2: vec![n_snr2; 3],
            delays: vec![delay - 5.0, delay, delay + 5.0],
        })
        .collect();
        let (inverse, delays) = means(&cells);
        assert!(inverse[4].is_infinite());
        assert!((spearman(&inverse, &delays) - 1.0).abs() < 1e-12);
        let (low, high) = bootstrap_rho(&cells);
        assert!(
            low <= 1.0 && high >= low && high <= 1.0 + 1e-12,
            "{low} {high}"
        );
        // Five cells: the observed order is one of 120 (two-sided: 2 of 120).
        let p = permutation_p(&inverse, &delays, PERMUTATIONS, 0);
        assert!(p < 0.05, "{p}");
        assert_eq!(inverse_text(inverse[4]), "∞ (no signal above the floor)");
    }
}
