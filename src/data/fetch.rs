//! `data fetch`: download a dataset's canonical release files, check them against its manifest,
//! and move them into place. Without a network it fails within seconds and says where to put the
//! files by hand.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use md5::Md5;
use sha2::{Digest, Sha256};

use super::Dataset;
use super::catalog::{DatasetName, Manifest, ManifestFile, check_file};

/// What a fetch did, file by file.
#[derive(Debug, Default)]
pub struct FetchReport {
    pub downloaded: Vec<PathBuf>,
    pub already_present: Vec<PathBuf>,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        // Offline, name resolution or connection fails at once; a dead route times out quickly.
        .timeout_connect(Duration::from_secs(5))
        .timeout_read(Duration::from_secs(60))
        .build()
}

/// A file of the manifest already in place with the official checksums.
fn verified(path: &Path, file: &ManifestFile) -> bool {
    check_file(path, file).is_ok_and(|status| status.is_ok())
}

/// Streams `url` into a temporary file in `dir`, returning it with its md5 and sha256.
fn download(
    agent: &ureq::Agent,
    url: &str,
    dir: &Path,
) -> Result<(tempfile::NamedTempFile, String, String)> {
    // ureq's errors name the URL already.
    let response = agent.get(url).call().map_err(|e| anyhow!("{e}"))?;
    let mut reader = response.into_reader();
    let mut tmp = tempfile::Builder::new()
        .prefix(".download-")
        .tempfile_in(dir)?;
    let (mut sha, mut md5) = (Sha256::new(), Md5::new());
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let read = reader
            .read(&mut buf)
            .with_context(|| format!("{url}: download interrupted"))?;
        if read == 0 {
            break;
        }
        sha.update(&buf[..read]);
        md5.update(&buf[..read]);
        tmp.write_all(&buf[..read])?;
    }
    tmp.flush()?;
    let hex = crate::io::hex;
    Ok((tmp, hex(&md5.finalize()), hex(&sha.finalize())))
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
        "download the files on a machine with a network and {source} under {} (URLs and checksums: datasets/{}.toml); \
         `benign-attention data verify` checks them",
        dir.display(),
        manifest.name
    )
}

/// Downloads every missing or wrong file of `manifest` into `root/<folder>`. A failed fetch
/// leaves no temporary file, and no folder it created.
/// [`super::load`], fetching the dataset first when its folder is absent (checksummed, as
/// `data fetch` does), the way `load_dataset` users expect; without a network the load's own
/// error stays, with the download's reason beside it.
pub fn load_or_fetch(name: &DatasetName, root: &Path) -> Result<Dataset> {
    let absent = !super::catalog::dataset_dir(name, root).is_dir();
    let manifest = name.manifest();
    if let (true, Some(manifest)) = (absent, manifest) {
        eprintln!(
            "{name}: no copy under {}; downloading the official files",
            root.display()
        );
        if let Err(download) = fetch(&manifest, root) {
            let missing = super::load(name, root)
                .err()
                .map_or(String::new(), |e| format!("{e}; "));
            bail!("{missing}the download failed too: {download:#}");
        }
    }
    Ok(super::load(name, root)?)
}

pub fn fetch(manifest: &Manifest, root: &Path) -> Result<FetchReport> {
    let dir = root.join(&manifest.folder);
    let created = !dir.exists();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("{}: cannot create the dataset folder", dir.display()))?;
    let result = fetch_into(manifest, &dir);
    if result.is_err() && created {
        // Only succeeds if the folder is still empty.
        let _ = std::fs::remove_dir(&dir);
    }
    result
}

fn fetch_into(manifest: &Manifest, dir: &Path) -> Result<FetchReport> {
    let dir = dir.to_path_buf();
    let agent = agent();
    let mut report = FetchReport::default();
    let unreachable = |err: anyhow::Error| {
        anyhow!(
            "{}: cannot download ({err:#}); {}",
            manifest.name,
            by_hand(manifest, &dir)
        )
    };

    if let Some(archive) = &manifest.archive {
        let missing: Vec<&ManifestFile> = manifest
            .files
            .iter()
            .filter(|f| !verified(&dir.join(&f.path), f))
            .collect();
        if missing.is_empty() {
            report
                .already_present
                .extend(manifest.files.iter().map(|f| dir.join(&f.path)));
            return Ok(report);
        }
        let (tmp, md5, _) = download(&agent, &archive.url, &dir).map_err(unreachable)?;
        if md5 != archive.md5 {
            bail!(
                "{}: md5 {md5}, expected {} (download corrupt or release changed)",
                archive.url,
                archive.md5
            );
        }
        // Unpack beside the final folder, then move each file into place.
        let staging = tempfile::Builder::new()
            .prefix(".unpack-")
            .tempdir_in(&dir)?;
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(tmp.path())?);
        tar::Archive::new(gz)
            .unpack(staging.path())
            .with_context(|| format!("{}: cannot unpack", archive.url))?;
        for file in &manifest.files {
            let target = dir.join(&file.path);
            let unpacked = staging.path().join(&file.path);
            if !verified(&unpacked, file) {
                bail!(
                    "{}: {} in the archive does not match datasets/{}.toml",
                    archive.url,
                    file.path,
                    manifest.name
                );
            }
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::rename(&unpacked, &target)
                .with_context(|| format!("{}: cannot move into place", target.display()))?;
            report.downloaded.push(target);
        }
        return Ok(report);
    }

    for file in manifest.files.iter().filter(|f| !f.derived) {
        let target = dir.join(&file.path);
        if verified(&target, file) {
            report.already_present.push(target);
            continue;
        }
        let mut last_error = None;
        for url in &file.urls {
            match download(&agent, url, &dir) {
                Ok((tmp, md5, sha256)) => {
                    let md5_ok = file.md5.as_ref().is_none_or(|m| *m == md5);
                    let sha_ok = file.sha256.as_ref().is_none_or(|s| *s == sha256);
                    if !(md5_ok && sha_ok) {
                        last_error = Some(anyhow!(
                            "{url}: checksum mismatch (md5 {md5}, sha256 {sha256})"
                        ));
                        continue;
                    }
                    tmp.persist(&target)
                        .with_context(|| format!("{}: cannot move into place", target.display()))?;
                    report.downloaded.push(target.clone());
                    last_error = None;
                    break;
                }
                Err(err) => last_error = Some(err),
            }
        }
        if let Some(err) = last_error {
            return Err(unreachable(err));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::catalog::manifest;

    #[test]
    fn offline_fetch_fails_fast_and_says_where_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = manifest("trec").unwrap();
        // An address that refuses at once on any machine: nothing listens on port 9 of loopback.
        for file in &mut m.files {
            file.urls = vec!["http://127.0.0.1:9/train_5500.label".into()];
        }
        let started = std::time::Instant::now();
        let err = format!("{:#}", fetch(&m, dir.path()).unwrap_err());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        assert!(err.starts_with("trec: cannot download"), "{err}");
        assert!(
            err.contains("train_5500.label")
                && err.contains(&dir.path().join("trec").display().to_string()),
            "{err}"
        );
        // Nothing half-written: no temporary download left in the folder.
        assert!(
            !dir.path().join("trec").exists(),
            "the folder made for the download stayed behind"
        );
    }
}
