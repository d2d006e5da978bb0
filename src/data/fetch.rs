//! `data fetch`: download a dataset's canonical release files, check them against its manifest,
//! and move them into place. Without a network it fails within seconds and says where to put the
//! files by hand.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

use super::catalog::Dataset;
use super::catalog::{Manifest, ManifestFile, check_file};
use super::download::{self, agent, download};
use super::name::DatasetName;

/// A base URL tried before the canonical ones, laid out as a data root
/// (`<mirror>/<dataset folder>/<file>`), as torchvision's mirrors are tried first.
pub const MIRROR_ENV: &str = "BENIGN_DATA_MIRROR";

/// The mirror of `--data-mirror`, else of [`MIRROR_ENV`].
pub fn mirror(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_string)
        .or_else(|| std::env::var(MIRROR_ENV).ok())
        .filter(|m| !m.trim().is_empty())
}

/// What a fetch did, file by file.
#[derive(Debug, Default)]
pub struct FetchReport {
    pub downloaded: Vec<PathBuf>,
    pub already_present: Vec<PathBuf>,
}

/// A file of the manifest already in place with the official checksums.
fn verified(path: &Path, file: &ManifestFile) -> bool {
    check_file(path, file).is_ok_and(|status| status.is_ok())
}

/// The URLs of `path` (a file of the manifest, or its archive's name): the mirror's first.
fn urls(
    manifest: &Manifest,
    mirror: Option<&str>,
    path: &str,
    canonical: &[String],
) -> Vec<String> {
    mirror
        .map(|m| format!("{}/{}/{path}", m.trim_end_matches('/'), manifest.folder))
        .into_iter()
        .chain(canonical.iter().cloned())
        .collect()
}

/// Where the files go and what the manifest lists, for the offline message.
fn by_hand(manifest: &Manifest, dir: &Path) -> String {
    let files: Vec<&str> = manifest
        .files
        .iter()
        .filter(|f| !f.derived)
        .map(|f| f.path.as_str())
        .collect();
    let source = match &manifest.archive {
        Some(a) => format!("unpack {}", a.url),
        None => format!("put {}", files.join(", ")),
    };
    format!(
        "download the files on a machine with a network and {source} under {} (URLs and checksums: datasets/{}); \
         `benign-attention data verify` checks them",
        dir.display(),
        super::catalog::manifest_file(&manifest.name)
    )
}

/// [`super::catalog::load`], after fetching the files of the dataset that are missing (sibling MedMNIST
/// tasks included), checksummed as `data fetch` does. Files present but not official (partial or
/// third-party copies) are used as they are, and recorded by the run; `data fetch` replaces them.
/// Without a network the load's own error stays, with the download's reason beside it; data that
/// loads without the missing files (a partial copy, such as AG-news's test file alone, which
/// `--carve-train-from-test` splits) is used as it is, with a warning.
pub fn load_or_fetch(name: &DatasetName, root: &Path, mirror: Option<&str>) -> Result<Dataset> {
    if let Some(manifest) = name.manifest() {
        let dir = root.join(&manifest.folder);
        let missing = manifest
            .files
            .iter()
            .any(|f| !f.derived && !crate::io::is_present(&dir.join(&f.path)));
        if missing {
            eprintln!(
                "{name}: files missing under {}; downloading the official ones",
                root.display()
            );
            if let Err(download) = fetch_files(&manifest, root, mirror, Wanted::Missing) {
                return match super::catalog::load(name, root) {
                    Ok(partial) => {
                        eprintln!(
                            "warning: {name}: the missing files could not be downloaded ({}); going on with the files present",
                            crate::errors::one_line(&download)
                        );
                        Ok(partial)
                    }
                    Err(e) => bail!("{e}; download failed: {download:#}"),
                };
            }
        }
    }
    Ok(super::catalog::load(name, root)?)
}

/// Downloads every missing or wrong file of `manifest` into `root/<folder>`. A failed fetch
/// leaves no folder it created; a partial file it keeps is resumed by the next fetch.
pub fn fetch(manifest: &Manifest, root: &Path, mirror: Option<&str>) -> Result<FetchReport> {
    fetch_files(manifest, root, mirror, Wanted::NotOfficial)
}

/// Which files a fetch replaces.
#[derive(Clone, Copy, PartialEq)]
enum Wanted {
    /// Absent ones only.
    Missing,
    /// Every one that does not match the manifest.
    NotOfficial,
}

