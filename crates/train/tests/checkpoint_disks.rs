//! Checkpoints with each rank committing its own files, on 3 thread ranks
//! (the `local` communicator): each rank given its own run directory (a
//! disk of each node) or all one (a shared filesystem).
//!
//! - only rank 0 writes `trainer.json`, each rank only its own files, and
//!   each keeps its two newest steps;
//! - a resume agrees on the newest step every rank holds, and a rank's files
//!   of a newer step the run never committed are removed;
//! - a rank that cannot write or whose file is damaged fails every rank,
//!   the others naming it, and leaves the step uncommitted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use terse_comm::Communicator;
use terse_comm::LocalComm;
use terse_train::checkpoint::{self, RankFile, model_file, optimizer_file, record_file};
use terse_train::{RunConfig, TrainError};

const RANKS: usize = 3;

fn config() -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/pretrain-bert-tiny.toml");
    RunConfig::load(&path).unwrap()
}

/// Rank `r`'s bytes of step `step` (what its model file holds).
fn payload(rank: usize, step: u64) -> Vec<u8> {
    format!("rank {rank} at step {step}").into_bytes()
}

/// Writes step `step` on every rank, each its model file of [`payload`];
/// rank `failing` (if any) cannot.
fn write_step(
    dirs: &[PathBuf],
    config: &RunConfig,
    step: u64,
    failing: Option<usize>,
) -> Vec<Result<PathBuf, TrainError>> {
    write_files(dirs, config, step, |rank| {
        if failing == Some(rank) {
            return Err(TrainError::Batch("injected".into()));
        }
        Ok(vec![RankFile {
            name: model_file,
            bytes: payload(rank, step),
        }])
    })
}

/// Writes step `step` on every rank, each the files `files(rank)` gives.
fn write_files(
    dirs: &[PathBuf],
    config: &RunConfig,
    step: u64,
    files: impl Fn(usize) -> Result<Vec<RankFile>, TrainError> + Sync,
) -> Vec<Result<PathBuf, TrainError>> {
    LocalComm::run(RANKS, Duration::from_secs(30), |comm| {
        let rank = comm.rank();
        checkpoint::write(&dirs[rank], step, "warmup", None, config, comm, || {
            files(rank)
        })
    })
    .into_iter()
    .map(|r| r.expect("no rank panics"))
    .collect()
}

/// The step every rank agrees to resume from, and what each verified.
fn agree(dirs: &[PathBuf], config: &RunConfig) -> Vec<Result<Option<u64>, String>> {
    LocalComm::run(RANKS, Duration::from_secs(30), |comm| {
        let rank = comm.rank();
        let Some(dir) =
            checkpoint::agree_on_latest(&dirs[rank], comm).map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let record = checkpoint::verify_own(&dir, config, comm).map_err(|e| e.to_string())?;
        assert_eq!(
            std::fs::read(dir.join(model_file(rank))).unwrap(),
            payload(rank, record.meta.step)
        );
        Ok(Some(record.meta.step))
    })
    .into_iter()
    .map(|r| r.expect("no rank panics"))
    .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    checkpoint::checkpoints_dir(run_dir).join(format!("step-{step:08}"))
}

/// Each rank's run directory, as on a disk of its own node.
fn node_run_dirs(scratch: &Path) -> Vec<PathBuf> {
    (0..RANKS)
        .map(|r| scratch.join(format!("node{r}/run")))
        .collect()
}

