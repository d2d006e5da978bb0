//! The report's figures: the Fig. 8-style noise sweep, the Fig. 9-style attention curves,
//! memorization against test accuracy over all runs, and one run's attention maps per dataset.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use plotters::style::RGBColor;
use std::fmt::Write as _;

use crate::io::produce_atomic;
use crate::report::plot::{
    LinePanel, Marker, PALETTE, ScatterGroup, ScatterPanel, Series, line_panels, scatter_panels,
};
use crate::report::results::{Cell, ResultRow, aggregate};
use crate::report::{kept, paper};
use crate::train::metrics::EpochMetrics;
use crate::train::run::{Mode, RunFolder};

pub const FIG8: &str = "fig8_noise_sweep.png";
/// Fig. 8's runs: the n and seed of the `fig8` experiment's grid, which sweeps η.
pub const FIG8_N: usize = 200;
pub const FIG8_SEED: u64 = 42;
pub const FIG9: &str = "fig9_cls_attention.png";
pub const SCATTER: &str = "memorization_vs_test_accuracy.png";

/// Each dataset's colour (and scatter marker) in every figure of the report, so that a dataset
/// keeps them from one figure to the next: the datasets of `runs` in name order, through the
/// palette.
pub(in crate::report) struct DatasetColors(pub(super) Vec<String>);

impl DatasetColors {
    pub(super) fn of(runs: &[(ResultRow, PathBuf)]) -> Self {
        Self(datasets(runs).into_iter().collect())
    }

    /// The dataset's place in name order; one past the last for a dataset of no run.
    pub(super) fn index(&self, dataset: &str) -> usize {
        self.0
            .iter()
            .position(|d| d == dataset)
            .unwrap_or(self.0.len())
    }

    pub(super) fn color(&self, dataset: &str) -> RGBColor {
        PALETTE[self.index(dataset) % PALETTE.len()]
    }

    pub(super) fn marker(&self, dataset: &str) -> Marker {
        [Marker::Triangle, Marker::Circle, Marker::Cross][self.index(dataset) % 3]
    }
}

/// Fig. 8: losses against η of the runs at n = 200, seed 42 (one run per point, so that every
/// point is measured alike), one colour per dataset, solid in last-layer mode and dashed in any
/// other, a marker at each measured η; false when fewer than two η were run.
pub(super) fn noise_sweep(path: &Path, rows: &[ResultRow], colors: &DatasetColors) -> Result<bool> {
    let sweep_rows: Vec<ResultRow> = rows
        .iter()
        .filter(|r| r.config.n == FIG8_N && r.config.seed == FIG8_SEED)
        .cloned()
        .collect();
    let cells = aggregate(&sweep_rows);
    let lines = sweep_lines(&cells);
    if !lines.iter().any(|line| line.cells.len() >= 2) {
        return Ok(false);
    }
    line_panels(
        path,
        "Noise sweep at n = 200 (Fig. 8 style)",
        &[
            sweep_panel(
                "train loss (noisy labels, evaluated after training)",
                |c| c.train_eval_loss.mean,
                &lines,
                colors,
            ),
            sweep_panel("test loss", |c| c.test_loss.mean, &lines, colors),
        ],
    )?;
    Ok(true)
}

/// One line of the noise sweep: a dataset in a mode, its cells in η order.
struct SweepLine<'a> {
    dataset: String,
    mode: String,
    cells: Vec<&'a Cell>,
}

/// The sweep's lines, in the order their first cell comes.
fn sweep_lines(cells: &[Cell]) -> Vec<SweepLine<'_>> {
    let mut lines: Vec<SweepLine> = Vec::new();
    for c in cells {
        match lines
            .iter_mut()
            .find(|l| l.dataset == c.dataset && l.mode == c.mode)
        {
            Some(line) => line.cells.push(c),
            None => lines.push(SweepLine {
                dataset: c.dataset.clone(),
                mode: c.mode.clone(),
                cells: vec![c],
            }),
        }
    }
    lines
}