fn fetch_files(
    manifest: &Manifest,
    root: &Path,
    mirror: Option<&str>,
    wanted: Wanted,
) -> Result<FetchReport> {
    let dir = root.join(&manifest.folder);
    // The folders this fetch creates, the deepest first: a failed fetch leaves none of them (the
    // data root included, when it did not exist).
    let created: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !crate::io::is_present(a))
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create the dataset folder", dir.display()))?;
    let result = download::lock_dir(&dir).and_then(|_lock| {
        download::sweep(&dir)?;
        fetch_into(manifest, &dir, mirror, wanted)
    });
    if result.is_err() {
        for folder in &created {
            // Only succeeds while the folder is empty.
            let _ = std::fs::remove_dir(folder);
        }
    }
    result
}

fn fetch_into(
    manifest: &Manifest,
    dir: &Path,
    mirror: Option<&str>,
    wanted: Wanted,
) -> Result<FetchReport> {
    let agent = agent();
    let mut report = FetchReport::default();
    let failed = |what: &str, outcomes: Vec<String>| {
        anyhow!(
            "{}: {what}: {}; {}",
            manifest.name,
            outcomes.join("; "),
            by_hand(manifest, dir)
        )
    };
    let needed = |file: &ManifestFile| match wanted {
        Wanted::Missing => !crate::io::is_present(&dir.join(&file.path)),
        Wanted::NotOfficial => !verified(&dir.join(&file.path), file),
    };

    if let Some(archive) = &manifest.archive {
        if !manifest.files.iter().any(needed) {
            report
                .already_present
                .extend(manifest.files.iter().map(|f| dir.join(&f.path)));
            return Ok(report);
        }
        let name = archive.url.rsplit('/').next().unwrap_or("archive");
        let as_file = ManifestFile {
            path: name.to_string(),
            urls: Vec::new(),
            md5: Some(archive.md5.clone()),
            sha256: None,
            bytes: None,
            derived: false,
        };
        let archive_path = dir.join(format!(".{name}"));
        let all = urls(manifest, mirror, name, std::slice::from_ref(&archive.url));
        download(&agent, &all, &as_file, &archive_path).map_err(|o| failed(name, o))?;
        let unpacked = unpack(manifest, dir, &archive_path, &archive.url);
        let _ = std::fs::remove_file(&archive_path);
        report.downloaded.extend(unpacked?);
        return Ok(report);
    }

    for file in manifest.files.iter().filter(|f| !f.derived) {
        let target = dir.join(&file.path);
        if !needed(file) {
            report.already_present.push(target);
            continue;
        }
        let all = urls(manifest, mirror, &file.path, &file.urls);
        download(&agent, &all, file, &target).map_err(|o| failed(&file.path, o))?;
        report.downloaded.push(target);
    }
    Ok(report)
}

/// Unpacks a downloaded archive beside the final folder, then moves each file into place.
fn unpack(manifest: &Manifest, dir: &Path, archive: &Path, url: &str) -> Result<Vec<PathBuf>> {
    let staging = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempdir_in(dir)?;
    let (file, _) = crate::io::open_input(archive, crate::io::limits::DATA_FILE)?;
    if url.ends_with(".zip") {
        zip::ZipArchive::new(file)
            .and_then(|mut zip| zip.extract(staging.path()))
            .with_context(|| format!("{url}: cannot unpack"))?;
    } else {
        tar::Archive::new(flate2::read::GzDecoder::new(file))
            .unpack(staging.path())
            .with_context(|| format!("{url}: cannot unpack"))?;
    }
    let mut moved = Vec::new();
    for file in &manifest.files {
        let target = dir.join(&file.path);
        let unpacked = staging.path().join(&file.path);
        if !verified(&unpacked, file) {
            bail!(
                "{url}: {} in the archive does not match datasets/{}.toml",
                file.path,
                manifest.name
            );
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(&unpacked, &target)
            .with_context(|| format!("{}: cannot move into place", target.display()))?;
        moved.push(target);
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::catalog::manifest;
    use std::time::Duration;

    #[test]
    fn offline_fetch_fails_fast_and_says_where_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manifest("trec").unwrap();
        // An address that refuses at once on any machine: nothing listens on port 9 of loopback.
        for file in &mut m.files {
            file.urls = vec!["http://127.0.0.1:9/train_5500.label".into()];
        }
        let started = std::time::Instant::now();
        let err = format!("{:#}", fetch(&m, dir.path(), None).unwrap_err());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        assert!(err.starts_with("trec: "), "{err}");
        assert!(err.contains("unreachable"), "{err}");
        assert!(
            err.contains("train_5500.label")
                && err.contains(&dir.path().join("trec").display().to_string()),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        // Nothing half-written: no temporary download left in the folder.
        assert!(
            !dir.path().join("trec").exists(),
            "the folder made for the download stayed behind"
        );
    }
}
