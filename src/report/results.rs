//! results.csv (one row per finished `finetune` run) and its aggregation into the paper's cells:
//! mean and population standard deviation (numpy's default `np.std`, as the authors printed) over
//! the seeds of each (dataset, backbone, mode, n, η).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::train::finetune::FinetuneSummary;

use crate::train::run::RunFolder;

/// A finished run: its folder's name and its summary.json.
#[derive(Clone, Debug)]
pub struct ResultRow {
    /// The run's folder name (unique per configuration).
    pub run: String,
    pub summary: FinetuneSummary,
}

impl std::ops::Deref for ResultRow {
    type Target = FinetuneSummary;

    fn deref(&self) -> &FinetuneSummary {
        &self.summary
    }
}

impl ResultRow {
    pub fn dataset(&self) -> String {
        self.config.dataset.to_string()
    }

    pub fn mode(&self) -> String {
        self.config.mode_label()
    }

    /// The quantities the table aggregates, by name.
    pub fn memorization(&self) -> f64 {
        self.last.memorization
    }

    pub fn train_loss(&self) -> f64 {
        self.last.train_loss
    }

    fn spectrum(&self, f: fn(&crate::diagnostics::Spectrum) -> f64) -> f64 {
        self.last.qk_spectrum.as_ref().map_or(f64::NAN, f)
    }

    /// The run as results.csv's columns: `run`, then every leaf of summary.json by its dotted
    /// path (`config.eta`, `final.test_acc`, …); lists are joined by " | ". The wall time is left
    /// out: the table holds what a rerun reproduces.
    fn columns(&self) -> Result<Vec<(String, String)>> {
        let mut columns = vec![("run".to_string(), self.run.clone())];
        for (path, value) in crate::io::flatten_json(&serde_json::to_value(&self.summary)?) {
            if path == "wall_seconds" {
                continue;
            }
            let text = match value {
                serde_json::Value::Null => "NaN".to_string(),
                serde_json::Value::String(s) => s,
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect::<Vec<_>>()
                    .join(" | "),
                other => other.to_string(),
            };
            columns.push((path, text));
        }
        Ok(columns)
    }
}

pub use crate::train::run::RUNS;

/// The row of the finished run in `dir` (None when it has not finished).
pub fn read_run(dir: &Path) -> Result<Option<ResultRow>> {
    let path = RunFolder(dir.to_path_buf()).summary();
    if !crate::io::is_present(&path) {
        return Ok(None);
    }
    let text = crate::io::read_input_text(&path, crate::io::limits::SMALL_TEXT)?;
    let mut summary: FinetuneSummary = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a finetune summary", path.display()))?;
    // An estimate made by the rule that chose tokens by their label's score reads signal in pure
    // noise: it counts as absent (`reproduce snr` makes it again).
    if summary.snr.as_ref().is_some_and(|s| !s.is_current()) {
        summary.snr = None;
    }
    if let Some(why) = summary.snr.as_ref().and_then(|s| s.contradiction()) {
        anyhow::bail!(
            "{}: snr is not an estimate the rule makes ({why}); run `reproduce snr` on the \
             folder after removing it",
            path.display()
        );
    }
    let config = &summary.config;
    if config.authors_noise_draw != config.noise_draw() {
        anyhow::bail!(
            "{}: made with --rng authors and η {} before the authors' float32 noise draw, so its \
             flipped labels are not theirs; delete the folder or run it again",
            dir.display(),
            config.eta
        );
    }
    Ok(Some(ResultRow {
        run: dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
        summary,
    }))
}

/// results.csv: one row per run, the columns of [`ResultRow::columns`] (the union over the runs,
/// in first-seen order; a run without a column leaves it empty).
pub fn write_csv(path: &Path, rows: &[ResultRow]) -> Result<()> {
    let rows: Vec<Vec<(String, String)>> =
        rows.iter().map(ResultRow::columns).collect::<Result<_>>()?;
    let mut header: Vec<&str> = Vec::new();
    for row in &rows {
        for (name, _) in row {
            if !header.contains(&name.as_str()) {
                header.push(name);
            }
        }
    }
    crate::io::write_atomic(path, |w| {
        let mut writer = csv::Writer::from_writer(w);
        writer.write_record(&header)?;
        for row in &rows {
            let cells: HashMap<&str, &str> =
                row.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            writer.write_record(header.iter().map(|h| cells.get(h).copied().unwrap_or("")))?;
        }
        writer.flush()?;
        Ok(())
    })
}

