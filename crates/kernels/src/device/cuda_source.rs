//! terse's kernels as CUDA C++ compiled by NVRTC, on a machine without a
//! GPU: the check that they build for the `cuda` device before a GPU
//! first runs them (lavapipe runs them as WGSL, which proves nothing about
//! the CUDA source cubecl writes for them).
//!
//! Each kernel is built as a launch builds it — the struct
//! `#[cube(launch_unchecked)]` generates, with the launch's comptime
//! values — with device properties written out for an H100 (sm_90, as
//! `vendor/cubecl-cuda/src/runtime.rs` reads them from the driver), expanded
//! (`define_kernel`), turned into CUDA C++ by cubecl-cuda's own compiler,
//! and handed to NVRTC with the options cubecl-cuda's `compile_to_ptx`
//! passes. NVRTC is the `cuda-nvrtc` dataset (`data/manifests/`: libnvrtc
//! from PyPI's nvidia-cuda-nvrtc wheel, fetched once into terse's cache and
//! checked by its SHA-256), so the test runs in CI like any other. The f32
//! kernels include no header NVRTC does not carry itself; the bf16 and fp16
//! ones include `cuda_bf16.h`/`cuda_fp16.h`, and tensor-core kernels
//! `mma.h`, which includes `crt/mma.h`: those come from the `cuda-headers`
//! and `cuda-crt-headers` datasets (PyPI's nvidia-cuda-runtime and
//! nvidia-cuda-crt wheels), laid out as a toolkit's `include/` for NVRTC.
//! To compile with another CUDA instead, set `TERSE_NVRTC_CUDA` to its
//! directory (`lib/libnvrtc.so.*`, `include/`), e.g. site-packages/nvidia/cu13.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;

use cubecl::cuda::compiler::CudaBackend;
use cubecl::cuda::{CudaCompilationOptions, CudaCompiler, CudaRuntime};
use cubecl::ir::{DeviceIdentity, HardwareProperties, MemoryDeviceProperties, VectorSize};
use cubecl::prelude::*;
use cubecl_runtime::compiler::Compiler;
use cubecl_runtime::kernel::{CubeKernel, define_kernel};
use cubecl_runtime::runtime::Runtime as _;

/// An H100's properties as cubecl-cuda's `CudaServer::init` sets them
/// for compute capability 9.0 (the parts a kernel's expansion reads).
pub(crate) fn h100() -> Arc<DeviceProperties> {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: cubecl::cuda::CUDA_MAX_BINDINGS,
        max_shared_memory_size: 232_448,
        max_cube_count: (i32::MAX as u32, 65_535, 65_535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: Some(8),
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let memory = MemoryDeviceProperties::new(20 << 30, 512);
    let mut properties = DeviceProperties::new(
        Default::default(),
        memory,
        hardware,
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: "NVIDIA H100 (written out, no driver)".into(),
            fingerprint: "ptx_sm90".into(),
            physical: None,
        },
    );
    cubecl_cpp::register_supported_types(&mut properties);
    // The tensor-core tiles cubecl-cuda's runtime registers for sm_90 (its
    // wmma compiler's list), which cubek's matmuls are built from.
    let arch = cubecl_cpp::cuda::arch::CudaArchitecture {
        version: 90,
        tensor_cores: true,
    };
    cubecl_cpp::shared::register_wmma_features(
        cubecl_cpp::cuda::mma::CudaCmmaCompiler::Cpp.supported_cmma_combinations(&arch),
        &mut properties,
    );
    Arc::new(properties)
}

/// The settings a `launch_unchecked` of 256 units per cube makes.
pub(crate) fn unchecked() -> KernelSettings {
    KernelSettings::new(
        CubeDim::new_1d(256).into(),
        ExecutionMode::Unchecked,
        AddressType::U32,
    )
}

/// What a slice argument compiles as (not aliased with another).
pub(crate) fn buffer() -> BufferCompilationArg {
    BufferCompilationArg { inplace: None }
}

/// cubecl-cuda's target properties (static, no device).
pub(crate) fn target() -> Arc<TargetProperties> {
    Arc::new(CudaRuntime::target_properties())
}

