//! The verdict per (dataset, backbone, mode, n) — benign, harmful or not overfitting (issue 17) —
//! by one rule ([`rule`]) applied alike to our cells and to the paper's printed ones, and the
//! report.md section and verdicts.csv that show it.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::paper::{Table2, Table2Cell};
use super::results::Cell;

/// The label-noise rate whose test accuracy is set against η = 0's.
pub const NOISY_ETA: f64 = 0.2;
/// Mean memorization at η = 0.2 (share of the flipped samples predicted as their noisy label) at
/// or above which the noisy labels count as memorised.
pub const MEMORISED: f64 = 0.9;
/// Mean memorization at η = 0.2 below which the model is not overfitting the noise.
pub const NOT_OVERFITTING: f64 = 0.5;
/// The paper printed no memorization; its proxy is the η = 0.2 train loss on the noisy labels.
/// At or below this loss the noisy labels count as memorised: if the clean samples cost ≈ 0, the
/// flipped ones (a share η) carry a mean cross-entropy of 0.1 / 0.2 = 0.5 nats, a geometric-mean
/// probability of e^−0.5 ≈ 0.61 for the noisy label.
pub const PAPER_LOSS_MEMORISED: f64 = 0.1;
/// At or above this η = 0.2 train loss the paper's model counts as not overfitting: 1.5 nats on
/// the flipped samples, a geometric-mean probability of e^−1.5 ≈ 0.22 for the noisy label.
pub const PAPER_LOSS_NOT_OVERFITTING: f64 = 0.3;
/// A verdict from cells with fewer seeds than this carries a marker: a one-seed cell's std is 0,
/// so its spread says nothing about seed-to-seed variation.
pub const MIN_SEEDS: usize = 2;
/// Seeds behind each of the paper's printed cells (docs/protocol.md §4.1: 42, 314, 2718).
pub const PAPER_SEEDS: usize = 3;

/// How far the η = 0.2 fine-tune set's flipped labels were fitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memorisation {
    Memorised,
    Partly,
    Low,
}

/// Memorisation from our mean memorization at η = 0.2.
pub fn memorisation(memorization: f64) -> Memorisation {
    if memorization >= MEMORISED {
        Memorisation::Memorised
    } else if memorization < NOT_OVERFITTING {
        Memorisation::Low
    } else {
        Memorisation::Partly
    }
}

/// Memorisation from the paper's mean train loss at η = 0.2 (the proxy).
pub fn paper_memorisation(train_loss: f64) -> Memorisation {
    if train_loss <= PAPER_LOSS_MEMORISED {
        Memorisation::Memorised
    } else if train_loss >= PAPER_LOSS_NOT_OVERFITTING {
        Memorisation::Low
    } else {
        Memorisation::Partly
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Benign,
    Harmful,
    PartlyMemorised,
    NotOverfitting,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Benign => "benign",
            Verdict::Harmful => "harmful",
            Verdict::PartlyMemorised => "partly memorised",
            Verdict::NotOverfitting => "not overfitting",
        }
    }
}

/// The rule, the one place it is stated: by memorisation first; when memorised, benign if the
/// noise's test-accuracy change Δ stays within the seeds' spread (Δ ≥ −spread), harmful if it
/// falls below it. Δ and spread in the same unit.
pub fn rule(memorisation: Memorisation, delta: f64, spread: f64) -> Verdict {
    match memorisation {
        Memorisation::Low => Verdict::NotOverfitting,
        Memorisation::Partly => Verdict::PartlyMemorised,
        Memorisation::Memorised if delta >= -spread => Verdict::Benign,
        Memorisation::Memorised => Verdict::Harmful,
    }
}

/// A verdict and the numbers behind it, in percentage points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerdictCall {
    pub verdict: Verdict,
    /// Mean test accuracy at η = 0.2 minus that at η = 0.
    pub delta: f64,
    /// √(sd₀² + sd₀.₂²) of the two cells' population stds over seeds.
    pub spread: f64,
    /// The fewer seeds of the two cells.
    pub seeds: usize,
}

impl VerdictCall {
    /// `[mean, std]` test accuracies in percent at η = 0 and η = 0.2.
    pub fn of(memorisation: Memorisation, clean: [f64; 2], noisy: [f64; 2], seeds: usize) -> Self {
        let delta = noisy[0] - clean[0];
        let spread = clean[1].hypot(noisy[1]);
        VerdictCall {
            verdict: rule(memorisation, delta, spread),
            delta,
            spread,
            seeds,
        }
    }