/// One panel of the sweep: `y` of every line's cells against η, solid in last-layer mode and
/// dashed in any other, and a legend naming each dataset once and each dashed mode once.
fn sweep_panel(
    title: &str,
    y: fn(&Cell) -> f64,
    lines: &[SweepLine],
    colors: &DatasetColors,
) -> LinePanel {
    let mut series: Vec<Series> = lines
        .iter()
        .map(|line| Series {
            label: None,
            color: colors.color(&line.dataset),
            width: 1,
            dashed: line.mode != Mode::LastLayer.name(),
            markers: true,
            points: line.cells.iter().map(|c| (c.eta, y(c))).collect(),
        })
        .collect();
    let key = |label: String, color, dashed| Series {
        label: Some(label),
        color,
        width: 2,
        dashed,
        markers: false,
        points: Vec::new(),
    };
    let datasets: BTreeSet<&str> = lines.iter().map(|l| l.dataset.as_str()).collect();
    series.extend(
        datasets
            .iter()
            .map(|d| key(d.to_string(), colors.color(d), false)),
    );
    let other_modes: BTreeSet<&str> = lines
        .iter()
        .map(|l| l.mode.as_str())
        .filter(|mode| *mode != Mode::LastLayer.name())
        .collect();
    series.extend(
        other_modes
            .iter()
            .map(|mode| key(format!("dashed: {mode} mode"), PALETTE[7], true)),
    );
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    LinePanel {
        title: title.into(),
        x_label: "label-noise rate η".into(),
        y_label: "cross-entropy".into(),
        y_range: (0.0, (top * 1.1).max(1e-3)),
        series,
    }
}

pub(super) fn read_metrics(run_dir: &Path) -> Result<Vec<EpochMetrics>> {
    let path = RunFolder(run_dir.to_path_buf()).metrics();
    let text = crate::io::read_input_text(&path, crate::io::limits::SMALL_TEXT)?;
    text.lines()
        .enumerate()
        .map(|(k, line)| {
            serde_json::from_str(line).with_context(|| {
                format!("{}: line {}: not an epoch's metrics", path.display(), k + 1)
            })
        })
        .collect()
}

/// Reads every run's metrics.jsonl that is there, so that a damaged one stops the report before
/// it writes anything (a report half made beside an old one would mix two sets of runs).
pub(super) fn check_logs(runs: &[(ResultRow, PathBuf)]) -> Result<()> {
    for (_, dir) in runs {
        if RunFolder(dir.clone()).metrics().is_file() {
            read_metrics(dir)?;
        }
    }
    Ok(())
}

/// The datasets of `runs`, in name order.
pub(super) fn datasets(runs: &[(ResultRow, PathBuf)]) -> BTreeSet<String> {
    runs.iter().map(|(row, _)| row.dataset()).collect()
}

/// Which run's curve stands for its dataset in Fig. 9, lowest first: last-layer mode (the
/// last layer's CLS attention, the paper's quantity), n = 200, η = 0.1 (the paper's figure),
/// then the lowest seed and the run's name.
fn curve_rank(row: &ResultRow) -> (bool, bool, bool, u64, String) {
    let c = &row.config;
    (
        c.mode != Mode::LastLayer,
        c.n != 200,
        (c.eta - 0.1).abs() > 1e-9,
        c.seed,
        row.run.clone(),
    )
}

/// The run whose file stands for `dataset` in a figure: the best-ranked (lowest `rank`) among
/// the runs that have the file here (`has_file`) and the run an earlier report kept it from
/// (`kept_run`); `true` when that is the kept one. The fresh run wins a tie.
fn source_run<'a, K: Ord>(
    runs: &'a [(ResultRow, PathBuf)],
    dataset: &str,
    has_file: impl Fn(&RunFolder) -> bool,
    kept_run: Option<&str>,
    rank: impl Fn(&ResultRow) -> K,
) -> Option<(&'a (ResultRow, PathBuf), bool)> {
    let fresh = runs
        .iter()
        .filter(|(row, dir)| row.dataset() == dataset && has_file(&RunFolder(dir.clone())))
        .min_by_key(|(row, _)| rank(row));
    let kept = kept_run.and_then(|run| runs.iter().find(|(row, _)| row.run == run));
    match (fresh, kept) {
        (Some(f), Some(k)) if rank(&k.0) < rank(&f.0) => Some((k, true)),
        (Some(f), _) => Some((f, false)),
        (None, Some(k)) => Some((k, true)),
        (None, None) => None,
    }
}

