//! Theory meets data (docs/design.md, "The SNR of real tokens" and "Synthetic twins"): every
//! verdict cell of the report on the paper's n·SNR² axis, memorization and Δ against it with the
//! synthetic model's phase boundaries drawn, the rank correlation per mode with a bootstrap over
//! seeds, and a synthetic twin per cell whose regime is set beside the real verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::plot::{ScatterGroup, ScatterPanel, XMark, scatter_panels};
use super::results::{ResultRow, Stat};
use super::verdict::{NOISY_ETA, Outcome, VerdictRow};
use crate::synthetic::{EngineKind, Regime, SyntheticConfig, Trace};

/// The synthetic runs the section needs, kept between reports (each is keyed by its whole config).
pub const SYNTHETIC_RUNS: &str = "synthetic_twins.json";
pub const MEMORIZATION_FIGURE: &str = "memorization_vs_n_snr2.png";
pub const DELTA_FIGURE: &str = "delta_vs_n_snr2.png";

/// Bootstrap resamples of the seeds behind each correlation.
const BOOTSTRAP: usize = 2000;

/// One verdict cell on the n·SNR² axis.
struct Point<'a> {
    row: &'a VerdictRow,
    /// The cell's runs at η = 0 and at η = 0.2 (η-siblings share their estimate).
    clean: Vec<&'a ResultRow>,
    noisy: Vec<&'a ResultRow>,
}

impl Point<'_> {
    fn estimates(&self) -> impl Iterator<Item = &crate::diagnostics::snr::SnrEstimate> {
        self.noisy
            .iter()
            .chain(&self.clean)
            .filter_map(|r| r.snr.as_ref())
    }

    fn n_snr2(&self) -> Stat {
        // One value per seed: the η = 0.2 runs', else the η = 0 runs'.
        let runs = if self.noisy.iter().any(|r| r.snr.is_some()) {
            &self.noisy
        } else {
            &self.clean
        };
        Stat::of(runs.iter().filter_map(|r| r.snr.as_ref().map(|s| s.n_snr2)))
    }

    fn call(&self) -> Option<&super::verdict::Call> {
        match &self.row.ours {
            Outcome::Called(call) => Some(call),
            Outcome::Missing(_) => None,
        }
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
        }
    }

    fn outcome(
        &mut self,
        config: &SyntheticConfig,
        engine: EngineKind,
    ) -> Result<SyntheticOutcome> {
        let found = self
            .used
            .iter()
            .chain(&self.kept)
            .find(|o| o.config == *config)
            .cloned();
        let outcome = match found {
            Some(o) => o,
            None => {
                let run = crate::synthetic::run(config, engine, Trace::FinalOnly, &mut |_| {})
                    .with_context(|| format!("synthetic run {config:?}"))?;
                let s = run.summary;
                SyntheticOutcome {
                    config: config.clone(),
                    regime: s.regime,
                    train_acc: s.train_acc,
                    test_acc: s.test_acc,
                    noisy_fitted: s.noisy_fitted,
                    noisy_total: s.noisy_total,
                }
            }
        };
        if !self.used.iter().any(|o| o.config == *config) {
            self.used.push(outcome.clone());
        }
        Ok(outcome)
    }

    fn save(&self) -> Result<()> {
        crate::io::write_json(&self.path, &self.used)
    }
}

/// The synthetic twin of a cell: the token selector at the cell's d, T (its mean token count), n
/// and η = 0.2, with σ_ε = 1 and ‖μ‖ = SNR·√d so that its SNR is the cell's. The paper's step size
/// is for T = 8; the softmax's gradients shrink as 1/T, so the twin's is scaled by T/8 (with the
/// paper's own, attention over 197 tokens does not move in 1000 steps).
pub fn twin_config(embed_dim: usize, mean_tokens: f64, n: usize, snr: f64) -> SyntheticConfig {
    let paper = SyntheticConfig::default();
    let seq_len = (mean_tokens.round() as usize).max(3);
    SyntheticConfig {
        seq_len,
        embed_dim,
        train_n: n,
        noise_ratio: NOISY_ETA,
        signal_norm: snr * (embed_dim as f64).sqrt(),
        learning_rate: paper.learning_rate * seq_len as f64 / paper.seq_len as f64,
        log_interval: paper.num_steps,
        ..paper
    }
}

