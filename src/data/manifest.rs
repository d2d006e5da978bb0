//! The manifest of an official release (`datasets/<name>.toml`, or the MedMNIST family's
//! catalog): its files, their canonical URLs and checksums, its classes and record counts.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One `datasets/<name>.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub name: String,
    /// Folder under the data root.
    pub folder: String,
    pub title: String,
    pub homepage: String,
    #[serde(default)]
    pub classes: Vec<String>,
    /// Records per split in the official release.
    pub expected: BTreeMap<String, usize>,
    #[serde(default)]
    pub archive: Option<Archive>,
    pub files: Vec<ManifestFile>,
}

/// A release shipped as one archive (CIFAR-10 and STL-10 as .tar.gz, SST-2 as .zip).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Archive {
    pub url: String,
    pub md5: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestFile {
    /// Relative to the dataset folder.
    pub path: String,
    #[serde(default)]
    pub urls: Vec<String>,
    pub md5: Option<String>,
    pub sha256: Option<String>,
    pub bytes: Option<u64>,
    /// Made from another file of the release, not downloadable itself.
    #[serde(default)]
    pub derived: bool,
}