/// `cuda_sources![module::Kernel(args…), …]` defines the file's
/// `cuda_sources()`: each kernel `#[cube(launch_unchecked)]` generated as
/// `module::Kernel`, built with `args` — one compilation argument per
/// runtime parameter (`b()` for a slice, `table()` for the chunk table, `()`
/// for a scalar), then the comptime values, in the variants its launches
/// make — named with them, and its CUDA C++.
macro_rules! cuda_sources {
    ($($module:ident :: $kernel:ident ($($arg:expr),* $(,)?)),* $(,)?) => {
        /// The kernels here as CUDA C++ ([`crate::device::cuda_source`]).
        pub(crate) fn cuda_sources() -> Vec<(String, String)> {
            #[allow(unused_imports)]
            use $crate::device::cuda_source::{buffer as b, table, tensors};
            vec![$((
                // On one line, however rustfmt broke the arguments.
                stringify!($module($($arg),*))
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
                $crate::device::cuda_source::cuda_source($module::$kernel::new(
                    $crate::device::cuda_source::unchecked(),
                    $crate::device::cuda_source::h100(),
                    $crate::device::cuda_source::target(),
                    $($arg),*
                )),
            )),*]
        }
    };
}
pub(crate) use cuda_sources;

/// What a launch registers for `count` 1-D tensors in a sequence.
pub(crate) fn tensors(count: usize) -> SequenceCompilationArg<OwnedTensor<f32>> {
    let tensor = TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: buffer(),
    };
    SequenceCompilationArg {
        values: std::iter::repeat_n(tensor, count).collect(),
    }
}

/// What a launch registers for the chunk table.
pub(crate) fn table() -> <super::optim::ChunkTable as LaunchArg>::CompilationArg {
    super::optim::ChunkTable::compilation_arg()
}

/// `kernel`'s CUDA C++ as cubecl-cuda writes it for an sm_90 device.
pub(crate) fn cuda_source(kernel: impl CubeKernel) -> String {
    let name = kernel.name().to_string();
    let mut options = CudaCompilationOptions::default();
    options.cpp.warp_size = 32;
    let features = &mut options.cpp.supports_features;
    features.fast_math = true;
    features.dp4a = true;
    features.grid_constants = true;
    features.clusters = true;
    features.elect_sync = true;
    features.fast_tanh = true;
    let definition =
        define_kernel(&kernel).unwrap_or_else(|e| panic!("{name}: expansion failed: {e}"));
    CudaCompiler::new(CudaBackend::Cpp)
        .compile(definition, &options)
        .unwrap_or_else(|e| panic!("{name}: cubecl's CUDA compiler refused it: {e}"))
        .to_string()
}

/// Loads NVRTC from `TERSE_NVRTC_CUDA`'s `lib/` or else from the
/// `cuda-nvrtc` dataset, and returns the CUDA directory whose `include/`
/// NVRTC is to be handed (`TERSE_NVRTC_CUDA`, or else [`dataset_headers`]). cudarc opens NVRTC by its library names only; a library already
/// loaded by path answers to its soname (`libnvrtc.so.13`), so loading both
/// files by path first makes cudarc's lookup, and NVRTC's own for its
/// builtins, find these.
fn load_nvrtc() -> PathBuf {
    let (cuda, lib) = match std::env::var_os("TERSE_NVRTC_CUDA") {
        Some(dir) => {
            let cuda = PathBuf::from(dir);
            let lib = cuda.join("lib");
            (cuda, lib)
        }
        None => {
            let lib = terse_data::dataset("cuda-nvrtc").expect("the cuda-nvrtc dataset");
            (dataset_headers(), lib)
        }
    };
    let mut libraries: Vec<PathBuf> = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("libnvrtc") && name.contains(".so.")
        })
        .collect();
    // The builtins first: libnvrtc opens them while it loads.
    libraries.sort_by_key(|path| !path.to_string_lossy().contains("builtins"));
    assert!(
        !libraries.is_empty(),
        "no libnvrtc.so.* in {}",
        lib.display()
    );
    for path in &libraries {
        // SAFETY: NVIDIA's library, whose initialisers only set up NVRTC;
        // kept loaded for the process (forgotten), as cudarc keeps its own.
        let library = unsafe { libloading::Library::new(path) }
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::mem::forget(library);
    }
    // SAFETY: only opens the library by its names.
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "NVRTC loaded from {} but not found by cudarc's names",
        lib.display()
    );
    cuda
}

