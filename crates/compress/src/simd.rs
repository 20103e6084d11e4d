//! Vector-width dispatch and fixed-lane reductions shared by the kernels.

/// Independent accumulators of an f64 reduction: enough to fill a vector
/// register and hide the addition latency, fixed so results never depend on
/// the machine.
pub(crate) const LANES: usize = 8;

/// The instruction sets a loop can be compiled for, widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdTier {
    /// 512-bit AVX-512 (F, BW, DQ, VL): twice AVX2's lanes, which the
    /// compute-bound loops (GELU's f64 erf, dropout's hash) feel.
    Avx512,
    /// 256-bit AVX with AVX2's integer operations.
    Avx2,
    /// 256-bit AVX.
    Avx,
    /// The baseline x86-64 (SSE2) or non-x86 build.
    Portable,
}

impl SimdTier {
    /// The widest tier the running CPU supports.
    pub fn detect() -> SimdTier {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                return SimdTier::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return SimdTier::Avx2;
            }
            if std::arch::is_x86_feature_detected!("avx") {
                return SimdTier::Avx;
            }
        }
        SimdTier::Portable
    }

    /// This tier and every narrower one the CPU supports, widest first (for
    /// tests that compare them).
    pub fn available() -> Vec<SimdTier> {
        let all = [
            SimdTier::Avx512,
            SimdTier::Avx2,
            SimdTier::Avx,
            SimdTier::Portable,
        ];
        all.into_iter().filter(|&t| t.is_supported()).collect()
    }

    /// Whether the running CPU can run this tier (the tiers nest: each
    /// includes every narrower one).
    pub fn is_supported(self) -> bool {
        // Declaration order is widest first.
        self as u8 >= SimdTier::detect() as u8
    }
}

/// Runs `f` compiled for the widest vectors the CPU has ([`SimdTier`]).
///
/// Never FMA: fused multiply-adds round differently, and the same config and
/// seed must give the same bits on every x86-64 machine. Every tier computes
/// exactly what SSE2 does, only wider (sqrt and division are correctly
/// rounded in all of them, and the compiler reorders no float operation), so
/// the tier changes the speed and never a bit (tested:
/// `every_tier_gives_the_same_bits`).
#[inline(always)]
pub fn with_avx<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: `detect` returns a tier the running CPU supports.
    unsafe { run_in(SimdTier::detect(), f) }
}

/// Runs `f` compiled for `tier`, which the CPU must support (from
/// [`SimdTier::detect`] or [`SimdTier::available`]); a tier it lacks runs
/// portable code.
#[inline(always)]
pub fn with_tier<R>(tier: SimdTier, f: impl FnOnce() -> R) -> R {
    if tier.is_supported() {
        // SAFETY: the running CPU supports the tier, checked just above.
        unsafe { run_in(tier, f) }
    } else {
        f()
    }
}

/// Runs `f` compiled for `tier`.
///
/// # Safety
/// The running CPU must support `tier`.
#[inline(always)]
unsafe fn run_in<R>(tier: SimdTier, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx,avx2,avx512f,avx512bw,avx512dq,avx512vl")]
        fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx,avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx")]
        fn avx<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the caller's contract: the CPU supports `tier`.
        match tier {
            SimdTier::Avx512 => return unsafe { avx512(f) },
            SimdTier::Avx2 => return unsafe { avx2(f) },
            SimdTier::Avx => return unsafe { avx(f) },
            SimdTier::Portable => {}
        }
    }
    let _ = tier;
    f()
}
