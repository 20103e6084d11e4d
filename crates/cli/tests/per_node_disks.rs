//! Checkpoints on a disk of each node: 2 `mpirun` ranks pre-training
//! BERT-Tiny, each rank in its own mount namespace with its own directory
//! bind-mounted at the run directory's path — what two nodes with local
//! disks see. Needs root (mount); skipped, saying so, without it.
//!
//! - each node holds only its own rank's checkpoint files, rank 0's node
//!   the step's commit (`trainer.json`), and the ranks end with the same
//!   weights;
//! - `kill -9` of the job while a checkpoint is being written, then
//!   `--resume`: the ranks agree on the newest step both hold and end
//!   bit-identical to the uninterrupted run;
//! - a node that lost its newest commit: the resume continues from the step
//!   before, which both hold;
//! - with 2 ranks to a node (4 ranks), each node keeps one copy of what its
//!   ranks write alike (the model, 1-bit LAMB's moments: one file, two
//!   names), each rank its own error buffers, and no file is shared across
//!   nodes.

mod common;

use common::text;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 12;

/// `mpirun -np 2 terse pretrain …` with node `r`'s directory
/// (`nodes/node<r>`) mounted at `nodes/run` for rank `r`.
fn job(nodes: &Path, extra: &[&str]) -> Command {
    job_of(nodes, 2, 1, extra)
}

/// `mpirun -np <ranks> terse pretrain …`, `per_node` ranks to a node: rank
/// `r` sees node `r / per_node`'s directory at `nodes/run`.
fn job_of(nodes: &Path, ranks: usize, per_node: usize, extra: &[&str]) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .args(["-x", "RAYON_NUM_THREADS=1", "-x", "NODES", "-x", "PER_NODE"])
        .env("NODES", nodes)
        .env("PER_NODE", per_node.to_string())
        .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
        // The paths travel as the environment and arguments, never as
        // part of the script.
        .arg(
            r#"mount --bind "$NODES/node$((OMPI_COMM_WORLD_RANK / PER_NODE))" "$NODES/run" && exec "$@""#,
        )
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_terse"))
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", &format!("train.steps={STEPS}")])
        .args([
            "--set",
            "train.checkpoint_every=4",
            "--set",
            "train.eval_every=0",
        ])
        .arg("--run-dir")
        .arg(nodes.join("run"))
        .args(extra)
        .current_dir(common::workspace());
    command
}

/// Two empty node disks and the mount point.
fn nodes(scratch: &Path, name: &str) -> PathBuf {
    let nodes = scratch.join(name);
    for dir in ["node0", "node1", "run"] {
        std::fs::create_dir_all(nodes.join(dir)).unwrap();
    }
    nodes
}

