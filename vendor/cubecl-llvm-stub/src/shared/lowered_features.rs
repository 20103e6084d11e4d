//! What a device advertises, narrowed to what the LLVM backend lowers for it: copied from the real
//! `cubecl-llvm` 0.11.3 (`src/shared/lowered_features.rs`, MIT OR Apache-2.0), NVPTX part only.
//!
//! This crate stands in for `cubecl-llvm`, whose build script downloads an LLVM bundle that
//! cannot be fetched here; terse compiles kernels with NVRTC through cubecl's C++ path.
//! cubecl-cuda calls [`restrict_features`] only when its default backend is LLVM (that is,
//! without its `cpp` feature); it is kept faithful so that such a build advertises what the real
//! crate would, even though the stub then compiles nothing.

use cubecl_ir::{
    ComplexKind, DeviceProperties, ElemType, FloatKind, IntKind, OpaqueType, UIntKind,
};

const HALF: ElemType = ElemType::Float(FloatKind::F16);
const BF16: ElemType = ElemType::Float(FloatKind::BF16);

/// The GPU target a device's features are narrowed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuTarget {
    Nvptx,
}

/// Narrows `props` to what the LLVM backend lowers for `target`: the matrix forms that target
/// has register shapes for, and nothing that neither target lowers.
pub fn restrict_features(props: &mut DeviceProperties, target: GpuTarget) {
    match target {
        GpuTarget::Nvptx => keep_nvptx_matrix_forms(props),
    }
    restrict_common(props);
}

/// An accumulator the half-precision matrix instructions of NVPTX write.
fn is_half_or_single(ty: ElemType) -> bool {
    matches!(
        ty,
        ElemType::Float(FloatKind::F16) | ElemType::Float(FloatKind::F32)
    )
}

/// Keeps the matrix forms NVPTX has register shapes for.
fn keep_nvptx_matrix_forms(props: &mut DeviceProperties) {
    let byte = |ty: ElemType| {
        matches!(
            ty,
            ElemType::Int(IntKind::I8) | ElemType::UInt(UIntKind::U8)
        )
    };

    let tf32 = ElemType::Float(FloatKind::TF32);
    let f32 = ElemType::Float(FloatKind::F32);
    let matmul = &mut props.features.matmul;
    matmul.cmma.retain(|config| {
        let half =
            config.a_type == HALF && config.b_type == HALF && is_half_or_single(config.cd_type);
        let bf16 = config.a_type == BF16 && config.b_type == BF16 && config.cd_type == f32;
        let tf32 = config.a_type == tf32
            && config.b_type == tf32
            && config.cd_type == f32
            && (config.m, config.n, config.k) == (16, 16, 8);
        half || bf16 || tf32
    });
    matmul.mma.retain(|config| {
        let floats = (config.a_type == HALF || config.a_type == BF16)
            && config.b_type == config.a_type
            && config.cd_type == ElemType::Float(FloatKind::F32);
        let integers = byte(config.a_type)
            && byte(config.b_type)
            && config.cd_type == ElemType::Int(IntKind::I32);
        let tf32 = config.a_type == tf32
            && config.b_type == tf32
            && config.cd_type == f32
            && config.m == 16
            && config.n == 8
            && matches!(config.k, 4 | 8);
        floats || integers || tf32
    });
}

/// What neither GPU target lowers.
fn restrict_common(props: &mut DeviceProperties) {
    // The cube-level matrix API, and the scaled instructions with their `block_scale` operands.
    let matmul = &mut props.features.matmul;
    matmul.cube_mma = Default::default();
    matmul.scaled_mma = Default::default();
    matmul.cmma_tensor_addressing = false;
    if matmul.cmma.is_empty() && matmul.mma.is_empty() {
        props.hardware.num_tensor_cores = None;
        props.hardware.min_tensor_cores_dim = None;
    }

    // No TMA, no clusters, no async copy, and no `mbarrier` behind them.
    props.features.tma = Default::default();
    props.features.cube_cluster = false;
    props.features.copy_async = false;
    props.features.types.opaque.remove(&OpaqueType::TensorMap);
    props.features.types.opaque.remove(&OpaqueType::Barrier);

    // No `bf16` atomics.
    props
        .features
        .types
        .atomic
        .retain(|ty, _| ty.elem_type() != BF16);

    // Complex arithmetic is lowered by the C++ backends only.
    props.features.types.complex.clear();
    for kind in [ComplexKind::C32, ComplexKind::C64] {
        props.features.types.elem.remove(&ElemType::Complex(kind));
    }

    // Scalar float atomics only.
    props
        .features
        .types
        .atomic
        .retain(|ty, _| ty.vector_size() == 1);
}
