//! `run.sh` (`bundle_run.sh`) run by bash with stub binaries: its help,
//! the order of its rows, `--row-limit`, `--budget`, `--repeats`,
//! `--kernel-times`, and what it leaves in `--out` (7 files at most: a lent
//! GPU's call returns 8).

use std::path::Path;
use std::process::Command;

use super::{CUDA_ENV_SH, RUN_SH, make_executable};

#[test]
fn the_run_script_has_help_and_runs_both_frameworks() {
    assert!(RUN_SH.starts_with("#!/usr/bin/env bash"));
    for part in [
        "--help",
        "bin/model_step",
        "pytorch_bert_step.py",
        "--precision",
        "LD_LIBRARY_PATH",
        "bin/terse-comm-check --nccl",
        "bin/terse-gpu-exchange-check",
        "source \"$here/cuda_env.sh\"",
    ] {
        assert!(RUN_SH.contains(part), "run.sh lacks {part}");
    }
    for part in ["libnvrtc.so", "libcublas.so", "libnccl.so.2", "CUDA_PATH"] {
        assert!(CUDA_ENV_SH.contains(part), "cuda_env.sh lacks {part}");
    }
}

/// `run.sh --device cuda` with stub binaries: a `model_step` that hangs
/// in bf16 and a Python that has "torch" and prints a row for each
/// precision. Each terse row is followed by the PyTorch rows it is
/// compared with, the hung row is stopped at `--row-limit` and named,
/// and every PyTorch row still runs.
#[test]
fn the_run_script_pairs_the_rows_and_stops_one_past_its_limit() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = scratch.path();
    let write = |name: &str, text: &str| write_executable(bundle, name, text);
    // Both stubs print the row of the precision they are given.
    let row = r#"while [ $# -gt 0 ]; do [ "$1" = --precision ] && p=$2; shift; done