/// One dataset's Fig. 9 curve ([`source_run`] by [`curve_rank`]): read from the run's
/// metrics.jsonl, or the curve an earlier report kept; None when neither exists.
fn dataset_curve(
    dataset: &str,
    runs: &[(ResultRow, PathBuf)],
    kept: &BTreeMap<String, kept::Fig9Curve>,
) -> Result<Option<(ResultRow, kept::Fig9Curve)>> {
    let kept = kept.get(dataset);
    let source = source_run(
        runs,
        dataset,
        |folder| folder.metrics().is_file(),
        kept.map(|curve| curve.run.as_str()),
        curve_rank,
    );
    let Some(((row, dir), is_kept)) = source else {
        return Ok(None);
    };
    let curve = match kept {
        Some(curve) if is_kept => curve.clone(),
        _ => kept::Fig9Curve {
            run: row.run.clone(),
            points: read_metrics(dir)?
                .iter()
                .map(|m| (m.epoch, m.max_cls_attention))
                .collect(),
        },
    };
    Ok(Some((row.clone(), curve)))
}

/// Fig. 9: the per-epoch mean max CLS attention of one run per dataset ([`curve_rank`]), with
/// the paper's end value dashed, and the curves kept beside it ([`kept::CURVES`]). Returns the
/// figure's caption, naming the datasets without a curve here; None when no dataset has one.
pub(super) fn attention_curves(
    out: &Path,
    runs: &[(ResultRow, PathBuf)],
    colors: &DatasetColors,
) -> Result<Option<String>> {
    let fig9 = paper::fig9()?;
    let rows: Vec<&ResultRow> = runs.iter().map(|(row, _)| row).collect();
    let kept = kept::kept_curves(out, &rows)?;
    let mut curves: Vec<(String, kept::Fig9Curve)> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut series = Vec::new();
    for dataset in datasets(runs) {
        let Some((row, curve)) = dataset_curve(&dataset, runs, &kept)? else {
            missing.push(dataset);
            continue;
        };
        let color = colors.color(&dataset);
        let last = curve.points.len() as f64;
        series.push(Series {
            label: Some(format!(
                "{} ({}, n {}, η {}, seed {})",
                dataset,
                row.config.mode_label(),
                row.config.n,
                row.config.eta,
                row.config.seed
            )),
            color,
            width: 2,
            dashed: false,
            markers: false,
            points: curve.points.iter().map(|&(e, v)| (e as f64, v)).collect(),
        });
        if let Some(end) = fig9.end(&dataset) {
            // The paper's end value as a dashed mark over the last tenth of the epochs.
            series.push(Series {
                label: None,
                color,
                width: 2,
                dashed: true,
                markers: false,
                points: vec![(last * 0.9, end), (last, end)],
            });
        }
        curves.push((dataset, curve));
    }
    if curves.is_empty() {
        return Ok(None);
    }
    line_panels(
        &out.join(FIG9),
        "Attention sparsifies while fitting noisy labels (Fig. 9 style)",
        &[LinePanel {
            title: "mean max CLS attention of the last layer".into(),
            x_label: "epoch".into(),
            y_label: "mean max attention probability".into(),
            y_range: (0.0, 1.0),
            series,
        }],
    )?;
    kept::write_curves(out, &curves)?;
    let mut caption = format!(
        "Fig. 9-style: mean max CLS attention per epoch, one run per dataset (dashed: the \
         paper's value at epoch 2000; the data in `{}`)",
        kept::CURVES
    );
    if !missing.is_empty() {
        write!(
            caption,
            ". No curve for {}: the per-epoch logs of its runs are not here (metrics.jsonl \
             stays with each run, uncommitted) and no earlier report kept a curve",
            missing.join(", ")
        )?;
    }
    Ok(Some(caption))
}

