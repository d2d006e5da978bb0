//! results.csv (one row per finished `finetune` run) and its aggregation into the paper's cells:
//! mean and population standard deviation (numpy's default `np.std`, as the authors printed) over
//! the seeds of each (dataset, backbone, mode, n, η).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::train::finetune::FinetuneSummary;

/// A finished run, flattened from its summary.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// The run's folder name (unique per grid point).
    pub run: String,
    pub dataset: String,
    pub backbone: String,
    pub mode: String,
    pub noise: String,
    pub eta: f64,
    pub realised_eta: f64,
    pub n: usize,
    pub seed: u64,
    pub pretrain_n: usize,
    pub test_n: usize,
    pub epochs: usize,
    pub pretrain_epochs: usize,
    pub baseline_test_acc: f64,
    pub train_loss: f64,
    pub train_acc: f64,
    /// NaN when no label was flipped.
    pub memorization: f64,
    pub clean_train_acc: f64,
    pub test_acc: f64,
    pub test_loss: f64,
    pub max_cls_attention: f64,
    pub attention_entropy: f64,
    /// Final query-key eigen-mean and eigen-variance of the real parts, and the variance of the
    /// symmetric part (`diagnostics`); NaN when the run has none.
    #[serde(default = "nan")]
    pub qk_eigen_mean: f64,
    #[serde(default = "nan")]
    pub qk_eigen_var: f64,
    #[serde(default = "nan")]
    pub qk_sym_var: f64,
    /// Final rank-collapse residual of the last layer's token outputs; NaN when not measured.
    #[serde(default = "nan")]
    pub rank_collapse: f64,
    /// Every deviation of the run, joined by " | ".
    pub deviations: String,
}

fn nan() -> f64 {
    f64::NAN
}

pub const RUNS: &str = "runs";

/// The row of the finished run in `dir` (None when it has not finished).
pub fn read_run(dir: &Path) -> Result<Option<ResultRow>> {
    let path = dir.join("summary.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let s: FinetuneSummary = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a finetune summary", path.display()))?;
    Ok(Some(ResultRow {
        run: dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
        dataset: s.dataset,
        backbone: s.backbone,
        // As summary.json spells it: "last-layer" or "head".
        mode: serde_json::to_value(s.mode)?
            .as_str()
            .unwrap_or_default()
            .to_string(),
        noise: s.noise,
        eta: s.eta,
        realised_eta: s.realised_eta,
        n: s.n,
        seed: s.seed,
        pretrain_n: s.pretrain_n,
        test_n: s.test_n,
        epochs: s.epochs,
        pretrain_epochs: s.pretrain_epochs,
        baseline_test_acc: s.baseline_test_acc,
        train_loss: s.train_loss,
        train_acc: s.train_acc,
        // serde_json writes NaN as null.
        memorization: s.memorization,
        clean_train_acc: s.clean_train_acc,
        test_acc: s.test_acc,
        test_loss: s.test_loss,
        max_cls_attention: s.max_cls_attention,
        attention_entropy: s.attention_entropy,
        qk_eigen_mean: s.qk_spectrum.map_or(f64::NAN, |q| q.mean_real),
        qk_eigen_var: s.qk_spectrum.map_or(f64::NAN, |q| q.var_real),
        qk_sym_var: s.qk_spectrum.map_or(f64::NAN, |q| q.sym_var),
        rank_collapse: s.rank_collapse.unwrap_or(f64::NAN),
        deviations: s.deviations.join(" | "),
    }))
}

/// Finished runs under `<dir>/runs/*` of every result folder, each run once (the first folder
/// that holds it wins), sorted by run name; also the run folders, for per-epoch metrics.
pub fn collect(result_dirs: &[PathBuf]) -> Result<Vec<(ResultRow, PathBuf)>> {
    let mut found: BTreeMap<String, (ResultRow, PathBuf)> = BTreeMap::new();
    for dir in result_dirs {
        let runs = dir.join(RUNS);
        if !dir.is_dir() {
            anyhow::bail!("{}: no such result folder", dir.display());
        }
        let Ok(entries) = std::fs::read_dir(&runs) else {
            continue;
        };
        let mut run_dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        run_dirs.sort();
        for run_dir in run_dirs {
            if let Some(row) = read_run(&run_dir)? {
                found.entry(row.run.clone()).or_insert((row, run_dir));
            }
        }
    }
    Ok(found.into_values().collect())
}

pub fn read_csv(path: &Path) -> Result<Vec<ResultRow>> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("{}", path.display()))?;
    reader
        .deserialize()
        .enumerate()
        .map(|(k, row)| row.with_context(|| format!("{}: row {}", path.display(), k + 1)))
        .collect()
}

/// Mean and population standard deviation (ddof 0) of the finite values; NaN if there are none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stat {
    pub mean: f64,
    pub std: f64,
}

impl Stat {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if values.is_empty() {
            return Self {
                mean: f64::NAN,
                std: f64::NAN,
            };
        }
        let len = values.len() as f64;
        let mean = values.iter().sum::<f64>() / len;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / len;
        Self {
            mean,
            std: var.sqrt(),
        }
    }
}

