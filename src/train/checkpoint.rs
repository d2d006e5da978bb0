//! Checkpoints of a `finetune` run, so that `--resume` continues bit for bit: the phase-1
//! classifier, the phase-2 parameters with their AdamW moments and step, and the metrics so far.
//! The batch order needs no state: epoch k's order is drawn from its own seeded stream.
//!
//! One file, `checkpoint.safetensors`, replaced atomically: the tensors by name, the run state as
//! JSON in the u8 tensor `state.json` (so tensors and state can never disagree), and the SHA-256
//! of every tensor and of the state in the u8 tensor `sha256.json`, verified on every load: a
//! flipped byte or a hand-edited state is refused, never resumed. The shared phase-1 results
//! (`finetune::phase1`) use the same format.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor, Var};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::attention_maps::Snapshot;
use super::metrics::EpochMetrics;
use super::run::RunConfig;
use crate::io::produce_atomic;

const STATE: &str = "state.json";
const CHECKSUMS: &str = "sha256.json";

/// What makes two runs the same run: a checkpoint is only resumed by an identical one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunIdentity {
    pub config: RunConfig,
    /// The weights the run's backbone resolved to.
    pub backbone_sha256: String,
    /// The sizes the split resolved to (partial data shrinks pretrain_n).
    pub pretrain_n: usize,
    pub test_n: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunState {
    pub identity: RunIdentity,
    pub baseline_test_acc: f64,
    pub pretrain_losses: Vec<f64>,
    /// Phase-2 epochs finished (0: only phase 1).
    pub epochs_done: usize,
    pub optimizer_step: usize,
    pub log: Vec<EpochMetrics>,
    /// The attention maps' samples right after the reset, as measured then (absent before phase
    /// 2 starts, and in checkpoints written before the maps existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_reset: Option<Snapshot>,
    /// The float kernels of the sittings so far (empty in checkpoints from before it was kept).
    #[serde(default)]
    pub float_kernels: String,
    /// Wall seconds the run had taken up to this checkpoint, over every sitting so far (0 in
    /// checkpoints from before it was kept), so that a resumed run's `wall_seconds` is the whole
    /// run's and not its last sitting's.
    #[serde(default)]
    pub wall_seconds: f64,
}

impl RunState {
    /// A state that contradicts itself was edited by hand or written by a faulty build: refused.
    /// Every phase-2 epoch is logged, 0 (right after the reset) included, and each takes
    /// `steps_per_epoch` optimizer steps.
    pub fn ensure_consistent(&self, steps_per_epoch: usize, file: &Path) -> Result<()> {
        let logged: Vec<usize> = self.log.iter().map(|m| m.epoch).collect();
        let whole_log = logged.iter().copied().eq(0..=self.epochs_done);
        let problem = if self.epochs_done > self.identity.config.epochs {
            Some(format!(
                "epochs_done {} beyond the run's {} epochs",
                self.epochs_done, self.identity.config.epochs
            ))
        } else if !(whole_log || (self.epochs_done == 0 && logged.is_empty())) {
            Some(format!(
                "epochs_done {} but its metrics log holds epochs {}",
                self.epochs_done,
                match (logged.first(), logged.last()) {
                    (Some(first), Some(last)) =>
                        format!("{first}..={last} ({} entries)", logged.len()),
                    _ => "none".into(),
                }
            ))
        } else if self.optimizer_step != self.epochs_done * steps_per_epoch {
            Some(format!(
                "optimizer step {} after {} epochs of {steps_per_epoch} steps",
                self.optimizer_step, self.epochs_done
            ))
        } else {
            None
        };
        match problem {
            Some(problem) => bail!(
                "--resume: {}: {problem}; the checkpoint contradicts itself, so it is not resumed (start again without --resume)",
                file.display()
            ),
            None => Ok(()),
        }
    }
}

pub struct Checkpoint {
    pub state: RunState,
    pub tensors: HashMap<String, Tensor>,
}

/// Where a run picks phase 2 up: after `epochs_done` epochs, with or without epoch 0 (the
/// evaluation right after the reset) already logged. A fresh run and a run stopped after phase 1
/// both start at (0, false); one stopped right after epoch 0's log at (0, true). Runs train
/// together only from the same start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartPoint {
    pub epochs_done: usize,
    pub reset_logged: bool,
}

impl StartPoint {
    pub fn of(resumed: Option<&Checkpoint>) -> Self {
        resumed.map_or(
            Self {
                epochs_done: 0,
                reset_logged: false,
            },
            |c| Self {
                epochs_done: c.state.epochs_done,
                reset_logged: !c.state.log.is_empty(),
            },
        )
    }
}

pub fn path(dir: &Path) -> PathBuf {
    super::run::RunFolder(dir.to_path_buf()).checkpoint()
}

