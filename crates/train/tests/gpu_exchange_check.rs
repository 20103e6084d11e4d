//! `terse-gpu-exchange-check` as a GPU machine runs it, where none is: on
//! lavapipe with `local` every case runs (the fp32 mean, the compressed
//! allreduce made to compress in a world of one) and passes, through the
//! host; `--comm nccl` without the driver or libnccl, and `--device cpu`,
//! stop in one line saying why. Whether NCCL's GPU path gives the same bits
//! is for a GPU (`run.sh --nccl-check` in the bundle).

use std::process::Command;

fn check(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_terse-gpu-exchange-check"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("the check starts");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_case_runs_and_passes_on_lavapipe_through_the_host() {
    let (ok, stdout, stderr) = check(&["--device", "lavapipe", "--comm", "local"]);
    assert!(ok, "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 7, "{stdout}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("compressed allreduce"))
            .count(),
        4,
        "{stdout}"
    );
    for line in lines {
        assert!(
            line.starts_with("ok ") && line.contains("through the host"),
            "{line}"
        );
    }
}

#[test]
fn what_cannot_run_here_is_said_in_one_line() {
    let (ok, _, stderr) = check(&["--device", "cpu"]);
    assert!(!ok);
    assert!(
        stderr.contains("--device cpu has no GPU buffers"),
        "{stderr}"
    );
    if let Some(missing) = terse_comm::nccl_missing_libraries() {
        let (ok, stdout, stderr) = check(&["--device", "lavapipe"]);
        assert!(!ok, "{stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&missing), "{stderr}");
    }
}
