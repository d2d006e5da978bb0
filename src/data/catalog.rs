//! The datasets the paper uses, where their files live under the data root, what the official
//! releases contain (the manifests of `datasets/*.toml`, compiled in), and how complete a local
//! copy is.

use std::path::{Path, PathBuf};

use super::files::{DataError, Result};
use super::name::{DatasetName, RELEASED};
use super::samples::Split;
use super::{agnews, cifar, medmnist, mnist, sst2, stl10, trec};

/// Environment variable naming the data root.
pub const DATA_DIR_ENV: &str = "BENIGN_DATA_DIR";

/// `--data-dir`, else `$BENIGN_DATA_DIR`, else `./datasets`.
pub fn data_root(flag: Option<&Path>) -> PathBuf {
    if let Some(dir) = flag {
        return dir.to_path_buf();
    }
    match std::env::var_os(DATA_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from("datasets"),
    }
}

pub use super::samples::Modality;

/// A dataset in memory. `train` is `None` when its files are absent (AG-news offline).
#[derive(Clone, Debug)]
pub struct Dataset {
    pub name: DatasetName,
    pub class_names: Vec<String>,
    pub train: Option<Split>,
    pub val: Option<Split>,
    pub test: Split,
    /// Things the user should know (partial files), one line each.
    pub warnings: Vec<String>,
}

impl Dataset {
    pub fn num_classes(&self) -> usize {
        self.class_names.len()
    }
}

impl DatasetName {
    /// The manifest of the official release (for the MedMNIST family, from its catalog).
    pub fn manifest(&self) -> Option<Manifest> {
        if let DatasetName::Own(_) = self {
            return None;
        }
        manifest(self.id()).or_else(|| match self {
            DatasetName::OtherMedMnist(name) => super::medmnist_family::release(name)
                .ok()
                .map(|release| release.manifest()),
            _ => None,
        })
    }
}

pub use super::manifest::{Archive, FileStatus, Manifest, ManifestFile, check_file};

/// CIFAR-10N's human labels: a manifest of its own, not a dataset ([`super::cifar10n`]).
const CIFAR10N: (&str, &str) = ("cifar10n", include_str!("../../datasets/cifar10n.toml"));

/// Every manifest by name: each released dataset's ([`RELEASED`]), then CIFAR-10N's.
fn manifests() -> impl Iterator<Item = (&'static str, &'static str)> {
    RELEASED
        .iter()
        .map(|r| (r.id, r.manifest))
        .chain(std::iter::once(CIFAR10N))
}

/// The manifest called `name` (the eight datasets and `cifar10n`).
pub fn manifest(name: &str) -> Option<Manifest> {
    let (_, text) = manifests().find(|(n, _)| *n == name)?;
    Some(toml::from_str(text).unwrap_or_else(|e| panic!("datasets/{name}.toml is invalid: {e}")))
}

/// The file under `datasets/` that lists `name`'s release: its own manifest, or the MedMNIST
/// family's for the other tasks and sizes.
pub fn manifest_file(name: &str) -> String {
    if manifests().any(|(n, _)| n == name) {
        format!("{name}.toml")
    } else {
        "medmnist.toml".to_string()
    }
}

/// Names of every manifest, the eight datasets first.
pub fn manifest_names() -> impl Iterator<Item = &'static str> {
    manifests().map(|(n, _)| n)
}

/// Every file of `manifest` under `root`, with its status.
pub fn verify(manifest: &Manifest, root: &Path) -> Result<Vec<(PathBuf, FileStatus)>> {
    let dir = root.join(&manifest.folder);
    manifest
        .files
        .iter()
        .map(|file| {
            let path = dir.join(&file.path);
            check_file(&path, file).map(|status| (path, status))
        })
        .collect()
}

/// The dataset's folder under `root` (for a dataset the user brings, its own path).
pub fn dataset_dir(name: &DatasetName, root: &Path) -> PathBuf {
    if let DatasetName::Own(source) = name {
        return source.path().to_path_buf();
    }
    if name.is_medmnist() {
        return root.join("medmnist");
    }
    root.join(name.id())
}

/// Whether `name` has files to read: its folder under `root`, or the path of a dataset the user
/// brings.
pub fn has_files(name: &DatasetName, root: &Path) -> bool {
    let path = dataset_dir(name, root);
    match name {
        DatasetName::Own(_) => path.exists(),
        _ => path.is_dir(),
    }
}

