//! `reproduce dose-check`: the dose's pre-registered analysis on the paper's synthetic model, where
//! the theorem holds, before the real grid is trusted to answer (docs/design.md, "The SNR dose").
//! The same P1–P4 and answer line, on six (d, ‖μ‖) settings as its "datasets", doses as σ_ε² =
//! 1 + k, and n 20 and 100 for P4 (the same ×5 as the real grid's 200 and 1000: n 1000 at d 1000
//! takes ~10 min a run on the exact engine, n 100 seconds). Then the same with the doses shuffled.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;

use crate::report::dose::{Analysis, DoseRun, Sizes};
use crate::report::verdict::{NOISY_ETA, Verdict};
use crate::synthetic::dose::{DoseGrid, DoseOutcome, DoseSetting, run_grid};
use crate::synthetic::{Regime, SyntheticConfig};

/// The check's sizes: P4's ×5 at a cost two cores bear.
pub const CHECK_SIZES: Sizes = Sizes {
    small: 20,
    large: 100,
};

/// Undosed n·SNR² at the smaller n: the settings span it by doublings at two widths, fixed before
/// the check ran (not tuned on its outcomes), so that the ladder 1 + k ∈ [1, 25] can hold both
/// crossings where the crossing sits at n·SNR² ≈ 50–100 (a scan of four runs; COMMANDS.md).
const UNDOSED: [f64; 3] = [100.0, 200.0, 400.0];
const WIDTHS: [usize; 2] = [1000, 2000];

/// The six (d, ‖μ‖): ‖μ‖ = √(n·SNR² · d / n) at n 20, since SNR = ‖μ‖/√d at σ_ε 1.
fn settings() -> Vec<DoseSetting> {
    WIDTHS
        .into_iter()
        .flat_map(|embed_dim| UNDOSED.into_iter().map(move |target| (embed_dim, target)))
        .map(|(embed_dim, target)| {
            let signal_norm = (target * embed_dim as f64 / CHECK_SIZES.small as f64).sqrt();
            let signal_norm = (signal_norm * 100.0).round() / 100.0;
            DoseSetting {
                name: format!("d{embed_dim}-nsnr{target}"),
                embed_dim,
                signal_norm,
            }
        })
        .collect()
}

/// The check's grid: the paper's T, ρ, step size and 1000 steps; a test set of 500.
pub fn grid() -> DoseGrid {
    DoseGrid {
        base: SyntheticConfig {
            test_n: 500,
            log_interval: 1000,
            ..SyntheticConfig::default()
        },
        settings: settings(),
        ns: vec![CHECK_SIZES.small, CHECK_SIZES.large],
        doses: super::driver::DOSES.to_vec(),
        etas: vec![0.0, NOISY_ETA],
        seeds: vec![0, 1, 2],
    }
}

const PREFACE: &str = "# The SNR dose on the paper's synthetic model\n\nThe pre-registered \
analysis of the dose (results/dose-pilot/PREREGISTRATION.md: the rule as registered and as mended after \
this check's first reading) on the token selector \
of the paper with Gaussian noise σ_ε² = 1 + k: six (d, ‖μ‖) settings stand for the datasets, n 20 \
and 100 for 200 and 1000 (the same ×5 that P4 predicts). Where the theorem holds the analysis must \
be able to say Yes; with the doses shuffled it must not.\n\n";

fn dose_run(outcome: &DoseOutcome) -> DoseRun {
    DoseRun {
        dataset: outcome.setting.clone(),
        n: outcome.config.train_n,
        k: outcome.k,
        seed: outcome.config.seed,
        eta: outcome.config.noise_ratio,
        memorization: outcome.memorization(),
        test_acc: outcome.test_acc,
    }
}

/// A regime as the real report's verdict (the synthetic rule has no "partly memorised").
fn verdict_of_regime(regime: Regime) -> Option<Verdict> {
    match regime {
        Regime::Benign => Some(Verdict::Benign),
        Regime::Harmful => Some(Verdict::Harmful),
        Regime::NotOverfitting => Some(Verdict::NotOverfitting),
        Regime::Underfitting | Regime::NoLabelNoise => None,
    }
}

/// Each (setting, n, dose)'s verdict: the regime most of its η 0.2 seeds reached (a tie: none).
fn majority_verdicts(outcomes: &[DoseOutcome]) -> BTreeMap<(String, usize, u64), Verdict> {
    let mut votes: BTreeMap<(String, usize, u64), Vec<Regime>> = BTreeMap::new();
    for o in outcomes
        .iter()
        .filter(|o| (o.config.noise_ratio - NOISY_ETA).abs() < 1e-9)
    {
        votes
            .entry((o.setting.clone(), o.config.train_n, o.k.to_bits()))
            .or_default()
            .push(o.regime);
    }
    votes
        .into_iter()
        .filter_map(|(key, regimes)| {
            let count = |r: Regime| regimes.iter().filter(|&&x| x == r).count();
            let best = *regimes.iter().max_by_key(|&&r| count(r))?;
            let tied = regimes
                .iter()
                .any(|&r| r != best && count(r) == count(best));
            (!tied)
                .then(|| verdict_of_regime(best))
                .flatten()
                .map(|v| (key, v))
        })
        .collect()
}

/// Runs (or resumes) the check in `out` and writes dose_check.md and dose_check.png; returns the
/// answer on the unshuffled runs.
pub fn run(out: &Path, jobs: usize, on_done: &(dyn Fn() + Sync)) -> Result<&'static str> {
    let outcomes = run_grid(&grid(), out, jobs, on_done)?;
    let runs: Vec<DoseRun> = outcomes.iter().map(dose_run).collect();
    let verdicts = majority_verdicts(&outcomes);
    let verdict_of = |setting: &str, n: usize, k: f64| {
        verdicts
            .get(&(setting.to_string(), n, k.to_bits()))
            .copied()
    };
    let analysis = Analysis {
        stem: "dose_check",
        preface: PREFACE,
        sizes: CHECK_SIZES,
    };
    analysis.write(out, &runs, &verdict_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(seed: u64, regime: Regime) -> DoseOutcome {
        DoseOutcome {
            setting: "a".into(),
            k: 3.0,
            config: SyntheticConfig {
                seed,
                train_n: 20,
                noise_ratio: NOISY_ETA,
                ..Default::default()
            },
            regime,
            train_acc: 1.0,
            test_acc: 1.0,
            noisy_fitted: 4,
            noisy_total: 4,
        }
    }

    #[test]
    fn a_verdict_is_the_seeds_majority_and_a_tie_is_none() {
        let two_to_one = [
            outcome(0, Regime::Benign),
            outcome(1, Regime::Benign),
            outcome(2, Regime::Harmful),
        ];
        let got = majority_verdicts(&two_to_one);
        assert_eq!(
            got.values().copied().collect::<Vec<_>>(),
            vec![Verdict::Benign]
        );
        let tie = [outcome(0, Regime::Benign), outcome(1, Regime::Harmful)];
        assert!(majority_verdicts(&tie).is_empty());
    }

    #[test]
    fn the_check_sizes_are_the_real_grids_ratio() {
        let real = crate::report::dose::REAL_SIZES;
        assert_eq!(
            CHECK_SIZES.large * real.small,
            CHECK_SIZES.small * real.large
        );
        assert_eq!(grid().points().len(), 6 * 2 * 5 * 2 * 3);
    }
}
