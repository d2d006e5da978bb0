//! The synthetic side, with no knowledge of cells: a cell's twin setting and the runs that test it,
//! the cache of synthetic runs kept between reports, the twin's call, and the boundary lines.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::report::verdict::NOISY_ETA;
use crate::synthetic::{EngineKind, Regime, SyntheticConfig, Trace};

/// The synthetic runs the section needs, kept between reports (each is keyed by its whole config).
pub const SYNTHETIC_RUNS: &str = "synthetic_twins.json";

/// The twin's step size and length are tried at these multiples; the last lengthens the run.
const STEP_SCALES: [(&str, f64); 2] = [("½ step", 0.5), ("2× step", 2.0)];
pub(super) const LONGER: usize = 5;
/// The boundary lines: log₁₀ n·SNR² from −1 by half decades (0.1 to 10³). Each point is a base
/// twin run; at T 197 and n 1000 one takes ~40 s, so the line is coarse.
const BOUNDARY_POINTS: usize = 9;

/// A synthetic run's outcome, as the cache keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SyntheticOutcome {
    config: SyntheticConfig,
    regime: Regime,
    train_acc: f64,
    test_acc: f64,
    noisy_fitted: usize,
    noisy_total: usize,
}

/// Synthetic runs read from and written back to the report folder, so that a report made again
/// runs only the configurations it has not seen.
pub(super) struct SyntheticRuns {
    path: std::path::PathBuf,
    kept: Vec<SyntheticOutcome>,
    used: Vec<SyntheticOutcome>,
    /// Runs that failed, with why (shown in the table instead of a regime).
    failed: Vec<(SyntheticConfig, String)>,
}

impl SyntheticRuns {
    pub(super) fn open(out: &Path) -> Self {
        let path = out.join(SYNTHETIC_RUNS);
        // An unreadable or stale file is only a cache: its runs are made again.
        let kept = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Self {
            path,
            kept,
            used: Vec::new(),
            failed: Vec::new(),
        }
    }

    fn find(&self, config: &SyntheticConfig) -> Option<&SyntheticOutcome> {
        self.used
            .iter()
            .chain(&self.kept)
            .find(|o| o.config == *config)
    }

    /// Makes every run of `configs` not yet known, the slowest first, across the cores (each run
    /// is single-threaded), and keeps them all for [`save`](Self::save).
    pub(super) fn run_all(&mut self, configs: &[SyntheticConfig]) {
        let mut todo: Vec<&SyntheticConfig> = Vec::new();
        for config in configs {
            match self.find(config).cloned() {
                Some(o) if !self.used.iter().any(|u| u.config == *config) => self.used.push(o),
                Some(_) => {}
                None if !todo.contains(&config) => todo.push(config),
                None => {}
            }
        }
        let cost = |c: &SyntheticConfig| c.train_n * c.seq_len * (c.embed_dim + 16) * c.num_steps;
        todo.sort_by_key(|c| std::cmp::Reverse(cost(c)));
        let done = AtomicUsize::new(0);
        let total = todo.len();
        let outcomes: Vec<(SyntheticConfig, Result<SyntheticOutcome>)> = todo
            .par_iter()
            .map(|config| {
                let outcome = run_synthetic(config);
                let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                eprintln!(
                    "synthetic run {k}/{total}: T {}, d {}, n {}, ‖μ‖ {:.3}, step {:.4}, {} steps",
                    config.seq_len,
                    config.embed_dim,
                    config.train_n,
                    config.signal_norm,
                    config.learning_rate,
                    config.num_steps
                );
                ((*config).clone(), outcome)
            })
            .collect();
        for (config, outcome) in outcomes {
            match outcome {
                Ok(o) => self.used.push(o),
                Err(e) => self.failed.push((config, format!("{e:#}"))),
            }
        }
    }

    pub(super) fn regime(&self, config: &SyntheticConfig) -> Result<Regime, String> {
        if let Some(o) = self.find(config) {
            return Ok(o.regime);
        }
        Err(self
            .failed
            .iter()
            .find(|(c, _)| c == config)
            .map_or_else(|| "not run".to_string(), |(_, why)| why.clone()))
    }

    pub(super) fn save(&self) -> Result<()> {
        crate::io::write_json(&self.path, &self.used)
    }
}

