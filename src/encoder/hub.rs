//! Finds a backbone's files for a hub id, in order: a plain directory path; the models folder
//! (`--models-dir`, else `BENIGN_MODELS_DIR`) as `<org>/<name>/`; the Hugging Face cache through
//! hf-hub (an incomplete entry is completed); a download from the hub (`HF_ENDPOINT`), into the
//! same cache, resumable and with timeouts; none with `HF_HUB_OFFLINE`. A file the hub does not
//! have is "not found"; any other failure is "download failed", with its cause once.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

pub use crate::data::hub::HubSettings;
use crate::data::hub::{HubError, hub_file};

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
/// The weights of older checkpoints that hold no safetensors file; read only where `WEIGHTS` is
/// absent.
const PYTORCH_WEIGHTS: &str = "pytorch_model.bin";

/// The files in a checkpoint folder; errors when config.json is there but no weights are.
fn from_dir(id: &str, dir: &Path, source: String) -> Result<BackboneFiles> {
    let config = dir.join("config.json");
    if !crate::io::is_present(&config) {
        bail!("{id}: {} has no config.json", dir.display());
    }
    // Present is enough here: what is not a readable file is refused, naming it, when read.
    let weights = [WEIGHTS, PYTORCH_WEIGHTS]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| crate::io::is_present(p));
    let Some(weights) = weights else {
        bail!(
            "{id}: {} has config.json but no {WEIGHTS} (nor {PYTORCH_WEIGHTS}): the weights are \
             missing; put the checkpoint's {WEIGHTS} beside it",
            dir.display()
        );
    };
    let optional = |name: &str| Some(dir.join(name)).filter(|p| crate::io::is_present(p));
    Ok(BackboneFiles {
        id: id.to_string(),
        config,
        weights,
        preprocessor: optional("preprocessor_config.json"),
        tokenizer: optional("tokenizer.json"),
        source,
    })
}

/// The checkpoint's files, required first.
const HUB_FILES: [(&str, bool); 4] = [
    ("config.json", true),
    (WEIGHTS, true),
    ("preprocessor_config.json", false),
    ("tokenizer.json", false),
];

/// Finds the backbone `id` (see the module's order) with the hub settings of the environment.
/// The files of `id` when they are on this machine already (a folder, or the models folder),
/// found without the hub: for estimates made before any backbone loads.
pub fn local_files(id: &str, models_dir: Option<&Path>) -> Option<BackboneFiles> {
    let as_path = Path::new(id);
    if as_path.is_dir() {
        return from_dir(id, as_path, String::new()).ok();
    }
    let dir = models_root(models_dir)?.join(canonical(id));
    from_dir(id, &dir, String::new()).ok()
}

pub fn resolve(id: &str, models_dir: Option<&Path>) -> Result<BackboneFiles> {
    resolve_with(id, models_dir, &HubSettings::from_env())
}

pub fn resolve_with(
    id: &str,
    models_dir: Option<&Path>,
    hub: &HubSettings,
) -> Result<BackboneFiles> {
    let mut searched = Vec::new();
    let as_path = Path::new(id);
    if as_path.is_dir() {
        return from_dir(id, as_path, format!("directory {}", as_path.display()));
    }
    let repo_id = canonical(id);
    match models_root(models_dir) {
        Some(root) => {
            if std::fs::metadata(&root).is_ok_and(|meta| !meta.is_dir()) {
                bail!(
                    "{}: the models folder (--models-dir or {MODELS_DIR_ENV}) is not a folder",
                    root.display()
                );
            }
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
    // A complete cache entry; an incomplete one (a download cut short) is completed below.
    if let Some(files) = from_hf_cache(id, repo_id, hub) {
        return Ok(files);
    }
    searched.push(format!(
        "{} (Hugging Face cache)",
        hub.cache.path().display()
    ));
    if hub.offline {
        bail!(
            "{id}: backbone not found and HF_HUB_OFFLINE is set, so the hub was not asked; searched {}. \
             Put the checkpoint folder under the models folder as {repo_id}/, or unset HF_HUB_OFFLINE",
            searched.join("; ")
        );
    }
    download(id, repo_id, hub, &searched)
}

/// The backbone's files from the Hugging Face cache, when the entry holds a config and weights.
fn from_hf_cache(id: &str, repo_id: &str, hub: &HubSettings) -> Option<BackboneFiles> {
    let cached = hub.cache.model(repo_id.to_string());
    let cached_weights = cached.get(WEIGHTS).or_else(|| cached.get(PYTORCH_WEIGHTS));
    let (config, weights) = (cached.get("config.json")?, cached_weights?);
    let folder = config.parent().map_or_else(PathBuf::new, Path::to_path_buf);
    Some(BackboneFiles {
        id: id.to_string(),
        config,
        weights,
        preprocessor: cached.get("preprocessor_config.json"),
        tokenizer: cached.get("tokenizer.json"),
        source: format!("Hugging Face cache {}", folder.display()),
    })
}

/// The backbone's files downloaded from the hub (into its cache), the optional ones where the
/// repository has them; `searched` names where they were looked for first.
fn download(
    id: &str,
    repo_id: &str,
    hub: &HubSettings,
    searched: &[String],
) -> Result<BackboneFiles> {
    let mut found = Vec::new();
    for (name, required) in HUB_FILES {
        let repo = hf_hub::Repo::model(repo_id.to_string());
        let fetched = match hub_file(hub, &repo, name) {
            // An older repository may hold only PyTorch's weights.
            Err(HubError::NotFound) if name == WEIGHTS => hub_file(hub, &repo, PYTORCH_WEIGHTS),
            other => other,
        };
        match fetched {
            Ok(path) => found.push(Some(path)),
            Err(HubError::NotFound) if !required => found.push(None),
            Err(HubError::NotFound) => bail!(
                "{id}: not found: {}/{repo_id} has no {name} (HTTP 404); searched {}",
                hub.endpoint,
                searched.join("; ")
            ),
            Err(HubError::Failed(why)) => bail!("{id}: download failed: {name}: {why}"),
        }
    }
    let [config, weights, preprocessor, tokenizer] = <[Option<PathBuf>; 4]>::try_from(found)
        .map_err(|_| anyhow!("{id}: internal: four files expected"))?;
    Ok(BackboneFiles {
        id: id.to_string(),
        config: config.context("config.json")?,
        weights: weights.context(WEIGHTS)?,
        preprocessor,
        tokenizer,
        source: format!("downloaded from {}", hub.endpoint),
    })
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
