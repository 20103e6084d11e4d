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
//! No mmap at all: glibc caps the mmap threshold at 32 MiB, and BERT-base
//! frees blocks above it every step (the tied word embedding's 94 MB
//! gradient, the 440 MB flat gradient and parameter buffers), which it
//! mapped, faulted in page by page (~50k faults per step, 25% of the
//! profile's samples in `clear_page` with the model's set-up, TLB
//! shootdowns after) and unmapped again. Served from the heap they cost
//! nothing after the first step: 0 faults per step (`perf stat`, 1 and 5
//! steps), BERT-base 3.77–3.81 → 4.00–4.24 samples/s alternating in one
//! session (BERT-mini and ResNet-20 unchanged within noise). A failed
//! `brk` still falls back to mmap inside glibc.
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
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_MAX, 0);
        }
    }
}
