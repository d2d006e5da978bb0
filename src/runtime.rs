//! Process-wide settings: threads and the allocator, applied once at start-up before any thread
//! exists, and the compute device a run asks for.
//!
//! candle runs element-wise ops on its own spinning barrier pool, shared by the whole process
//! behind one lock, and without RAYON_NUM_THREADS it re-reads the CPU count from /proc on every
//! matrix product. One barrier-pool thread made backbone extraction faster (figures in
//! docs/design.md, "Process settings") and keeps concurrent runs (`reproduce --jobs`) from
//! serialising on that lock; matrix products keep all cores through rayon.
//! Variables the user has set are left alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
/// freed pages mapped and reuses them, which nearly doubled ViT-B/16's extraction (docs/design.md,
/// "Process settings"). Peak RSS is the high-water mark of what is live
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
    /// The name the flags take.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// The device, or one line on how to get it.
    pub fn device(self) -> anyhow::Result<candle_core::Device> {
        self.device_of("--device")
    }

    /// The device `flag` asked for, or one line naming the flag on how to get it.
    pub fn device_of(self, flag: &str) -> anyhow::Result<candle_core::Device> {
        match self {
            DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
            DeviceKind::Cuda if !cfg!(feature = "cuda") => anyhow::bail!(
                "{flag} cuda: this binary was built without CUDA; rebuild with `cargo build --release --features cuda` (needs the CUDA toolkit and an NVIDIA driver)"
            ),
            DeviceKind::Cuda => candle_core::Device::new_cuda(0)
                .map_err(|e| anyhow::anyhow!("{flag} cuda: no usable GPU 0 ({e})")),
        }
    }
}

/// Where each part of a run computes: the one rule of placement (docs/design.md, "Placement").
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// The frozen backbone's forward, which makes the features (`--device`).
    pub backbone: DeviceKind,
    /// Phase 1: the classifier on the clean pretrain features.
    pub phase1: DeviceKind,
    /// Phase 2: the stack's steps and evaluations.
    pub phase2: DeviceKind,
}

impl Placement {
    /// The backbone where `device` says; both phases where `train_device` says, else on the
    /// host. A GPU extracts features many times faster than a few cores, but the phases are
    /// chains of small operations that the host pass runs on the machine's cores faster than
    /// candle's generic operations run them on a GPU (docs/performance.md, "On a GPU").
    pub fn of(device: DeviceKind, train_device: Option<DeviceKind>) -> Self {
        let phases = train_device.unwrap_or(DeviceKind::Cpu);
        Self {
            backbone: device,
            phase1: phases,
            phase2: phases,
        }
    }

    /// The phases' device (both phases run on one).
    pub fn phases(self) -> DeviceKind {
        self.phase2
    }

    /// Whether the backbone and the phases run on different devices.
    pub fn is_split(self) -> bool {
        self.backbone != self.phases()
    }

    /// One line for a run's stderr.
    pub fn describe(self) -> String {
        format!(
            "the backbone on {}, phase 1 on {}, phase 2 on {}",
            self.backbone.name(),
            self.phase1.name(),
            self.phase2.name()
        )
    }
}

/// The widest vector instruction set this CPU gives the float kernels: gemm (candle's matrix
/// products, built with its AVX-512 kernels) and the crate's own kernels choose theirs at run
/// time, and the choices sum in different orders. The same run on two CPUs therefore agrees
/// only to float rounding (docs/design.md, "Process settings"), so a run records what it ran with.
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

/// `work` on this thread while the other threads of its rayon pool look for work without pause,
/// instead of going to sleep whenever it runs serial code between two parallel sections.
///
/// A phase-2 step at ViT-B's width forks and joins about thirty times in 7–10 ms, with a few
/// microseconds of serial work between. rayon's idle threads sleep after a few dozen empty polls,
/// and on a virtual machine a sleeping CPU takes tens of microseconds to wake: the loop's thread
/// then ran much of each parallel section alone, having taken back the half it had left for the
/// other. Kept to the span of `work`, the cost is a core busy while it runs, as an OpenMP
/// runtime's threads spin between its parallel regions; the polling yields the CPU to other
/// processes now and then. Outside a pool, or in a pool of one, `work` simply runs.
pub fn with_workers_awake<R>(work: impl FnOnce() -> R) -> R {
    let Some(this_thread) = rayon::current_thread_index() else {
        return work();
    };
    if rayon::current_num_threads() < 2 {
        return work();
    }
    /// Ends the polling when `work` returns or unwinds.
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = Done(Arc::new(AtomicBool::new(false)));
    let flag = Arc::clone(&done.0);
    rayon::spawn_broadcast(move |context| {
        // This thread's copy runs when it next waits in a join: it has work of its own.
        if context.index() != this_thread {
            poll_until(&flag);
        }
    });
    work()
}

/// Threads polling in [`with_workers_awake`] now: what its test watches, at the cost of two
/// atomic adds per epoch.
static POLLING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is polling: a poll started inside a job that a poll is running must
    /// return at once (see [`poll_until`]).
    static IN_POLL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long a poll waits with nothing to run before it lets its thread sleep as rayon's would.
