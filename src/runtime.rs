//! Process-wide settings: threads and the allocator, applied once at start-up before any thread
//! exists, and the compute device a run asks for.
//!
//! candle runs element-wise ops on its own spinning barrier pool, shared by the whole process
//! behind one lock, and without RAYON_NUM_THREADS it re-reads the CPU count from /proc on every
//! matrix product. Measured on this project's 2-core machine, one barrier-pool thread made backbone
//! extraction faster (ViT-Ti 15.7 vs 12.0 images/s) and keeps concurrent runs (`reproduce
//! --jobs`) from serialising on that lock; matrix products keep all cores through rayon.
//! Variables the user has set are left alone.

/// The process's start-up settings: CANDLE_NUM_THREADS=1 and RAYON_NUM_THREADS=<cores> unless
/// already set, and the allocator's [`keep_freed_memory`].
///
/// # Safety
/// Must run before any other thread is started (it writes the process environment).
pub unsafe fn configure_process() {
    keep_freed_memory();
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

/// The process allocator (every binary, test and bench linking this crate): mimalloc, see
/// [`keep_freed_memory`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (v2, the version libmimalloc-sys 0.1 builds), which
/// libmimalloc-sys does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Lets freed tensor buffers be reused instead of faulted in afresh. Every op allocates its output
/// and frees its inputs' temporaries, megabytes each; an allocator that hands freed memory back
/// to the kernel gets it back zeroed page by page on the next touch. perf on the encoder bench
/// put 20–30 % of a forward in the kernel's page clearing (`clear_page_erms`) with glibc's
/// malloc, whose blocks above 32 MiB are always fresh mappings. mimalloc with purging off keeps
/// freed pages mapped and reuses them: ViT-B/16 went from 2.2 to 4.1 images/s, ViT-Ti from 38.6
/// to 44.3 (idle, docs/performance.md). Peak RSS is the high-water mark of what is live
/// plus mimalloc's free lists; the scale bench and the MNIST runs measure it.
fn keep_freed_memory() {
    // SAFETY: sets one allocator option; any thread may call it at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
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

/// The widest vector instruction set this CPU gives the float kernels: gemm (candle's matrix
/// products, built with its AVX-512 kernels) and the crate's own kernels choose theirs at run
/// time, and the choices sum in different orders. The same run on two CPUs therefore agrees
/// only to float rounding (measured: MNIST n = 200, η = 0.2, seed 42 gave test accuracy 55.12 %
/// on an AVX-512 machine and 55.10 % on an AVX2 one), so a run records what it ran with.
pub fn float_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return "x86_64 avx512f";
        }
        if crate::kernels::avx2_fma() {
            return "x86_64 avx2+fma";
        }
        "x86_64 sse2"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH
    }
}
