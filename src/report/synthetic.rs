//! Outputs of the synthetic experiment: metrics.jsonl, summary.json and the Fig. 1 / Fig. 3 style
//! figures of one run; the CSV and heat maps (Fig. 5 style) of a grid.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::plot::{
    Grid2d, LinePanel, Marker, PALETTE, ScatterGroup, ScatterPanel, Series, category_map,
    heatmap_in, line_panels, scatter_panels, subscript,
};
use crate::io::{ensure_dir, write_csv, write_json, write_json_lines};
use crate::synthetic::{GridSize, Regime, RunSummary, SweepRow, SyntheticConfig, SyntheticRun};

/// summary.json: the summary fields at top level, then the config that reproduces the run.
#[derive(Serialize)]
struct SummaryFile<'a> {
    #[serde(flatten)]
    summary: &'a RunSummary,
    config: &'a SyntheticConfig,
    version: &'static str,
}

pub fn summary_json(run: &SyntheticRun) -> serde_json::Value {
    let file = SummaryFile {
        summary: &run.summary,
        config: &run.config,
        version: env!("CARGO_PKG_VERSION"),
    };
    serde_json::to_value(file).expect("summary fields serialise")
}

/// metrics.jsonl, summary.json, token_probs.png and selected_tokens.png under `dir`.
pub fn write_run(dir: &Path, run: &SyntheticRun) -> Result<()> {
    ensure_dir(dir)?;
    write_json_lines(&dir.join("metrics.jsonl"), &run.metrics)?;
    write_json(&dir.join("summary.json"), &summary_json(run))?;
    plot_token_probabilities(&dir.join("token_probs.png"), run)?;
    plot_selected_tokens(&dir.join("selected_tokens.png"), run)?;
    Ok(())
}

/// The metrics as JSON lines, then the summary as one JSON line.
pub fn print_run(out: &mut impl Write, run: &SyntheticRun, with_metrics: bool) -> Result<()> {
    if with_metrics {
        for row in &run.metrics {
            serde_json::to_writer(&mut *out, row)?;
            writeln!(out)?;
        }
    }
    serde_json::to_writer(&mut *out, &summary_json(run))?;
    writeln!(out)?;
    Ok(())
}

fn token_names(seq_len: usize) -> Vec<&'static str> {
    let mut names = vec![
        "x₁ relevant",
        "x₂ weakly relevant (Y*)",
        "x₃ weakly relevant (−Y*)",
    ];
    names.extend(std::iter::repeat_n("", seq_len - 3));
    names
}

/// Fig. 3 style: softmax probability of every token vs step, for one clean and one noisy sample.
pub fn plot_token_probabilities(path: &Path, run: &SyntheticRun) -> Result<()> {
    let t_len = run.config.seq_len;
    let names = token_names(t_len);
    let panel_for = |sample: usize, what: &str| {
        let series = (0..t_len)
            .map(|t| {
                let irrelevant = t >= 3;
                Series {
                    label: match t {
                        0..=2 => Some(names[t].to_string()),
                        3 => Some(format!("x₄…x{} irrelevant", subscript(t_len))),
                        _ => None,
                    },
                    color: if irrelevant { PALETTE[7] } else { PALETTE[t] },
                    width: if irrelevant { 1 } else { 3 },
                    dashed: false,
                    markers: false,
                    points: run
                        .attention_trace
                        .iter()
                        .enumerate()
                        .map(|(step, row)| (step as f64, row[sample * t_len + t] as f64))
                        .collect(),
                }
            })
            .collect();
        LinePanel {
            title: format!("{what} training sample #{sample}"),
            x_label: "step".into(),
            y_label: if run.config.encoder.is_some() {
                "CLS attention".into()
            } else {
                "softmax probability".into()
            },
            y_range: (0.0, 1.0),
            series,
        }
    };
    let mut panels = Vec::new();
    if let Some(clean) = run.noisy_mask.iter().position(|&m| !m) {
        panels.push(panel_for(clean, "clean"));
    }
    if let Some(noisy) = run.noisy_mask.iter().position(|&m| m) {
        panels.push(panel_for(noisy, "noisy"));
    }
    let c = &run.config;
    let title = format!(
        "{}, d = {}, ‖μ‖ = {}, η = {} ({})",
        if c.encoder.is_some() {
            "One-layer encoder, CLS attention"
        } else {
            "Token selection"
        },
        c.embed_dim,
        c.signal_norm,
        c.noise_ratio,
        run.summary.regime.name()
    );
    line_panels(path, &title, &panels)
}