/// Finished runs under `<dir>/runs/*` of every result folder, each run once (the first folder
/// that holds it wins), sorted by run name; also the run folders, for per-epoch metrics.
/// Two finished folders of one run (two shards that both ran it) must hold the same results; which
/// one a report kept would otherwise depend on the order of the folders. The wall time may differ.
fn same_results(a: &ResultRow, a_dir: &Path, b: &ResultRow, b_dir: &Path) -> Result<()> {
    let numbers = |row: &ResultRow| -> Result<serde_json::Value> {
        let mut value = serde_json::to_value(&row.summary)?;
        if let Some(object) = value.as_object_mut() {
            object.remove("wall_seconds");
        }
        Ok(value)
    };
    if numbers(a)? != numbers(b)? {
        anyhow::bail!(
            "{}: {} and {} hold different results for this run (test accuracy {} and {}); \
             keep one of the two folders",
            a.run,
            a_dir.display(),
            b_dir.display(),
            a.test_acc(),
            b.test_acc()
        );
    }
    Ok(())
}

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
                match found.get(&row.run) {
                    Some((kept, kept_dir)) => same_results(kept, kept_dir, &row, &run_dir)?,
                    None => {
                        found.insert(row.run.clone(), (row, run_dir));
                    }
                }
            }
        }
    }
    Ok(found.into_values().collect())
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
    /// The fine-tune set's n·SNR² (runs that record it).
    pub n_snr2: Stat,
    pub baseline_test_acc: Stat,
    pub train_loss: Stat,
    /// Cross-entropy on the noisy fine-tune set evaluated after training (Fig. 8's train loss).
    pub train_eval_loss: Stat,
    pub memorization: Stat,
    pub test_acc: Stat,
    /// Test accuracy right after the query/key reset.
    pub reset_test_acc: Stat,
    pub test_loss: Stat,
    pub max_cls_attention: Stat,
    pub qk_eigen_mean: Stat,
    pub qk_eigen_var: Stat,
}

