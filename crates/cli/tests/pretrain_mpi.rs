//! End-to-end: the real `terse` binary pre-training BERT-Tiny on the real
//! SOTU corpus with 1-bit LAMB, on 2 OpenMPI ranks (`mpirun`) through the
//! warmup (12 steps) into the compression stage.
//!
//! - the ranks end with bit-identical weights (one model file on disk, the
//!   second rank's a hard link of the first's, and one file of the
//!   moments; the error buffers each rank's own), the loss falls, compression
//!   sends far fewer bytes than the warmup, and 2 threads (`--ranks 2`) give
//!   the same weights as 2 processes;
//! - `kill -9` of the whole job after a checkpoint in the compression stage,
//!   then `--resume`, ends bit-identical to the uninterrupted run;
//! - a checkpoint with a damaged file, or resumed under another optimizer, is
//!   refused with a message naming the file or the field;
//! - SIGTERM stops a run with a checkpoint of the step it reached, and the
//!   resume again ends bit-identical;
//! - ranks with a data cache each (a disk of each node) each make the
//!   examples in their own.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{checkpoint, step_lines, text, workspace};

const CONFIG: &str = "configs/pretrain-bert-tiny.toml";
const STEPS: u64 = 30;
const FREEZE: u64 = 12;

fn terse(ranks: usize, run_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .args(["-x", "RAYON_NUM_THREADS=1", env!("CARGO_BIN_EXE_terse")])
        .args(["pretrain", "--no-progress", "--config", CONFIG, "--run-dir"])
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace());
    command
}

fn succeed(command: &mut Command) -> String {
    let output = command
        .output()
        .expect("mpirun starts (apt-get install openmpi-bin)");
    let text = text(&output);
    assert!(output.status.success(), "{text}");
    text
}

/// `terse pretrain` on 2 ranks as threads of one process, with one rayon
/// thread as each MPI rank has: flex's kernels may split reductions by
/// thread count, and the comparison is of backends, not thread counts.
fn threads(run_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse"));
    command
        .env("RAYON_NUM_THREADS", "1")
        .args([
            "pretrain",
            "--no-progress",
            "--config",
            CONFIG,
            "--local-ranks",
            "2",
        ])
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .current_dir(workspace());
    command
}

/// A scratch directory, removed when dropped, and the run directory inside
/// it: the caller keeps the directory until the runs inside it have ended.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    (scratch, run)
}

/// Every tensor of a saved module (BERT-Tiny has more than 20).
fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let all = common::tensors(path);
    assert!(all.len() > 20, "{}: {} tensors", path.display(), all.len());
    all
}

fn final_weights(run_dir: &Path, rank: usize) -> Vec<(String, Vec<u8>)> {
    tensors(&checkpoint(run_dir, STEPS).join(format!("model-rank-{rank}.safetensors")))
}

