//! A dataset's name as the user writes it (`cifar10`, `dermamnist_224`, `csv:reviews.csv`) and
//! what the name alone tells: its id, its modality, whether the user's files give it, and which
//! run defaults it takes (configs/).

use std::fmt;
use std::str::FromStr;

use super::files::DataError;
use super::own::{OwnKind, OwnSource};
use super::samples::Modality;

/// One released dataset: what its name decides, in one row. A dataset added here is known to
/// the CLI, the manifests, the run defaults and every grid; its files are read by its loader
/// (`catalog::load`).
pub struct Released {
    pub name: DatasetName,
    /// What config.json, folder names and the data root call it.
    pub id: &'static str,
    /// Other spellings the CLI takes.
    pub aliases: &'static [&'static str],
    pub modality: Modality,
    /// In the paper's Table 2 (the others are in the authors' code and their Table 6).
    pub in_table2: bool,
    /// datasets/<id>.toml: the official release's files and checksums.
    pub manifest: &'static str,
    /// configs/<id>.toml: the paper's run defaults (docs/protocol.md §3), compiled in so the
    /// binary carries them.
    pub defaults: &'static str,
}

/// Every released dataset: Table 2's six in the paper's order, then STL-10 and SST-2.
pub const RELEASED: [Released; 8] = [
    Released {
        name: DatasetName::Mnist,
        id: "mnist",
        aliases: &[],
        modality: Modality::Image,
        in_table2: true,
        manifest: include_str!("../../datasets/mnist.toml"),
        defaults: include_str!("../../configs/mnist.toml"),
    },
    Released {
        name: DatasetName::Cifar10,
        id: "cifar10",
        aliases: &["cifar-10"],
        modality: Modality::Image,
        in_table2: true,
        manifest: include_str!("../../datasets/cifar10.toml"),
        defaults: include_str!("../../configs/cifar10.toml"),
    },
    Released {
        name: DatasetName::PneumoniaMnist,
        id: "pneumoniamnist",
        aliases: &[],
        modality: Modality::Image,
        in_table2: true,
        manifest: include_str!("../../datasets/pneumoniamnist.toml"),
        defaults: include_str!("../../configs/pneumoniamnist.toml"),
    },
    Released {
        name: DatasetName::BreastMnist,
        id: "breastmnist",
        aliases: &[],
        modality: Modality::Image,
        in_table2: true,
        manifest: include_str!("../../datasets/breastmnist.toml"),
        defaults: include_str!("../../configs/breastmnist.toml"),
    },
    Released {
        name: DatasetName::AgNews,
        id: "ag_news",
        aliases: &["ag-news", "agnews"],
        modality: Modality::Text,
        in_table2: true,
        manifest: include_str!("../../datasets/ag_news.toml"),
        defaults: include_str!("../../configs/ag_news.toml"),
    },
    Released {
        name: DatasetName::Trec,
        id: "trec",
        aliases: &[],
        modality: Modality::Text,
        in_table2: true,
        manifest: include_str!("../../datasets/trec.toml"),
        defaults: include_str!("../../configs/trec.toml"),
    },
    Released {
        name: DatasetName::Stl10,
        id: "stl10",
        aliases: &["stl-10"],
        modality: Modality::Image,
        in_table2: false,
        manifest: include_str!("../../datasets/stl10.toml"),
        defaults: include_str!("../../configs/stl10.toml"),
    },
    Released {
        name: DatasetName::Sst2,
        id: "sst2",
        aliases: &["sst-2"],
        modality: Modality::Text,
        in_table2: false,
        manifest: include_str!("../../datasets/sst2.toml"),
        defaults: include_str!("../../configs/sst2.toml"),
    },
];

/// The MedMNIST family's tasks besides the paper's two (configs/medmnist.toml).
const MEDMNIST_FAMILY: &str = include_str!("../../configs/medmnist.toml");

/// Defaults for the datasets a user brings, by modality (configs/own_*.toml).
const OWN_IMAGES: &str = include_str!("../../configs/own_images.toml");
const OWN_TEXTS: &str = include_str!("../../configs/own_texts.toml");

/// A dataset's run defaults: the configs/ file (its stem and its TOML text, which `train`
/// reads), and for a MedMNIST task its training images, which cap phase 1.
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    pub file: &'static str,
    pub toml: &'static str,
    pub train_images: Option<usize>,
}

