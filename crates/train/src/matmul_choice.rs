//! `train.matmul`: the cubek matmul routine a run's linear layers name on a
//! cubecl device (`terse_fused::name_linear_matmul`), checked with the
//! config, named for the process before the model is built, and logged by
//! the lead rank with, at the end, the products it could not take.

use std::path::Path;

use terse_kernels::device::BARRIER_HEADERS;

use crate::device::DeviceChoice;
use crate::{Precision, RunConfig, TrainError};

/// A named routine is one of cubek's, on a cubecl device.
pub(crate) fn check(cfg: &RunConfig) -> Result<(), String> {
    let Some(name) = &cfg.train.matmul else {
        return Ok(());
    };
    if !terse_fused::matmul_routine_names().any(|known| known == name) {
        let known: Vec<&str> = terse_fused::matmul_routine_names().collect();
        return Err(format!(
            "train.matmul = \"{name}\": not a matmul routine; known: {}",
            known.join(", ")
        ));
    }
    if cfg.train.device.is_cpu() {
        return Err(format!(
            "train.matmul = \"{name}\" names a cubek routine for a cubecl device (wgpu, \
             lavapipe, cuda); device cpu multiplies with flex's own matmul"
        ));
    }
    if let Some(why) = cublas_off_cuda(name, &cfg.train.device) {
        return Err(why);
    }
    matmul_agrees_with_precision(name, cfg.train.precision)
}

/// A cuBLAS routine named for a device other than `cuda`: there cuBLAS
/// declines every product to burn's matmul, and a run or a benchmark row
/// would carry a routine it never ran.
fn cublas_off_cuda(name: &str, device: &DeviceChoice) -> Option<String> {
    (terse_fused::is_cublas_routine(name) && !matches!(device, DeviceChoice::Cuda(_))).then(|| {
        format!(
            "train.matmul = \"{name}\" is NVIDIA's cuBLAS, for device cuda (cuda:N); device \
             {device} runs cubek's routines"
        )
    })
}

/// A named routine multiplies f32 operands: under a half precision it
/// would decline every product to burn's matmul (a run labelled with a
/// routine it never ran), and cuBLAS's f32 arithmetic contradicts `tf32`.
pub fn matmul_agrees_with_precision(name: &str, precision: Precision) -> Result<(), String> {
    if precision.half().is_some() {
        return Err(format!(
            "train.matmul = \"{name}\" multiplies f32 operands, and train.precision = \
             \"{precision}\" hands the linear layers {precision} ones (burn's matmul, cubek's \
             half-precision tensor-core routine, takes them): leave train.matmul unset"
        ));
    }
    if precision == Precision::Tf32 && name == "cublas" {
        return Err(
            "train.matmul = \"cublas\" is cuBLAS's f32 arithmetic, and train.precision = \
             \"tf32\" asks for TF32 matmuls: name \"cublas_tf32\" (or train.precision = \"fp32\")"
                .to_string(),
        );
    }
    Ok(())
}

/// What a cuBLAS routine needs of the machine, said before the run starts
/// (otherwise each product would fall back to burn's matmul, counted).
fn cublas_missing(name: &str) -> Option<String> {
    (terse_fused::is_cublas_routine(name) && !terse_fused::cublas_present()).then(|| {
        format!(
            "train.matmul = \"{name}\": cuBLAS was not found (libcublas.so.13 or .so.12): \
             `pip install nvidia-cublas-cu12` (or `-cu13`) and put its `nvidia/cublas/lib` in \
             LD_LIBRARY_PATH, or install a CUDA toolkit"
        )
    })
}

