//! Feature cache: each image or sentence goes through a frozen backbone once per backbone,
//! whatever split, seed or grid later asks for it, and a cached feature is only served for the
//! very sample, network and preprocessing it was computed from.
//!
//! Layout: `<root>/<backbone>-<weights sha256[..12]>/<hash of preprocessing and config.json>/
//! <dataset>/<split>/` holds shards: a safetensors file of features for a set of samples and a
//! JSON sidecar with its key (backbone id, weights and config.json sha256, preprocessing, dataset,
//! split, contents, and per sample its release index and a digest of its raw bytes) and the
//! sha256 of the safetensors file. A sample is served from a shard only when both its release
//! index and its bytes' digest match, so a replaced data file is recomputed, not reused; a shard is
//! read only when its file matches the recorded sha256 and every value is finite, else it is
//! deleted and its samples recomputed, with a warning. Both files are written to temporary names
//! and renamed, the sidecar last, so a killed extraction leaves nothing a later run would trust.
//! Writers of one folder take an exclusive file lock (`.lock`), so concurrent processes (Slurm
//! array tasks) compute each sample once and the lock holder may sweep temporary files that
//! killed writers left.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::backbone::{Backbone, Encoded};
use crate::data::Split;
use crate::data::files::sha256_hex;

pub const CACHE_DIR_ENV: &str = "BENIGN_CACHE_DIR";
const FORMAT_VERSION: u32 = 2;
/// Samples per shard written by one extraction.
const SHARD_SAMPLES: usize = 1024;
/// The lock file of a shard folder.
const LOCK: &str = ".lock";

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

/// Everything a shard's features depend on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ShardKey {
    version: u32,
    backbone: String,
    weights_sha256: String,
    config_sha256: String,
    preprocessing: String,
    dataset: String,
    split: String,
    contents: Contents,
    release_index: Vec<usize>,
    /// `Inputs::sample_digest` of each sample, aligned with `release_index`.
    sample_digest: Vec<String>,
}

/// A shard's sidecar: its key and the checksum of its tensors file.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Sidecar {
    key: ShardKey,
    tensors_sha256: String,
}

