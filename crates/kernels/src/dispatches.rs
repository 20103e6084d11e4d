//! Kernel dispatches counted as they are issued, by kind (matmul,
//! elementwise, reduce, copy, other), for `bench model` on a cubecl device:
//! a proxy for the step's launch overhead that CI can measure on lavapipe
//! without a GPU (fusion's gain shows as fewer elementwise dispatches).
//!
//! cubecl calls an installed [`LaunchObserver`] on the issuing thread for
//! every kernel launch, before it is submitted; nothing is timed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cubecl::logging::{LaunchObservation, LaunchObserver};

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
struct Counts(Mutex<BTreeMap<&'static str, u64>>);

impl LaunchObserver for Counts {
    fn launched(&self, kernel: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kernel)
            .or_default() += 1;
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
        let counts = Arc::new(Counts::default());
        let watching = LaunchObservation::new(counts.clone());
        Self {
            counts,
            _watching: watching,
        }
    }

    /// The dispatches so far, by kernel name.
    pub fn by_kernel(&self) -> BTreeMap<&'static str, u64> {
        self.counts
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
