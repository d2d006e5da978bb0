//! What a shard is, apart from how it is read and written: its key (everything its features
//! depend on), its sidecar (the key and its checksums), what it stores per sample, and a trusted
//! shard as a request reads it. Both the store and the shard files speak of these.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

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

/// Everything a shard's features depend on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct ShardKey {
    pub(super) version: u32,
    pub(super) backbone: String,
    pub(super) weights_sha256: String,
    pub(super) config_sha256: String,
    pub(super) preprocessing: String,
    pub(super) dataset: String,
    pub(super) split: String,
    pub(super) contents: Contents,
    pub(super) release_index: Vec<usize>,
    /// `Inputs::sample_digest` of each sample, aligned with `release_index`.
    pub(super) sample_digest: Vec<String>,
    /// The device the backbone ran on when it is not the CPU ("cuda"): results differ between
    /// devices in the last float bits, so a CPU run never reads a GPU's features or the reverse.
    /// Absent for the CPU, whose shards keep the names they had before devices were told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) device: Option<String>,
    /// What computed the features: [`EXTRACTION_VERSION`] and the CPU's float kernels
    /// ([`crate::runtime::float_kernels`]). Another version of extraction's arithmetic, or
    /// another family of kernels (AVX-512 against AVX2), gives other features in the last bits:
    /// they are extracted again, with a warning, not reused. Absent in shards written before it
    /// was recorded, which are therefore never reused.
    #[serde(default)]
    pub(super) extraction: Option<String>,
    /// The products' arithmetic when not f32 ("bf16", "bf16-amx"); absent for f32, whose shards keep their
    /// names and folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) precision: Option<String>,
}

/// The version of extraction's arithmetic (the backbones' forward, the preprocessing): raised
/// whenever a change to it changes a feature's bits, so that caches filled before are not reused.
pub const EXTRACTION_VERSION: u32 = 1;

/// What a shard written now records as its [`ShardKey::extraction`].
pub(super) fn extraction_stamp() -> String {
    format!(
        "extraction {EXTRACTION_VERSION}, {}",
        crate::runtime::float_kernels()
    )
}

/// A shard's sidecar: its key and the checksums of its tensors: sha256 of each small tensor's
/// bytes, and a digest of each sample's layer-input rows (read one sample at a time).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Sidecar {
    pub(super) key: ShardKey,
    pub(super) tensor_sha256: BTreeMap<String, String>,
    /// `layer_rows::rows_digest` per sample, with `Contents::Full`.
    pub(super) row_digest: Vec<String>,
    /// Tokens per sample before its padding was cut.
    pub(super) tokens: usize,
}

impl ShardKey {
    pub(super) fn file_stem(&self) -> Result<String> {
        Ok(format!("shard-{}", &crate::io::json_digest(self)?[..16]))
    }
}

/// A trusted shard as a request reads it: its small tensors in memory, and where its samples'
/// layer inputs are in its file.
pub(super) struct OpenShard {
    pub(super) small: HashMap<String, Tensor>,
    /// Per sample: byte offset of its first layer-input row, and its rows' digest.
    pub(super) rows: Vec<(u64, String)>,
    pub(super) lengths: Vec<usize>,
    pub(super) file: std::sync::Arc<PathBuf>,
    pub(super) tokens: usize,
}
