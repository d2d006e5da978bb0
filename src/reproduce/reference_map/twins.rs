//! Each Table 2 cell's twin (issue 74, item 4; docs/design.md, "The paper's model on real noise"):
//! the reference map's model on the cell's own tokens (its dataset, backbone and mode, T 8 of
//! each sample's tokens as the noise) at the cell's n and its pooled n·SNR² (n times its group's
//! SNR², `report::theory`), at η 0 and 0.2 with the map's seeds on the map's clock, judged by the
//! real cells' rule (`report::verdict::rule`: memorisation of the flipped labels at η 0.2, then
//! benign where Δ stays within the seeds' spread) — and only where every run settled and the
//! test set has a signal to show. It replaces the twins at the cell's T and d_eff, which could
//! not return a regime.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::judge::MapCall;
use super::map::{MapRun, SEEDS, cheaper_engine, seed_noise, source_tokens};
use crate::report::results::Stat;
use crate::report::theory::TwinTarget;
use crate::report::verdict::{self, NOISY_ETA};
use crate::train::progress::Progress;
use crate::train::run::Places;
use crate::train::run::{FinetuneJob, RunConfig};

/// The twin's label-noise rates: the clean runs Δ is measured from, and the noisy ones.
pub const TWIN_ETAS: [f64; 2] = [0.0, NOISY_ETA];

/// Where one twin run is kept.
pub fn twin_file(out: &Path, target: &TwinTarget, eta: f64, seed: u64) -> PathBuf {
    out.join("runs").join(format!(
        "{}_{}_n{}_eta{eta}_s{seed}.json",
        target.config.dataset, target.mode, target.n
    ))
}

/// The fine-tune pool a group of cells needs: twice its largest n (samples shorter than T are
/// passed over).
pub fn pool_size(targets: &[&TwinTarget]) -> usize {
    2 * targets.iter().map(|t| t.n).max().unwrap_or(0)
}

