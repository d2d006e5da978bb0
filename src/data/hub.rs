//! The Hugging Face hub's file protocol, shared by the backbones (`encoder::hub`) and the
//! datasets of `hf:` sources ([`super::own`]): where the hub is and whether it may be asked
//! (the environment the Hugging Face tools share), one file into the hub cache in hf-hub's layout,
//! and a repository's file listing.

use std::path::{Path, PathBuf};

/// Where and whether the hub is asked, from the environment the Hugging Face tools share:
/// `HF_ENDPOINT`, `HF_HOME` (its `hub/` folder is the cache) and `HF_HUB_OFFLINE`.
#[derive(Clone, Debug)]
pub struct HubSettings {
    pub endpoint: String,
    pub cache: hf_hub::Cache,
    /// No request at all.
    pub offline: bool,
}

impl HubSettings {
    pub fn from_env() -> Self {
        Self {
            endpoint: std::env::var("HF_ENDPOINT")
                .ok()
                .filter(|e| !e.trim().is_empty())
                .unwrap_or_else(|| "https://huggingface.co".into()),
            cache: hf_hub::Cache::from_env(),
            offline: std::env::var("HF_HUB_OFFLINE")
                .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
        }
    }
}

/// Why a file did not come from the hub.
pub enum HubError {
    /// HTTP 404: the repository or the file is not there.
    NotFound,
    /// Anything else, said once.
    Failed(String),
}

/// What the hub says of one file before it is fetched (hf-hub's protocol: a ranged request for
/// byte 0 of `resolve/main/<file>`, relative redirects followed, the commit and etag from the
/// headers, the size from `Content-Range`, through the CDN for a large file).
struct HubMetadata {
    commit: String,
    etag: String,
    size: u64,
}

fn hub_metadata(agent: &ureq::Agent, url: &str) -> std::result::Result<HubMetadata, HubError> {
    let no_redirects = crate::data::download::agent_without_redirects();
    let ask = |agent: &ureq::Agent, url: &str| match agent.get(url).set("Range", "bytes=0-0").call()
    {
        Ok(r) => Ok(r),
        Err(ureq::Error::Status(404, _)) => Err(HubError::NotFound),
        Err(ureq::Error::Status(code, r)) if (300..400).contains(&code) => Ok(r),
        Err(e) => Err(HubError::Failed(e.to_string())),
    };
    let mut response = ask(&no_redirects, url)?;
    let mut url = url.to_string();
    for _ in 0..5 {
        let Some(location) = response
            .header("Location")
            .filter(|_| (300..400).contains(&response.status()))
            .map(str::to_string)
        else {
            break;
        };
        if location.starts_with('/') {
            let origin = url.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
            url = format!("{origin}{location}");
            response = ask(&no_redirects, &url)?;
        } else {
            break;
        }
    }
    let header = |name: &str| response.header(name).map(|v| v.replace('"', ""));
    let etag = header("x-linked-etag")
        .or_else(|| header("etag"))
        .ok_or_else(|| HubError::Failed(format!("{url}: no etag header")))?;
    let commit = header("x-repo-commit")
        .ok_or_else(|| HubError::Failed(format!("{url}: no x-repo-commit header")))?;
    // A redirect to the CDN: the size comes from there.
    let sized = match response.header("Location") {
        Some(location) if (300..400).contains(&response.status()) => ask(agent, location)?,
        _ => response,
    };
    let size = sized
        .header("Content-Range")
        .and_then(|r| r.rsplit('/').next())
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| HubError::Failed(format!("{url}: no Content-Range header")))?;
    Ok(HubMetadata { commit, etag, size })
}

/// One file of `repo` (a model's or a dataset's, at its revision) into the Hugging Face cache,
/// laid out as hf-hub lays it (blobs/<etag>, snapshots/<commit>/<file> linking it,
/// refs/<revision>), so that hf-hub and the Python tools read it too; resumed after a cut
/// transfer or a killed process, with timeouts (data::download).
pub fn hub_file(
    hub: &HubSettings,
    repo: &hf_hub::Repo,
    name: &str,
) -> std::result::Result<PathBuf, HubError> {
    let agent = super::download::agent();
    let url = format!(
        "{}/{}/resolve/{}/{name}",
        hub.endpoint.trim_end_matches('/'),
        repo.url(),
        repo.url_revision()
    );
    let meta = hub_metadata(&agent, &url)?;
    let failed = |e: std::io::Error| HubError::Failed(e.to_string());
    let cached = hub.cache.repo(repo.clone());
    let blob = hub
        .cache
        .path()
        .join(repo.folder_name())
        .join("blobs")
        .join(&meta.etag);
    std::fs::create_dir_all(blob.parent().unwrap_or(Path::new("."))).map_err(failed)?;
    // LFS files' etag is their sha256: the download is checked against it.
    let is_sha256 = meta.etag.len() == 64 && meta.etag.bytes().all(|b| b.is_ascii_hexdigit());
    let expected = super::manifest::ManifestFile {
        path: name.to_string(),
        urls: Vec::new(),
        md5: None,
        sha256: is_sha256.then(|| meta.etag.clone()),
        bytes: Some(meta.size),
        derived: false,
    };
    if !super::manifest::check_file(&blob, &expected).is_ok_and(|s| s.is_ok()) {
        eprintln!(
            "{}: downloading {name} ({:.1} MB) from {}",
            repo.url(),
            meta.size as f64 / 1e6,
            hub.endpoint
        );
        super::download::download(&agent, std::slice::from_ref(&url), &expected, &blob)
            .map_err(|outcomes| HubError::Failed(outcomes.join("; ")))?;
    }
    let pointer = blob
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .join("snapshots")
        .join(&meta.commit)
        .join(name);
    std::fs::create_dir_all(pointer.parent().unwrap_or(Path::new("."))).map_err(failed)?;
    let _ = std::fs::remove_file(&pointer);
    // The link climbs from snapshots/<commit>/<file>'s folder to the repository's blobs/.
    let depth = Path::new(name).components().count();
    let up: PathBuf = std::iter::repeat_n("..", depth + 1).collect();
    std::os::unix::fs::symlink(up.join("blobs").join(&meta.etag), &pointer).map_err(failed)?;
    cached.create_ref(&meta.commit).map_err(failed)?;
    Ok(pointer)
}

/// The files of `repo` at its revision, as the hub's API lists them (`GET
/// /api/<kind>/<id>/revision/<revision>`, its `siblings`), and the commit they belong to.
pub fn list_files(
    hub: &HubSettings,
    repo: &hf_hub::Repo,
) -> std::result::Result<(String, Vec<String>), HubError> {
    let url = format!(
        "{}/api/{}",
        hub.endpoint.trim_end_matches('/'),
        repo.api_url()
    );
    let response = match super::download::agent().get(&url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(404, _)) => return Err(HubError::NotFound),
        Err(e) => return Err(HubError::Failed(format!("{url}: {e}"))),
    };
    #[derive(serde::Deserialize)]
    struct Sibling {
        rfilename: String,
    }
    #[derive(serde::Deserialize)]
    struct Info {
        sha: String,
        siblings: Vec<Sibling>,
    }
    let info: Info = response
        .into_json()
        .map_err(|e| HubError::Failed(format!("{url}: not the hub's repository listing ({e})")))?;
    Ok((
        info.sha,
        info.siblings.into_iter().map(|s| s.rfilename).collect(),
    ))
}
