//! Theory meets data (docs/design.md, "The SNR of real tokens" and "Theory against data"): every
//! verdict cell of the report on the paper's n·SNR² axis, with what a reader needs to judge it.
//!
//! - **Placement.** Per cell the raw n·SNR², the permutation floor, the calibrated value over
//!   seeds (mean ± spread, and the widest of the seeds' bootstrap intervals) and how many seeds
//!   rise above the floor; a cell none of whose seeds does is shown as a bound, never a number.
//! - **Synthetic twin.** The token selector at the cell's T, effective dimension, n and calibrated
//!   SNR, run at its base step, at half and twice the step and at five times the steps. Its regime
//!   counts only when all four agree; a run that underfits or has not settled is "undecided".
//! - **Boundaries.** The same setting run along n·SNR², where its regime changes, drawn at each
//!   point's height.
//! - **Statistics that could say no.** Cohen's κ of twin against verdict; Spearman's ρ per mode
//!   with a seeds-only and a cells-then-seeds bootstrap and a permutation p-value; ρ with the SNR
//!   within each n, with a permutation test that keeps every n's cells together.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::plot::{ErrorPanel, ErrorPoint, LegendEntry, LegendKey, Shape, error_scatter_panels};
use super::results::{ResultRow, Stat};
use super::verdict::{NOISY_ETA, Outcome, VerdictRow};
use crate::diagnostics::snr::SnrEstimate;
use crate::synthetic::{EngineKind, Regime, SyntheticConfig, Trace};

/// The synthetic runs the section needs, kept between reports (each is keyed by its whole config).
pub const SYNTHETIC_RUNS: &str = "synthetic_twins.json";
pub const MEMORIZATION_FIGURE: &str = "memorization_vs_n_snr2.png";
pub const DELTA_FIGURE: &str = "delta_vs_n_snr2.png";

/// Bootstrap resamples behind each correlation's intervals.
const BOOTSTRAP: usize = 2000;
/// Permutations behind each correlation's p-value.
const PERMUTATIONS: usize = 10_000;
/// The twin's step size and length are tried at these multiples; the last lengthens the run.
const STEP_SCALES: [(&str, f64); 2] = [("½ step", 0.5), ("2× step", 2.0)];
const LONGER: usize = 5;
/// The boundary lines: log₁₀ n·SNR² from −1 by half decades (0.1 to 10³). Each point is a base
/// twin run; at T 197 and n 1000 one takes ~40 s, so the line is coarse.
const BOUNDARY_POINTS: usize = 9;

/// One verdict cell on the n·SNR² axis.
struct Point<'a> {
    row: &'a VerdictRow,
    /// The cell's runs at η = 0 and at η = 0.2 (η-siblings share their estimate).
    clean: Vec<&'a ResultRow>,
    noisy: Vec<&'a ResultRow>,
}

impl Point<'_> {
    /// One estimate per seed: the η = 0.2 runs', else the η = 0 runs'.
    fn seed_estimates(&self) -> Vec<&SnrEstimate> {
        let runs = if self.noisy.iter().any(|r| r.snr.is_some()) {
            &self.noisy
        } else {
            &self.clean
        };
        runs.iter().filter_map(|r| r.snr.as_ref()).collect()
    }

    fn call(&self) -> Option<&super::verdict::Call> {
        match &self.row.ours {
            Outcome::Called(call) => Some(call),
            Outcome::Missing(_) => None,
        }
    }

    fn verdict(&self) -> Option<String> {
        self.call().map(|c| c.verdict.name().to_string())
    }

    fn label(&self) -> String {
        format!("{} {} n {}", self.row.dataset, self.row.mode, self.row.n)
    }
}