    /// The verdict's name, marked when it rests on too few seeds.
    pub fn label(&self) -> String {
        if self.seeds < MIN_SEEDS {
            format!(
                "{} ({} seed{})",
                self.verdict.name(),
                self.seeds,
                if self.seeds == 1 { "" } else { "s" }
            )
        } else {
            self.verdict.name().to_string()
        }
    }
}

/// A verdict, or why there is none.
#[derive(Clone, Debug, PartialEq)]
pub enum CellOutcome {
    Called(VerdictCall),
    /// What is missing, e.g. "no η = 0.2 runs".
    Missing(String),
}

impl CellOutcome {
    pub fn label(&self) -> String {
        match self {
            CellOutcome::Called(call) => call.label(),
            CellOutcome::Missing(why) => format!("– ({why})"),
        }
    }

    fn call(&self) -> Option<&VerdictCall> {
        match self {
            CellOutcome::Called(call) => Some(call),
            CellOutcome::Missing(_) => None,
        }
    }
}

/// Our verdict from the η = 0 and η = 0.2 cells of one (dataset, backbone, mode, n).
pub fn verdict(clean: &Cell, noisy: &Cell) -> CellOutcome {
    let missing = [
        (clean.test_acc.mean, "no η = 0 test accuracy"),
        (noisy.test_acc.mean, "no η = 0.2 test accuracy"),
        (noisy.memorization.mean, "no η = 0.2 memorization"),
    ];
    if let Some((_, why)) = missing.iter().find(|(v, _)| !v.is_finite()) {
        return CellOutcome::Missing(why.to_string());
    }
    let percent = |c: &Cell| [100.0 * c.test_acc.mean, 100.0 * c.test_acc.std];
    CellOutcome::Called(VerdictCall::of(
        memorisation(noisy.memorization.mean),
        percent(clean),
        percent(noisy),
        clean.seeds.len().min(noisy.seeds.len()),
    ))
}

/// The paper's verdict from its printed η = 0 and η = 0.2 cells, train loss as the proxy.
pub fn paper_verdict(clean: &Table2Cell, noisy: &Table2Cell) -> VerdictCall {
    VerdictCall::of(
        paper_memorisation(noisy.train_loss[0]),
        clean.test_acc,
        noisy.test_acc,
        PAPER_SEEDS,
    )
}

/// The paper's side of a verdict row.
#[derive(Clone, Debug, PartialEq)]
pub struct PaperSide {
    /// η = 0 test accuracy minus the phase-1 baseline, percentage points.
    pub reset_cost: f64,
    /// Mean train loss at η = 0.2.
    pub train_loss: f64,
    pub call: VerdictCall,
}

/// One row of the verdict table.
#[derive(Clone, Debug, PartialEq)]
pub struct VerdictRow {
    pub dataset: String,
    pub backbone: String,
    pub mode: String,
    pub n: usize,
    /// Seeds of the η = 0 and the η = 0.2 cell (0 when the cell is missing).
    pub seeds: [usize; 2],
    /// η = 0 test accuracy minus the phase-1 baseline, percentage points (NaN without η = 0):
    /// the cost of resetting the query/key and retraining on n clean samples, before any noise.
    pub reset_cost: f64,
    /// Mean and std of the η = 0.2 memorization, percent (NaN without η = 0.2).
    pub memorization: [f64; 2],
    pub ours: CellOutcome,
    /// None when the paper printed no η = 0 or no η = 0.2 cell for (dataset, n).
    pub paper: Option<PaperSide>,
}

