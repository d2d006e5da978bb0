//! What a report keeps of the per-run files it drew from. A run's metrics.jsonl and
//! attention_maps.png stay local (.gitignore: they are large, and a grid has hundreds of runs),
//! so a checkout of a committed grid has only each run's config.json and summary.json. The
//! report folder therefore keeps, beside the figures, the data it drew and the run it came from:
//! `fig9_cls_attention.csv` (each plotted run's per-epoch mean max CLS attention) and
//! `attention_maps.csv` (which run each `attention_<dataset>.png` was copied from, and the
//! copy's sha256). A report made again where the runs' own files are gone reuses a kept item
//! only when it proves it belongs to a finished run of this report: the run is among them, and
//! the series ends at the run's last epoch with the run's final value (a curve), or the copy in
//! the report folder still has the recorded sha256 (a map). Anything else is left out.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::results::ResultRow;
use crate::data::files::sha256_hex;

pub const CURVES: &str = "fig9_cls_attention.csv";
pub const MAPS: &str = "attention_maps.csv";

/// One dataset's Fig. 9 curve: the run it comes from and its (epoch, mean max CLS attention).
#[derive(Clone, Debug, PartialEq)]
pub struct Fig9Curve {
    pub run: String,
    pub points: Vec<(usize, f64)>,
}

#[derive(Serialize, Deserialize)]
struct CurvePoint {
    dataset: String,
    run: String,
    epoch: usize,
    max_cls_attention: f64,
}

#[derive(Serialize, Deserialize)]
struct KeptMapSource {
    dataset: String,
    run: String,
    sha256: String,
}

fn read_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<Vec<T>>> {
    if !path.exists() {
        return Ok(None);
    }
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let rows = reader
        .deserialize()
        .collect::<std::result::Result<Vec<T>, _>>()
        .with_context(|| format!("{}: not a table this report wrote", path.display()))?;
    Ok(Some(rows))
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// True when `curve` is `row`'s whole per-epoch series: epochs 0, 1, … up to the run's last
/// epoch, ending at the run's final mean max CLS attention.
fn belongs(curve: &Fig9Curve, row: &ResultRow) -> bool {
    let contiguous = curve.points.iter().enumerate().all(|(k, p)| p.0 == k);
    let last = curve.points.last();
    contiguous
        && last.is_some_and(|&(epoch, value)| {
            epoch == row.last.epoch && same(value, row.last.max_cls_attention)
        })
}

/// The curves an earlier report kept in `out`, by dataset, each only if it belongs to the run
/// of `rows` it names.
pub fn kept_curves(out: &Path, rows: &[&ResultRow]) -> Result<BTreeMap<String, Fig9Curve>> {
    let Some(points) = read_rows::<CurvePoint>(&out.join(CURVES))? else {
        return Ok(BTreeMap::new());
    };
    let mut curves: BTreeMap<String, Fig9Curve> = BTreeMap::new();
    for p in points {
        let curve = curves.entry(p.dataset).or_insert_with(|| Fig9Curve {
            run: p.run.clone(),
            points: Vec::new(),
        });
        if curve.run == p.run {
            curve.points.push((p.epoch, p.max_cls_attention));
        }
    }
    curves.retain(|dataset, curve| {
        rows.iter()
            .any(|r| r.run == curve.run && r.dataset() == *dataset && belongs(curve, r))
    });
    Ok(curves)
}

/// Writes the plotted curves to `out`'s CURVES table.
pub fn write_curves(out: &Path, curves: &[(String, Fig9Curve)]) -> Result<()> {
    let points: Vec<CurvePoint> = curves
        .iter()
        .flat_map(|(dataset, curve)| {
            curve.points.iter().map(|&(epoch, value)| CurvePoint {
                dataset: dataset.clone(),
                run: curve.run.clone(),
                epoch,
                max_cls_attention: value,
            })
        })
        .collect();
    crate::io::write_csv(&out.join(CURVES), &points)
}

fn file_sha256(path: &Path) -> Result<String> {
    let bytes = crate::io::read_input(path, crate::io::limits::DATA_FILE)?;
    Ok(sha256_hex(&bytes))
}

/// The maps an earlier report kept in `out`: dataset → the run its copy (`file(dataset)` in
/// `out`) came from, each only if that run is among `rows` and the copy is unchanged.
pub fn kept_maps(
    out: &Path,
    rows: &[&ResultRow],
    file: impl Fn(&str) -> String,
) -> Result<BTreeMap<String, String>> {
    let Some(sources) = read_rows::<KeptMapSource>(&out.join(MAPS))? else {
        return Ok(BTreeMap::new());
    };
    let mut kept = BTreeMap::new();
    for s in sources {
        let copy = out.join(file(&s.dataset));
        let known = rows
            .iter()
            .any(|r| r.run == s.run && r.dataset() == s.dataset);
        if known && copy.is_file() && file_sha256(&copy)? == s.sha256 {
            kept.insert(s.dataset, s.run);
        }
    }
    Ok(kept)
}

/// Writes `out`'s MAPS table for the maps now in `out`: (dataset, run) pairs.
pub fn write_maps(
    out: &Path,
    sources: &[(String, String)],
    file: impl Fn(&str) -> String,
) -> Result<()> {
    let rows = sources
        .iter()
        .map(|(dataset, run)| {
            Ok(KeptMapSource {
                dataset: dataset.clone(),
                run: run.clone(),
                sha256: file_sha256(&out.join(file(dataset)))?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::io::write_csv(&out.join(MAPS), &rows)
}
