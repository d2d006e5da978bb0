//! The report's theory section: every verdict cell placed on n·SNR², its twins, boundaries and the
//! statistics that could say no.

use super::pooled::{PooledSnr, TwinTarget};
use super::stats::cohen_kappa;
use super::twins::twin_config;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::cells::{CellAndTwin, CellEstimate, Point, dedup, modes, number, points};
use super::correlation::{correlations, fixed_n_correlations};
use super::figures::draw;
use super::twins::{LONGER, SyntheticRuns, TwinCall, boundary_line, twin_variants};
use crate::diagnostics::snr::SIGNIFICANCE;
use crate::report::results::ResultRow;
use crate::report::verdict::{NOISY_ETA, VerdictRow};
use crate::synthetic::{Regime, SyntheticConfig};

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

pub(super) fn judged<'a>(
    point: Point<'a>,
    estimate: CellEstimate,
    runs: &SyntheticRuns,
) -> CellAndTwin<'a> {
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
    CellAndTwin {
        point,
        estimate,
        base,
        twin,
        line,
    }
}

/// One pooled SNR² per (dataset, backbone, mode) of the verdict cells (what a cell's twin is set
/// by).
pub fn pooled_snr(rows: &[ResultRow], verdict_rows: &[VerdictRow]) -> Vec<PooledSnr> {
    let points = points(rows, verdict_rows);
    super::pooled::pooled(&points.iter().collect::<Vec<_>>())
}

/// Every verdict cell of `rows` as its twin on the paper's model needs it.
pub fn twin_targets(rows: &[ResultRow]) -> Result<Vec<TwinTarget>> {
    let verdict_rows = crate::report::verdict::verdicts(
        &crate::report::results::aggregate(rows),
        &crate::report::paper::table2()?,
    );
    let points = points(rows, &verdict_rows);
    Ok(super::pooled::twin_targets(
        &points.iter().collect::<Vec<_>>(),
    ))
}

/// The report's section (markdown) and the figures it drew, each with its caption.
pub fn section(
    out: &Path,
    rows: &[ResultRow],
    verdict_rows: &[VerdictRow],
    mode_order: &dyn Fn(&str) -> usize,
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, crate::report::plot::Marker),
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
    let placed_points: Vec<&Point> = placed.iter().map(|(p, _)| p).collect();
    super::pooled::pooled_section(&mut md, &placed_points, mode_order)?;
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
    let cells: Vec<CellAndTwin> = placed
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
         bootstrap intervals) and how many seeds rise above the floor (p ≤ {SIGNIFICANCE}). A cell no seed \
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

fn cell_table(md: &mut String, cells: &[CellAndTwin]) -> Result<()> {
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
pub(super) fn agreement(
    md: &mut String,
    cells: &[CellAndTwin],
    mode_order: &dyn Fn(&str) -> usize,
) -> Result<()> {
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
        let kappa = if k.items > 0 && k.kappa.is_nan() {
            "– (one side says one thing throughout: κ would be 0 by construction)".to_string()
        } else {
            number(k.kappa, 2)
        };
        writeln!(
            md,
            "| {} | {} | {agree} | {} | {} | {kappa} |",
            mode.unwrap_or("all"),
            k.items,
            share(k.observed),
            share(k.chance),
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Where each cell's own setting changes regime along n·SNR², cells of one setting together.
fn boundary_table(md: &mut String, cells: &[CellAndTwin]) -> Result<()> {
    let mut settings: BTreeMap<(usize, usize, usize), Vec<&CellAndTwin>> = BTreeMap::new();
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