/// A CUDA directory whose `include/` holds the `cuda-headers` dataset's
/// files and, as `include/crt/`, the `cuda-crt-headers` dataset's, as a
/// toolkit (or the CUDA 13 wheels, which share `nvidia/cu13/include/`)
/// lays them out: symbolic links (the datasets' directories are flat) in a
/// temporary directory named by the cache's path, made where missing, so
/// that test processes share it and a run leaves nothing new behind.
fn dataset_headers() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let headers = terse_data::dataset("cuda-headers").expect("the cuda-headers dataset");
    let crt = terse_data::dataset("cuda-crt-headers").expect("the cuda-crt-headers dataset");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    headers.hash(&mut hasher);
    let root = std::env::temp_dir().join(format!("terse-cuda-headers-{:016x}", hasher.finish()));
    let include = root.join("include");
    std::fs::create_dir_all(&include).unwrap_or_else(|e| panic!("{}: {e}", include.display()));
    let link = |from: PathBuf, to: PathBuf| match std::os::unix::fs::symlink(&from, &to) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            panic!("{} -> {}: {e}", to.display(), from.display())
        }
        _ => {}
    };
    for entry in std::fs::read_dir(&headers).expect("the headers' directory") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "h" || e == "hpp") {
            link(
                path.clone(),
                include.join(path.file_name().expect("a name")),
            );
        }
    }
    link(crt, include.join("crt"));
    root
}

/// NVRTC's verdict on each of `sources` (name, CUDA C++), with the options
/// cubecl-cuda's `compile_to_ptx` gives it for an sm_90 device: every
/// failure's log, or an empty list.
pub(crate) fn nvrtc_failures(sources: &[(String, String)]) -> Vec<String> {
    let cuda = load_nvrtc();
    let mut options = vec!["--gpu-architecture=sm_90a".to_string()];
    for include in ["include", "include/cccl"].map(|dir| cuda.join(dir)) {
        if include.is_dir() {
            options.push(format!("--include-path={}", include.display()));
        }
    }
    options.push("-lineinfo".to_string());
    let mut failures = Vec::new();
    for (name, source) in sources {
        let c_source = CString::new(source.as_str()).expect("no NUL in a source");
        // SAFETY: NVRTC's program API on a source that outlives the
        // program; the log is read before the program is dropped.
        unsafe {
            let program = cudarc::nvrtc::result::create_program(c_source.as_c_str(), None)
                .expect("nvrtcCreateProgram");
            if cudarc::nvrtc::result::compile_program(program, &options).is_err() {
                let log = cudarc::nvrtc::result::get_program_log(program).expect("the log");
                let log: Vec<u8> = log.iter().map(|&c| c as u8).collect();
                failures.push(format!(
                    "{name}:\n{}\n--- source ---\n{source}",
                    String::from_utf8_lossy(&log)
                ));
            }
            let _ = cudarc::nvrtc::result::destroy_program(program);
        }
    }
    failures
}

/// Panics with NVRTC's logs when any of `sources` does not compile.
pub(crate) fn assert_compiles(sources: &[(String, String)]) {
    let failures = nvrtc_failures(sources);
    assert!(
        failures.is_empty(),
        "{} of {} kernels do not compile for CUDA:\n{}",
        failures.len(),
        sources.len(),
        failures.join("\n\n")
    );
    for (name, _) in sources {
        println!("compiles: {name}");
    }
    println!("{} kernels compile for sm_90 with NVRTC", sources.len());
}

