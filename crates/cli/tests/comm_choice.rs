//! `--comm`: the communicator named on the command line, through the real
//! binary (and `mpirun`): `mpi` runs one process as an MPI world of one,
//! `local` under mpirun is refused, and `nccl` on a machine without the
//! NVIDIA driver or NCCL stops, with one error line saying why.

mod common;

use common::text;

use std::path::Path;
use std::process::{Command, Output};

fn pretrain(command: &mut Command, run_dir: &Path, comm: &str) -> Output {
    command
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args([
            "--comm",
            comm,
            "--set",
            "train.steps=2",
            "--set",
            "train.eval_every=0",
        ])
        .arg("--run-dir")
        .arg(run_dir)
        .current_dir(common::workspace())
        .output()
        .expect("starts")
}

#[test]
fn the_named_communicator_runs_or_is_refused_with_the_reason() {
    let scratch = tempfile::Builder::new()
        .prefix("terse-comm-")
        .tempdir()
        .unwrap();
    let terse = || Command::new(env!("CARGO_BIN_EXE_terse"));

    let output = pretrain(&mut terse(), &scratch.path().join("mpi"), "mpi");
    let message = text(&output);
    assert!(output.status.success(), "{message}");
    assert!(message.contains("1 rank(s) (mpi)"), "{message}");

    let mut mpirun = Command::new("mpirun");
    mpirun
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_terse"));
    let output = pretrain(&mut mpirun, &scratch.path().join("local"), "local");
    let message = text(&output);
    assert!(!output.status.success(), "{message}");
    assert!(
        message.contains("--comm local: this process was started by mpirun"),
        "{message}"
    );

    // NCCL is in every build; on a machine without the driver or libnccl
    // (this one) it stops in one line naming what is missing.
    if let Some(missing) = terse_comm::nccl_missing_libraries() {
        let output = pretrain(&mut terse(), &scratch.path().join("nccl"), "nccl");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(&missing), "{stderr}");
        assert!(
            missing.contains("libcuda.so") || missing.contains("libnccl.so.2"),
            "{missing}"
        );
    }
}
