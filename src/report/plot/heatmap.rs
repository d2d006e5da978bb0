//! Heatmaps and category maps over a 2-D grid of cells.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::panels::*;
use std::path::Path;

use crate::io::produce_atomic;

/// Cell edges for centres `c` (sorted): midpoints between neighbours, half a gap beyond the ends.
pub(super) fn cell_edges(c: &[f64]) -> Vec<f64> {
    if c.len() == 1 {
        return vec![c[0] - 0.5, c[0] + 0.5];
    }
    let mut edges = vec![c[0] - (c[1] - c[0]) / 2.0];
    edges.extend(c.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    edges.push(c[c.len() - 1] + (c[c.len() - 1] - c[c.len() - 2]) / 2.0);
    edges
}

/// A grid of values over (x, y) centres; `values[iy * xs.len() + ix]`.
pub struct Grid2d<'a, T> {
    pub xs: &'a [f64],
    pub ys: &'a [f64],
    pub values: &'a [T],
    pub x_label: &'a str,
    pub y_label: &'a str,
}

pub(super) fn draw_cells<T>(
    area: &DrawingArea<BitMapBackend, Shift>,
    caption: &str,
    grid: &Grid2d<T>,
    color: impl Fn(&T) -> RGBColor,
) -> Result<()> {
    let (ex, ey) = (cell_edges(grid.xs), cell_edges(grid.ys));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(ex[0]..ex[ex.len() - 1], ey[0]..ey[ey.len() - 1])
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(grid.x_label)
        .y_desc(grid.y_label)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()
        .map_err(plot_err)?;
    let nx = grid.xs.len();
    chart
        .draw_series(grid.values.iter().enumerate().map(|(k, v)| {
            let (ix, iy) = (k % nx, k / nx);
            Rectangle::new(
                [(ex[ix], ey[iy]), (ex[ix + 1], ey[iy + 1])],
                color(v).filled(),
            )
        }))
        .map_err(plot_err)?;
    Ok(())
}

/// A heat map with a colour bar (viridis; NaN cells grey).
pub fn heatmap(path: &Path, title: &str, grid: &Grid2d<f64>, value_label: &str) -> Result<()> {
    heatmap_in(path, title, grid, value_label, None)
}

/// [`heatmap`] with the colour scale spanning `range` (values beyond it take its end colours), as
/// a paper's figure does; `None`: the values' own range.
pub fn heatmap_in(
    path: &Path,
    title: &str,
    grid: &Grid2d<f64>,
    value_label: &str,
    range: Option<(f64, f64)>,
) -> Result<()> {
    let finite = grid.values.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = match range {
        Some(range) => range,
        None if lo.is_finite() && hi > lo => (lo, hi),
        None => (lo.min(0.0), lo.max(0.0) + 1.0),
    };
    let color = |v: &f64| {
        if v.is_finite() {
            ViridisRGB::get_color_normalized(v.clamp(lo, hi), lo, hi)
        } else {
            RGBColor(200, 200, 200)
        }
    };
    register_fonts();
    produce_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (760, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root
            .titled(title, (FONT, 22).into_font().style(FontStyle::Bold))
            .map_err(plot_err)?;
        let (main, bar) = root.split_horizontally(640);
        draw_cells(&main, "", grid, color)?;
        // Colour bar: 100 slices from lo to hi.
        let mut chart = ChartBuilder::on(&bar)
            .margin_top(24)
            .margin_bottom(54)
            .margin_right(8)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..1.0, lo..hi)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_desc(value_label)
            .y_label_formatter(&tick)
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(plot_err)?;
        let step = (hi - lo) / 100.0;
        chart
            .draw_series((0..100).map(|k| {
                let v = lo + step * k as f64;
                Rectangle::new(
                    [(0.0, v), (1.0, v + step)],
                    ViridisRGB::get_color_normalized(v, lo, hi).filled(),
                )
            }))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
        Ok(())
    })
}

/// A map of categories (indices into `legend`), with a legend beside it.
pub fn category_map(
    path: &Path,
    title: &str,
    grid: &Grid2d<usize>,
    legend: &[(&str, RGBColor)],
) -> Result<()> {
    register_fonts();
    produce_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (860, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root
            .titled(title, (FONT, 22).into_font().style(FontStyle::Bold))
            .map_err(plot_err)?;
        let (main, side) = root.split_horizontally(640);
        draw_cells(&main, "", grid, |k| legend[*k].1)?;
        for (row, (name, color)) in legend.iter().enumerate() {
            let y = 40 + 30 * row as i32;
            side.draw(&Rectangle::new([(12, y), (32, y + 20)], color.filled()))
                .map_err(plot_err)?;
            side.draw(&Text::new(name.to_string(), (40, y + 2), (FONT, 15)))
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
        Ok(())
    })
}
