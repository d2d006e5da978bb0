//! One SNR² per (dataset, backbone, mode), pooled over every seed and size of the grid (issue 74,
//! item 2): a cell's n·SNR² is then n times it, not its own seeds' noisy, floor-clipped mean.
//!
//! Pooled as Σ (raw − floor mean) / Σ n over the group's estimates: each term is an unbiased
//! estimate of n·SNR² (the floor's mean is the estimator's value with no signal), so seeds below
//! their floor enter with what they measured instead of a zero, and the larger n weigh more, as
//! their lower relative noise deserves. Beside it the same with σ taken from the other tokens
//! instead of the relevant ones (design.md, "Which σ"), and the class count K, which the review
//! found to carry the fixed-n correlation on its own; the correlations are given within n and
//! within (n, K), where only datasets of one class count are compared.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cells::{Point, modes, number, p_value};
use super::correlation::{BOOTSTRAP, PERMUTATIONS};
use super::stats::{
    percentile_interval, permutation_p_of, pooled_rho, spearman, stratified_permutation_p,
};
use crate::diagnostics::snr::{SnrEstimate, VALIDATED_FROM_LIMITS};
use crate::report::results::{ResultRow, Stat};

/// The pooled SNR² of one (dataset, backbone, mode).
#[derive(Clone, Debug, PartialEq)]
pub struct PooledSnr {
    pub dataset: String,
    pub backbone: String,
    pub mode: String,
    /// Classes (the most any estimate of the group saw).
    pub classes: usize,
    /// Estimates pooled (seeds × sizes).
    pub estimates: usize,
    /// Σ (raw − floor mean) / Σ n, σ from the relevant tokens (may be ≤ 0: no signal).
    pub snr2: f64,
    /// 2.5–97.5 % over resamples of the group's estimates.
    pub interval: (f64, f64),
    /// The same with σ from the other tokens.
    pub other_sigma_snr2: f64,
    /// The mean [`selection_limit`](crate::diagnostics::snr::selection_limit) of the group's
    /// estimates (their T and d).
    pub selection_limit: f64,
}

impl PooledSnr {
    pub fn n_snr2(&self, n: usize) -> f64 {
        n as f64 * self.snr2
    }

    pub fn has_signal(&self) -> bool {
        self.snr2 > 0.0
    }

    /// Whether the pooled SNR lies where the planted-signal curve validates the estimate
    /// ([`VALIDATED_FROM_LIMITS`] selection limits and above).
    pub fn in_validated_range(&self) -> bool {
        self.has_signal() && self.snr2.sqrt() >= VALIDATED_FROM_LIMITS * self.selection_limit
    }
}

/// Σ (raw − floor) · scale / Σ n over `estimates`, `scale` the σ² ratio of a σ choice.
fn pool(estimates: &[&SnrEstimate], scale: fn(&SnrEstimate) -> f64) -> f64 {
    let signal: f64 = estimates
        .iter()
        .map(|e| (e.raw_n_snr2 - e.floor.mean) * scale(e))
        .sum();
    let samples: usize = estimates.iter().map(|e| e.samples).sum();
    signal / samples as f64
}

/// (noise_norm / other_noise_norm)²: n·SNR² on the other tokens' σ over that on the relevant ones'.
fn other_sigma(e: &SnrEstimate) -> f64 {
    (e.noise_norm / e.other_noise_norm).powi(2)
}

/// The pooled SNR² of one group's estimates.
pub fn pooled_of(key: (&str, &str, &str), estimates: &[&SnrEstimate]) -> PooledSnr {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let draws = (0..BOOTSTRAP)
        .map(|_| {
            let drawn: Vec<&SnrEstimate> = (0..estimates.len())
                .map(|_| estimates[rng.random_range(0..estimates.len())])
                .collect();
            pool(&drawn, |_| 1.0)
        })
        .collect();
    PooledSnr {
        dataset: key.0.to_string(),
        backbone: key.1.to_string(),
        mode: key.2.to_string(),
        classes: estimates.iter().map(|e| e.classes).max().unwrap_or(0),
        estimates: estimates.len(),
        snr2: pool(estimates, |_| 1.0),
        interval: percentile_interval(draws),
        other_sigma_snr2: pool(estimates, other_sigma),
        selection_limit: estimates.iter().map(|e| e.selection_limit()).sum::<f64>()
            / estimates.len().max(1) as f64,
    }
}