/// Memorization against test accuracy of every run with flipped labels: a panel per mode, a
/// colour and marker per dataset.
pub(super) fn memorization_scatter(
    path: &Path,
    rows: &[ResultRow],
    colors: &DatasetColors,
) -> Result<bool> {
    let mut panels: Vec<(String, Vec<ScatterGroup>)> = Vec::new();
    for r in rows.iter().filter(|r| r.memorization().is_finite()) {
        let mode = r.mode();
        let panel = match panels.iter().position(|(m, _)| *m == mode) {
            Some(k) => &mut panels[k].1,
            None => {
                panels.push((mode, Vec::new()));
                &mut panels.last_mut().expect("just pushed").1
            }
        };
        let point = (r.memorization(), r.test_acc());
        let dataset = r.dataset();
        match panel.iter_mut().find(|g| g.label == dataset) {
            Some(g) => g.points.push(point),
            None => panel.push(ScatterGroup {
                color: colors.color(&dataset),
                marker: colors.marker(&dataset),
                label: dataset,
                points: vec![point],
            }),
        }
    }
    if panels.is_empty() {
        return Ok(false);
    }
    // The paper's mode first.
    panels.sort_by_key(|(mode, _)| mode != Mode::LastLayer.name());
    let panels: Vec<ScatterPanel> = panels
        .into_iter()
        .map(|(mode, groups)| ScatterPanel {
            title: format!("{mode} mode, every run with label noise"),
            x_label: "memorization (noisy samples fitted to their noisy label)".into(),
            y_label: "test accuracy".into(),
            groups,
            x_marks: Vec::new(),
        })
        .collect();
    scatter_panels(
        path,
        "Benign or harmful: memorization vs test accuracy",
        &panels,
    )?;
    Ok(true)
}

/// The file one dataset's attention maps are copied to in the report folder; a dataset given by
/// its path (`folder:data/pets`) with every character a file name should not hold as `_`.
pub fn attention_file(dataset: &str) -> String {
    let safe: String = dataset
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("attention_{safe}.png")
}

/// Which run's attention maps stand for its dataset, lowest first: the closest to the paper's
/// headline setting (last-layer mode, η = 0.2, n = 200, seed 42), in that order of importance;
/// ties go to the lowest seed, then the run's name.
fn map_rank(row: &ResultRow) -> (bool, u64, usize, bool, u64, String) {
    let c = &row.config;
    (
        c.mode != Mode::LastLayer,
        ((c.eta - 0.2).abs() * 1e9).round() as u64,
        c.n.abs_diff(200),
        c.seed != 42,
        c.seed,
        row.run.clone(),
    )
}

/// report.md's attention-map section: per dataset (in name order), one run's attention_maps.png
/// copied into `out` (or the copy an earlier report made of it, kept when unchanged; see
/// [`kept`]) and embedded with a caption naming the run, or a line saying that none of the
/// dataset's runs has one here.
pub(super) fn attention_maps(out: &Path, runs: &[(ResultRow, PathBuf)]) -> Result<String> {
    let datasets = datasets(runs);
    if datasets.is_empty() {
        return Ok(String::new());
    }
    let rows: Vec<&ResultRow> = runs.iter().map(|(row, _)| row).collect();
    let kept = kept::kept_maps(out, &rows, attention_file)?;
    let mut md = String::new();
    let mut sources: Vec<(String, String)> = Vec::new();
    writeln!(md, "## Attention maps\n")?;
    writeln!(
        md,
        "Token selection on real inputs, one run per dataset (the closest to last-layer mode, \
         η = 0.2, n = 200, seed 42): the first clean and the first noisy fine-tune samples, right \
         after the query/key reset and after the last epoch. `{}` names the run each map comes \
         from.\n",
        kept::MAPS
    )?;
    for dataset in &datasets {
        let source = source_run(
            runs,
            dataset,
            |folder| folder.attention_maps().is_file(),
            kept.get(dataset).map(String::as_str),
            map_rank,
        );
        let Some(((row, dir), is_kept)) = source else {
            writeln!(
                md,
                "- {dataset}: no attention map; none of its runs has attention_maps.png here \
                 (the file stays with the run, uncommitted; runs made before the maps existed \
                 have none) and no earlier report kept one.\n"
            )?;
            continue;
        };
        let file = attention_file(dataset);
        if !is_kept {
            let source = RunFolder(dir.clone()).attention_maps();
            produce_atomic(&out.join(&file), |tmp| {
                std::fs::copy(&source, tmp)
                    .with_context(|| format!("copying {}", source.display()))?;
                Ok(())
            })?;
        }
        sources.push((dataset.clone(), row.run.clone()));
        let c = &row.config;
        let caption = format!(
            "{dataset}: run `{}` ({} mode, n = {}, η = {}, seed {}, {} epochs)",
            row.run,
            c.mode_label(),
            c.n,
            c.eta,
            c.seed,
            c.epochs
        );
        writeln!(md, "{caption}\n\n![{caption}]({file})\n")?;
    }
    kept::write_maps(out, &sources, attention_file)?;
    Ok(md)
}
