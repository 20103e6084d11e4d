//! How NCCL starts, up to the GPU, on a machine without one.
//!
//! A process `mpirun` did not start runs NCCL in a world of one
//! bootstrapped without MPI: a machine running terse from `cargo xtask
//! bundle` has libmpi but not OpenMPI's plugins or `orted`, so an MPI
//! singleton start would fail there before NCCL opened the GPU. And NCCL
//! installed the way PyTorch's wheels and Debian install it (as
//! `libnccl.so.2` only, a name cudarc never opens) is found and the link
//! cudarc needs named, instead of "not found".
//!
//! The driver and NCCL are stand-ins built here: a `libcuda.so` whose
//! `cuInit` answers `CUDA_ERROR_NO_DEVICE` (what the real driver answers on
//! a machine without a GPU) and an empty `libnccl.so.2` (only opened before
//! the GPU is). MPI is made unable to start (no component directory), so a
//! run that started it would fail in `MPI_Init` instead of reaching the GPU.
#![cfg(feature = "nccl")]

use std::path::Path;
use std::process::{Command, Output};

/// Builds the stand-in libraries into `dir`.
fn stand_in_libraries(dir: &Path) {
    let source = dir.join("cuda_stub.c");
    // 100 is CUDA_ERROR_NO_DEVICE; its name and text are the driver's.
    let driver = r#"
        int cuInit(unsigned int flags) { return 100; }
        int cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
        int cuGetErrorString(int e, const char **s) {
            *s = "no CUDA-capable device is detected";
            return 0;
        }
    "#;
    std::fs::write(&source, driver).unwrap();
    let cc = |args: &[&str], input: &Path, output: &str| {
        let built = Command::new("cc")
            .args(["-shared", "-fPIC"])
            .args(args)
            .arg(input)
            .arg("-o")
            .arg(dir.join(output))
            .status()
            .expect("cc (the C compiler Rust links with) starts");
        assert!(built.success(), "cc {output}");
    };
    cc(&[], &source, "libcuda.so");
    cc(&["-x", "c"], Path::new("/dev/null"), "libnccl.so.2");
}

/// `terse-comm-check --nccl` started alone, with `libraries` first on the
/// loader's path and MPI unable to start; its stderr.
fn nccl_check_alone(libraries: &Path) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse-comm-check"));
    command
        .arg("--nccl")
        .env("LD_LIBRARY_PATH", libraries)
        .env("OMPI_MCA_mca_base_component_path", libraries.join("none"));
    for launcher in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"] {
        command.env_remove(launcher);
    }
    let output: Output = command.output().expect("terse-comm-check starts");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("{stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn nccl_as_pip_installs_it_is_found_and_the_link_named() {
    let scratch = tempfile::tempdir().unwrap();
    let libs = scratch.path().canonicalize().unwrap();
    stand_in_libraries(&libs);
    let stderr = nccl_check_alone(&libs);
    let soname = libs.join("libnccl.so.2");
    assert!(
        stderr.contains(&format!("NCCL is at {}", soname.display()))
            && stderr.contains(&format!("ln -sf {} ", soname.display()))
            && stderr.contains("libnccl.so`"),
        "{stderr}"
    );
}

#[test]
fn nccl_started_alone_reaches_the_gpu_without_mpi() {
    let scratch = tempfile::tempdir().unwrap();
    let libs = scratch.path();
    stand_in_libraries(libs);
    std::os::unix::fs::symlink(libs.join("libnccl.so.2"), libs.join("libnccl.so")).unwrap();
    let stderr = nccl_check_alone(libs);
    // The driver was asked for the GPU: NCCL's bootstrap got that far.
    assert!(
        stderr.contains("GPU 0") && stderr.contains("CUDA_ERROR_NO_DEVICE"),
        "{stderr}"
    );
}
