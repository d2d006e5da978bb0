//! The planted-signal recovery curve (`diagnose plant-report`): the JSON lines of `diagnose snr
//! --plant-snr` gathered into one table and one figure, estimate against planted S per dataset,
//! mode and n, with the share of planted tokens found by the fitted and the oracle classifier,
//! and the one line the calibration is judged by: the worst miss at S ≥ [`JUDGED_FROM`], n ≥
//! [`JUDGED_N`], against the ±[`TOLERANCE`] the estimate must hold.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::plot::{LinePanel, PALETTE, Series, line_panels_in_rows};
use crate::diagnostics::snr::VALIDATED_FROM_LIMITS;
use crate::train::snr_plant::PlantedSnr;

/// The calibration is judged from this S up …
pub const JUDGED_FROM: f64 = 0.15;
/// … at this n and above …
pub const JUDGED_N: usize = 200;
/// … within this share of S.
pub const TOLERANCE: f64 = 0.20;

/// One curve: a dataset in a mode at one n, its points in S order.
struct PlantCurve {
    dataset: String,
    mode: String,
    n: usize,
    points: Vec<PlantedSnr>,
}

/// What the report found, for the caller's line.
pub struct PlantFindings {
    pub curves: usize,
    pub judged: usize,
    pub within: usize,
}

/// Reads `files` (JSON lines of `diagnose snr --plant-snr`) and writes `recovery.md` and
/// `recovery.png` into `out`.
pub fn write(files: &[PathBuf], out: &Path) -> Result<PlantFindings> {
    let mut curves: BTreeMap<(String, String, usize), Vec<PlantedSnr>> = BTreeMap::new();
    for file in files {
        let text = crate::io::read_input_text(file, crate::io::limits::SMALL_TEXT)?;
        for (k, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let row: PlantedSnr = serde_json::from_str(line).with_context(|| {
                format!(
                    "{} line {}: not a line of `diagnose snr --plant-snr`",
                    file.display(),
                    k + 1
                )
            })?;
            let key = (row.dataset.clone(), mode_name(&row), row.estimate.samples);
            curves.entry(key).or_default().push(row);
        }
    }
    if curves.is_empty() {
        bail!("no planted estimate in {} file(s)", files.len());
    }
    let curves: Vec<PlantCurve> = curves
        .into_iter()
        .map(|((dataset, mode, n), mut points)| {
            points.sort_by(|a, b| a.planted_snr.total_cmp(&b.planted_snr));
            PlantCurve {
                dataset,
                mode,
                n,
                points,
            }
        })
        .collect();
    crate::io::ensure_dir(out)?;
    let (markdown, outcome) = table(&curves);
    crate::io::write_atomic(&out.join("recovery.md"), |w| {
        Ok(w.write_all(markdown.as_bytes())?)
    })?;
    figure(&curves, &out.join("recovery.png"))?;
    Ok(outcome)
}