echo "{\"preset\": \"base\", \"batch\": 32, \"precision\": \"$p\", \"samples_per_s\": 1.0}""#;
    let python = with_torch(bundle, row);
    write(
        "bin/model_step",
        &format!(
            "#!/bin/sh\ncase \"$*\" in *--matmul-precision*) echo '{{}}'; exit 0 ;; \
                 *'--precision bf16'*) exec sleep 30 ;; esac\n\
                 [ -n \"${{STUB_MARK:-}}\" ] && {{ sleep 3; touch \"$STUB_MARK\"; }}\n{row}\n"
        ),
    );
    let out = bundle.join("out");
    let started = std::time::Instant::now();
    let output = run_cuda(bundle, &python, &["--batches", "32", "--row-limit", "2"]);
    let said = said(&output);
    assert!(started.elapsed().as_secs() < 20, "{said}");
    // The hung row failed the run, and nothing else did.
    assert_eq!(output.status.code(), Some(1), "{said}");
    let rows = rows(&said);
    assert_eq!(
        rows,
        [
            "terse on cuda, batch 32, fp32",
            "PyTorch on cuda, batch 32, fp32",
            "PyTorch on cuda, batch 32, tf32",
            "terse on cuda, batch 32, bf16",
            "PyTorch on cuda, batch 32, bf16",
        ],
        "{said}"
    );
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let detail = |name: &str| std::fs::read_to_string(bundle.join("details").join(name));
    assert_eq!(
        detail("timed-out.txt").unwrap(),
        "terse batch 32 bf16: stopped after 2 s (--row-limit)\n"
    );
    assert_eq!(read("terse.jsonl").lines().count(), 1, "{said}");
    let torch = read("pytorch.jsonl");
    for precision in ["fp32", "tf32", "bf16"] {
        assert!(torch.contains(&format!("\"{precision}\"")), "{torch}");
    }
    // PyTorch's fp16 row only beside terse's own fp16.
    assert!(!torch.contains("fp16"), "{torch}");
    // Everything printed is in log.txt, the rest archived.
    assert!(read("log.txt").contains("stopped after 2 s"), "{said}");
    assert!(out.join("details.tar.xz").exists());
    // A limit that is not whole seconds is refused before any row.
    let refused = Command::new("bash")
        .arg(bundle.join("run.sh"))
        .args(["--row-limit", "1.5"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--row-limit takes a whole number"));
    // A caller's own limit (the GPU call's `timeout` around run.sh)
    // stops the row running then too: the stub's fp32 row, 3 s long
    // (its mark written at the end), is cut at 1 s with run.sh, and
    // no mark appears after.
    let mark = bundle.join("row-ran-on");
    let cut = Command::new("timeout")
        .args(["-k", "1", "1", "bash"])
        .arg(bundle.join("run.sh"))
        .args(["--device", "cuda", "--batches", "32", "--row-limit", "20"])
        .arg("--python")
        .arg(&python)
        .arg("--out")
        .arg(bundle.join("cut"))
        .env("STUB_MARK", &mark)
        .output()
        .unwrap();
    assert_eq!(cut.status.code(), Some(124));
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(!mark.exists(), "the row went on after run.sh was stopped");
}

/// `run.sh` for CUDA in `bundle` with a stub Python that has "torch" (no
/// GPU of its own) and runs PyTorch's rows as the shell script `row`;
/// returns that Python.
fn with_torch(bundle: &Path, row: &str) -> std::path::PathBuf {
    write_executable(bundle, "run.sh", RUN_SH);
    write_executable(bundle, "cuda_env.sh", CUDA_ENV_SH);
    write_executable(bundle, "benches/pytorch_bert_step.py", "");
    write_executable(
        bundle,
        "python",
        &format!(
            "#!/bin/sh\ncase \"$1\" in -c) case \"$2\" in *nvidia*) exit 1 ;; esac; exit 0 ;; \
                 -) cat > /dev/null; exit 0 ;; esac\n{row}\n"
        ),
    );
    bundle.join("python")
}

/// `run.sh --device cuda ARGS --python PYTHON --out BUNDLE/out`.
fn run_cuda(bundle: &Path, python: &Path, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(bundle.join("run.sh"))
        .args(["--device", "cuda"])
        .args(args)
        .arg("--python")
        .arg(python)
        .arg("--out")
        .arg(bundle.join("out"))
        .arg("--details")
        .arg(bundle.join("details"))
        .output()
        .unwrap()
}

/// A `model_step` in `bundle` that answers the matmul-precision check
/// and runs each row as the shell script `row`.
fn stub_model_step(bundle: &Path, row: &str) {
    write_executable(
        bundle,
        "bin/model_step",
        &format!(
            "#!/bin/sh\ncase \"$*\" in *--matmul-precision*) echo '{{}}'; exit 0 ;; esac\n{row}\n"
        ),
    );
}

/// `text` as the executable `name` under `bundle`.
fn write_executable(bundle: &Path, name: &str, text: &str) {
    let path = bundle.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    make_executable(&path).unwrap();
}

/// `run.sh --device cuda` with a Python whose tf32 row fails: the run
/// fails and names the row, and PyTorch's other rows still run (the row's
/// own status, not that of the `tee` it is piped through).
#[test]
fn a_failed_pytorch_row_fails_the_run_and_the_others_still_run() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = scratch.path();
    let row = r#"while [ $# -gt 0 ]; do [ "$1" = --precision ] && p=$2; shift; done
[ "$p" = tf32 ] && { echo "CUDA out of memory" >&2; exit 3; }
echo "{\"preset\": \"base\", \"batch\": 8, \"precision\": \"$p\", \"samples_per_s\": 1.0}""#;
    let python = with_torch(bundle, row);
    stub_model_step(bundle, row);
    let out = bundle.join("out");
    let output = run_cuda(bundle, &python, &["--batches", "8", "--precisions", "fp32"]);
    let said = said(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(
        said.contains("PyTorch failed on cuda (batch 8, tf32)"),
        "{said}"
    );
    let torch = std::fs::read_to_string(out.join("pytorch.jsonl")).unwrap();
    for precision in ["fp32", "bf16"] {
        assert!(torch.contains(&format!("\"{precision}\"")), "{torch}");
    }
}

/// `run.sh --kernel-times` with a stub `model_step` (no PyTorch off
/// CUDA): every timed row first, then each (batch, precision) again
/// with `--kernel-times`, to files of its own.
#[test]
fn the_run_script_times_kernels_after_the_rows_and_apart() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = scratch.path();
    write_executable(bundle, "run.sh", RUN_SH);
    write_executable(
        bundle,
        "bin/model_step",
        r#"#!/bin/sh
case "$*" in *--matmul-precision*) echo '{}'; exit 0 ;; esac
timed=false
case "$*" in *--kernel-times*) timed=true; echo "   1.00 ms per step  1.0 launches  AdamKernel" >&2 ;; esac
while [ $# -gt 0 ]; do case $1 in --batch) b=$2 ;; --precision) p=$2 ;; esac; shift; done
echo "{\"batch\": $b, \"precision\": \"$p\", \"kernel_times\": $timed}"
"#,
    );
    let out = bundle.join("out");
    let output = Command::new("bash")
        .arg(bundle.join("run.sh"))
        .args([
            "--device",
            "lavapipe",
            "--batches",
            "8 32",
            "--kernel-times",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--details")
        .arg(bundle.join("details"))
        .output()
        .unwrap();
    let said = said(&output);
    assert!(output.status.success(), "{said}");
    let rows = rows(&said);
    assert_eq!(
        rows,
        [
            "terse on lavapipe, batch 8, fp32",
            "terse on lavapipe, batch 32, fp32",
            "terse kernel times on lavapipe, batch 8, fp32",
            "terse kernel times on lavapipe, batch 32, fp32",
        ],
        "{said}"
    );
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    assert!(!read("terse.jsonl").contains("true"), "{said}");
    let detail =
        |name: &str| std::fs::read_to_string(bundle.join("details").join(name)).unwrap_or_default();
    let timed = detail("terse-kernel-times.jsonl");
    assert_eq!(
        timed.matches("\"kernel_times\": true").count(),
        2,
        "{timed}"
    );
    assert!(detail("terse-kernel-times-b32-fp32.txt").contains("AdamKernel"));
    assert!(
        said.contains("ms per step  1.0 launches  AdamKernel"),
        "{said}"
    );
    // OUT holds what a lent GPU's call returns (8 files at most), the
    // per-row files archived.
    let mut kept: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            "details.tar.xz",
            "log.txt",
            "machine.txt",
            "matmul-precision.json",
            "summary.txt",
            "terse.jsonl"
        ],
        "{said}"
    );
    let listed = Command::new("tar")
        .arg("-tJf")
        .arg(out.join("details.tar.xz"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("terse-kernel-times-b32-fp32.txt"),
        "{listed}"
    );
}

