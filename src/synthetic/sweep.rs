//! The Fig. 5 grid (docs/protocol.md §2.7): d ∈ {250, 375, …, 5000} × ‖μ‖ ∈ {5, 7.5, …, 100}, one full run
//! per cell at the other hyper-parameters, cells spread over all cores.

use anyhow::{Context, Result};
use clap::ValueEnum;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::engine::EngineKind;
use super::model::Regime;
use super::train::{Trace, run};

/// The authors' axes: 39 values each.
pub const EMBED_DIMS: (usize, usize, usize) = (250, 125, 39);
pub const SIGNAL_NORMS: (f64, f64, usize) = (5.0, 2.5, 39);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Grid {
    /// All 39 × 39 = 1521 cells.
    Full,
    /// 9 × 9 cells, evenly spread over the full grid's indices (a subset of it).
    Coarse,
}

impl Grid {
    fn indices(self) -> Vec<usize> {
        match self {
            Grid::Full => (0..39).collect(),
            // round(k · 38 / 8), k = 0..8: both ends and seven evenly spaced cells between.
            Grid::Coarse => (0..9)
                .map(|k| ((k as f64) * 38.0 / 8.0).round() as usize)
                .collect(),
        }
    }

    pub fn embed_dims(self) -> Vec<usize> {
        let (start, step, _) = EMBED_DIMS;
        self.indices()
            .into_iter()
            .map(|i| start + step * i)
            .collect()
    }

    pub fn signal_norms(self) -> Vec<f64> {
        let (start, step, _) = SIGNAL_NORMS;
        self.indices()
            .into_iter()
            .map(|i| start + step * i as f64)
            .collect()
    }
}

/// One cell of the grid: the final state of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepRow {
    pub embed_dim: usize,
    pub signal_norm: f64,
    pub snr: f64,
    pub train_loss: f64,
    pub test_loss: f64,
    pub train_acc: f64,
    pub test_acc: f64,
    pub noisy_fitted: usize,
    pub noisy_total: usize,
    pub clean_x1_prob: f64,
    pub regime: Regime,
    /// Final mean attention entropy of clean and of noisy training samples.
    pub clean_entropy: f64,
    pub noisy_entropy: Option<f64>,
    /// W's symmetric-part eigen-mean and -variance at the end and at initialisation (empty unless
    /// the sweep ran with `Trace::FinalWithSpectrum`).
    pub qk_sym_mean: Option<f64>,
    pub qk_sym_var: Option<f64>,
    pub qk_sym_var_init: Option<f64>,
}

/// Runs every cell of `grid` with `base`'s other hyper-parameters, each with `trace`
/// (`FinalOnly` or `FinalWithSpectrum`). Rows come back ordered by (d, ‖μ‖). `on_done` is called
/// once per finished cell, from any thread.
pub fn sweep(
    base: &SyntheticConfig,
    grid: Grid,
    engine: EngineKind,
    trace: Trace,
    on_done: &(dyn Fn() + Sync),
) -> Result<Vec<SweepRow>> {
    let cells: Vec<(usize, f64)> = grid
        .embed_dims()
        .into_iter()
        .flat_map(|d| grid.signal_norms().into_iter().map(move |mu| (d, mu)))
        .collect();
    // Largest d first so that the slowest cells do not straggle at the end.
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(cells[k].0));
    let mut rows: Vec<(usize, SweepRow)> = order
        .into_par_iter()
        .map(|k| {
            let (embed_dim, signal_norm) = cells[k];
            let config = SyntheticConfig {
                embed_dim,
                signal_norm,
                ..base.clone()
            };
            let result = run(&config, engine, trace, &mut |_| {})
                .with_context(|| format!("grid cell d = {embed_dim}, ‖μ‖ = {signal_norm}"))?;
            on_done();
            let s = result.summary;
            Ok((
                k,
                SweepRow {
                    embed_dim,
                    signal_norm,
                    snr: s.snr,
                    train_loss: s.train_loss,
                    test_loss: s.test_loss,
                    train_acc: s.train_acc,
                    test_acc: s.test_acc,
                    noisy_fitted: s.noisy_fitted,
                    noisy_total: s.noisy_total,
                    clean_x1_prob: s.clean_x1_prob,
                    regime: s.regime,
                    clean_entropy: s.clean_entropy,
                    noisy_entropy: s.noisy_entropy,
                    qk_sym_mean: s.qk_symmetric.map(|q| q.mean),
                    qk_sym_var: s.qk_symmetric.map(|q| q.var),
                    qk_sym_var_init: s.qk_symmetric_init.map(|q| q.var),
                },
            ))
        })
        .collect::<Result<_>>()?;
    rows.sort_by_key(|(k, _)| *k);
    Ok(rows.into_iter().map(|(_, row)| row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_match_the_authors_axes() {
        let d = Grid::Full.embed_dims();
        assert_eq!((d.len(), d[0], d[38]), (39, 250, 5000));
        let mu = Grid::Full.signal_norms();
        assert_eq!((mu.len(), mu[0], mu[38]), (39, 5.0, 100.0));
        let coarse = Grid::Coarse.embed_dims();
        assert_eq!(coarse.len(), 9);
        assert_eq!((coarse[0], coarse[8]), (250, 5000));
        assert!(coarse.iter().all(|v| d.contains(v)));
        assert!(Grid::Coarse.signal_norms().iter().all(|v| mu.contains(v)));
    }
}