/// What node `r` holds of `step`, by file name.
fn holds(nodes: &Path, node: usize, step: u64) -> Vec<String> {
    let dir = common::checkpoint(&nodes.join(format!("node{node}")), step);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|e| {
            e.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn weights(nodes: &Path, node: usize, step: u64) -> Vec<(String, Vec<u8>)> {
    common::tensors(
        &common::checkpoint(&nodes.join(format!("node{node}")), step)
            .join(format!("model-rank-{node}.safetensors")),
    )
}

/// The per-step losses rank 0's node logged.
fn losses(nodes: &Path) -> Vec<f64> {
    common::losses(&nodes.join("node0"))
}

/// Whether this process may mount (root, and mount(8) works here).
fn can_mount(scratch: &Path) -> bool {
    let probe = scratch.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "mount", "--bind"])
        .arg(&probe)
        .arg(&probe)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn each_node_keeps_its_own_checkpoints_and_a_resume_agrees_on_a_step_both_hold() {
    let scratch = tempfile::tempdir().unwrap();
    if !can_mount(scratch.path()) {
        println!("skipped: cannot bind-mount in a mount namespace here (not root, or no unshare)");
        return;
    }

    // 1. Uninterrupted.
    let whole = nodes(scratch.path(), "whole");
    let output = job(&whole, &[]).output().expect("mpirun starts");
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(
        holds(&whole, 0, STEPS),
        [
            "model-rank-0.safetensors",
            "optimizer-own-rank-0.safetensors",
            "optimizer-rank-0.safetensors",
            "rank-0.json",
            "trainer.json"
        ]
    );
    assert_eq!(
        holds(&whole, 1, STEPS),
        [
            "model-rank-1.safetensors",
            "optimizer-own-rank-1.safetensors",
            "optimizer-rank-1.safetensors",
            "rank-1.json"
        ],
        "node 1 holds its own files, committed by its own rank"
    );
    assert!(holds(&whole, 1, 4).is_empty(), "node 1 keeps two steps");
    let reference = weights(&whole, 0, STEPS);
    assert!(reference.len() > 20);
    assert!(weights(&whole, 1, STEPS) == reference, "the ranks disagree");

    // 2. kill -9 while a checkpoint is being written (a rank's temporary
    // directory exists), past the first one.
    let killed = nodes(scratch.path(), "killed");
    let mut running = job(&killed, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("mpirun starts");
    let writing = |nodes: &Path| -> Option<String> {
        (0..2).find_map(|node| {
            std::fs::read_dir(nodes.join(format!("node{node}/checkpoints")))
                .ok()?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.ends_with(".tmp") && !n.starts_with(".step-00000004"))
                .map(|n| format!("node{node}/checkpoints/{n}"))
        })
    };
    let start = Instant::now();
    let caught = loop {
        if let Some(tmp) = writing(&killed) {
            break tmp;
        }
        assert!(running.try_wait().unwrap().is_none(), "the job ended first");
        assert!(start.elapsed() < Duration::from_secs(300), "no checkpoint");
        std::thread::sleep(Duration::from_millis(1));
    };
    // SAFETY: kill(2) on the job's own process group.
    assert_eq!(
        unsafe { libc::kill(-(running.id() as i32), libc::SIGKILL) },
        0
    );
    running.wait().unwrap();
    let left = writing(&killed);
    println!(
        "killed while {caught} was written; after the kill: {}; node 0 committed {:?}, \
         node 1 {:?}",
        left.as_deref()
            .unwrap_or("no temporary left (the write had finished)"),
        [4, 8, 12].map(|s| holds(&killed, 0, s).contains(&"trainer.json".to_string())),
        [4, 8, 12].map(|s| holds(&killed, 1, s).contains(&"rank-1.json".to_string())),
    );
    let output = job(&killed, &["--resume"]).output().unwrap();
    let message = text(&output);
    assert!(output.status.success(), "{message}");
    assert!(message.contains("resumed from"), "{message}");
    assert!(
        weights(&killed, 0, STEPS) == reference,
        "rank 0 differs after the resume"
    );
    assert!(
        weights(&killed, 1, STEPS) == reference,
        "rank 1 differs after the resume"
    );
    assert_eq!(losses(&killed), losses(&whole), "per-step losses differ");

    // 3. Node 1 lost its commit of the newest step: the resume continues
    // from the step before, which both nodes hold.
    std::fs::remove_file(common::checkpoint(&whole.join("node1"), STEPS).join("rank-1.json"))
        .unwrap();
    let output = job(&whole, &["--resume", "--steps", "16"])
        .output()
        .unwrap();
    let message = text(&output);
    assert!(output.status.success(), "{message}");
    assert!(message.contains("step-00000008 (step 8"), "{message}");
    assert!(weights(&whole, 1, 16) == weights(&whole, 0, 16));
}

#[test]
fn two_ranks_to_a_node_keep_one_copy_on_each_node_of_what_they_write_alike() {
    use std::os::unix::fs::MetadataExt;
    let scratch = tempfile::tempdir().unwrap();
    if !can_mount(scratch.path()) {
        println!("skipped: cannot bind-mount in a mount namespace here (not root, or no unshare)");
        return;
    }
    let nodes = nodes(scratch.path(), "pairs");
    let output = job_of(&nodes, 4, 2, &["--set", "train.steps=4"])
        .output()
        .expect("mpirun starts");
    assert!(output.status.success(), "{}", text(&output));
    let file = |node: usize, name: String| {
        let meta = std::fs::metadata(
            common::checkpoint(&nodes.join(format!("node{node}")), 4).join(&name),
        )
        .unwrap_or_else(|e| panic!("node {node}: {name}: {e}"));
        (meta.dev(), meta.ino(), meta.nlink())
    };
    for node in 0..2 {
        let (a, b) = (2 * node, 2 * node + 1);
        let mut want: Vec<String> = [a, b]
            .iter()
            .flat_map(|r| {
                [
                    format!("model-rank-{r}.safetensors"),
                    format!("optimizer-own-rank-{r}.safetensors"),
                    format!("optimizer-rank-{r}.safetensors"),
                    format!("rank-{r}.json"),
                ]
            })
            .collect();
        if node == 0 {
            want.push("trainer.json".into());
        }
        want.sort();
        assert_eq!(holds(&nodes, node, 4), want, "node {node}");
        for role in ["model", "optimizer"] {
            let first = file(node, format!("{role}-rank-{a}.safetensors"));
            assert_eq!(first, file(node, format!("{role}-rank-{b}.safetensors")));
            assert_eq!(first.2, 2, "node {node}: {role} has its two ranks' names");
        }
        let own = |r: usize| file(node, format!("optimizer-own-rank-{r}.safetensors"));
        assert_ne!(
            own(a),
            own(b),
            "node {node}: the error buffers are each rank's"
        );
        assert_eq!(own(a).2, 1);
    }
    let model = |node: usize, rank: usize| {
        common::tensors(
            &common::checkpoint(&nodes.join(format!("node{node}")), 4)
                .join(format!("model-rank-{rank}.safetensors")),
        )
    };
    assert!(model(0, 0) == model(1, 3), "the nodes' ranks disagree");
}