fn run_synthetic(config: &SyntheticConfig) -> Result<SyntheticOutcome> {
    let run = crate::synthetic::run(config, EngineKind::Dense, Trace::FinalOnly, &mut |_| {})
        .with_context(|| format!("synthetic run {config:?}"))?;
    let s = run.summary;
    Ok(SyntheticOutcome {
        config: config.clone(),
        regime: s.regime,
        train_acc: s.train_acc,
        test_acc: s.test_acc,
        noisy_fitted: s.noisy_fitted,
        noisy_total: s.noisy_total,
    })
}

/// The synthetic twin of a cell: the token selector at the cell's T (its mean token count), d
/// (the noise's effective dimension: the paper's noise is isotropic in d directions, real tokens'
/// spreads in far fewer), n and η = 0.2, with σ_ε = 1 and ‖μ‖ = SNR·√d so that its SNR is the
/// cell's. The paper's step size is for T = 8; the softmax's gradients shrink as 1/T, so the
/// twin's is scaled by T/8 (with the paper's own, attention over 197 tokens does not move in 1000
/// steps).
pub fn twin_config(dim: usize, mean_tokens: f64, n: usize, snr: f64) -> SyntheticConfig {
    let paper = SyntheticConfig::default();
    let seq_len = (mean_tokens.round() as usize).max(3);
    SyntheticConfig {
        seq_len,
        embed_dim: dim.max(2),
        train_n: n,
        noise_ratio: NOISY_ETA,
        signal_norm: snr * (dim.max(2) as f64).sqrt(),
        learning_rate: paper.learning_rate * seq_len as f64 / paper.seq_len as f64,
        log_interval: paper.num_steps,
        ..paper
    }
}

/// The twin and the runs that test it: half and twice the step, and five times the steps (if
/// the regime moves with more steps, the base run had not settled).
pub(super) fn twin_variants(base: &SyntheticConfig) -> Vec<(&'static str, SyntheticConfig)> {
    let mut variants = vec![("base", base.clone())];
    for (name, scale) in STEP_SCALES {
        let mut c = base.clone();
        c.learning_rate *= scale;
        variants.push((name, c));
    }
    let mut longer = base.clone();
    longer.num_steps *= LONGER;
    longer.log_interval = longer.num_steps;
    variants.push(("5× steps", longer));
    variants
}