fn points<'a>(rows: &'a [ResultRow], verdict_rows: &'a [VerdictRow]) -> Vec<Point<'a>> {
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
struct CellEstimate {
    seeds: usize,
    /// Seeds whose raw value rises above their permutation floor.
    above: usize,
    raw: Stat,
    /// Mean over seeds of the floor's mean and of its 95th percentile.
    floor_mean: f64,
    floor_q95: f64,
    /// The calibrated n·SNR² (0 for a seed not above its floor), mean ± std over seeds.
    calibrated: Stat,
    /// Smallest seed and largest seed of the calibrated value.
    calibrated_range: (f64, f64),
    /// The lowest lower end and the highest upper end of the seeds' bootstrap intervals: what
    /// every seed's interval allows together.
    interval: [f64; 2],
    /// The calibrated SNR, mean over seeds.
    snr: f64,
    effective_dim: f64,
    embed_dim: usize,
    mean_tokens: f64,
}

impl CellEstimate {
    fn of(estimates: &[&SnrEstimate]) -> Option<Self> {
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
    fn has_signal(&self) -> bool {
        self.above > 0 && self.snr > 0.0
    }

    /// The twin's d: the noise's effective dimension (the directions it actually spreads in),
    /// at least 2; d itself where too few samples left it unknown.
    fn twin_dim(&self) -> usize {
        if self.effective_dim.is_finite() {
            (self.effective_dim.round() as usize).max(2)
        } else {
            self.embed_dim
        }
    }

    /// The calibrated value as the table shows it: a bound where no seed rises above the floor.
    fn calibrated_text(&self) -> String {
        if self.above == 0 {
            format!("not above floor, ≤ {:.2}", self.interval[1])
        } else {
            format!("{:.2} ± {:.2}", self.calibrated.mean, self.calibrated.std)
        }
    }
}

/// A synthetic run's outcome, as the cache keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SyntheticOutcome {
    config: SyntheticConfig,
    regime: Regime,
    train_acc: f64,
    test_acc: f64,
    noisy_fitted: usize,
    noisy_total: usize,
}

/// Synthetic runs read from and written back to the report folder, so that a report made again
/// runs only the configurations it has not seen.
struct SyntheticRuns {
    path: std::path::PathBuf,
    kept: Vec<SyntheticOutcome>,
    used: Vec<SyntheticOutcome>,
    /// Runs that failed, with why (shown in the table instead of a regime).
    failed: Vec<(SyntheticConfig, String)>,
}

impl SyntheticRuns {
    fn open(out: &Path) -> Self {
        let path = out.join(SYNTHETIC_RUNS);
        // An unreadable or stale file is only a cache: its runs are made again.
        let kept = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Self {
            path,
            kept,
            used: Vec::new(),
            failed: Vec::new(),
        }
    }

    fn find(&self, config: &SyntheticConfig) -> Option<&SyntheticOutcome> {
        self.used
            .iter()
            .chain(&self.kept)
            .find(|o| o.config == *config)
    }

    /// Makes every run of `configs` not yet known, the slowest first, across the cores (each run
    /// is single-threaded), and keeps them all for [`save`](Self::save).
    fn run_all(&mut self, configs: &[SyntheticConfig]) {
        let mut todo: Vec<&SyntheticConfig> = Vec::new();
        for config in configs {
            match self.find(config).cloned() {
                Some(o) if !self.used.iter().any(|u| u.config == *config) => self.used.push(o),
                Some(_) => {}
                None if !todo.contains(&config) => todo.push(config),
                None => {}
            }
        }
        let cost = |c: &SyntheticConfig| c.train_n * c.seq_len * (c.embed_dim + 16) * c.num_steps;
        todo.sort_by_key(|c| std::cmp::Reverse(cost(c)));
        let done = AtomicUsize::new(0);
        let total = todo.len();
        let outcomes: Vec<(SyntheticConfig, Result<SyntheticOutcome>)> = todo
            .par_iter()
            .map(|config| {
                let outcome = run_synthetic(config);
                let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                eprintln!(
                    "synthetic run {k}/{total}: T {}, d {}, n {}, ‖μ‖ {:.3}, step {:.4}, {} steps",
                    config.seq_len,
                    config.embed_dim,
                    config.train_n,
                    config.signal_norm,
                    config.learning_rate,
                    config.num_steps
                );
                ((*config).clone(), outcome)
            })
            .collect();
        for (config, outcome) in outcomes {
            match outcome {
                Ok(o) => self.used.push(o),
                Err(e) => self.failed.push((config, format!("{e:#}"))),
            }
        }
    }

    fn regime(&self, config: &SyntheticConfig) -> Result<Regime, String> {
        if let Some(o) = self.find(config) {
            return Ok(o.regime);
        }
        Err(self
            .failed
            .iter()
            .find(|(c, _)| c == config)
            .map_or_else(|| "not run".to_string(), |(_, why)| why.clone()))
    }

    fn save(&self) -> Result<()> {
        crate::io::write_json(&self.path, &self.used)
    }
}

fn run_synthetic(config: &SyntheticConfig) -> Result<SyntheticOutcome> {
    let run = crate::synthetic::run(config, EngineKind::Dense, Trace::FinalOnly, &mut |_| {})
        .with_context(|| format!("synthetic run {config:?}"))?;
    let s = run.summary;
    Ok(SyntheticOutcome {
        config: config.clone(),
        regime: s.regime,
        train_acc: s.train_acc,
        test_acc: s.test_acc,
        noisy_fitted: s.noisy_fitted,
        noisy_total: s.noisy_total,
    })
}

/// The synthetic twin of a cell: the token selector at the cell's T (its mean token count), d
/// (the noise's effective dimension: the paper's noise is isotropic in d directions, real tokens'
/// spreads in far fewer), n and η = 0.2, with σ_ε = 1 and ‖μ‖ = SNR·√d so that its SNR is the
/// cell's. The paper's step size is for T = 8; the softmax's gradients shrink as 1/T, so the
/// twin's is scaled by T/8 (with the paper's own, attention over 197 tokens does not move in 1000
/// steps).
pub fn twin_config(dim: usize, mean_tokens: f64, n: usize, snr: f64) -> SyntheticConfig {
    let paper = SyntheticConfig::default();
    let seq_len = (mean_tokens.round() as usize).max(3);
    SyntheticConfig {
        seq_len,
        embed_dim: dim.max(2),
        train_n: n,
        noise_ratio: NOISY_ETA,
        signal_norm: snr * (dim.max(2) as f64).sqrt(),
        learning_rate: paper.learning_rate * seq_len as f64 / paper.seq_len as f64,
        log_interval: paper.num_steps,
        ..paper
    }
}

/// The twin and the runs that test it: half and twice the step, and five times the steps (if
/// the regime moves with more steps, the base run had not settled).
fn twin_variants(base: &SyntheticConfig) -> Vec<(&'static str, SyntheticConfig)> {
    let mut variants = vec![("base", base.clone())];
    for (name, scale) in STEP_SCALES {
        let mut c = base.clone();
        c.learning_rate *= scale;
        variants.push((name, c));
    }
    let mut longer = base.clone();
    longer.num_steps *= LONGER;
    longer.log_interval = longer.num_steps;
    variants.push(("5× steps", longer));
    variants
}

/// What a twin says about its cell.
#[derive(Clone, Debug, PartialEq)]
enum TwinCall {
    /// Every variant lands in this regime.
    Stable(Regime),
    /// The base run settled in a regime the step size moves: (variant, regime) of each run.
    Unstable(Vec<(&'static str, Regime)>),
    /// No regime: why.
    Undecided(String),
}

impl TwinCall {
    /// The rule: a base run that underfits, or whose regime five times the steps change, has not
    /// landed anywhere; otherwise the regime is stable when the step's halving and doubling keep it.
    fn judge(runs: &[(&'static str, Regime)]) -> Self {
        let Some(&(_, base)) = runs.first() else {
            return TwinCall::Undecided("no run".into());
        };
        if base == Regime::Underfitting {
            return TwinCall::Undecided("base run underfitting".into());
        }
        if let Some((_, longer)) = runs.iter().find(|(name, _)| *name == "5× steps")
            && *longer != base
        {
            return TwinCall::Undecided(format!(
                "{} after 1×, {} after 5× steps",
                base.name(),
                longer.name()
            ));
        }
        if runs.iter().all(|(_, r)| *r == base) {
            TwinCall::Stable(base)
        } else {
            TwinCall::Unstable(runs.to_vec())
        }
    }

    /// The regime a verdict can be set against (stable twins only).
    fn regime(&self) -> Option<Regime> {
        match self {
            TwinCall::Stable(r) => Some(*r),
            _ => None,
        }
    }

    /// The confusion table's row.
    fn row(&self) -> String {
        match self {
            TwinCall::Stable(r) => r.name().to_string(),
            TwinCall::Unstable(_) => "unstable".into(),
            TwinCall::Undecided(_) => "undecided".into(),
        }
    }

    fn text(&self) -> String {
        match self {
            TwinCall::Stable(r) => format!("{} (stable)", r.name()),
            TwinCall::Unstable(runs) => format!(
                "unstable: {}",
                runs.iter()
                    .map(|(name, r)| format!("{name} {}", r.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TwinCall::Undecided(why) => format!("undecided ({why})"),
        }
    }
}

/// The twin's setting along n·SNR² (0.1 to 10³ by half decades), everything else as `base`.
fn boundary_line(base: &SyntheticConfig) -> Vec<(f64, SyntheticConfig)> {
    (0..BOUNDARY_POINTS)
        .map(|k| {
            let n_snr2 = 10f64.powf(-1.0 + 0.5 * k as f64);
            let snr = (n_snr2 / base.train_n as f64).sqrt();
            let config = SyntheticConfig {
                signal_norm: snr * (base.embed_dim as f64).sqrt(),
                ..base.clone()
            };
            (n_snr2, config)
        })
        .collect()
}

/// Where the regime changes along the line: the geometric midpoint of each pair of neighbours
/// whose regimes differ, with the two regimes.
fn boundaries(line: &[(f64, Regime)]) -> Vec<(f64, Regime, Regime)> {
    line.windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| ((w[0].0 * w[1].0).sqrt(), w[0].1, w[1].1))
        .collect()
}

/// What the section knows of one cell once its synthetic runs are made.
struct Cell<'a> {
    point: Point<'a>,
    estimate: CellEstimate,
    /// The base twin's setting (at the cell's SNR, or at SNR 1 where there is none: its line
    /// only needs the rest).
    base: SyntheticConfig,
    twin: TwinCall,
    /// The regime along the cell's own line; a run that failed is left out.
    line: Vec<(f64, Regime)>,
}

impl Cell<'_> {
    fn edges(&self) -> Vec<(f64, Regime, Regime)> {
        boundaries(&self.line)
    }
}

fn base_twin(estimate: &CellEstimate, n: usize) -> SyntheticConfig {
    let snr = if estimate.has_signal() {
        estimate.snr
    } else {
        1.0
    };
    twin_config(estimate.twin_dim(), estimate.mean_tokens, n, snr)
}

/// Every synthetic run the cells need: the twins' four runs where there is signal, the lines
/// everywhere.
fn needed_runs(cells: &[(Point, CellEstimate)]) -> Vec<SyntheticConfig> {
    let mut configs = Vec::new();
    for (point, estimate) in cells {
        let base = base_twin(estimate, point.row.n);
        if estimate.has_signal() {
            configs.extend(twin_variants(&base).into_iter().map(|(_, c)| c));
        }
        configs.extend(boundary_line(&base).into_iter().map(|(_, c)| c));
    }
    configs
}

fn judged<'a>(point: Point<'a>, estimate: CellEstimate, runs: &SyntheticRuns) -> Cell<'a> {
    let base = base_twin(&estimate, point.row.n);
    let twin = if !estimate.has_signal() {
        TwinCall::Undecided("no signal above the floor".into())
    } else {
        let outcomes: Result<Vec<(&'static str, Regime)>, String> = twin_variants(&base)
            .into_iter()
            .map(|(name, c)| runs.regime(&c).map(|r| (name, r)))
            .collect();
        match outcomes {
            Ok(o) => TwinCall::judge(&o),
            Err(why) => TwinCall::Undecided(format!("run failed: {why}")),
        }
    };
    let line = boundary_line(&base)
        .into_iter()
        .filter_map(|(x, c)| runs.regime(&c).ok().map(|r| (x, r)))
        .collect();
    Cell {
        point,
        estimate,
        base,
        twin,
        line,
    }
}

/// Ranks with ties given their mean rank (1-based).
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = mean_rank;
        }
        i = j + 1;
    }
    ranks
}

/// Spearman's rank correlation (Pearson's on tie-averaged ranks); NaN under three pairs or when
/// one side is constant.
pub fn spearman(xs: &[f64], ys: &[f64]) -> f64 {
    if xs.len() != ys.len() || xs.len() < 3 {
        return f64::NAN;
    }
    let (rx, ry) = (ranks(xs), ranks(ys));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mx, my) = (mean(&rx), mean(&ry));
    let cov: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = rx.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = ry.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}

