//! Where an `hf:` source's Parquet files come from. The Hugging Face hub keeps every dataset as
//! Parquet files in its `refs/convert/parquet` revision, laid out `<config>/<split>/NNNN.parquet`
//! (`partial-<split>` for a large split converted in part). `hf:PATH` with PATH a folder reads
//! that layout from disk; `hf:ORG/NAME` asks the hub through the client the backbones use
//! ([`crate::data::hub`]: `HF_ENDPOINT`, `HF_HOME`'s cache in hf-hub's layout, resumed and
//! checked downloads), or with `HF_HUB_OFFLINE` reads only what the cache holds. A
//! configuration's `train` and `test` splits are read; without `test`, `train` is one pool.

use std::path::{Path, PathBuf};

use super::OwnSource;
use crate::data::files::{DataError, Result};
use crate::data::hub::{HubError, HubSettings, hub_file, list_files};

/// The hub revision that holds every dataset as Parquet files.
pub const PARQUET_REVISION: &str = "refs/convert/parquet";

/// The configuration read when the source names none.
pub const DEFAULT_CONFIG: &str = "default";

/// The splits read, in this order.
pub const SPLITS: [&str; 2] = ["train", "test"];

/// The split a file of the Parquet layout belongs to (`default/train/0000.parquet` → `train`),
/// when it is one of [`SPLITS`] of `config`.
pub fn split_of<'a>(name: &'a str, config: &str) -> Option<&'a str> {
    let mut parts = name.split('/');
    let (Some(c), Some(split), Some(file), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let split = split.strip_prefix("partial-").unwrap_or(split);
    (c == config && file.ends_with(".parquet"))
        .then(|| SPLITS.into_iter().find(|s| *s == split))
        .flatten()
}

/// `names` of `config`'s splits, train's first, each split's files in name order.
fn wanted(names: &[String], config: &str) -> Vec<String> {
    let mut kept: Vec<&String> = names
        .iter()
        .filter(|n| split_of(n, config).is_some())
        .collect();
    kept.sort_by_key(|n| {
        (
            SPLITS.iter().position(|s| Some(*s) == split_of(n, config)),
            *n,
        )
    });
    kept.into_iter().cloned().collect()
}

/// Whether `names` hold a training split (a test split alone is not a dataset to train on).
fn has_train(names: &[String], config: &str) -> bool {
    names.iter().any(|n| split_of(n, config) == Some("train"))
}

/// The Parquet files of `source`, each with its name in the hub's layout.
pub fn files(source: &OwnSource) -> Result<Vec<(String, PathBuf)>> {
    let config = source.config.as_deref().unwrap_or(DEFAULT_CONFIG);
    if source.path().is_dir() {
        return from_folder(source, source.path(), config, "the folder");
    }
    from_hub(source, config, &HubSettings::from_env())
}

/// The layout's files under `root`.
fn from_folder(
    source: &OwnSource,
    root: &Path,
    config: &str,
    what: &str,
) -> Result<Vec<(String, PathBuf)>> {
    let mut names = Vec::new();
    for split in SPLITS {
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
    let names = wanted(&names, config);
    if !has_train(&names, config) {
        return Err(unavailable(
            source,
            format!(
                "{what} {} holds no {config}/train/*.parquet (the layout of the hub's Parquet revision: <config>/<split>/NNNN.parquet)",
                root.display()
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
fn from_hub(source: &OwnSource, config: &str, hub: &HubSettings) -> Result<Vec<(String, PathBuf)>> {
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
        return from_folder(source, &snapshot, config, "the cached snapshot");
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
                    from_folder(source, &snapshot, config, "the cached snapshot")
                }
                None => Err(unavailable(source, format!("download failed: {why}"))),
            };
        }
    };
    let names = wanted(&names, config);
    if !has_train(&names, config) {
        return Err(unavailable(
            source,
            format!(
                "the hub's Parquet revision has no {config}/train/*.parquet (is the configuration {config:?} right? `#config=NAME` chooses another)"
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
        assert_eq!(
            split_of("default/train/0000.parquet", "default"),
            Some("train")
        );
        assert_eq!(
            split_of("plain_text/partial-test/0001.parquet", "plain_text"),
            Some("test")
        );
        assert_eq!(split_of("default/validation/0000.parquet", "default"), None);
        assert_eq!(split_of("other/train/0000.parquet", "default"), None);
        assert_eq!(split_of("README.md", "default"), None);
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
            wanted(&names, "default"),
            [
                "default/train/0000.parquet",
                "default/train/0001.parquet",
                "default/test/0000.parquet"
            ]
        );
    }
}
