//! Correlations over cells of n·SNR² (or the SNR at fixed n) with memorization and with Δ: the
//! bootstrap over seeds and cells, and the markdown tables that show them.

use std::fmt::Write as _;

use anyhow::Result;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cells::{CellAndTwin, Point, modes, number, p_value};
use super::stats::{
    percentile_interval, permutation_p, pooled_rho, spearman, stratified_permutation_p,
};
use crate::report::results::Stat;

/// Bootstrap resamples behind each correlation's intervals.
pub(super) const BOOTSTRAP: usize = 2000;
/// Permutations behind each correlation's p-value.
pub(super) const PERMUTATIONS: usize = 10_000;

/// A correlation over cells, with two 95 % percentile intervals and a permutation p-value.
#[derive(Clone, Copy, Debug)]
pub struct Correlation {
    pub rho: f64,
    /// Resampling each cell's seeds only: how much the seeds' noise moves ρ.
    pub seeds: (f64, f64),
    /// Resampling the cells, then the seeds of each drawn cell: how much another set of cells
    /// would move it too.
    pub cells_and_seeds: (f64, f64),
    /// Two-sided, the cells' outcomes permuted against their n·SNR².
    pub p: f64,
    pub cells: usize,
}

/// (n·SNR², outcome) of each cell's means, the cells whose two are finite.
fn pairs(means: &[CellMeans], outcome: fn(&CellMeans) -> f64) -> (Vec<f64>, Vec<f64>) {
    means
        .iter()
        .map(|m| (m.n_snr2, outcome(m)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .unzip()
}

/// Spearman's ρ between the calibrated n·SNR² and `outcome` over `cells`, with its intervals and
/// p-value.
fn correlation(cells: &[CellSeeds], outcome: fn(&CellMeans) -> f64) -> Correlation {
    let means: Vec<CellMeans> = cells.iter().map(CellSeeds::means).collect();
    let (xs, ys) = pairs(&means, outcome);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let seeds_only = (0..BOOTSTRAP)
        .map(|_| {
            let drawn: Vec<CellMeans> = cells
                .iter()
                .map(|c| c.resampled(&mut rng).means())
                .collect();
            let (xs, ys) = pairs(&drawn, outcome);
            spearman(&xs, &ys)
        })
        .collect();
    let two_level = (0..BOOTSTRAP)
        .map(|_| {
            let drawn: Vec<CellMeans> = (0..cells.len())
                .map(|_| {
                    cells[rng.random_range(0..cells.len())]
                        .resampled(&mut rng)
                        .means()
                })
                .collect();
            let (xs, ys) = pairs(&drawn, outcome);
            spearman(&xs, &ys)
        })
        .collect();
    Correlation {
        rho: spearman(&xs, &ys),
        seeds: percentile_interval(seeds_only),
        cells_and_seeds: percentile_interval(two_level),
        p: permutation_p(&xs, &ys, PERMUTATIONS, 1),
        cells: xs.len(),
    }
}

/// What the bootstrap resamples of one cell: per η = 0.2 seed its calibrated n·SNR²,
/// memorization and test accuracy; per η = 0 seed its test accuracy.
#[derive(Clone, Debug)]
struct CellSeeds {
    noisy: Vec<(f64, f64, f64)>,
    clean: Vec<f64>,
}

struct CellMeans {
    n_snr2: f64,
    memorization: f64,
    /// Mean test accuracy at η = 0.2 minus at η = 0, percentage points.
    delta: f64,
}

impl CellSeeds {
    fn of(point: &Point) -> Self {
        Self {
            noisy: point
                .noisy
                .iter()
                .filter_map(|r| {
                    r.snr
                        .as_ref()
                        .map(|s| (s.n_snr2, r.memorization(), r.test_acc()))
                })
                .collect(),
            clean: point.clean.iter().map(|r| r.test_acc()).collect(),
        }
    }

    fn resampled(&self, rng: &mut ChaCha8Rng) -> Self {
        fn draw<T: Copy>(values: &[T], rng: &mut ChaCha8Rng) -> Vec<T> {
            (0..values.len())
                .map(|_| values[rng.random_range(0..values.len())])
                .collect()
        }
        Self {
            noisy: draw(&self.noisy, rng),
            clean: draw(&self.clean, rng),
        }
    }

    fn means(&self) -> CellMeans {
        let mean = |v: &mut dyn Iterator<Item = f64>| Stat::of(v).mean;
        CellMeans {
            n_snr2: mean(&mut self.noisy.iter().map(|s| s.0)),
            memorization: mean(&mut self.noisy.iter().map(|s| s.1)),
            delta: 100.0
                * (mean(&mut self.noisy.iter().map(|s| s.2))
                    - mean(&mut self.clean.iter().copied())),
        }
    }
}

pub(super) fn correlations(
    md: &mut String,
    cells: &[CellAndTwin],
    mode_order: &dyn Fn(&str) -> usize,
) -> Result<()> {
    writeln!(
        md,
        "Spearman's ρ over a mode's cells of the calibrated n·SNR² (mean over seeds) with the mean \
         memorization and with Δ. Two 95 % percentile intervals from {BOOTSTRAP} resamples each: \
         *seeds*, each cell's seeds drawn with replacement (η = 0 and η = 0.2 apart); *cells + \
         seeds*, the cells drawn with replacement and then each drawn cell's seeds. p: two-sided, \
         the cells' outcomes permuted against their n·SNR² ({PERMUTATIONS} permutations).\n\n\
         | mode | cells | ρ(n·SNR², memorization) | seeds | cells + seeds | p | ρ(n·SNR², Δ) | seeds | cells + seeds | p |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    )?;
    let show = |c: Correlation| {
        format!(
            "{} | [{}, {}] | [{}, {}] | {}",
            number(c.rho, 2),
            number(c.seeds.0, 2),
            number(c.seeds.1, 2),
            number(c.cells_and_seeds.0, 2),
            number(c.cells_and_seeds.1, 2),
            p_value(c.p)
        )
    };
    for mode in modes(cells.iter().map(|c| &c.point), mode_order) {
        let seeds: Vec<CellSeeds> = cells
            .iter()
            .filter(|c| c.point.row.mode == mode)
            .map(|c| CellSeeds::of(&c.point))
            .filter(|c| !c.noisy.is_empty())
            .collect();
        let memo = correlation(&seeds, |m| m.memorization);
        let delta = correlation(&seeds, |m| m.delta);
        writeln!(
            md,
            "| {mode} | {} | {} | {} |",
            memo.cells,
            show(memo),
            show(delta)
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// At one n, n·SNR² is SNR² times a constant: a correlation there cannot come from n alone.
pub(super) fn fixed_n_correlations(
    md: &mut String,
    cells: &[CellAndTwin],
    mode_order: &dyn Fn(&str) -> usize,
) -> Result<()> {
    writeln!(
        md,
        "At fixed n: Spearman's ρ of the calibrated SNR (mean over seeds) with the mean \
         memorization and with Δ among a mode's cells of one n; *pooled*, the cell-weighted mean \
         of those ρ, with a two-sided p-value from {PERMUTATIONS} permutations of the outcomes \
         within each n only (so that n cannot carry it).\n\n\
         | mode | n | cells | ρ(SNR, memorization) | ρ(SNR, Δ) |\n|---|---|---|---|---|"
    )?;
    for mode in modes(cells.iter().map(|c| &c.point), mode_order) {
        let mut xs = Vec::new();
        let (mut memo, mut delta, mut strata) = (Vec::new(), Vec::new(), Vec::new());
        for cell in cells.iter().filter(|c| c.point.row.mode == mode) {
            let means = CellSeeds::of(&cell.point).means();
            if cell.estimate.snr.is_finite()
                && means.memorization.is_finite()
                && means.delta.is_finite()
            {
                xs.push(cell.estimate.snr);
                memo.push(means.memorization);
                delta.push(means.delta);
                strata.push(cell.point.row.n);
            }
        }
        let mut ns = strata.clone();
        ns.sort_unstable();
        ns.dedup();
        for n in &ns {
            let pick = |v: &[f64]| -> Vec<f64> {
                (0..v.len())
                    .filter(|&i| strata[i] == *n)
                    .map(|i| v[i])
                    .collect()
            };
            writeln!(
                md,
                "| {mode} | {n} | {} | {} | {} |",
                pick(&xs).len(),
                number(spearman(&pick(&xs), &pick(&memo)), 2),
                number(spearman(&pick(&xs), &pick(&delta)), 2)
            )?;
        }
        let pooled = |ys: &[f64]| {
            format!(
                "{} (p {})",
                number(pooled_rho(&xs, ys, &strata), 2),
                p_value(stratified_permutation_p(&xs, ys, &strata, PERMUTATIONS, 2))
            )
        };
        writeln!(
            md,
            "| {mode} | pooled | {} | {} | {} |",
            xs.len(),
            pooled(&memo),
            pooled(&delta)
        )?;
    }
    writeln!(md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_intervals_hold_the_estimate_and_narrow_without_seed_spread() {
        // Five cells whose memorization falls with n·SNR², three seeds each.
        let cells: Vec<CellSeeds> = (0..5)
            .map(|k| {
                let x = 10f64.powi(k);
                CellSeeds {
                    noisy: vec![(x, 1.0 - 0.1 * k as f64, 0.9); 3],
                    clean: vec![0.9; 3],
                }
            })
            .collect();
        let c = correlation(&cells, |m| m.memorization);
        assert_eq!(c.cells, 5);
        assert!((c.rho + 1.0).abs() < 1e-12);
        assert!((c.seeds.0 + 1.0).abs() < 1e-12 && (c.seeds.1 + 1.0).abs() < 1e-12);
        // Drawing cells again keeps a perfect monotone relation perfect (ties aside).
        assert!((c.cells_and_seeds.1 + 1.0).abs() < 1e-12);
        // 5! orders, two reach |ρ| = 1: p ≈ 2/120.
        assert!(c.p < 0.05, "{}", c.p);
    }
}
