//! `--device cuda` on a machine without an NVIDIA driver (this one, CI's):
//! the real `terse` binary refuses it in one line naming every missing
//! part — the driver, NVRTC, CUDA's headers — and how to get it, before
//! burn's CUDA backend (which panics on a missing library) is touched. The
//! NVRTC and header lookups are the real ones: a library named
//! `libnvrtc.so.12` on `LD_LIBRARY_PATH` (an empty one, built here: the
//! lookup only opens it) and a `CUDA_PATH` whose `include/` holds the four
//! headers (empty files: the check looks for them, NVRTC never reads them
//! here) take those parts off the line, leaving the driver; one header
//! missing is named.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn terse_on_cuda(run_dir: &Path, env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--steps", "1", "--device", "cuda", "--run-dir"])
        .arg(run_dir)
        .env_remove("CUDA_PATH")
        .env_remove("LD_LIBRARY_PATH")
        .current_dir(common::workspace());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("terse starts")
}

/// The one error line of a refused run.
fn error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_string()
}

#[test]
fn cuda_without_a_driver_names_each_missing_part_in_one_line() {
    let scratch = tempfile::tempdir().unwrap();
    let bare = error_line(&terse_on_cuda(&scratch.path().join("bare"), &[]));
    println!("nothing installed: {bare}");
    for part in [
        "`cuda` cannot be used: no NVIDIA driver: libcuda.so was not found",
        "NVRTC was not found (libnvrtc.so.13 or .so.12)",
        "pip install nvidia-cuda-nvrtc-cu12",
        "no CUDA headers",
        "cuda_fp16.h, cuda_bf16.h, mma.h",
    ] {
        assert!(bare.contains(part), "`{part}` missing from: {bare}");
    }

    // NVRTC and a CUDA directory present: only the driver is missing.
    let libs = scratch.path().join("lib");
    let cuda = scratch.path().join("cuda");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::create_dir_all(cuda.join("include/crt")).unwrap();
    // The three headers of CUDA 13's nvidia-cuda-runtime wheel: the
    // fourth, crt/mma.h (nvidia-cuda-crt), is named as missing.
    for header in ["cuda_fp16.h", "cuda_bf16.h", "mma.h"] {
        std::fs::write(cuda.join("include").join(header), "").unwrap();
    }
    let built = Command::new("cc")
        .args(["-shared", "-x", "c", "/dev/null", "-o"])
        .arg(libs.join("libnvrtc.so.12"))
        .status()
        .expect("cc (the C compiler Rust links with) starts");
    assert!(built.success());
    let env: [(&str, &Path); 2] = [("LD_LIBRARY_PATH", &libs), ("CUDA_PATH", &cuda)];
    let no_crt = error_line(&terse_on_cuda(&scratch.path().join("no-crt"), &env));
    println!("crt/mma.h missing: {no_crt}");
    assert!(
        no_crt.contains(&format!(
            "no CUDA headers crt/mma.h in {}",
            cuda.join("include").display()
        )) && no_crt.contains("pip install nvidia-cuda-runtime nvidia-cuda-crt"),
        "{no_crt}"
    );
    std::fs::write(cuda.join("include/crt/mma.h"), "").unwrap();
    let found = error_line(&terse_on_cuda(&scratch.path().join("found"), &env));
    println!("NVRTC and headers found: {found}");
    assert!(found.contains("no NVIDIA driver"), "{found}");
    assert!(!found.contains("NVRTC"), "{found}");
    assert!(!found.contains("no CUDA headers"), "{found}");

    // A CUDA_PATH without include/ is named.
    let no_include = error_line(&terse_on_cuda(
        &scratch.path().join("no-include"),
        &[("LD_LIBRARY_PATH", &libs), ("CUDA_PATH", &libs)],
    ));
    assert!(
        no_include.contains(&format!(
            "{} does not exist",
            libs.join("include").display()
        )),
        "{no_include}"
    );
}
