//! What `train.device = "cuda"` needs from the machine, asked before burn's
//! CUDA backend starts: cubecl loads the driver and NVRTC at run time and
//! panics (on its device thread, then on ours) when one is missing, and
//! it passes `$CUDA_PATH/include` to every NVRTC compile, panicking when no
//! CUDA installation is found. So each of those is checked here first and a
//! missing one becomes one line saying what is missing and how to get it.
//!
//! Where cubecl looks (cubecl-cuda 0.11.3, `install::cuda_path`): the
//! headers under `$CUDA_PATH/include`, else `/usr/local/cuda`, `/opt/cuda`,
//! or `/usr` when `/usr/bin/nvcc` exists. cudarc opens the libraries by name
//! (`LD_LIBRARY_PATH` and the linker's paths): `libcuda.so`/`.so.1` and
//! `libnvrtc.so`/`.so.13`/`.so.12`/….

use std::path::PathBuf;

use terse_comm::CudaGpu;

use crate::Precision;

/// The headers under the CUDA directory's `include/` that cubecl's kernels
/// include: `cuda_fp16.h` and `cuda_bf16.h` (fp16 and bf16 kernels), `mma.h`
/// (the tensor-core matmuls: every f32 matmul on sm_80 and newer, which
/// cubek stages as TF32, and bf16's and fp16's), and `crt/mma.h`, which
/// `mma.h` includes. A toolkit has all four; of pip's wheels, CUDA 13's
/// nvidia-cuda-runtime has the first three and nvidia-cuda-crt the fourth,
/// both under site-packages/nvidia/cu13/include, while CUDA 12's split
/// them between nvidia-cuda-runtime-cu12 (nvidia/cuda_runtime/include) and
/// nvidia-cuda-nvcc-cu12 (nvidia/cuda_nvcc/include/crt). A missing one is
/// otherwise a panic inside cubecl at the first kernel that includes it.
/// An fp32 run on a GPU older than compute capability 8.0 includes none of
/// them ([`headers_needed`]).
pub const HEADERS: [&str; 4] = ["cuda_fp16.h", "cuda_bf16.h", "mma.h", "crt/mma.h"];

/// The [`HEADERS`] a run in `precision` on `gpu` compiles against.
/// cubecl's CUDA C++ includes a header only for a kernel that uses its
/// types (cubecl-cpp 0.11 `cuda/ty.rs`: `mma.h` for tensor-core tiles and
/// TF32, `cuda_fp16.h` / `cuda_bf16.h` for the half types). Before compute
/// capability 8.0 (the papers' V100s, or a T4) cubecl registers no TF32,
/// so an fp32 (or `tf32`, the same there) run's matmuls take no tile and
/// none of its kernels has a half type: it needs none of them. Every other
/// run needs all four (fp16's tiles include `mma.h`, whose `crt/mma.h`
/// includes both half headers), as does any run on a GPU the driver did
/// not describe.
pub fn headers_needed(gpu: Option<&CudaGpu>, precision: Precision) -> &'static [&'static str] {
    let f32_without_tiles = matches!(precision, Precision::Fp32 | Precision::Tf32)
        && gpu.is_some_and(|gpu| !gpu.has_tf32_and_bf16());
    if f32_without_tiles { &[] } else { &HEADERS }
}

/// How to get [`HEADERS`], for the error line.
const HOW_TO_GET_HEADERS: &str = "set CUDA_PATH to a CUDA toolkit, or to pip's site-packages/\
nvidia/cu13 after `pip install nvidia-cuda-runtime nvidia-cuda-crt` (CUDA 13), or to a directory \
whose include/ links CUDA 12's nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12 headers into one, \
as the GPU bundle's cuda_env.sh does";

/// What a CUDA run asks of the machine; [`ThisMachine`] answers for this
/// one, tests answer for machines this one is not.
pub trait Machine {
    /// Whether the driver library (`libcuda.so`) can be opened.
    fn has_driver(&self) -> bool;
    /// The driver's start-up (`cuInit`), and the number of devices it sees.
    fn devices(&self) -> Result<usize, String>;
    /// Device `index`'s name and compute capability (once [`Self::devices`]
    /// has counted it).
    fn gpu(&self, index: usize) -> Result<CudaGpu, String>;
    /// Whether NVRTC (`libnvrtc.so`) can be opened.
    fn has_nvrtc(&self) -> bool;
    /// The CUDA installation cubecl would hand NVRTC, if any.
    fn cuda_path(&self) -> Option<PathBuf>;
}