/// Class names from a list of literals.
fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Loads every split present. A missing training split is `None` (checked where it is needed);
/// a missing test split is an error.
pub fn load(name: &DatasetName, root: &Path) -> Result<Dataset> {
    let dir = dataset_dir(name, root);
    // A source the user brings names its own files.
    if !matches!(name, DatasetName::Own(_)) && !dir.is_dir() {
        return Err(DataError::Unavailable {
            dataset: name.to_string(),
            problem: format!(
                "no folder {} (set --data-dir or {DATA_DIR_ENV} to the folder holding {}/; `benign-attention data fetch {name}` downloads it)",
                dir.display(),
                dir.file_name().and_then(|n| n.to_str()).unwrap_or(""),
            ),
        });
    }
    let warnings = Vec::new();
    let dataset = match name {
        DatasetName::Mnist => Dataset {
            name: name.clone(),
            class_names: names(&mnist::CLASS_NAMES),
            train: Some(mnist::load_split(&dir, "train")?),
            val: None,
            test: mnist::load_split(&dir, "t10k")?,
            warnings: Vec::new(),
        },
        DatasetName::Cifar10 => load_cifar10(name, &dir)?,
        DatasetName::PneumoniaMnist | DatasetName::BreastMnist | DatasetName::OtherMedMnist(_) => {
            load_medmnist(name, &dir)?
        }
        DatasetName::AgNews => load_agnews(name, &dir)?,
        DatasetName::Own(source) => {
            let read = source.load()?;
            Dataset {
                name: name.clone(),
                class_names: read.class_names,
                train: Some(read.train),
                val: None,
                test: read.test,
                warnings: read.warnings,
            }
        }
        DatasetName::Trec => Dataset {
            name: name.clone(),
            class_names: names(&trec::CLASS_NAMES),
            train: Some(trec::load_file(&dir.join("train_5500.label"))?),
            val: None,
            test: trec::load_file(&dir.join("TREC_10.label"))?,
            warnings,
        },
        DatasetName::Stl10 => {
            let release = dir.join(stl10::FOLDER);
            Dataset {
                name: name.clone(),
                class_names: stl10::load_class_names(&release.join("class_names.txt"))?,
                train: Some(stl10::load_split(&release, "train")?),
                val: None,
                test: stl10::load_split(&release, "test")?,
                warnings,
            }
        }
        DatasetName::Sst2 => {
            let release = dir.join(sst2::FOLDER);
            Dataset {
                name: name.clone(),
                class_names: names(&sst2::CLASS_NAMES),
                train: Some(sst2::load_tsv(&release.join("train.tsv"))?),
                val: None,
                // GLUE's test file has no labels: the validation split is the test set.
                test: sst2::load_tsv(&release.join("dev.tsv"))?,
                warnings,
            }
        }
    };
    check_splits(&dataset)?;
    Ok(dataset)
}

/// CIFAR-10's binary batches: five training batches and the test batch.
fn load_cifar10(name: &DatasetName, dir: &Path) -> Result<Dataset> {
    let mut warnings: Vec<String> = Vec::new();
    let batches = dir.join("cifar-10-batches-bin");
    let (train, w) = cifar::load_batches(&batches, &cifar::TRAIN_BATCHES)?;
    warnings.extend(w);
    let (test, w) = cifar::load_batches(&batches, &[cifar::TEST_BATCH])?;
    warnings.extend(w);
    Ok(Dataset {
        name: name.clone(),
        class_names: names(&cifar::CLASS_NAMES),
        train: Some(train),
        val: None,
        test,
        warnings,
    })
}