impl Defaults {
    fn of(file: &'static str, toml: &'static str) -> Self {
        Self {
            file,
            toml,
            train_images: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DatasetName {
    Mnist,
    Cifar10,
    PneumoniaMnist,
    BreastMnist,
    AgNews,
    Trec,
    /// In the authors' code and their Table 6, not in the paper's Table 2.
    Stl10,
    /// In the authors' code and their Table 6, not in the paper's Table 2.
    Sst2,
    /// Any other 2D MedMNIST task or size, by its release file's name (`dermamnist` →
    /// medmnist/dermamnist.npz, `dermamnist_224` → medmnist/dermamnist_224.npz), checked against
    /// the family's catalog ([`super::medmnist_family`]).
    OtherMedMnist(String),
    /// A dataset the user brings: `folder:PATH`, `csv:PATH` or `jsonl:PATH` ([`super::own`]).
    Own(OwnSource),
}

impl DatasetName {
    /// The six datasets of the paper's Table 2.
    pub fn paper() -> Vec<DatasetName> {
        RELEASED
            .iter()
            .filter(|r| r.in_table2)
            .map(|r| r.name.clone())
            .collect()
    }

    /// Every dataset the authors' code fine-tunes on: Table 2's six, then STL-10 and SST-2.
    pub fn all() -> Vec<DatasetName> {
        RELEASED.iter().map(|r| r.name.clone()).collect()
    }

    /// The row of a released dataset; `None` for another MedMNIST task or the user's files.
    pub fn released(&self) -> Option<&'static Released> {
        RELEASED.iter().find(|r| r.name == *self)
    }

    pub fn id(&self) -> &str {
        match self {
            DatasetName::OtherMedMnist(task) => task,
            DatasetName::Own(source) => source.id(),
            released => released.released().map_or("", |r| r.id),
        }
    }

    /// Whether the user's own files give the dataset (`folder:`, `csv:`, `jsonl:`, `hf:`): a run
    /// on it records their content digest, and nothing of it is downloaded by name.
    pub fn given_by_files(&self) -> bool {
        matches!(self, DatasetName::Own(_))
    }

    /// The content digest of the files the user gives ([`OwnSource::content_digest`]); `None`
    /// for a released dataset, which its manifest checks instead.
    pub fn content_digest(&self) -> Result<Option<String>, DataError> {
        match self {
            DatasetName::Own(source) => source.content_digest().map(Some),
            _ => Ok(None),
        }
    }

    /// The hub dataset an `hf:` source names, the one kind of the user's own whose files are
    /// downloaded.
    pub fn hub_source(&self) -> Option<&OwnSource> {
        match self {
            DatasetName::Own(source) if source.kind == OwnKind::Hf => Some(source),
            _ => None,
        }
    }

    /// Whether this is a MedMNIST task besides the paper's two (found by its release file).
    pub fn is_other_medmnist(&self) -> bool {
        matches!(self, DatasetName::OtherMedMnist(_))
    }

    /// Which run defaults the dataset takes (configs/): the paper's file for a released dataset,
    /// the MedMNIST family's for its other tasks with phase 1 capped at their training images,
    /// the own-data file of its modality for files the user gives.
    pub fn defaults(&self) -> Result<Defaults, String> {
        Ok(match self {
            DatasetName::Own(source) => match source.modality() {
                Modality::Image => Defaults::of("own_images", OWN_IMAGES),
                Modality::Text => Defaults::of("own_texts", OWN_TEXTS),
            },
            DatasetName::OtherMedMnist(name) => {
                let release = super::medmnist_family::release(name)?;
                Defaults {
                    train_images: Some(release.task.samples.get("train").copied().unwrap_or(0)),
                    ..Defaults::of("medmnist", MEDMNIST_FAMILY)
                }
            }
            released => {
                let row = released
                    .released()
                    .ok_or_else(|| format!("{self}: no paper defaults in configs/"))?;
                Defaults::of(row.id, row.defaults)
            }
        })
    }

    pub fn modality(&self) -> Modality {
        match self {
            DatasetName::Own(source) => source.modality(),
            DatasetName::OtherMedMnist(_) => Modality::Image,
            released => released.released().map_or(Modality::Image, |r| r.modality),
        }
    }

    /// This dataset with the text and label columns `--text-column` / `--label-column` name;
    /// an error for a dataset without columns to choose.
    pub fn with_columns(self, text: Option<&str>, label: Option<&str>) -> Result<Self, String> {
        match self {
            _ if text.is_none() && label.is_none() => Ok(self),
            DatasetName::Own(source) => source.with_columns(text, label).map(DatasetName::Own),
            other => Err(format!(
                "--text-column / --label-column: {other} has its own columns; they apply to csv: and jsonl: datasets"
            )),
        }
    }

    pub(super) fn is_medmnist(&self) -> bool {
        matches!(
            self,
            DatasetName::PneumoniaMnist | DatasetName::BreastMnist | DatasetName::OtherMedMnist(_)
        )
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetName::Own(source) => source.fmt(f),
            _ => f.write_str(self.id()),
        }
    }
}

impl FromStr for DatasetName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // A path keeps its case: a source is parsed before the names are lowercased.
        if let Some(source) = OwnSource::parse(s.trim()) {
            return source.map(DatasetName::Own);
        }
        let key = s.trim().to_ascii_lowercase();
        if let Some(row) = RELEASED
            .iter()
            .find(|r| r.id == key || r.aliases.contains(&key.as_str()))
        {
            return Ok(row.name.clone());
        }
        Ok(match key.as_str() {
            task if task.contains("mnist")
                && task.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                // The catalog knows the task and its sizes, or says why not.
                super::medmnist_family::release(task)?;
                DatasetName::OtherMedMnist(task.to_string())
            }
            _ => {
                let ids: Vec<&str> = RELEASED.iter().map(|r| r.id).collect();
                return Err(format!(
                    "unknown dataset {s:?}: expected {}, or another \
                     2D MedMNIST task by name, at 28 px or at MedMNIST+'s 64, 128 or 224 (e.g. dermamnist, dermamnist_224), \
                     or your own files: folder:PATH, csv:PATH, jsonl:PATH, hf:PATH or hf:ORG/NAME (docs/data.md)",
                    ids.join(", ")
                ));
            }
        })
    }
}