/// This process's machine.
pub struct ThisMachine;

impl Machine for ThisMachine {
    fn has_driver(&self) -> bool {
        terse_comm::cuda_driver_present()
    }

    fn devices(&self) -> Result<usize, String> {
        terse_comm::cuda_device_count()
    }

    fn gpu(&self, index: usize) -> Result<CudaGpu, String> {
        terse_comm::cuda_gpu(index)
    }

    fn has_nvrtc(&self) -> bool {
        // SAFETY: only tries to open the library by its names.
        unsafe { cudarc::nvrtc::sys::is_culib_present() }
    }

    fn cuda_path(&self) -> Option<PathBuf> {
        cubecl::cuda::install::cuda_path()
    }
}

/// `Ok` when CUDA device `index` can run terse's kernels in `precision` on
/// `machine`; otherwise everything that is missing and how to get it, in
/// one line.
pub fn check(machine: &dyn Machine, index: usize, precision: Precision) -> Result<(), String> {
    let mut missing = Vec::new();
    let mut gpu = None;
    if !machine.has_driver() {
        missing.push(
            "no NVIDIA driver: libcuda.so was not found (install the NVIDIA driver: in a \
             container the host's driver must be mounted, e.g. `docker run --gpus all`, and a \
             driver outside the linker's paths goes in LD_LIBRARY_PATH)"
                .to_string(),
        );
    } else {
        match machine.devices() {
            Err(e) => missing.push(format!(
                "the NVIDIA driver did not start ({e}): is a GPU visible? (`nvidia-smi`)"
            )),
            Ok(count) if index >= count => missing.push(format!(
                "no CUDA device {index}: the driver sees {count} (devices are numbered from 0, \
                 and CUDA_VISIBLE_DEVICES may hide some)"
            )),
            Ok(_) => match machine.gpu(index) {
                Ok(found) => gpu = Some(found),
                Err(e) => missing.push(format!(
                    "the driver did not describe CUDA device {index} ({e})"
                )),
            },
        }
    }
    if let Some(gpu) = gpu.as_ref().filter(|gpu| !gpu.has_tf32_and_bf16())
        && precision == Precision::Bf16
    {
        // cubecl would compile bf16 for it all the same, as float
        // arithmetic behind every operation and matmuls without tensor
        // cores: a run far slower than fp16's, which PyTorch's autocast
        // starts without a word.
        missing.push(format!(
            "train.precision = \"bf16\" needs bf16 tensor cores, compute capability 8.0 \
             or newer (A100, H100, …): CUDA device {index} is {gpu}; its half precision is \
             fp16 (`--precision fp16`, with dynamic loss scaling)"
        ));
    }
    let needed = headers_needed(gpu.as_ref(), precision);
    if !machine.has_nvrtc() {
        missing.push(
            "NVRTC was not found (libnvrtc.so.13 or .so.12): terse's GPU kernels are compiled \
             with it when they first run: `pip install nvidia-cuda-nvrtc-cu12` (or `-cu13`) and \
             put its lib directory in LD_LIBRARY_PATH (site-packages/nvidia/cuda_nvrtc/lib, or \
             nvidia/cu13/lib for CUDA 13), or install a CUDA toolkit"
                .to_string(),
        );
    }
    let headers = needed.join(", ");
    match machine.cuda_path() {
        // cubecl asks for a CUDA directory before every compile, headers
        // or not.
        None if needed.is_empty() => missing.push(format!(
            "no CUDA directory: cubecl 0.11 stops at its first kernel without one, although \
             this {precision} run on a GPU without TF32 includes no CUDA header: set CUDA_PATH \
             to a CUDA toolkit, or to any directory"
        )),
        None => missing.push(format!(
            "no CUDA headers: NVRTC is handed `$CUDA_PATH/include` (default /usr/local/cuda or \
             /opt/cuda, none here), whose {headers} terse's kernels include: {HOW_TO_GET_HEADERS}"
        )),
        Some(_) if needed.is_empty() => {}
        Some(root) if !root.join("include").is_dir() => missing.push(format!(
            "no CUDA headers: {} does not exist (NVRTC is handed it, and terse's kernels include \
             its {headers}): {HOW_TO_GET_HEADERS}",
            root.join("include").display()
        )),
        Some(root) => {
            let include = root.join("include");
            let absent: Vec<&str> = needed
                .iter()
                .copied()
                .filter(|header| !include.join(header).is_file())
                .collect();
            if !absent.is_empty() {
                missing.push(format!(
                    "no CUDA headers {} in {} (NVRTC is handed it, and terse's kernels include \
                     {headers}): {HOW_TO_GET_HEADERS}",
                    absent.join(", "),
                    include.display()
                ));
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with the given answers (the GPU-less ones this machine
    /// cannot give).
    struct Answers {
        driver: bool,
        devices: Result<usize, String>,
        gpu: CudaGpu,
        nvrtc: bool,
        cuda_path: Option<PathBuf>,
    }

    impl Machine for Answers {
        fn has_driver(&self) -> bool {
            self.driver
        }
        fn devices(&self) -> Result<usize, String> {
            self.devices.clone()
        }
        fn gpu(&self, _: usize) -> Result<CudaGpu, String> {
            Ok(self.gpu.clone())
        }
        fn has_nvrtc(&self) -> bool {
            self.nvrtc
        }
        fn cuda_path(&self) -> Option<PathBuf> {
            self.cuda_path.clone()
        }
    }

    fn gpu(name: &str, capability: (u32, u32)) -> CudaGpu {
        CudaGpu {
            name: name.into(),
            capability,
        }
    }

    fn complete(root: &std::path::Path) -> Answers {
        Answers {
            driver: true,
            devices: Ok(2),
            gpu: gpu("NVIDIA H100 80GB HBM3", (9, 0)),
            nvrtc: true,
            cuda_path: Some(root.to_path_buf()),
        }
    }

    /// A CUDA directory whose `include/` holds `headers` (empty files).
    fn cuda_root(headers: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("include/crt")).unwrap();
        for header in headers {
            std::fs::write(root.path().join("include").join(header), "").unwrap();
        }
        root
    }

    #[test]
    fn each_missing_part_is_named_with_how_to_get_it() {
        let root = cuda_root(&HEADERS);
        assert_eq!(check(&complete(root.path()), 1, Precision::Fp32), Ok(()));

        // The error of the complete machine with one answer changed.
        let error = |change: fn(&mut Answers), index| {
            let mut machine = complete(root.path());
            change(&mut machine);
            check(&machine, index, Precision::Fp32).unwrap_err()
        };
        let no_driver = error(|m| m.driver = false, 0);
        assert!(
            no_driver.starts_with("no NVIDIA driver: libcuda.so"),
            "{no_driver}"
        );
        assert!(
            !no_driver.contains(';'),
            "only the driver is missing: {no_driver}"
        );
        let not_started = error(|m| m.devices = Err("CUDA_ERROR_NO_DEVICE".into()), 0);
        assert!(
            not_started.contains("CUDA_ERROR_NO_DEVICE"),
            "{not_started}"
        );
        let beyond = error(|_| {}, 2);
        assert!(
            beyond.starts_with("no CUDA device 2: the driver sees 2"),
            "{beyond}"
        );
        let no_nvrtc = error(|m| m.nvrtc = false, 0);
        assert!(
            no_nvrtc.contains("pip install nvidia-cuda-nvrtc-cu12"),
            "{no_nvrtc}"
        );
        let no_headers = error(|m| m.cuda_path = None, 0);
        assert!(
            no_headers.starts_with("no CUDA headers") && no_headers.contains("cuda_bf16.h"),
            "{no_headers}"
        );
        let empty = tempfile::tempdir().unwrap();
        let no_include = check(&complete(empty.path()), 0, Precision::Fp32).unwrap_err();
        assert!(
            no_include.contains("include does not exist"),
            "{no_include}"
        );
        // CUDA 13's runtime wheel alone: crt/mma.h (nvidia-cuda-crt) missing.
        let runtime_only = cuda_root(&["cuda_fp16.h", "cuda_bf16.h", "mma.h"]);
        let no_crt = check(&complete(runtime_only.path()), 0, Precision::Fp32).unwrap_err();
        assert!(
            no_crt.starts_with(&format!(
                "no CUDA headers crt/mma.h in {}",
                runtime_only.path().join("include").display()
            )) && no_crt.contains("pip install nvidia-cuda-runtime nvidia-cuda-crt"),
            "{no_crt}"
        );
        let only_bf16 = cuda_root(&["cuda_bf16.h"]);
        let three = check(&complete(only_bf16.path()), 0, Precision::Fp32).unwrap_err();
        assert!(
            three.starts_with("no CUDA headers cuda_fp16.h, mma.h, crt/mma.h in "),
            "{three}"
        );
        for line in [
            no_driver,
            not_started,
            beyond,
            no_nvrtc,
            no_headers,
            no_include,
            no_crt,
            three,
        ] {
            assert_eq!(line.lines().count(), 1, "{line}");
        }
    }

    #[test]
    fn everything_missing_is_said_in_one_line() {
        let nothing = Answers {
            driver: false,
            devices: Err("unused".into()),
            gpu: gpu("unused", (0, 0)),
            nvrtc: false,
            cuda_path: None,
        };
        let error = check(&nothing, 0, Precision::Fp32).unwrap_err();
        let parts: Vec<&str> = error
            .split("; ")
            .map(|p| &p[..p.find(':').unwrap()])
            .collect();
        assert_eq!(
            parts,
            [
                "no NVIDIA driver",
                "NVRTC was not found (libnvrtc.so.13 or .so.12)",
                "no CUDA headers"
            ]
        );
        assert_eq!(error.lines().count(), 1);
    }

    /// What a run needs follows the GPU and the precision: before compute
    /// capability 8.0 fp32 needs no header and bf16 is refused, naming the
    /// GPU and fp16; from 8.0 every precision needs all four headers.
    #[test]
    fn a_gpu_without_tf32_needs_no_header_for_fp32_and_refuses_bf16() {
        let v100 = gpu("Tesla V100-SXM2-32GB", (7, 0));
        let t4 = gpu("Tesla T4", (7, 5));
        let a100 = gpu("NVIDIA A100-SXM4-80GB", (8, 0));
        for older in [&v100, &t4] {
            assert!(headers_needed(Some(older), Precision::Fp32).is_empty());
            assert!(headers_needed(Some(older), Precision::Tf32).is_empty());
            assert_eq!(headers_needed(Some(older), Precision::Fp16), HEADERS);
        }
        for precision in Precision::ALL {
            assert_eq!(headers_needed(Some(&a100), precision), HEADERS);
            // A GPU the driver did not describe: all four, as before.
            assert_eq!(headers_needed(None, precision), HEADERS);
        }

        // The CUDA 13 runtime wheel alone (no crt/mma.h), on a V100.
        let runtime_only = cuda_root(&["cuda_fp16.h", "cuda_bf16.h", "mma.h"]);
        let on = |gpu: &CudaGpu, root: Option<&std::path::Path>, precision| {
            let mut machine = complete(runtime_only.path());
            machine.gpu = gpu.clone();
            machine.cuda_path = root.map(std::path::Path::to_path_buf);
            check(&machine, 0, precision)
        };
        let wheel = Some(runtime_only.path());
        assert_eq!(on(&v100, wheel, Precision::Fp32), Ok(()));
        assert_eq!(on(&t4, wheel, Precision::Tf32), Ok(()));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(on(&v100, Some(empty.path()), Precision::Fp32), Ok(()));
        let fp16 = on(&v100, wheel, Precision::Fp16).unwrap_err();
        assert!(fp16.starts_with("no CUDA headers crt/mma.h in "), "{fp16}");
        let a100_fp32 = on(&a100, wheel, Precision::Fp32).unwrap_err();
        assert!(
            a100_fp32.starts_with("no CUDA headers crt/mma.h in "),
            "{a100_fp32}"
        );

        // cubecl still stops without a CUDA directory.
        let no_root = on(&v100, None, Precision::Fp32).unwrap_err();
        assert!(
            no_root.starts_with("no CUDA directory:")
                && no_root.contains("includes no CUDA header"),
            "{no_root}"
        );

        let bf16 = on(&v100, wheel, Precision::Bf16).unwrap_err();
        assert!(
            bf16.starts_with("train.precision = \"bf16\" needs bf16 tensor cores")
                && bf16.contains("CUDA device 0 is Tesla V100-SXM2-32GB, compute capability 7.0")
                && bf16.contains("--precision fp16"),
            "{bf16}"
        );
        // ... and the missing crt/mma.h beside it, in the same line.
        assert!(bf16.contains("; no CUDA headers crt/mma.h"), "{bf16}");
        assert_eq!(bf16.lines().count(), 1);
        assert_eq!(
            on(&a100, Some(cuda_root(&HEADERS).path()), Precision::Bf16),
            Ok(())
        );
    }
}
