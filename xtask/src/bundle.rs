//! `cargo xtask bundle`: a directory (and its `.tar.xz`) that runs terse's
//! GPU benchmark on a machine with no Rust toolchain and no OpenMPI — a GPU
//! node, or a lent GPU reached for one call: the stripped `terse`,
//! `terse-comm-check`, `terse-gpu-exchange-check`, `model_step` and
//! `matmul_routines` binaries, the shared libraries they load that a bare
//! machine may lack (those `ldd` resolves outside the C library, and the
//! Vulkan loader wgpu opens at run time), the PyTorch side of the
//! comparison and a `run.sh` that prints terse beside PyTorch on the same
//! GPU (`run.sh --help`).
//!
//! The NVIDIA driver, NVRTC, NCCL and CUDA's headers come from the GPU machine:
//! they belong to its driver and CUDA installation, and `terse` names the
//! one that is missing (`crates/train/src/cuda_check.rs`). Where the machine
//! has them only in PyTorch's pip wheels, the bundle's `cuda_env.sh` (sourced
//! by `run.sh` and the prepared GPU calls) puts them on the paths.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::terse_binary;

/// Arguments of `cargo xtask bundle`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the bundle directory (its `.tar.xz` goes beside it)
    #[arg(long, value_name = "DIR", default_value = "target/terse-gpu-bundle")]
    pub out: PathBuf,
    /// How hard xz packs the `.tar.xz`: `small` (34 MB, about 3.5 minutes
    /// of one core: a lent GPU takes the bundle with the whole working tree,
    /// 64 MiB at most) or `fast` (62 MB in about 13 s on two cores: CI,
    /// which extracts it and runs it on lavapipe)
    #[arg(long, value_enum, default_value = "small")]
    pub archive: Archive,
}

/// How the bundle's `.tar.xz` is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Archive {
    /// xz's preset 9 with a 192 MiB dictionary and its x86 filter, one thread
    Small,
    /// xz's preset 1 with its x86 filter, on every core
    Fast,
}

impl Archive {
    /// xz's options (`XZ_OPT`). Small: the x86 filter makes calls
    /// position-independent and a dictionary wider than one binary finds
    /// the code the binaries share (burn, cubecl): 28 → 19 MB on three of
    /// them (stop 81); one thread, since xz's threads each take a block of
    /// three dictionaries, more than the whole bundle.
    fn xz_options(self) -> &'static str {
        match self {
            Archive::Small => "-T1 --x86 --lzma2=preset=9,dict=192MiB",
            Archive::Fast => "-T0 --x86 --lzma2=preset=1",
        }
    }
}

/// The run script, written as `run.sh`.
const RUN_SH: &str = include_str!("bundle_run.sh");

/// The CUDA libraries' lookup in PyTorch's wheels, written as `cuda_env.sh`:
/// sourced by `run.sh` and by the prepared GPU calls (`results/gpu-*/`).
const CUDA_ENV_SH: &str = include_str!("bundle_cuda_env.sh");

/// Libraries every Linux machine has (the C library and the loader), left
/// out: a copy from another glibc would not load beside the machine's own.
const SYSTEM: &[&str] = &[
    "linux-vdso.so",
    "ld-linux-x86-64.so",
    "libc.so",
    "libm.so",
    "libdl.so",
    "libpthread.so",
    "librt.so",
    "libutil.so",
    "libgcc_s.so",
];

/// Loaded with `dlopen` at run time, so `ldd` does not list it: wgpu's
/// Vulkan loader (the driver's ICD comes with the GPU's driver).
const OPENED_AT_RUN_TIME: &[&str] = &["libvulkan.so.1"];

/// Refuses an `--out` that exists and is not an earlier bundle (one with
/// its `run.sh` and `bin/terse`), which replacing would delete: `--out .`
/// would have removed the checkout.
fn replaceable(out: &Path) -> Result<()> {
    let earlier_bundle = out.join("run.sh").is_file() && out.join("bin/terse").is_file();
    if out.exists() && !earlier_bundle {
        bail!(
            "--out {}: exists and is not an earlier bundle (no run.sh and bin/terse), so it is \
             not replaced; name a new directory",
            out.display()
        );
    }
    Ok(())
}