impl ShardKey {
    fn file_stem(&self) -> Result<String> {
        Ok(format!("shard-{}", &crate::io::json_digest(self)?[..16]))
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

/// The exclusive lock of a shard folder, held while samples are computed and written.
struct FolderLock(std::fs::File);

impl FolderLock {
    /// Blocks until no other process writes into `dir`.
    fn acquire(dir: &Path) -> Result<Self> {
        let file = Self::file(dir)?;
        file.lock()
            .with_context(|| format!("{}: cannot lock the cache folder", dir.display()))?;
        Ok(Self(file))
    }

    /// The lock if no other process holds it.
    fn try_acquire(dir: &Path) -> Result<Option<Self>> {
        let file = Self::file(dir)?;
        Ok(file.try_lock().ok().map(|()| Self(file)))
    }

    fn file(dir: &Path) -> Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))
            .with_context(|| format!("{}: cannot open the cache lock", dir.display()))
    }

    /// Removes the temporary files of writers that were killed: whoever holds the lock is the
    /// only writer, so every temporary file present is stale.
    fn sweep(&self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

impl FeatureCache {
    /// The cache under `root`, created if needed; an error now if it cannot be written, so that a
    /// run does not find out after its backbone work.
    pub fn open(root: PathBuf) -> Result<Self> {
        let unwritable = |e: std::io::Error| {
            anyhow::anyhow!(
                "{}: the feature cache folder cannot be written ({e}); choose another --cache-dir or set {CACHE_DIR_ENV}",
                root.display()
            )
        };
        std::fs::create_dir_all(&root).map_err(unwritable)?;
        tempfile::Builder::new()
            .prefix(".tmp-probe-")
            .tempfile_in(&root)
            .map_err(unwritable)?;
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, backbone: &Backbone, dataset: &str, split: &str) -> PathBuf {
        let inputs = sha256_hex(
            format!(
                "{}\n{}",
                backbone.preprocessing_fingerprint(),
                backbone.config_sha256
            )
            .as_bytes(),
        );
        self.root
            .join(format!(
                "{}-{}",
                slug(&backbone.files.id),
                &backbone.weights_sha256[..12]
            ))
            .join(&inputs[..12])
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
        if positions.is_empty() {
            bail!("{dataset} {split}: no samples requested");
        }
        let dir = self.dir(backbone, dataset, split);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create the cache folder", dir.display()))?;
        if let Some(lock) = FolderLock::try_acquire(&dir)? {
            lock.sweep(&dir);
        }
        let mut stats = CacheStats::default();
        let key_of = |contents: Contents, positions: &[usize]| ShardKey {
            version: FORMAT_VERSION,
            backbone: backbone.files.id.clone(),
            weights_sha256: backbone.weights_sha256.clone(),
            config_sha256: backbone.config_sha256.clone(),
            preprocessing: backbone.preprocessing_fingerprint(),
            dataset: dataset.to_string(),
            split: split.to_string(),
            contents,
            release_index: positions.iter().map(|&p| data.release_index[p]).collect(),
            sample_digest: positions
                .iter()
                .map(|&p| data.inputs.sample_digest(p))
                .collect(),
        };
        // Each requested sample by what identifies its features: release index and bytes.
        let wanted: Vec<(usize, String)> = positions
            .iter()
            .map(|&p| (data.release_index[p], data.inputs.sample_digest(p)))
            .collect();

        let mut store = ShardStore::default();
        store.scan(&dir, backbone, &key_of, contents, &wanted, &mut stats)?;
        let mut missing: Vec<usize> = positions
            .iter()
            .zip(&wanted)
            .filter(|(_, id)| !store.location.contains_key(*id))
            .map(|(&p, _)| p)
            .collect();
        if !missing.is_empty() {
            // One writer per folder: wait for the others, then see what they wrote meanwhile.
            let lock = FolderLock::acquire(&dir)?;
            lock.sweep(&dir);
            store.scan(&dir, backbone, &key_of, contents, &wanted, &mut stats)?;
            missing.retain(|&p| {
                let id = (data.release_index[p], data.inputs.sample_digest(p));
                !store.location.contains_key(&id)
            });
            missing.sort_unstable_by_key(|&p| data.release_index[p]);
            missing.dedup_by_key(|p| data.release_index[*p]);
            // A shard per SHARD_SAMPLES, so an interrupted extraction keeps what it finished.
            for part in missing.chunks(SHARD_SAMPLES) {
                let mut encoded: Vec<Encoded> = Vec::new();
                for chunk in part.chunks(batch_size.max(1)) {
                    encoded.push(backbone.encode(&data.inputs, chunk)?);
                    on_computed(chunk.len());
                }
                let key = key_of(contents, part);
                let tensors = shard_tensors(&encoded, contents)?;
                ensure_finite(&tensors, backbone, &key)?;
                write_shard(&dir, &key, &tensors)?;
                stats.computed += part.len();
                store.add(key, tensors);
            }
        }
        stats.from_cache = positions.len() - stats.computed.min(positions.len());
        let features = store.gather(&wanted, contents)?;
        Ok((features, stats))
    }
}

/// The trusted shards a request reads, and where each requested sample is.
#[derive(Default)]
struct ShardStore {
    shards: Vec<HashMap<String, Tensor>>,
    /// (release index, sample digest) → (shard, row).
    location: HashMap<(usize, String), (usize, usize)>,
    /// Sidecars already read (by path), so a second scan only opens new shards.
    seen: std::collections::HashSet<PathBuf>,
}

impl ShardStore {
    /// Loads the shards of `dir` that hold requested samples; untrusted ones are removed.
    fn scan(
        &mut self,
        dir: &Path,
        backbone: &Backbone,
        key_of: &dyn Fn(Contents, &[usize]) -> ShardKey,
        contents: Contents,
        wanted: &[(usize, String)],
        stats: &mut CacheStats,
    ) -> Result<()> {
        let needed: std::collections::HashSet<&(usize, String)> = wanted.iter().collect();
        let expected = key_of(contents, &[]);
        for (sidecar_path, sidecar) in read_sidecars(dir) {
            if !self.seen.insert(sidecar_path.clone()) {
                continue;
            }
            let key = &sidecar.key;
            // Features of another network under this one's folder: a copied or renamed cache.
            // Recomputing beside them would hide the mix-up, so stop.
            if (&key.backbone, &key.weights_sha256)
                != (&backbone.files.id, &backbone.weights_sha256)
            {
                bail!(
                    "{}: cached features of another backbone ({} weights {}), not {} weights {}; delete that folder or choose another --cache-dir",
                    sidecar_path.display(),
                    key.backbone,
                    &key.weights_sha256[..12.min(key.weights_sha256.len())],
                    backbone.files.id,
                    &backbone.weights_sha256[..12],
                );
            }
            let same_source = ShardKey {
                contents: key.contents,
                release_index: Vec::new(),
                sample_digest: Vec::new(),
                ..key.clone()
            } == ShardKey {
                contents: key.contents,
                ..expected.clone()
            };
            let rows: Vec<(usize, (usize, String))> = key
                .release_index
                .iter()
                .zip(&key.sample_digest)
                .map(|(&r, d)| (r, d.clone()))
                .enumerate()
                .filter(|(_, id)| needed.contains(id) && !self.location.contains_key(id))
                .collect();
            if !same_source
                || key.contents < contents
                || key.release_index.len() != key.sample_digest.len()
                || rows.is_empty()
            {
                continue;
            }
            let tensors_path = sidecar_path.with_extension("safetensors");
            match load_shard(&tensors_path, &sidecar, backbone.hidden_size()) {
                Ok(tensors) => {
                    let s = self.shards.len();
                    self.shards.push(tensors);
                    for (row, id) in rows {
                        self.location.insert(id, (s, row));
                    }
                }
                Err(err) => {
                    stats.warnings.push(format!(
                        "{}: {err:#}; rebuilding its samples",
                        tensors_path.display()
                    ));
                    let _ = std::fs::remove_file(&sidecar_path);
                    let _ = std::fs::remove_file(&tensors_path);
                }
            }
        }
        Ok(())
    }

    fn add(&mut self, key: ShardKey, tensors: HashMap<String, Tensor>) {
        let s = self.shards.len();
        for (row, id) in key
            .release_index
            .into_iter()
            .zip(key.sample_digest)
            .enumerate()
        {
            self.location.insert(id, (s, row));
        }
        self.shards.push(tensors);
    }

    /// The requested rows in request order: one index_select per shard, then one to restore
    /// the order.
    fn gather(&self, wanted: &[(usize, String)], contents: Contents) -> Result<Features> {
        let mut by_shard: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
        for (k, id) in wanted.iter().enumerate() {
            let &(s, row) = self
                .location
                .get(id)
                .context("a requested sample is in no shard")?;
            by_shard.entry(s).or_default().push((k, row as u32));
        }
        let mut restore = vec![0u32; wanted.len()];
        let mut next = 0u32;
        for rows in by_shard.values() {
            for &(k, _) in rows {
                restore[k] = next;
                next += 1;
            }
        }
        let restore = Tensor::new(restore, &Device::Cpu)?;
        let gather = |name: &str| -> Result<Option<Tensor>> {
            if !by_shard.keys().all(|&s| self.shards[s].contains_key(name)) {
                return Ok(None);
            }
            let pieces: Vec<Tensor> = by_shard
                .iter()
                .map(|(&s, rows)| {
                    let idx = Tensor::new(
                        rows.iter().map(|&(_, r)| r).collect::<Vec<u32>>(),
                        &Device::Cpu,
                    )?;
                    self.shards[s][name].index_select(&idx, 0)
                })
                .collect::<candle_core::Result<_>>()?;
            Ok(Some(Tensor::cat(&pieces, 0)?.index_select(&restore, 0)?))
        };
        let wants_full = contents == Contents::Full;
        Ok(Features {
            release_index: wanted.iter().map(|(r, _)| *r).collect(),
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
        })
    }
}

/// Every `shard-*.json` in `dir` that parses and names its own file: (sidecar path, sidecar).
fn read_sidecars(dir: &Path) -> Vec<(PathBuf, Sidecar)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: BTreeMap<PathBuf, Sidecar> = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if !(name.starts_with("shard-") && name.ends_with(".json")) {
            continue;
        }
        let Some(sidecar) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok())
        else {
            continue;
        };
        // A sidecar only vouches for the shard its key names.
        let stem = sidecar.key.file_stem().ok();
        if stem.as_deref() != path.file_stem().and_then(|s| s.to_str()) {
            continue;
        }
        found.insert(path, sidecar);
    }
    found.into_iter().collect()
}

