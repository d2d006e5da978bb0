//! reproduce's report written: results.csv, report.md, verdicts.csv and the figures' data.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::super::paper;
use super::super::results::{Cell, ResultRow, Stat, aggregate, write_csv};
use super::super::verdict::{self, VerdictRow};
use crate::io::{ensure_dir, write_atomic};
use crate::train::run::Mode;

use super::figures::{
    DatasetColors, FIG8, FIG9, SCATTER, attention_curves, attention_maps, check_logs,
    memorization_scatter, noise_sweep, read_metrics,
};

pub const VERDICTS: &str = "verdicts.csv";

/// Writes results.csv, report.md and the figures the runs allow into `out`.
pub fn write_report(
    out: &Path,
    runs: &[(ResultRow, PathBuf)],
    sources: &[PathBuf],
    missing: &[String],
) -> Result<()> {
    check_logs(runs)?;
    ensure_dir(out)?;
    let rows: Vec<ResultRow> = runs.iter().map(|(r, _)| r.clone()).collect();
    write_csv(&out.join("results.csv"), &rows)?;
    let cells = aggregate(&rows);
    let verdict_rows = verdicts(&cells)?;
    verdict::write_csv(&out.join(VERDICTS), &verdict_rows)?;
    let mut figures: Vec<(&str, String)> = Vec::new();
    let colors = DatasetColors::of(runs);
    if noise_sweep(&out.join(FIG8), &rows, &colors)? {
        figures.push((FIG8, "Fig. 8-style: train and test loss against the label-noise rate η at n = 200, seed 42 (the `fig8` experiment's point), one run per marker; only measured η are drawn, the lines just join them. Its train loss is the authors' `eval_train/eval_loss`: cross-entropy on the noisy fine-tune set evaluated after the last epoch; the table's train loss is the Trainer's logged mean batch loss of the last epoch (`log_history[-4][\"loss\"]`)".into()));
    }
    if let Some(caption) = attention_curves(out, runs, &colors)? {
        figures.push((FIG9, caption));
    }
    if memorization_scatter(&out.join(SCATTER), &rows, &colors)? {
        figures.push((
            SCATTER,
            "Memorization of the noisy labels against test accuracy, every run".into(),
        ));
    }
    let mode_order = |mode: &str| usize::from(mode != Mode::LastLayer.name());
    let dataset_style = |dataset: &str| (colors.color(dataset), colors.marker(dataset));
    let (theory, theory_figures) =
        super::super::theory::section(out, &rows, &verdict_rows, &mode_order, &dataset_style)?;
    figures.extend(theory_figures);
    let theory = theory + &super::super::delay::section(runs, &read_metrics)?;
    let mut markdown = markdown(&rows, &cells, &verdict_rows, &theory, sources, &figures)?;
    if !missing.is_empty() {
        // Under the title, so a partial table is never read as the whole grid.
        let title_end = markdown.find("\n\n").map_or(0, |i| i + 2);
        let note = format!("**Partial report**: {}.\n\n", missing.join("; "));
        markdown.insert_str(title_end, &note);
    }
    markdown.push_str(&attention_maps(out, runs)?);
    write_atomic(&out.join("report.md"), |w| {
        Ok(std::io::Write::write_all(w, markdown.as_bytes())?)
    })
}

pub(super) fn pct(s: Stat) -> String {
    if s.mean.is_nan() {
        "–".into()
    } else {
        format!("{:.1} ± {:.1}", 100.0 * s.mean, 100.0 * s.std)
    }
}

pub(super) fn two(s: Stat) -> String {
    if s.mean.is_nan() {
        "–".into()
    } else {
        format!("{:.2} ± {:.2}", s.mean, s.std)
    }
}

/// n·SNR² to three significant digits (it spans decades across cells).
pub(super) fn n_snr2(s: Stat) -> String {
    if s.mean.is_nan() {
        "–".into()
    } else {
        format!("{:.3} ± {:.2}", s.mean, s.std)
    }
}

pub(super) fn printed(p: paper::Printed, decimals: usize) -> String {
    format!("{:.*} ± {:.*}", decimals, p[0], decimals, p[1])
}

/// The distinct values of a field over rows, as "a, b".
pub(super) fn distinct<T: ToString>(
    rows: &[&ResultRow],
    field: impl Fn(&ResultRow) -> T,
) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in rows {
        let v = field(r).to_string();
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.join(", ")
}