/// Builds the binaries and writes the bundle.
pub fn run(args: &Args) -> Result<()> {
    let terse = terse_binary::build()?;
    let comm_check = terse_binary::binary("terse-comm-check")?;
    let exchange_check = terse_binary::binary("terse-gpu-exchange-check")?;
    let model_step = terse_binary::build_bench("model_step")?;
    let matmul_routines = terse_binary::build_bench("matmul_routines")?;
    let out = &args.out;
    replaceable(out)?;
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("cannot replace {}", out.display()))?;
    }
    let bin = out.join("bin");
    let lib = out.join("lib");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(&lib)?;
    for (from, name) in [
        (&terse, "terse"),
        (&comm_check, "terse-comm-check"),
        (&exchange_check, "terse-gpu-exchange-check"),
        (&model_step, "model_step"),
        (&matmul_routines, "matmul_routines"),
    ] {
        let to = bin.join(name);
        fs::copy(from, &to).with_context(|| format!("cannot copy {}", from.display()))?;
        let stripped = Command::new("strip").arg(&to).status();
        if !stripped.is_ok_and(|s| s.success()) {
            bail!("strip {} failed (binutils)", to.display());
        }
    }
    let mut libraries = Vec::new();
    for binary in [
        &terse,
        &comm_check,
        &exchange_check,
        &model_step,
        &matmul_routines,
    ] {
        for library in needed_libraries(binary)? {
            if !libraries.contains(&library) {
                libraries.push(library);
            }
        }
    }
    for name in OPENED_AT_RUN_TIME {
        if let Some(path) = find_library(name) {
            libraries.push(path);
        }
    }
    for library in &libraries {
        let name = library.file_name().context("a library path")?;
        fs::copy(library, lib.join(name))
            .with_context(|| format!("cannot copy {}", library.display()))?;
    }
    let scripts = out.join("benches");
    fs::create_dir_all(&scripts)?;
    for script in ["pytorch_bert_step.py", "pytorch_matmul_shapes.py"] {
        fs::copy(format!("benches/{script}"), scripts.join(script))?;
    }
    // Copied out of this machine's cache (fetched first if missing) by
    // `terse-data copy`, which verifies every file against its manifest.
    let cache = out.join("cache");
    terse_binary::run_binary(
        "terse-data",
        &[
            "copy".into(),
            "--to".into(),
            cache.display().to_string(),
            "sotu".into(),
            "minilm:tokenizer.json".into(),
        ],
    )?;
    let run_sh = out.join("run.sh");
    fs::write(&run_sh, RUN_SH)?;
    make_executable(&run_sh)?;
    fs::write(out.join("cuda_env.sh"), CUDA_ENV_SH)?;
    let tarball = out.with_extension("tar.xz");
    let parent = out.parent().unwrap_or(Path::new("."));
    let name = out.file_name().context("a bundle directory name")?;
    // The small archive's xz runs minutes on one core without a word.
    println!(
        "bundle: packing {} ({})",
        tarball.display(),
        match args.archive {
            Archive::Small => "--archive small: about 3.5 minutes of one core",
            Archive::Fast => "--archive fast: seconds",
        }
    );
    crate::finish::finish(
        Command::new("tar")
            .env("XZ_OPT", args.archive.xz_options())
            .arg("-C")
            .arg(parent)
            .arg("-cJf")
            // Opened before `-C` applies: a path from here, not from `parent`.
            .arg(&tarball)
            .arg(name),
        "tar",
    )?;
    println!(
        "bundle: {} ({} libraries), {} ({:.1} MB); on the GPU machine: tar xJf {} && {}/run.sh --help",
        out.display(),
        libraries.len(),
        tarball.display(),
        fs::metadata(&tarball).map_or(0.0, |m| m.len() as f64 / 1e6),
        tarball.file_name().unwrap_or_default().to_string_lossy(),
        name.to_string_lossy(),
    );
    Ok(())
}

/// The libraries `binary` loads that are not the C library's, as `ldd`
/// resolves them here.
fn needed_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot start ldd")?;
    if !output.status.success() {
        bail!("ldd {} failed", binary.display());
    }
    let listing = String::from_utf8_lossy(&output.stdout);
    let mut found = Vec::new();
    for line in listing.lines() {
        match parse_ldd_line(line) {
            LddLine::Found(name, path) if !is_system(name) => found.push(PathBuf::from(path)),
            LddLine::Missing(name) => {
                bail!("{} needs {name}, which is not found", binary.display())
            }
            _ => {}
        }
    }
    Ok(found)
}