/// The tensors of a shard, checked against its sidecar: the file's sha256, the shapes, and
/// finite values.
fn load_shard(path: &Path, sidecar: &Sidecar, hidden: usize) -> Result<HashMap<String, Tensor>> {
    let bytes = std::fs::read(path).context("unreadable")?;
    let sha = sha256_hex(&bytes);
    if sha != sidecar.tensors_sha256 {
        bail!(
            "sha256 {} differs from the {} its sidecar recorded",
            &sha[..12],
            &sidecar.tensors_sha256[..12.min(sidecar.tensors_sha256.len())]
        );
    }
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).context("unreadable")?;
    let key = &sidecar.key;
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
    if let Some(name) = first_non_finite(&tensors)? {
        bail!("{name} holds non-finite values");
    }
    Ok(tensors)
}

/// The name of the first float tensor holding a NaN or an infinity.
fn first_non_finite(tensors: &HashMap<String, Tensor>) -> Result<Option<String>> {
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        let t = &tensors[name];
        if t.dtype() != DType::F32 {
            continue;
        }
        let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
        if values.iter().any(|v| !v.is_finite()) {
            return Ok(Some(name.clone()));
        }
    }
    Ok(None)
}

/// Extraction stops at the first non-finite feature, naming the backbone and the samples: a
/// broken checkpoint or preprocessing must not reach the cache.
fn ensure_finite(tensors: &HashMap<String, Tensor>, backbone: &Backbone, key: &ShardKey) -> Result<()> {
    if let Some(name) = first_non_finite(tensors)? {
        let shown: Vec<String> = key.release_index.iter().take(5).map(usize::to_string).collect();
        bail!(
            "{}: non-finite {name} features for {} {} samples (release indices {}{}); check its config.json and preprocessor config",
            backbone.files.id,
            key.dataset,
            key.split,
            shown.join(", "),
            if key.release_index.len() > 5 { ", …" } else { "" }
        );
    }
    Ok(())
}