/// The paper's own synthetic setting (T 8, n 20, d 2000) along n·SNR² from 0.1 to 10⁴.
fn boundary_line() -> Vec<(f64, SyntheticConfig)> {
    let paper = SyntheticConfig::default();
    (0..=20)
        .map(|k| {
            let n_snr2 = 10f64.powf(-1.0 + 0.25 * f64::from(k));
            let snr = (n_snr2 / paper.train_n as f64).sqrt();
            let config = SyntheticConfig {
                signal_norm: snr * (paper.embed_dim as f64).sqrt(),
                log_interval: paper.num_steps,
                ..paper.clone()
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

/// A correlation over cells and its 95 % percentile interval from resampling each cell's seeds.
#[derive(Clone, Copy, Debug)]
pub struct Correlation {
    pub rho: f64,
    pub low: f64,
    pub high: f64,
    pub cells: usize,
}

/// Spearman's ρ between n·SNR² and `outcome` over `cells`, each a list of seeds' (n·SNR²,
/// memorization at η = 0.2) and a list of its η = 0 test accuracies, `outcome` turning a cell's
/// means into the compared quantity; the interval resamples every cell's seeds with replacement.
fn correlation(cells: &[CellSeeds], outcome: fn(&CellMeans) -> f64) -> Correlation {
    let pairs = |means: Vec<CellMeans>| -> (Vec<f64>, Vec<f64>) {
        means
            .iter()
            .map(|m| (m.n_snr2, outcome(m)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .unzip()
    };
    let (xs, ys) = pairs(cells.iter().map(CellSeeds::means).collect());
    let rho = spearman(&xs, &ys);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut draws: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| {
            let (xs, ys) = pairs(
                cells
                    .iter()
                    .map(|c| c.resampled(&mut rng).means())
                    .collect(),
            );
            spearman(&xs, &ys)
        })
        .filter(|r| r.is_finite())
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| {
        draws
            .get(((draws.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Correlation {
        rho,
        low: at(0.025),
        high: at(0.975),
        cells: xs.len(),
    }
}

/// What the bootstrap resamples of one cell: per η = 0.2 seed its n·SNR², memorization and test
/// accuracy; per η = 0 seed its test accuracy.
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

/// A twin's regime against a real verdict: the same name.
fn agrees(twin: Regime, verdict: &str) -> bool {
    twin.name() == verdict
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
    let all = points(rows, verdict_rows);
    let (placed, unplaced): (Vec<Point>, Vec<Point>) = all
        .into_iter()
        .partition(|p| p.estimates().next().is_some());
    if placed.is_empty() {
        writeln!(
            md,
            "No run records its n·SNR² (runs made before it was measured): `benign-attention \
             reproduce snr <folder>` adds it from the cached features.\n"
        )?;
        return Ok((md, Vec::new()));
    }
    writeln!(
        md,
        "n·SNR² of each run's fine-tune set (docs/design.md, \"The SNR of real tokens\"; mean ± \
         std over seeds). The twin is the paper's token selector at the cell's d, T (mean tokens \
         per sample), n and η = {NOISY_ETA}, with σ_ε = 1 and ‖μ‖ = SNR·√d, step size 5e-3·T/8, \
         1000 steps, seed 42, judged by the synthetic rule (docs/protocol.md §2.5); the verdict is \
         the real cell's (above).\n"
    )?;
    if !unplaced.is_empty() {
        writeln!(
            md,
            "{} cells have no estimate yet (`reproduce snr` adds it): {}.\n",
            unplaced.len(),
            unplaced
                .iter()
                .map(|p| format!("{} {} n {}", p.row.dataset, p.row.mode, p.row.n))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }

    let mut synthetic = SyntheticRuns::open(out);
    let line: Vec<(f64, Regime)> = boundary_line()
        .into_iter()
        .map(|(x, config)| Ok((x, synthetic.outcome(&config, EngineKind::Subspace)?.regime)))
        .collect::<Result<_>>()?;
    let edges = boundaries(&line);

    writeln!(
        md,
        "| dataset | mode | n | n·SNR² | SNR | T | d | twin ‖μ‖ | twin train / test acc | twin regime | verdict | agree |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    let mut confusion: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut agreements: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (k, p) in placed.iter().enumerate() {
        let estimates: Vec<_> = p.estimates().collect();
        let snr = Stat::of(estimates.iter().map(|e| e.snr)).mean;
        let tokens = Stat::of(estimates.iter().map(|e| e.mean_tokens)).mean;
        let dim = estimates[0].embed_dim;
        let config = twin_config(dim, tokens, p.row.n, snr);
        eprintln!(
            "twin {}/{}: {} {} n {} (T {}, d {dim})",
            k + 1,
            placed.len(),
            p.row.dataset,
            p.row.mode,
            p.row.n,
            config.seq_len
        );
        let twin = synthetic.outcome(&config, EngineKind::Dense);
        let verdict = p.call().map(|c| c.verdict.name().to_string());
        let (twin_cells, agree) = match (&twin, &verdict) {
            (Ok(t), Some(v)) => {
                *confusion
                    .entry((t.regime.name().to_string(), v.clone()))
                    .or_default() += 1;
                let tally = agreements.entry(p.row.mode.clone()).or_default();
                tally.1 += 1;
                let same = agrees(t.regime, v);
                tally.0 += usize::from(same);
                (
                    (
                        format!("{:.3} / {:.3}", t.train_acc, t.test_acc),
                        t.regime.name().to_string(),
                    ),
                    if same { "yes" } else { "no" }.to_string(),
                )
            }
            (Ok(t), None) => (
                (
                    format!("{:.3} / {:.3}", t.train_acc, t.test_acc),
                    t.regime.name().to_string(),
                ),
                "–".into(),
            ),
            (Err(e), _) => (("–".into(), format!("– ({e:#})")), "–".into()),
        };
        let n_snr2 = p.n_snr2();
        writeln!(
            md,
            "| {} | {} | {} | {:.2} ± {:.2} | {:.3} | {} | {dim} | {:.2} | {} | {} | {} | {agree} |",
            p.row.dataset,
            p.row.mode,
            p.row.n,
            n_snr2.mean,
            n_snr2.std,
            snr,
            config.seq_len,
            config.signal_norm,
            twin_cells.0,
            twin_cells.1,
            verdict.as_deref().unwrap_or("–"),
        )?;
    }
    synthetic.save()?;

    confusion_table(&mut md, &confusion, &agreements)?;
    writeln!(
        md,
        "The synthetic model's own setting (T 8, n 20, d 2000, the paper's step size) changes \
         regime along n·SNR² at {} (one run per quarter decade from 0.1 to 10⁴, geometric \
         midpoints; the dashed lines of the figures).\n",
        if edges.is_empty() {
            "no point".to_string()
        } else {
            edges
                .iter()
                .map(|(x, a, b)| format!("{x:.3} ({} → {})", a.name(), b.name()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    )?;
    correlations(&mut md, &placed, mode_order)?;
    let figures = draw(out, &placed, &edges, mode_order, colors)?;
    Ok((md, figures))
}

fn confusion_table(
    md: &mut String,
    confusion: &BTreeMap<(String, String), usize>,
    agreements: &BTreeMap<String, (usize, usize)>,
) -> Result<()> {
    let twins: Vec<&String> = dedup(confusion.keys().map(|k| &k.0));
    let verdicts: Vec<&String> = dedup(confusion.keys().map(|k| &k.1));
    writeln!(
        md,
        "\nPredicted (twin, rows) against measured (verdict, columns), cells:\n"
    )?;
    write!(md, "| twin \\ verdict |")?;
    for v in &verdicts {
        write!(md, " {v} |")?;
    }
    writeln!(md)?;
    writeln!(md, "|---|{}", "---|".repeat(verdicts.len()))?;
    for t in &twins {
        write!(md, "| {t} |")?;
        for v in &verdicts {
            let count = confusion.get(&((*t).clone(), (*v).clone())).copied();
            write!(md, " {} |", count.unwrap_or(0))?;
        }
        writeln!(md)?;
    }
    let (agree, total) = agreements
        .values()
        .fold((0, 0), |(a, t), (x, y)| (a + x, t + y));
    writeln!(
        md,
        "\nThe twin's regime is the verdict in {agree} of {total} cells ({}).\n",
        agreements
            .iter()
            .map(|(mode, (a, t))| format!("{mode}: {a} of {t}"))
            .collect::<Vec<_>>()
            .join("; ")
    )?;
    Ok(())
}

fn dedup<'a>(items: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
    let mut seen: Vec<&String> = items.collect();
    seen.sort();
    seen.dedup();
    seen
}

fn modes<'a>(placed: &'a [Point], mode_order: &dyn Fn(&str) -> usize) -> Vec<&'a str> {
    let mut modes: Vec<&str> = placed.iter().map(|p| p.row.mode.as_str()).collect();
    modes.sort_by_key(|m| (mode_order(m), m.to_string()));
    modes.dedup();
    modes
}

fn correlations(
    md: &mut String,
    placed: &[Point],
    mode_order: &dyn Fn(&str) -> usize,
) -> Result<()> {
    writeln!(
        md,
        "Spearman's rank correlation over cells of the mean n·SNR² with the mean memorization and \
         with Δ, 95 % interval from {BOOTSTRAP} resamples of each cell's seeds (with replacement):\n"
    )?;
    writeln!(
        md,
        "| mode | cells | ρ(n·SNR², memorization) | ρ(n·SNR², Δ) |"
    )?;
    writeln!(md, "|---|---|---|---|")?;
    for mode in modes(placed, mode_order) {
        let cells: Vec<CellSeeds> = placed
            .iter()
            .filter(|p| p.row.mode == mode)
            .map(CellSeeds::of)
            .filter(|c| !c.noisy.is_empty())
            .collect();
        let memo = correlation(&cells, |m| m.memorization);
        let delta = correlation(&cells, |m| m.delta);
        let show = |c: Correlation| format!("{:+.2} [{:+.2}, {:+.2}]", c.rho, c.low, c.high);
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

/// Memorization and Δ against log₁₀ n·SNR², a panel per mode, the synthetic boundaries dashed.
fn draw(
    out: &Path,
    placed: &[Point],
    edges: &[(f64, Regime, Regime)],
    mode_order: &dyn Fn(&str) -> usize,
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, super::plot::Marker),
) -> Result<Vec<(&'static str, String)>> {
    let marks: Vec<XMark> = edges
        .iter()
        .map(|(x, a, b)| XMark {
            x: x.log10(),
            label: format!("{} | {}", a.name(), b.name()),
        })
        .collect();
    let panels = |value: &dyn Fn(&Point) -> Option<f64>, y_label: &str| -> Vec<ScatterPanel> {
        modes(placed, mode_order)
            .into_iter()
            .map(|mode| {
                let mut groups: Vec<ScatterGroup> = Vec::new();
                for p in placed.iter().filter(|p| p.row.mode == mode) {
                    let (x, Some(y)) = (p.n_snr2().mean.log10(), value(p)) else {
                        continue;
                    };
                    if !x.is_finite() || !y.is_finite() {
                        continue;
                    }
                    match groups.iter_mut().find(|g| g.label == p.row.dataset) {
                        Some(g) => g.points.push((x, y)),
                        None => {
                            let (color, marker) = colors(&p.row.dataset);
                            groups.push(ScatterGroup {
                                label: p.row.dataset.clone(),
                                color,
                                marker,
                                points: vec![(x, y)],
                            });
                        }
                    }
                }
                ScatterPanel {
                    title: format!("{mode} mode, a point per (dataset, n)"),
                    x_label: "log₁₀ n·SNR²".into(),
                    y_label: y_label.into(),
                    groups,
                    x_marks: marks.clone(),
                }
            })
            .filter(|p| !p.groups.is_empty())
            .collect()
    };
    let mut figures = Vec::new();
    let memorization = panels(
        &|p| {
            let m = p.row.memorization[0];
            m.is_finite().then_some(m / 100.0)
        },
        "memorization at η = 0.2",
    );
    if !memorization.is_empty() {
        scatter_panels(
            &out.join(MEMORIZATION_FIGURE),
            "Memorization against n·SNR²",
            &memorization,
        )?;
        figures.push((
            MEMORIZATION_FIGURE,
            "Memorization of the flipped labels (mean over seeds) against the cell's n·SNR²; dashed: where the synthetic model (T 8, n 20, d 2000) changes regime".to_string(),
        ));
    }
    let delta = panels(
        &|p| p.call().map(|c| c.delta),
        "Δ (pp): test acc at η = 0.2 − at η = 0",
    );
    if !delta.is_empty() {
        scatter_panels(
            &out.join(DELTA_FIGURE),
            "The noise's cost Δ against n·SNR²",
            &delta,
        )?;
        figures.push((
            DELTA_FIGURE,
            "Δ, the noise's cost in test accuracy (percentage points), against the cell's n·SNR²; dashed: the synthetic model's regime changes".to_string(),
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
    fn a_twin_has_the_cells_snr_and_a_step_scaled_to_its_tokens() {
        let twin = twin_config(192, 197.0, 200, 0.3);
        assert_eq!(
            (twin.seq_len, twin.embed_dim, twin.train_n),
            (197, 192, 200)
        );
        assert!((twin.snr() - 0.3).abs() < 1e-12);
        assert!((twin.learning_rate - 5e-3 * 197.0 / 8.0).abs() < 1e-12);
        assert_eq!(twin.noise_ratio, NOISY_ETA);
        twin.validate().unwrap();
        // A short text keeps the three roles x₁, x₂, x₃.
        assert_eq!(twin_config(384, 1.6, 20, 0.3).seq_len, 3);
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
    fn the_bootstrap_interval_holds_the_estimate_and_narrows_without_seed_spread() {
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
        assert!((c.low + 1.0).abs() < 1e-12 && (c.high + 1.0).abs() < 1e-12);
    }
}
