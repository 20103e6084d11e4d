//! Kernel dispatches counted as they are issued, by kind (matmul,
//! elementwise, reduce, copy, other), for `bench model` on a cubecl device:
//! a proxy for the step's launch overhead that CI can measure on lavapipe
//! without a GPU (fusion's gain shows as fewer elementwise dispatches).
//!
//! cubecl calls an installed [`LaunchObserver`] on the issuing thread for
//! every kernel launch, before it is submitted. Counted alone, nothing is
//! timed; [`DispatchCounter::start_timed`] also asks cubecl to time every
//! launch on the device ([`TimingRequest::Deferred`]: two timestamps around
//! each kernel, read only once the pass is over, so the kernels still run
//! back to back), the per-kernel device time `bench model --kernel-times`
//! breaks a step down by (what `results/gpu-cuda-profile/` had to get from
//! cubecl's profiling log, which times each kernel with a wait).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cubecl::logging::{
    Duration, LaunchObservation, LaunchObserver, ProfileDuration, TimingMethod, TimingRequest,
};

/// What a kernel does, as its name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DispatchKind {
    /// A matrix multiplication (cubek's matmul kernels).
    Matmul,
    /// A reduction (sums, means, arg-max, softmax's statistics).
    Reduce,
    /// A copy or layout change (into-contiguous, slice assignment, cast).
    Copy,
    /// An element-wise kernel, fused or not.
    Elementwise,
    /// Anything else (terse's own kernels: compression, optimizer passes).
    Other,
}

impl DispatchKind {
    /// Every kind, in report order.
    pub const ALL: [DispatchKind; 5] = [
        Self::Matmul,
        Self::Elementwise,
        Self::Reduce,
        Self::Copy,
        Self::Other,
    ];

    /// The kind of a kernel called `name` (cubecl's full type name of the
    /// kernel).
    pub fn of(name: &str) -> Self {
        let lower = name.to_ascii_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
        if has(&["matmul", "gemm", "conv"]) {
            Self::Matmul
        } else if has(&["reduce", "argmax", "argmin", "cumsum", "cumprod"]) {
            Self::Reduce
        } else if has(&[
            "copy",
            "contiguous",
            "slice",
            "cast",
            "gather",
            "scatter",
            "select",
        ]) {
            Self::Copy
        } else if has(&[
            "elemwise",
            "elementwise",
            "fuse",
            "unary",
            "binary",
            "scalar",
            "fill",
        ]) {
            Self::Elementwise
        } else {
            Self::Other
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Matmul => "matmul",
            Self::Elementwise => "elementwise",
            Self::Reduce => "reduce",
            Self::Copy => "copy",
            Self::Other => "other",
        }
    }
}