pub(super) fn markdown(
    rows: &[ResultRow],
    cells: &[Cell],
    verdict_rows: &[VerdictRow],
    theory: &str,
    sources: &[PathBuf],
    figures: &[(&str, String)],
) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "# Reproduction of Sakamoto & Sato (ICML 2025), real-data experiments\n"
    )?;
    writeln!(
        md,
        "{} finished runs from {}. Cells are mean ± population std over seeds (as the authors \
         printed); accuracies in %. Paper numbers: docs/protocol.md §4.1 (Table 2, v3 notebook).\n",
        rows.len(),
        sources
            .iter()
            .map(|s| format!("`{}`", s.display()))
            .collect::<Vec<_>>()
            .join(", ")
    )?;

    settings_section(&mut md, rows, cells)?;
    table2_section(&mut md, cells)?;
    verdict::markdown(&mut md, verdict_rows)?;
    md.push_str(theory);
    if !figures.is_empty() {
        writeln!(md, "## Figures\n")?;
        for (file, caption) in figures {
            writeln!(md, "{caption}\n\n![{caption}]({file})\n")?;
        }
    }
    Ok(md)
}

/// What each dataset ran with, beside the paper's settings, and every deviation the runs recorded.
pub(super) fn settings_section(md: &mut String, rows: &[ResultRow], cells: &[Cell]) -> Result<()> {
    writeln!(md, "## Settings and deviations\n")?;
    writeln!(
        md,
        "| dataset | backbone used | mode | pretrain_n | test_n | phase-1 / phase-2 epochs | seeds |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    let mut by_dataset: BTreeMap<usize, (String, Vec<&ResultRow>)> = BTreeMap::new();
    let order: Vec<String> = cells.iter().fold(Vec::new(), |mut seen, c| {
        if !seen.contains(&c.dataset) {
            seen.push(c.dataset.clone());
        }
        seen
    });
    for r in rows {
        let rank = order.iter().position(|d| *d == r.dataset()).unwrap_or(0);
        by_dataset
            .entry(rank)
            .or_insert_with(|| (r.dataset(), Vec::new()))
            .1
            .push(r);
    }
    for (dataset, runs) in by_dataset.values() {
        writeln!(
            md,
            "| {dataset} | {} | {} | {} | {} | {} / {} | {} |",
            distinct(runs, |r| r.resolved.backbone.clone()),
            distinct(runs, |r| r.mode()),
            distinct(runs, |r| r.resolved.pretrain_n),
            distinct(runs, |r| r.resolved.test_n),
            distinct(runs, |r| r.config.pretrain_epochs),
            distinct(runs, |r| r.config.epochs),
            distinct(runs, |r| r.config.seed),
        )?;
    }
    writeln!(
        md,
        "\nThe paper: ViT-B/16 (in21k) for images and bert-base-uncased for text, pretrain_n \
         10000 (3000 PneumoniaMNIST and TREC, 200 BreastMNIST), the full test sets, 300 / 2000 \
         epochs, seeds 42, 314, 2718.\n"
    )?;
    let mut deviations: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows {
        for d in r.deviations.iter().filter(|d| !d.is_empty()) {
            let datasets = deviations.entry(d.to_string()).or_default();
            if !datasets.contains(&r.dataset()) {
                datasets.push(r.dataset());
            }
        }
    }
    if deviations.is_empty() {
        writeln!(md, "No run recorded a deviation.\n")?;
    } else {
        writeln!(md, "Deviations recorded by the runs:\n")?;
        for (d, datasets) in &deviations {
            writeln!(md, "- ({}) {d}", datasets.join(", "))?;
        }
        writeln!(md)?;
    }
    Ok(())
}

/// Table 2's cells, ours beside the paper's, with what each column means.
pub(super) fn table2_section(md: &mut String, cells: &[Cell]) -> Result<()> {
    let table2 = paper::table2()?;
    writeln!(
        md,
        "## Table 2: train loss on the noisy labels and test accuracy\n"
    )?;
    writeln!(
        md,
        "| dataset | mode | η | n | seeds | n·SNR² | train loss | memorization | test acc | after reset | baseline | max CLS attn | QK eigen mean / var | paper train loss | paper test acc | paper baseline |"
    )?;
    writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for c in cells {
        let paper_cell = table2.cell(&c.dataset, c.eta, c.n);
        let paper_baseline = table2.dataset(&c.dataset).map(|d| d.baseline);
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.dataset,
            c.mode,
            c.eta,
            c.n,
            c.seeds.len(),
            n_snr2(c.n_snr2),
            two(c.train_loss),
            pct(c.memorization),
            pct(c.test_acc),
            pct(c.reset_test_acc),
            pct(c.baseline_test_acc),
            two(c.max_cls_attention),
            if c.qk_eigen_mean.mean.is_nan() {
                "–".to_string()
            } else {
                format!("{:.2e} / {:.2e}", c.qk_eigen_mean.mean, c.qk_eigen_var.mean)
            },
            paper_cell.map_or("–".into(), |p| printed(p.train_loss, 2)),
            paper_cell.map_or("–".into(), |p| printed(p.test_acc, 1)),
            paper_baseline.map_or("–".into(), |p| printed(p, 2)),
        )?;
    }
    writeln!(
        md,
        "\nMemorization: share of the flipped samples predicted as their noisy label (– when η = 0). \
         Train loss: mean batch loss of the last epoch, as the authors' `log_history[-4]`. \
         After reset: test accuracy right after the query/key reset, before any phase-2 step \
         (baseline → after reset is the reset's cost, after reset → test acc the training's). \
         Max CLS attn: mean over samples and heads of the largest attention probability of the \
         selecting query (Fig. 9). QK eigen mean / var: of the real parts of the final query-key \
         matrix's eigenvalues, mean over heads (docs/protocol.md §5; definitions in `src/diagnostics/`).\n"
    )?;
    Ok(())
}

