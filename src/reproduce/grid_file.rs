//! A grid's settings from a file (`reproduce table2|fig8|fig9|slurm --config FILE`): a TOML table
//! whose keys are the grid's flags (`datasets`, `seeds`, `ns`, `etas`, `token_noises`, `budget`,
//! `mode`, `head_classifier`, `rng`, `out`, `jobs`, `stack_memory`), spelled as the flags' values
//! are. A
//! flag given beside the file overrides its key. A key the program does not know, or a value of
//! the wrong kind, is refused in one line naming the key and the file, before any work.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use toml::Value;

use super::driver::Budget;
use crate::data::DatasetName;
use crate::rng::RngChoice;
use crate::train::run::{HeadClassifier, Mode};

/// The keys a grid file may hold.
pub const KEYS: [&str; 12] = [
    "datasets",
    "seeds",
    "ns",
    "etas",
    "token_noises",
    "budget",
    "mode",
    "head_classifier",
    "rng",
    "out",
    "jobs",
    "stack_memory",
];

/// What a grid file sets; `None` where it is silent.
#[derive(Debug, Default, PartialEq)]
pub struct GridFile {
    pub datasets: Option<Vec<DatasetName>>,
    pub seeds: Option<Vec<u64>>,
    pub ns: Option<Vec<usize>>,
    pub etas: Option<Vec<f64>>,
    /// The SNR doses (`--token-noises`).
    pub token_noises: Option<Vec<f64>>,
    pub budget: Option<Budget>,
    pub mode: Option<Mode>,
    pub head_classifier: Option<HeadClassifier>,
    pub rng: Option<RngChoice>,
    pub out: Option<PathBuf>,
    pub jobs: Option<usize>,
    pub stack_memory: Option<f64>,
}

impl GridFile {
    /// Reads the TOML file `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let text = crate::io::read_input_text(path, crate::io::limits::SMALL_TEXT)
            .with_context(|| format!("--config {shown}"))?;
        Self::parse(&text, &shown)
    }

    /// The settings of `text`, a file shown as `shown` in errors.
    pub fn parse(text: &str, shown: &str) -> Result<Self> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map_or(0, |span| text[..span.start].matches('\n').count() + 1);
            anyhow!("{shown}: not valid TOML (line {line}: {})", e.message())
        })?;
        let mut file = Self::default();
        for (key, value) in &table {
            let wrong = |expected: &str| anyhow!("{shown}: key `{key}`: expected {expected}");
            match key.as_str() {
                "datasets" => {
                    file.datasets =
                        Some(list(value, |v| v.as_str()?.parse().ok()).ok_or_else(|| {
                            wrong("a list of dataset names, such as [\"trec\", \"mnist\"]")
                        })?)
                }
                "seeds" => {
                    file.seeds = Some(
                        list(value, |v| u64::try_from(v.as_integer()?).ok())
                            .ok_or_else(|| wrong("a list of seeds (whole numbers ≥ 0)"))?,
                    )
                }
                "ns" => {
                    file.ns = Some(
                        list(value, |v| usize::try_from(v.as_integer()?).ok())
                            .ok_or_else(|| wrong("a list of sizes (whole numbers ≥ 0)"))?,
                    )
                }
                "etas" => {
                    file.etas = Some(list(value, number).ok_or_else(|| wrong("a list of rates"))?)
                }
                "token_noises" => {
                    file.token_noises = Some(
                        list(value, number)
                            .ok_or_else(|| wrong("a list of doses k (numbers ≥ 0)"))?,
                    )
                }
                "budget" => {
                    file.budget = Some(choice(value).ok_or_else(|| wrong("paper or quick"))?)
                }
                "mode" => {
                    file.mode = Some(choice(value).ok_or_else(|| wrong("last-layer or head"))?)
                }
                "head_classifier" => {
                    file.head_classifier =
                        Some(choice(value).ok_or_else(|| wrong("mean, cls or tokens"))?)
                }
                "rng" => file.rng = Some(choice(value).ok_or_else(|| wrong("own or authors"))?),
                "out" => {
                    file.out = Some(PathBuf::from(
                        value.as_str().ok_or_else(|| wrong("a folder (a string)"))?,
                    ))
                }
                "jobs" => {
                    file.jobs = Some(
                        value
                            .as_integer()
                            .and_then(|j| usize::try_from(j).ok())
                            .ok_or_else(|| wrong("a whole number"))?,
                    )
                }
                "stack_memory" => {
                    file.stack_memory = Some(number(value).ok_or_else(|| wrong("a number of GiB"))?)
                }
                _ => bail!("{shown}: unknown key `{key}` (known: {})", KEYS.join(", ")),
            }
        }
        Ok(file)
    }
}