/// One cell of the table: the runs of one (dataset, backbone, mode, n, η) over seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    pub dataset: String,
    pub backbone: String,
    pub mode: String,
    pub n: usize,
    pub eta: f64,
    pub seeds: Vec<u64>,
    pub baseline_test_acc: Stat,
    pub train_loss: Stat,
    pub memorization: Stat,
    pub test_acc: Stat,
    pub test_loss: Stat,
    pub max_cls_attention: Stat,
    pub qk_eigen_mean: Stat,
    pub qk_eigen_var: Stat,
}

/// Groups rows into cells, ordered by dataset (first appearance), mode, η, then n.
pub fn aggregate(rows: &[ResultRow]) -> Vec<Cell> {
    let order: Vec<&str> = rows.iter().fold(Vec::new(), |mut seen, r| {
        if !seen.contains(&r.dataset.as_str()) {
            seen.push(r.dataset.as_str());
        }
        seen
    });
    type Key = (usize, String, String, u64, usize);
    let mut groups: BTreeMap<Key, Vec<&ResultRow>> = BTreeMap::new();
    for r in rows {
        let rank = order.iter().position(|d| *d == r.dataset).unwrap_or(0);
        // η as integer micro-units so that the key orders and compares exactly.
        let eta = (r.eta * 1e6).round() as u64;
        groups
            .entry((rank, r.mode.clone(), r.backbone.clone(), eta, r.n))
            .or_default()
            .push(r);
    }
    groups
        .into_values()
        .map(|runs| {
            let stat = |f: fn(&ResultRow) -> f64| Stat::of(runs.iter().map(|r| f(r)));
            let seeds: BTreeSet<u64> = runs.iter().map(|r| r.seed).collect();
            Cell {
                dataset: runs[0].dataset.clone(),
                backbone: runs[0].backbone.clone(),
                mode: runs[0].mode.clone(),
                n: runs[0].n,
                eta: runs[0].eta,
                seeds: seeds.into_iter().collect(),
                baseline_test_acc: stat(|r| r.baseline_test_acc),
                train_loss: stat(|r| r.train_loss),
                memorization: stat(|r| r.memorization),
                test_acc: stat(|r| r.test_acc),
                test_loss: stat(|r| r.test_loss),
                max_cls_attention: stat(|r| r.max_cls_attention),
                qk_eigen_mean: stat(|r| r.qk_eigen_mean),
                qk_eigen_var: stat(|r| r.qk_eigen_var),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made results.csv: two cells of three and two seeds, one with a NaN memorization
    /// (η = 0), rows out of order; means and population stds computed by hand.
    #[test]
    fn aggregation_groups_and_uses_population_std() {
        let header = "run,dataset,backbone,mode,noise,eta,realised_eta,n,seed,pretrain_n,test_n,epochs,pretrain_epochs,baseline_test_acc,train_loss,train_acc,memorization,clean_train_acc,test_acc,test_loss,max_cls_attention,attention_entropy,deviations";
        let rows = [
            "a2,trec,m,last-layer,symmetric,0.2,0.2,20,314,100,50,10,2,0.80,0.30,0.9,0.5,0.9,0.70,1.0,0.2,3.0,",
            "b1,trec,m,last-layer,symmetric,0.0,0.0,20,42,100,50,10,2,0.80,0.10,1.0,NaN,1.0,0.90,0.5,0.3,2.0,x | y",
            "a1,trec,m,last-layer,symmetric,0.2,0.2,20,42,100,50,10,2,0.82,0.10,0.9,0.25,0.9,0.60,1.0,0.1,3.0,",
            "a3,trec,m,last-layer,symmetric,0.2,0.2,20,2718,100,50,10,2,0.84,0.20,0.9,1.0,0.9,0.80,1.0,0.3,3.0,",
            "b2,trec,m,last-layer,symmetric,0.0,0.0,20,314,100,50,10,2,0.80,0.30,1.0,NaN,1.0,0.70,0.5,0.3,2.0,",
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        std::fs::write(&path, format!("{header}\n{}\n", rows.join("\n"))).unwrap();
        let parsed = read_csv(&path).unwrap();
        assert_eq!(parsed.len(), 5);
        assert_eq!(parsed[1].deviations, "x | y");

        let cells = aggregate(&parsed);
        assert_eq!(cells.len(), 2);
        // η = 0 sorts first.
        let (clean, noisy) = (&cells[0], &cells[1]);
        assert_eq!((clean.eta, noisy.eta), (0.0, 0.2));
        assert_eq!(noisy.seeds, vec![42, 314, 2718]);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // test acc 0.6, 0.7, 0.8: mean 0.7, population std sqrt(2/3)·0.1 (not the sample 0.1).
        assert!(close(noisy.test_acc.mean, 0.7));
        assert!(close(noisy.test_acc.std, (2.0f64 / 3.0).sqrt() * 0.1));
        assert!(close(noisy.train_loss.mean, 0.2));
        assert!(close(noisy.memorization.mean, (0.25 + 0.5 + 1.0) / 3.0));
        assert!(close(noisy.baseline_test_acc.mean, 0.82));
        // Two seeds: 0.9 and 0.7 → 0.8 ± 0.1.
        assert!(close(clean.test_acc.mean, 0.8) && close(clean.test_acc.std, 0.1));
        assert!(clean.memorization.mean.is_nan());
        assert_eq!(clean.seeds, vec![42, 314]);
    }
}