const IDLE_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs the pool's pending jobs as they come, until `done`, or until nothing came for
/// [`IDLE_LIMIT`].
///
/// A poll runs jobs inside itself, and a job may wait in a join, where its thread runs whatever
/// is queued for it, the next call's poll among them. A poll that outlived its own work (it was
/// in `yield_now` when the work returned) can so run a job of the next work, and the next
/// work's poll then starts inside that job: it would poll until the next work ends, which needs
/// the job under it to return first (a phase-2 run once hung so). Hence a poll inside a poll
/// returns at once, and no poll spins for long with nothing to run.
fn poll_until(done: &AtomicBool) {
    if IN_POLL.with(|in_poll| in_poll.replace(true)) {
        return;
    }
    /// Clears the flag however the poll ends.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_POLL.with(|in_poll| in_poll.set(false));
            POLLING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    POLLING.fetch_add(1, Ordering::Relaxed);
    let _leave = Leave;
    let mut idle = 0u32;
    let mut idle_since = std::time::Instant::now();
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
            continue;
        }
        if idle == 0 {
            idle_since = std::time::Instant::now();
        }
        idle = idle.wrapping_add(1);
        if idle.is_multiple_of(256) {
            if idle_since.elapsed() > IDLE_LIMIT {
                return;
            }
            // Now and then the CPU goes to any other process that wants it.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The placement rule: the backbone follows `--device`, the phases `--train-device`, and
    /// without it the host.
    #[test]
    fn the_phases_run_on_the_host_unless_asked_otherwise() {
        use DeviceKind::{Cpu, Cuda};
        let all = |d| Placement {
            backbone: d,
            phase1: d,
            phase2: d,
        };
        assert_eq!(Placement::of(Cpu, None), all(Cpu));
        assert_eq!(Placement::of(Cpu, Some(Cpu)), all(Cpu));
        assert_eq!(Placement::of(Cuda, Some(Cuda)), all(Cuda));
        let gpu_features = Placement::of(Cuda, None);
        assert_eq!(
            gpu_features,
            Placement {
                backbone: Cuda,
                phase1: Cpu,
                phase2: Cpu
            }
        );
        assert!(gpu_features.is_split() && !all(Cuda).is_split());
        assert_eq!(
            gpu_features.describe(),
            "the backbone on cuda, phase 1 on cpu, phase 2 on cpu"
        );
        assert_eq!(Placement::of(Cpu, Some(Cuda)).phases(), Cuda);
    }

    /// Whether `test` holds within a second.
    fn soon(test: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            if test() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    fn polling() -> usize {
        POLLING.load(Ordering::Relaxed)
    }

    /// The tests that count polling threads, one at a time.
    static POLL_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Whether `f` returns within two seconds, run on a thread of its own.
    fn returns_soon(f: impl FnOnce() + Send + 'static) -> bool {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = sender.send(());
        });
        receiver.recv_timeout(Duration::from_secs(2)).is_ok()
    }

    /// A poll started inside a poll returns at once, and a poll with nothing to run lets its
    /// thread go after [`IDLE_LIMIT`], though its work has not ended: the two ways out of the
    /// hang where a stale poll ran a job of the next work and that work's poll started inside it.
    #[test]
    fn a_poll_inside_a_poll_or_with_nothing_to_run_returns() {
        let _one_at_a_time = POLL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let pool = || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap()
        };
        let nested = pool();
        assert!(
            returns_soon(move || nested.install(|| {
                IN_POLL.with(|p| p.set(true));
                poll_until(&AtomicBool::new(false));
                assert!(
                    IN_POLL.with(|p| p.get()),
                    "the outer poll's flag was cleared"
                );
                IN_POLL.with(|p| p.set(false));
            })),
            "a nested poll polled on"
        );
        let idle = pool();
        assert!(
            returns_soon(move || idle.install(|| poll_until(&AtomicBool::new(false)))),
            "an idle poll never let go"
        );
        assert!(soon(|| polling() == 0));
    }

    /// The other thread polls while the work runs, takes part in it, and stops polling when the
    /// work returns and when it panics; a pool of one and no pool just run the work.
    #[test]
    fn the_other_thread_polls_for_the_span_of_the_work_only() {
        let _one_at_a_time = POLL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let sum = pool.install(|| {
            with_workers_awake(|| {
                assert!(soon(|| polling() == 1), "no thread polls during the work");
                (0..1000u64)
                    .map(|k| {
                        let (a, b) = rayon::join(|| k, || 2 * k);
                        a + b
                    })
                    .sum::<u64>()
            })
        });
        assert_eq!(sum, 3 * 999 * 1000 / 2);
        assert!(soon(|| polling() == 0), "a thread polls after the work");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| with_workers_awake(|| panic!("work failed")))
        }));
        assert!(unwound.is_err());
        assert!(soon(|| polling() == 0), "a thread polls after a panic");
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(single.install(|| with_workers_awake(|| 7)), 7);
        assert_eq!(with_workers_awake(|| 8), 8);
        assert_eq!(polling(), 0);
    }
}
