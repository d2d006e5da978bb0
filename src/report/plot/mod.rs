//! PNG figures with plotters and an embedded font (DejaVu Sans), so that text renders on a
//! machine without system fonts. Each figure is written atomically.

mod error_bars;
mod heatmap;
pub use self::error_bars::{
    ErrorPanel, ErrorPoint, LegendEntry, LegendKey, Shape, error_scatter_panels,
};
pub use self::heatmap::{Grid2d, category_map, heatmap, heatmap_in};

mod panels;

pub use panels::*;