/// One line of `ldd`'s listing.
#[derive(Debug, PartialEq, Eq)]
enum LddLine<'a> {
    /// `name => path (address)`.
    Found(&'a str, &'a str),
    /// `name => not found`.
    Missing(&'a str),
    /// The vDSO or the loader (no `=>`), or anything else.
    Other,
}

fn parse_ldd_line(line: &str) -> LddLine<'_> {
    let Some((name, rest)) = line.trim().split_once(" => ") else {
        return LddLine::Other;
    };
    let rest = rest.trim();
    if rest.starts_with("not found") {
        return LddLine::Missing(name);
    }
    match rest.split_whitespace().next() {
        Some(path) if path.starts_with('/') => LddLine::Found(name, path),
        _ => LddLine::Other,
    }
}

fn is_system(name: &str) -> bool {
    SYSTEM.iter().any(|s| name.starts_with(s))
}

/// Where the dynamic linker's cache has `name`, if anywhere.
fn find_library(name: &str) -> Option<PathBuf> {
    let output = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with(name) && l.contains("x86-64"))
        .find_map(|l| l.split(" => ").nth(1).map(|p| PathBuf::from(p.trim())))
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut permissions = fs::metadata(path)?.permissions();
    permissions.set_mode(0o755);
    fs::set_permissions(path, permissions)?;
    Ok(())
}

