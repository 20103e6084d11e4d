//! The same optimizer run on `mpi` (2 processes under `mpirun`) and on
//! `local` (2 threads) gives bit-identical parameters on every rank, for
//! every optimizer and the options that change what travels (scale kind and
//! blocks, 1-bit LAMB's ratio, SLAMB's cyclic mask and fp16 values).
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::Command;

/// The labels the check wrote parameters for, from rank 0's files in `dir`.
fn labels(dir: &Path) -> Vec<String> {
    let mut labels: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rank0.f32").map(str::to_string)
        })
        .collect();
    labels.sort();
    labels
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .expect("the check starts (mpirun: apt-get install openmpi-bin)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    text
}

fn params(dir: &Path, label: &str, rank: usize) -> Vec<u8> {
    let path = dir.join(format!("{label}.rank{rank}.f32"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn mpi_and_local_give_bit_identical_parameters() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    let (mpi, local) = (root.join("mpi"), root.join("local"));
    let exe = env!("CARGO_BIN_EXE_terse-optim-check");
    let text = run(Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            exe,
            "--out",
        ])
        .arg(&mpi));
    assert!(text.contains("2 ranks on mpi"), "{text}");
    let text = run(Command::new(exe)
        .args(["--backend", "local", "--local-ranks", "2", "--out"])
        .arg(&local));
    assert!(text.contains("2 ranks on local"), "{text}");
    // `terse-optim-check` runs every optimizer the registry lists (its
    // short run), then the options that change what travels.
    let labels = labels(&local);
    for name in terse_optim::OPTIMIZER_NAMES.lines() {
        assert!(
            labels.iter().any(|l| l == name),
            "{name}: not run, {labels:?}"
        );
    }
    assert_eq!(labels, self::labels(&mpi), "the same runs on mpi");
    for label in &labels {
        let want = params(&local, label, 0);
        assert_eq!(want.len(), 4 * (64 * 100 + 64 + 10 * 64 + 10), "{label}");
        for rank in 0..2 {
            assert!(
                params(&local, label, rank) == want,
                "{label}: local rank {rank}"
            );
            assert!(
                params(&mpi, label, rank) == want,
                "{label}: mpi rank {rank} differs from local"
            );
        }
    }
    // The runs did something: each optimizer ends somewhere else.
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            assert!(
                params(&local, a, 0) != params(&local, b, 0),
                "{a} and {b} coincide"
            );
        }
    }
}
