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

/// The mirror's ViT-Ti written back in timm's hub format (timm names, fused qkv, timm's
/// config.json), into `dir`.
fn as_timm_checkpoint(hf_folder: &Path, dir: &Path) {
    use candle_core::Tensor;
    let hf = candle_core::safetensors::load(
        hf_folder.join("model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let mut timm = std::collections::HashMap::new();
    let mut put = |to: &str, from: &str| {
        timm.insert(to.to_string(), hf[from].clone());
    };
    put("cls_token", "embeddings.cls_token");
    put("pos_embed", "embeddings.position_embeddings");
    let layers = (0..)
        .take_while(|i| hf.contains_key(&format!("encoder.layer.{i}.layernorm_before.weight")))
        .count();
    for p in ["weight", "bias"] {
        put(
            &format!("patch_embed.proj.{p}"),
            &format!("embeddings.patch_embeddings.projection.{p}"),
        );
        put(&format!("norm.{p}"), &format!("layernorm.{p}"));
        put(&format!("head.{p}"), &format!("classifier.{p}"));
        for i in 0..layers {
            for (to, from) in [
                ("norm1", "layernorm_before"),
                ("attn.proj", "attention.output.dense"),
                ("norm2", "layernorm_after"),
                ("mlp.fc1", "intermediate.dense"),
                ("mlp.fc2", "output.dense"),
            ] {
                put(
                    &format!("blocks.{i}.{to}.{p}"),
                    &format!("encoder.layer.{i}.{from}.{p}"),
                );
            }
        }
    }
    for i in 0..layers {
        for p in ["weight", "bias"] {
            let parts: Vec<Tensor> = ["query", "key", "value"]
                .iter()
                .map(|n| hf[&format!("encoder.layer.{i}.attention.attention.{n}.{p}")].clone())
                .collect();
            timm.insert(
                format!("blocks.{i}.attn.qkv.{p}"),
                Tensor::cat(&parts, 0).unwrap(),
            );
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    candle_core::safetensors::save(&timm, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architecture": "vit_tiny_patch16_224", "num_classes": 1000, "num_features": 192,
            "global_pool": "token", "pretrained_cfg": {"tag": "augreg_in21k_ft_in1k",
            "input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.9,
            "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": 1000}}"#,
    )
    .unwrap();
}

/// With an empty Hugging Face cache and `HF_ENDPOINT` at a hub holding ViT-Ti in timm's format,
/// `extract` downloads it, loads it and computes the features of the mirror's converted copy.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn extract_downloads_a_timm_format_vit_and_computes_the_mirrors_features() {
    use benign_attention::encoder::hub::{BackboneFiles, resolve};
    use benign_attention::encoder::{Backbone, TextOptions};
    short_stall();
    let Some((data, models)) = common::data_and_models_roots(
        "hub::extract_downloads_a_timm_format_vit_and_computes_the_mirrors_features",
        &["medmnist"],
    ) else {
        return;
    };
    let repo = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k";
    let mirror = models.join(repo);
    let work = tempfile::tempdir().unwrap();
    let timm_dir = work.path().join("timm-format");
    as_timm_checkpoint(&mirror, &timm_dir);
    let server = Server::start(work.path().join("nothing"));
    let commit = ("x-repo-commit".to_string(), COMMIT.to_string());
    server.route(
        &format!("{repo}/resolve/main/config.json"),
        Route::File {
            path: timm_dir.join("config.json"),
            headers: vec![commit.clone(), ("ETag".into(), "\"c0ffee\"".into())],
        },
    );
    let sha = sha256(&timm_dir.join("model.safetensors"));
    server.route(
        &format!("{repo}/resolve/main/model.safetensors"),
        Route::Redirect {
            location: format!("{}/cdn/{sha}", server.url),
            headers: vec![commit, ("x-linked-etag".into(), format!("\"{sha}\""))],
        },
    );
    server.route(
        &format!("cdn/{sha}"),
        Route::File {
            path: timm_dir.join("model.safetensors"),
            headers: Vec::new(),
        },
    );
    let hf_home = work.path().join("hf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args([
            "extract",
            "--dataset",
            "breastmnist",
            "--split",
            "test",
            "--limit",
            "4",
        ])
        .args(["--backbone", repo, "--data-dir"])
        .arg(&data)
        .arg("--cache-dir")
        .arg(work.path().join("cache"))
        .env_remove("BENIGN_MODELS_DIR")
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_ENDPOINT", &server.url)
        .env("HF_HOME", &hf_home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("downloading model.safetensors"), "{stderr}");

    // The downloaded timm checkpoint and the mirror's Hugging Face copy give the same features.
    let downloaded = hf_hub::Cache::new(hf_home.join("hub")).model(repo.into());
    let timm_files = BackboneFiles {
        id: repo.into(),
        config: downloaded.get("config.json").unwrap(),
        weights: downloaded.get("model.safetensors").unwrap(),
        preprocessor: None,
        tokenizer: None,
        source: "downloaded".into(),
    };
    let device = candle_core::Device::Cpu;
    let timm = Backbone::load(timm_files, &device, TextOptions::default()).unwrap();
    let hf = Backbone::load(
        resolve(mirror.to_str().unwrap(), None).unwrap(),
        &device,
        TextOptions::default(),
    )
    .unwrap();
    let dataset =
        benign_attention::data::load(&benign_attention::data::DatasetName::BreastMnist, &data)
            .unwrap();
    let (a, b) = (
        timm.encode(&dataset.test.inputs, &[0, 1, 2, 3]).unwrap(),
        hf.encode(&dataset.test.inputs, &[0, 1, 2, 3]).unwrap(),
    );
    for (name, x, y) in [
        ("cls", &a.cls, &b.cls),
        ("layer inputs", &a.layer_inputs, &b.layer_inputs),
    ] {
        let diff = common::max_abs_diff(x, y);
        assert!(diff < 1e-5, "{name}: max |Δ| = {diff}");
    }
}

/// A repository whose main branch holds only `pytorch_model.bin` (no safetensors): its weights are
/// downloaded and used.
#[test]
fn a_repository_with_only_pytorch_weights_is_downloaded() {
    short_stall();
    let empty = tempfile::tempdir().unwrap();
    let server = Server::start(empty.path().into());
    let commit = ("x-repo-commit".to_string(), COMMIT.to_string());
    let repo = "org/old-vit";
    server.route(
        &format!("{repo}/resolve/main/config.json"),
        Route::File {
            path: fixture("config.json"),
            headers: vec![commit.clone(), ("ETag".into(), "\"cfg\"".into())],
        },
    );
    let bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_vit_bin/pytorch_model.bin");
    server.route(
        &format!("{repo}/resolve/main/pytorch_model.bin"),
        Route::File {
            path: bin.clone(),
            headers: vec![commit, ("ETag".into(), "\"bin\"".into())],
        },
    );
    let cache = tempfile::tempdir().unwrap();
    let files = resolve_with(repo, None, &settings(&server, cache.path(), false)).unwrap();
    assert!(
        files.weights.ends_with("pytorch_model.bin"),
        "{}",
        files.weights.display()
    );
    assert_eq!(sha256(&files.weights), sha256(&bin));
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("model.safetensors"))
    );
}

/// The emulator speaks hf-hub's protocol as hf-hub itself reads it: hf-hub's own client
/// downloads both files from it (so the emulator is not just our reading of the protocol).
#[test]
fn hf_hubs_own_client_downloads_from_the_emulator() {
    let (server, _root) = hub();
    let cache = tempfile::tempdir().unwrap();
    let api = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(cache.path().into()))
        .with_endpoint(server.url.clone())
        .with_progress(false)
        .build()
        .unwrap();
    let repo = api.model(REPO.into());
    let config = repo.get("config.json").unwrap();
    let weights = repo.get("model.safetensors").unwrap();
    assert_eq!(sha256(&config), sha256(&fixture("config.json")));
    assert_eq!(sha256(&weights), sha256(&fixture("model.safetensors")));
}
