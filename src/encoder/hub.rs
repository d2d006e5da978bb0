//! Finds a backbone's files for a hub id, in order: a plain directory path; the models folder
//! (`--models-dir`, else `BENIGN_MODELS_DIR`) as `<org>/<name>/`; the Hugging Face cache through
//! hf-hub; a download through hf-hub. When nothing is found, one error lists every place searched.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

pub const MODELS_DIR_ENV: &str = "BENIGN_MODELS_DIR";

/// The files of one checkpoint in Hugging Face layout.
#[derive(Clone, Debug)]
pub struct BackboneFiles {
    /// The id it was asked for.
    pub id: String,
    pub config: PathBuf,
    pub weights: PathBuf,
    /// `preprocessor_config.json` (ViT).
    pub preprocessor: Option<PathBuf>,
    /// `tokenizer.json` (BERT).
    pub tokenizer: Option<PathBuf>,
    /// Where it was found, in words.
    pub source: String,
}

/// `--models-dir`, else `$BENIGN_MODELS_DIR`.
pub fn models_root(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(MODELS_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// Old short ids the hub redirects to their organisation.
fn canonical(id: &str) -> &str {
    match id {
        "bert-base-uncased" => "google-bert/bert-base-uncased",
        "all-MiniLM-L6-v2" => "sentence-transformers/all-MiniLM-L6-v2",
        other => other,
    }
}

const WEIGHTS: &str = "model.safetensors";

/// The files in a checkpoint folder; errors when config.json is there but no weights are.
fn from_dir(id: &str, dir: &Path, source: String) -> Result<BackboneFiles> {
    let config = dir.join("config.json");
    if !config.is_file() {
        bail!("{id}: {} has no config.json", dir.display());
    }
    let weights = dir.join(WEIGHTS);
    if !weights.is_file() {
        let hint = if dir.join("pytorch_model.bin").is_file() {
            "only pytorch_model.bin is there; convert it to model.safetensors"
        } else {
            "the weights are missing; put the checkpoint's model.safetensors beside it"
        };
        bail!(
            "{id}: {} has config.json but no {WEIGHTS}: {hint}",
            dir.display()
        );
    }
    let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    Ok(BackboneFiles {
        id: id.to_string(),
        config,
        weights,
        preprocessor: optional("preprocessor_config.json"),
        tokenizer: optional("tokenizer.json"),
        source,
    })
}

/// Whether the hub answers at all (a HEAD with a short timeout), so that offline runs fail in
/// seconds instead of waiting on hf-hub's defaults.
fn hub_reachable(endpoint: &str) -> Result<()> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build();
    match agent.head(endpoint).call() {
        Ok(_) | Err(ureq::Error::Status(..)) => Ok(()),
        Err(e) => Err(anyhow!("{e}")),
    }
}

pub fn resolve(id: &str, models_dir: Option<&Path>) -> Result<BackboneFiles> {
    let mut searched = Vec::new();
    let as_path = Path::new(id);
    if as_path.is_dir() {
        return from_dir(id, as_path, format!("directory {}", as_path.display()));
    }
    let repo_id = canonical(id);
    match models_root(models_dir) {
        Some(root) => {
            let dir = root.join(repo_id);
            if dir.is_dir() {
                return from_dir(id, &dir, format!("models folder {}", dir.display()));
            }
            searched.push(format!("{} (models folder)", dir.display()));
        }
        None => searched.push(format!(
            "no models folder (--models-dir / {MODELS_DIR_ENV} unset)"
        )),
    }

    let cache = hf_hub::Cache::from_env();
    let cached = cache.model(repo_id.to_string());
    if let Some(config) = cached.get("config.json") {
        let dir = config
            .parent()
            .expect("a cached file has a folder")
            .to_path_buf();
        let weights = cached.get(WEIGHTS).ok_or_else(|| {
            anyhow!(
                "{id}: the Hugging Face cache has config.json ({}) but no {WEIGHTS}",
                config.display()
            )
        })?;
        return Ok(BackboneFiles {
            id: id.to_string(),
            config,
            weights,
            preprocessor: cached.get("preprocessor_config.json"),
            tokenizer: cached.get("tokenizer.json"),
            source: format!("Hugging Face cache {}", dir.display()),
        });
    }
    searched.push(format!("{} (Hugging Face cache)", cache.path().display()));

    let offline =
        std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let download = if offline {
        Err(anyhow!("HF_HUB_OFFLINE is set"))
    } else {
        hub_reachable(&endpoint).and_then(|()| {
            let api = hf_hub::api::sync::ApiBuilder::from_env()
                .with_progress(true)
                .build()?;
            let repo = api.model(repo_id.to_string());
            let config = repo.get("config.json")?;
            let weights = repo.get(WEIGHTS)?;
            Ok(BackboneFiles {
                id: id.to_string(),
                config,
                weights,
                preprocessor: repo.get("preprocessor_config.json").ok(),
                tokenizer: repo.get("tokenizer.json").ok(),
                source: format!("downloaded from {endpoint}"),
            })
        })
    };
    match download {
        Ok(files) => Ok(files),
        Err(e) => {
            searched.push(format!("{endpoint} ({e:#})"));
            bail!(
                "{id}: backbone not found; searched {}. Put the checkpoint folder (config.json, {WEIGHTS}, \
                 preprocessor_config.json or tokenizer.json) under the models folder as {repo_id}/",
                searched.join("; ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_missing_next_to_a_config_is_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("org/name");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let err = resolve("org/name", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("org/name") && err.contains("no model.safetensors"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1);
        std::fs::write(model.join("model.safetensors"), b"").unwrap();
        let files = resolve("org/name", Some(dir.path())).unwrap();
        assert!(files.source.contains("models folder"));
        let files = resolve(model.to_str().unwrap(), None).unwrap();
        assert!(files.source.starts_with("directory"));
    }
}
