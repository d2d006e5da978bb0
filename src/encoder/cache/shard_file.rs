//! A shard's files: the sidecars of a folder, and a safetensors file written, opened and
//! checked (its recorded sha256, each tensor's declared shape and extent, every value finite)
//! before a sample of it is served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use candle_core::{DType, Device, Tensor};

use super::shard_key::{Contents, OpenShard, ShardKey, Sidecar};
use std::collections::BTreeMap;

use super::super::backbone::{Backbone, Encoded};
use super::super::layer_rows::rows_digest;
use crate::data::files::sha256_hex;

/// Every `shard-*.json` in `dir` that parses and names its own file: (sidecar path, sidecar).
pub(super) fn read_sidecars(dir: &Path) -> Vec<(PathBuf, Sidecar)> {
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
        let Some(sidecar) = crate::io::read_input(&path, crate::io::limits::SMALL_TEXT)
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

/// A tensor's place in a safetensors file.
pub(super) struct TensorInfo {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

/// The header of a safetensors file, read by the safetensors crate: its tensors by name, and
/// where their data starts. The crate reads it over a map of the whole file, which also proves the
/// data section as long as the header says (a truncated shard is refused here); the tensors' bytes
/// are read only where they are checked.
pub(super) fn safetensors_header(
    file: &std::fs::File,
) -> Result<(HashMap<String, TensorInfo>, u64)> {
    // SAFETY: shards are written once, to a temporary name renamed into place, and never
    // modified after; the map lives only while the header is parsed.
    let map = unsafe { memmap2::Mmap::map(file) }.context("unmappable")?;
    let (size, metadata) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| anyhow!("not a safetensors file: {e}"))?;
    let infos = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (begin, end) = info.data_offsets;
            let info = TensorInfo {
                dtype: info.dtype,
                shape: info.shape.clone(),
                data_offsets: (begin as u64, end as u64),
            };
            (name, info)
        })
        .collect();
    Ok((infos, 8 + size as u64))
}

/// The shard's small tensors (cls, mean, lengths), each read whole and checked against the
/// sha256 its sidecar recorded.
pub(super) fn checked_small_tensors(
    file: &std::fs::File,
    infos: &HashMap<String, TensorInfo>,
    data_start: u64,
    sidecar: &Sidecar,
) -> Result<HashMap<String, Tensor>> {
    use std::os::unix::fs::FileExt;
    let mut small = HashMap::new();
    for (name, expected_sha) in &sidecar.tensor_sha256 {
        let info = infos
            .get(name)
            .with_context(|| format!("no {name} tensor"))?;
        let (begin, end) = info.data_offsets;
        let mut bytes = vec![0u8; end.saturating_sub(begin) as usize];
        file.read_exact_at(&mut bytes, data_start + begin)
            .with_context(|| format!("{name}: truncated"))?;
        let sha = sha256_hex(&bytes);
        if sha != *expected_sha {
            bail!(
                "{name}: sha256 {} differs from the {} its sidecar recorded",
                &sha[..12],
                &expected_sha[..12.min(expected_sha.len())]
            );
        }
        let dtype = match info.dtype {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::U32 => DType::U32,
            other => bail!("{name}: unexpected dtype {other}"),
        };
        let tensor = Tensor::from_raw_buffer(&bytes, dtype, &info.shape, &Device::Cpu)?;
        small.insert(name.clone(), tensor);
    }
    Ok(small)
}

/// Opens a shard checked against its sidecar: each small tensor's sha256, shapes and finite
/// values; the layer inputs stay on disk (each sample is checked when read).
pub(super) fn open_shard(path: &Path, sidecar: &Sidecar) -> Result<OpenShard> {
    let (file, _) = crate::io::open_input(path, crate::io::limits::TENSORS)?;
    let (infos, data_start) = safetensors_header(&file)?;
    let key = &sidecar.key;
    let n = key.release_index.len();
    let small = checked_small_tensors(&file, &infos, data_start, sidecar)?;
    let hidden = infos
        .get("cls")
        .and_then(|i| i.shape.get(1).copied())
        .context("no cls tensor")?;
    for name in ["cls", "mean"] {
        let t = small
            .get(name)
            .with_context(|| format!("no checked {name} tensor"))?;
        if t.dims() != [n, hidden] {
            bail!("{name} has shape {:?}, expected [{n}, {hidden}]", t.dims());
        }
    }
    if let Some(name) = first_non_finite(&small)? {
        bail!("{name} holds non-finite values");
    }
    let (mut rows, mut lengths) = (Vec::new(), Vec::new());
    if key.contents == Contents::Full {
        let info = infos
            .get("layer_inputs")
            .context("no layer_inputs tensor")?;
        lengths = small
            .get("lengths")
            .context("no checked lengths tensor")?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let total: usize = lengths.iter().sum();
        if info.dtype != safetensors::Dtype::F32
            || info.shape != [total, hidden]
            || lengths.len() != n
            || sidecar.row_digest.len() != n
            || info.data_offsets.1 - info.data_offsets.0 != (total * hidden * 4) as u64
        {
            bail!(
                "layer_inputs has shape {:?} for {n} samples of {total} rows",
                info.shape
            );
        }
        let mut offset = data_start + info.data_offsets.0;
        for (len, digest) in lengths.iter().zip(&sidecar.row_digest) {
            rows.push((offset, digest.clone()));
            offset += (len * hidden * 4) as u64;
        }
    }
    Ok(OpenShard {
        small,
        rows,
        lengths,
        file: std::sync::Arc::new(path.to_path_buf()),
        tokens: sidecar.tokens,
    })
}

