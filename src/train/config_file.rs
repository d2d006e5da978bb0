//! A run's settings from a file (`finetune --config FILE`): TOML, or JSON such as a run folder's
//! own config.json, holding any of [`RunConfig`]'s keys. The file is read into the same
//! [`RunOverrides`] the flags make; it overlays the dataset's paper defaults
//! ([`RunConfig::paper`]) and flags overlay the file, so a run folder's config.json given back
//! replays that run exactly.
//!
//! The keys a file may hold are those a run records: the file is checked against a serialised
//! [`RunConfig`], so a key the program does not know, or a value of the wrong kind, is refused
//! naming the key and the file before any work.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use super::overrides::RunOverrides;
use super::run::{HeadClassifier, RunConfig};
use crate::data::DatasetName;

/// The settings a file holds, as read: every key checked to be one a run records.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    path: String,
    values: Map<String, Value>,
}

impl ConfigFile {
    /// Reads `path` (`.json` as JSON, anything else as TOML).
    pub fn read(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let text = crate::io::read_input_text(path, crate::io::limits::SMALL_TEXT)
            .with_context(|| format!("--config {shown}"))?;
        let value: Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).with_context(|| format!("{shown}: not valid JSON"))?
        } else {
            let table: toml::Table =
                toml::from_str(&text).with_context(|| format!("{shown}: not valid TOML"))?;
            // JSON has no nan or inf: said here, not later as "got null".
            if let Some(key) = non_finite_key(&table, "") {
                bail!(
                    "{shown}: key `{}`: nan and inf are not values a run takes",
                    key_path(&key)
                );
            }
            serde_json::to_value(table)?
        };
        let Value::Object(values) = value else {
            bail!("{shown}: expected a table of settings");
        };
        let file = Self {
            path: shown,
            values,
        };
        file.check_keys(&file.values, &known_keys()?, "")?;
        Ok(file)
    }

    /// The file's dataset, if it names one.
    pub fn dataset(&self) -> Result<Option<DatasetName>> {
        self.values
            .get("dataset")
            .map(|v| {
                let name = v.as_str().with_context(|| {
                    format!("{}: key `dataset`: expected a dataset name", self.path)
                })?;
                name.parse()
                    .map_err(|e| anyhow::anyhow!("{}: key `dataset`: {e}", self.path))
            })
            .transpose()
    }

    /// Whether the file sets `key` (a top-level key).
    pub fn sets(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The file's values as one [`RunOverrides`] for a run of `dataset` (the file's dataset
    /// excepted: the caller chose it, from a flag or from [`Self::dataset`]). A null (a
    /// config.json's unset `test_n`) leaves the value as the run has it, which for the paper run
    /// a file overlays is unset too; the authors' noise draw is not read, since a run's stream and
    /// η decide it ([`RunConfig::with_noise_draw`]).
    pub fn overrides(&self, dataset: &DatasetName) -> Result<RunOverrides> {
        let mut values = self.values.clone();
        // The digest a file records is its own dataset's: given another dataset (--dataset over
        // a replayed config.json), the run's digest of the files now named stands instead.
        let same_dataset = values
            .get("dataset")
            .and_then(Value::as_str)
            .is_none_or(|d| d.parse::<DatasetName>().is_ok_and(|d| &d == dataset));
        if !same_dataset {
            values.remove("data_digest");
        }
        values.remove("dataset");
        // A recorded draw must be one this build makes (an older run's is refused, not replayed
        // with another); the run then takes the one its stream and η call for.
        if let Some(draw) = values.remove("authors_noise_draw") {
            serde_json::from_value::<crate::rng::AuthorsNoiseDraw>(draw).map_err(|e| {
                anyhow::anyhow!("{}: key `authors_noise_draw`: {e}", self.path)
            })?;
        }
        serde_path_to_error::deserialize(Value::Object(values)).map_err(|e| {
            anyhow::anyhow!(
                "{}: key `{}`: {}",
                self.path,
                key_path(&e.path().to_string()),
                e.inner()
            )
        })
    }

    /// `base` overlaid by the file ([`Self::overrides`], [`RunConfig::overlay`]), its head
    /// classifier the mode's.
    pub fn overlay(&self, base: &RunConfig) -> Result<RunConfig> {
        let config = base.overlay(&self.overrides(&base.dataset)?);
        Ok(RunConfig {
            head_classifier: HeadClassifier::for_mode(config.mode, config.head_classifier),
            ..config
        })
    }

    /// Each key of `values` must be one of `known`'s, and of the same kind (a number, a string,
    /// a list, a table; null where the run may leave it unset).
    fn check_keys(&self, values: &Map<String, Value>, known: &Value, prefix: &str) -> Result<()> {
        for (key, value) in values {
            let name = format!("{prefix}{key}");
            let Some(expected) = known.get(key) else {
                let keys: Vec<&String> = known
                    .as_object()
                    .map(|o| o.keys().collect())
                    .unwrap_or_default();
                bail!(
                    "{}: unknown key `{}` (known: {})",
                    self.path,
                    key_path(&crate::excerpt::line(&name, crate::excerpt::SHOWN)),
                    keys.iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            match (expected, value) {
                (Value::Object(_), Value::Object(inner)) => {
                    self.check_keys(inner, expected, &format!("{name}."))?
                }
                (_, Value::Null) if nullable(&name) => {}
                (expected, value) if kind(expected) != kind(value) => bail!(
                    "{}: key `{}`: expected {}, got {}",
                    self.path,
                    key_path(&name),
                    kind(expected),
                    kind(value)
                ),
                _ => {}
            }
        }
        Ok(())
    }
}

/// serde_path_to_error's path (`optimizer.learning_rate`) as the file's own spelling of it.
fn key_path(path: &str) -> String {
    match path.split_once('.') {
        Some((table, key)) if !table.is_empty() => format!("[{table}] {key}"),
        _ => path.to_string(),
    }
}

/// The first key of `table` (a dotted path) holding a nan or infinite float.
fn non_finite_key(table: &toml::Table, prefix: &str) -> Option<String> {
    fn in_value(value: &toml::Value, name: &str) -> Option<String> {
        match value {
            toml::Value::Float(f) if !f.is_finite() => Some(name.to_string()),
            toml::Value::Table(t) => non_finite_key(t, &format!("{name}.")),
            toml::Value::Array(items) => items.iter().find_map(|v| in_value(v, name)),
            _ => None,
        }
    }
    table
        .iter()
        .find_map(|(key, value)| in_value(value, &format!("{prefix}{key}")))
}

/// Keys a run may leave unset (null in its config.json).
fn nullable(key: &str) -> bool {
    matches!(key, "test_n" | "carve_train_from_test")
}

/// Every key a run records, with a value of its kind: a paper configuration with the keys that
/// are only written when set filled in.
fn known_keys() -> Result<Value> {
    let full = RunConfig {
        head_classifier: Some(HeadClassifier::Tokens),
        test_n: Some(1),
        carve_train_from_test: Some(0.5),
        authors_noise_draw: Some(crate::rng::AuthorsNoiseDraw::CURRENT),
        train_device: Some(crate::runtime::DeviceKind::Cpu),
        data_digest: Some(String::new()),
        token_noise: 1.0,
        precision: crate::kernels::Precision::Bf16,
        ..RunConfig::paper(&DatasetName::BreastMnist)?
    };
    Ok(serde_json::to_value(full)?)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// A TOML file overlays the paper's values key by key, tables too; a run's own config.json
    /// read back is that run's configuration.
    #[test]
    fn a_file_overlays_the_paper_and_a_run_reads_back_as_itself() {
        let (_dir, path) = written(
            "lab.toml",
            "dataset = \"trec\"\nn = 30\nseed = 7\n[optimizer]\nlearning_rate = 1e-4\n",
        );
        let file = ConfigFile::read(&path).unwrap();
        let dataset = file.dataset().unwrap().unwrap();
        assert_eq!(dataset, DatasetName::Trec);
        let paper = RunConfig::paper(&dataset).unwrap();
        let config = file.overlay(&paper).unwrap();
        assert_eq!((config.n, config.seed), (30, 7));
        assert_eq!(config.optimizer.learning_rate, 1e-4);
        assert_eq!(config.optimizer.beta2, paper.optimizer.beta2);
        assert_eq!(config.epochs, paper.epochs);

        let run = RunConfig {
            eta: 0.2,
            test_n: Some(60),
            ..config
        };
        let (_dir, json) = written("config.json", &serde_json::to_string_pretty(&run).unwrap());
        let back = ConfigFile::read(&json).unwrap().overlay(&paper).unwrap();
        assert_eq!(back, run);
    }

    /// A run folder's config.json replayed with `--dataset` naming other files takes the digest
    /// of those files, not the recorded one (which would refuse the run as "files changed");
    /// replayed as it is, it keeps its own.
    #[test]
    fn a_replayed_config_with_another_dataset_takes_that_datasets_digest() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
        std::fs::write(&a, "text,label\nx,0\ny,1\n").unwrap();
        std::fs::write(&b, "text,label\nx,0\nz,1\n").unwrap();
        let name = |p: &Path| -> DatasetName { format!("csv:{}", p.display()).parse().unwrap() };
        let run_a = RunConfig::paper(&name(&a)).unwrap();
        let json = dir.path().join("config.json");
        std::fs::write(&json, serde_json::to_string_pretty(&run_a).unwrap()).unwrap();
        let file = ConfigFile::read(&json).unwrap();
        let on_b = RunConfig::paper(&name(&b)).unwrap();
        assert_ne!(run_a.data_digest, on_b.data_digest);
        assert_eq!(file.overlay(&on_b).unwrap().data_digest, on_b.data_digest);
        assert_eq!(file.overlay(&run_a).unwrap().data_digest, run_a.data_digest);
    }

    /// An unknown key (also inside a table), a value of the wrong kind and a missing file are
    /// each refused naming the file and the key.
    #[test]
    fn unknown_keys_wrong_kinds_and_missing_files_are_refused() {
        let cases = [
            ("epoch = 3\n", "unknown key `epoch`"),
            ("[optimizer]\nlr = 0.1\n", "unknown key `[optimizer] lr`"),
            ("n = \"many\"\n", "key `n`: expected a number, got a string"),
            ("mode = \"tail\"\n", "unknown variant `tail`"),
            ("epochs = -5\n", "key `epochs`"),
            ("[optimizer]\nbeta1 = \"x\"\n", "key `[optimizer] beta1`"),
        ];
        for (text, expected) in cases {
            let (_dir, path) = written("bad.toml", text);
            let err = ConfigFile::read(&path)
                .and_then(|f| f.overlay(&RunConfig::paper(&DatasetName::Trec)?))
                .unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("bad.toml") && err.contains(expected),
                "{text}: {err}"
            );
        }
        let err = ConfigFile::read(Path::new("/nonexistent/lab.toml")).unwrap_err();
        assert!(format!("{err:#}").contains("--config /nonexistent/lab.toml"));
    }
}
