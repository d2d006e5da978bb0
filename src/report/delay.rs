//! Delayed generalization: the theorem's time before a benign run generalises again grows like
//! exp(1 / (n·SNR²)) (docs/protocol.md §2). From each η = 0.2 run's metrics.jsonl: the epoch its
//! noisy labels reach their final fit, and the first scored epoch after it at which its test
//! accuracy is back within the cell's seed spread of its final value; the delay is the gap, set
//! against 1 / (n·SNR²) over cells.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Result;

use super::results::{ResultRow, Stat};
use super::theory::spearman;
use super::verdict::NOISY_ETA;
use crate::train::metrics::EpochMetrics;

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
    type Key = (String, String, String, usize);
    let mut cells: BTreeMap<Key, Vec<(&ResultRow, &PathBuf)>> = BTreeMap::new();
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
    let mut lines = Vec::new();
    let mut by_mode: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut without_metrics = 0;
    for ((mode, dataset, _, n), cell) in &cells {
        let spread = Stat::of(cell.iter().map(|(r, _)| r.test_acc())).std;
        let mut delays = Vec::new();
        for (_, dir) in cell {
            match read_metrics(dir) {
                Ok(metrics) => delays.extend(delay(&metrics, spread)),
                Err(_) => without_metrics += 1,
            }
        }
        if delays.is_empty() {
            continue;
        }
        let inverse = 1.0
            / Stat::of(
                cell.iter()
                    .filter_map(|(r, _)| r.snr.as_ref().map(|s| s.n_snr2)),
            )
            .mean;
        let epochs = Stat::of(delays.iter().map(|d| d.epochs() as f64));
        let fitted = Stat::of(delays.iter().map(|d| d.fitted as f64));
        lines.push(format!(
            "| {dataset} | {mode} | {n} | {inverse:.4} | {:.0} | {:.0} ± {:.0} | {} |",
            fitted.mean,
            epochs.mean,
            epochs.std,
            delays.len()
        ));
        let pairs = by_mode.entry(mode.clone()).or_default();
        pairs.0.push(inverse);
        pairs.1.push(epochs.mean);
    }
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
    for (mode, (inverse, delays)) in &by_mode {
        writeln!(
            md,
            "{mode}: Spearman's ρ(1 / (n·SNR²), delay) = {:+.2} over {} cells.",
            spearman(inverse, delays),
            inverse.len()
        )?;
    }
    writeln!(md)?;
    Ok(md)
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
}