/// Writes `state` and `tensors` to `dir`/checkpoint.safetensors, replacing the previous one only
/// once the new one is complete.
pub fn save(dir: &Path, state: &RunState, tensors: &HashMap<String, Tensor>) -> Result<()> {
    save_state(&path(dir), state, tensors)
}

/// The checkpoint in `dir`, if there is one; tensors land on `device`.
pub fn load(dir: &Path, device: &Device) -> Result<Option<Checkpoint>> {
    Ok(load_state(&path(dir), device)?.map(|(state, tensors)| Checkpoint { state, tensors }))
}

/// Any serialisable state with named tensors, in one safetensors file written atomically.
pub fn save_state(
    file: &Path,
    state: &impl Serialize,
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    let json = serde_json::to_vec(state)?;
    let mut all = tensors.clone();
    all.insert(
        STATE.into(),
        Tensor::from_vec(json.clone(), json.len(), &Device::Cpu)?,
    );
    // Safetensors on disk are host data.
    let mut all: HashMap<String, Tensor> = all
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let checksums = all
        .iter()
        .map(|(name, t)| Ok((name.clone(), tensor_sha256(t)?)))
        .collect::<Result<BTreeMap<_, _>>>()?;
    let checksums = serde_json::to_vec(&checksums)?;
    all.insert(
        CHECKSUMS.into(),
        Tensor::from_vec(checksums.clone(), checksums.len(), &Device::Cpu)?,
    );
    if let Some(parent) = file.parent() {
        crate::io::ensure_dir(parent)?;
    }
    produce_atomic(file, |tmp| {
        candle_core::safetensors::save(&all, tmp)
            .with_context(|| format!("writing {}", tmp.display()))
    })
}

/// What [`save_state`] wrote, if `file` exists; tensors land on `device`.
pub fn load_state<S: DeserializeOwned>(
    file: &Path,
    device: &Device,
) -> Result<Option<(S, HashMap<String, Tensor>)>> {
    if !crate::io::is_present(file) {
        return Ok(None);
    }
    let bytes = crate::io::read_input(file, crate::io::limits::TENSORS)?;
    let mut tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .with_context(|| format!("{}: not a readable checkpoint", file.display()))?;
    drop(bytes);
    verify_checksums(file, &mut tensors)?;
    let json = tensors
        .remove(STATE)
        .with_context(|| format!("{}: no {STATE} in the checkpoint", file.display()))?
        .to_vec1::<u8>()?;
    let state: S = serde_json::from_slice(&json)
        .with_context(|| format!("{}: unreadable {STATE}", file.display()))?;
    let tensors = tensors
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_device(device)?)))
        .collect::<Result<_>>()?;
    Ok(Some((state, tensors)))
}

/// SHA-256 of a tensor's dtype, shape and values (little-endian bytes in row-major order).
fn tensor_sha256(tensor: &Tensor) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(format!("{:?} {:?};", tensor.dtype(), tensor.dims()));
    let flat = tensor.flatten_all()?;
    match tensor.dtype() {
        DType::U8 => hasher.update(flat.to_vec1::<u8>()?),
        DType::U32 => flat
            .to_vec1::<u32>()?
            .iter()
            .for_each(|v| hasher.update(v.to_le_bytes())),
        DType::I64 => flat
            .to_vec1::<i64>()?
            .iter()
            .for_each(|v| hasher.update(v.to_le_bytes())),
        DType::F32 => flat
            .to_vec1::<f32>()?
            .iter()
            .for_each(|v| hasher.update(v.to_le_bytes())),
        DType::F64 => flat
            .to_vec1::<f64>()?
            .iter()
            .for_each(|v| hasher.update(v.to_le_bytes())),
        other => bail!("a checkpoint tensor of dtype {other:?}: not one a checkpoint holds"),
    }
    Ok(crate::io::hex(&hasher.finalize()))
}

/// Removes `sha256.json` from `tensors` and checks every tensor (the state included) against it:
/// the same names, the same digests.
fn verify_checksums(file: &Path, tensors: &mut HashMap<String, Tensor>) -> Result<()> {
    let listed = tensors.remove(CHECKSUMS).with_context(|| {
        format!(
            "{}: no {CHECKSUMS} (written before checkpoints carried checksums), so it cannot be verified; start the run again (drop --resume, or remove {} for `reproduce`)",
            file.display(),
            file.parent().map_or(file.display(), |d| d.display())
        )
    })?;
    let listed: BTreeMap<String, String> = serde_json::from_slice(&listed.to_vec1::<u8>()?)
        .with_context(|| format!("{}: unreadable {CHECKSUMS}", file.display()))?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    if !names.iter().copied().eq(listed.keys()) {
        bail!(
            "{}: its tensors are not those its {CHECKSUMS} lists (the file is corrupt)",
            file.display()
        );
    }
    for name in names {
        if tensor_sha256(&tensors[name])? != listed[name] {
            bail!(
                "{}: tensor {name} does not match its checksum (the file is corrupt)",
                file.display()
            );
        }
    }
    Ok(())
}