/// Every twin run of `targets` (cells of one dataset, backbone and mode, read from `job`'s
/// tokens), kept ones read back; `on_done` after each. Cells without a signal to set are passed
/// over.
pub fn group_twins(
    job: &FinetuneJob,
    targets: &[&TwinTarget],
    out: &Path,
    progress: &dyn Progress,
    on_done: &dyn Fn(&MapRun),
) -> Result<Vec<MapRun>> {
    let (tokens, names) = source_tokens(job, out, progress)?;
    let source = names.source(out, job, cheaper_engine);
    let largest = targets.iter().map(|t| t.n).max().unwrap_or(0);
    let mut todo: Vec<&&TwinTarget> = targets.iter().filter(|t| t.n_snr2 > 0.0).collect();
    // The cheap cells first, so that an interrupted pass leaves whole small cells.
    todo.sort_by_key(|t| t.n);
    let mut runs = Vec::new();
    for seed in SEEDS {
        let noise = seed_noise(&tokens, seed, largest)?;
        for target in &todo {
            for eta in TWIN_ETAS {
                crate::interrupt::check()?;
                let point = (target.n, target.n_snr2, seed);
                let path = twin_file(out, target, eta, seed);
                let run = source.run_at(&noise, (point, eta, false), &path)?;
                on_done(&run);
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

/// What a twin says of its cell.
#[derive(Clone, Debug, PartialEq)]
pub enum TwinVerdict {
    /// The real rule's verdict, with the twin's memorisation and Δ (percentage points).
    Called {
        verdict: verdict::VerdictCall,
        memorization: f64,
    },
    /// No signal to set (pooled SNR² ≤ 0) or a test set whose relevant token shows none.
    NoSignal,
    /// Runs still moving at the cap (how many of the cell's).
    Unconverged(usize),
    /// Not all runs made yet (how many are).
    Incomplete(usize),
}

impl TwinVerdict {
    pub fn label(&self) -> String {
        match self {
            Self::Called { verdict, .. } => verdict.verdict.name().to_string(),
            Self::NoSignal => "no signal".into(),
            Self::Unconverged(k) => format!("unconverged at cap ({k} runs)"),
            Self::Incomplete(k) => format!("incomplete ({k} of {} runs)", 2 * SEEDS.len()),
        }
    }
}

/// The runs of `runs` that are `target`'s twin.
pub fn runs_of<'a>(target: &TwinTarget, runs: &'a [MapRun]) -> Vec<&'a MapRun> {
    runs.iter()
        .filter(|r| {
            r.dataset == target.config.dataset.to_string()
                && r.mode == target.config.mode.name()
                && r.n == target.n
                && !r.half_step
        })
        .collect()
}

/// The last checkpoint's (test accuracy, memorisation) of each run at `eta`.
fn finals(runs: &[&MapRun], eta: f64) -> Vec<(f64, f64)> {
    runs.iter()
        .filter(|r| (r.config.noise_ratio - eta).abs() < 1e-12)
        .filter_map(|r| r.checkpoints.last().map(|c| (c.test_acc, c.memorization)))
        .collect()
}

/// The twin's verdict from its runs, by the real cells' rule.
pub fn judge_twin(target: &TwinTarget, runs: &[&MapRun]) -> TwinVerdict {
    if target.n_snr2 <= 0.0 || runs.iter().any(|r| r.call == MapCall::NoSignal) {
        return TwinVerdict::NoSignal;
    }
    if runs.len() < 2 * SEEDS.len() {
        return TwinVerdict::Incomplete(runs.len());
    }
    let moving = runs
        .iter()
        .filter(|r| r.call == MapCall::Unconverged)
        .count();
    if moving > 0 {
        return TwinVerdict::Unconverged(moving);
    }
    let (clean, noisy) = (finals(runs, 0.0), finals(runs, NOISY_ETA));
    let percent = |values: &[(f64, f64)]| {
        let s = Stat::of(values.iter().map(|v| 100.0 * v.0));
        [s.mean, s.std]
    };
    let memorization = Stat::of(noisy.iter().map(|v| v.1)).mean;
    TwinVerdict::Called {
        verdict: verdict::VerdictCall::of(
            verdict::memorisation(memorization),
            percent(&clean),
            percent(&noisy),
            clean.len().min(noisy.len()),
        ),
        memorization,
    }
}

/// The job whose tokens a group of cells reads: the paper's config of the cells' dataset in
/// their mode, classifier and backbone, its fine-tune pool [`pool_size`].
fn group_job(targets: &[&TwinTarget], places: &Places) -> Result<FinetuneJob> {
    let cell = &targets[0].config;
    let config = RunConfig {
        mode: cell.mode,
        head_classifier: cell.head_classifier,
        backbones: cell.backbones.clone(),
        carve_train_from_test: cell.carve_train_from_test,
        special_tokens: cell.special_tokens,
        n: pool_size(targets),
        eta: 0.0,
        ..RunConfig::paper(&cell.dataset)?
    };
    Ok(FinetuneJob {
        checkpoint_every: 0,
        ..FinetuneJob::new(config, places.clone())
    })
}

/// Every twin run of `targets`, a group (dataset, backbone, mode) at a time, kept ones read
/// back.
pub fn all_twins(
    targets: &[&TwinTarget],
    (out, places): (&Path, &Places),
    progress: &dyn Progress,
    on_done: &dyn Fn(&MapRun),
) -> Result<Vec<MapRun>> {
    let key = |t: &TwinTarget| {
        (
            t.config.dataset.to_string(),
            t.backbone.clone(),
            t.mode.clone(),
        )
    };
    let mut keys: Vec<_> = targets.iter().map(|t| key(t)).collect();
    keys.dedup();
    let mut runs = Vec::new();
    for k in keys {
        let group: Vec<&TwinTarget> = targets.iter().copied().filter(|t| key(t) == k).collect();
        let job = group_job(&group, places)?;
        runs.extend(group_twins(&job, &group, out, progress, on_done)?);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::reference_map::judge::CheckpointReading;
    use crate::synthetic::{EngineKind, SyntheticConfig};

    fn target(n_snr2: f64) -> TwinTarget {
        TwinTarget {
            config: RunConfig::paper(&"trec".parse().unwrap()).unwrap(),
            backbone: "b".into(),
            mode: "head-tokens".into(),
            n: 20,
            n_snr2,
            real_memorization: 1.0,
            real_delta: -1.0,
            real_verdict: Some("benign".into()),
        }
    }

    fn run(eta: f64, seed: u64, test_acc: f64, call: MapCall) -> MapRun {
        MapRun {
            dataset: "trec".into(),
            backbone: "b".into(),
            mode: "head".into(),
            n: 20,
            n_snr2: 1.0,
            seed,
            half_step: false,
            tokens_digest: String::new(),
            config: SyntheticConfig {
                noise_ratio: eta,
                ..SyntheticConfig::default()
            },
            engine: EngineKind::Subspace,
            ceiling: 1.0,
            checkpoints: vec![CheckpointReading {
                step: 4000,
                train_loss: 0.0,
                train_acc: 1.0,
                test_acc,
                memorization: if eta > 0.0 { 1.0 } else { f64::NAN },
            }],
            call,
        }
    }

    fn cell(noisy_test: [f64; 3], last: MapCall) -> Vec<MapRun> {
        let mut runs: Vec<MapRun> = (0..3).map(|s| run(0.0, s, 0.95, MapCall::Benign)).collect();
        runs.extend((0..3).map(|s| run(NOISY_ETA, s, noisy_test[s as usize], MapCall::Benign)));
        runs[5].call = last;
        runs
    }

    #[test]
    fn a_twin_is_judged_by_the_real_rule_only_when_settled() {
        let said =
            |runs: &[MapRun], x: f64| judge_twin(&target(x), &runs.iter().collect::<Vec<_>>());
        let benign = cell([0.95, 0.94, 0.96], MapCall::Benign);
        match said(&benign, 1.0) {
            TwinVerdict::Called {
                verdict,
                memorization,
            } => {
                assert_eq!(verdict.verdict, verdict::Verdict::Benign);
                assert_eq!(memorization, 1.0);
            }
            other => panic!("{other:?}"),
        }
        let harmful = cell([0.6, 0.62, 0.58], MapCall::Harmful);
        let TwinVerdict::Called { verdict, .. } = said(&harmful, 1.0) else {
            panic!("not called")
        };
        assert_eq!(verdict.verdict, verdict::Verdict::Harmful);
        assert!((verdict.delta + 35.0).abs() < 1e-9, "{}", verdict.delta);
        let moving = cell([0.95, 0.94, 0.96], MapCall::Unconverged);
        assert_eq!(said(&moving, 1.0), TwinVerdict::Unconverged(1));
        assert_eq!(said(&benign[..4], 1.0), TwinVerdict::Incomplete(4));
        assert_eq!(said(&benign, 0.0), TwinVerdict::NoSignal);
    }

    #[test]
    fn the_cheaper_engine_follows_the_shape() {
        let at = |train_n, embed_dim| SyntheticConfig {
            train_n,
            embed_dim,
            seq_len: 8,
            ..SyntheticConfig::default()
        };
        // nT 160 tokens in d 384: the subspace engine's (nT)² is the smaller.
        assert_eq!(cheaper_engine(&at(20, 384)), EngineKind::Subspace);
        // nT 1600 tokens in d 192: the dense engine's d² + nT·d.
        assert_eq!(cheaper_engine(&at(200, 192)), EngineKind::Dense);
    }
}