fn same_eta(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// A row per (dataset, backbone, mode, n) that has an η = 0 or an η = 0.2 cell, in the cells'
/// order of (dataset, mode, backbone), then by n.
pub fn verdicts(cells: &[Cell], table2: &Table2) -> Vec<VerdictRow> {
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    let mut keys: Vec<(usize, usize)> = Vec::new();
    for c in cells
        .iter()
        .filter(|c| same_eta(c.eta, 0.0) || same_eta(c.eta, NOISY_ETA))
    {
        let group = (c.dataset.as_str(), c.backbone.as_str(), c.mode.as_str());
        let rank = groups.iter().position(|g| *g == group).unwrap_or_else(|| {
            groups.push(group);
            groups.len() - 1
        });
        if !keys.contains(&(rank, c.n)) {
            keys.push((rank, c.n));
        }
    }
    keys.sort_unstable();
    keys.into_iter()
        .map(|(rank, n)| {
            let (dataset, backbone, mode) = groups[rank];
            let find = |eta: f64| {
                cells.iter().find(|c| {
                    (c.dataset.as_str(), c.backbone.as_str(), c.mode.as_str()) == groups[rank]
                        && c.n == n
                        && same_eta(c.eta, eta)
                })
            };
            let (clean, noisy) = (find(0.0), find(NOISY_ETA));
            let ours = match (clean, noisy) {
                (Some(clean), Some(noisy)) => verdict(clean, noisy),
                (None, Some(_)) => CellOutcome::Missing("no η = 0 runs".into()),
                _ => CellOutcome::Missing("no η = 0.2 runs".into()),
            };
            let paper = match (
                table2.cell(dataset, 0.0, n),
                table2.cell(dataset, NOISY_ETA, n),
                table2.dataset(dataset),
            ) {
                (Some(clean), Some(noisy), Some(d)) => Some(PaperSide {
                    reset_cost: clean.test_acc[0] - d.baseline[0],
                    train_loss: noisy.train_loss[0],
                    call: paper_verdict(clean, noisy),
                }),
                _ => None,
            };
            VerdictRow {
                dataset: dataset.to_string(),
                backbone: backbone.to_string(),
                mode: mode.to_string(),
                n,
                seeds: [clean, noisy].map(|c| c.map_or(0, |c| c.seeds.len())),
                reset_cost: clean.map_or(f64::NAN, |c| {
                    100.0 * (c.test_acc.mean - c.baseline_test_acc.mean)
                }),
                memorization: noisy.map_or([f64::NAN; 2], |c| {
                    [100.0 * c.memorization.mean, 100.0 * c.memorization.std]
                }),
                ours,
                paper,
            }
        })
        .collect()
}

fn signed(x: f64) -> String {
    if x.is_finite() {
        format!("{x:+.1}")
    } else {
        "–".into()
    }
}

fn delta(call: Option<&VerdictCall>) -> String {
    call.map_or("–".into(), |c| {
        format!("{} ± {:.1}", signed(c.delta), c.spread)
    })
}

/// The rule in words, from the constants.
fn rule_text() -> String {
    let pct = |x: f64| format!("{:.0} %", 100.0 * x);
    format!(
        "Per (dataset, backbone, mode, n), the η = {NOISY_ETA} cell against the η = 0 cell, by one \
         rule (`src/report/verdict.rs`) applied alike to ours and to the paper's printed cells:\n\n\
         - Δ = mean test accuracy at η = {NOISY_ETA} − mean test accuracy at η = 0, in \
         percentage points; spread = √(sd₀² + sd₀.₂²) from the two cells' population stds over \
         seeds. Δ ± spread is printed.\n\
         - Memorised when the mean memorization at η = {NOISY_ETA} (share of the flipped \
         fine-tune samples predicted as their noisy label) is ≥ {}; not overfitting when it is \
         < {}; partly memorised in between.\n\
         - **benign**: memorised and Δ ≥ −spread. **harmful**: memorised and Δ < −spread. \
         **not overfitting** and **partly memorised** go by memorization alone, whatever Δ.\n\
         - The paper printed no memorization: its verdict uses its η = {NOISY_ETA} train loss on \
         the noisy labels as the proxy, memorised when ≤ {PAPER_LOSS_MEMORISED}, not overfitting \
         when ≥ {PAPER_LOSS_NOT_OVERFITTING}, partly memorised in between (if the clean samples \
         cost ≈ 0, these are {:.1} and {:.1} nats on the flipped ones, a geometric-mean \
         probability of {:.2} and {:.2} for the noisy label). Its cells have {PAPER_SEEDS} seeds.\n\
         - \"(1 seed)\": a cell had fewer than {MIN_SEEDS} seeds, so its std is 0 and the spread \
         does not measure seed-to-seed variation; the verdict rests on one run. \"–\": no \
         verdict, with what is missing.\n\
         - η = 0 − baseline: the η = 0 test accuracy minus the phase-1 baseline, the cost of \
         resetting the query/key and retraining on n clean samples before any noise; Δ is the \
         noise's cost on top of it.\n",
        pct(MEMORISED),
        pct(NOT_OVERFITTING),
        PAPER_LOSS_MEMORISED / NOISY_ETA,
        PAPER_LOSS_NOT_OVERFITTING / NOISY_ETA,
        (-PAPER_LOSS_MEMORISED / NOISY_ETA).exp(),
        (-PAPER_LOSS_NOT_OVERFITTING / NOISY_ETA).exp(),
    )
}

/// report.md's verdict section: the rule in words, then the table.
pub fn markdown(md: &mut String, rows: &[VerdictRow]) -> Result<()> {
    writeln!(md, "## Verdict: benign, harmful or not overfitting\n")?;
    writeln!(md, "{}", rule_text())?;
    if rows.is_empty() {
        writeln!(
            md,
            "No (dataset, mode, n) was run at η = 0 or η = {NOISY_ETA}: no verdict.\n"
        )?;
        return Ok(());
    }
    writeln!(
        md,
        "| dataset | backbone | mode | n | seeds η = 0 / {NOISY_ETA} | η = 0 − baseline | Δ ± spread | memorization | verdict | paper η = 0 − baseline | paper Δ ± spread | paper train loss | paper verdict (loss proxy) |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for r in rows {
        let memorization = if r.memorization[0].is_finite() {
            format!("{:.1} ± {:.1}", r.memorization[0], r.memorization[1])
        } else {
            "–".into()
        };
        let paper = r.paper.as_ref();
        writeln!(
            md,
            "| {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.dataset,
            r.backbone,
            r.mode,
            r.n,
            r.seeds[0],
            r.seeds[1],
            signed(r.reset_cost),
            delta(r.ours.call()),
            memorization,
            r.ours.label(),
            paper.map_or("–".into(), |p| signed(p.reset_cost)),
            delta(paper.map(|p| &p.call)),
            paper.map_or("–".into(), |p| format!("{:.2}", p.train_loss)),
            paper.map_or("–".into(), |p| p.call.label()),
        )?;
    }
    writeln!(
        md,
        "\nAccuracy differences in percentage points, memorization in % (η = {NOISY_ETA}, mean ± \
         std over seeds). The paper's train loss is its η = {NOISY_ETA} cell's mean.\n"
    )?;
    Ok(())
}

/// verdicts.csv's row: the table's numbers unformatted (NaN and empty where missing).
#[derive(Serialize)]
struct CsvRow<'a> {
    dataset: &'a str,
    backbone: &'a str,
    mode: &'a str,
    n: usize,
    seeds_eta0: usize,
    seeds_eta02: usize,
    reset_cost_pp: f64,
    delta_pp: f64,
    spread_pp: f64,
    memorization: f64,
    verdict: &'static str,
    /// The fewer seeds of the two cells, as the verdict's marker counts them.
    verdict_seeds: usize,
    missing: &'a str,
    paper_reset_cost_pp: f64,
    paper_delta_pp: f64,
    paper_spread_pp: f64,
    paper_train_loss: f64,
    paper_verdict: &'static str,
}