/// The per-step losses of a run's `metrics.jsonl`.
fn losses(run_dir: &Path) -> Vec<f64> {
    step_lines(run_dir)
        .iter()
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// The run's terse.log holds levelled lines of both ranks: rank 0's
/// announcements at info, every rank's steps at debug.
fn every_rank_logged(run_dir: &Path) {
    let log = std::fs::read_to_string(run_dir.join("terse.log")).unwrap();
    assert!(log.contains(" INFO  rank 0: 2 rank(s) ("), "{log}");
    for rank in 0..2 {
        for t in [1, STEPS] {
            let line = format!(" DEBUG rank {rank}: step {t}: local loss ");
            assert!(log.contains(&line), "no `{line}` in\n{log}");
        }
    }
}

/// A run that `command` starts and that fails: its output.
fn refused(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let message = text(&output);
    assert!(!output.status.success(), "{message}");
    message
}

/// Step 1: The uninterrupted run into `whole`: warmup then compression, the
/// loss falls, compression sends far fewer bytes, the ranks agree. Rank
/// 0's final weights.
fn uninterrupted(whole: &Path) -> Vec<(String, Vec<u8>)> {
    succeed(&mut terse(2, whole, &[]));
    let log = step_lines(whole);
    assert_eq!(log.len() as u64, STEPS);
    for v in &log {
        let t = v["step"].as_u64().unwrap();
        let want = if t <= FREEZE { "warmup" } else { "compression" };
        assert_eq!(v["stage"], want, "step {t}");
    }
    let loss = |range: std::ops::Range<usize>| {
        log[range.clone()]
            .iter()
            .map(|v| v["loss"].as_f64().unwrap())
            .sum::<f64>()
            / range.len() as f64
    };
    let (first, last) = (loss(0..5), loss(25..30));
    assert!(last < first - 0.5, "loss {first:.3} → {last:.3}");
    let bytes = |t: usize| log[t - 1]["bytes_sent"].as_u64().unwrap();
    assert!(
        bytes(5) > 10 * bytes(20),
        "warmup {} vs compression {} bytes",
        bytes(5),
        bytes(20)
    );
    let weights = final_weights(whole, 0);
    assert!(final_weights(whole, 1) == weights, "ranks disagree");
    // On one filesystem the ranks keep one copy of what they write alike:
    // rank 1's model file and its file of 1-bit LAMB's moments are rank
    // 0's under second names; the error buffers are each rank's own.
    let inode = |name: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(checkpoint(whole, STEPS).join(name))
            .unwrap()
            .ino()
    };
    assert_eq!(
        inode("model-rank-0.safetensors"),
        inode("model-rank-1.safetensors")
    );
    assert_eq!(
        inode("optimizer-rank-0.safetensors"),
        inode("optimizer-rank-1.safetensors")
    );
    assert_ne!(
        inode("optimizer-own-rank-0.safetensors"),
        inode("optimizer-own-rank-1.safetensors")
    );
    every_rank_logged(whole);
    weights
}

/// The same run as 2 threads of one process ends with the same weights.
fn threads_agree(weights: &[(String, Vec<u8>)]) {
    let (_scratch, threads_dir) = scratch();
    let output = threads(&threads_dir, &[]).output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        final_weights(&threads_dir, 1) == weights,
        "local backend differs"
    );
    every_rank_logged(&threads_dir);
}

/// Step 2: kill -9 of the whole job in `killed` once a compression-stage
/// checkpoint exists, then `--resume`: the same steps, losses and weights
/// as the uninterrupted run in `whole`.
fn killed_and_resumed(killed: &Path, whole: &Path, weights: &[(String, Vec<u8>)]) {
    let mut job = terse(2, killed, &[])
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let resume_from = FREEZE + 3;
    loop {
        let ready = (resume_from..STEPS).any(|s| checkpoint(killed, s).exists());
        if ready {
            break;
        }
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before it could be killed"
        );
        assert!(start.elapsed() < Duration::from_secs(600), "no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    let group = job.id() as i32;
    // SAFETY: kill(2) on the job's own process group.
    assert_eq!(unsafe { libc::kill(-group, libc::SIGKILL) }, 0);
    job.wait().unwrap();
    assert!(
        !checkpoint(killed, STEPS).exists(),
        "the job finished before the kill"
    );
    let resumed = succeed(&mut terse(2, killed, &["--resume"]));
    assert!(resumed.contains("resumed from"), "{resumed}");
    // The log holds each step once, as the uninterrupted run's does.
    let steps_logged: Vec<u64> = step_lines(killed)
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps_logged, (1..=STEPS).collect::<Vec<_>>());
    assert_eq!(losses(killed), losses(whole), "per-step losses differ");
    for rank in 0..2 {
        assert!(
            final_weights(killed, rank) == weights,
            "rank {rank}: resumed run differs from the uninterrupted one"
        );
    }
}

/// Step 3: Damage: one flipped byte in rank 1's own optimizer state (its
/// error buffers) of `whole`.
fn damage_is_refused(whole: &Path) {
    let damaged = checkpoint(whole, STEPS).join("optimizer-own-rank-1.safetensors");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&damaged, bytes).unwrap();
    let message = refused(&mut terse(2, whole, &["--resume", "--steps", "35"]));
    assert!(
        message.contains("optimizer-own-rank-1.safetensors") && message.contains("corrupted"),
        "{message}"
    );
}

