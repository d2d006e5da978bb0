//! Where an `hf:` source's Parquet files come from. The Hugging Face hub keeps every dataset as
//! Parquet files in its `refs/convert/parquet` revision, laid out `<config>/<split>/NNNN.parquet`
//! (`partial-<split>` for a large split converted in part). `hf:PATH` with PATH a folder reads
//! that layout from disk; `hf:ORG/NAME` asks the hub through the client the backbones use
//! ([`crate::data::hub`]: `HF_ENDPOINT`, `HF_HOME`'s cache in hf-hub's layout, resumed and
//! checked downloads), or with `HF_HUB_OFFLINE` reads only what the cache holds. A
//! configuration's `train` and `test` splits are read (`#train=`, `#test=` name others); without
//! the test split, the training split is one pool.

use std::path::{Path, PathBuf};

use super::source::OwnSource;
use crate::data::files::{DataError, Result};
use crate::data::hub::{HubError, HubSettings, hub_file, list_files};

/// The hub revision that holds every dataset as Parquet files.
pub const PARQUET_REVISION: &str = "refs/convert/parquet";

/// The configuration read when the source names none.
pub const DEFAULT_CONFIG: &str = "default";

/// The splits read when the source names none: training, then test.
pub const SPLITS: [&str; 2] = ["train", "test"];

/// Which files of the Parquet layout a source reads: its configuration's training and test
/// splits (`#config=`, `#train=`, `#test=`; e.g. `#test=validation` where the test split is
/// unlabelled).
pub struct Layout<'a> {
    pub config: &'a str,
    pub splits: [&'a str; 2],
}

impl<'a> Layout<'a> {
    pub fn of(source: &'a OwnSource) -> Self {
        Self {
            config: source.config.as_deref().unwrap_or(DEFAULT_CONFIG),
            splits: [
                source.train_split.as_deref().unwrap_or(SPLITS[0]),
                source.test_split.as_deref().unwrap_or(SPLITS[1]),
            ],
        }
    }

    /// Which of the two splits a file of the layout belongs to (`default/train/0000.parquet` →
    /// 0), if either.
    pub fn split_of(&self, name: &str) -> Option<usize> {
        let mut parts = name.split('/');
        let (Some(config), Some(split), Some(file), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let split = split.strip_prefix("partial-").unwrap_or(split);
        (config == self.config && file.ends_with(".parquet"))
            .then(|| self.splits.iter().position(|s| *s == split))
            .flatten()
    }

    /// `names` of the two splits, the training split's first, each split's files in name order.
    fn wanted(&self, names: &[String]) -> Vec<String> {
        let mut kept: Vec<&String> = names
            .iter()
            .filter(|n| self.split_of(n).is_some())
            .collect();
        kept.sort_by_key(|n| (self.split_of(n), *n));
        kept.into_iter().cloned().collect()
    }

    /// Whether `names` hold the training split (a test split alone is nothing to train on).
    fn has_train(&self, names: &[String]) -> bool {
        names.iter().any(|n| self.split_of(n) == Some(0))
    }

    /// `<config>/<train split>/*.parquet`, for messages.
    fn train_files(&self) -> String {
        format!("{}/{}/*.parquet", self.config, self.splits[0])
    }
}

/// The Parquet files of `source`, each with its name in the hub's layout.
pub fn files(source: &OwnSource) -> Result<Vec<(String, PathBuf)>> {
    let layout = Layout::of(source);
    // A name of the layout is one path component: `..`, `.` or a separator would read outside
    // the dataset's folder (or ask the hub for another path).
    for (key, value) in [
        ("config", layout.config),
        ("train", layout.splits[0]),
        ("test", layout.splits[1]),
    ] {
        if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\\']) {
            return Err(unavailable(
                source,
                format!(
                    "#{key}={}: a configuration or split is one name (not empty, `.`, `..` or holding a `/`)",
                    crate::excerpt::quote(value)
                ),
            ));
        }
    }
    if layout.splits[0] == layout.splits[1] {
        return Err(unavailable(
            source,
            format!(
                "the training and test splits are both {}",
                crate::excerpt::quote(layout.splits[0])
            ),
        ));
    }
    if source.path().is_dir() {
        return from_folder(source, source.path(), &layout, "the folder");
    }
    // A path that exists but is not a folder is not a hub id (ORG/NAME names no local file).
    if crate::io::is_present(source.path()) {
        return Err(DataError::format(
            source.path(),
            "not a folder: hf:PATH reads a folder in the hub's Parquet layout (<config>/<split>/*.parquet)",
        ));
    }
    // A run resolves its files at configuration, at set-up's digest check and at load: the hub
    // is asked once per process; the files then lie in the cache, read-only blobs by content.
    static RESOLVED: super::memo::Memo<OwnSource, Vec<(String, PathBuf)>> =
        super::memo::Memo::new();
    RESOLVED.get_or_try(source.clone(), || {
        from_hub(source, &layout, &HubSettings::from_env())
    })
}

