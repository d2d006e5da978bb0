//! Feature cache: each image or sentence goes through a frozen backbone once per backbone,
//! whatever split, seed or grid later asks for it.
//!
//! Layout: `<root>/<backbone>-<weights sha256[..12]>/<preprocessing hash>/<dataset>/<split>/`
//! holds shards, each a safetensors file of features for a set of samples and a JSON sidecar with
//! its full key (backbone id + weights sha256, preprocessing, dataset, split, the samples' release
//! indices, contents). Samples are identified by their release index, so a cache stays valid
//! when more of a partial dataset arrives. A shard is trusted only when its sidecar names it and
//! its tensors have the promised shapes; both files are written to temporary names and renamed,
//! the sidecar last, so a killed extraction leaves nothing a later run would trust. A shard that
//! fails to load is deleted and its samples recomputed, with a warning.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::backbone::{Backbone, Encoded};
use crate::data::Split;
use crate::data::files::sha256_hex;

pub const CACHE_DIR_ENV: &str = "BENIGN_CACHE_DIR";
const FORMAT_VERSION: u32 = 1;
/// Samples per shard written by one extraction.
const SHARD_SAMPLES: usize = 1024;

/// What is stored per sample.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Contents {
    /// The final CLS / position-0 feature, the mean final token (and BERT's pooler output):
    /// phase 1.
    Cls,
    /// Also the hidden states entering the last layer (and the text mask): phase 2 and head mode.
    Full,
}

/// Features of requested samples, in request order.
pub struct Features {
    pub release_index: Vec<usize>,
    /// (N, D).
    pub cls: Tensor,
    /// (N, D), BERT checkpoints with a pooler.
    pub pooled: Option<Tensor>,
    /// Mean of the final tokens over attended positions, (N, D).
    pub mean: Tensor,
    /// (N, T, D), with `Contents::Full`.
    pub layer_inputs: Option<Tensor>,
    /// (N, T) u32, text with `Contents::Full`.
    pub attention_mask: Option<Tensor>,
}

#[derive(Debug, Default)]
pub struct CacheStats {
    pub from_cache: usize,
    pub computed: usize,
    /// One line per shard that could not be trusted and was rebuilt.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ShardKey {
    version: u32,
    backbone: String,
    weights_sha256: String,
    preprocessing: String,
    dataset: String,
    split: String,
    contents: Contents,
    release_index: Vec<usize>,
}

impl ShardKey {
    fn file_stem(&self) -> String {
        let json = serde_json::to_vec(self).expect("keys serialise");
        format!("shard-{}", &sha256_hex(&json)[..16])
    }
}

pub struct FeatureCache {
    root: PathBuf,
}

/// `--cache-dir`, else `$BENIGN_CACHE_DIR`, else the platform cache folder + benign-attention.
pub fn cache_root(flag: Option<&Path>) -> PathBuf {
    if let Some(dir) = flag {
        return dir.to_path_buf();
    }
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("benign-attention")
}

fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl FeatureCache {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    fn dir(&self, backbone: &Backbone, dataset: &str, split: &str) -> PathBuf {
        let prep = sha256_hex(backbone.preprocessing_fingerprint().as_bytes());
        self.root
            .join(format!(
                "{}-{}",
                slug(&backbone.files.id),
                &backbone.weights_sha256[..12]
            ))
            .join(&prep[..12])
            .join(slug(dataset))
            .join(split)
    }

    /// Features of `positions` of `data` (split `split` of `dataset`), computing only the samples
    /// no trusted shard holds, `batch_size` at a time; `on_computed` gets each batch's size.
    #[allow(clippy::too_many_arguments)]
    pub fn features(
        &self,
        backbone: &Backbone,
        dataset: &str,
        split: &str,
        data: &Split,
        positions: &[usize],
        contents: Contents,
        batch_size: usize,
        on_computed: &mut dyn FnMut(usize),
    ) -> Result<(Features, CacheStats)> {
        let dir = self.dir(backbone, dataset, split);
        let mut stats = CacheStats::default();
        let key_of = |contents: Contents, release_index: Vec<usize>| ShardKey {
            version: FORMAT_VERSION,
            backbone: backbone.files.id.clone(),
            weights_sha256: backbone.weights_sha256.clone(),
            preprocessing: backbone.preprocessing_fingerprint(),
            dataset: dataset.to_string(),
            split: split.to_string(),
            contents,
            release_index,
        };

        // Trusted shards that cover the request's contents, loaded; untrusted ones removed.
        let mut shards: Vec<(ShardKey, HashMap<String, Tensor>)> = Vec::new();
        for (key, tensors_path, sidecar) in read_sidecars(&dir) {
            // Features of another network under this one's folder: a copied or renamed cache.
            // Recomputing beside them would hide the mix-up, so stop.
            if (&key.backbone, &key.weights_sha256)
                != (&backbone.files.id, &backbone.weights_sha256)
            {
                bail!(
                    "{}: cached features of another backbone ({} weights {}), not {} weights {}; delete that folder or choose another --cache-dir",
                    sidecar.display(),
                    key.backbone,
                    &key.weights_sha256[..12.min(key.weights_sha256.len())],
                    backbone.files.id,
                    &backbone.weights_sha256[..12],
                );
            }
            let expected = key_of(key.contents, key.release_index.clone());
            if key != expected || key.contents < contents {
                continue;
            }
            match load_shard(&tensors_path, &key, backbone.hidden_size()) {
                Ok(tensors) => shards.push((key, tensors)),
                Err(err) => {
                    stats.warnings.push(format!(
                        "{}: {err:#}; rebuilding its samples",
                        tensors_path.display()
                    ));
                    let _ = std::fs::remove_file(&sidecar);
                    let _ = std::fs::remove_file(&tensors_path);
                }
            }
        }
        let mut location: HashMap<usize, (usize, usize)> = HashMap::new();
        for (s, (key, _)) in shards.iter().enumerate() {
            for (row, &r) in key.release_index.iter().enumerate() {
                location.entry(r).or_insert((s, row));
            }
        }

        // Compute what is missing, once per sample, and store it as a new shard.
        let mut missing: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|&p| !location.contains_key(&data.release_index[p]))
            .collect();
        missing.sort_unstable_by_key(|&p| data.release_index[p]);
        missing.dedup_by_key(|p| data.release_index[*p]);
        // A shard per SHARD_SAMPLES, so an interrupted extraction keeps what it finished.
        for part in missing.chunks(SHARD_SAMPLES) {
            let mut encoded: Vec<Encoded> = Vec::new();
            for chunk in part.chunks(batch_size.max(1)) {
                encoded.push(backbone.encode(&data.inputs, chunk)?);
                on_computed(chunk.len());
            }
            let key = key_of(
                contents,
                part.iter().map(|&p| data.release_index[p]).collect(),
            );
            let tensors = shard_tensors(&encoded, contents)?;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("{}: cannot create the cache folder", dir.display()))?;
            write_shard(&dir, &key, &tensors)?;
            stats.computed += part.len();
            let s = shards.len();
            for (row, &r) in key.release_index.iter().enumerate() {
                location.insert(r, (s, row));
            }
            shards.push((key, tensors));
        }
        stats.from_cache = positions.len() - stats.computed.min(positions.len());

        // Gather rows in request order: one index_select per shard, then one to restore order.
        let mut by_shard: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
        for (k, &p) in positions.iter().enumerate() {
            let (s, row) = location[&data.release_index[p]];
            by_shard.entry(s).or_default().push((k, row as u32));
        }
        let mut restore = vec![0u32; positions.len()];
        let mut next = 0u32;
        for rows in by_shard.values() {
            for &(k, _) in rows {
                restore[k] = next;
                next += 1;
            }
        }
        let restore = Tensor::new(restore, &Device::Cpu)?;
        let gather = |name: &str| -> Result<Option<Tensor>> {
            if !by_shard.keys().all(|&s| shards[s].1.contains_key(name)) {
                return Ok(None);
            }
            let pieces: Vec<Tensor> = by_shard
                .iter()
                .map(|(&s, rows)| {
                    let idx = Tensor::new(
                        rows.iter().map(|&(_, r)| r).collect::<Vec<u32>>(),
                        &Device::Cpu,
                    )?;
                    shards[s].1[name].index_select(&idx, 0)
                })
                .collect::<candle_core::Result<_>>()?;
            Ok(Some(Tensor::cat(&pieces, 0)?.index_select(&restore, 0)?))
        };
        let wants_full = contents == Contents::Full;
        let features = Features {
            release_index: positions.iter().map(|&p| data.release_index[p]).collect(),
            cls: gather("cls")?.context("cache shards lack the cls feature")?,
            pooled: gather("pooled")?,
            mean: gather("mean")?.context("cache shards lack the mean feature")?,
            layer_inputs: if wants_full {
                gather("layer_inputs")?
            } else {
                None
            },
            attention_mask: if wants_full {
                gather("attention_mask")?
            } else {
                None
            },
        };
        Ok((features, stats))
    }
}

