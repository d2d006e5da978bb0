//! Which vector instructions the kernels run with, chosen once per process from what the CPU
//! reports. The crate's baseline target is SSE2; every hand-written kernel is also compiled for
//! AVX2 + FMA and for AVX-512, and [`SimdArm::detected`] picks among them at run time. The arms
//! make the same IEEE operations in the same order per output, so they agree bit for bit (the
//! kernels' tests compare each arm the CPU has with the portable one). The one exception is the
//! widest, [`SimdArm::Amx`]: its bf16 products sum in the tile unit's own order ([`super::amx`]),
//! so bf16 features made on it differ in their last bits from those made with `vdpbf16ps`, and
//! the feature cache keys the two apart ([`super::bf16::Precision::arithmetic`]).

use std::sync::OnceLock;

/// The widest set of vector instructions a kernel may use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SimdArm {
    /// Plain Rust, whatever the compiler makes of it for the baseline target.
    Portable,
    /// AVX2 and FMA: 8 f32 lanes, 16 registers.
    Avx2,
    /// AVX-512F (with AVX2 and FMA): 16 lanes, 32 registers.
    Avx512,
    /// AVX-512 and Intel's AMX tiles (AMX-TILE and AMX-BF16, Sapphire Rapids and later), with
    /// Linux's permission to use them: bf16 products on the tiles, f32 ones as [`Self::Avx512`].
    Amx,
}

impl SimdArm {
    /// What this CPU has, detected once; `BENIGN_SIMD_ARM=avx512` (or `avx2`, `portable`) caps
    /// it, so that a bench can time the narrower arms on one machine (the f32 products' numbers
    /// are the same on every arm).
    pub(crate) fn detected() -> Self {
        static ARM: OnceLock<SimdArm> = OnceLock::new();
        *ARM.get_or_init(|| {
            let cap = match std::env::var("BENIGN_SIMD_ARM").as_deref() {
                Ok("portable") => SimdArm::Portable,
                Ok("avx2") => SimdArm::Avx2,
                Ok("avx512") => SimdArm::Avx512,
                _ => SimdArm::Amx,
            };
            let arm = Self::of_cpu().min(cap);
            // The tiles' state is large (8 KiB a thread): Linux lends it only when asked.
            if arm == SimdArm::Amx && !amx_permitted() {
                return SimdArm::Avx512;
            }
            arm
        })
    }

    /// The widest arm this CPU runs (before Linux's permission for the tiles).
    fn of_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 && is_x86_feature_detected!("avx512f") {
                return if amx_on_cpu() && bf16_dot_on_cpu() {
                    SimdArm::Amx
                } else {
                    SimdArm::Avx512
                };
            }
            if avx2 {
                return SimdArm::Avx2;
            }
        }
        SimdArm::Portable
    }

    /// The arms this CPU can run, the portable one first: what the kernels' tests compare.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Self> {
        [Self::Portable, Self::Avx2, Self::Avx512, Self::Amx]
            .into_iter()
            .filter(|&arm| arm <= Self::detected().max(Self::of_cpu().min(Self::Avx512)))
            .collect()
    }

    /// The arm of the f32 kernels: the tiles' arm has AVX-512's.
    pub(crate) fn vector(self) -> Self {
        self.min(Self::Avx512)
    }
}

/// Whether the CPU computes bf16 dot products in hardware (`vdpbf16ps`: AVX512-BF16, on AMD Zen 4
/// and later and Intel Cooper Lake and later), which `--precision bf16` runs on.
pub(crate) fn bf16_dot() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| SimdArm::of_cpu() >= SimdArm::Avx512 && bf16_dot_on_cpu())
}

/// Whether the CPU reports AVX512-BF16.
fn bf16_dot_on_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22).
fn amx_on_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 7 exists on every x86-64 CPU with AVX-512 (checked before this).
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        leaf.edx & (1 << 24) != 0 && leaf.edx & (1 << 22) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether Linux lets this process use the tiles, asked once: `arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)` (the permission holds for every thread of the process).
pub(super) fn amx_permitted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a request for a permission; it reads and writes no memory of ours.
            unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}
