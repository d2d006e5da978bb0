//! The manifest of an official release (`datasets/<name>.toml`, or the MedMNIST family's
//! catalog): its files, their canonical URLs and checksums, its classes and record counts.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use super::files::Result;

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

/// How a local file compares with the official release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileStatus {
    /// Matches every checksum and size the manifest gives.
    Ok,
    Missing,
    /// Shorter than the release: leading records only.
    Partial {
        bytes: u64,
        expected: u64,
    },
    /// Differs from the release.
    Mismatch(String),
}

impl FileStatus {
    pub fn is_ok(&self) -> bool {
        *self == FileStatus::Ok
    }
}

impl fmt::Display for FileStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileStatus::Ok => f.write_str("ok"),
            FileStatus::Missing => f.write_str("missing"),
            FileStatus::Partial { bytes, expected } => {
                write!(f, "PARTIAL: {bytes} of {expected} bytes")
            }
            FileStatus::Mismatch(why) => write!(f, "MISMATCH: {why}"),
        }
    }
}

/// Checks `path` against the manifest's checksums and size for it.
pub fn check_file(path: &Path, file: &ManifestFile) -> Result<FileStatus> {
    if !crate::io::is_present(path) {
        return Ok(FileStatus::Missing);
    }
    let d = super::files::digests(path)?;
    if let Some(expected) = file.bytes.filter(|&b| d.bytes < b) {
        return Ok(FileStatus::Partial {
            bytes: d.bytes,
            expected,
        });
    }
    let mut problems = Vec::new();
    if let Some(md5) = file.md5.as_ref().filter(|m| **m != d.md5) {
        problems.push(format!("md5 {} is not the official {md5}", d.md5));
    }
    if let Some(sha) = file.sha256.as_ref().filter(|s| **s != d.sha256) {
        problems.push(format!("sha256 {} is not the official {sha}", d.sha256));
    }
    if let Some(bytes) = file.bytes.filter(|&b| b != d.bytes) {
        problems.push(format!("{} bytes, the release has {bytes}", d.bytes));
    }
    Ok(if problems.is_empty() {
        FileStatus::Ok
    } else {
        FileStatus::Mismatch(problems.join("; "))
    })
}