/// Groups rows into cells, ordered by dataset (first appearance), mode, η, then n.
pub fn aggregate(rows: &[ResultRow]) -> Vec<Cell> {
    let order: Vec<String> = rows.iter().fold(Vec::new(), |mut seen, r| {
        if !seen.contains(&r.dataset()) {
            seen.push(r.dataset());
        }
        seen
    });
    type Key = (usize, String, String, u64, usize);
    let mut groups: BTreeMap<Key, Vec<&ResultRow>> = BTreeMap::new();
    for r in rows {
        let rank = order.iter().position(|d| *d == r.dataset()).unwrap_or(0);
        // η as integer micro-units so that the key orders and compares exactly.
        let eta = (r.config.eta * 1e6).round() as u64;
        groups
            .entry((rank, r.mode(), r.resolved.backbone.clone(), eta, r.config.n))
            .or_default()
            .push(r);
    }
    groups
        .into_values()
        .map(|runs| {
            let stat = |f: fn(&ResultRow) -> f64| Stat::of(runs.iter().map(|r| f(r)));
            let seeds: BTreeSet<u64> = runs.iter().map(|r| r.config.seed).collect();
            Cell {
                dataset: runs[0].dataset(),
                backbone: runs[0].resolved.backbone.clone(),
                mode: runs[0].mode(),
                n: runs[0].config.n,
                eta: runs[0].config.eta,
                seeds: seeds.into_iter().collect(),
                n_snr2: stat(|r| r.snr.as_ref().map_or(f64::NAN, |s| s.n_snr2)),
                baseline_test_acc: stat(|r| r.baseline_test_acc),
                train_loss: stat(|r| r.train_loss()),
                train_eval_loss: stat(|r| r.last.train_eval_loss),
                memorization: stat(|r| r.memorization()),
                test_acc: stat(|r| r.test_acc()),
                reset_test_acc: stat(|r| r.reset_test_acc.unwrap_or(f64::NAN)),
                test_loss: stat(|r| r.test_loss()),
                max_cls_attention: stat(|r| r.last.max_cls_attention),
                qk_eigen_mean: stat(|r| r.spectrum(|q| q.mean_real)),
                qk_eigen_var: stat(|r| r.spectrum(|q| q.var_real)),
            }
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use crate::train::finetune::Resolved;

    use crate::train::metrics::EpochMetrics;
    use crate::train::run::RunConfig;

    /// A finished TREC run at n = 20 (other reports' tests change what they need).
    pub(crate) fn row(
        run: &str,
        eta: f64,
        seed: u64,
        baseline: f64,
        loss: f64,
        memo: f64,
        test: f64,
    ) -> ResultRow {
        let config = RunConfig {
            eta,
            seed,
            n: 20,
            ..RunConfig::paper(&crate::data::DatasetName::Trec).unwrap()
        };
        let summary = FinetuneSummary {
            config,
            resolved: Resolved {
                backbone: "m".into(),
                backbone_sha256: "00".into(),
                backbone_source: "test".into(),
                pretrain_n: 100,
                test_n: 50,
                realised_eta: eta,
                dataset_completeness: crate::data::catalog::Completeness {
                    dataset: "trec".into(),
                    splits: vec![],
                    complete: true,
                },
                class_names: Vec::new(),
                float_kernels: "x86_64 avx2+fma".into(),
                placement: None,
            },
            baseline_test_acc: baseline,
            reset_test_acc: None,
            snr: None,
            last: EpochMetrics {
                epoch: 10,
                train_loss: loss,
                train_eval_loss: loss,
                train_acc: 1.0,
                memorization: memo,
                clean_train_acc: 1.0,
                max_cls_attention: 0.2,
                attention_entropy: 3.0,
                test_loss: Some(1.0),
                test_acc: Some(test),
                qk_spectrum: None,
                rank_collapse: None,
            },
            deviations: if run == "b1" {
                vec!["x".into(), "y".into()]
            } else {
                vec![]
            },
            wall_seconds: 1.0,
        };
        ResultRow {
            run: run.into(),
            summary,
        }
    }

    /// One run in two shards: equal results (another wall time) merge into one row; different
    /// results are an error naming both folders, whatever their order.
    #[test]
    fn a_run_in_two_shards_merges_only_with_equal_results() {
        let write = |root: &Path, row: &ResultRow| {
            let dir = root.join(RUNS).join(&row.run);
            std::fs::create_dir_all(&dir).unwrap();
            crate::io::write_json(&RunFolder(dir).summary(), &row.summary).unwrap();
        };
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let run = row("r", 0.2, 42, 0.8, 0.1, 1.0, 0.7);
        let mut slower = run.clone();
        slower.summary.wall_seconds = 9.0;
        write(a.path(), &run);
        write(b.path(), &slower);
        let both = [a.path().to_path_buf(), b.path().to_path_buf()];
        assert_eq!(collect(&both).unwrap().len(), 1);
        write(c.path(), &row("r", 0.2, 42, 0.8, 0.1, 1.0, 0.6));
        for dirs in [
            [a.path().to_path_buf(), c.path().to_path_buf()],
            [c.path().to_path_buf(), a.path().to_path_buf()],
        ] {
            let err = collect(&dirs).unwrap_err().to_string();
            assert!(
                err.starts_with("r: ")
                    && err.contains("different results")
                    && err.lines().count() == 1,
                "{err}"
            );
        }
    }

    /// Two cells of three and two seeds, one with a NaN memorization (η = 0), rows out of order;
    /// means and population stds computed by hand.
    #[test]
    fn aggregation_groups_and_uses_population_std() {
        let rows = [
            row("a2", 0.2, 314, 0.80, 0.30, 0.5, 0.70),
            row("b1", 0.0, 42, 0.80, 0.10, f64::NAN, 0.90),
            row("a1", 0.2, 42, 0.82, 0.10, 0.25, 0.60),
            row("a3", 0.2, 2718, 0.84, 0.20, 1.0, 0.80),
            row("b2", 0.0, 314, 0.80, 0.30, f64::NAN, 0.70),
        ];
        let cells = aggregate(&rows);
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

    /// results.csv has a column per leaf of summary.json: a field added to the configuration is
    /// a column without further code.
    #[test]
    fn csv_columns_come_from_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        write_csv(&path, &[row("b1", 0.0, 42, 0.8, 0.1, f64::NAN, 0.9)]).unwrap();
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        let record = reader.records().next().unwrap().unwrap();
        let cell = |name: &str| record[header.iter().position(|h| h == name).unwrap()].to_string();
        assert_eq!(cell("run"), "b1");
        assert_eq!(cell("config.dataset"), "trec");
        assert_eq!(cell("config.special_tokens"), "false");
        assert_eq!(cell("final.test_acc"), "0.9");
        assert_eq!(cell("final.memorization"), "NaN");
        assert_eq!(cell("deviations"), "x | y");
    }
}