/// What a TMA routine's kernels include ([`BARRIER_HEADERS`]) that CUDA's
/// `include` directory lacks, said before the run starts (NVRTC would fail
/// at the first product). `cuda/barrier` is CCCL's, which cubecl also
/// finds in `include/cccl` (a CUDA 13 toolkit's and pip's layout). Other
/// routines' asynchronous loads may wait on barriers too; which do has not
/// been worked out.
fn barrier_headers_missing(name: &str, include: Option<&Path>) -> Option<String> {
    let include = include.filter(|_| name.contains("tma"))?;
    let found = |header: &str| {
        include.join(header).is_file() || include.join("cccl").join(header).is_file()
    };
    let absent: Vec<&str> = BARRIER_HEADERS
        .into_iter()
        .filter(|header| !found(header))
        .collect();
    (!absent.is_empty()).then(|| {
        format!(
            "train.matmul = \"{name}\": its TMA loads wait on barriers, whose kernels include \
             {} from CUDA's headers, and {} lacks {}: set CUDA_PATH to a CUDA toolkit, or \
             `pip install nvidia-cuda-cccl` beside nvidia-cuda-runtime (CUDA 13, \
             CUDA_PATH=site-packages/nvidia/cu13), or leave train.matmul unset",
            BARRIER_HEADERS.join(", "),
            include.display(),
            absent.join(", ")
        )
    })
}

/// What this machine lacks for routine `name` on `device`, in one line:
/// on `cuda` cuBLAS or the barrier headers; elsewhere cuBLAS itself (a
/// cuBLAS routine runs on `cuda` only; other devices have no TMA, and a
/// TMA routine declines there to burn's matmul, as the sweep records).
/// None where it has all. The trainer, `bench model`'s `--matmul` and the
/// matmul sweep ask it before any kernel compiles.
pub fn matmul_machine_lacks(name: &str, device: &DeviceChoice) -> Option<String> {
    if !matches!(device, DeviceChoice::Cuda(_)) {
        return cublas_off_cuda(name, device);
    }
    let include = cubecl::cuda::install::cuda_path().map(|root| root.join("include"));
    cublas_missing(name).or_else(|| barrier_headers_missing(name, include.as_deref()))
}

/// Names the run's routine (or burn's own matmul) for the process: every
/// rank of the process names the same one.
pub(crate) fn name_for_run(cfg: &RunConfig) -> Result<(), TrainError> {
    let name = cfg.train.matmul.as_deref();
    if let Some(reason) = name.and_then(|name| matmul_machine_lacks(name, &cfg.train.device)) {
        return Err(TrainError::InvalidRun {
            field: "train.matmul",
            reason,
        });
    }
    terse_fused::name_linear_matmul(cfg.train.matmul.as_deref()).map_err(|reason| {
        TrainError::InvalidRun {
            field: "train.matmul",
            reason,
        }
    })
}

/// The routine the lead rank's device log names.
pub(crate) fn log_named(cfg: &RunConfig) {
    if let Some(name) = &cfg.train.matmul {
        let whose = if terse_fused::is_cublas_routine(name) {
            "cuBLAS's"
        } else {
            "cubek's"
        };
        tracing::info!("the linear layers' matmuls run {whose} `{name}` routine (train.matmul)");
    }
}