/// A MedMNIST npz file: its train, val and test arrays; classes from the manifest, else by index.
fn load_medmnist(name: &DatasetName, dir: &Path) -> Result<Dataset> {
    let warnings: Vec<String> = Vec::new();
    let path = dir.join(format!("{}.npz", name.id()));
    if !crate::io::is_present(&path) {
        return Err(DataError::format(
            &path,
            format!(
                "missing (its URL and checksum: datasets/{}; `benign-attention data fetch {name}` downloads it)",
                manifest_file(name.id())
            ),
        ));
    }
    let known = name.manifest().map(|m| m.classes).filter(|c| !c.is_empty());
    let num_classes = known.as_ref().map(Vec::len);
    let train = medmnist::read_split(&path, "train", num_classes)?;
    let val = medmnist::read_split(&path, "val", num_classes)?;
    let test = medmnist::read_split(&path, "test", num_classes)?;
    if let Ok(release) = super::medmnist_family::release(name.id()) {
        for split in [&train, &val, &test] {
            medmnist::check_size(&path, split, release.pixels)?;
        }
    }
    let class_names = match known {
        Some(classes) => classes,
        // Tasks without a manifest: classes named by index.
        None => {
            let max = [&train, &val, &test]
                .iter()
                .flat_map(|s| s.labels.iter())
                .max()
                .copied()
                .unwrap_or(0);
            (0..=max).map(|k| k.to_string()).collect()
        }
    };
    Ok(Dataset {
        name: name.clone(),
        class_names,
        train: Some(train),
        val: Some(val),
        test,
        warnings,
    })
}

/// AG-news's CSV files; the training file may be absent (offline copies hold only the test file).
fn load_agnews(name: &DatasetName, dir: &Path) -> Result<Dataset> {
    let mut warnings: Vec<String> = Vec::new();
    let classes_path = dir.join("classes.txt");
    let class_names = if crate::io::is_present(&classes_path) {
        agnews::load_class_names(&classes_path)?
    } else {
        names(&agnews::DEFAULT_CLASS_NAMES)
    };
    let train_path = dir.join("train.csv");
    let train = if crate::io::is_present(&train_path) {
        Some(agnews::load_csv(&train_path)?)
    } else {
        warnings.push(format!(
            "{}: missing; the training split is absent",
            train_path.display()
        ));
        None
    };
    let test = agnews::load_csv(&dir.join("test.csv"))?;
    Ok(Dataset {
        name: name.clone(),
        class_names,
        train,
        val: None,
        test,
        warnings,
    })
}

/// What every run relies on, whatever the loader: the splits that are present hold samples, and
/// every label is a class index below `num_classes()`. The loaders check their own files and name
/// them; this is the backstop for any split they let through.
fn check_splits(dataset: &Dataset) -> Result<()> {
    let classes = dataset.num_classes();
    let splits = [
        ("train", dataset.train.as_ref()),
        ("val", dataset.val.as_ref()),
        ("test", Some(&dataset.test)),
    ];
    for (name, split) in splits {
        let Some(split) = split else { continue };
        let problem = if split.is_empty() {
            Some(format!("the {name} split holds no samples"))
        } else {
            split
                .labels
                .iter()
                .position(|&l| l as usize >= classes)
                .map(|k| {
                    format!(
                        "{name} sample {k} has label {}, outside the {classes} classes 0..{}",
                        split.labels[k],
                        classes.saturating_sub(1)
                    )
                })
        };
        if let Some(problem) = problem {
            return Err(DataError::Unavailable {
                dataset: dataset.name.to_string(),
                problem,
            });
        }
    }
    Ok(())
}

/// The number of rows of the official training split, against which the authors drew their
/// split (`numpy choice(N, …)` over the release's row order), when the local training rows can be
/// matched to it by their `release_index`: files read in part keep their leading records (CIFAR-10
/// batches, CSV and label files), but a MedMNIST archive is read whole, so one whose size differs
/// from the release is another file (the mirror's PneumoniaMNIST), whose row positions are not
/// release indices. The error says why, for a message about `--rng authors`.
pub fn official_train_size(dataset: &Dataset) -> std::result::Result<usize, String> {
    // A source the user brings is its own release: its training split in the documented order.
    if let (DatasetName::Own(_), Some(train)) = (&dataset.name, &dataset.train) {
        return Ok(train.len());
    }
    let official = dataset
        .name
        .manifest()
        .and_then(|m| m.expected.get("train").copied())
        .ok_or_else(|| {
            format!(
                "the size of {}'s official training split is not known (no manifest in datasets/)",
                dataset.name
            )
        })?;
    if dataset.name.is_medmnist()
        && let Some(train) = &dataset.train
        && train.len() != official
    {
        return Err(format!(
            "{}.npz holds {} training images, not the official {official}: it is another file, \
             not a part of the release, so its rows cannot be matched to the release's",
            dataset.name.id(),
            train.len()
        ));
    }
    Ok(official)
}