/// Cohen's κ of two labellings of the same items, with the agreement observed and the agreement
/// chance alone gives from the two margins.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Kappa {
    pub kappa: f64,
    pub observed: f64,
    pub chance: f64,
    pub items: usize,
}

/// κ = (p_o − p_e) / (1 − p_e) over `pairs` (first labelling, second); NaN without items or when
/// chance already agrees fully (both labellings one and the same single label).
pub fn cohen_kappa(pairs: &[(String, String)]) -> Kappa {
    let items = pairs.len();
    let total = items as f64;
    let observed = pairs.iter().filter(|(a, b)| a == b).count() as f64 / total;
    let mut rows: BTreeMap<&str, f64> = BTreeMap::new();
    let mut columns: BTreeMap<&str, f64> = BTreeMap::new();
    for (a, b) in pairs {
        *rows.entry(a).or_default() += 1.0;
        *columns.entry(b).or_default() += 1.0;
    }
    let chance: f64 = rows
        .iter()
        .map(|(label, count)| count / total * columns.get(label).copied().unwrap_or(0.0) / total)
        .sum();
    Kappa {
        kappa: (observed - chance) / (1.0 - chance),
        observed,
        chance,
        items,
    }
}

/// Two-sided permutation p-value of Spearman's ρ(xs, ys): the share of `permutations` shuffles of
/// `ys` whose |ρ| reaches the observed one, the observed pairing counted as one of them.
pub fn permutation_p(xs: &[f64], ys: &[f64], permutations: usize, seed: u64) -> f64 {
    let strata = vec![0; xs.len()];
    stratified_permutation_p(xs, ys, &strata, permutations, seed)
}