/// The name of the first float tensor holding a NaN or an infinity.
pub(super) fn first_non_finite(tensors: &HashMap<String, Tensor>) -> Result<Option<String>> {
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
pub(super) fn ensure_finite(
    tensors: &HashMap<String, Tensor>,
    backbone: &Backbone,
    key: &ShardKey,
) -> Result<()> {
    if let Some(name) = first_non_finite(tensors)? {
        let shown: Vec<String> = key
            .release_index
            .iter()
            .take(5)
            .map(usize::to_string)
            .collect();
        bail!(
            "{}: non-finite {name} features for {} {} samples (release indices {}{}); check its config.json and preprocessor config",
            backbone.files.id,
            key.dataset,
            key.split,
            shown.join(", "),
            if key.release_index.len() > 5 {
                ", …"
            } else {
                ""
            }
        );
    }
    Ok(())
}

pub(super) fn shard_tensors(
    parts: &[Encoded],
    contents: Contents,
) -> Result<HashMap<String, Tensor>> {
    let cat = |pick: &dyn Fn(&Encoded) -> Option<&Tensor>| -> Result<Option<Tensor>> {
        let pieces: Vec<&Tensor> = parts.iter().filter_map(pick).collect();
        if pieces.is_empty() || pieces.len() != parts.len() {
            return Ok(None);
        }
        Ok(Some(
            Tensor::cat(&pieces, 0)?
                .to_device(&Device::Cpu)?
                .to_dtype(DType::F32)?
                .contiguous()?,
        ))
    };
    let mut tensors = HashMap::new();
    tensors.insert(
        "cls".to_string(),
        cat(&|e| Some(&e.cls))?.context("no batch was encoded")?,
    );
    tensors.insert(
        "mean".to_string(),
        cat(&|e| Some(&e.mean))?.context("no batch was encoded")?,
    );
    if let Some(pooled) = cat(&|e| e.pooled.as_ref())? {
        tensors.insert("pooled".into(), pooled);
    }
    if contents == Contents::Full {
        // Each sample's rows up to its last attended token: padding is never stored.
        let (mut rows, mut lengths) = (Vec::new(), Vec::new());
        for part in parts {
            let inputs = part.layer_inputs.to_device(&Device::Cpu)?;
            let (b, t, _) = inputs.dims3()?;
            let cut = match &part.attention_mask {
                Some(mask) => {
                    crate::encoder::layers::unpadded_lengths(&mask.to_device(&Device::Cpu)?)?
                }
                None => vec![t; b],
            };
            for (i, len) in cut.into_iter().enumerate() {
                rows.push(inputs.get(i)?.narrow(0, 0, len)?);
                lengths.push(len as u32);
            }
        }
        tensors.insert(
            "layer_inputs".into(),
            Tensor::cat(&rows, 0)?.to_dtype(DType::F32)?.contiguous()?,
        );
        let n = lengths.len();
        tensors.insert(
            "lengths".into(),
            Tensor::from_vec(lengths, n, &Device::Cpu)?,
        );
    }
    Ok(tensors)
}

/// The raw little-endian bytes of a tensor, as safetensors stores them.
pub(super) fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => t
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::U32 => t
            .flatten_all()?
            .to_vec1::<u32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        other => bail!("cache tensors are f32 or u32, not {other:?}"),
    })
}

/// Tensors first, then the sidecar that vouches for them (checksums of the small tensors and
/// of each sample's layer-input rows); each to a temporary name, then renamed.
pub(super) fn write_shard(
    dir: &Path,
    key: &ShardKey,
    tensors: &HashMap<String, Tensor>,
    tokens: usize,
) -> Result<Sidecar> {
    let stem = key.file_stem()?;
    let target = dir.join(format!("{stem}.safetensors"));
    let mut tensor_sha256 = BTreeMap::new();
    for (name, t) in tensors.iter().filter(|(name, _)| *name != "layer_inputs") {
        tensor_sha256.insert(name.clone(), sha256_hex(&tensor_bytes(t)?));
    }
    let mut row_digest = Vec::new();
    if let (Some(inputs), Some(lengths)) = (tensors.get("layer_inputs"), tensors.get("lengths")) {
        let dim = inputs.dim(1)?;
        let values: Vec<f32> = inputs.flatten_all()?.to_vec1()?;
        let mut start = 0;
        for len in lengths.to_vec1::<u32>()? {
            let end = start + len as usize * dim;
            row_digest.push(rows_digest(&values[start..end]));
            start = end;
        }
    }
    crate::io::produce_atomic(&target, |tmp| {
        candle_core::safetensors::save(tensors, tmp).map_err(anyhow::Error::from)
    })?;
    let sidecar = Sidecar {
        key: key.clone(),
        tensor_sha256,
        row_digest,
        tokens,
    };
    crate::io::write_json(&dir.join(format!("{stem}.json")), &sidecar)?;
    Ok(sidecar)
}