fn shard_tensors(parts: &[Encoded], contents: Contents) -> Result<HashMap<String, Tensor>> {
    let cat = |pick: &dyn Fn(&Encoded) -> Option<&Tensor>| -> Result<Option<Tensor>> {
        let pieces: Vec<&Tensor> = parts.iter().filter_map(pick).collect();
        if pieces.is_empty() || pieces.len() != parts.len() {
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
            .context("no batch was encoded")?
            .to_dtype(DType::F32)?,
    );
    tensors.insert(
        "mean".to_string(),
        cat(&|e| Some(&e.mean))?.context("no batch was encoded")?,
    );
    if let Some(pooled) = cat(&|e| e.pooled.as_ref())? {
        tensors.insert("pooled".into(), pooled);
    }
    if contents == Contents::Full {
        tensors.insert(
            "layer_inputs".into(),
            cat(&|e| Some(&e.layer_inputs))?.context("no batch was encoded")?,
        );
        if let Some(mask) = cat(&|e| e.attention_mask.as_ref())? {
            tensors.insert("attention_mask".into(), mask);
        }
    }
    Ok(tensors)
}

/// Tensors first, then the sidecar that vouches for them; each to a temporary name, then renamed.
fn write_shard(dir: &Path, key: &ShardKey, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let stem = key.file_stem()?;
    let target = dir.join(format!("{stem}.safetensors"));
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .suffix(".safetensors")
        .tempfile_in(dir)?;
    candle_core::safetensors::save(tensors, tmp.path())
        .with_context(|| format!("{}: cannot write", target.display()))?;
    let tensors_sha256 = sha256_hex(
        &std::fs::read(tmp.path()).with_context(|| format!("{}: cannot read back", target.display()))?,
    );
    tmp.persist(&target)
        .with_context(|| format!("{}: cannot move into place", target.display()))?;
    let sidecar = Sidecar {
        key: key.clone(),
        tensors_sha256,
    };
    crate::io::write_json(&dir.join(format!("{stem}.json")), &sidecar)
}