#[test]
fn each_node_commits_its_own_files_and_a_resume_agrees_on_a_step_all_hold() {
    let scratch = tempfile::tempdir().unwrap();
    let dirs = node_run_dirs(scratch.path());
    let config = config();
    assert_eq!(agree(&dirs, &config), vec![Ok(None); RANKS], "a fresh run");
    for step in [4, 8, 12] {
        for (rank, result) in write_step(&dirs, &config, step, None)
            .into_iter()
            .enumerate()
        {
            assert_eq!(result.unwrap(), step_dir(&dirs[rank], step));
        }
    }
    // Each node holds only its own rank's files, rank 0's also the step's
    // commit, and the two newest steps only.
    for (rank, dir) in dirs.iter().enumerate() {
        assert_eq!(
            names(&checkpoint::checkpoints_dir(dir)),
            ["step-00000008", "step-00000012"],
            "node {rank}"
        );
        let mut want = vec![model_file(rank), record_file(rank)];
        if rank == 0 {
            want.push("trainer.json".into());
        }
        want.sort();
        assert_eq!(names(&step_dir(dir, 12)), want, "node {rank}");
    }
    assert_eq!(agree(&dirs, &config), vec![Ok(Some(12)); RANKS]);

    // Node 2 lost its commit of step 12 (its record): the ranks agree on
    // step 8, and node 1's files of step 12 go (the run never finished it
    // on every rank; it is written afresh when the run gets there).
    std::fs::remove_file(step_dir(&dirs[2], 12).join(record_file(2))).unwrap();
    assert_eq!(agree(&dirs, &config), vec![Ok(Some(8)); RANKS]);
    assert!(!step_dir(&dirs[1], 12).exists(), "node 1's step 12 stays");
    // Step 12 written again commits on every rank, and the stale record of
    // none is trusted meanwhile.
    for result in write_step(&dirs, &config, 12, None) {
        result.unwrap();
    }
    assert_eq!(agree(&dirs, &config), vec![Ok(Some(12)); RANKS]);

    // Rank 1 cannot serialise step 16, then cannot write it (a file where
    // its temporary directory goes): every rank fails, the others naming
    // it; nothing of step 16 is committed and the resume stays at step 12.
    let blocked = checkpoint::checkpoints_dir(&dirs[1]).join(".step-00000016.rank-1.tmp");
    for (failing, own_error, others_error) in [
        (
            Some(1),
            "injected",
            "could not serialise its checkpoint of step 16",
        ),
        (
            None,
            "Not a directory",
            "could not write its files of the checkpoint of step 16",
        ),
    ] {
        if failing.is_none() {
            std::fs::write(&blocked, "in the way").unwrap();
        }
        let results = write_step(&dirs, &config, 16, failing);
        let errors: Vec<String> = results
            .into_iter()
            .map(|r| r.unwrap_err().to_string())
            .collect();
        assert!(errors[1].contains(own_error), "{errors:?}");
        for rank in [0, 2] {
            assert!(
                errors[rank].contains(&format!("rank 1 failed: {others_error}")),
                "{errors:?}"
            );
        }
        assert!(!step_dir(&dirs[0], 16).join("trainer.json").exists());
        if failing.is_none() {
            std::fs::remove_file(&blocked).unwrap();
        }
        assert_eq!(agree(&dirs, &config), vec![Ok(Some(12)); RANKS]);
    }

    // A damaged file of rank 2: it names the file, the others name rank 2.
    std::fs::write(step_dir(&dirs[2], 12).join(model_file(2)), "damaged").unwrap();
    let outcome = agree(&dirs, &config);
    let message = outcome[2].as_ref().unwrap_err();
    assert!(
        message.contains("model-rank-2.safetensors") && message.contains("corrupted"),
        "{message}"
    );
    let message = outcome[0].as_ref().unwrap_err();
    assert!(
        message.contains("rank 2 failed: could not use its files"),
        "{message}"
    );

    // Rank 0 holds step 12 only, node 2 step 8 only: no step all hold.
    std::fs::remove_dir_all(step_dir(&dirs[0], 8)).unwrap();
    std::fs::remove_dir_all(step_dir(&dirs[2], 12)).unwrap();
    let outcome = agree(&dirs, &config);
    let message = outcome[1].as_ref().unwrap_err();
    assert!(
        message.contains("no committed step is held by every rank")
            && message.contains("rank 0 [12]")
            && message.contains("rank 2 [8]"),
        "{message}"
    );
}

#[test]
fn on_a_shared_directory_the_ranks_fill_one_step_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let dirs = vec![scratch.path().join("run"); RANKS];
    let config = config();
    for step in [4, 8, 12] {
        for result in write_step(&dirs, &config, step, None) {
            assert_eq!(result.unwrap(), step_dir(&dirs[0], step));
        }
    }
    assert_eq!(
        names(&checkpoint::checkpoints_dir(&dirs[0])),
        ["step-00000008", "step-00000012"],
        "step 4 pruned by all ranks, no temporaries left"
    );
    let mut want: Vec<String> = (0..RANKS)
        .flat_map(|r| [model_file(r), record_file(r)])
        .chain(["trainer.json".to_string()])
        .collect();
    want.sort();
    assert_eq!(names(&step_dir(&dirs[0], 12)), want);
    let meta = checkpoint::verify(&step_dir(&dirs[0], 12)).unwrap();
    assert_eq!((meta.step, meta.world_size), (12, RANKS));
    assert_eq!(agree(&dirs, &config), vec![Ok(Some(12)); RANKS]);
}

