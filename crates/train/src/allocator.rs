//! glibc malloc settings for training processes.
//!
//! A training step allocates and frees the same large activation and
//! gradient buffers every step. With glibc's defaults, freed blocks above
//! the (dynamic) mmap threshold go back to the kernel and every step
//! page-faults them in again: the BERT-base profile showed ~12% of its
//! samples in page faults, page clearing and TLB shootdowns. Keeping freed
//! memory in the heap (mmap only above glibc's 32 MiB maximum, trim only
//! above 2 GiB) measured 1.05–1.21× samples/s on BERT-mini and base
//! (`cargo xtask bench model`, same run, with and without).

/// Applies the settings; call once at the start of a process.
pub fn tune_for_training() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; called before
        // the process starts its own threads.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}
