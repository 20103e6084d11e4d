//! The `mpi` backend in real `mpirun` jobs of 2, 3 and 4 processes: the
//! whole self-check (including the compressed and sparse allreduce bit for
//! bit against an in-process world), and failure: a rank killed with
//! SIGKILL or failing with an error ends every other rank, non-zero, with a
//! message, well within 60 s.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn mpirun(ranks: usize, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let output = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .arg(env!("CARGO_BIN_EXE_terse-comm-check"))
        .args(args)
        .output()
        .expect("mpirun runs (apt-get install openmpi-bin)");
    (output, start.elapsed())
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn every_collective_passes_the_self_check_under_mpirun() {
    for n in [2, 3, 4] {
        let (output, _) = mpirun(n, &[]);
        let text = text(&output);
        assert!(output.status.success(), "{n} ranks:\n{text}");
        assert!(
            text.contains(&format!("{n} ranks on mpi:")),
            "{n} ranks, no report from rank 0:\n{text}"
        );
    }
}

/// A 3-rank job with `args` that must fail within 60 s: its output.
fn fails_within_60_s(args: &[&str]) -> String {
    let (output, took) = mpirun(3, args);
    let text = text(&output);
    assert!(!output.status.success(), "{text}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    text
}

#[test]
fn a_killed_rank_ends_the_job_within_60_seconds() {
    let text = fails_within_60_s(&["--kill-rank", "1"]);
    assert!(text.contains("rank 1 kills itself"), "{text}");
    assert!(
        text.contains("signal 9"),
        "mpirun names the dead rank's signal:\n{text}"
    );
}

#[test]
fn a_failing_rank_aborts_the_job_with_its_reason() {
    let text = fails_within_60_s(&["--fail-rank", "2"]);
    assert!(
        text.contains("rank 2 failed: rank 2 fails on purpose"),
        "the reason reaches the log:\n{text}"
    );
}
