//! What the CUDA driver shows this process, asked without letting cudarc
//! panic: cudarc opens `libcuda.so` at its first driver call and panics
//! where it cannot, so the library's presence is asked first. One place
//! for NCCL's start, the choice of a process's GPU and the trainer's
//! `cuda` check (`terse_train::cuda_check`).

/// Whether the driver library (`libcuda.so`) can be opened.
pub fn cuda_driver_present() -> bool {
    // SAFETY: only tries to open the library by its names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The driver's start-up (`cuInit`), and the number of GPUs it shows this
/// process. Call only where [`cuda_driver_present`].
pub fn cuda_device_count() -> Result<usize, String> {
    cudarc::driver::result::init().map_err(|e| e.to_string())?;
    let count = cudarc::driver::result::device::get_count().map_err(|e| e.to_string())?;
    Ok(usize::try_from(count).unwrap_or(0))
}
