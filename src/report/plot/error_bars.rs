//! Points with seed error bars, a marker shape per group and a legend strip clear of the data.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::panels::*;
use std::path::Path;

use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::io::produce_atomic;

/// A marker's outline; `ErrorPoint`s of one n share one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Circle,
    Triangle,
    Square,
    Diamond,
}

impl Shape {
    pub const ALL: [Shape; 4] = [
        Shape::Circle,
        Shape::Triangle,
        Shape::Square,
        Shape::Diamond,
    ];

    /// The outline around (0, 0) in pixels, as a polygon (a circle as a 16-gon).
    fn outline(self) -> Vec<(i32, i32)> {
        let r = 6.0;
        let corners = |k: usize, start: f64| -> Vec<(i32, i32)> {
            (0..k)
                .map(|i| {
                    let a = start + std::f64::consts::TAU * i as f64 / k as f64;
                    ((r * a.cos()).round() as i32, (-r * a.sin()).round() as i32)
                })
                .collect()
        };
        match self {
            Shape::Circle => corners(16, 0.0),
            Shape::Triangle => corners(3, std::f64::consts::FRAC_PI_2),
            Shape::Square => corners(4, std::f64::consts::FRAC_PI_4),
            Shape::Diamond => corners(4, 0.0),
        }
    }
}

/// A point with error bars; `x_range` may reach −∞ (the bar then runs to the panel's edge).
pub struct ErrorPoint {
    pub x: f64,
    pub y: f64,
    pub x_range: (f64, f64),
    pub y_err: f64,
    pub color: RGBColor,
    pub shape: Shape,
    /// Drawn hollow with an arrow to the left: x is only an upper bound.
    pub upper_bound: bool,
    /// Short vertical ticks at these x, at the point's height.
    pub ticks: Vec<f64>,
}

pub struct ErrorPanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub points: Vec<ErrorPoint>,
}

pub enum LegendKey {
    Color(RGBColor),
    Shape(Shape),
    UpperBound,
    Tick,
}

pub struct LegendEntry {
    pub key: LegendKey,
    pub label: String,
}

/// A marker's fill and its outline, in pixels around the point.
type MarkerParts = (Polygon<(i32, i32)>, PathElement<(i32, i32)>);

/// A marker's fill and outline around (0, 0), in pixels; hollow: white inside.
pub(super) fn marker_at(shape: Shape, color: RGBColor, hollow: bool) -> MarkerParts {
    let outline = shape.outline();
    let mut closed = outline.clone();
    closed.push(outline[0]);
    let fill = if hollow {
        WHITE.filled()
    } else {
        color.mix(0.85).filled()
    };
    (
        Polygon::new(outline, fill),
        PathElement::new(closed, color.stroke_width(2)),
    )
}