#[test]
fn a_fresh_run_clears_each_nodes_leftovers_and_keeps_its_own_steps() {
    let scratch = tempfile::tempdir().unwrap();
    let dirs = node_run_dirs(scratch.path());
    let config = config();
    // An earlier run's steps 25 and 30 on node 1, never seen by rank 0 (its
    // node was cleared with --overwrite, say).
    for step in [25, 30] {
        let old = step_dir(&dirs[1], step);
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join(record_file(1)), "{}").unwrap();
        std::fs::write(old.join(model_file(1)), "old").unwrap();
    }
    // Even without clearing, the steps a run writes are the ones each rank
    // keeps: a leftover newer step never takes a fresh step's place.
    for step in [4, 8, 12] {
        for result in write_step(&dirs, &config, step, None) {
            result.unwrap();
        }
    }
    assert!(step_dir(&dirs[1], 12).join(record_file(1)).exists());
    assert!(step_dir(&dirs[1], 8).join(record_file(1)).exists());
    assert_eq!(agree(&dirs, &config), vec![Ok(Some(12)); RANKS]);
    assert!(
        !step_dir(&dirs[1], 30).exists(),
        "the resume removes leftovers"
    );

    // A fresh run clears every rank's own files first.
    for (rank, dir) in dirs.iter().enumerate() {
        checkpoint::clear_own(dir, rank).unwrap();
        assert!(
            names(&checkpoint::checkpoints_dir(dir)).is_empty(),
            "node {rank}"
        );
    }
    assert_eq!(agree(&dirs, &config), vec![Ok(None); RANKS]);
}

#[test]
fn ranks_on_one_filesystem_keep_one_copy_of_the_files_they_write_alike() {
    use std::os::unix::fs::MetadataExt;
    let scratch = tempfile::tempdir().unwrap();
    // Ranks 0 and 1 share a filesystem, rank 2 has a disk of its own.
    let shared = scratch.path().join("shared/run");
    let dirs = vec![shared.clone(), shared, scratch.path().join("node2/run")];
    let config = config();
    // The model alike on every rank; the optimizer file alike on ranks 0
    // and 2 only (rank 1's error buffers, say, differ).
    let model = |step: u64| format!("model at step {step}").into_bytes();
    let optimizer = |rank: usize, step: u64| {
        let whose = if rank == 1 { 1 } else { 0 };
        format!("optimizer {whose} at step {step}").into_bytes()
    };
    for step in [4, 8, 12] {
        let results = write_files(&dirs, &config, step, |rank| {
            Ok(vec![
                RankFile {
                    name: model_file,
                    bytes: model(step),
                },
                RankFile {
                    name: optimizer_file,
                    bytes: optimizer(rank, step),
                },
            ])
        });
        for result in results {
            result.unwrap();
        }
    }
    let inode = |rank: usize, step: u64, name: fn(usize) -> String| {
        let path = step_dir(&dirs[rank], step).join(name(rank));
        assert_eq!(
            std::fs::read(&path).unwrap(),
            if name(0) == model_file(0) {
                model(step)
            } else {
                optimizer(rank, step)
            },
            "{}",
            path.display()
        );
        let meta = std::fs::metadata(&path).unwrap();
        (meta.ino(), meta.nlink())
    };
    for step in [8, 12] {
        // Rank 1's model file is rank 0's, one file with two names; its
        // optimizer file is its own.
        assert_eq!(inode(1, step, model_file), inode(0, step, model_file));
        assert_eq!(inode(0, step, model_file).1, 2, "step {step}");
        assert_ne!(
            inode(1, step, optimizer_file),
            inode(0, step, optimizer_file)
        );
        assert_eq!(inode(1, step, optimizer_file).1, 1);
        // Rank 2 sees neither of the others' files: it wrote both.
        assert_eq!(inode(2, step, model_file).1, 1);
        assert_eq!(inode(2, step, optimizer_file).1, 1);
    }
    assert!(!step_dir(&dirs[0], 4).exists(), "step 4 pruned");
    assert_eq!(
        names(&checkpoint::checkpoints_dir(&dirs[0])),
        ["step-00000008", "step-00000012"],
        "no temporaries or markers left"
    );
    // Each rank's record lists its own name with the file's checksum: a
    // resume verifies every rank's files as before.
    let verified = LocalComm::run(RANKS, Duration::from_secs(30), |comm| {
        let dir = checkpoint::agree_on_latest(&dirs[comm.rank()], comm)
            .unwrap()
            .unwrap();
        checkpoint::verify_own(&dir, &config, comm)
            .map(|record| (record.meta.step, record.files.len()))
            .map_err(|e| e.to_string())
    });
    for result in verified {
        assert_eq!(result.unwrap(), Ok((12, 2)));
    }
}