/// One pooled SNR² per (dataset, backbone, mode) of `points`, in the points' order.
pub(super) fn pooled(points: &[&Point]) -> Vec<PooledSnr> {
    let mut groups: BTreeMap<(String, String, String), Vec<&SnrEstimate>> = BTreeMap::new();
    let mut order = Vec::new();
    for point in points {
        let key = (
            point.row.dataset.clone(),
            point.row.backbone.clone(),
            point.row.mode.clone(),
        );
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups
            .entry(key)
            .or_default()
            .extend(point.seed_estimates());
    }
    order
        .iter()
        .filter(|key| !groups[*key].is_empty())
        .map(|key| pooled_of((&key.0, &key.1, &key.2), &groups[key]))
        .collect()
}

/// The group of `point` in `pooled`.
pub(super) fn of_point<'a>(pooled: &'a [PooledSnr], point: &Point) -> Option<&'a PooledSnr> {
    pooled.iter().find(|p| {
        p.dataset == point.row.dataset
            && p.backbone == point.row.backbone
            && p.mode == point.row.mode
    })
}

fn plain(value: f64, decimals: usize) -> String {
    format!("{value:.decimals$}")
}

/// The table of pooled values, n·SNR² at each n of the grid.
pub(super) fn pooled_table(md: &mut String, pooled: &[PooledSnr], ns: &[usize]) -> Result<()> {
    writeln!(
        md,
        "### One SNR² per dataset, backbone and mode\n\n\
         Pooled over every seed and size: SNR² = Σ (raw − floor mean) / Σ n over the group's \
         estimates (each term an unbiased n·SNR², a seed below its floor entering with what it \
         measured, not a zero), its 95 % interval over {BOOTSTRAP} resamples of the estimates; \
         a cell's n·SNR² is n times it. *Other σ*: the same with σ from the other tokens instead \
         of the relevant ones (their ratio is how much that choice moves every n·SNR²). K: the \
         class count. *S\\**: the selection limit √(2 ln(T − 1) / d) at the group's T and d; the \
         planted-signal curve (results/snr-plant) validates the estimate (±20 %) only from \
         {VALIDATED_FROM_LIMITS}·S\\* up, so an SNR below that (*validated*: no) is a reading in \
         the range where a planted signal of that size reads low or nothing.\n"
    )?;
    let heads: String = ns.iter().map(|n| format!(" n·SNR² at n {n} |")).collect();
    let rule: String = ns.iter().map(|_| "---|").collect();
    writeln!(
        md,
        "| dataset | mode | K | estimates | SNR² [95 %] | other σ (× relevant) | SNR | S\\* | validated |{heads}\n\
         |---|---|---|---|---|---|---|---|---|{rule}"
    )?;
    for p in pooled {
        let at: String = ns
            .iter()
            .map(|&n| format!(" {} |", plain(p.n_snr2(n), 1)))
            .collect();
        writeln!(
            md,
            "| {} | {} | {} | {} | {} [{}, {}] | {} (× {}) | {} | {} | {} |{at}",
            p.dataset,
            p.mode,
            p.classes,
            p.estimates,
            plain(p.snr2, 4),
            plain(p.interval.0, 4),
            plain(p.interval.1, 4),
            plain(p.other_sigma_snr2, 4),
            plain(p.other_sigma_snr2 / p.snr2, 2),
            plain(p.snr2.max(0.0).sqrt(), 3),
            plain(p.selection_limit, 3),
            if p.in_validated_range() { "yes" } else { "no" }
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// The pooled values, their table and the correlations on them (markdown into `md`).
pub(super) fn pooled_section(
    md: &mut String,
    points: &[&Point],
    mode_order: &dyn Fn(&str) -> usize,
) -> Result<()> {
    let groups = pooled(points);
    let mut ns: Vec<usize> = points.iter().map(|p| p.row.n).collect();
    ns.sort_unstable();
    ns.dedup();
    pooled_table(md, &groups, &ns)?;
    writeln!(
        md,
        "On the pooled values: Spearman's ρ with the mean memorization and with Δ, pooled over \
         strata with a two-sided p from {PERMUTATIONS} permutations within each stratum: within \
         n (so that n cannot carry it); the same with the class count K partialled out (Spearman \
         partial correlation within each n, the same permutations); and K's own ρ within n.\n\n{CORRELATION_HEAD}"
    )?;
    for mode in modes(points.iter().copied(), mode_order) {
        let cells: Vec<PooledCell> = points
            .iter()
            .filter(|p| p.row.mode == mode)
            .filter_map(|p| of_point(&groups, p).map(|g| PooledCell::of(p, g)))
            .collect();
        writeln!(md, "{}", correlation_row(mode, &cells))?;
    }
    writeln!(md)?;
    Ok(())
}

/// One cell of the correlations: its pooled n·SNR², K, n and its seeds' outcomes.
pub(super) struct PooledCell {
    pub(super) n_snr2: f64,
    pub(super) classes: usize,
    pub(super) n: usize,
    pub(super) memorization: f64,
    /// Percentage points.
    pub(super) delta: f64,
}

impl PooledCell {
    pub(super) fn of(point: &Point, pooled: &PooledSnr) -> Self {
        let mean = |runs: &[&ResultRow], f: fn(&ResultRow) -> f64| {
            Stat::of(runs.iter().map(|r| f(r))).mean
        };
        Self {
            n_snr2: pooled.n_snr2(point.row.n),
            classes: pooled.classes,
            n: point.row.n,
            memorization: mean(&point.noisy, ResultRow::memorization),
            delta: 100.0
                * (mean(&point.noisy, |r| r.test_acc()) - mean(&point.clean, |r| r.test_acc())),
        }
    }
}

/// ρ pooled within strata, with its permutation p, as a table entry.
fn within(xs: &[f64], ys: &[f64], strata: &[usize]) -> String {
    format!(
        "{} (p {})",
        number(pooled_rho(xs, ys, strata), 2),
        p_value(stratified_permutation_p(xs, ys, strata, PERMUTATIONS, 3))
    )
}

/// Spearman's ρ(x, y) with K partialled out, (r_xy − r_xK r_yK) / √((1 − r_xK²)(1 − r_yK²)),
/// within each stratum, cell-weighted over strata (those where it is undefined left out).
fn partial_rho(xs: &[f64], ys: &[f64], ks: &[f64], strata: &[usize]) -> f64 {
    let mut labels = strata.to_vec();
    labels.sort_unstable();
    labels.dedup();
    let (mut sum, mut weight) = (0.0, 0.0);
    for label in labels {
        let pick = |v: &[f64]| -> Vec<f64> {
            (0..v.len())
                .filter(|&i| strata[i] == label)
                .map(|i| v[i])
                .collect()
        };
        let (x, y, k) = (pick(xs), pick(ys), pick(ks));
        let (rxy, rxk, ryk) = (spearman(&x, &y), spearman(&x, &k), spearman(&y, &k));
        let rho = (rxy - rxk * ryk) / ((1.0 - rxk * rxk) * (1.0 - ryk * ryk)).sqrt();
        if rho.is_finite() {
            sum += rho * x.len() as f64;
            weight += x.len() as f64;
        }
    }
    if weight > 0.0 { sum / weight } else { f64::NAN }
}

/// [`partial_rho`] with a two-sided p from permutations of `ys` within strata.
fn partial_within(xs: &[f64], ys: &[f64], ks: &[f64], strata: &[usize]) -> String {
    let statistic = |ys: &[f64]| partial_rho(xs, ys, ks, strata);
    let observed = statistic(ys);
    if !observed.is_finite() {
        return "–".into();
    }
    let p = permutation_p_of(&statistic, ys, strata, PERMUTATIONS, 5);
    format!("{} (p {})", number(observed, 2), p_value(p))
}

/// One mode's row of the correlation table.
pub(super) fn correlation_row(mode: &str, cells: &[PooledCell]) -> String {
    let cells: Vec<&PooledCell> = cells
        .iter()
        .filter(|c| c.n_snr2.is_finite() && c.memorization.is_finite() && c.delta.is_finite())
        .collect();
    let xs: Vec<f64> = cells.iter().map(|c| c.n_snr2).collect();
    let ks: Vec<f64> = cells.iter().map(|c| c.classes as f64).collect();
    let memo: Vec<f64> = cells.iter().map(|c| c.memorization).collect();
    let delta: Vec<f64> = cells.iter().map(|c| c.delta).collect();
    let by_n: Vec<usize> = cells.iter().map(|c| c.n).collect();
    format!(
        "| {mode} | {} | {} | {} | {} | {} | {} | {} |",
        cells.len(),
        within(&xs, &memo, &by_n),
        partial_within(&xs, &memo, &ks, &by_n),
        within(&ks, &memo, &by_n),
        within(&xs, &delta, &by_n),
        partial_within(&xs, &delta, &ks, &by_n),
        within(&ks, &delta, &by_n),
    )
}

/// The correlation table's head.
pub(super) const CORRELATION_HEAD: &str = "| mode | cells | ρ(n·SNR², memorization) within n | \
     partial on K | ρ(K, memorization) within n | ρ(n·SNR², Δ) within n | partial on K | \
     ρ(K, Δ) within n |\n|---|---|---|---|---|---|---|---|";

/// A verdict cell as its twin needs it (issue 74, item 4): the config of one of its runs (where
/// its tokens are), its n and pooled n·SNR², and what its real runs said.
#[derive(Clone, Debug)]
pub struct TwinTarget {
    pub config: crate::train::run::RunConfig,
    pub backbone: String,
    /// The verdict table's mode label.
    pub mode: String,
    pub n: usize,
    /// n × the group's pooled SNR² (≤ 0: no signal to set).
    pub n_snr2: f64,
    pub real_memorization: f64,
    /// Percentage points.
    pub real_delta: f64,
    pub real_verdict: Option<String>,
}

/// Every verdict cell of `points` with runs and a pooled SNR².
pub(super) fn twin_targets(points: &[&Point]) -> Vec<TwinTarget> {
    let groups = pooled(points);
    points
        .iter()
        .filter_map(|point| {
            let group = of_point(&groups, point)?;
            let run = point.clean.first().or(point.noisy.first())?;
            let cell = PooledCell::of(point, group);
            Some(TwinTarget {
                config: run.config.clone(),
                backbone: point.row.backbone.clone(),
                mode: point.row.mode.clone(),
                n: point.row.n,
                n_snr2: cell.n_snr2,
                real_memorization: cell.memorization,
                real_delta: cell.delta,
                real_verdict: point.verdict(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An estimate with only what pooling reads set.
    fn estimate(samples: usize, raw: f64, floor: f64, noise_norms: (f64, f64)) -> SnrEstimate {
        serde_json::from_value(serde_json::json!({
            "estimator": 3, "samples": samples, "classes": 2, "embed_dim": 8,
            "effective_dim": 4.0, "mean_tokens": 8.0, "signal_norm": 0.0,
            "noise_norm": noise_norms.0, "other_noise_norm": noise_norms.1, "snr": 0.0,
            "n_snr2": 0.0, "raw_n_snr2": raw,
            "floor": {"mean": floor, "q95": floor, "permutations": 10},
            "modal_position": 0, "modal_share": 1.0
        }))
        .unwrap()
    }

    #[test]
    fn pooled_snr_is_the_signal_over_the_samples_and_zero_on_the_null() {
        let sigma = (2.0, 1.0);
        let (small, large) = (
            estimate(20, 3.0, 1.0, sigma),
            estimate(200, 21.0, 1.0, sigma),
        );
        let p = pooled_of(("d", "b", "head"), &[&small, &large]);
        // (2 + 20) / 220.
        assert!((p.snr2 - 0.1).abs() < 1e-12, "{}", p.snr2);
        assert!((p.n_snr2(1000) - 100.0).abs() < 1e-9);
        // σ from tokens half as spread: n·SNR² × 4.
        assert!((p.other_sigma_snr2 - 0.4).abs() < 1e-12);
        assert!(
            p.interval.0 <= p.snr2 && p.snr2 <= p.interval.1,
            "{:?}",
            p.interval
        );
        // The null: raw values scattered around their floor pool to 0, where clipping each at
        // 0 first would read a signal.
        let null = [
            estimate(200, 0.5, 1.0, sigma),
            estimate(200, 1.5, 1.0, sigma),
            estimate(200, 0.8, 1.0, sigma),
            estimate(200, 1.2, 1.0, sigma),
        ];
        let p = pooled_of(("d", "b", "head"), &null.iter().collect::<Vec<_>>());
        assert!(p.snr2.abs() < 1e-12, "{}", p.snr2);
        assert!(!p.has_signal());
        assert!(p.interval.0 < 0.0 && p.interval.1 > 0.0, "{:?}", p.interval);
    }
}
