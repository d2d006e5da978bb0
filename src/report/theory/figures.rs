//! The section's figures: memorization and Δ against log₁₀ n·SNR², a panel per mode, each cell a
//! point with its seeds' spread, its bound and its twin's regime changes.

use std::path::Path;

use anyhow::Result;

use super::cells::{CellAndTwin, modes};
use crate::report::plot::{
    ErrorPanel, ErrorPoint, LegendEntry, LegendKey, Shape, error_scatter_panels,
};

pub const MEMORIZATION_FIGURE: &str = "memorization_vs_n_snr2.png";
pub const DELTA_FIGURE: &str = "delta_vs_n_snr2.png";

/// A cell as a figure's point: x the calibrated n·SNR² (log₁₀) with its seeds' range, or its
/// upper bound where no seed rises above the floor; y and its seed spread from `value`.
fn figure_point(
    cell: &CellAndTwin,
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
    cells: &[CellAndTwin],
    ns: &[usize],
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, crate::report::plot::Marker),
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
pub(super) fn draw(
    out: &Path,
    cells: &[CellAndTwin],
    mode_order: &dyn Fn(&str) -> usize,
    colors: &dyn Fn(&str) -> (plotters::style::RGBColor, crate::report::plot::Marker),
) -> Result<Vec<(&'static str, String)>> {
    let mut ns: Vec<usize> = cells.iter().map(|c| c.point.row.n).collect();
    ns.sort_unstable();
    ns.dedup();
    let legend = figure_legend(cells, &ns, colors);
    let panels = |value: &dyn Fn(&CellAndTwin) -> (f64, f64), y_label: &str| -> Vec<ErrorPanel> {
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