/// The layout's files under `root`.
fn from_folder(
    source: &OwnSource,
    root: &Path,
    layout: &Layout,
    what: &str,
) -> Result<Vec<(String, PathBuf)>> {
    let config = layout.config;
    let mut names = Vec::new();
    for split in layout.splits {
        for part in [split.to_string(), format!("partial-{split}")] {
            let dir = root.join(config).join(&part);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Some(file) = entry.file_name().to_str() {
                    names.push(format!("{config}/{part}/{file}"));
                }
            }
        }
    }
    let names = layout.wanted(&names);
    if !layout.has_train(&names) {
        return Err(unavailable(
            source,
            format!(
                "{what} {} holds no {} (the layout of the hub's Parquet revision: <config>/<split>/NNNN.parquet)",
                root.display(),
                layout.train_files()
            ),
        ));
    }
    Ok(names
        .into_iter()
        .map(|name| {
            let path = root.join(&name);
            (name, path)
        })
        .collect())
}

fn unavailable(source: &OwnSource, problem: String) -> DataError {
    DataError::Unavailable {
        dataset: source.to_string(),
        problem,
    }
}

/// The files from the hub, or from its cache alone when offline (or when the hub cannot be
/// reached and the cache holds the dataset, said on stderr).
fn from_hub(
    source: &OwnSource,
    layout: &Layout,
    hub: &HubSettings,
) -> Result<Vec<(String, PathBuf)>> {
    let repo = hf_hub::Repo::with_revision(
        source.location.clone(),
        hf_hub::RepoType::Dataset,
        PARQUET_REVISION.to_string(),
    );
    let cached = || -> Option<PathBuf> {
        let folder = hub.cache.path().join(repo.folder_name());
        let commit = std::fs::read_to_string(folder.join("refs").join(PARQUET_REVISION)).ok()?;
        Some(folder.join("snapshots").join(commit.trim()))
    };
    if hub.offline {
        let Some(snapshot) = cached() else {
            return Err(unavailable(
                source,
                format!(
                    "not in the Hugging Face cache ({}) and HF_HUB_OFFLINE is set, so the hub was not asked; \
                     run once online, or give a folder laid out as the hub's Parquet revision (hf:PATH)",
                    hub.cache.path().display()
                ),
            ));
        };
        return from_folder(source, &snapshot, layout, "the cached snapshot");
    }
    let names = match list_files(hub, &repo) {
        Ok((_, names)) => names,
        Err(HubError::NotFound) => {
            return Err(unavailable(
                source,
                format!(
                    "no such dataset on {} (HTTP 404 for its Parquet revision)",
                    hub.endpoint
                ),
            ));
        }
        Err(HubError::Failed(why)) => {
            return match cached() {
                Some(snapshot) => {
                    eprintln!(
                        "warning: {source}: the hub could not be asked ({why}); reading the cached snapshot"
                    );
                    from_folder(source, &snapshot, layout, "the cached snapshot")
                }
                None => Err(unavailable(source, format!("download failed: {why}"))),
            };
        }
    };
    let names = layout.wanted(&names);
    if !layout.has_train(&names) {
        return Err(unavailable(
            source,
            format!(
                "the hub's Parquet revision has no {} (`#config=NAME` and `#train=SPLIT` choose others)",
                layout.train_files()
            ),
        ));
    }
    names
        .into_iter()
        .map(|name| match hub_file(hub, &repo, &name) {
            Ok(path) => Ok((name, path)),
            Err(HubError::NotFound) => Err(unavailable(
                source,
                format!("{name}: listed by the hub but not found (HTTP 404)"),
            )),
            Err(HubError::Failed(why)) => Err(unavailable(
                source,
                format!("download failed: {name}: {why}"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_names_config_and_split() {
        let source = |spec: &str| OwnSource::parse(spec).unwrap().unwrap();
        let plain = source("hf:org/name");
        let layout = Layout::of(&plain);
        assert_eq!(layout.split_of("default/train/0000.parquet"), Some(0));
        assert_eq!(
            layout.split_of("default/partial-test/0001.parquet"),
            Some(1)
        );
        assert_eq!(layout.split_of("default/validation/0000.parquet"), None);
        assert_eq!(layout.split_of("other/train/0000.parquet"), None);
        assert_eq!(layout.split_of("README.md"), None);
        let names: Vec<String> = [
            "default/test/0000.parquet",
            "default/train/0001.parquet",
            "default/train/0000.parquet",
            ".gitattributes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            layout.wanted(&names),
            [
                "default/train/0000.parquet",
                "default/train/0001.parquet",
                "default/test/0000.parquet"
            ]
        );
        let glue = source("hf:nyu-mll/glue#config=sst2#test=validation");
        let layout = Layout::of(&glue);
        assert_eq!(layout.split_of("sst2/validation/0000.parquet"), Some(1));
        assert_eq!(layout.split_of("sst2/test/0000.parquet"), None);
    }
}