/// Step 4: Another optimizer cannot continue the state in `killed`, nor
/// another world size (the error buffers are per rank).
fn another_optimizer_or_world_is_refused(killed: &Path) {
    let message = refused(&mut terse(
        2,
        killed,
        &["--resume", "--optimizer", "onebit_adam", "--steps", "35"],
    ));
    assert!(message.contains("optimizer.name"), "{message}");
    let message = refused(
        Command::new(env!("CARGO_BIN_EXE_terse"))
            .args([
                "pretrain",
                "--no-progress",
                "--config",
                CONFIG,
                "--resume",
                "--steps",
                "35",
            ])
            .arg("--run-dir")
            .arg(killed)
            .current_dir(workspace()),
    );
    assert!(
        message.contains("written by 2 rank(s), this run has 1"),
        "{message}"
    );
}

/// Step 5: SIGTERM: the run checkpoints the step it is at and stops; the
/// resume (here on the threads backend) still ends where the
/// uninterrupted run did.
fn sigterm_then_resume(weights: &[(String, Vec<u8>)]) {
    let (_scratch, stopped) = scratch();
    let mut job = threads(&stopped, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = stopped.join("metrics.jsonl");
    while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 17 {
        assert!(job.try_wait().unwrap().is_none(), "ended before the signal");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(job.id() as i32, libc::SIGTERM) }, 0);
    let output = job.wait_with_output().unwrap();
    let message = text(&output);
    // 128 + SIGTERM, the shell's convention for a run a signal ended.
    assert_eq!(output.status.code(), Some(143), "{message}");
    assert!(message.contains("stopped by a signal at step"), "{message}");
    assert!(
        !message.contains("error"),
        "a requested stop is no error:\n{message}"
    );
    let at: u64 = message
        .split("stopped by a signal at step ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!((17..STEPS).contains(&at), "{message}");
    assert!(
        checkpoint(&stopped, at).exists(),
        "no checkpoint at step {at}"
    );
    let output = threads(&stopped, &["--resume"]).output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        final_weights(&stopped, 0) == weights,
        "resume after SIGTERM differs"
    );
}

#[test]
fn two_mpi_ranks_train_agree_resume_after_kill_and_refuse_damage() {
    let (_whole_scratch, whole) = scratch();
    let weights = uninterrupted(&whole);
    threads_agree(&weights);
    let (_killed_scratch, killed) = scratch();
    killed_and_resumed(&killed, &whole, &weights);
    damage_is_refused(&whole);
    another_optimizer_or_world_is_refused(&killed);
    sigterm_then_resume(&weights);
}

/// Each rank with a data cache of its own, as ranks on nodes whose caches
/// are their own disks (the README's multi-node setup): the first rank on
/// each cache makes the pre-training examples there. Before, only rank 0
/// made them and rank 1 failed to open its cache's.
#[test]
fn ranks_with_a_data_cache_each_make_their_examples_there() {
    let (scratch, run) = scratch();
    let datasets = terse_data::fetch::cache_dir().join("datasets");
    for rank in 0..2 {
        let cache = scratch.path().join(format!("cache{rank}"));
        std::fs::create_dir_all(&cache).unwrap();
        std::os::unix::fs::symlink(&datasets, cache.join("datasets")).unwrap();
    }
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "RAYON_NUM_THREADS=1", "-x", "CACHES"])
        .env("CACHES", scratch.path())
        // The path travels as the environment, never as part of the script.
        .args([
            "sh",
            "-c",
            r#"TERSE_CACHE="$CACHES/cache$OMPI_COMM_WORLD_RANK" exec "$@""#,
        ])
        .args(["sh", env!("CARGO_BIN_EXE_terse")])
        .args(["pretrain", "--no-progress", "--config", CONFIG, "--run-dir"])
        .arg(&run)
        .args(["--set", "train.steps=2", "--set", "train.eval_every=0"])
        .current_dir(workspace());
    succeed(&mut command);
    for rank in 0..2 {
        let shards = scratch.path().join(format!("cache{rank}/shards"));
        let made: Vec<_> = std::fs::read_dir(&shards)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.path().join("pretrain.json").is_file())
            .collect();
        assert_eq!(made.len(), 1, "{}", shards.display());
    }
}