/// The cell-weighted mean over strata of Spearman's ρ within each stratum (strata whose ρ is
/// undefined left out): a correlation that a difference between strata cannot make.
pub fn pooled_rho(xs: &[f64], ys: &[f64], strata: &[usize]) -> f64 {
    let mut labels: Vec<usize> = strata.to_vec();
    labels.sort_unstable();
    labels.dedup();
    let (mut sum, mut weight) = (0.0, 0.0);
    for label in labels {
        let (sx, sy): (Vec<f64>, Vec<f64>) = (0..xs.len())
            .filter(|&i| strata[i] == label)
            .map(|i| (xs[i], ys[i]))
            .unzip();
        let rho = spearman(&sx, &sy);
        if rho.is_finite() {
            sum += rho * sx.len() as f64;
            weight += sx.len() as f64;
        }
    }
    if weight > 0.0 { sum / weight } else { f64::NAN }
}

/// Shuffles `values` among the positions of each stratum only: every value stays in its stratum.
fn permute_within(values: &mut [f64], strata: &[usize], rng: &mut ChaCha8Rng) {
    let mut labels: Vec<usize> = strata.to_vec();
    labels.sort_unstable();
    labels.dedup();
    for label in labels {
        let at: Vec<usize> = (0..strata.len()).filter(|&i| strata[i] == label).collect();
        let mut taken: Vec<f64> = at.iter().map(|&i| values[i]).collect();
        taken.shuffle(rng);
        for (&i, v) in at.iter().zip(taken) {
            values[i] = v;
        }
    }
}