impl RunIdentity {
    /// Fails with the first field that differs, naming the checkpoint.
    pub fn ensure_same(&self, saved: &RunIdentity, file: &Path) -> Result<()> {
        let (ours, theirs) = (serde_json::to_value(self)?, serde_json::to_value(saved)?);
        match crate::io::first_difference(&ours, &theirs) {
            Some(difference) => bail!(
                "--resume: {} belongs to another run ({difference}); use another --out or drop --resume",
                file.display()
            ),
            None => Ok(()),
        }
    }
}

/// Named tensors of `params` under `prefix.`.
pub fn named_tensors(prefix: &str, params: &[(String, Var)]) -> HashMap<String, Tensor> {
    params
        .iter()
        .map(|(name, var)| (format!("{prefix}.{name}"), var.as_tensor().clone()))
        .collect()
}

/// Sets `params` from what [`named_tensors`] saved under `prefix.`.
pub fn restore_params(
    prefix: &str,
    params: &[(String, Var)],
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    for (name, var) in params {
        let key = format!("{prefix}.{name}");
        var.set(
            tensors
                .get(&key)
                .with_context(|| format!("checkpoint lacks {key}"))?,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state whose floats do not survive a decimal round trip unless written exactly.
    fn awkward_state() -> RunState {
        let identity = RunIdentity {
            config: RunConfig {
                eta: 0.2,
                ..RunConfig::paper(&crate::data::DatasetName::Trec).unwrap()
            },
            backbone_sha256: "00".into(),
            pretrain_n: 100,
            test_n: 50,
        };
        RunState {
            identity,
            baseline_test_acc: 0.1 + 0.2,
            pretrain_losses: vec![1.0 / 3.0, std::f64::consts::PI],
            epochs_done: 4,
            optimizer_step: 12,
            log: vec![EpochMetrics {
                epoch: 4,
                train_loss: 0.1 + 0.2,
                train_eval_loss: f64::NAN,
                train_acc: 1.0,
                memorization: f64::NAN,
                clean_train_acc: 2.0 / 3.0,
                max_cls_attention: 0.3,
                attention_entropy: 1e-300,
                test_loss: None,
                test_acc: Some(0.7),
                qk_spectrum: None,
                rank_collapse: Some(0.25),
            }],
            attention_reset: Some(Snapshot {
                epoch: 0,
                rows: vec![2, 0],
                predictions: vec![1, 0],
                attention: vec![vec![0.1 + 0.2, 0.7], vec![1.0 / 3.0]],
            }),
            float_kernels: "x86_64 avx512f, then x86_64 avx2+fma".into(),
            wall_seconds: 12.5,
        }
    }

    #[test]
    fn round_trips_tensors_and_state_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let var = Var::new(&[0.1f32, -3.7e-9, 1.0 / 3.0], &Device::Cpu).unwrap();
        let state = awkward_state();
        let identity = state.identity.clone();
        save(
            dir.path(),
            &state,
            &named_tensors("w", &[("x".into(), var.clone())]),
        )
        .unwrap();
        let loaded = load(dir.path(), &Device::Cpu).unwrap().unwrap();
        assert_eq!(
            loaded.state.baseline_test_acc.to_bits(),
            (0.1f64 + 0.2).to_bits()
        );
        assert_eq!(loaded.state.pretrain_losses, state.pretrain_losses);
        let (ours, theirs) = (&loaded.state.log[0], &state.log[0]);
        assert!(ours.memorization.is_nan());
        assert_eq!(ours.train_loss.to_bits(), theirs.train_loss.to_bits());
        assert_eq!(
            ours.clean_train_acc.to_bits(),
            theirs.clean_train_acc.to_bits()
        );
        assert_eq!(ours.attention_entropy, 1e-300);
        assert_eq!(loaded.state.attention_reset, state.attention_reset);
        assert_eq!(loaded.state.float_kernels, state.float_kernels);
        assert_eq!(loaded.state.wall_seconds, 12.5);
        let other = Var::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        restore_params("w", &[("x".into(), other.clone())], &loaded.tensors).unwrap();
        assert_eq!(
            other.as_tensor().to_vec1::<f32>().unwrap(),
            var.as_tensor().to_vec1::<f32>().unwrap()
        );
        identity
            .ensure_same(&loaded.state.identity, Path::new("c"))
            .unwrap();
        let changed = RunIdentity {
            config: RunConfig {
                eta: 0.3,
                ..identity.config.clone()
            },
            ..identity
        };
        let err = changed
            .ensure_same(&loaded.state.identity, Path::new("c"))
            .unwrap_err();
        assert!(
            err.to_string().contains("config.eta 0.2 there, 0.3 here"),
            "{err}"
        );
        assert!(
            load(&dir.path().join("none"), &Device::Cpu)
                .unwrap()
                .is_none()
        );
    }
}
