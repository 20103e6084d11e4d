//! `--comm`: the communicator named on the command line, through the real
//! binary (and `mpirun`): `mpi` runs one process as an MPI world of one,
//! `local` under mpirun is refused, and `nccl` on a machine without the
//! NVIDIA driver or NCCL stops, with one error line saying why (under
//! `auto`, which picks NCCL for CUDA runs of several processes, also how
//! to run without it).

mod common;

use common::text;

use std::path::Path;
use std::process::{Command, Output};

fn pretrain(command: &mut Command, run_dir: &Path, comm: &str, extra: &[&str]) -> Output {
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
        .args(extra)
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
    // Two processes of terse under mpirun.
    let mpirun = || {
        let mut mpirun = Command::new("mpirun");
        mpirun
            .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
            .arg(env!("CARGO_BIN_EXE_terse"));
        mpirun
    };

    let output = pretrain(&mut terse(), &scratch.path().join("mpi"), "mpi", &[]);
    let message = text(&output);
    assert!(output.status.success(), "{message}");
    assert!(message.contains("1 rank(s) (mpi)"), "{message}");

    let output = pretrain(&mut mpirun(), &scratch.path().join("local"), "local", &[]);
    let message = text(&output);
    assert!(!output.status.success(), "{message}");
    assert!(
        message.contains("--comm local: this process was started by mpirun"),
        "{message}"
    );

    // NCCL is in every build; on a machine without the driver or libnccl
    // (this one) it stops in one line naming what is missing.
    if let Some(missing) = terse_comm::nccl_missing_libraries() {
        let output = pretrain(&mut terse(), &scratch.path().join("nccl"), "nccl", &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(&missing), "{stderr}");
        assert!(
            missing.contains("libcuda.so") || missing.contains("libnccl.so"),
            "{missing}"
        );

        // `--comm auto` picks NCCL for several processes on CUDA; where
        // NCCL cannot start, each rank's one error line names what is
        // missing and the way without NCCL.
        let run_dir = scratch.path().join("auto-cuda");
        let output = pretrain(&mut mpirun(), &run_dir, "auto", &["--device", "cuda"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert!(!errors.is_empty(), "{stderr}");
        for line in errors {
            assert!(
                line.contains("--comm auto picks NCCL")
                    && line.contains(&missing)
                    && line.contains("`--comm mpi`"),
                "{line}"
            );
        }
    }
}