/// Fig. 1 style: each sample's most attended token in the μ₊/μ₋ plane, train and test.
pub fn plot_selected_tokens(path: &Path, run: &SyntheticRun) -> Result<()> {
    let groups = |selected: &[crate::synthetic::trajectory::SelectedToken]| {
        let pick = |label: f64, noisy: bool| -> Vec<(f64, f64)> {
            selected
                .iter()
                .filter(|s| s.label == label && s.noisy == noisy)
                .map(|s| (s.mu_plus as f64, s.mu_minus as f64))
                .collect()
        };
        let mut groups = vec![
            ScatterGroup {
                label: "y = +1".into(),
                color: PALETTE[0],
                marker: Marker::Circle,
                points: pick(1.0, false),
            },
            ScatterGroup {
                label: "y = −1".into(),
                color: PALETTE[2],
                marker: Marker::Circle,
                points: pick(-1.0, false),
            },
        ];
        for (label, color) in [(1.0, PALETTE[0]), (-1.0, PALETTE[2])] {
            let points = pick(label, true);
            if !points.is_empty() {
                let name = format!("noisy, y = {}", if label > 0.0 { "+1" } else { "−1" });
                groups.push(ScatterGroup {
                    label: name,
                    color,
                    marker: Marker::Triangle,
                    points,
                });
            }
        }
        groups
    };
    let s = &run.summary;
    let panels = [
        ScatterPanel {
            title: format!("train (acc {:.3})", s.train_acc),
            x_label: "μ₊ coordinate of selected token".into(),
            y_label: "μ₋ coordinate of selected token".into(),
            groups: groups(&run.selected_train),
            x_marks: Vec::new(),
        },
        ScatterPanel {
            title: format!("test (acc {:.3})", s.test_acc),
            x_label: "μ₊ coordinate of selected token".into(),
            y_label: "μ₋ coordinate of selected token".into(),
            groups: groups(&run.selected_test),
            x_marks: Vec::new(),
        },
    ];
    let title = format!(
        "{}Selected tokens, SNR {:.3}: {}",
        model_name(&run.config),
        s.snr,
        s.regime.name()
    );
    scatter_panels(path, &title, &panels)
}

/// `<name>.csv`, one row per cell, and `<name>_config.json`, the grid and the base config.
fn write_grid_table(
    dir: &Path,
    name: &str,
    grid: GridSize,
    base: &SyntheticConfig,
    rows: &[SweepRow],
) -> Result<()> {
    ensure_dir(dir)?;
    write_csv(&dir.join(format!("{name}.csv")), rows)?;
    write_json(
        &dir.join(format!("{name}_config.json")),
        &serde_json::json!({ "grid": grid, "base": base }),
    )
}

/// The colour ranges of Fig. 6's heat maps (the one-layer encoder), read from the paper's figure
/// (docs/protocol.md §2.7).
const FIG6_TRAIN_LOSS_RANGE: (f64, f64) = (0.405, 0.55);
const FIG6_TEST_LOSS_RANGE: (f64, f64) = (0.41, 0.64);

/// "One-layer encoder, " for the encoder's figures; nothing for the token selector's.
fn model_name(config: &SyntheticConfig) -> &'static str {
    if config.encoder.is_some() {
        "one-layer encoder, "
    } else {
        ""
    }
}

/// sweep.csv, heatmap_train_loss.png, heatmap_test_loss.png and regime.png under `dir`.
pub fn write_sweep(
    dir: &Path,
    grid: GridSize,
    base: &SyntheticConfig,
    rows: &[SweepRow],
) -> Result<()> {
    write_grid_table(dir, "sweep", grid, base, rows)?;
    let xs: Vec<f64> = grid.embed_dims().into_iter().map(|d| d as f64).collect();
    let ys = grid.signal_norms();
    let dims = (xs.len(), ys.len());
    let subtitle = format!(
        "{}n = {}, η = {}, {} steps",
        model_name(base),
        base.train_n,
        base.noise_ratio,
        base.num_steps
    );
    // The encoder's heat maps in Fig. 6's colour ranges, so that they read beside the paper's.
    let encoder = base.encoder.is_some();
    for (name, label, values, range) in [
        (
            "heatmap_train_loss.png",
            "train loss",
            in_plot_order(rows, dims, |r| r.train_loss),
            encoder.then_some(FIG6_TRAIN_LOSS_RANGE),
        ),
        (
            "heatmap_test_loss.png",
            "test loss",
            in_plot_order(rows, dims, |r| r.test_loss),
            encoder.then_some(FIG6_TEST_LOSS_RANGE),
        ),
    ] {
        let grid2d = Grid2d {
            xs: &xs,
            ys: &ys,
            values: &values,
            x_label: "d (embed_dim)",
            y_label: "‖μ‖ (signal_norm)",
        };
        heatmap_in(
            &dir.join(name),
            &format!("Final {label}, {subtitle}"),
            &grid2d,
            label,
            range,
        )?;
    }
    let regimes = in_plot_order(rows, dims, |r| {
        Regime::ALL
            .iter()
            .position(|regime| *regime == r.regime)
            .expect("every regime is listed")
    });
    regime_map(&dir.join("regime.png"), (&xs, &ys), &regimes, &subtitle)
}

