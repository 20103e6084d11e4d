//! Each use cubecl-cuda 0.11.3 makes of `cubecl-llvm`, written as it is written there (file and
//! line in each comment), so `cargo check --tests` on this stub proves the stub satisfies them
//! without building cubecl-cuda.
//!
//! This crate stands in for `cubecl-llvm`, whose build script downloads an LLVM bundle that
//! cannot be fetched here; terse compiles kernels with NVRTC through cubecl's C++ path.

#![allow(
    dead_code,
    unreachable_patterns,
    clippy::needless_update,
    clippy::useless_format
)]

use cubecl_ir::{DeviceProperties, nvidia::SmArch};
use cubecl_llvm::nvptx::ptx_version::PtxVersion;
use cubecl_llvm::shared::lowered_features::{GpuTarget, restrict_features};
use cubecl_runtime::compiler::{CompilationError, Compiler};
use cubecl_runtime::kernel::{BufferIOAttr, KernelDefinition};

// src/compiler.rs:34-38: `#[derive(Clone, Debug)] enum CudaCompiler { .., Llvm(PlironCompiler) }`.
#[derive(Clone, Debug)]
enum CudaCompiler {
    Llvm(cubecl_llvm::PlironCompiler),
}

// src/compiler.rs:59-66: `#[derive(Debug, Default, Clone)]` options holding the PTX version.
#[derive(Debug, Default, Clone)]
struct CudaCompilationOptions {
    grid_constants: bool,
    arch: Option<SmArch>,
    ptx_version: Option<PtxVersion>,
}

// src/compiler.rs:68-96.
enum CudaRepresentation {
    Llvm(cubecl_llvm::NvptxModule),
}

impl core::fmt::Debug for CudaRepresentation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CudaRepresentation::Llvm(module) => f
                .debug_tuple("CudaRepresentation::Llvm")
                .field(module)
                .finish(),
        }
    }
}

impl CudaRepresentation {
    fn shared_memory_size(&self) -> usize {
        match self {
            CudaRepresentation::Llvm(module) => module.shared_memory_size,
        }
    }
    // src/compiler.rs:102 and :118.
    fn text_and_io(&self) -> (String, Option<Vec<BufferIOAttr>>) {
        match self {
            CudaRepresentation::Llvm(module) => (format!("{}", module.ir), Some(module.io.clone())),
        }
    }
    // src/compute/context.rs:282: `module.ptx.clone()` stored as `Vec<c_char>`.
    fn ptx(&self) -> Vec<core::ffi::c_char> {
        match self {
            CudaRepresentation::Llvm(module) => module.ptx.clone(),
        }
    }
}

// src/compiler.rs:44-46 and :122-162.
fn compile(
    kernel: KernelDefinition,
    options: &CudaCompilationOptions,
) -> Result<CudaRepresentation, CompilationError> {
    let mut compiler = CudaCompiler::Llvm(cubecl_llvm::PlironCompiler {
        target: cubecl_llvm::LlvmTarget::Nvptx,
    });
    let CudaCompiler::Llvm(compiler) = &mut compiler;
    let _ = compiler.lang_tag();
    let pliron_options = cubecl_llvm::PlironOptions {
        arch: None,
        sm_arch: options.arch,
        ptx_version: options.ptx_version,
        grid_constants: options.grid_constants,
        ..Default::default()
    };
    match compiler.compile(kernel, &pliron_options)? {
        cubecl_llvm::PlironArtifact::NvptxCode(module) => Ok(CudaRepresentation::Llvm(module)),
        _ => unreachable!("the CUDA runtime always configures LlvmTarget::Nvptx"),
    }
}

// src/runtime.rs:376-385 (`driver_version` is the `c_int` `cuDriverGetVersion` writes).
fn device_options(device_props: &mut DeviceProperties, driver_version: i32) -> Option<PtxVersion> {
    restrict_features(device_props, GpuTarget::Nvptx);
    PtxVersion::for_driver(driver_version)
}

// src/compute/context.rs:96-122: the version is read out of owned options by value (so it is
// `Copy`) and formatted with `Display`.
fn cache_namespace(fingerprint: &str, ptx_version: Option<PtxVersion>) -> String {
    match ptx_version {
        None => format!("{fingerprint}-llvm"),
        Some(ptx_version) => format!("{fingerprint}-llvm-{ptx_version}"),
    }
}

fn context_new(compilation_options: CudaCompilationOptions) -> (String, CudaCompilationOptions) {
    let fingerprint = cache_namespace("ptx_sm86", compilation_options.ptx_version);
    (fingerprint, compilation_options)
}

#[test]
fn the_llvm_backends_ptx_versions_get_their_own_namespaces() {
    // src/compute/context.rs:632-637.
    assert_ne!(
        cache_namespace("ptx_sm86", PtxVersion::for_driver(12080)),
        cache_namespace("ptx_sm86", PtxVersion::for_driver(12090)),
    );
    assert_eq!(
        cache_namespace("ptx_sm86", PtxVersion::for_driver(12080)),
        "ptx_sm86-llvm-ptx87"
    );
}

/// The one compile entry point refuses every kernel with an error naming it, and the fix.
#[test]
fn compiling_is_an_error_not_a_panic() {
    use cubecl_ir::{
        AddressType, Scope,
        metadata::Info,
        settings::{Dim3, ExecutionMode, KernelSettings},
    };

    let mut settings = KernelSettings::new(
        Dim3::new_single(),
        ExecutionMode::default(),
        AddressType::default(),
    );
    settings.kernel_name = "a_kernel".into();
    let kernel = KernelDefinition {
        body: Scope::root(settings.clone()),
        info: Info::default(),
        settings,
    };

    match compile(kernel, &CudaCompilationOptions::default()) {
        Err(CompilationError::Generic { reason, .. }) => {
            assert!(reason.contains("'a_kernel'"), "{reason}");
            assert!(reason.contains("cuda-cpp"), "{reason}");
        }
        other => panic!(
            "expected a generic compilation error, got {:?}",
            other.map(|_| ())
        ),
    }
}