/// `--repeats 2`: every row twice, in turns, and the summary's medians
/// count both; `--budget`: a row that would start past it is skipped and
/// named; an option without its value is refused.
#[test]
fn the_run_script_repeats_rows_and_keeps_to_its_budget() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = scratch.path();
    let row = r#"while [ $# -gt 0 ]; do case $1 in --batch) b=$2 ;; --precision) p=$2 ;; esac; shift; done
[ -n "${STUB_SLEEP:-}" ] && sleep "$STUB_SLEEP"
echo "{\"preset\": \"base\", \"batch\": $b, \"precision\": \"$p\", \"samples_per_s\": 2.0}""#;
    let python = with_torch(bundle, row);
    stub_model_step(bundle, row);
    let output = run_cuda(
        bundle,
        &python,
        &["--batches", "32", "--precisions", "fp32", "--repeats", "2"],
    );
    let said = said(&output);
    assert!(output.status.success(), "{said}");
    let once = [
        "terse on cuda, batch 32, fp32",
        "PyTorch on cuda, batch 32, fp32",
        "PyTorch on cuda, batch 32, tf32",
        "PyTorch on cuda, batch 32, bf16",
    ];
    assert_eq!(rows(&said), [once, once].concat(), "{said}");
    let summary = std::fs::read_to_string(bundle.join("out/summary.txt")).unwrap();
    assert!(summary.contains("base       32  fp32"), "{summary}");
    assert!(summary.contains("2.0 (2)"), "{summary}");

    // Each row takes 4 s against a budget of 3 s: the first starts (the
    // script's own start-up well inside the 3 s), the
    // rest are skipped and named.
    let budget = Command::new("bash")
        .arg(bundle.join("run.sh"))
        .args([
            "--device",
            "cuda",
            "--batches",
            "32",
            "--precisions",
            "fp32",
        ])
        .args(["--budget", "3", "--python"])
        .arg(&python)
        .arg("--out")
        .arg(bundle.join("budget"))
        .arg("--details")
        .arg(bundle.join("budget-details"))
        .env("STUB_SLEEP", "4")
        .output()
        .unwrap();
    let said = self::said(&budget);
    assert!(budget.status.success(), "{said}");
    assert_eq!(rows(&said), ["terse on cuda, batch 32, fp32"], "{said}");
    let skipped = std::fs::read_to_string(bundle.join("budget-details/skipped.txt")).unwrap();
    assert!(
        skipped.starts_with("PyTorch batch 32 fp32: skipped"),
        "{skipped}"
    );

    let refused = Command::new("bash")
        .arg(bundle.join("run.sh"))
        .arg("--row-limit")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--row-limit takes a value"));
}

/// What `run.sh` printed, stdout then stderr.
fn said(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
}

/// The rows `run.sh` announced (`== …` lines), in order.
fn rows(said: &str) -> Vec<&str> {
    said.lines()
        .filter_map(|line| line.strip_prefix("== "))
        .collect()
}