/// The rows' values in the plots' order: rows come ordered by (d, ‖μ‖), the plots index cells by
/// (‖μ‖ row, d column).
fn in_plot_order<T>(
    rows: &[SweepRow],
    (nx, ny): (usize, usize),
    value: impl Fn(&SweepRow) -> T,
) -> Vec<T> {
    (0..ny)
        .flat_map(|iy| (0..nx).map(move |ix| (iy, ix)))
        .map(|(iy, ix)| value(&rows[ix * ny + iy]))
        .collect()
}

/// regime.png: each cell's regime (an index into [`Regime::ALL`]) in its colour.
fn regime_map(
    path: &Path,
    (xs, ys): (&[f64], &[f64]),
    regimes: &[usize],
    subtitle: &str,
) -> Result<()> {
    let legend: Vec<(&str, _)> = Regime::ALL
        .iter()
        .enumerate()
        .map(|(k, r)| (r.name(), regime_color(k)))
        .collect();
    let grid2d = Grid2d {
        xs,
        ys,
        values: regimes,
        x_label: "d (embed_dim)",
        y_label: "‖μ‖ (signal_norm)",
    };
    category_map(path, &format!("Regime, {subtitle}"), &grid2d, &legend)
}

/// localization.csv (the sweep's columns, spectrum and entropies included) and
/// entropy_vs_eigen_variance.png: the final attention entropy of clean and of noisy training
/// samples against the final eigen-variance of W's symmetric part, and the noisy samples' entropy
/// against that variance's change from initialisation, one colour per regime.
pub fn write_localization(
    dir: &Path,
    grid: GridSize,
    base: &SyntheticConfig,
    rows: &[SweepRow],
) -> Result<()> {
    write_grid_table(dir, "localization", grid, base, rows)?;
    let groups = |point: &dyn Fn(&SweepRow) -> Option<(f64, f64)>| -> Vec<ScatterGroup> {
        Regime::ALL
            .iter()
            .enumerate()
            .map(|(k, regime)| ScatterGroup {
                label: regime.name().to_string(),
                color: regime_color(k),
                marker: Marker::Circle,
                points: rows
                    .iter()
                    .filter(|r| r.regime == *regime)
                    .filter_map(point)
                    .collect(),
            })
            .filter(|g| !g.points.is_empty())
            .collect()
    };
    let variance = "eigen-variance of W's symmetric part (final)";
    let panels = [
        ScatterPanel {
            title: "clean samples".into(),
            x_label: variance.into(),
            y_label: "attention entropy (final)".into(),
            groups: groups(&|r| Some((r.qk_sym_var?, r.clean_entropy))),
            x_marks: Vec::new(),
        },
        ScatterPanel {
            title: "noisy samples".into(),
            x_label: variance.into(),
            y_label: "attention entropy (final)".into(),
            groups: groups(&|r| Some((r.qk_sym_var?, r.noisy_entropy?))),
            x_marks: Vec::new(),
        },
        ScatterPanel {
            title: "noisy samples, change from W₀".into(),
            x_label: "eigen-variance, final − initial".into(),
            y_label: "attention entropy (final)".into(),
            groups: groups(&|r| Some((r.qk_sym_var? - r.qk_sym_var_init?, r.noisy_entropy?))),
            x_marks: Vec::new(),
        },
    ];
    let title = format!(
        "Entropy vs QK eigen-variance over d × ‖μ‖ (n = {}, η = {}, T = {}, {} steps, λ = {})",
        base.train_n, base.noise_ratio, base.seq_len, base.num_steps, base.locater
    );
    scatter_panels(&dir.join("entropy_vs_eigen_variance.png"), &title, &panels)
}

fn regime_color(k: usize) -> plotters::style::RGBColor {
    // not overfitting, benign, harmful, underfitting, no label noise
    [PALETTE[2], PALETTE[1], PALETTE[0], PALETTE[4], PALETTE[7]][k]
}
