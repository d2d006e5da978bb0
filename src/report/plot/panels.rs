//! Line and scatter panels, the fonts they are drawn with and the palette.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::io::produce_atomic;

pub(in crate::report) const FONT: &str = "sans-serif";

pub(in crate::report) fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TTF shipped by the dejavu crate; failure would be a build defect.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// plotters' errors borrow the backend; keep their message only.
pub(in crate::report) fn plot_err(err: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plotting failed: {err}")
}

/// Qualitative colours (Tableau 10), distinguishable in print.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(214, 39, 40),   // red
    RGBColor(44, 160, 44),   // green
    RGBColor(31, 119, 180),  // blue
    RGBColor(255, 127, 14),  // orange
    RGBColor(148, 103, 189), // purple
    RGBColor(140, 86, 75),   // brown
    RGBColor(227, 119, 194), // pink
    RGBColor(127, 127, 127), // grey
];

/// One line of a line chart; series with `label: None` are drawn but not listed in the legend.
pub struct Series {
    pub label: Option<String>,
    pub color: RGBColor,
    pub width: u32,
    /// Drawn dashed (a second property beside the colour, e.g. the mode beside the dataset).
    pub dashed: bool,
    /// A filled circle at every point: each one is a measurement, and the line only joins them.
    pub markers: bool,
    pub points: Vec<(f64, f64)>,
}

pub struct LinePanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub y_range: (f64, f64),
    pub series: Vec<Series>,
}

#[derive(Clone, Copy)]
pub enum Marker {
    Circle,
    Cross,
    Triangle,
}

pub struct ScatterGroup {
    pub label: String,
    pub color: RGBColor,
    pub marker: Marker,
    pub points: Vec<(f64, f64)>,
}

pub struct ScatterPanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub groups: Vec<ScatterGroup>,
    /// Vertical dashed lines across the panel (the axis reaches them).
    pub x_marks: Vec<XMark>,
}

/// A vertical dashed line at `x`, its label written along its top.
#[derive(Clone, Debug)]
pub struct XMark {
    pub x: f64,
    pub label: String,
}

/// A figure of panels side by side under a common title.
pub(super) fn figure(
    path: &Path,
    title: &str,
    panels: usize,
    panel_size: (u32, u32),
    draw: impl FnOnce(Vec<DrawingArea<BitMapBackend, Shift>>) -> Result<()>,
) -> Result<()> {
    figure_in_rows(path, title, (panels, panels.max(1)), panel_size, draw)
}