/// A tensor-core product of one 16 × 16 tile (`k` deep) in `I`, as
/// cubek's matmuls make them for f32 (staged as TF32 on sm_80 and newer)
/// and for bf16 and fp16: terse's kernels make none, but its `cuda` runs
/// do, and their source includes `mma.h` (and that `crt/mma.h`), the
/// headers the test's NVRTC must find as a GPU machine's does.
#[cube(launch_unchecked)]
fn tensor_core_kernel<I: Float>(
    lhs: &[I],
    rhs: &[I],
    out: &mut [f32],
    #[comptime] k: usize,
    #[define(I)] _input: ElemType,
) {
    let a = cmma::Matrix::<I>::from_slice(
        cmma::MatrixIdent::A,
        16usize,
        16usize,
        k,
        cmma::MatrixLayout::RowMajor,
        lhs,
        k as u32,
    );
    let b = cmma::Matrix::<I>::from_slice(
        cmma::MatrixIdent::B,
        16usize,
        16usize,
        k,
        cmma::MatrixLayout::RowMajor,
        rhs,
        16,
    );
    let c = cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        16usize,
        16usize,
        k,
        cmma::MatrixLayout::Undefined,
        0.0,
    );
    cmma::execute(&a, &b, &c, &c);
    cmma::store(out, &c, 16, cmma::MatrixLayout::RowMajor);
}

mod tensor_core {
    use cubecl::ir::{ElemType, FloatKind};

    use super::tensor_core_kernel;

    // TF32 tiles are 8 deep, bf16 and fp16 ones 16 (CUDA's wmma shapes).
    super::cuda_sources![
        tensor_core_kernel::TensorCoreKernel(b(), b(), b(), 8, ElemType::Float(FloatKind::TF32)),
        tensor_core_kernel::TensorCoreKernel(b(), b(), b(), 16, ElemType::Float(FloatKind::BF16)),
        tensor_core_kernel::TensorCoreKernel(b(), b(), b(), 16, ElemType::Float(FloatKind::F16)),
    ];
}

/// An asynchronous copy into shared memory that completes on a barrier:
/// what a TMA routine's loads are made of, as far as its includes go.
#[cube(launch_unchecked)]
fn barrier_kernel(input: &[f32], output: &mut [f32]) {
    let barrier = cubecl::prelude::barrier::Barrier::local();
    let mut staged = Shared::new_slice(1usize);
    barrier.memcpy_async(&input[2..3], &mut staged[..1]);
    barrier.arrive_and_wait();
    output[0] = staged[0];
}

mod barrier {
    use super::barrier_kernel;

    super::cuda_sources![barrier_kernel::BarrierKernel(b(), b())];
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// Every kernel of terse-kernels, in the variants its launches make.
    fn every_kernel() -> Vec<(String, String)> {
        [
            dropout::cuda_sources(),
            half::cuda_sources(),
            layer_norm::cuda_sources(),
            mask::cuda_sources(),
            messages::cuda_sources(),
            onebit::cuda_sources(),
            server::cuda_sources(),
            slamb::cuda_sources(),
            slamb_trust::cuda_sources(),
            softmax::cuda_sources(),
            word_offsets::cuda_sources(),
            optim::cuda_sources(),
            super::tensor_core::cuda_sources(),
        ]
        .concat()
    }

    #[test]
    fn every_kernel_becomes_cuda_source() {
        // No NVRTC needed: the expansion and cubecl-cuda's C++ writer run
        // for every kernel (a panic in either names the kernel).
        let sources = every_kernel();
        assert!(sources.len() >= 60, "{} kernels", sources.len());
        for (name, source) in &sources {
            assert!(
                source.contains("extern \"C\" __global__"),
                "{name}:\n{source}"
            );
        }
    }

    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        super::assert_compiles(&every_kernel());
    }

    #[test]
    fn a_barrier_kernel_includes_the_barrier_headers() {
        let sources = super::barrier::cuda_sources();
        let includes: Vec<&str> = sources[0]
            .1
            .lines()
            .filter_map(|line| line.strip_prefix("#include <")?.strip_suffix('>'))
            .collect();
        assert_eq!(includes, BARRIER_HEADERS, "{}", sources[0].1);
    }
}
