//! The reference map's report: per dataset a table of calls over n × n·SNR², the boundaries, and
//! the answer line (`map.md`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::judge::{Comparison, MapCall, boundary, compare, overall};
use super::map::{LADDER, MapRun, SIZES};

/// One cell: its seeds' runs and the half-step run.
struct MapCell<'a> {
    runs: Vec<&'a MapRun>,
    half: Option<&'a MapRun>,
}

impl MapCell<'_> {
    /// The call most seeds make (ties: the first in seed order).
    fn majority(&self) -> Option<MapCall> {
        let mut counts: Vec<(MapCall, usize)> = Vec::new();
        for r in &self.runs {
            match counts.iter_mut().find(|(c, _)| *c == r.call) {
                Some((_, k)) => *k += 1,
                None => counts.push((r.call, 1)),
            }
        }
        counts.into_iter().max_by_key(|&(_, k)| k).map(|(c, _)| c)
    }

    /// Whether the half-step run called something else than its seed's run.
    fn step_sensitive(&self) -> bool {
        self.half.is_some_and(|h| {
            self.runs
                .iter()
                .find(|r| r.seed == h.seed)
                .is_some_and(|r| r.call != h.call)
        })
    }

    /// Seed-mean memorisation of the runs with a regime; `None` without one or where the step
    /// size decides the call.
    fn memorisation(&self) -> Option<f64> {
        if self.step_sensitive() {
            return None;
        }
        let values: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| !matches!(r.call, MapCall::Unconverged | MapCall::NoSignal))
            .filter_map(|r| r.checkpoints.last().map(|c| c.memorization))
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }
}

fn cell<'a>(runs: &'a [MapRun], dataset: &str, n: usize, n_snr2: f64) -> MapCell<'a> {
    let here = |r: &&MapRun| r.dataset == dataset && r.n == n && r.n_snr2 == n_snr2;
    MapCell {
        runs: runs.iter().filter(here).filter(|r| !r.half_step).collect(),
        half: runs.iter().filter(here).find(|r| r.half_step),
    }
}

/// One dataset's table and comparison.
fn dataset_section(md: &mut String, runs: &[MapRun], dataset: &str) -> Comparison {
    let any = runs
        .iter()
        .find(|r| r.dataset == dataset)
        .expect("a dataset of the runs");
    let _ = writeln!(
        *md,
        "## {dataset} ({}, d {}, T {})\n",
        any.backbone, any.config.embed_dim, any.config.seq_len
    );
    let header: Vec<String> = LADDER.iter().map(|x| format!("n·SNR² {x}")).collect();
    let _ = writeln!(
        *md,
        "| n | {} |\n|---|{}",
        header.join(" | "),
        "---|".repeat(LADDER.len())
    );
    let mut boundaries = [None; 2];
    for (k, &n) in SIZES.iter().enumerate() {
        let mut row = Vec::new();
        let mut means = Vec::new();
        for &x in &LADDER {
            let c = cell(runs, dataset, n, x);
            let mem = c.memorisation();
            means.push(mem);
            let test: Vec<String> = c
                .runs
                .iter()
                .filter_map(|r| {
                    r.checkpoints
                        .last()
                        .map(|p| format!("{:.2}/{:.2}", p.test_acc, r.ceiling))
                })
                .collect();
            row.push(format!(
                "{}{} · mem {} · test/ceiling {} · ‖μ‖ {:.2}",
                c.majority().map_or("–", MapCall::name),
                if c.step_sensitive() {
                    " (½-step: other call)"
                } else {
                    ""
                },
                mem.map_or("–".into(), |m| format!("{m:.2}")),
                test.join(", "),
                c.runs.first().map_or(f64::NAN, |r| r.config.signal_norm)
            ));
        }
        boundaries[k] = boundary(&LADDER, &means);
        let _ = writeln!(*md, "| {n} | {} |", row.join(" | "));
    }
    let comparison = compare(SIZES, boundaries);
    let show = |b: Option<f64>| b.map_or("none".into(), |v| format!("{v:.2}"));
    let _ = writeln!(
        *md,
        "\nBoundary (memorisation crosses 50 %) at n {}: n·SNR² {}; at n {}: {}. Ratio on the \
         n·SNR² axis {}, on the ‖μ‖ axis {}: **{}**.\n",
        SIZES[0],
        show(boundaries[0]),
        SIZES[1],
        show(boundaries[1]),
        show(comparison.n_snr2_ratio),
        show(comparison.signal_norm_ratio),
        comparison.answer
    );
    comparison
}

const PREFACE: &str = "# The paper's token selector on real noise\n\nRules fixed before the \
numbers (src/reproduce/reference_map/judge.rs; docs/design.md, \"The paper's model on real \
noise\"): a run is called only where, over its last two doublings (S, 2S, 4S, and on to 16S \
where those moved; S = 1000 steps at lr·‖μ‖² = 2), train accuracy and memorisation moved ≤ 0.01, \
test accuracy ≤ 0.5/√m (m test samples) and the train loss ≤ 0.01 (else \"unconverged at cap\"), \
and the relevant token's own test accuracy (the ceiling) is ≥ 0.6 (else \"no signal\"); memorised \
= every training sample fitted, generalises = test ≥ 0.5 + 0.9·(ceiling − 0.5). A boundary is \
where the seed-mean memorisation of the called runs crosses 50 % as n·SNR² rises. **Yes** if the \
boundaries at n 20 and 200 coincide within ×2 on the n·SNR² axis and not on the ‖μ‖ axis; **No** \
if the reverse; else Undecided; over datasets, Yes (No) where all say so. Each cell: the seeds' \
majority call, the memorisation, each seed's test accuracy over its ceiling, ‖μ‖.\n\n";

/// map.md in `out` from `runs`; returns the answer over datasets.
pub fn write(out: &Path, runs: &[MapRun]) -> Result<&'static str> {
    let mut datasets: BTreeMap<&str, ()> = BTreeMap::new();
    for r in runs {
        datasets.insert(&r.dataset, ());
    }
    let mut md = String::from(PREFACE);
    let answers: Vec<&'static str> = datasets
        .keys()
        .map(|d| dataset_section(&mut md, runs, d).answer)
        .collect();
    let said = overall(&answers);
    let _ = writeln!(md, "**Answer over {} dataset(s): {said}.**", answers.len());
    crate::io::ensure_dir(out)?;
    crate::io::write_atomic(&out.join("map.md"), |w| Ok(w.write_all(md.as_bytes())?))?;
    Ok(said)
}