/// Present vs official record counts of one split.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitCount {
    pub split: String,
    pub present: usize,
    pub expected: Option<usize>,
}

/// How much of the official release a loaded dataset holds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Completeness {
    pub dataset: String,
    pub splits: Vec<SplitCount>,
    /// Every split holds at least the official count (unknown counts count as complete).
    pub complete: bool,
}

impl Completeness {
    pub fn of(dataset: &Dataset) -> Self {
        let expected = dataset
            .name
            .manifest()
            .map(|m| m.expected)
            .unwrap_or_default();
        let mut splits = vec![SplitCount {
            split: "train".into(),
            present: dataset.train.as_ref().map_or(0, |s| s.len()),
            expected: expected.get("train").copied(),
        }];
        if let Some(val) = &dataset.val {
            splits.push(SplitCount {
                split: "val".into(),
                present: val.len(),
                expected: expected.get("val").copied(),
            });
        }
        splits.push(SplitCount {
            split: "test".into(),
            present: dataset.test.len(),
            expected: expected.get("test").copied(),
        });
        let complete = splits
            .iter()
            .all(|s| s.expected.is_none_or(|e| s.present >= e));
        Completeness {
            dataset: dataset.name.to_string(),
            splits,
            complete,
        }
    }

    /// "cifar10: 8068/50000 train, 1017/10000 test, partial".
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .splits
            .iter()
            .map(|s| match s.expected {
                Some(e) if s.present == 0 => format!("0/{e} {} (missing)", s.split),
                Some(e) => format!("{}/{e} {}", s.present, s.split),
                None => format!("{} {}", s.present, s.split),
            })
            .collect();
        let status = if self.complete { "complete" } else { "partial" };
        format!("{}: {}, {status}", self.dataset, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_manifest_parses_and_names_itself() {
        for name in manifest_names() {
            let m = manifest(name).unwrap();
            assert_eq!(m.name, name);
            assert!(!m.files.is_empty());
            // A file without checksums of its own is checked through its archive's.
            for file in &m.files {
                assert!(
                    file.md5.is_some()
                        || file.sha256.is_some()
                        || file.bytes.is_some()
                        || m.archive.is_some(),
                    "{name}: {}",
                    file.path
                );
            }
        }
        for dataset in DatasetName::all() {
            assert!(dataset.manifest().is_some(), "{dataset} has no manifest");
        }
    }

    #[test]
    fn names_parse() {
        assert_eq!(
            "ag-news".parse::<DatasetName>().unwrap(),
            DatasetName::AgNews
        );
        assert_eq!(
            "CIFAR10".parse::<DatasetName>().unwrap(),
            DatasetName::Cifar10
        );
        assert_eq!(
            "dermamnist".parse::<DatasetName>().unwrap(),
            DatasetName::OtherMedMnist("dermamnist".into())
        );
        let err = "imagenet".parse::<DatasetName>().unwrap_err();
        assert!(err.contains("unknown dataset \"imagenet\""), "{err}");
    }

    #[test]
    fn data_root_prefers_the_flag() {
        assert_eq!(data_root(Some(Path::new("/x"))), PathBuf::from("/x"));
    }

    #[test]
    fn empty_splits_and_labels_outside_the_classes_are_refused() {
        let split = |labels: Vec<u32>| Split {
            inputs: crate::data::Inputs::Texts(vec![String::new(); labels.len()]),
            release_index: (0..labels.len()).collect(),
            labels,
        };
        let dataset = |train: Vec<u32>, test: Vec<u32>| Dataset {
            name: DatasetName::Trec,
            class_names: vec!["a".into(), "b".into()],
            train: Some(split(train)),
            val: None,
            test: split(test),
            warnings: Vec::new(),
        };
        check_splits(&dataset(vec![0, 1], vec![1])).unwrap();
        let err = check_splits(&dataset(vec![0, 1], vec![]))
            .unwrap_err()
            .to_string();
        assert_eq!(err, "trec: the test split holds no samples");
        let err = check_splits(&dataset(vec![0, 2], vec![1]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "trec: train sample 1 has label 2, outside the 2 classes 0..1"
        );
    }

    #[test]
    fn a_missing_folder_says_where_to_put_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&DatasetName::Trec, dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("trec: no folder") && err.contains("--data-dir"),
            "{err}"
        );
    }
}
