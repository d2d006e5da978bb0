//! The verdict cells on the n·SNR² axis: each cell's runs, its estimates over seeds, what the
//! section knows of it once its twin is judged, and small helpers shared by the section's writers.

use super::twins::{TwinCall, boundaries};
use crate::diagnostics::snr::SnrEstimate;
use crate::report::results::{ResultRow, Stat};
use crate::report::verdict::{CellOutcome, NOISY_ETA, VerdictRow};
use crate::synthetic::{Regime, SyntheticConfig};

/// One verdict cell on the n·SNR² axis.
pub(super) struct Point<'a> {
    pub(super) row: &'a VerdictRow,
    /// The cell's runs at η = 0 and at η = 0.2 (η-siblings share their estimate).
    pub(super) clean: Vec<&'a ResultRow>,
    pub(super) noisy: Vec<&'a ResultRow>,
}

impl Point<'_> {
    /// One estimate per seed: the η = 0.2 runs', else the η = 0 runs'.
    pub(super) fn seed_estimates(&self) -> Vec<&SnrEstimate> {
        let runs = if self.noisy.iter().any(|r| r.snr.is_some()) {
            &self.noisy
        } else {
            &self.clean
        };
        runs.iter().filter_map(|r| r.snr.as_ref()).collect()
    }

    pub(super) fn call(&self) -> Option<&crate::report::verdict::VerdictCall> {
        match &self.row.ours {
            CellOutcome::Called(call) => Some(call),
            CellOutcome::Missing(_) => None,
        }
    }

    pub(super) fn verdict(&self) -> Option<String> {
        self.call().map(|c| c.verdict.name().to_string())
    }

    pub(super) fn label(&self) -> String {
        format!("{} {} n {}", self.row.dataset, self.row.mode, self.row.n)
    }
}

pub(super) fn points<'a>(rows: &'a [ResultRow], verdict_rows: &'a [VerdictRow]) -> Vec<Point<'a>> {
    verdict_rows
        .iter()
        .map(|v| {
            let runs = |eta: f64| -> Vec<&ResultRow> {
                rows.iter()
                    .filter(|r| {
                        r.dataset() == v.dataset
                            && r.resolved.backbone == v.backbone
                            && r.mode() == v.mode
                            && r.config.n == v.n
                            && (r.config.eta - eta).abs() < 1e-9
                    })
                    .collect()
            };
            Point {
                row: v,
                clean: runs(0.0),
                noisy: runs(NOISY_ETA),
            }
        })
        .collect()
}

/// A cell's estimates summarised over its seeds.
#[derive(Clone, Debug)]
pub(super) struct CellEstimate {
    pub(super) seeds: usize,
    /// Seeds whose raw value rises above their permutation floor.
    pub(super) above: usize,
    pub(super) raw: Stat,
    /// Mean over seeds of the floor's mean and of its 95th percentile.
    pub(super) floor_mean: f64,
    pub(super) floor_q95: f64,
    /// The calibrated n·SNR² (0 for a seed not above its floor), mean ± std over seeds.
    pub(super) calibrated: Stat,
    /// Smallest seed and largest seed of the calibrated value.
    pub(super) calibrated_range: (f64, f64),
    /// The lowest lower end and the highest upper end of the seeds' bootstrap intervals: what
    /// every seed's interval allows together.
    pub(super) interval: [f64; 2],
    /// The calibrated SNR, mean over seeds.
    pub(super) snr: f64,
    pub(super) effective_dim: f64,
    pub(super) embed_dim: usize,
    pub(super) mean_tokens: f64,
}

impl CellEstimate {
    pub(super) fn of(estimates: &[&SnrEstimate]) -> Option<Self> {
        let first = estimates.first()?;
        let mean = |f: fn(&SnrEstimate) -> f64| Stat::of(estimates.iter().map(|e| f(e))).mean;
        let calibrated: Vec<f64> = estimates.iter().map(|e| e.n_snr2).collect();
        let fold = |init: f64, pick: fn(f64, f64) -> f64, end: usize| {
            estimates
                .iter()
                .map(|e| e.n_snr2_interval[end])
                .fold(init, pick)
        };
        Some(Self {
            seeds: estimates.len(),
            above: estimates.iter().filter(|e| e.above_floor()).count(),
            raw: Stat::of(estimates.iter().map(|e| e.raw_n_snr2)),
            floor_mean: mean(|e| e.floor.mean),
            floor_q95: mean(|e| e.floor.q95),
            calibrated: Stat::of(calibrated.iter().copied()),
            calibrated_range: (
                calibrated.iter().copied().fold(f64::INFINITY, f64::min),
                calibrated.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ),
            interval: [fold(f64::INFINITY, f64::min, 0), fold(0.0, f64::max, 1)],
            snr: mean(|e| e.snr),
            effective_dim: mean(|e| e.effective_dim),
            embed_dim: first.embed_dim,
            mean_tokens: mean(|e| e.mean_tokens),
        })
    }

    /// Whether any seed rises above its floor (else the cell carries no measured signal).
    pub(super) fn has_signal(&self) -> bool {
        self.above > 0 && self.snr > 0.0
    }

    /// The twin's d: the noise's effective dimension (the directions it actually spreads in),
    /// at least 2; d itself where too few samples left it unknown.
    pub(super) fn twin_dim(&self) -> usize {
        if self.effective_dim.is_finite() {
            (self.effective_dim.round() as usize).max(2)
        } else {
            self.embed_dim
        }
    }

    /// The calibrated value as the table shows it: a bound where no seed rises above the floor.
    pub(super) fn calibrated_text(&self) -> String {
        if self.above == 0 {
            format!("not above floor, ≤ {:.2}", self.interval[1])
        } else {
            format!("{:.2} ± {:.2}", self.calibrated.mean, self.calibrated.std)
        }
    }
}

/// What the section knows of one cell once its synthetic runs are made.
pub(super) struct CellAndTwin<'a> {
    pub(super) point: Point<'a>,
    pub(super) estimate: CellEstimate,
    /// The base twin's setting (at the cell's SNR, or at SNR 1 where there is none: its line
    /// only needs the rest).
    pub(super) base: SyntheticConfig,
    pub(super) twin: TwinCall,
    /// The regime along the cell's own line; a run that failed is left out.
    pub(super) line: Vec<(f64, Regime)>,
}

impl CellAndTwin<'_> {
    pub(super) fn edges(&self) -> Vec<(f64, Regime, Regime)> {
        boundaries(&self.line)
    }
}

/// A value, or "–" where it is undefined.
pub(super) fn number(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:+.decimals$}")
    } else {
        "–".into()
    }
}

/// A p-value to four places; "–" where there is none (too few cells to permute).
pub(super) fn p_value(p: f64) -> String {
    if p.is_finite() {
        format!("{p:.4}")
    } else {
        "–".into()
    }
}

pub(super) fn dedup<'a>(items: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut seen: Vec<&String> = items.collect();
    seen.sort();
    seen.dedup();
    seen
}

pub(super) fn modes<'a, 'b: 'a>(
    points: impl Iterator<Item = &'a Point<'b>>,
    mode_order: &dyn Fn(&str) -> usize,
) -> Vec<&'a str> {
    let mut modes: Vec<&str> = points.map(|p| p.row.mode.as_str()).collect();
    modes.sort_by_key(|m| (mode_order(m), m.to_string()));
    modes.dedup();
    modes
}