/// The verdict per (dataset, backbone, mode, n) of the cells, the paper's beside (verdicts.csv and
/// report.md's verdict section).
pub(super) fn verdicts(cells: &[Cell]) -> Result<Vec<VerdictRow>> {
    Ok(verdict::verdicts(cells, &paper::table2()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DatasetName;
    use crate::report::kept;
    use crate::report::results::tests::row;
    use crate::train::metrics::EpochMetrics;
    use crate::train::run::RunFolder;

    /// A run folder `name` under `root` (with attention_maps.png holding `name` when `maps`).
    fn run(
        root: &Path,
        name: &str,
        change: impl FnOnce(&mut ResultRow),
        maps: bool,
    ) -> (ResultRow, PathBuf) {
        let mut r = row(name, 0.2, 42, 0.8, 0.1, 0.5, 0.7);
        change(&mut r);
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        if maps {
            std::fs::write(RunFolder(dir.clone()).attention_maps(), name).unwrap();
        }
        (r, dir)
    }

    /// A dataset has one colour in every figure, whatever the mode; the scatter gives each mode
    /// its own panel (two panels side by side here), on one range.
    #[test]
    fn a_dataset_keeps_its_colour_and_each_mode_its_panel() {
        let dir = tempfile::tempdir().unwrap();
        let runs = vec![
            run(dir.path(), "t-last", |_| {}, false),
            run(
                dir.path(),
                "t-head",
                |r| r.summary.config.mode = Mode::Head,
                false,
            ),
            run(
                dir.path(),
                "m-last",
                |r| r.summary.config.dataset = DatasetName::Mnist,
                false,
            ),
        ];
        let colors = DatasetColors::of(&runs);
        assert_eq!(colors.0, ["mnist", "trec"]);
        assert_ne!(colors.color("mnist"), colors.color("trec"));
        let rows: Vec<ResultRow> = runs.iter().map(|(r, _)| r.clone()).collect();
        let path = dir.path().join("scatter.png");
        assert!(memorization_scatter(&path, &rows, &colors).unwrap());
        // A PNG's width: the IHDR chunk's first field, bytes 16..20, big-endian.
        let png = std::fs::read(&path).unwrap();
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 2 * 560);
    }

    /// Per dataset, the run closest to last-layer mode, η 0.2, n 200, seed 42 among those with
    /// a map is copied and named; a dataset without any map gets a line saying so.
    #[test]
    fn one_attention_map_per_dataset_from_the_closest_run() {
        let dir = tempfile::tempdir().unwrap();
        let (root, out) = (dir.path().join("runs"), dir.path().join("report"));
        std::fs::create_dir_all(&out).unwrap();
        let runs = vec![
            // The exact setting, but it wrote no map (an older run).
            run(&root, "t-exact", |r| r.summary.config.n = 200, false),
            run(
                &root,
                "t-eta0",
                |r| {
                    r.summary.config.n = 200;
                    r.summary.config.eta = 0.0;
                },
                true,
            ),
            run(
                &root,
                "t-head",
                |r| {
                    r.summary.config.n = 200;
                    r.summary.config.mode = Mode::Head;
                },
                true,
            ),
            run(&root, "t-seed314", |r| r.summary.config.seed = 314, true),
            run(&root, "t-n20", |_| {}, true),
            run(
                &root,
                "m-old",
                |r| r.summary.config.dataset = DatasetName::Mnist,
                false,
            ),
        ];
        let md = attention_maps(&out, &runs).unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("attention_trec.png")).unwrap(),
            "t-n20"
        );
        assert!(
            md.contains("![trec: run `t-n20` (last-layer mode, n = 20, η = 0.2, seed 42"),
            "{md}"
        );
        assert!(md.contains("- mnist: no attention map"), "{md}");
        assert!(!out.join("attention_mnist.png").exists());
        assert!(attention_maps(&out, &[]).unwrap().is_empty());
    }

    /// A metrics.jsonl for `dir` with epochs 0..=last whose last value is `end`.
    fn write_log(dir: &Path, last: usize, end: f64) {
        let metrics: Vec<EpochMetrics> = (0..=last)
            .map(|epoch| EpochMetrics {
                epoch,
                max_cls_attention: if epoch == last {
                    end
                } else {
                    0.01 * epoch as f64
                },
                ..row("x", 0.2, 42, 0.8, 0.1, 0.5, 0.7).last.clone()
            })
            .collect();
        crate::io::write_json_lines(&RunFolder(dir.to_path_buf()).metrics(), &metrics).unwrap();
    }

    /// Where the runs' own files are gone (a fresh checkout of a committed grid), the report is
    /// made again from what it kept, and only from what still belongs to a finished run.
    #[test]
    fn a_report_made_again_without_the_runs_files_keeps_what_it_drew() {
        let dir = tempfile::tempdir().unwrap();
        let (root, out) = (dir.path().join("runs"), dir.path().join("report"));
        std::fs::create_dir_all(&out).unwrap();
        let mut runs = vec![run(&root, "t-n200", |r| r.summary.config.n = 200, true)];
        write_log(&runs[0].1, 10, 0.2);
        let caption = attention_curves(&out, &runs, &DatasetColors::of(&runs))
            .unwrap()
            .unwrap();
        assert!(!caption.contains("No curve"), "{caption}");
        let md = attention_maps(&out, &runs).unwrap();
        assert!(md.contains("![trec: run `t-n200`"), "{md}");
        let curves = std::fs::read_to_string(out.join(kept::CURVES)).unwrap();
        let map = std::fs::read(out.join("attention_trec.png")).unwrap();

        // The run's log and map are gone: both come from what the report kept.
        std::fs::remove_file(RunFolder(runs[0].1.clone()).metrics()).unwrap();
        std::fs::remove_file(RunFolder(runs[0].1.clone()).attention_maps()).unwrap();
        assert_eq!(
            attention_curves(&out, &runs, &DatasetColors::of(&runs))
                .unwrap()
                .unwrap(),
            caption
        );
        assert_eq!(
            std::fs::read_to_string(out.join(kept::CURVES)).unwrap(),
            curves
        );
        assert_eq!(attention_maps(&out, &runs).unwrap(), md);
        assert_eq!(std::fs::read(out.join("attention_trec.png")).unwrap(), map);

        // A better-ranked run with its own files replaces the kept ones.
        runs.push(run(
            &root,
            "t-n200-eta0.1",
            |r| {
                r.summary.config.n = 200;
                r.summary.config.eta = 0.1;
            },
            false,
        ));
        write_log(&runs[1].1, 10, 0.2);
        attention_curves(&out, &runs, &DatasetColors::of(&runs))
            .unwrap()
            .unwrap();
        assert!(
            std::fs::read_to_string(out.join(kept::CURVES))
                .unwrap()
                .contains("t-n200-eta0.1")
        );
        runs.pop();
        std::fs::write(out.join(kept::CURVES), &curves).unwrap();

        // A kept curve that no longer ends at its run's final value, or a copy that changed,
        // stands for nothing: left out, and said so.
        runs[0].0.summary.last.max_cls_attention = 0.3;
        let caption = attention_curves(&out, &runs, &DatasetColors::of(&runs)).unwrap();
        assert!(caption.is_none(), "{caption:?}");
        std::fs::write(out.join("attention_trec.png"), "edited").unwrap();
        let md = attention_maps(&out, &runs).unwrap();
        assert!(md.contains("- trec: no attention map"), "{md}");
    }
}