/// Every item of the list `value` through `item`; none if `value` is not a list or an item
/// does not convert.
fn list<T>(value: &Value, item: impl Fn(&Value) -> Option<T>) -> Option<Vec<T>> {
    value.as_array()?.iter().map(item).collect()
}

/// A number, whole or not.
fn number(value: &Value) -> Option<f64> {
    value
        .as_float()
        .or_else(|| value.as_integer().map(|i| i as f64))
}

/// One of a flag's values, spelled as on the command line.
fn choice<T: clap::ValueEnum>(value: &Value) -> Option<T> {
    T::from_str(value.as_str()?, false).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_file_reads_as_its_flags_would() {
        let file = GridFile::parse(
            "datasets = [\"trec\", \"breastmnist\"]\nseeds = [42, 314]\nns = [20]\n\
             etas = [0, 0.2]\ntoken_noises = [0, 3]\nbudget = \"quick\"\nmode = \"head\"\nhead_classifier = \"mean\"\n\
             rng = \"authors\"\nout = \"results/mine\"\njobs = 2\nstack_memory = 4\n",
            "grid.toml",
        )
        .unwrap();
        assert_eq!(
            file,
            GridFile {
                datasets: Some(vec![DatasetName::Trec, DatasetName::BreastMnist]),
                seeds: Some(vec![42, 314]),
                ns: Some(vec![20]),
                etas: Some(vec![0.0, 0.2]),
                token_noises: Some(vec![0.0, 3.0]),
                budget: Some(Budget::Quick),
                mode: Some(Mode::Head),
                head_classifier: Some(HeadClassifier::Mean),
                rng: Some(RngChoice::Authors),
                out: Some(PathBuf::from("results/mine")),
                jobs: Some(2),
                stack_memory: Some(4.0),
            }
        );
    }

    #[test]
    fn unknown_keys_wrong_kinds_and_bad_toml_are_one_line_naming_file_and_key() {
        let error = |text: &str| format!("{:#}", GridFile::parse(text, "grid.toml").unwrap_err());
        let unknown = error("seed = [42]\n");
        assert!(
            unknown.starts_with("grid.toml: unknown key `seed` (known: datasets, seeds"),
            "{unknown}"
        );
        let wrong = error("seeds = 42\n");
        assert!(
            wrong.starts_with("grid.toml: key `seeds`: expected a list"),
            "{wrong}"
        );
        let negative = error("ns = [-20]\n");
        assert!(
            negative.starts_with("grid.toml: key `ns`: expected"),
            "{negative}"
        );
        let budget = error("budget = \"huge\"\n");
        assert_eq!(budget, "grid.toml: key `budget`: expected paper or quick");
        let dataset = error("datasets = [\"imagenet\"]\n");
        assert!(
            dataset.starts_with("grid.toml: key `datasets`"),
            "{dataset}"
        );
        let broken = error("seeds = [42\n");
        assert!(
            broken.starts_with("grid.toml: not valid TOML (line "),
            "{broken}"
        );
        for message in [unknown, wrong, negative, budget, dataset, broken] {
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