fn mode_name(row: &PlantedSnr) -> String {
    serde_json::to_value(row.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn table(curves: &[PlantCurve]) -> (String, PlantFindings) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# The SNR estimate against a signal planted in real tokens\n\n\
         Each row: one dataset's fine-tune tokens (the mode's: final tokens in head mode, the last \
         layer's attention inputs in last-layer mode) as the noise, K balanced classes, one token \
         per sample carrying its class's signal at SNR S = ‖μ‖ / √tr Σ̂ (docs/design.md, \"A \
         planted signal\"). *read*: the estimate's SNR on the position-centred σ; *own σ*: on the \
         relevant tokens' own spread (the estimate's `snr`); *found*: share of samples whose \
         chosen token is the planted one, by the classifier fitted on planted test tokens and \
         (*oracle*) by one that knows the signals.\n"
    );
    let mut plain = Judgement::default();
    let mut corrected = Judgement::default();
    let mut above_limit = Judgement {
        from_limits: Some(VALIDATED_FROM_LIMITS),
        ..Judgement::default()
    };
    for curve in curves {
        let _ = writeln!(
            md,
            "## {} {} n = {} (T {:.0}, d {}, K {}; selection limit S* {:.3})\n",
            curve.dataset,
            curve.mode,
            curve.n,
            curve.points[0].estimate.mean_tokens,
            curve.points[0].estimate.embed_dim,
            curve.points[0].estimate.classes,
            curve.points[0].estimate.selection_limit()
        );
        curve_rows(&mut md, curve);
        md.push('\n');
        for point in &curve.points {
            plain.add(curve, point, point.snr_position_sigma);
            corrected.add(curve, point, point.kappa_corrected_snr);
            above_limit.add(curve, point, point.snr_position_sigma);
        }
    }
    let verdict = format!(
        "{}\n\n{}\n\n{}\n\n{SELECTION_LIMIT_NOTE}",
        plain.line("the estimate (position-centred σ)"),
        corrected.line("the estimate divided by κ (`kappa_corrected_snr`)"),
        above_limit.line(
            "the estimate (position-centred σ) where S is at least twice the selection limit"
        )
    );
    let md = md.replacen(
        "\n## ",
        &format!("\n{verdict}\n\n![recovery](recovery.png)\n\n## "),
        1,
    );
    (
        md,
        PlantFindings {
            curves: curves.len(),
            judged: plain.judged,
            within: plain.within,
        },
    )
}

/// One curve's table: a column per planted S, a row per reading.
fn curve_rows(md: &mut String, curve: &PlantCurve) {
    let header: Vec<String> = curve
        .points
        .iter()
        .map(|p| format!("{:.2}", p.planted_snr))
        .collect();
    let _ = writeln!(md, "| S | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(header.len()));
    let row = |label: &str, f: &dyn Fn(&PlantedSnr) -> String| {
        format!(
            "| {label} | {} |\n",
            curve.points.iter().map(f).collect::<Vec<_>>().join(" | ")
        )
    };
    md.push_str(&row("read", &|p| format!("{:.3}", p.snr_position_sigma)));
    md.push_str(&row("own σ", &|p| format!("{:.3}", p.estimate.snr)));
    md.push_str(&row("found", &|p| format!("{:.2}", p.found_share)));
    md.push_str(&row("κ", &|p| {
        format!("{:.2}", p.estimate.selection_kappa)
    }));
    md.push_str(&row("corrected", &|p| {
        format!("{:.3}", p.kappa_corrected_snr)
    }));
    md.push_str(&row("oracle read", &|p| {
        format!("{:.3}", p.oracle.snr_position_sigma)
    }));
    md.push_str(&row("oracle found", &|p| {
        format!("{:.2}", p.oracle.found_share)
    }));
}

/// What the selection limit is, under the judgement lines.
const SELECTION_LIMIT_NOTE: &str = "*Selection limit* S* = √(2 ln(T − 1) / d) \
    (`diagnostics::snr::selection_limit`): the SNR at which the planted token's projection on its \
    signal reaches the largest of the other T − 1 tokens' (noise of variance tr Σ̂ / d along a \
    random direction). Below it no rule that chooses one token per sample finds the planted one \
    (see *oracle found*, the classifier that knows the signals), and the estimate, which chooses \
    one, reads low or nothing; S* is 0.234 at ViT-Ti's T 197, d 192 and 0.14 at MiniLM's T ≈ 50, \
    d 384, so S 0.15 is below the limit on every image set.";

/// The points the calibration is judged on, for one reading of them.
#[derive(Default)]
struct Judgement {
    /// Judge only points at S ≥ this many selection limits (every point from [`JUDGED_FROM`]
    /// when `None`).
    from_limits: Option<f64>,
    judged: usize,
    within: usize,
    worst: Option<(f64, String)>,
}

impl Judgement {
    fn add(&mut self, curve: &PlantCurve, point: &PlantedSnr, read: f64) {
        if !(curve.n >= JUDGED_N && point.planted_snr >= JUDGED_FROM - 1e-12) {
            return;
        }
        if let Some(limits) = self.from_limits
            && point.planted_snr < limits * point.estimate.selection_limit() - 1e-12
        {
            return;
        }
        // A reading that is not a number misses by all of S.
        let miss = if read.is_finite() {
            read / point.planted_snr - 1.0
        } else {
            -1.0
        };
        self.judged += 1;
        self.within += usize::from(miss.abs() <= TOLERANCE);
        if self
            .worst
            .as_ref()
            .is_none_or(|(w, _)| miss.abs() > w.abs())
        {
            let at = format!(
                "{} {} n = {} at S {:.2}, read {:.3}",
                curve.dataset, curve.mode, curve.n, point.planted_snr, read
            );
            self.worst = Some((miss, at));
        }
    }

    fn line(&self, what: &str) -> String {
        match &self.worst {
            Some((miss, at)) => format!(
                "**Calibration of {what}: {} of {} points at S ≥ {JUDGED_FROM}{}, n ≥ {JUDGED_N} \
                 within ±{:.0} %; worst miss {:+.0} % ({at}).** {}",
                self.within,
                self.judged,
                self.from_limits
                    .map(|k| format!(" and S ≥ {k}·S*"))
                    .unwrap_or_default(),
                100.0 * TOLERANCE,
                100.0 * miss,
                if self.within == self.judged && self.from_limits.is_some() {
                    "It holds over that range (narrower than the card's)."
                } else if self.within == self.judged {
                    "It holds where the card asks it to."
                } else {
                    "It does not hold over that range."
                }
            ),
            None => format!("No point at S ≥ {JUDGED_FROM}, n ≥ {JUDGED_N}: nothing to judge."),
        }
    }
}

/// One panel per dataset: the estimate (position-centred σ) against S per mode and n, and S
/// itself dashed.
fn figure(curves: &[PlantCurve], path: &Path) -> Result<()> {
    let mut datasets: Vec<&str> = Vec::new();
    for c in curves {
        if !datasets.contains(&c.dataset.as_str()) {
            datasets.push(&c.dataset);
        }
    }
    let top = curves
        .iter()
        .flat_map(|c| &c.points)
        .map(|p| p.planted_snr.max(p.snr_position_sigma))
        .fold(0.0, f64::max)
        * 1.05;
    // One colour per (mode, n) arm, the same in every panel.
    let mut arms: Vec<(&str, usize)> = Vec::new();
    for c in curves {
        if !arms.contains(&(c.mode.as_str(), c.n)) {
            arms.push((&c.mode, c.n));
        }
    }
    let colour = |c: &PlantCurve| {
        let k = arms
            .iter()
            .position(|&(mode, n)| mode == c.mode && n == c.n)
            .unwrap_or(0);
        PALETTE[k % (PALETTE.len() - 1)]
    };
    let panels: Vec<LinePanel> = datasets
        .iter()
        .map(|dataset| {
            let mut series: Vec<Series> = curves
                .iter()
                .filter(|c| c.dataset == *dataset)
                .map(|c| Series {
                    label: Some(format!("{} n {}", c.mode, c.n)),
                    color: colour(c),
                    width: 2,
                    dashed: false,
                    markers: true,
                    points: c
                        .points
                        .iter()
                        .map(|p| (p.planted_snr, p.snr_position_sigma))
                        .collect(),
                })
                .collect();
            series.push(Series {
                label: Some("read = planted".into()),
                color: PALETTE[7],
                width: 1,
                dashed: true,
                markers: false,
                points: vec![(0.0, 0.0), (top, top)],
            });
            LinePanel {
                title: dataset.to_string(),
                x_label: "planted SNR S".into(),
                y_label: "estimated SNR (position-centred σ)".into(),
                y_range: (0.0, top),
                series,
            }
        })
        .collect();
    line_panels_in_rows(
        path,
        "SNR estimate against a signal planted in real tokens",
        &panels,
        3,
    )
}
