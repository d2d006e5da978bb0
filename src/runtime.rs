//! Process-wide settings: threads, applied once at start-up before any thread exists, and the
//! compute device a run asks for.
//!
//! candle runs element-wise ops on its own spinning barrier pool, shared by the whole process
//! behind one lock, and without RAYON_NUM_THREADS it re-reads the CPU count from /proc on every
//! matrix product. Measured on this project's 2-core machine, one barrier-pool thread made backbone
//! extraction faster (ViT-Ti 15.7 vs 12.0 images/s) and keeps concurrent runs (`reproduce
//! --jobs`) from serialising on that lock; matrix products keep all cores through rayon.
//! Variables the user has set are left alone.

/// Sets CANDLE_NUM_THREADS=1 and RAYON_NUM_THREADS=<cores> unless already set.
///
/// # Safety
/// Must run before any other thread is started (it writes the process environment).
pub unsafe fn configure_threads() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: the caller guarantees no other thread reads or writes the environment.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // SAFETY: as above.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", cores.to_string()) };
    }
}

/// Where the backbone and the training compute: part of a run's configuration, since results
/// differ in the last float bits between devices.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    /// The device, or one line on how to get it.
    pub fn device(self) -> anyhow::Result<candle_core::Device> {
        match self {
            DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
            DeviceKind::Cuda if !cfg!(feature = "cuda") => anyhow::bail!(
                "--device cuda: this binary was built without CUDA; rebuild with `cargo build --release --features cuda` (needs the CUDA toolkit and an NVIDIA driver)"
            ),
            DeviceKind::Cuda => candle_core::Device::new_cuda(0)
                .map_err(|e| anyhow::anyhow!("--device cuda: no usable GPU 0 ({e})")),
        }
    }
}
