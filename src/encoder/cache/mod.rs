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

mod shard_file;

mod shard_key;

mod store;

pub use shard_key::*;
pub use store::*;