/// A named routine that could not take some of the linear layers' products
/// (a device without its instructions, a half type), which burn's matmul
/// then ran: said, since the run was not all that routine's. The count is
/// the process's (every local rank's products).
pub(crate) fn log_declined(cfg: &RunConfig) {
    let declined = terse_fused::declined_matmuls();
    if let Some(name) = &cfg.train.matmul
        && declined > 0
    {
        let why = terse_fused::first_decline_reason().unwrap_or_default();
        tracing::warn!(
            "train.matmul = \"{name}\": the routine could not take {declined} of the linear \
             layers' products in this process on {} (burn's matmul ran them); the first: {why}",
            cfg.train.device
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_routine_agrees_with_the_precision() {
        for name in ["simple_unit", "cublas", "cublas_tf32"] {
            assert_eq!(matmul_agrees_with_precision(name, Precision::Fp32), Ok(()));
            for half in [Precision::Bf16, Precision::Fp16] {
                let why = matmul_agrees_with_precision(name, half).unwrap_err();
                assert!(
                    why.contains(&format!("train.matmul = \"{name}\""))
                        && why.contains(&format!("train.precision = \"{half}\""))
                        && why.contains("leave train.matmul unset"),
                    "{why}"
                );
            }
        }
        assert_eq!(
            matmul_agrees_with_precision("cublas_tf32", Precision::Tf32),
            Ok(())
        );
        assert_eq!(
            matmul_agrees_with_precision("simple_tma_mma", Precision::Tf32),
            Ok(())
        );
        let why = matmul_agrees_with_precision("cublas", Precision::Tf32).unwrap_err();
        assert!(why.contains("name \"cublas_tf32\""), "{why}");
    }

    #[test]
    fn a_tma_routine_names_the_barrier_headers_cuda_lacks() {
        let root = tempfile::tempdir().unwrap();
        let include = root.path();
        let write = |header: &str| {
            let path = include.join(header);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        };
        // pip's runtime headers without CCCL: cooperative groups, no barrier.
        write("cooperative_groups.h");
        write("cooperative_groups/memcpy_async.h");
        let why = barrier_headers_missing("simple_tma_mma", Some(include)).unwrap();
        assert!(
            why.starts_with("train.matmul = \"simple_tma_mma\"")
                && why.contains(&format!("{} lacks cuda/barrier:", include.display()))
                && why.contains("nvidia-cuda-cccl"),
            "{why}"
        );
        // Routines without TMA, and a device without a CUDA directory (its
        // own check names that), are not judged.
        assert_eq!(
            barrier_headers_missing("simple_cyclic_cmma", Some(include)),
            None
        );
        assert_eq!(barrier_headers_missing("double_tma_mma", None), None);
        // CCCL where cubecl also looks: include/cccl.
        write("cccl/cuda/barrier");
        for name in [
            "simple_tma_cmma",
            "simple_tma_mma",
            "double_tma_mma",
            "specialized_tma_mma",
        ] {
            assert_eq!(barrier_headers_missing(name, Some(include)), None, "{name}");
        }
        std::fs::remove_file(include.join("cooperative_groups.h")).unwrap();
        let why = barrier_headers_missing("specialized_tma_mma", Some(include)).unwrap();
        assert!(why.contains("lacks cooperative_groups.h:"), "{why}");
    }

    #[test]
    fn only_cuda_is_judged_for_headers_and_only_cuda_has_cublas() {
        // Off CUDA TMA is not available (a TMA routine declines to burn's
        // matmul, and the sweep says so): no headers to lack. cuBLAS is
        // refused there in one line.
        for device in [DeviceChoice::Lavapipe, DeviceChoice::Wgpu] {
            for name in ["simple_tma_mma", "simple_unit"] {
                assert_eq!(matmul_machine_lacks(name, &device), None, "{name}");
            }
            for name in ["cublas", "cublas_tf32"] {
                let why = matmul_machine_lacks(name, &device).expect(name);
                assert!(
                    why.contains(&format!("\"{name}\" is NVIDIA's cuBLAS, for device cuda"))
                        && why.contains(&format!("device {device} runs cubek's")),
                    "{why}"
                );
            }
        }
        let cuda = DeviceChoice::Cuda(0);
        assert_eq!(matmul_machine_lacks("simple_unit", &cuda), None);
        if !terse_fused::cublas_present() {
            let why = matmul_machine_lacks("cublas", &cuda).unwrap();
            assert!(why.contains("cuBLAS was not found"), "{why}");
        }
    }

    #[test]
    fn a_cublas_routine_without_libcublas_says_how_to_get_it() {
        assert_eq!(cublas_missing("simple_unit"), None);
        if terse_fused::cublas_present() {
            // A machine with cuBLAS (a GPU node): nothing is missing.
            assert_eq!(cublas_missing("cublas"), None);
            return;
        }
        let why = cublas_missing("cublas_tf32").expect("no libcublas here");
        assert!(
            why.contains("train.matmul = \"cublas_tf32\"")
                && why.contains("nvidia-cublas-cu12")
                && why.contains("LD_LIBRARY_PATH"),
            "{why}"
        );
    }
}
