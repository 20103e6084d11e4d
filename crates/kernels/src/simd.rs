//! Vector-width dispatch and fixed-lane reductions shared by the kernels.

/// Independent accumulators of an f64 reduction: enough to fill a vector
/// register and hide the addition latency, fixed so results never depend on
/// the machine.
pub(crate) const LANES: usize = 8;

/// Runs `f` compiled for 256-bit AVX vectors (and AVX2's 256-bit integer
/// operations, which the sign packing uses) when the CPU has them.
///
/// Never FMA: fused multiply-adds round differently, and the same config and
/// seed must give the same bits on every x86-64 machine. AVX computes exactly
/// what SSE2 does, twice as wide (sqrt and division are correctly rounded in
/// both); AVX2 adds only integer operations.
#[inline(always)]
pub fn with_avx<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx,avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx")]
        fn avx<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the running CPU supports AVX2, checked just above.
            return unsafe { avx2(f) };
        }
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the running CPU supports AVX, checked just above.
            return unsafe { avx(f) };
        }
    }
    f()
}