/// [`figure`] with the panels in rows of `columns`.
pub(super) fn figure_in_rows(
    path: &Path,
    title: &str,
    (panels, columns): (usize, usize),
    panel_size: (u32, u32),
    draw: impl FnOnce(Vec<DrawingArea<BitMapBackend, Shift>>) -> Result<()>,
) -> Result<()> {
    register_fonts();
    let columns = columns.clamp(1, panels.max(1));
    let rows = panels.div_ceil(columns).max(1);
    produce_atomic(path, |tmp| {
        let size = (
            panel_size.0 * columns as u32,
            panel_size.1 * rows as u32 + 40,
        );
        let root = BitMapBackend::new(tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root
            .titled(title, (FONT, 24).into_font().style(FontStyle::Bold))
            .map_err(plot_err)?;
        draw(root.split_evenly((rows, columns)))?;
        root.present().map_err(plot_err)?;
        Ok(())
    })
}

/// Tick labels without trailing zeros: 500 rather than 500.0, 0.25 rather than 0.250.
pub(super) fn tick(v: &f64) -> String {
    tick_with(*v, 3)
}

/// A tick formatter with enough decimals to tell apart ticks over `range` (about ten of them):
/// an axis from 0.1667 to 0.1674 needs five, not three.
pub(super) fn ticks_for(range: (f64, f64)) -> impl Fn(&f64) -> String {
    let step = ((range.1 - range.0) / 10.0).abs();
    let decimals = if step > 0.0 {
        (-step.log10()).ceil().clamp(3.0, 9.0) as usize
    } else {
        3
    };
    move |v| tick_with(*v, decimals)
}

pub(super) fn tick_with(v: f64, decimals: usize) -> String {
    let text = format!("{v:.decimals$}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// Digits as Unicode subscripts: 12 → ₁₂.
pub fn subscript(n: usize) -> String {
    n.to_string()
        .chars()
        .map(|c| char::from_u32(0x2080 + c.to_digit(10).unwrap_or(0)).unwrap_or(c))
        .collect()
}

/// The plotted range of `values`: their finite extent padded by 5 % (at least a billionth of
/// their magnitude, so that equal values still span a range the axis can divide), (0, 1) when
/// none is finite. Bounded for any finite input: values beyond ±1e300 are drawn at ±1e300, and
/// halves are taken before differences, so that nothing overflows.
pub(super) fn span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    const EDGE: f64 = 1e300;
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .map(|v| v.clamp(-EDGE, EDGE))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let magnitude = lo.abs().max(hi.abs()).max(1.0);
    let pad = ((hi / 2.0 - lo / 2.0) * 0.1).max(magnitude * 1e-9);
    (lo - pad, hi + pad)
}

/// The points a line chart draws: each segment of `series` sampled, so that a straight line
/// across a corner counts in [`emptiest_corner`].
pub(super) fn sampled_lines(series: &[Series]) -> Vec<(f64, f64)> {
    series
        .iter()
        .flat_map(|s| {
            s.points.windows(2).flat_map(|w| {
                (0..8).map(move |k| {
                    let f = k as f64 / 8.0;
                    (
                        w[0].0 + f * (w[1].0 - w[0].0),
                        w[0].1 + f * (w[1].1 - w[0].1),
                    )
                })
            })
        })
        .collect()
}

/// The legend corner that covers the fewest of the drawn `points`, within the plotted ranges.
pub(super) fn emptiest_corner(
    points: &[(f64, f64)],
    x: (f64, f64),
    y: (f64, f64),
) -> SeriesLabelPosition {
    // Normalised boxes (x from, x to, y from, y to) a legend of a few rows roughly covers.
    let corners = [
        (SeriesLabelPosition::MiddleRight, (0.5, 1.0, 0.3, 0.7)),
        (SeriesLabelPosition::UpperRight, (0.5, 1.0, 0.6, 1.0)),
        (SeriesLabelPosition::UpperLeft, (0.0, 0.5, 0.6, 1.0)),
        (SeriesLabelPosition::LowerRight, (0.5, 1.0, 0.0, 0.4)),
        (SeriesLabelPosition::LowerLeft, (0.0, 0.5, 0.0, 0.4)),
    ];
    let normalised: Vec<(f64, f64)> = points
        .iter()
        .map(|(px, py)| ((px - x.0) / (x.1 - x.0), (py - y.0) / (y.1 - y.0)))
        .collect();
    let covered = |(x0, x1, y0, y1): (f64, f64, f64, f64)| {
        normalised
            .iter()
            .filter(|(px, py)| (x0..=x1).contains(px) && (y0..=y1).contains(py))
            .count()
    };
    corners
        .into_iter()
        .min_by_key(|(_, area)| covered(*area))
        .map(|(position, _)| position)
        .expect("five candidates")
}

/// Line charts, one panel each, with a legend per panel where it hides the least.
pub fn line_panels(path: &Path, title: &str, panels: &[LinePanel]) -> Result<()> {
    line_panels_in_rows(path, title, panels, panels.len())
}

/// [`line_panels`] in rows of `columns` panels.
pub fn line_panels_in_rows(
    path: &Path,
    title: &str,
    panels: &[LinePanel],
    columns: usize,
) -> Result<()> {
    figure_in_rows(path, title, (panels.len(), columns), (620, 460), |areas| {
        for (area, panel) in areas.iter().zip(panels) {
            let (x0, x1) = span(
                panel
                    .series
                    .iter()
                    .flat_map(|s| s.points.iter().map(|p| p.0)),
            );
            let mut chart = scatter_chart(
                area,
                &panel.title,
                (&panel.x_label, &panel.y_label),
                (x0, x1),
                panel.y_range,
            )?;
            for series in &panel.series {
                let style = series.color.stroke_width(series.width);
                if series.markers {
                    let fill = series.color.filled();
                    chart
                        .draw_series(series.points.iter().map(|&p| Circle::new(p, 4, fill)))
                        .map_err(plot_err)?;
                }
                let points = series.points.iter().copied();
                let drawn = if series.dashed {
                    chart.draw_series(DashedLineSeries::new(points, 8, 5, style))
                } else {
                    chart.draw_series(LineSeries::new(points, style))
                }
                .map_err(plot_err)?;
                if let Some(label) = &series.label {
                    let (color, dashed) = (series.color, series.dashed);
                    drawn.label(label).legend(
                        move |(x, y)| -> DynElement<'static, BitMapBackend, (i32, i32)> {
                            let style = color.stroke_width(3);
                            if dashed {
                                DashedPathElement::new(vec![(x, y), (x + 18, y)], 7, 4, style)
                                    .into_dyn()
                            } else {
                                PathElement::new(vec![(x, y), (x + 18, y)], style).into_dyn()
                            }
                        },
                    );
                }
            }
            let legend_at = emptiest_corner(&sampled_lines(&panel.series), (x0, x1), panel.y_range);
            chart
                .configure_series_labels()
                .position(legend_at)
                .label_font((FONT, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .draw()
                .map_err(plot_err)?;
        }
        Ok(())
    })
}

/// Scatter plots, one panel each, with a legend per panel.
pub fn scatter_panels(path: &Path, title: &str, panels: &[ScatterPanel]) -> Result<()> {
    // One range for every panel, so that panels compare at a glance.
    let points = || {
        panels
            .iter()
            .flat_map(|p| &p.groups)
            .flat_map(|g| &g.points)
    };
    let marks = || panels.iter().flat_map(|p| &p.x_marks).map(|m| m.x);
    let xs = span(points().map(|p| p.0).chain(marks()));
    let ys = span(points().map(|p| p.1));
    figure(path, title, panels.len(), (560, 520), |areas| {
        for (area, panel) in areas.iter().zip(panels) {
            let labels = (panel.x_label.as_str(), panel.y_label.as_str());
            let mut chart = scatter_chart(area, &panel.title, labels, xs, ys)?;
            draw_marks(&mut chart, &panel.x_marks, xs, ys)?;
            draw_groups(&mut chart, &panel.groups)?;
            let points: Vec<(f64, f64)> = panel
                .groups
                .iter()
                .flat_map(|g| g.points.iter().copied())
                .collect();
            chart
                .configure_series_labels()
                .position(emptiest_corner(&points, xs, ys))
                .label_font((FONT, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .draw()
                .map_err(plot_err)?;
        }
        Ok(())
    })
}

/// A panel's axes at spans `xs` and `ys`, with its title and axis labels: every panel's (lines,
/// points, error bars).
pub(in crate::report) fn scatter_chart<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    title: &str,
    (x_label, y_label): (&str, &str),
    xs: (f64, f64),
    ys: (f64, f64),
) -> Result<ScatterChart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(xs.0..xs.1, ys.0..ys.1)
        .map_err(plot_err)?;
    let (x_tick, y_tick) = (ticks_for(xs), ticks_for(ys));
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&x_tick)
        .y_label_formatter(&y_tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_err)?;
    Ok(chart)
}

/// A scatter panel's chart: both axes f64.
pub(in crate::report) type ScatterChart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The vertical dashed marks across a panel, each labelled beside its line.
pub(super) fn draw_marks(
    chart: &mut ScatterChart,
    marks: &[XMark],
    xs: (f64, f64),
    ys: (f64, f64),
) -> Result<()> {
    let grey = RGBColor(110, 110, 110);
    for (k, mark) in marks.iter().enumerate() {
        chart
            .draw_series(DashedLineSeries::new(
                [(mark.x, ys.0), (mark.x, ys.1)],
                8,
                5,
                grey.stroke_width(2),
            ))
            .map_err(plot_err)?;
        // Labels step down so that neighbouring marks do not write over each other.
        let y = ys.1 - (ys.1 - ys.0) * (0.03 + 0.05 * k as f64);
        // Right of the line in the panel's left half, left of it in the right half.
        let side = if mark.x > (xs.0 + xs.1) / 2.0 {
            HPos::Right
        } else {
            HPos::Left
        };
        let style = (FONT, 12)
            .into_font()
            .color(&grey)
            .pos(Pos::new(side, VPos::Top));
        chart
            .draw_series(std::iter::once(Text::new(
                format!(" {} ", mark.label),
                (mark.x, y),
                style,
            )))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Each group's points in its marker, with its legend entry.
pub(super) fn draw_groups<'a, 'b: 'a>(
    chart: &mut ScatterChart<'a, 'b>,
    groups: &[ScatterGroup],
) -> Result<()> {
    for group in groups {
        let color = group.color;
        // A point that is not finite has no place on the axes (its range leaves it out).
        let points = group
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite());
        let drawn = match group.marker {
            Marker::Circle => chart
                .draw_series(points.map(|p| Circle::new(p, 4, color.mix(0.7).filled())))
                .map_err(plot_err)?,
            Marker::Cross => chart
                .draw_series(points.map(|p| Cross::new(p, 6, color.stroke_width(2))))
                .map_err(plot_err)?,
            Marker::Triangle => chart
                .draw_series(points.map(|p| TriangleMarker::new(p, 7, color.filled())))
                .map_err(plot_err)?,
        };
        let marker = group.marker;
        drawn.label(&group.label).legend(
            move |(x, y)| -> DynElement<'static, BitMapBackend, (i32, i32)> {
                match marker {
                    Marker::Circle => Circle::new((x + 8, y), 4, color.filled()).into_dyn(),
                    Marker::Cross => Cross::new((x + 8, y), 6, color.stroke_width(2)).into_dyn(),
                    Marker::Triangle => {
                        TriangleMarker::new((x + 8, y), 7, color.filled()).into_dyn()
                    }
                }
            },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::heatmap::{Grid2d, cell_edges, heatmap};
    use super::*;

    #[test]
    fn ticks_and_subscripts() {
        assert_eq!(tick(&500.0), "500");
        assert_eq!(tick(&0.25), "0.25");
        assert_eq!(tick(&-0.0), "0");
        let narrow = ticks_for((0.1667, 0.1674));
        assert_eq!(
            (narrow(&0.16705), narrow(&0.1670)),
            ("0.16705".into(), "0.167".into())
        );
        assert_eq!(subscript(12), "₁₂");
    }

    #[test]
    fn any_finite_points_give_a_bounded_range_and_a_figure() {
        for values in [
            vec![1e40, 1e40],
            vec![-1e308, 1e308],
            vec![f64::MAX, f64::MAX],
            vec![f64::INFINITY, 2.0, f64::NAN],
            vec![0.0, 0.0],
        ] {
            let (lo, hi) = span(values.iter().copied());
            assert!(
                lo.is_finite() && hi.is_finite() && lo < hi,
                "{values:?}: {lo}..{hi}"
            );
        }
        // Drawn within seconds, not for ever (signal-norm 1e40 used to hang the plot).
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let panel = |points: Vec<(f64, f64)>| ScatterPanel {
                title: "t".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                groups: vec![ScatterGroup {
                    label: "g".into(),
                    color: PALETTE[0],
                    marker: Marker::Circle,
                    points,
                }],
                x_marks: Vec::new(),
            };
            let panels = [
                panel(vec![(1e40, 1e40), (1e40, -1e40)]),
                panel(vec![(f64::INFINITY, 1.0), (1e308, -1e308)]),
            ];
            let drawn = scatter_panels(&dir.path().join("s.png"), "extreme", &panels);
            done.send(drawn.map_err(|e| e.to_string())).unwrap();
        });
        let drawn = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the figure was not drawn within 60 s");
        drawn.unwrap();
    }

    #[test]
    fn edges_surround_centres() {
        assert_eq!(cell_edges(&[1.0, 2.0, 4.0]), vec![0.5, 1.5, 3.0, 5.0]);
        assert_eq!(cell_edges(&[3.0]), vec![2.5, 3.5]);
    }

    #[test]
    fn figures_render_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let line = dir.path().join("line.png");
        let panel = LinePanel {
            title: "panel μ".into(),
            x_label: "step".into(),
            y_label: "probability".into(),
            y_range: (0.0, 1.0),
            series: vec![Series {
                label: Some("x₁".into()),
                color: PALETTE[0],
                dashed: false,
                markers: false,
                width: 2,
                points: vec![(0.0, 0.1), (1.0, 0.9)],
            }],
        };
        line_panels(&line, "title", &[panel]).unwrap();
        let xs = [1.0, 2.0];
        let grid = Grid2d {
            xs: &xs,
            ys: &xs,
            values: &[0.1, 0.2, 0.3, f64::NAN],
            x_label: "d",
            y_label: "‖μ‖",
        };
        let heat = dir.path().join("heat.png");
        heatmap(&heat, "heat", &grid, "loss").unwrap();
        // A figure with rendered text is far from a blank image: PNGs of a few KB at least.
        for path in [&line, &heat] {
            let size = std::fs::metadata(path).unwrap().len();
            assert!(size > 5_000, "{} is {size} bytes", path.display());
        }
        // Nothing but the two figures in the folder (temporary files renamed away).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