/// verdicts.csv: one row per verdict row.
pub fn write_csv(path: &Path, rows: &[VerdictRow]) -> Result<()> {
    crate::io::write_atomic(path, |w| {
        let mut writer = csv::Writer::from_writer(w);
        for r in rows {
            let call = r.ours.call();
            let paper = r.paper.as_ref();
            writer.serialize(CsvRow {
                dataset: &r.dataset,
                backbone: &r.backbone,
                mode: &r.mode,
                n: r.n,
                seeds_eta0: r.seeds[0],
                seeds_eta02: r.seeds[1],
                reset_cost_pp: r.reset_cost,
                delta_pp: call.map_or(f64::NAN, |c| c.delta),
                spread_pp: call.map_or(f64::NAN, |c| c.spread),
                memorization: r.memorization[0] / 100.0,
                verdict: call.map_or("", |c| c.verdict.name()),
                verdict_seeds: call.map_or(0, |c| c.seeds),
                missing: match &r.ours {
                    CellOutcome::Missing(why) => why,
                    CellOutcome::Called(_) => "",
                },
                paper_reset_cost_pp: paper.map_or(f64::NAN, |p| p.reset_cost),
                paper_delta_pp: paper.map_or(f64::NAN, |p| p.call.delta),
                paper_spread_pp: paper.map_or(f64::NAN, |p| p.call.spread),
                paper_train_loss: paper.map_or(f64::NAN, |p| p.train_loss),
                paper_verdict: paper.map_or("", |p| p.call.verdict.name()),
            })?;
        }
        writer.flush()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::report::paper::table2;
    use crate::report::results::Stat;

    const NAN: Stat = Stat {
        mean: f64::NAN,
        std: f64::NAN,
    };

    fn stat(mean: f64, std: f64) -> Stat {
        Stat { mean, std }
    }

    /// A cifar10 cell: test accuracy and memorization as fractions, baseline 0.96.
    fn cell(eta: f64, n: usize, seeds: &[u64], test: Stat, memorization: Stat) -> Cell {
        Cell {
            dataset: "cifar10".into(),
            backbone: "vit".into(),
            mode: "last-layer".into(),
            n,
            eta,
            seeds: seeds.to_vec(),
            n_snr2: NAN,
            baseline_test_acc: stat(0.96, 0.0),
            train_loss: NAN,
            train_eval_loss: NAN,
            memorization,
            test_acc: test,
            reset_test_acc: NAN,
            test_loss: NAN,
            max_cls_attention: NAN,
            qk_eigen_mean: NAN,
            qk_eigen_var: NAN,
        }
    }

    const SEEDS: [u64; 3] = [42, 314, 2718];

    fn clean() -> Cell {
        cell(0.0, 200, &SEEDS, stat(0.80, 0.01), NAN)
    }

    fn noisy(test: f64, memorization: f64) -> Cell {
        cell(0.2, 200, &SEEDS, stat(test, 0.01), stat(memorization, 0.02))
    }

    fn called(outcome: CellOutcome) -> VerdictCall {
        match outcome {
            CellOutcome::Called(call) => call,
            CellOutcome::Missing(why) => panic!("no verdict: {why}"),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Memorised (0.95): a 1-point drop is within the spread √(1² + 1²) ≈ 1.41, a 3-point drop
    /// is beyond it.
    #[test]
    fn memorised_within_the_spread_is_benign_and_beyond_it_harmful() {
        let benign = called(verdict(&clean(), &noisy(0.79, 0.95)));
        assert_eq!(benign.verdict, Verdict::Benign);
        assert!(close(benign.delta, -1.0) && close(benign.spread, 2f64.sqrt()));
        assert_eq!(benign.label(), "benign");
        // A gain is benign too.
        let gain = called(verdict(&clean(), &noisy(0.83, 0.95)));
        assert_eq!(gain.verdict, Verdict::Benign);
        let harmful = called(verdict(&clean(), &noisy(0.77, 0.95)));
        assert_eq!(harmful.verdict, Verdict::Harmful);
        assert!(close(harmful.delta, -3.0));
    }

    #[test]
    fn low_memorization_is_not_overfitting_whatever_the_drop() {
        for test in [0.79, 0.60] {
            let call = called(verdict(&clean(), &noisy(test, 0.30)));
            assert_eq!(call.verdict, Verdict::NotOverfitting);
            assert_eq!(call.label(), "not overfitting");
        }
    }

    #[test]
    fn between_the_thresholds_is_partly_memorised() {
        for test in [0.79, 0.60] {
            let call = called(verdict(&clean(), &noisy(test, 0.70)));
            assert_eq!(call.verdict, Verdict::PartlyMemorised);
        }
    }

    /// The thresholds belong where report.md says: memorised at ≥ 0.9, low below 0.5, benign at
    /// Δ = −spread exactly; the paper's loss proxy memorised at ≤ 0.1, low at ≥ 0.3.
    #[test]
    fn the_rule_at_its_boundaries() {
        assert_eq!(memorisation(MEMORISED), Memorisation::Memorised);
        assert_eq!(memorisation(0.899), Memorisation::Partly);
        assert_eq!(memorisation(NOT_OVERFITTING), Memorisation::Partly);
        assert_eq!(memorisation(0.499), Memorisation::Low);
        assert_eq!(
            paper_memorisation(PAPER_LOSS_MEMORISED),
            Memorisation::Memorised
        );
        assert_eq!(paper_memorisation(0.11), Memorisation::Partly);
        assert_eq!(
            paper_memorisation(PAPER_LOSS_NOT_OVERFITTING),
            Memorisation::Low
        );
        assert_eq!(rule(Memorisation::Memorised, -1.0, 1.0), Verdict::Benign);
        assert_eq!(rule(Memorisation::Memorised, -1.001, 1.0), Verdict::Harmful);
        assert_eq!(rule(Memorisation::Low, -50.0, 0.0), Verdict::NotOverfitting);
    }

    /// One seed in either cell: the verdict is called, and marked; the table and the csv say so.
    #[test]
    fn a_one_seed_cell_marks_the_verdict() {
        let one = cell(0.2, 200, &[42], stat(0.79, 0.0), stat(1.0, 0.0));
        let call = called(verdict(&clean(), &one));
        assert_eq!((call.verdict, call.seeds), (Verdict::Benign, 1));
        assert_eq!(call.label(), "benign (1 seed)");
        let one_clean = cell(0.0, 200, &[42], stat(0.80, 0.0), NAN);
        let call = called(verdict(&one_clean, &noisy(0.77, 0.95)));
        assert_eq!(call.label(), "harmful (1 seed)");
        let rows = verdicts(&[one_clean, noisy(0.77, 0.95)], &table2().unwrap());
        let mut md = String::new();
        markdown(&mut md, &rows).unwrap();
        assert!(md.contains("| 1 / 3 |"), "{md}");
        assert!(md.contains("| harmful (1 seed) |"), "{md}");
        assert!(
            md.contains("\"(1 seed)\": a cell had fewer than 2 seeds"),
            "{md}"
        );
    }

    /// A missing η = 0 or η = 0.2 cell, or a value not recorded: no verdict, and which is missing.
    #[test]
    fn a_missing_cell_or_value_gives_no_verdict_and_says_which() {
        let t = table2().unwrap();
        let at = |n, c: Cell| Cell { n, ..c };
        let cells = [
            at(20, clean()),
            at(200, noisy(0.79, 0.95)),
            at(1000, clean()),
            at(1000, noisy(0.79, f64::NAN)),
            // η = 0.1 alone gives no row.
            cell(0.1, 5000, &SEEDS, stat(0.8, 0.0), stat(1.0, 0.0)),
        ];
        let rows = verdicts(&cells, &t);
        assert_eq!(
            rows.iter().map(|r| r.n).collect::<Vec<_>>(),
            [20, 200, 1000]
        );
        let labels: Vec<String> = rows.iter().map(|r| r.ours.label()).collect();
        assert_eq!(
            labels,
            [
                "– (no η = 0.2 runs)",
                "– (no η = 0 runs)",
                "– (no η = 0.2 memorization)"
            ]
        );
        assert_eq!(rows[0].seeds, [3, 0]);
        assert!(rows[1].reset_cost.is_nan());
        // The paper's side does not depend on ours.
        assert!(rows.iter().all(|r| r.paper.is_some()));
        let mut md = String::new();
        markdown(&mut md, &rows).unwrap();
        assert!(md.contains("| – (no η = 0 runs) |"), "{md}");
        assert!(
            md.contains("| cifar10 | vit | last-layer | 20 | 3 / 0 | -16.0 | – | – |"),
            "{md}"
        );
        let mut empty = String::new();
        markdown(&mut empty, &[]).unwrap();
        assert!(empty.contains("no verdict"), "{empty}");
    }

    /// The paper's side on its printed numbers (docs/protocol.md §4.1).
    #[test]
    fn the_paper_verdicts_on_its_printed_cells() {
        let t = table2().unwrap();
        let paper = |dataset: &str, n| {
            let (clean, noisy) = (t.cell(dataset, 0.0, n), t.cell(dataset, 0.2, n));
            paper_verdict(clean.unwrap(), noisy.unwrap())
        };
        // AG-news n = 1000: 85.5 ± 0.3 → 69.6 ± 1.1 at train loss 0.00.
        let ag = paper("ag_news", 1000);
        assert_eq!(ag.verdict, Verdict::Harmful);
        assert!(close(ag.delta, -15.9) && close(ag.spread, (0.09f64 + 1.21).sqrt()));
        assert_eq!((ag.seeds, ag.label()), (3, "harmful".to_string()));
        // CIFAR-10 n = 20: 96.0 ± 0.1 → 95.5 ± 0.4, Δ −0.5 beyond the spread 0.41, but the
        // train loss 0.18 is between the thresholds.
        let cifar = paper("cifar10", 20);
        assert!(cifar.delta < -cifar.spread);
        assert_eq!(cifar.verdict, Verdict::PartlyMemorised);
        // CIFAR-10 n = 1000: train loss 0.33.
        assert_eq!(paper("cifar10", 1000).verdict, Verdict::NotOverfitting);
        // MNIST n = 20: 90.8 ± 1.5 → 84.0 ± 7.2 at loss 0.00, within the spread 7.35.
        assert_eq!(paper("mnist", 20).verdict, Verdict::Benign);
        // MNIST n = 200: 91.8 ± 0.1 → 87.3 ± 1.2 at loss 0.04.
        assert_eq!(paper("mnist", 200).verdict, Verdict::Harmful);
        // PneumoniaMNIST n = 1000: 81.5 → 82.5 at loss 0.07, a gain.
        assert_eq!(paper("pneumoniamnist", 1000).verdict, Verdict::Benign);
        // The row carries the paper's reset cost: 96.0 − 96.19.
        let rows = verdicts(
            &[clean(), noisy(0.79, 0.95)].map(|c| Cell { n: 20, ..c }),
            &t,
        );
        let side = rows[0].paper.as_ref().unwrap();
        assert!(close(side.reset_cost, 96.0 - 96.19) && close(side.train_loss, 0.18));
        assert!(
            verdicts(
                &[Cell {
                    dataset: "breastmnist".into(),
                    n: 1000,
                    ..clean()
                }],
                &t
            )[0]
            .paper
            .is_none()
        );
    }

    /// The section states the rule with the constants' values, then a row per n with ours and
    /// the paper's side by side.
    #[test]
    fn the_section_states_the_rule_and_sets_the_paper_beside() {
        let t = table2().unwrap();
        let cells = [clean(), noisy(0.77, 0.95)];
        let rows = verdicts(&cells, &t);
        let mut md = String::new();
        markdown(&mut md, &rows).unwrap();
        for phrase in [
            "## Verdict",
            "spread = √(sd₀² + sd₀.₂²)",
            "is ≥ 90 %; not overfitting when it is < 50 %",
            "**benign**: memorised and Δ ≥ −spread",
            "train loss on the noisy labels as the proxy, memorised when ≤ 0.1, not overfitting \
             when ≥ 0.3",
            "η = 0 − baseline",
        ] {
            assert!(md.contains(phrase), "{phrase}:\n{md}");
        }
        // Ours: 80 − 96 = −16.0; Δ −3.0 ± 1.4; the paper at n = 200: 95.9 − 96.19 = −0.3,
        // Δ 94.3 − 95.9 = −1.6 ± 0.3 at loss 0.18.
        assert!(
            md.contains(
                "| cifar10 | vit | last-layer | 200 | 3 / 3 | -16.0 | -3.0 ± 1.4 | 95.0 ± 2.0 | \
                 harmful | -0.3 | -1.6 ± 0.3 | 0.18 | partly memorised |"
            ),
            "{md}"
        );
    }

    #[test]
    fn verdicts_csv_has_a_row_per_verdict_row() {
        let t = table2().unwrap();
        let rows = verdicts(&[clean(), noisy(0.79, 0.95), Cell { n: 20, ..clean() }], &t);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("verdicts.csv");
        write_csv(&path, &rows).unwrap();
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        let records: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
        let field = |i: usize, name: &str| {
            records[i][header.iter().position(|h| h == name).unwrap()].to_string()
        };
        assert_eq!(records.len(), 2);
        assert_eq!(
            (field(0, "n"), field(0, "verdict")),
            ("20".into(), "".into())
        );
        assert_eq!(field(0, "missing"), "no η = 0.2 runs");
        assert_eq!(field(1, "verdict"), "benign");
        assert_eq!(field(1, "verdict_seeds"), "3");
        assert_eq!(field(1, "memorization"), "0.95");
        assert_eq!(field(1, "paper_verdict"), "partly memorised");
    }
}
