//! One copy on disk of what the ranks write alike: 2 `mpirun` ranks
//! pre-training BERT-Tiny with AdamW, whose parameters and state are the
//! same bits on both ranks after every step, into one run directory.
//!
//! - each checkpoint holds one model file and one optimizer file, rank 1's
//!   names hard links of rank 0's (the files' headers are written in one
//!   key order: before, the writers' hash-map order made two processes'
//!   files of the same state differ);
//! - the step directory then takes half the room two copies took, and each
//!   rank's log line says what it wrote and what it linked;
//! - `--resume` from the older checkpoint, each rank loading its own name
//!   of the one file, ends bit-identical to the uninterrupted run.
//!
//! That ranks whose files differ still write their own is checked by
//! `pretrain_mpi.rs` (1-bit LAMB's error buffers), and a disk of each node
//! by `per_node_disks.rs`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::{checkpoint, succeeded, tensors, workspace};

fn job(run_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "RAYON_NUM_THREADS=1", env!("CARGO_BIN_EXE_terse")])
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--optimizer", "adam", "--steps", "4"])
        .args(["--set", "train.checkpoint_every=2"])
        .args(["--set", "train.eval_every=0", "--run-dir"])
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace());
    command
}

/// `(inode, links, bytes)` of a file.
fn file(path: &Path) -> (u64, u64, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.ino(), meta.nlink(), meta.len())
}

#[test]
fn adamw_ranks_on_one_filesystem_keep_one_copy_of_each_checkpoint_file() {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    succeeded(&mut job(&run, &[]));
    for step in [2, 4] {
        let dir = checkpoint(&run, step);
        for role in ["model", "optimizer"] {
            let rank0 = file(&dir.join(format!("{role}-rank-0.safetensors")));
            let rank1 = file(&dir.join(format!("{role}-rank-1.safetensors")));
            assert_eq!(rank0, rank1, "step {step}: {role}");
            assert_eq!(rank0.1, 2, "step {step}: {role} has two names");
        }
        // The room the step takes: its blocks, each file once.
        let output = Command::new("du")
            .args(["-s", "--block-size=1M"])
            .arg(&dir)
            .output()
            .unwrap();
        let mib: u64 = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let one_copy = (file(&dir.join("model-rank-0.safetensors")).2
            + file(&dir.join("optimizer-rank-0.safetensors")).2)
            >> 20;
        assert!(
            (one_copy..one_copy + 2).contains(&mib),
            "step {step}: {mib} MiB on disk, one copy is {one_copy} MiB"
        );
    }
    // Each rank logs what it wrote and what it linked: rank 1 wrote nothing.
    let log = std::fs::read_to_string(run.join("terse.log")).unwrap();
    for (rank, what) in [(0, "linked 0.0 MiB"), (1, "wrote 0.0 MiB")] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("DEBUG rank {rank}: checkpoint of step 4 in ")))
            .unwrap_or_else(|| panic!("no checkpoint line of rank {rank} in\n{log}"));
        assert!(line.contains(what), "{line}");
        assert!(line.contains("ranks 0–1 on this filesystem"), "{line}");
    }
    let last = tensors(&checkpoint(&run, 4).join("model-rank-1.safetensors"));

    // Without step 4, a resume continues from step 2: both ranks load the
    // one copy under their own names and end where the run ended.
    std::fs::remove_dir_all(checkpoint(&run, 4)).unwrap();
    succeeded(&mut job(&run, &["--resume"]));
    for rank in 0..2 {
        let path = checkpoint(&run, 4).join(format!("model-rank-{rank}.safetensors"));
        assert!(tensors(&path) == last, "rank {rank} resumed elsewhere");
    }
}