/// Every `shard-*.json` in `dir` that parses: (key, tensors path, sidecar path).
fn read_sidecars(dir: &Path) -> Vec<(ShardKey, PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: BTreeMap<PathBuf, (ShardKey, PathBuf)> = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if !(name.starts_with("shard-") && name.ends_with(".json")) {
            continue;
        }
        let Some(key) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<ShardKey>(&b).ok())
        else {
            continue;
        };
        // A sidecar only vouches for the shard its key names.
        if Some(key.file_stem().as_str()) != path.file_stem().and_then(|s| s.to_str()) {
            continue;
        }
        let tensors = path.with_extension("safetensors");
        found.insert(path, (key, tensors));
    }
    found
        .into_iter()
        .map(|(sidecar, (key, tensors))| (key, tensors, sidecar))
        .collect()
}

fn load_shard(path: &Path, key: &ShardKey, hidden: usize) -> Result<HashMap<String, Tensor>> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu).context("unreadable")?;
    let n = key.release_index.len();
    for name in ["cls", "mean"] {
        let t = tensors
            .get(name)
            .with_context(|| format!("no {name} tensor"))?;
        if t.dims() != [n, hidden] {
            bail!("{name} has shape {:?}, expected [{n}, {hidden}]", t.dims());
        }
    }
    if key.contents == Contents::Full {
        let inputs = tensors
            .get("layer_inputs")
            .context("no layer_inputs tensor")?;
        if inputs.rank() != 3 || inputs.dim(0)? != n || inputs.dim(2)? != hidden {
            bail!("layer_inputs has shape {:?} for {n} samples", inputs.dims());
        }
    }
    Ok(tensors)
}

fn shard_tensors(parts: &[Encoded], contents: Contents) -> Result<HashMap<String, Tensor>> {
    let cat = |pick: &dyn Fn(&Encoded) -> Option<&Tensor>| -> Result<Option<Tensor>> {
        let pieces: Vec<&Tensor> = parts.iter().filter_map(pick).collect();
        if pieces.len() != parts.len() {
            return Ok(None);
        }
        Ok(Some(
            Tensor::cat(&pieces, 0)?
                .to_device(&Device::Cpu)?
                .contiguous()?,
        ))
    };
    let mut tensors = HashMap::new();
    tensors.insert(
        "cls".to_string(),
        cat(&|e| Some(&e.cls))?
            .expect("every batch has cls")
            .to_dtype(DType::F32)?,
    );
    tensors.insert(
        "mean".to_string(),
        cat(&|e| Some(&e.mean))?.expect("every batch has the mean"),
    );
    if let Some(pooled) = cat(&|e| e.pooled.as_ref())? {
        tensors.insert("pooled".into(), pooled);
    }
    if contents == Contents::Full {
        tensors.insert(
            "layer_inputs".into(),
            cat(&|e| Some(&e.layer_inputs))?.expect("every batch has layer inputs"),
        );
        if let Some(mask) = cat(&|e| e.attention_mask.as_ref())? {
            tensors.insert("attention_mask".into(), mask);
        }
    }
    Ok(tensors)
}

/// Tensors first, then the sidecar that vouches for them; each to a temporary name, then renamed.
fn write_shard(dir: &Path, key: &ShardKey, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let stem = key.file_stem();
    let target = dir.join(format!("{stem}.safetensors"));
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .suffix(".safetensors")
        .tempfile_in(dir)?;
    candle_core::safetensors::save(tensors, tmp.path())
        .with_context(|| format!("{}: cannot write", target.display()))?;
    tmp.persist(&target)
        .with_context(|| format!("{}: cannot move into place", target.display()))?;
    crate::io::write_json(&dir.join(format!("{stem}.json")), key)
}