#[derive(Default)]
struct Counts {
    launches: Mutex<BTreeMap<&'static str, u64>>,
    /// Whether launches are timed.
    timed: bool,
    /// Their measurements, unread (device timestamps).
    unread: Mutex<Vec<(&'static str, ProfileDuration)>>,
    /// Measurements cubecl read itself (with its profiling logger on), and
    /// whether on the device's clock.
    read: Mutex<Vec<(&'static str, Duration, bool)>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl LaunchObserver for Counts {
    fn launched(&self, kernel: &'static str) {
        *locked(&self.launches).entry(kernel).or_default() += 1;
    }

    fn timing(&self) -> TimingRequest {
        if self.timed {
            TimingRequest::Deferred
        } else {
            TimingRequest::None
        }
    }

    fn profiled(&self, kernel: &'static str, profile: ProfileDuration) {
        locked(&self.unread).push((kernel, profile));
    }

    fn timed(&self, kernel: &'static str, duration: Duration, method: TimingMethod) {
        let device = matches!(method, TimingMethod::Device);
        locked(&self.read).push((kernel, duration, device));
    }
}

/// Each kernel's launches and total time over the timed launches
/// ([`DispatchCounter::kernel_times`]).
#[derive(Debug, Clone, Default)]
pub struct KernelTimes {
    /// Kernel name → (timed launches, total milliseconds).
    pub by_kernel: BTreeMap<&'static str, (u64, f64)>,
    /// Launches timed by the host around a wait instead of the device's
    /// clock (a wgpu adapter without timestamp queries; lavapipe has them): their
    /// times include submission and, at a kernel's first launch, its
    /// compilation.
    pub host_timed: u64,
    /// Launches whose measurement the device did not give.
    pub unmeasured: u64,
    /// Launches cubecl read at once because its profiling logger was on
    /// (`cubecl.toml`, `CUBECL_DEBUG_OPTION=profile`): each waited for, so
    /// those kernels did not run back to back.
    pub waited: u64,
}

impl KernelTimes {
    /// Total milliseconds by kind (every kind present, zeros included).
    pub fn by_kind(&self) -> BTreeMap<DispatchKind, f64> {
        let mut kinds: BTreeMap<DispatchKind, f64> =
            DispatchKind::ALL.iter().map(|&k| (k, 0.0)).collect();
        for (name, (_, ms)) in &self.by_kernel {
            *kinds.entry(DispatchKind::of(name)).or_default() += ms;
        }
        kinds
    }
}

/// Counts every kernel dispatch the process issues while it lives.
pub struct DispatchCounter {
    counts: Arc<Counts>,
    _watching: LaunchObservation,
}

impl DispatchCounter {
    /// Starts counting.
    pub fn start() -> Self {
        Self::watching(Counts::default())
    }

    /// Starts counting and timing every launch on the device
    /// ([`DispatchCounter::kernel_times`]).
    pub fn start_timed() -> Self {
        Self::watching(Counts {
            timed: true,
            ..Counts::default()
        })
    }

    fn watching(counts: Counts) -> Self {
        let counts = Arc::new(counts);
        let watching = LaunchObservation::new(counts.clone());
        Self {
            counts,
            _watching: watching,
        }
    }

    /// The dispatches so far, by kernel name.
    pub fn by_kernel(&self) -> BTreeMap<&'static str, u64> {
        locked(&self.counts.launches).clone()
    }

    /// The times of the launches since the last call (of a
    /// [`DispatchCounter::start_timed`] counter; empty otherwise), their
    /// device timestamps read now: call it once the device has run them
    /// (after a read or a sync). Unlike [`Self::by_kernel`], which counts
    /// every dispatch since the counter started, these restart at each
    /// call: compare one call's with the counts over the same launches. A
    /// launch whose measurement cubecl refused (a graph capture, a failed
    /// read) or that it did not run (a dry run's skipped launch) reaches
    /// neither list, so it is missing from the counts.
    pub fn kernel_times(&self) -> KernelTimes {
        let mut times = KernelTimes::default();
        let mut add = |name: &'static str, duration: Duration| {
            let entry = times.by_kernel.entry(name).or_default();
            entry.0 += 1;
            entry.1 += duration.as_secs_f64() * 1e3;
        };
        let unread = std::mem::take(&mut *locked(&self.counts.unread));
        let read = std::mem::take(&mut *locked(&self.counts.read));
        let mut unmeasured = 0;
        for (name, profile) in unread {
            let device = matches!(profile.timing_method(), TimingMethod::Device);
            match futures_lite::future::block_on(profile.resolve()) {
                Some(ticks) => {
                    add(name, ticks.duration());
                    times.host_timed += u64::from(!device);
                }
                None => unmeasured += 1,
            }
        }
        times.waited = read.len() as u64;
        for (name, duration, device) in read {
            add(name, duration);
            times.host_timed += u64::from(!device);
        }
        times.unmeasured = unmeasured;
        times
    }

    /// The dispatches so far, by kind (every kind present, zeros included).
    pub fn by_kind(&self) -> BTreeMap<DispatchKind, u64> {
        let mut kinds: BTreeMap<DispatchKind, u64> =
            DispatchKind::ALL.iter().map(|&k| (k, 0)).collect();
        for (name, n) in self.by_kernel() {
            *kinds.entry(DispatchKind::of(name)).or_default() += n;
        }
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_sorted_by_what_their_names_say() {
        assert_eq!(
            DispatchKind::of("cubek_matmul::kernels::SimpleUnitMatmul<f32>"),
            DispatchKind::Matmul
        );
        assert_eq!(
            DispatchKind::of("burn_cubecl::kernel::reduce::ReduceKernel"),
            DispatchKind::Reduce
        );
        assert_eq!(
            DispatchKind::of("burn_cubecl::kernel::contiguous::into_contiguous"),
            DispatchKind::Copy
        );
        assert_eq!(
            DispatchKind::of("burn_cubecl_fusion::elemwise::ElemwiseKernel"),
            DispatchKind::Elementwise
        );
        assert_eq!(
            DispatchKind::of("terse_kernels::device::optim::adam_step"),
            DispatchKind::Other
        );
    }
}
