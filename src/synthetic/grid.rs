//! The Fig. 5 grid's axes (docs/protocol.md §2.7) and the row each of its cells ends with: what a
//! sweep computes ([`super::sweep`]) and what its record on disk holds ([`super::cells`]).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::model::Regime;

/// The authors' axes: 39 values each.
pub const EMBED_DIMS: (usize, usize, usize) = (250, 125, 39);
pub const SIGNAL_NORMS: (f64, f64, usize) = (5.0, 2.5, 39);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GridSize {
    /// All 39 × 39 = 1521 cells.
    Full,
    /// 9 × 9 cells, evenly spread over the full grid's indices (a subset of it).
    Coarse,
}

impl GridSize {
    fn indices(self) -> Vec<usize> {
        match self {
            GridSize::Full => (0..39).collect(),
            // round(k · 38 / 8), k = 0..8: both ends and seven evenly spaced cells between.
            GridSize::Coarse => (0..9)
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
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub signal_norm: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub snr: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub train_loss: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub test_loss: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub train_acc: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub test_acc: f64,
    pub noisy_fitted: usize,
    pub noisy_total: usize,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub clean_x1_prob: f64,
    pub regime: Regime,
    /// Final mean attention entropy of clean and of noisy training samples.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub clean_entropy: f64,
    pub noisy_entropy: Option<f64>,
    /// W's symmetric-part eigen-mean and -variance at the end and at initialisation (empty unless
    /// the sweep ran with `Trace::FinalWithSpectrum`).
    pub qk_sym_mean: Option<f64>,
    pub qk_sym_var: Option<f64>,
    pub qk_sym_var_init: Option<f64>,
}

impl SweepRow {
    /// Why this row cannot be the final state of a run of `config` (a cell file edited by hand,
    /// or written by another program), if it cannot: the cell's coordinates and SNR must be the
    /// config's, rates must lie in [0, 1], counts within the training set, losses and entropies
    /// non-negative, and the spectrum present exactly when the sweep records it.
    pub fn contradiction(&self, config: &SyntheticConfig, with_spectrum: bool) -> Option<String> {
        let same = |a: f64, b: f64| a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        let rate = |v: f64| v.is_nan() || (0.0..=1.0).contains(&v);
        let non_negative = |v: f64| v.is_nan() || v >= 0.0;
        let checks = [
            (
                self.embed_dim == config.embed_dim,
                "row.embed_dim is not the cell's d",
            ),
            (
                same(self.signal_norm, config.signal_norm),
                "row.signal_norm is not the cell's ‖μ‖",
            ),
            (
                same(self.snr, config.snr()),
                "row.snr is not the SNR of the cell's config",
            ),
            (
                rate(self.train_acc) && rate(self.test_acc) && rate(self.clean_x1_prob),
                "an accuracy or probability outside [0, 1]",
            ),
            (
                self.noisy_fitted <= self.noisy_total && self.noisy_total <= config.train_n,
                "noisy_fitted > noisy_total, or noisy_total > the cell's train_n",
            ),
            (
                non_negative(self.train_loss)
                    && non_negative(self.test_loss)
                    && non_negative(self.clean_entropy)
                    && self.noisy_entropy.is_none_or(non_negative),
                "a negative loss or entropy",
            ),
            (
                self.qk_sym_mean.is_some() == with_spectrum
                    && self.qk_sym_var.is_some() == with_spectrum
                    && self.qk_sym_var_init.is_some() == with_spectrum,
                "the spectrum columns do not match the sweep (present exactly in a localization sweep)",
            ),
        ];
        checks
            .into_iter()
            .find(|(holds, _)| !holds)
            .map(|(_, why)| why.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_match_the_authors_axes() {
        let d = GridSize::Full.embed_dims();
        assert_eq!((d.len(), d[0], d[38]), (39, 250, 5000));
        let mu = GridSize::Full.signal_norms();
        assert_eq!((mu.len(), mu[0], mu[38]), (39, 5.0, 100.0));
        let coarse = GridSize::Coarse.embed_dims();
        assert_eq!(coarse.len(), 9);
        assert_eq!((coarse[0], coarse[8]), (250, 5000));
        assert!(coarse.iter().all(|v| d.contains(v)));
        assert!(
            GridSize::Coarse
                .signal_norms()
                .iter()
                .all(|v| mu.contains(v))
        );
    }
}
