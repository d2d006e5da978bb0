//! Flags and checks more than one command shares: where a real-data run finds its data,
//! checkpoints and cache and where it computes (`PlaceArgs`, `DataDirArg`), `--jobs`, and lists
//! that must hold each value once.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::kernels::Precision;
use crate::runtime::DeviceKind;

/// Where a real-data run finds its data and checkpoints, caches features and computes.
#[derive(Args, Debug, Clone)]
pub struct PlaceArgs {
    #[command(flatten)]
    pub root: DataDirArg,
    /// Folder holding checkpoints as <org>/<name>/ [default: $BENIGN_MODELS_DIR]
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// Feature cache [default: $BENIGN_CACHE_DIR, else the platform cache folder/benign-attention]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Where the backbone makes the features (cuda needs a build with `--features cuda`)
    /// [default: cpu]
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Where phases 1 and 2 run, whatever --device says [default: the host's cores, where they
    /// run fastest today; docs/design.md, "Placement"]
    #[arg(long, value_enum)]
    pub train_device: Option<DeviceKind>,
    /// What the frozen backbone's products compute in: f32 (HF parity), or bf16 on the CPU's bf16
    /// units (AMX or AVX512-BF16), features close to f32's but not the same; phases 1 and 2 stay f32
    /// [default: f32]
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
}

impl PlaceArgs {
    /// The library's places (the device is part of a run's configuration).
    pub fn places(&self) -> crate::train::run::Places {
        crate::train::run::Places {
            data_dir: self.root.data_dir.clone(),
            data_mirror: self.root.mirror(),
            models_dir: self.models_dir.clone(),
            cache_dir: self.cache_dir.clone(),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct DataDirArg {
    /// Folder holding one folder per dataset [default: $BENIGN_DATA_DIR, else ./datasets]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Base URL tried before a dataset's canonical URLs when a file must be downloaded, laid out
    /// as a data root (<URL>/<dataset folder>/<file>) [default: $BENIGN_DATA_MIRROR]
    #[arg(long, value_name = "URL")]
    pub data_mirror: Option<String>,
}

impl DataDirArg {
    /// The mirror of the flag, else of `$BENIGN_DATA_MIRROR`.
    pub fn mirror(&self) -> Option<String> {
        crate::data::fetch::mirror(self.data_mirror.as_deref())
    }
}

/// The most worker threads `--jobs` may ask for: far beyond any machine's cores, and few enough
/// that starting them is refused at once rather than after seconds of thread creation.
const MAX_JOBS: usize = 4096;

/// `--jobs`: at least 1 and at most [`MAX_JOBS`].
pub fn check_jobs(jobs: Option<usize>) -> Result<()> {
    match jobs {
        Some(0) => anyhow::bail!("--jobs must be at least 1, got 0"),
        Some(j) if j > MAX_JOBS => {
            anyhow::bail!("--jobs must be at most {MAX_JOBS} (worker threads), got {j}")
        }
        _ => Ok(()),
    }
}

/// Refuses a list that holds a value twice: two runs of one configuration would share a folder
/// (−0 and 0 are one value).
pub fn once_each<T: PartialEq + std::fmt::Display>(flag: &str, values: &[T]) -> Result<()> {
    for (k, value) in values.iter().enumerate() {
        if values[..k].contains(value) {
            bail!("{flag}: {value} is given twice; give each value once");
        }
    }
    Ok(())
}
