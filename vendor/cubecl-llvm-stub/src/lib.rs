//! Stand-in for `cubecl-llvm` 0.11.3, the LLVM (pliron → PTX) compiler behind cubecl's CUDA
//! runtime.
//!
//! The real crate's build script downloads a prebuilt LLVM bundle from GitHub, which cannot be
//! reached here. terse compiles its CUDA kernels with NVRTC, through cubecl's C++ path (cubecl's
//! `cuda-cpp` feature, that is cubecl-cuda's `cpp`), so the LLVM backend is never selected. But
//! cubecl-cuda compiles both backends in and names these items whichever one runs; this crate
//! provides exactly those, with the real crate's paths and signatures:
//!
//! - [`PlironCompiler`], [`PlironOptions`], [`PlironArtifact`], [`NvptxModule`], [`LlvmTarget`];
//! - [`nvptx::ptx_version::PtxVersion`], copied from the real crate (it is plain Rust);
//! - [`shared::lowered_features::GpuTarget`] and [`shared::lowered_features::restrict_features`],
//!   copied from the real crate for NVPTX (plain Rust over the device properties).
//!
//! [`PlironCompiler`]'s `compile`, the one entry point into LLVM, returns an error for every
//! kernel: it never panics.

pub mod nvptx;
pub mod shared;

use cubecl_environment::backtrace::BackTrace;
use cubecl_ir::{amd::GfxArch, nvidia::SmArch};
use cubecl_runtime::{
    compiler::{CompilationError, Compiler},
    kernel::{BufferIOAttr, KernelDefinition},
};
use nvptx::ptx_version::PtxVersion;

/// The targets the real crate compiles for; cubecl-cuda only names NVPTX.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Nvptx,
}

/// The LLVM backend's compiler. Compiling with it always fails: see the crate docs.
#[derive(Clone, Debug, Default)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

/// The options cubecl-cuda sets; it leaves the rest of the real crate's to `Default`.
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    /// AMDGPU architecture, or `None` for other targets (cubecl-cuda passes `None`).
    pub arch: Option<GfxArch>,
    /// NVPTX architecture, or `None` for other targets.
    pub sm_arch: Option<SmArch>,
    /// PTX version to emit, or `None` for the oldest the architecture accepts.
    pub ptx_version: Option<PtxVersion>,
    /// Pass scalars and static metadata in the kernel parameter block.
    pub grid_constants: bool,
}

/// A compiled PTX module. Nothing here ever builds one; the type is what cubecl-cuda matches on.
#[derive(Clone, Debug)]
pub struct NvptxModule {
    /// NUL-terminated PTX assembly.
    pub ptx: Vec<core::ffi::c_char>,
    /// IR for logging and cache keys.
    pub ir: String,
    /// Shared memory required per launch, in bytes.
    pub shared_memory_size: usize,
    /// Buffer access modes in binding order.
    pub io: Vec<BufferIOAttr>,
}

/// A compiled kernel artifact.
#[derive(Clone)]
pub enum PlironArtifact {
    NvptxCode(NvptxModule),
}

impl core::fmt::Display for PlironArtifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlironArtifact::NvptxCode(module) => write!(f, "{}", module.ir),
        }
    }
}

impl Compiler for PlironCompiler {
    type Representation = PlironArtifact;
    type CompilationOptions = PlironOptions;

    fn buffer_io(repr: &Self::Representation) -> Option<Vec<BufferIOAttr>> {
        match repr {
            PlironArtifact::NvptxCode(module) => Some(module.io.clone()),
        }
    }

    /// Always an error: this build has no LLVM.
    fn compile(
        &mut self,
        kernel: KernelDefinition,
        _compilation_options: &Self::CompilationOptions,
    ) -> Result<Self::Representation, CompilationError> {
        Err(CompilationError::Generic {
            reason: format!(
                "cannot compile '{}' with the LLVM backend: this build's cubecl-llvm is a stub \
                 without LLVM. Build cubecl with its `cuda-cpp` feature, so that cubecl-cuda \
                 compiles kernels with NVRTC instead",
                kernel.settings.kernel_name
            ),
            backtrace: BackTrace::capture(),
        })
    }

    fn extension(&self) -> &'static str {
        match self.target {
            LlvmTarget::Nvptx => "ll",
        }
    }

    fn lang_tag(&self) -> &'static str {
        match self.target {
            LlvmTarget::Nvptx => "llvm",
        }
    }
}
