//! A source read: the files it names, their digest, and its samples, by the loader its kind
//! names.

use std::path::PathBuf;

use super::memo::Memo;
use super::source::{LABEL_KEY, OwnKind, OwnSource, TEXT_KEY};
use crate::data::Split;
use crate::data::files::{DataError, Result};

/// A source as read: its classes in order, its training and test splits, and what the reading
/// changed (a pool split, images resized), one line each.
pub struct Read {
    pub class_names: Vec<String>,
    pub train: Split,
    pub test: Split,
    pub warnings: Vec<String>,
}

impl OwnSource {
    /// The files this source reads, each with its name relative to the source (what enters the
    /// digest, so that it does not depend on where a hub cache lies), in the order their bytes
    /// enter [`Self::content_digest`]. An `hf:` source's files are downloaded here if needed.
    pub fn files(&self) -> Result<Vec<(String, PathBuf)>> {
        let paths = match self.kind {
            OwnKind::Folder => super::folder::files(self.path())?,
            OwnKind::Csv | OwnKind::Jsonl => super::table::files(self.path(), self.kind)?,
            OwnKind::Hf => return super::hf::files(self),
        };
        Ok(paths
            .into_iter()
            .map(|path| {
                let relative = path.strip_prefix(self.path()).unwrap_or(&path);
                (relative.to_string_lossy().into_owned(), path)
            })
            .collect())
    }

    /// SHA-256 (first 16 hex digits) over every file the source reads: its name relative to the
    /// source, its length and its bytes, in [`Self::files`]' order. A run records it, so a
    /// run folder, a resumed run or a replayed config.json is refused when the files changed.
    ///
    /// A process computes it once per state of the files: a grid asks for it once per run, and
    /// the bytes are read again only when a file's path, length or modification time differs.
    pub fn content_digest(&self) -> Result<String> {
        type Stamps = Vec<(String, PathBuf, u64, Option<std::time::SystemTime>)>;
        static DIGESTS: Memo<Stamps, String> = Memo::new();
        let files = self.files()?;
        let stamps: Stamps = files
            .iter()
            .map(|(name, path)| {
                let meta = std::fs::metadata(path).map_err(|e| DataError::io(path, e))?;
                let path = std::path::absolute(path).map_err(|e| DataError::io(path, e))?;
                Ok((name.clone(), path, meta.len(), meta.modified().ok()))
            })
            .collect::<Result<_>>()?;
        DIGESTS.get_or_try(stamps, || Self::digest_of(&files))
    }

    /// SHA-256 (first 16 hex digits) of `files`' names, lengths and bytes, in order.
    fn digest_of(files: &[(String, PathBuf)]) -> Result<String> {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        for (relative, path) in files {
            let bytes = crate::data::files::read_data(path)?;
            hasher.update(relative.as_bytes());
            hasher.update([0]);
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        }
        Ok(crate::io::hex(&hasher.finalize()[..8]))
    }

    /// The samples in memory: the classes in the documented order, the train and test splits.
    pub fn load(&self) -> Result<Read> {
        let loaded = match self.kind {
            OwnKind::Folder => super::folder::load(self.path())?,
            OwnKind::Csv | OwnKind::Jsonl => super::table::load(
                self.path(),
                self.kind,
                &super::table::Columns {
                    text: self.text_column.as_deref().unwrap_or(TEXT_KEY),
                    label: self.label_column.as_deref().unwrap_or(LABEL_KEY),
                },
            )?,
            OwnKind::Hf => {
                let input = match &self.image_column {
                    Some(column) => super::parquet::Input::Image(column),
                    None => {
                        super::parquet::Input::Text(self.text_column.as_deref().unwrap_or(TEXT_KEY))
                    }
                };
                let label = self.label_column.as_deref().unwrap_or(LABEL_KEY);
                super::parquet::load(&super::hf::files(self)?, input, label)?
            }
        };
        if loaded.class_names.len() < 2 {
            return Err(DataError::Unavailable {
                dataset: self.to_string(),
                problem: format!(
                    "one class only ({}): a classifier needs two or more",
                    loaded.class_names.join(", ")
                ),
            });
        }
        let (train, test, warnings) = match loaded.splits {
            super::pool::Splits::Given { train, test } => (train, test, Vec::new()),
            super::pool::Splits::Pool(samples) => {
                let (train, test) = super::pool::hold_out(&samples, loaded.class_names.len());
                if test.is_empty() {
                    return Err(DataError::Unavailable {
                        dataset: self.to_string(),
                        problem: format!(
                            "one pool of {} samples with no class of {} or more: nothing is held out for a test split \
                             (every {}th sample of each class is); give more samples, or a train and test pair",
                            samples.len(),
                            super::pool::HOLD_OUT_EVERY,
                            super::pool::HOLD_OUT_EVERY
                        ),
                    });
                }
                (train, test, vec![super::pool::HOLD_OUT_NOTE.to_string()])
            }
        };
        Ok(Read {
            class_names: loaded.class_names,
            train,
            test,
            warnings: [warnings, loaded.warnings].concat(),
        })
    }
}
