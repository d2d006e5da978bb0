//! Backbone downloads against a hub emulator on 127.0.0.1 that answers as the Hugging Face hub
//! does for hf-hub's requests (ranged GET of `resolve/main/<file>`, `x-repo-commit`, `etag`, a
//! redirect with `x-linked-etag` to a CDN path for the weights): an empty cache is filled in
//! hf-hub's layout, a cut transfer is completed, `HF_HUB_OFFLINE` sends nothing, and "not found"
//! is said only for a 404.

use std::path::{Path, PathBuf};
use std::sync::Once;

use benign_attention::encoder::hub::{HubSettings, resolve_with};
use common::http::{Fault, Route, Server};
use sha2::{Digest, Sha256};

mod common;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "org/tiny-vit";

fn short_stall() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: set before any thread of this process reads the environment for a download.
        unsafe { std::env::set_var(benign_attention::data::download::STALL_SECS_ENV, "2") };
    });
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny_vit")
        .join(name)
}

fn sha256(path: &Path) -> String {
    benign_attention::io::hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

/// The emulator serving tests/fixtures/tiny_vit as `org/tiny-vit`: config.json directly, the
/// weights through a redirect to `/cdn/<sha256>`, nothing else (404s).
fn hub() -> (Server, tempfile::TempDir) {
    let empty = tempfile::tempdir().unwrap();
    let server = Server::start(empty.path().into());
    let commit = ("x-repo-commit".to_string(), COMMIT.to_string());
    server.route(
        &format!("{REPO}/resolve/main/config.json"),
        Route::File {
            path: fixture("config.json"),
            headers: vec![commit.clone(), ("ETag".into(), "\"a1b2c3\"".into())],
        },
    );
    let weights_sha = sha256(&fixture("model.safetensors"));
    server.route(
        &format!("{REPO}/resolve/main/model.safetensors"),
        Route::Redirect {
            location: format!("{}/cdn/{weights_sha}", server.url),
            headers: vec![
                commit,
                ("x-linked-etag".into(), format!("\"{weights_sha}\"")),
            ],
        },
    );
    server.route(
        &format!("cdn/{weights_sha}"),
        Route::File {
            path: fixture("model.safetensors"),
            headers: Vec::new(),
        },
    );
    (server, empty)
}

fn settings(server: &Server, cache: &Path, offline: bool) -> HubSettings {
    HubSettings {
        endpoint: server.url.clone(),
        cache: hf_hub::Cache::new(cache.to_path_buf()),
        offline,
    }
}

#[test]
fn an_empty_cache_is_filled_in_hf_hubs_layout_and_read_back_without_a_request() {
    short_stall();
    let (server, _root) = hub();
    let cache = tempfile::tempdir().unwrap();
    let files = resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap();
    assert!(
        files.source.starts_with("downloaded from"),
        "{}",
        files.source
    );
    assert_eq!(
        sha256(&files.weights),
        sha256(&fixture("model.safetensors"))
    );
    assert_eq!(sha256(&files.config), sha256(&fixture("config.json")));
    assert!(files.preprocessor.is_none() && files.tokenizer.is_none());
    // hf-hub's own cache reader finds the files.
    let repo = hf_hub::Cache::new(cache.path().into()).model(REPO.into());
    assert_eq!(repo.get("model.safetensors").unwrap(), files.weights);
    let asked = server.requests().len();
    let again = resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap();
    assert!(
        again.source.starts_with("Hugging Face cache"),
        "{}",
        again.source
    );
    assert_eq!(server.requests().len(), asked);
}

#[test]
fn a_cut_download_is_completed_and_a_failed_one_is_finished_by_the_next_run() {
    short_stall();
    let (server, _root) = hub();
    let weights_sha = sha256(&fixture("model.safetensors"));
    let cdn = format!("cdn/{weights_sha}");
    // Cut once: resumed with a Range within the same run.
    server.fault(&cdn, Fault::CloseAfter(1000));
    let cache = tempfile::tempdir().unwrap();
    resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap();
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path == cdn && r.range.as_deref() == Some("bytes=1000-")),
        "{:?}",
        server.requests()
    );

    // A hub that keeps failing: "download failed", config.json already cached; the next run
    // with a healthy hub completes the entry without clean-up.
    let cache = tempfile::tempdir().unwrap();
    server.fault(&cdn, Fault::Unavailable(usize::MAX));
    let err = format!(
        "{:#}",
        resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap_err()
    );
    assert!(
        err.contains("download failed") && !err.contains("not found"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    server.clear_faults();
    let files = resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap();
    assert_eq!(sha256(&files.weights), weights_sha);
}

#[test]
fn offline_sends_no_request_and_a_missing_repo_is_not_found() {
    short_stall();
    let (server, _root) = hub();
    let cache = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        resolve_with(REPO, None, &settings(&server, cache.path(), true)).unwrap_err()
    );
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("models folder"),
        "{err}"
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());

    let err = format!(
        "{:#}",
        resolve_with("org/absent", None, &settings(&server, cache.path(), false)).unwrap_err()
    );
    assert!(
        err.contains("not found") && err.contains("HTTP 404"),
        "{err}"
    );
}

#[test]
fn a_silent_hub_costs_the_stall_timeout() {
    short_stall();
    let (server, _root) = hub();
    server.fault(&format!("{REPO}/resolve/main/config.json"), Fault::Stall);
    let cache = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let err = format!(
        "{:#}",
        resolve_with(REPO, None, &settings(&server, cache.path(), false)).unwrap_err()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(err.contains("download failed"), "{err}");
}