/// Scatter panels with x and y error bars and per-point ticks, one x and y range for all, and
/// the legend in a strip below the panels so that it covers nothing.
pub fn error_scatter_panels(
    path: &Path,
    title: &str,
    panels: &[ErrorPanel],
    legend: &[LegendEntry],
) -> Result<()> {
    let points = || panels.iter().flat_map(|p| &p.points);
    let xs = span(
        points()
            .flat_map(|p| {
                [p.x, p.x_range.0, p.x_range.1, p.x - 0.35]
                    .into_iter()
                    .chain(p.ticks.clone())
            })
            .filter(|v| v.is_finite()),
    );
    let ys = span(points().flat_map(|p| [p.y - p.y_err, p.y + p.y_err]));
    register_fonts();
    let legend_rows = legend.len().div_ceil(4) as u32;
    let (panel_w, panel_h, strip) = (600, 520, 28 * legend_rows + 20);
    produce_atomic(path, |tmp| {
        let size = (panel_w * panels.len().max(1) as u32, panel_h + strip + 40);
        let root = BitMapBackend::new(tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root
            .titled(title, (FONT, 24).into_font().style(FontStyle::Bold))
            .map_err(plot_err)?;
        let (top, bottom) = root.split_vertically(panel_h);
        for (area, panel) in top
            .split_evenly((1, panels.len().max(1)))
            .iter()
            .zip(panels)
        {
            error_panel(area, panel, xs, ys)?;
        }
        draw_legend_strip(&bottom, legend)?;
        root.present().map_err(plot_err)?;
        Ok(())
    })
}

pub(super) fn error_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    panel: &ErrorPanel,
    xs: (f64, f64),
    ys: (f64, f64),
) -> Result<()> {
    let labels = (panel.x_label.as_str(), panel.y_label.as_str());
    let mut chart = scatter_chart(area, &panel.title, labels, xs, ys)?;
    let clamp = |x: f64| x.clamp(xs.0, xs.1);
    for p in &panel.points {
        let faint = p.color.mix(0.55).stroke_width(1);
        let bars = [
            vec![(clamp(p.x_range.0), p.y), (clamp(p.x_range.1), p.y)],
            vec![(p.x, p.y - p.y_err), (p.x, p.y + p.y_err)],
        ];
        chart
            .draw_series(bars.into_iter().map(|b| PathElement::new(b, faint)))
            .map_err(plot_err)?;
        let tick = p.color.stroke_width(2);
        chart
            .draw_series(p.ticks.iter().map(|&t| {
                EmptyElement::at((t, p.y)) + PathElement::new(vec![(0, -8), (0, 8)], tick)
            }))
            .map_err(plot_err)?;
        if p.upper_bound {
            // An arrow to the left: the value is at most x.
            let arrow = p.color.stroke_width(2);
            let head = EmptyElement::at((p.x, p.y))
                + PathElement::new(vec![(-6, 0), (-26, 0)], arrow)
                + PathElement::new(vec![(-26, 0), (-20, -5)], arrow)
                + PathElement::new(vec![(-26, 0), (-20, 5)], arrow);
            chart.draw_series(std::iter::once(head)).map_err(plot_err)?;
        }
        let (fill, outline) = marker_at(p.shape, p.color, p.upper_bound);
        let marker = EmptyElement::at((p.x, p.y)) + fill + outline;
        chart
            .draw_series(std::iter::once(marker))
            .map_err(plot_err)?;
    }
    Ok(())
}

pub(super) fn draw_legend_strip(
    area: &DrawingArea<BitMapBackend, Shift>,
    legend: &[LegendEntry],
) -> Result<()> {
    let (width, _) = area.dim_in_pixel();
    let column = (width as i32 - 40) / 4;
    let black = RGBColor(40, 40, 40);
    for (k, entry) in legend.iter().enumerate() {
        let (x, y) = (20 + column * (k % 4) as i32, 14 + 28 * (k / 4) as i32);
        let at = || EmptyElement::at((x + 18, y));
        let draw_marker = |shape, color, hollow| {
            let (fill, outline) = marker_at(shape, color, hollow);
            area.draw(&(at() + fill + outline)).map_err(plot_err)
        };
        match entry.key {
            LegendKey::Color(color) => draw_marker(Shape::Circle, color, false)?,
            LegendKey::Shape(shape) => draw_marker(shape, black, false)?,
            LegendKey::UpperBound => {
                let arrow = PathElement::new(vec![(-6, 0), (-18, 0)], black.stroke_width(2));
                area.draw(&(at() + arrow)).map_err(plot_err)?;
                draw_marker(Shape::Circle, black, true)?;
            }
            LegendKey::Tick => {
                let tick = PathElement::new(vec![(0, -8), (0, 8)], black.stroke_width(2));
                area.draw(&(at() + tick)).map_err(plot_err)?;
            }
        }
        let style = (FONT, 14)
            .into_font()
            .color(&black)
            .pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(entry.label.clone(), (x + 34, y), style))
            .map_err(plot_err)?;
    }
    Ok(())
}