/// `run.sh`'s tests, with stub binaries (this file's limit).
#[cfg(test)]
#[path = "bundle_run_tests.rs"]
mod run_script_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_earlier_bundle_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        replaceable(&dir.path().join("new")).unwrap();
        let error = replaceable(dir.path()).unwrap_err().to_string();
        assert!(error.contains("is not an earlier bundle"), "{error}");
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/terse"), "").unwrap();
        std::fs::write(dir.path().join("run.sh"), "").unwrap();
        replaceable(dir.path()).unwrap();
    }

    #[test]
    fn ldd_lines_are_read_and_the_c_library_left_out() {
        assert_eq!(
            parse_ldd_line("\tlibmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x00007f)"),
            LddLine::Found("libmpi.so.40", "/lib/x86_64-linux-gnu/libmpi.so.40")
        );
        assert_eq!(
            parse_ldd_line("\tlibfoo.so.1 => not found"),
            LddLine::Missing("libfoo.so.1")
        );
        assert_eq!(
            parse_ldd_line("\tlinux-vdso.so.1 (0x00007ffd)"),
            LddLine::Other
        );
        assert_eq!(
            parse_ldd_line("\t/lib64/ld-linux-x86-64.so.2 (0x00007f)"),
            LddLine::Other
        );
        assert!(is_system("libc.so.6") && is_system("libm.so.6"));
        assert!(!is_system("libmpi.so.40") && !is_system("libhwloc.so.15"));
    }

    /// The headers NVRTC may be asked for: the four every run may include,
    /// then the cooperative groups and CCCL's barrier that a TMA matmul
    /// routine's kernels include (`terse_kernels::device::BARRIER_HEADERS`).
    const HEADERS: [&str; 7] = [
        "cuda_fp16.h",
        "cuda_bf16.h",
        "mma.h",
        "crt/mma.h",
        "cooperative_groups/memcpy_async.h",
        "cooperative_groups.h",
        "cuda/barrier",
    ];

    /// `cuda_env.sh` sourced by bash with PyTorch's wheels as `files`
    /// (paths under site-packages/nvidia, each an empty file) and a
    /// `CUDA_PATH` without headers: what it prints, and those of
    /// [`HEADERS`] that cubecl then finds in `$CUDA_PATH/include` (or, as
    /// cubecl also looks, its `cccl/`).
    fn cuda_env_with_wheels(files: &[&str]) -> (String, Vec<&'static str>) {
        let scratch = tempfile::tempdir().unwrap();
        let nvidia = scratch.path().join("site-packages/nvidia");
        for file in files {
            let path = nvidia.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        // The interpreter the script asks where the wheels are.
        let python = scratch.path().join("python");
        std::fs::write(&python, format!("#!/bin/sh\necho {}\n", nvidia.display())).unwrap();
        make_executable(&python).unwrap();
        let script = scratch.path().join("cuda_env.sh");
        std::fs::write(&script, CUDA_ENV_SH).unwrap();
        let no_headers = scratch.path().join("cuda");
        std::fs::create_dir_all(no_headers.join("include")).unwrap();
        let output = std::process::Command::new("bash")
            .arg("-c")
            .arg("set -euo pipefail; source \"$1\"; echo \"CUDA_PATH=$CUDA_PATH\"")
            .arg("bash")
            .arg(&script)
            .env("PYTHON", &python)
            .env("CUDA_PATH", &no_headers)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let root = stdout
            .lines()
            .last()
            .unwrap()
            .trim_start_matches("CUDA_PATH=")
            .to_string();
        let include = Path::new(&root).join("include");
        let held = HEADERS
            .into_iter()
            .filter(|header| {
                include.join(header).is_file() || include.join("cccl").join(header).is_file()
            })
            .collect();
        (stdout, held)
    }

    #[test]
    fn cuda_env_finds_the_headers_in_either_cuda_s_wheels() {
        let all = HEADERS.to_vec();
        // CUDA 13: nvidia-cuda-runtime, nvidia-cuda-crt and
        // nvidia-cuda-cccl in one include/ (CCCL in its cccl/).
        let cu13 = [
            "cu13/include/cuda_fp16.h",
            "cu13/include/cuda_bf16.h",
            "cu13/include/mma.h",
            "cu13/include/cooperative_groups/memcpy_async.h",
            "cu13/include/cooperative_groups.h",
        ];
        let cu13_crt = "cu13/include/crt/mma.h";
        let cu13_cccl = "cu13/include/cccl/cuda/barrier";
        let (said, held) = cuda_env_with_wheels(&[&cu13[..], &[cu13_crt, cu13_cccl]].concat());
        assert_eq!(held, all, "{said}");
        assert!(said.contains("/nvidia/cu13 ("), "{said}");
        assert!(!said.contains("pip install"), "{said}");
        // CUDA 12: nvidia-cuda-runtime-cu12's, nvidia-cuda-nvcc-cu12's and
        // nvidia-cuda-cccl-cu12's directories, linked into one include/.
        let cu12 = [
            "cuda_runtime/include/cuda_fp16.h",
            "cuda_runtime/include/cuda_bf16.h",
            "cuda_runtime/include/mma.h",
            "cuda_runtime/include/cooperative_groups/memcpy_async.h",
            "cuda_runtime/include/cooperative_groups.h",
        ];
        let cu12_crt = "cuda_nvcc/include/crt/mma.h";
        let cu12_cccl = "cuda_cccl/include/cuda/barrier";
        let (said, held) = cuda_env_with_wheels(&[&cu12[..], &[cu12_crt, cu12_cccl]].concat());
        assert_eq!(held, all, "{said}");
        assert!(
            said.contains("/cuda_nvcc/include/crt, ") && said.contains("/cuda_cccl/include linked"),
            "{said}"
        );
        // CCCL alone beside the runtime (PyTorch's CUDA 12 wheels have no
        // nvcc): linked too, and crt/mma.h named as missing.
        let (said, held) = cuda_env_with_wheels(&[&cu12[..], &[cu12_cccl]].concat());
        let without_crt: Vec<&str> = all.iter().copied().filter(|h| *h != "crt/mma.h").collect();
        assert_eq!(held, without_crt, "{said}");
        assert!(said.contains("pip install nvidia-cuda-crt"), "{said}");
        // Neither crt/mma.h nor CCCL: the runtime's headers, and what to
        // install for each.
        let (said, held) = cuda_env_with_wheels(&cu13);
        assert_eq!(held, [&all[..3], &all[4..6]].concat(), "{said}");
        assert!(
            said.contains("pip install nvidia-cuda-crt")
                && said.contains("pip install nvidia-cuda-cccl (CUDA 13) or nvidia-cuda-cccl-cu12"),
            "{said}"
        );
    }
}