/// Two-sided permutation p-value of [`pooled_rho`], `ys` shuffled within strata only, so that
/// what the strata differ by (n) cannot carry it; (1 + reaching) / (1 + permutations).
pub fn stratified_permutation_p(
    xs: &[f64],
    ys: &[f64],
    strata: &[usize],
    permutations: usize,
    seed: u64,
) -> f64 {
    let observed = pooled_rho(xs, ys, strata).abs();
    if !observed.is_finite() {
        return f64::NAN;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut shuffled = ys.to_vec();
    let reaching = (0..permutations)
        .filter(|_| {
            permute_within(&mut shuffled, strata, &mut rng);
            // A tolerance, so that a permutation giving the same ρ counts despite rounding.
            pooled_rho(xs, &shuffled, strata).abs() >= observed - 1e-12
        })
        .count();
    (1 + reaching) as f64 / (1 + permutations) as f64
}

/// 2.5 % and 97.5 % percentiles of the finite `draws`.
pub fn percentile_interval(mut draws: Vec<f64>) -> (f64, f64) {
    draws.retain(|r| r.is_finite());
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| {
        draws
            .get(((draws.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.025), at(0.975))
}

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

/// The report's section (markdown) and the figures it drew, each with its caption.
pub fn section(
    out: &Path,
    rows: &[ResultRow],
    verdict_rows: &[VerdictRow],
    mode_order: &dyn Fn(&str) -> usize,
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, super::plot::Marker),
) -> Result<(String, Vec<(&'static str, String)>)> {
    let mut md = String::new();
    writeln!(md, "## Theory: every cell on the n·SNR² axis\n")?;
    let mut placed = Vec::new();
    let mut unplaced = Vec::new();
    for point in points(rows, verdict_rows) {
        match CellEstimate::of(&point.seed_estimates()) {
            Some(estimate) => placed.push((point, estimate)),
            None => unplaced.push(point.label()),
        }
    }
    if placed.is_empty() {
        writeln!(
            md,
            "No run records a current n·SNR² estimate (runs made before it was measured, or by \
             the old rule): `benign-attention reproduce snr <folder>` adds it from the cached \
             features.\n"
        )?;
        return Ok((md, Vec::new()));
    }
    introduction(&mut md)?;
    if !unplaced.is_empty() {
        writeln!(
            md,
            "{} cells have no current estimate (`reproduce snr` adds it): {}.\n",
            unplaced.len(),
            unplaced.join(", ")
        )?;
    }
    let mut synthetic = SyntheticRuns::open(out);
    synthetic.run_all(&needed_runs(&placed));
    synthetic.save()?;
    let cells: Vec<Cell> = placed
        .into_iter()
        .map(|(p, e)| judged(p, e, &synthetic))
        .collect();
    cell_table(&mut md, &cells)?;
    agreement(&mut md, &cells, mode_order)?;
    boundary_table(&mut md, &cells)?;
    correlations(&mut md, &cells, mode_order)?;
    fixed_n_correlations(&mut md, &cells, mode_order)?;
    let figures = draw(out, &cells, mode_order, colors)?;
    Ok((md, figures))
}

fn introduction(md: &mut String) -> Result<()> {
    writeln!(
        md,
        "Each cell's n·SNR² over its seeds' fine-tune sets (docs/design.md, \"The SNR of real \
         tokens\"): raw, the permutation floor (labels shuffled; mean and 95th percentile), the \
         calibrated value (raw less the floor's mean, 0 for a seed not above its floor; mean ± \
         std over seeds), its interval (the lowest lower and the highest upper end of the seeds' \
         bootstrap intervals) and how many seeds rise above the floor (p ≤ 0.05). A cell no seed \
         of which rises above the floor shows the most that could hide below it.\n\n\
         The twin is the paper's token selector at the cell's T (mean tokens per sample), the \
         noise's effective dimension d_eff (rounded, ≥ 2) in place of d, n, η = {NOISY_ETA}, \
         σ_ε = 1 and ‖μ‖ = SNR·√d_eff with the calibrated SNR's mean over seeds; step 5e-3·T/8, \
         1000 steps, seed 42, dense engine, judged by the synthetic rule (docs/protocol.md \
         §2.5). It is run again at ½ and 2× the step and at {LONGER}× the steps: its regime is \
         *stable* when all four agree, *unstable* (variants listed) when the step moves it, and \
         *undecided* when the base run underfits or {LONGER}× the steps change it (it had not \
         settled), or when no seed rises above the floor (no twin is run). Only stable twins \
         are set against the verdict.\n"
    )?;
    Ok(())
}

fn cell_table(md: &mut String, cells: &[Cell]) -> Result<()> {
    writeln!(
        md,
        "| dataset | mode | n | raw n·SNR² | floor (q95) | calibrated n·SNR² | interval | above floor | d_eff / d | T | twin | verdict | agree |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for cell in cells {
        let (p, e) = (&cell.point, &cell.estimate);
        let verdict = p.verdict();
        let agree = match (cell.twin.regime(), &verdict) {
            (Some(t), Some(v)) if t.name() == v => "yes",
            (Some(_), Some(_)) => "no",
            _ => "–",
        };
        let interval = if e.above == 0 {
            "–".to_string()
        } else {
            format!("[{:.2}, {:.2}]", e.interval[0], e.interval[1])
        };
        writeln!(
            md,
            "| {} | {} | {} | {:.2} ± {:.2} | {:.2} ({:.2}) | {} | {interval} | {} of {} | {:.0} / {} | {} | {} | {} | {agree} |",
            p.row.dataset,
            p.row.mode,
            p.row.n,
            e.raw.mean,
            e.raw.std,
            e.floor_mean,
            e.floor_q95,
            e.calibrated_text(),
            e.above,
            e.seeds,
            e.effective_dim,
            e.embed_dim,
            cell.base.seq_len,
            cell.twin.text(),
            verdict.as_deref().unwrap_or("–"),
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// The confusion table (every twin, stable or not) and Cohen's κ over the stable ones.
fn agreement(md: &mut String, cells: &[Cell], mode_order: &dyn Fn(&str) -> usize) -> Result<()> {
    let mut confusion: BTreeMap<(String, String), usize> = BTreeMap::new();
    for cell in cells {
        if let Some(v) = cell.point.verdict() {
            *confusion.entry((cell.twin.row(), v)).or_default() += 1;
        }
    }
    let twins: Vec<&String> = dedup(confusion.keys().map(|k| &k.0));
    let verdicts: Vec<&String> = dedup(confusion.keys().map(|k| &k.1));
    writeln!(md, "Twin (rows) against verdict (columns), cells:\n")?;
    write!(md, "| twin \\ verdict |")?;
    for v in &verdicts {
        write!(md, " {v} |")?;
    }
    writeln!(md, "\n|---|{}", "---|".repeat(verdicts.len()))?;
    for t in &twins {
        write!(md, "| {t} |")?;
        for v in &verdicts {
            let count = confusion.get(&((*t).clone(), (*v).clone())).copied();
            write!(md, " {} |", count.unwrap_or(0))?;
        }
        writeln!(md)?;
    }
    writeln!(
        md,
        "\nCohen's κ of the stable twins' regime against the verdict (chance agreement from the \
         two margins; \"partly memorised\" has no synthetic counterpart, so it always counts as \
         a disagreement):\n\n| mode | cells with a stable twin and a verdict | agree | observed | chance | κ |\n|---|---|---|---|---|---|"
    )?;
    let decided = |mode: Option<&str>| -> Vec<(String, String)> {
        cells
            .iter()
            .filter(|c| mode.is_none_or(|m| c.point.row.mode == m))
            .filter_map(|c| Some((c.twin.regime()?.name().to_string(), c.point.verdict()?)))
            .collect()
    };
    let modes = modes(cells.iter().map(|c| &c.point), mode_order);
    for mode in modes.iter().map(|m| Some(*m)).chain([None]) {
        let pairs = decided(mode);
        let agree = pairs.iter().filter(|(a, b)| a == b).count();
        let k = cohen_kappa(&pairs);
        let share = |v: f64| {
            if k.items == 0 {
                "–".to_string()
            } else {
                format!("{v:.2}")
            }
        };
        writeln!(
            md,
            "| {} | {} | {agree} | {} | {} | {} |",
            mode.unwrap_or("all"),
            k.items,
            share(k.observed),
            share(k.chance),
            number(k.kappa, 2)
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// A value, or "–" where it is undefined.
fn number(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:+.decimals$}")
    } else {
        "–".into()
    }
}

fn dedup<'a>(items: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut seen: Vec<&String> = items.collect();
    seen.sort();
    seen.dedup();
    seen
}

fn modes<'a, 'b: 'a>(
    points: impl Iterator<Item = &'a Point<'b>>,
    mode_order: &dyn Fn(&str) -> usize,
) -> Vec<&'a str> {
    let mut modes: Vec<&str> = points.map(|p| p.row.mode.as_str()).collect();
    modes.sort_by_key(|m| (mode_order(m), m.to_string()));
    modes.dedup();
    modes
}

/// Where each cell's own setting changes regime along n·SNR², cells of one setting together.
fn boundary_table(md: &mut String, cells: &[Cell]) -> Result<()> {
    let mut settings: BTreeMap<(usize, usize, usize), Vec<&Cell>> = BTreeMap::new();
    for cell in cells {
        let b = &cell.base;
        settings
            .entry((b.seq_len, b.embed_dim, b.train_n))
            .or_default()
            .push(cell);
    }
    writeln!(
        md,
        "Where the twin's setting (T, d_eff, n, base step) changes regime along n·SNR² (one run \
         per half decade from 0.1 to 10³, the change put at the geometric midpoint of the two \
         runs that differ; the ticks at each point's height in the figures):\n\n\
         | T | d_eff | n | cells | regime at 0.1 | changes at |\n|---|---|---|---|---|---|"
    )?;
    for ((t, d, n), group) in settings {
        let line = &group[0].line;
        let edges = group[0].edges();
        let changes = if edges.is_empty() {
            "none up to 10³".to_string()
        } else {
            edges
                .iter()
                .map(|(x, _, b)| format!("{x:.2} (→ {})", b.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let names: Vec<String> = group
            .iter()
            .map(|c| format!("{} {}", c.point.row.dataset, c.point.row.mode))
            .collect();
        writeln!(
            md,
            "| {t} | {d} | {n} | {} | {} | {changes} |",
            names.join(", "),
            line.first().map_or("–", |(_, r)| r.name()),
        )?;
    }
    writeln!(md)?;
    Ok(())
}

fn correlations(md: &mut String, cells: &[Cell], mode_order: &dyn Fn(&str) -> usize) -> Result<()> {
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
            "{} | [{}, {}] | [{}, {}] | {:.4}",
            number(c.rho, 2),
            number(c.seeds.0, 2),
            number(c.seeds.1, 2),
            number(c.cells_and_seeds.0, 2),
            number(c.cells_and_seeds.1, 2),
            c.p
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
fn fixed_n_correlations(
    md: &mut String,
    cells: &[Cell],
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
                "{} (p {:.4})",
                number(pooled_rho(&xs, ys, &strata), 2),
                stratified_permutation_p(&xs, ys, &strata, PERMUTATIONS, 2)
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

/// A cell as a figure's point: x the calibrated n·SNR² (log₁₀) with its seeds' range, or its
/// upper bound where no seed rises above the floor; y and its seed spread from `value`.
fn figure_point(
    cell: &Cell,
    (y, y_err): (f64, f64),
    color: plotters::style::RGBColor,
    shape: Shape,
) -> Option<ErrorPoint> {
    let e = &cell.estimate;
    let log = |v: f64| {
        if v > 0.0 {
            v.log10()
        } else {
            f64::NEG_INFINITY
        }
    };
    let (x, x_range, bound) = if e.above == 0 {
        let x = log(e.interval[1]);
        (x, (x, x), true)
    } else {
        let x = log(e.calibrated.mean);
        (
            x,
            (log(e.calibrated_range.0), log(e.calibrated_range.1)),
            false,
        )
    };
    (x.is_finite() && y.is_finite()).then(|| ErrorPoint {
        x,
        y,
        x_range,
        y_err: if y_err.is_finite() { y_err } else { 0.0 },
        color,
        shape,
        upper_bound: bound,
        ticks: cell.edges().iter().map(|(x, _, _)| x.log10()).collect(),
    })
}

/// The legend strip: a colour per dataset, a shape per n, the bound's marker and the tick.
fn figure_legend(
    cells: &[Cell],
    ns: &[usize],
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, super::plot::Marker),
) -> Vec<LegendEntry> {
    let mut datasets: Vec<&str> = cells.iter().map(|c| c.point.row.dataset.as_str()).collect();
    datasets.sort_unstable();
    datasets.dedup();
    let mut legend: Vec<LegendEntry> = datasets
        .iter()
        .map(|d| LegendEntry {
            key: LegendKey::Color(colors(d).0),
            label: d.to_string(),
        })
        .collect();
    legend.extend(ns.iter().map(|&n| LegendEntry {
        key: LegendKey::Shape(shape_of(ns, n)),
        label: format!("n {n}"),
    }));
    legend.push(LegendEntry {
        key: LegendKey::UpperBound,
        label: "no seed above floor (at its bound)".into(),
    });
    legend.push(LegendEntry {
        key: LegendKey::Tick,
        label: "its twin setting's regime change".into(),
    });
    legend
}

/// The marker of n: one shape per distinct n, in order.
fn shape_of(ns: &[usize], n: usize) -> Shape {
    Shape::ALL[ns.iter().position(|&m| m == n).unwrap_or(0) % Shape::ALL.len()]
}

/// Memorization and Δ against log₁₀ n·SNR², a panel per mode.
fn draw(
    out: &Path,
    cells: &[Cell],
    mode_order: &dyn Fn(&str) -> usize,
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, super::plot::Marker),
) -> Result<Vec<(&'static str, String)>> {
    let mut ns: Vec<usize> = cells.iter().map(|c| c.point.row.n).collect();
    ns.sort_unstable();
    ns.dedup();
    let legend = figure_legend(cells, &ns, colors);
    let panels = |value: &dyn Fn(&Cell) -> (f64, f64), y_label: &str| -> Vec<ErrorPanel> {
        modes(cells.iter().map(|c| &c.point), mode_order)
            .into_iter()
            .map(|mode| ErrorPanel {
                title: format!("{mode} mode, a point per (dataset, n)"),
                x_label: "log₁₀ calibrated n·SNR²".into(),
                y_label: y_label.into(),
                points: cells
                    .iter()
                    .filter(|c| c.point.row.mode == mode)
                    .filter_map(|c| {
                        let color = colors(&c.point.row.dataset).0;
                        figure_point(c, value(c), color, shape_of(&ns, c.point.row.n))
                    })
                    .collect(),
            })
            .filter(|p| !p.points.is_empty())
            .collect()
    };
    let how = "x: mean over seeds of the calibrated n·SNR², bar from the lowest to the highest seed \
               (to the panel's edge where a seed is not above its floor); hollow with a left arrow: \
               no seed above the floor, drawn at the largest upper end of its seeds' intervals; \
               marker shape: n; short vertical ticks at a point's height: where the synthetic \
               twin at that cell's T, d_eff and n changes regime (table above)";
    let mut figures = Vec::new();
    let memorization = panels(
        &|c| {
            (
                c.point.row.memorization[0] / 100.0,
                c.point.row.memorization[1] / 100.0,
            )
        },
        "memorization at η = 0.2",
    );
    if !memorization.is_empty() {
        error_scatter_panels(
            &out.join(MEMORIZATION_FIGURE),
            "Memorization against n·SNR²",
            &memorization,
            &legend,
        )?;
        figures.push((
            MEMORIZATION_FIGURE,
            format!("Memorization of the flipped labels (mean ± std over seeds) against the cell's n·SNR²; {how}"),
        ));
    }
    let delta = panels(
        &|c| {
            c.point
                .call()
                .map_or((f64::NAN, 0.0), |call| (call.delta, call.spread))
        },
        "Δ (pp): test acc at η = 0.2 − at η = 0",
    );
    if !delta.is_empty() {
        error_scatter_panels(
            &out.join(DELTA_FIGURE),
            "The noise's cost Δ against n·SNR²",
            &delta,
            &legend,
        )?;
        figures.push((
            DELTA_FIGURE,
            format!("Δ, the noise's cost in test accuracy (percentage points; bar √(sd₀² + sd₀.₂²) of the seeds) against the cell's n·SNR²; {how}"),
        ));
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_is_one_for_monotone_pairs_and_handles_ties() {
        assert!((spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 25.0, 100.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert_eq!(ranks(&[5.0, 1.0, 5.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        // scipy.stats.spearmanr([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) = 0.8
        assert!(
            (spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 1.0, 4.0, 3.0, 5.0]) - 0.8).abs() < 1e-12
        );
        // scipy.stats.spearmanr, ties on both sides: -0.9705882352941178
        let tied = spearman(
            &[0.5, 1.0, 1.0, 3.0, 2.0, 7.0],
            &[0.9, 0.8, 0.85, 0.3, 0.3, 0.1],
        );
        assert!((tied + 0.9705882352941178).abs() < 1e-12, "{tied}");
        assert!(spearman(&[1.0, 2.0], &[1.0, 2.0]).is_nan());
        assert!(spearman(&[1.0, 2.0, 3.0], &[1.0, 1.0, 1.0]).is_nan());
    }

    #[test]
    fn a_twin_has_the_cells_snr_in_its_effective_dimension_and_a_step_scaled_to_its_tokens() {
        let twin = twin_config(12, 197.0, 200, 0.3);
        assert_eq!((twin.seq_len, twin.embed_dim, twin.train_n), (197, 12, 200));
        assert!((twin.snr() - 0.3).abs() < 1e-12);
        assert!((twin.signal_norm - 0.3 * 12f64.sqrt()).abs() < 1e-12);
        assert!((twin.learning_rate - 5e-3 * 197.0 / 8.0).abs() < 1e-12);
        assert_eq!(twin.noise_ratio, NOISY_ETA);
        twin.validate().unwrap();
        // A short text keeps the three roles x₁, x₂, x₃; a dimension under 2 is raised to 2.
        let short = twin_config(1, 1.6, 20, 0.3);
        assert_eq!((short.seq_len, short.embed_dim), (3, 2));
        short.validate().unwrap();
        // Every variant and every point of the line is a valid run.
        for (_, c) in twin_variants(&twin) {
            c.validate().unwrap();
        }
        let variants = twin_variants(&twin);
        assert_eq!(variants[3].1.num_steps, 5 * twin.num_steps);
        assert_eq!(variants[3].1.log_interval, variants[3].1.num_steps);
        assert!((variants[1].1.learning_rate - twin.learning_rate / 2.0).abs() < 1e-15);
        let line = boundary_line(&twin);
        assert_eq!(line.len(), BOUNDARY_POINTS);
        assert!((line[0].0 - 0.1).abs() < 1e-12 && (line[8].0 - 1000.0).abs() < 1e-9);
        for (x, c) in line {
            c.validate().unwrap();
            let n_snr2 = c.train_n as f64 * c.snr().powi(2);
            assert!((n_snr2 / x - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn a_twin_counts_only_when_it_settles_and_the_step_keeps_it() {
        use Regime::*;
        let runs = |r: [Regime; 4]| {
            vec![
                ("base", r[0]),
                ("½ step", r[1]),
                ("2× step", r[2]),
                ("5× steps", r[3]),
            ]
        };
        assert_eq!(
            TwinCall::judge(&runs([Benign; 4])),
            TwinCall::Stable(Benign)
        );
        let unstable = TwinCall::judge(&runs([Benign, Harmful, Benign, Benign]));
        assert!(matches!(unstable, TwinCall::Unstable(_)) && unstable.regime().is_none());
        assert!(unstable.text().contains("½ step harmful"));
        let unsettled = TwinCall::judge(&runs([Harmful, Harmful, Harmful, Benign]));
        assert!(matches!(unsettled, TwinCall::Undecided(_)) && unsettled.regime().is_none());
        let underfit = TwinCall::judge(&runs([Underfitting; 4]));
        assert_eq!(
            underfit,
            TwinCall::Undecided("base run underfitting".into())
        );
    }

    #[test]
    fn boundaries_sit_between_neighbours_that_differ() {
        let line = [
            (1.0, Regime::Harmful),
            (4.0, Regime::Benign),
            (16.0, Regime::Benign),
            (64.0, Regime::NotOverfitting),
        ];
        let edges = boundaries(&line);
        assert_eq!(edges.len(), 2);
        assert!((edges[0].0 - 2.0).abs() < 1e-12 && edges[0].1 == Regime::Harmful);
        assert!((edges[1].0 - 32.0).abs() < 1e-12 && edges[1].2 == Regime::NotOverfitting);
    }

    #[test]
    fn kappa_matches_a_hand_computation() {
        // 2×2 table: (a, a) 20, (a, b) 5, (b, a) 10, (b, b) 15; N 50.
        // p_o = 35/50 = 0.7; rows a 25, b 25; columns a 30, b 20;
        // p_e = 0.5·0.6 + 0.5·0.4 = 0.5; κ = (0.7 − 0.5) / 0.5 = 0.4.
        let mut pairs = Vec::new();
        for (a, b, count) in [
            ("a", "a", 20),
            ("a", "b", 5),
            ("b", "a", 10),
            ("b", "b", 15),
        ] {
            pairs.extend(std::iter::repeat_n((a.to_string(), b.to_string()), count));
        }
        let k = cohen_kappa(&pairs);
        assert_eq!(k.items, 50);
        assert!((k.observed - 0.7).abs() < 1e-12 && (k.chance - 0.5).abs() < 1e-12);
        assert!((k.kappa - 0.4).abs() < 1e-12, "{k:?}");
        // A label only one side uses adds nothing to chance; full agreement is κ 1.
        let same: Vec<(String, String)> = ["x", "y", "x"]
            .iter()
            .map(|s| (s.to_string(), s.to_string()))
            .collect();
        assert!((cohen_kappa(&same).kappa - 1.0).abs() < 1e-12);
        assert!(cohen_kappa(&[]).kappa.is_nan());
    }

    #[test]
    fn the_permutation_p_value_is_small_for_a_monotone_relation_and_large_for_noise() {
        let xs: Vec<f64> = (0..12).map(f64::from).collect();
        let monotone: Vec<f64> = xs.iter().map(|x| x * x).collect();
        // The smallest p 2000 permutations can give is 1/2001; none of 12! orders but the
        // observed one (and its mirror, for |ρ|) reaches ρ = 1.
        let p = permutation_p(&xs, &monotone, 2000, 7);
        assert!(p < 0.002, "{p}");
        // Outcomes unrelated to x: a fixed shuffle with ρ near 0.
        let noise = [5.0, 11.0, 0.0, 8.0, 3.0, 9.0, 1.0, 6.0, 10.0, 2.0, 7.0, 4.0];
        let rho = spearman(&xs, &noise);
        let p = permutation_p(&xs, &noise, 2000, 7);
        assert!(rho.abs() < 0.15 && p > 0.6, "ρ {rho}, p {p}");
    }

    #[test]
    fn the_stratified_permutation_keeps_each_value_in_its_stratum() {
        let strata = [20, 20, 20, 200, 200, 200, 1000, 1000];
        let values = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 100.0, 200.0];
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut moved = values;
        let mut changed = false;
        for _ in 0..50 {
            permute_within(&mut moved, &strata, &mut rng);
            changed |= moved != values;
            for (label, range) in [(20, 0..3), (200, 3..6), (1000, 6..8)] {
                let mut inside: Vec<f64> = moved[range.clone()].to_vec();
                inside.sort_by(f64::total_cmp);
                assert_eq!(inside, values[range].to_vec(), "stratum {label}");
            }
        }
        assert!(changed, "the permutation never moved anything");
        // y rises with n only and falls with x inside every stratum: pooled ρ is −1, and
        // permuting within strata finds that rare; a plain permutation (strata ignored) would
        // credit the rise across n.
        let xs = [3.0, 2.0, 1.0, 3.0, 2.0, 1.0, 3.0, 2.0, 1.0];
        let ys = [1.0, 2.0, 3.0, 11.0, 12.0, 13.0, 21.0, 22.0, 23.0];
        let strata = [0, 0, 0, 1, 1, 1, 2, 2, 2];
        assert!((pooled_rho(&xs, &ys, &strata) + 1.0).abs() < 1e-12);
        let p = stratified_permutation_p(&xs, &ys, &strata, 4000, 5);
        // Exactly: 2 of the 6³ orders reach |ρ| = 1 in every stratum, 2/216 ≈ 0.009.
        assert!(p < 0.03, "{p}");
        assert!(spearman(&xs, &ys).abs() < 0.5);
    }

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
