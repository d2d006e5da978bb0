//! twins.md: each Table 2 cell beside its twin on the paper's model, the rule first, then the
//! agreement and Spearman's ρ of twin against real over the cells, of memorisation and of Δ.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::map::MapRun;
use super::twins::{TwinVerdict, judge_twin, runs_of};
use crate::report::theory::{TwinTarget, permutation_p, spearman};

const PERMUTATIONS: usize = 10_000;

const PREFACE: &str = "# Table 2's cells beside their twins on the paper's model\n\nEach cell's \
twin (src/reproduce/reference_map/twins.rs; docs/design.md, \"The paper's model on real noise\") \
is the paper's token selector on the cell's own tokens — its dataset, backbone and mode, T 8 of \
each sample's tokens as the noise, the paper's three-token signal planted on them — at the \
cell's n and its pooled n·SNR² (n times one SNR² per dataset, backbone and mode, pooled over \
every seed and size: report.md, \"One SNR² per dataset, backbone and mode\"), at η 0 and 0.2 \
with three seeds on the map's clock (S = 1000 steps at lr·‖μ‖² = 2, checkpoints at S, 2S, 4S, \
made again to 16S where those moved). Rules fixed before the numbers: a twin is judged only \
where all six runs settled (map.md's rule) and its test set shows the relevant token's signal \
(ceiling ≥ 0.6); then by the real cells' rule (report.md, \"Verdicts\"): memorised at a mean \
memorisation ≥ 0.9 of the flipped labels at η 0.2, not overfitting below 0.5, else partly \
memorised; a memorised twin is benign where Δ = test(η 0.2) − test(η 0) ≥ −spread (√(sd₀² + \
sd₀.₂²) over seeds), else harmful. Twin and real are compared by agreement of the verdicts and \
by Spearman's ρ over the judged cells of memorisation and of Δ (two-sided permutation p).\n\n";

/// One cell's line: the target, the twin's numbers and call, the real ones.
fn cell_line(target: &TwinTarget, runs: &[&MapRun], said: &TwinVerdict) -> String {
    let signal_norm = runs
        .first()
        .map_or("–".into(), |r| format!("{:.2}", r.config.signal_norm));
    let (memo, delta) = match said {
        TwinVerdict::Called {
            verdict,
            memorization,
        } => (
            format!("{memorization:.2}"),
            format!("{:+.1}", verdict.delta),
        ),
        _ => ("–".into(), "–".into()),
    };
    format!(
        "| {} | {} | {} | {:.2} | {signal_norm} | {memo} | {delta} | {} | {:.2} | {:+.1} | {} |",
        target.config.dataset,
        target.mode,
        target.n,
        target.n_snr2,
        said.label(),
        target.real_memorization,
        target.real_delta,
        target.real_verdict.as_deref().unwrap_or("–"),
    )
}

/// ρ with its p over `pairs`, as text.
fn rho_text(pairs: &[(f64, f64)]) -> String {
    let (xs, ys): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    if xs.len() < 3 {
        return format!("not enough judged cells ({})", xs.len());
    }
    format!(
        "ρ {:.2} (p {:.3}, {} cells)",
        spearman(&xs, &ys),
        permutation_p(&xs, &ys, PERMUTATIONS, 4),
        xs.len()
    )
}

/// twins.md in `out` from `targets` and the twin runs made so far; returns the line that sums it
/// up.
pub fn write(out: &Path, targets: &[TwinTarget], runs: &[MapRun]) -> Result<String> {
    let mut md = String::from(PREFACE);
    writeln!(
        md,
        "| dataset | mode | n | n·SNR² | ‖μ‖ | twin: memorisation | twin: Δ (pp) | twin | real: \
         memorisation | real: Δ (pp) | real |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let (mut memo, mut delta, mut agree, mut judged) = (Vec::new(), Vec::new(), 0, 0);
    for target in targets {
        let own = runs_of(target, runs);
        let said = judge_twin(target, &own);
        writeln!(md, "{}", cell_line(target, &own, &said))?;
        if let TwinVerdict::Called {
            verdict,
            memorization,
        } = &said
        {
            judged += 1;
            memo.push((*memorization, target.real_memorization));
            delta.push((verdict.delta, target.real_delta));
            agree += usize::from(target.real_verdict.as_deref() == Some(verdict.verdict.name()));
        }
    }
    let summary = format!(
        "{judged} of {} cells judged; verdicts agree in {agree}; memorisation {}; Δ {}",
        targets.len(),
        rho_text(&memo),
        rho_text(&delta)
    );
    writeln!(md, "\n**Twin against real:** {summary}.")?;
    crate::io::ensure_dir(out)?;
    crate::io::write_atomic(&out.join("twins.md"), |w| Ok(w.write_all(md.as_bytes())?))?;
    Ok(summary)
}
