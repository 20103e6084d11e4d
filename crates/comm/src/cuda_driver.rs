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

/// What the driver says of one GPU: its name and compute capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaGpu {
    /// As `nvidia-smi` prints it, e.g. `Tesla V100-SXM2-32GB`.
    pub name: String,
    /// (major, minor), e.g. (7, 0) for a V100, (9, 0) for an H100.
    pub capability: (u32, u32),
}

impl CudaGpu {
    /// Whether the GPU has TF32 and bf16 tensor cores (compute capability
    /// 8.0, Ampere, and newer).
    pub fn has_tf32_and_bf16(&self) -> bool {
        self.capability >= (8, 0)
    }
}

impl std::fmt::Display for CudaGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.capability;
        write!(f, "{}, compute capability {major}.{minor}", self.name)
    }
}

/// GPU `index` as the driver shows it to this process (after
/// `CUDA_VISIBLE_DEVICES`). Call only where [`cuda_driver_present`].
pub fn cuda_gpu(index: usize) -> Result<CudaGpu, String> {
    use cudarc::driver::{result, sys::CUdevice_attribute};
    result::init().map_err(|e| e.to_string())?;
    let ordinal = i32::try_from(index).map_err(|e| e.to_string())?;
    let device = result::device::get(ordinal).map_err(|e| e.to_string())?;
    let attribute = |which| {
        // SAFETY: `device` was returned by `get` above.
        unsafe { result::device::get_attribute(device, which) }
            .map_err(|e| e.to_string())
            .map(|value| u32::try_from(value).unwrap_or(0))
    };
    Ok(CudaGpu {
        name: result::device::get_name(device).map_err(|e| e.to_string())?,
        capability: (
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
    })
}
