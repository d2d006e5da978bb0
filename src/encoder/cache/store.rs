//! The feature cache itself: its root, its key, its shards looked up, verified and written.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use candle_core::{Device, DeviceLocation, Tensor};

use super::super::backbone::{Backbone, Encoded};
use super::super::layer_rows::LayerRows;
use crate::data::Split;
use crate::data::files::sha256_hex;

use super::shard_file::{ensure_finite, open_shard, read_sidecars, shard_tensors, write_shard};
use super::shard_key::{Contents, OpenShard, ShardKey, Sidecar, extraction_stamp};

pub const CACHE_DIR_ENV: &str = "BENIGN_CACHE_DIR";
pub(super) const FORMAT_VERSION: u32 = 3;
/// Samples per shard written by one extraction: at most 1024, and about 256 MB of layer inputs
/// (a shard is held in memory while it is computed).
pub(super) const SHARD_SAMPLES: usize = 1024;
pub(super) const SHARD_BYTES: usize = 256 << 20;
/// The lock file of a shard folder.
pub(super) const LOCK: &str = ".lock";

/// Features of requested samples, in request order.
pub struct Features {
    pub release_index: Vec<usize>,
    /// (N, D).
    pub cls: Tensor,
    /// (N, D), BERT checkpoints with a pooler.
    pub pooled: Option<Tensor>,
    /// Mean of the final tokens over attended positions, (N, D).
    pub mean: Tensor,
    /// The hidden states entering the last layer, unpadded, read from the shards on demand, with
    /// `Contents::Full`.
    pub layer_inputs: Option<LayerRows>,
}

