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
//!
//! Transparent huge pages for the heap: the heap still grows over the first
//! steps while the ranks' allocations settle, and each new 4 KiB page
//! there is often read before it is written (calloc leaves fresh heap pages
//! untouched; an accumulating op then reads the zero page and writes a
//! copy), which costs a second fault and a TLB shootdown to every CPU the
//! process runs on: `perf` put `do_wp_page → flush_tlb_mm_range →
//! smp_call_function_many_cond` and the IPIs' `native_write_msr` at ~9% of
//! step 2 on 4 local ranks, and steps 2–4 of BERT-mini took 320–690 ms
//! against ~250 later. With 2 MiB pages a fault covers 512 small ones.
//! glibc's own switch (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) is read only
//! at process start, so the same is done here: a large block of heap
//! (address space only, nothing is touched) is advised `MADV_HUGEPAGE` and
//! freed behind a small block allocated after it and never freed, so it
//! stays in the heap's free lists (glibc gives back only the top of the
//! heap) and the allocations that follow are carved from it. Heap beyond it
//! grows in small pages as before. BERT-mini on 4 local ranks, `perf stat`:
//! 618k → 2.9k page faults for one step, 725k → 2.6k for eight; peak RSS
//! 2591 → 2652 MB (BERT-base, 1 rank: 5538 → 5572 MB); 16-step runs, 3
//! alternating pairs: 4 local ranks 51.2–55.9 → 55.6–59.3 samples/s,
//! 1 rank 51.4–65.4 → 62.6–66.3 (the slow runs before had 860–940 ms steps
//! among ~240 ms ones).

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
        advise_huge_pages();
    }
}

/// Half the machine's memory (at most 16 GiB) of heap advised
/// `MADV_HUGEPAGE` (a no-op where transparent huge pages are off); less
/// where the kernel refuses that much address space.
///
/// Not where address space is counted: under strict overcommit
/// (`vm.overcommit_memory = 2`) or a limit on it (`ulimit -v`) the free
/// block, still part of the heap, would use up what later allocations need.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn advise_huge_pages() {
    const HUGE_PAGE: usize = 2 << 20;
    let strict = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .is_ok_and(|mode| mode.trim() == "2");
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur != libc::RLIM_INFINITY;
    if strict || limited {
        return;
    }
    // SAFETY: sysconf only reads system parameters.
    let memory = unsafe {
        libc::sysconf(libc::_SC_PHYS_PAGES).max(0) as usize
            * libc::sysconf(libc::_SC_PAGESIZE).max(0) as usize
    };
    let mut size = (memory / 2).min(16 << 30);
    while size >= 256 << 20 {
        // SAFETY: the block is malloc's own, advised only inside its bounds
        // (rounded inwards to whole huge pages) and freed once; madvise
        // with MADV_HUGEPAGE changes no contents. The plug is leaked on
        // purpose (1 MiB for the life of the process).
        unsafe {
            // black_box: the compiler may otherwise drop a malloc whose
            // block is only freed (and did: the advice never happened).
            let block = std::hint::black_box(libc::malloc(size));
            if !block.is_null() {
                std::hint::black_box(libc::malloc(1 << 20));
                let start = (block as usize).next_multiple_of(HUGE_PAGE);
                let end = (block as usize + size) / HUGE_PAGE * HUGE_PAGE;
                if end > start {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
                }
                libc::free(block);
                return;
            }
        }
        size /= 2;
    }
}
