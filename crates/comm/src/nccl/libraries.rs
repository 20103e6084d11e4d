//! Whether this machine can run NCCL, said before cudarc's first call
//! (which panics on a library it cannot open).
//!
//! cudarc opens NCCL only by the names it derives from the CUDA version
//! (`libnccl.so`, `libnccl.so.13`, `.so.12`, …), never by NCCL's soname
//! `libnccl.so.2` — the only name pip's `nvidia-nccl-cu12`/`-cu13` wheels
//! (PyTorch's NCCL) and Debian's `libnccl2` install. A machine with NCCL
//! from either is told where its library is and the one link that makes
//! cudarc find it.

/// What this machine lacks to run NCCL, in one line; `None` when libcuda
/// and libnccl both load under the names cudarc opens.
pub fn missing_libraries() -> Option<String> {
    let driver = crate::cuda_driver_present();
    // SAFETY: only tries to open the library by its names.
    let nccl = unsafe { cudarc::nccl::sys::is_culib_present() };
    let mut missing = Vec::new();
    if !driver {
        missing.push(
            "no NVIDIA driver (libcuda.so was not found; in a container the host's driver must \
             be mounted, e.g. `docker run --gpus all`)"
                .to_string(),
        );
    }
    if !nccl {
        missing.push(match soname_path() {
            Some(path) => format!(
                "NCCL is at {path}, but cudarc opens NCCL only as libnccl.so (or libnccl.so.13, \
                 .so.12): link it under that name, e.g. `mkdir -p ~/.local/lib/nccl && ln -sf \
                 {path} ~/.local/lib/nccl/libnccl.so`, and put that directory in LD_LIBRARY_PATH"
            ),
            None => "no NCCL library (libnccl.so was not found: `pip install nvidia-nccl-cu12` \
                     (or `-cu13`), or install NCCL (e.g. Debian's libnccl2), then link its \
                     libnccl.so.2 as libnccl.so in a directory on LD_LIBRARY_PATH)"
                .to_string(),
        });
    }
    (!missing.is_empty()).then(|| format!("--comm nccl cannot start: {}", missing.join("; ")))
}

/// Where `libnccl.so.2` is (the file it resolves to), when the dynamic
/// loader finds it by that name.
fn soname_path() -> Option<String> {
    // SAFETY: opening NCCL runs only its library initialisers; nothing of
    // it is called. Kept open while its path is read.
    let library = unsafe { libloading::Library::new("libnccl.so.2") }.ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok();
    drop(library);
    let maps = maps?;
    let path = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libnccl.so.2"))
        .unwrap_or("libnccl.so.2");
    Some(path.to_string())
}