#[derive(Debug, Default)]
pub struct CacheStats {
    pub from_cache: usize,
    pub computed: usize,
    /// One line per shard that could not be trusted and was rebuilt.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct FeatureCache {
    pub(super) root: PathBuf,
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

pub(super) fn slug(text: &str) -> String {
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
pub(super) struct CacheWriterLock {
    pub(super) _held: crate::io::FileLock,
}

impl CacheWriterLock {
    /// Blocks until no other process writes into `dir`.
    pub(super) fn acquire(dir: &Path) -> Result<Self> {
        crate::io::FileLock::wait(&dir.join(LOCK)).map(|held| Self { _held: held })
    }

    /// The lock if no other process holds it.
    pub(super) fn try_acquire(dir: &Path) -> Result<Option<Self>> {
        Ok(crate::io::FileLock::try_take(&dir.join(LOCK))?.map(|held| Self { _held: held }))
    }

    /// Removes the temporary files of writers that were killed: whoever holds the lock is the
    /// only writer, so every temporary file present is stale.
    pub(super) fn sweep(&self, dir: &Path) {
        crate::io::sweep_temporaries(dir);
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

    pub(super) fn dir(&self, backbone: &Backbone, dataset: &str, split: &str) -> PathBuf {
        let mut inputs = format!(
            "{}\n{}",
            backbone.preprocessing_fingerprint(),
            backbone.config_sha256
        );
        if !backbone.precision.is_f32() {
            // bf16 features in a folder of their own: f32 and bf16 runs never evict each other.
            // The AMX tiles' sums differ from `vdpbf16ps`'s: their features too.
            inputs.push_str(&format!("\nprecision {}", backbone.precision.arithmetic()));
        }
        let inputs = sha256_hex(inputs.as_bytes());
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
        if let Some(lock) = CacheWriterLock::try_acquire(&dir)? {
            lock.sweep(&dir);
        }
        let mut stats = CacheStats::default();
        let key_of = |contents: Contents, positions: &[usize]| {
            self.key(backbone, dataset, split, data, positions, contents)
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
        if let (false, Some(other)) = (missing.is_empty(), &store.other_extraction) {
            stats.warnings.push(format!(
                "{}: cached features made by {other}, not by this build's {}: extracted again",
                dir.display(),
                extraction_stamp()
            ));
        }
        if !missing.is_empty() {
            // One writer per folder: wait for the others, then see what they wrote meanwhile.
            let lock = CacheWriterLock::acquire(&dir)?;
            lock.sweep(&dir);
            store.scan(&dir, backbone, &key_of, contents, &wanted, &mut stats)?;
            missing.retain(|&p| {
                let id = (data.release_index[p], data.inputs.sample_digest(p));
                !store.location.contains_key(&id)
            });
            missing.sort_unstable_by_key(|&p| data.release_index[p]);
            missing.dedup_by_key(|p| data.release_index[*p]);
            // A shard per SHARD_SAMPLES, so an interrupted extraction keeps what it finished.
            let per_sample = backbone.max_tokens() * backbone.hidden_size() * 4;
            let shard_samples = SHARD_SAMPLES.min(SHARD_BYTES / per_sample.max(1)).max(1);
            for part in missing.chunks(shard_samples) {
                let mut encoded: Vec<Encoded> = Vec::new();
                for chunk in part.chunks(batch_size.max(1)) {
                    // Stopping here loses this shard's batches only; the shards written stay.
                    crate::interrupt::check()?;
                    encoded.push(backbone.encode(&data.inputs, chunk)?);
                    on_computed(chunk.len());
                }
                let key = key_of(contents, part);
                let (path, sidecar) = write_encoded(&dir, &key, &encoded, backbone)?;
                stats.computed += part.len();
                store.add(&path, &sidecar)?;
            }
        }
        stats.from_cache = positions.len() - stats.computed.min(positions.len());
        let features = store.gather(&wanted, contents)?;
        Ok((features, stats))
    }

    /// Stores features computed elsewhere for `positions` of `data`, one shard, as an extraction
    /// would: benches fill a cache with random layer inputs at paper sizes this way.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &self,
        backbone: &Backbone,
        dataset: &str,
        split: &str,
        data: &Split,
        positions: &[usize],
        contents: Contents,
        encoded: &[Encoded],
    ) -> Result<()> {
        let dir = self.dir(backbone, dataset, split);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create the cache folder", dir.display()))?;
        let _lock = CacheWriterLock::acquire(&dir)?;
        let key = self.key(backbone, dataset, split, data, positions, contents);
        write_encoded(&dir, &key, encoded, backbone)?;
        Ok(())
    }

    /// The key of a shard of `positions` of `data`.
    pub(super) fn key(
        &self,
        backbone: &Backbone,
        dataset: &str,
        split: &str,
        data: &Split,
        positions: &[usize],
        contents: Contents,
    ) -> ShardKey {
        ShardKey {
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
            device: match backbone.device.location() {
                DeviceLocation::Cpu => None,
                DeviceLocation::Cuda { .. } => Some("cuda".into()),
                DeviceLocation::Metal { .. } => Some("metal".into()),
            },
            extraction: Some(extraction_stamp()),
            precision: (!backbone.precision.is_f32())
                .then(|| backbone.precision.arithmetic().into()),
        }
    }
}

/// One shard of `encoded` batches under `key`, checked for finite values.
pub(super) fn write_encoded(
    dir: &Path,
    key: &ShardKey,
    encoded: &[Encoded],
    backbone: &Backbone,
) -> Result<(PathBuf, Sidecar)> {
    let tensors = shard_tensors(encoded, key.contents)?;
    ensure_finite(&tensors, backbone, key)?;
    let sidecar = write_shard(dir, key, &tensors, backbone.max_tokens())?;
    Ok((
        dir.join(format!("{}.safetensors", key.file_stem()?)),
        sidecar,
    ))
}

/// The trusted shards a request reads, and where each requested sample is.
#[derive(Default)]
pub(super) struct ShardStore {
    pub(super) shards: Vec<OpenShard>,
    /// (release index, sample digest) → (shard, row).
    pub(super) location: HashMap<(usize, String), (usize, usize)>,
    /// Sidecars already read (by path), so a second scan only opens new shards.
    pub(super) seen: std::collections::HashSet<PathBuf>,
    /// What made features of requested samples that this extraction does not reuse, if any.
    pub(super) other_extraction: Option<String>,
}

impl ShardStore {
    /// Opens the shards of `dir` that hold requested samples; untrusted ones are removed.
    pub(super) fn scan(
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
            let holds_wanted = key
                .release_index
                .iter()
                .zip(&key.sample_digest)
                .any(|(&r, d)| needed.contains(&(r, d.clone())));
            // The same samples of the same source, made by another extraction.
            let other_extraction = ShardKey {
                extraction: expected.extraction.clone(),
                ..key.clone()
            } == ShardKey {
                contents: key.contents,
                release_index: key.release_index.clone(),
                sample_digest: key.sample_digest.clone(),
                ..expected.clone()
            };
            if !same_source && other_extraction && holds_wanted {
                self.other_extraction = Some(
                    key.extraction
                        .clone()
                        .unwrap_or_else(|| "an extraction that did not record its version".into()),
                );
            }
            if !same_source
                || key.contents < contents
                || key.release_index.len() != key.sample_digest.len()
                || !holds_wanted
            {
                continue;
            }
            let tensors_path = sidecar_path.with_extension("safetensors");
            if let Err(err) = self.add(&tensors_path, &sidecar) {
                stats.warnings.push(format!(
                    "{}: {err:#}; rebuilding its samples",
                    tensors_path.display()
                ));
                let _ = std::fs::remove_file(&sidecar_path);
                let _ = std::fs::remove_file(&tensors_path);
            }
        }
        Ok(())
    }

    /// Opens the shard at `path` (checked against its sidecar) and records where its samples are.
    pub(super) fn add(&mut self, path: &Path, sidecar: &Sidecar) -> Result<()> {
        let shard = open_shard(path, sidecar)?;
        let s = self.shards.len();
        for (row, id) in sidecar
            .key
            .release_index
            .iter()
            .zip(&sidecar.key.sample_digest)
            .enumerate()
        {
            self.location
                .entry((*id.0, id.1.clone()))
                .or_insert((s, row));
        }
        self.shards.push(shard);
        Ok(())
    }

    /// The requested rows in request order: one index_select per shard, then one to restore
    /// the order; layer inputs as references into the shard files.
    pub(super) fn gather(
        &self,
        wanted: &[(usize, String)],
        contents: Contents,
    ) -> Result<Features> {
        let mut by_shard: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
        let mut places = Vec::with_capacity(wanted.len());
        for (k, id) in wanted.iter().enumerate() {
            let &(s, row) = self
                .location
                .get(id)
                .context("a requested sample is in no shard")?;
            by_shard.entry(s).or_default().push((k, row as u32));
            places.push((s, row));
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
            if !by_shard
                .keys()
                .all(|&s| self.shards[s].small.contains_key(name))
            {
                return Ok(None);
            }
            let pieces: Vec<Tensor> = by_shard
                .iter()
                .map(|(&s, rows)| {
                    let idx = Tensor::new(
                        rows.iter().map(|&(_, r)| r).collect::<Vec<u32>>(),
                        &Device::Cpu,
                    )?;
                    self.shards[s].small[name].index_select(&idx, 0)
                })
                .collect::<candle_core::Result<_>>()?;
            Ok(Some(Tensor::cat(&pieces, 0)?.index_select(&restore, 0)?))
        };
        let cls = gather("cls")?.context("cache shards lack the cls feature")?;
        let layer_inputs = if contents == Contents::Full {
            let samples = places
                .iter()
                .map(|&(s, row)| {
                    let shard = &self.shards[s];
                    let (offset, digest) = shard
                        .rows
                        .get(row)
                        .cloned()
                        .context("a shard lacks layer inputs")?;
                    Ok((
                        std::sync::Arc::clone(&shard.file),
                        offset,
                        shard.lengths[row],
                        digest,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let tokens = places
                .iter()
                .map(|&(s, _)| self.shards[s].tokens)
                .max()
                .unwrap_or(0);
            Some(LayerRows::on_disk(samples, tokens, cls.dim(1)?))
        } else {
            None
        };
        Ok(Features {
            release_index: wanted.iter().map(|(r, _)| *r).collect(),
            cls,
            pooled: gather("pooled")?,
            mean: gather("mean")?.context("cache shards lack the mean feature")?,
            layer_inputs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU shard's key reads as before the device joined it (its file keeps its name); a GPU
    /// shard's is another.
    #[test]
    fn the_device_enters_a_shard_key_only_off_the_cpu() {
        let key = ShardKey {
            version: FORMAT_VERSION,
            backbone: "org/model".into(),
            weights_sha256: "w".into(),
            config_sha256: "c".into(),
            preprocessing: "p".into(),
            dataset: "trec".into(),
            split: "test".into(),
            contents: Contents::Cls,
            release_index: vec![3],
            sample_digest: vec!["d".into()],
            device: None,
            extraction: Some(extraction_stamp()),
            precision: None,
        };
        let json = serde_json::to_string(&key).unwrap();
        assert!(!json.contains("device"), "{json}");
        assert_eq!(serde_json::from_str::<ShardKey>(&json).unwrap(), key);
        let on_gpu = ShardKey {
            device: Some("cuda".into()),
            ..key.clone()
        };
        assert_ne!(key.file_stem().unwrap(), on_gpu.file_stem().unwrap());
    }

    /// Features that another version of extraction (or another family of float kernels) made
    /// are extracted again, with a warning naming both, not served.
    /// The tiny ViT fixture with a 32-pixel preprocessor written into `dir`, and four images.
    fn tiny_vit_and_images(dir: &Path) -> (Backbone, Split) {
        use crate::data::{ImageSet, Inputs};
        use crate::encoder::{BackboneFiles, TextOptions};
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_vit");
        let preprocessor = dir.join("preprocessor_config.json");
        std::fs::write(
            &preprocessor,
            r#"{"size": {"height": 32, "width": 32}, "resample": 2}"#,
        )
        .unwrap();
        let files = BackboneFiles {
            id: "fixture/tiny-vit".into(),
            config: fixture.join("config.json"),
            weights: fixture.join("model.safetensors"),
            preprocessor: Some(preprocessor),
            tokenizer: None,
            source: "test fixture".into(),
        };
        let backbone = Backbone::load(files, &Device::Cpu, TextOptions::default()).unwrap();
        let count = 4;
        let data = Split {
            inputs: Inputs::Images(ImageSet {
                count,
                channels: 3,
                height: 32,
                width: 32,
                pixels: (0..count * 3 * 32 * 32).map(|k| (k % 251) as u8).collect(),
            }),
            labels: vec![0; count],
            release_index: (0..count).collect(),
        };
        (backbone, data)
    }

    /// bf16 features live in a folder and under a key of their own: a bf16 request after an f32
    /// one extracts again (no warning: nothing stale was found), and an f32 request after both is
    /// still served from the f32 shard.
    #[test]
    fn bf16_features_are_cached_apart_from_f32_ones() {
        if crate::kernels::Precision::Bf16.check_supported().is_err() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (f32_backbone, data) = tiny_vit_and_images(dir.path());
        let (bf16_backbone, _) = tiny_vit_and_images(dir.path());
        let bf16_backbone = bf16_backbone
            .in_precision(crate::kernels::Precision::Bf16)
            .unwrap();
        let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
        assert_ne!(
            cache.dir(&f32_backbone, "toy", "test"),
            cache.dir(&bf16_backbone, "toy", "test")
        );
        let all: Vec<usize> = (0..4).collect();
        let features = |backbone: &Backbone| {
            cache
                .features(
                    backbone,
                    "toy",
                    "test",
                    &data,
                    &all,
                    Contents::Cls,
                    4,
                    &mut |_| {},
                )
                .unwrap()
        };
        let (f32_features, first) = features(&f32_backbone);
        assert_eq!(first.computed, 4);
        let (bf16_features, second) = features(&bf16_backbone);
        assert_eq!(second.computed, 4, "bf16 was served f32 features");
        assert!(second.warnings.is_empty(), "{:?}", second.warnings);
        let (again, third) = features(&f32_backbone);
        assert_eq!(third.computed, 0);
        let cls = |f: &Features| f.cls.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(cls(&again), cls(&f32_features));
        assert_ne!(cls(&bf16_features), cls(&f32_features), "bf16 computed f32");
    }

    #[test]
    fn features_of_another_extraction_are_extracted_again_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let (backbone, data) = tiny_vit_and_images(dir.path());
        let count = 4;
        let all: Vec<usize> = (0..count).collect();
        let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
        // A shard of these very samples, as an older extraction would have left it.
        let folder = cache.dir(&backbone, "toy", "test");
        std::fs::create_dir_all(&folder).unwrap();
        let stale = ShardKey {
            extraction: Some("extraction 0, an older build".into()),
            ..cache.key(&backbone, "toy", "test", &data, &all, Contents::Full)
        };
        let encoded = backbone.encode(&data.inputs, &all).unwrap();
        write_encoded(&folder, &stale, &[encoded], &backbone).unwrap();
        let (_, stats) = cache
            .features(
                &backbone,
                "toy",
                "test",
                &data,
                &all,
                Contents::Full,
                4,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(
            stats.computed, count,
            "the older extraction's features were served"
        );
        let warning = stats.warnings.join(" | ");
        assert!(
            warning.contains("extraction 0, an older build")
                && warning.contains(&extraction_stamp()),
            "{warning}"
        );
        // What this extraction wrote is served the next time, without a warning.
        let (_, again) = cache
            .features(
                &backbone,
                "toy",
                "test",
                &data,
                &all,
                Contents::Full,
                4,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(again.computed, 0);
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    }
}