/// What a twin says about its cell.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum TwinCall {
    /// Every variant lands in this regime.
    Stable(Regime),
    /// The base run settled in a regime the step size moves: (variant, regime) of each run.
    Unstable(Vec<(&'static str, Regime)>),
    /// No regime: why.
    Undecided(String),
}

impl TwinCall {
    /// The rule: a base run that underfits, or whose regime five times the steps change, has not
    /// landed anywhere; otherwise the regime is stable when the step's halving and doubling keep it.
    pub(super) fn judge(runs: &[(&'static str, Regime)]) -> Self {
        let Some(&(_, base)) = runs.first() else {
            return TwinCall::Undecided("no run".into());
        };
        if base == Regime::Underfitting {
            return TwinCall::Undecided("base run underfitting".into());
        }
        if let Some((_, longer)) = runs.iter().find(|(name, _)| *name == "5× steps")
            && *longer != base
        {
            return TwinCall::Undecided(format!(
                "{} after 1×, {} after 5× steps",
                base.name(),
                longer.name()
            ));
        }
        if runs.iter().all(|(_, r)| *r == base) {
            TwinCall::Stable(base)
        } else {
            TwinCall::Unstable(runs.to_vec())
        }
    }

    /// The regime a verdict can be set against (stable twins only).
    pub(super) fn regime(&self) -> Option<Regime> {
        match self {
            TwinCall::Stable(r) => Some(*r),
            _ => None,
        }
    }

    /// The confusion table's row.
    pub(super) fn row(&self) -> String {
        match self {
            TwinCall::Stable(r) => r.name().to_string(),
            TwinCall::Unstable(_) => "unstable".into(),
            TwinCall::Undecided(_) => "undecided".into(),
        }
    }

    pub(super) fn text(&self) -> String {
        match self {
            TwinCall::Stable(r) => format!("{} (stable)", r.name()),
            TwinCall::Unstable(runs) => format!(
                "unstable: {}",
                runs.iter()
                    .map(|(name, r)| format!("{name} {}", r.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TwinCall::Undecided(why) => format!("undecided ({why})"),
        }
    }
}

/// The twin's setting along n·SNR² (0.1 to 10³ by half decades), everything else as `base`.
pub(super) fn boundary_line(base: &SyntheticConfig) -> Vec<(f64, SyntheticConfig)> {
    (0..BOUNDARY_POINTS)
        .map(|k| {
            let n_snr2 = 10f64.powf(-1.0 + 0.5 * k as f64);
            let snr = (n_snr2 / base.train_n as f64).sqrt();
            let config = SyntheticConfig {
                signal_norm: snr * (base.embed_dim as f64).sqrt(),
                ..base.clone()
            };
            (n_snr2, config)
        })
        .collect()
}

/// Where the regime changes along the line: the geometric midpoint of each pair of neighbours
/// whose regimes differ, with the two regimes.
pub(super) fn boundaries(line: &[(f64, Regime)]) -> Vec<(f64, Regime, Regime)> {
    line.windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| ((w[0].0 * w[1].0).sqrt(), w[0].1, w[1].1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_twin_has_the_cells_snr_in_its_effective_dimension_and_a_step_scaled_to_its_tokens() {
        let twin = twin_config(12, 197.0, 200, 0.3);
        assert_eq!((twin.seq_len, twin.embed_dim, twin.train_n), (197, 12, 200));
        assert!((twin.snr() - 0.3).abs() < 1e-12);
        assert!((twin.signal_norm - 0.3 * 12f64.sqrt()).abs() < 1e-12);
        assert!((twin.learning_rate - 5e-3 * 197.0 / 8.0).abs() < 1e-12);
        assert_eq!(twin.noise_ratio, NOISY_ETA);
        twin.validate().unwrap();
        // A short text keeps the three roles x₁, x₂, x₃; a dimension under 2 is raised to 2.
        let short = twin_config(1, 1.6, 20, 0.3);
        assert_eq!((short.seq_len, short.embed_dim), (3, 2));
        short.validate().unwrap();
        // Every variant and every point of the line is a valid run.
        for (_, c) in twin_variants(&twin) {
            c.validate().unwrap();
        }
        let variants = twin_variants(&twin);
        assert_eq!(variants[3].1.num_steps, 5 * twin.num_steps);
        assert_eq!(variants[3].1.log_interval, variants[3].1.num_steps);
        assert!((variants[1].1.learning_rate - twin.learning_rate / 2.0).abs() < 1e-15);
        let line = boundary_line(&twin);
        assert_eq!(line.len(), BOUNDARY_POINTS);
        assert!((line[0].0 - 0.1).abs() < 1e-12 && (line[8].0 - 1000.0).abs() < 1e-9);
        for (x, c) in line {
            c.validate().unwrap();
            let n_snr2 = c.train_n as f64 * c.snr().powi(2);
            assert!((n_snr2 / x - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn a_twin_counts_only_when_it_settles_and_the_step_keeps_it() {
        use Regime::*;
        let runs = |r: [Regime; 4]| {
            vec![
                ("base", r[0]),
                ("½ step", r[1]),
                ("2× step", r[2]),
                ("5× steps", r[3]),
            ]
        };
        assert_eq!(
            TwinCall::judge(&runs([Benign; 4])),
            TwinCall::Stable(Benign)
        );
        let unstable = TwinCall::judge(&runs([Benign, Harmful, Benign, Benign]));
        assert!(matches!(unstable, TwinCall::Unstable(_)) && unstable.regime().is_none());
        assert!(unstable.text().contains("½ step harmful"));
        let unsettled = TwinCall::judge(&runs([Harmful, Harmful, Harmful, Benign]));
        assert!(matches!(unsettled, TwinCall::Undecided(_)) && unsettled.regime().is_none());
        let underfit = TwinCall::judge(&runs([Underfitting; 4]));
        assert_eq!(
            underfit,
            TwinCall::Undecided("base run underfitting".into())
        );
    }

    #[test]
    fn boundaries_sit_between_neighbours_that_differ() {
        let line = [
            (1.0, Regime::Harmful),
            (4.0, Regime::Benign),
            (16.0, Regime::Benign),
            (64.0, Regime::NotOverfitting),
        ];
        let edges = boundaries(&line);
        assert_eq!(edges.len(), 2);
        assert!((edges[0].0 - 2.0).abs() < 1e-12 && edges[0].1 == Regime::Harmful);
        assert!((edges[1].0 - 32.0).abs() < 1e-12 && edges[1].2 == Regime::NotOverfitting);
    }
}
