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
//!
//! No mmap at all (which leaves no use for an mmap threshold): glibc caps
//! that threshold at 32 MiB, and BERT-base frees blocks above it every
//! step (the tied word embedding's 94 MB gradient, the 440 MB flat
//! gradient and parameter buffers), which were mapped, faulted in page by
//! page (~50k faults per step, `perf stat` of 1 against 5 steps) and
//! unmapped again. From the heap: 0 faults per step; BERT-base's
//! embedding class 43–47 → 16–28 ms per step, the whole step within this
//! VM's noise (4.18–4.48 → 4.22–4.59 samples/s, alternating binaries),
//! peak RSS of 3 steps 3.23 → 3.34 GB. A failed `brk` still falls back to
//! mmap inside glibc.
//!
//! One arena for all threads: glibc gives other threads their own arenas,
//! and those return a whole heap to the kernel as soon as it empties,
//! whatever the trim threshold says. `local` ranks are threads, so each
//! rank faulted its step's buffers in again every step: BERT-mini, 16
//! steps on 4 local ranks, took 2.17M page faults and 32.3 s of CPU; with
//! one arena 0.86M and 27.0 s (2 ranks: 1.63M → 0.50M, 22.8 → 20.4 s;
//! 1 rank unchanged at 0.19M), `perf stat`, same build, one run each.
//! Training allocates few, large blocks per op, so the one arena's lock is
//! not contended.

/// Applies the settings; call once at the start of a process.
pub fn tune_for_training() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; called before
        // the process starts its own threads.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_MAX, 0);
        }
    }
}
