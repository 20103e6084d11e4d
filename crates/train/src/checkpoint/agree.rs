//! Resuming: the checkpoint every rank continues from, agreed over the
//! communicator, so that it works whether the ranks see one run directory
//! or each its own disk's copy of it.

use std::path::{Path, PathBuf};

use terse_comm::Communicator;

use super::write::{remove_own, remove_own_temporaries};
use super::{
    META, RankRecord, bad, check_compatible, checkpoints_dir, held, list, read_meta, record_file,
    step_dir, step_dirs,
};
use crate::rank_exchange::{all_gather_bytes, all_succeeded};
use crate::{RunConfig, TrainError};

/// The newest step every rank holds: rank 0's committed steps (those with
/// `trainer.json`) and every other rank's own committed files, all-gathered.
/// `None` when rank 0 has committed none and sees no commit it cannot use
/// (a fresh run); an error naming what each rank holds when some
/// rank lacks every step rank 0 committed (a node's disk replaced, another
/// run directory), and an error too where a start from step 0 would hide
/// checkpoints (`refuse_fresh_start_over_checkpoints`).
///
/// Each rank first removes its own leftovers: temporaries of a write cut
/// short, and its files of steps newer than the agreed one (committed by
/// this rank, never by the run, so a later checkpoint of that step is
/// written afresh).
pub fn agree_on_latest(
    run_dir: &Path,
    comm: &dyn Communicator,
) -> Result<Option<PathBuf>, TrainError> {
    let rank = comm.rank();
    let own = remove_own_temporaries(run_dir, rank).and_then(|()| held(run_dir, rank));
    let listed = own.as_deref().unwrap_or_default();
    let lists = all_gather_steps(comm, listed)?;
    let own = all_succeeded(comm, own, || "could not list its checkpoints".into())?;
    let common = lists[0]
        .iter()
        .rev()
        .find(|step| lists.iter().all(|held| held.contains(step)));
    let Some(&step) = common else {
        if lists[0].is_empty() {
            refuse_fresh_start_over_checkpoints(run_dir, comm)?;
            return Ok(None);
        }
        return Err(bad(
            &checkpoints_dir(run_dir),
            format!(
                "no committed step is held by every rank (steps held: {}): a rank's disk \
                 lost its checkpoints, the ranks see different run directories, or fewer \
                 ranks wrote the run (a resume needs the same world size)",
                holdings(&lists)
            ),
        ));
    };
    remove_own_after(run_dir, rank, step, &own)?;
    Ok(Some(step_dir(run_dir, step)))
}

/// This rank's files of steps after `step` among those it holds (`own`):
/// committed by this rank, never by the run, so a later checkpoint of
/// that step is written afresh.
fn remove_own_after(run_dir: &Path, rank: usize, step: u64, own: &[u64]) -> Result<(), TrainError> {
    for (newer, dir) in step_dirs(run_dir)? {
        if newer > step && own.contains(&newer) {
            tracing::debug!(
                "rank {rank}: removing its files of step {newer}, which the run never committed"
            );
            remove_own(&dir, rank)?;
        }
    }
    Ok(())
}

/// Before continuing from a chosen checkpoint of step `step` (`--resume
/// PATH`): this rank's leftovers in `run_dir` removed as [`agree_on_latest`]
/// removes them (temporaries of a write cut short, its files of steps
/// after `step` that the run never committed), so that pruning later
/// counts only steps this continuation wrote.
pub fn remove_leftovers_after(run_dir: &Path, rank: usize, step: u64) -> Result<(), TrainError> {
    remove_own_temporaries(run_dir, rank)?;
    let own = held(run_dir, rank)?;
    remove_own_after(run_dir, rank, step, &own)
}

/// Where rank 0 holds no committed step, the resume would start from step
/// 0, truncate the metrics and prune the checkpoints: refused when rank 0
/// sees a `trainer.json` it does not hold (no `rank-0.json` beside it: a
/// checkpoint of format version 1, or one damaged), with [`read_meta`]'s
/// error for the newest (naming the version) or one naming that
/// directory. Other ranks' own files of a step rank 0 never committed (a
/// kill during the first checkpoint) are no reason to refuse: there is
/// nothing to resume.
fn refuse_fresh_start_over_checkpoints(
    run_dir: &Path,
    comm: &dyn Communicator,
) -> Result<(), TrainError> {
    let unheld = if comm.rank() == 0 {
        no_unheld_commit(run_dir)
    } else {
        Ok(())
    };
    all_succeeded(comm, unheld, || {
        format!(
            "found a checkpoint in {} it cannot resume from",
            checkpoints_dir(run_dir).display()
        )
    })
}

/// Rank 0's view: `Ok` unless the newest step directory with a
/// `trainer.json` lacks its `rank-0.json` ([`held`] skips such steps).
fn no_unheld_commit(run_dir: &Path) -> Result<(), TrainError> {
    let Some((_, dir)) = list(run_dir)?.pop() else {
        return Ok(());
    };
    read_meta(&dir)?;
    Err(bad(
        &dir,
        format!(
            "holds {META} but no {} (rank 0's record of its files): an incomplete \
             checkpoint or one of an older format, which this terse cannot resume; refusing \
             to start from step 0 over it (move it aside, or start afresh with --overwrite)",
            record_file(0)
        ),
    ))
}

/// What each rank holds, for an error.
fn holdings(lists: &[Vec<u64>]) -> String {
    lists
        .iter()
        .enumerate()
        .map(|(r, steps)| format!("rank {r} {steps:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks this rank's files of checkpoint `dir` against their checksums and
/// that they can continue the run of `config`; every rank learns whether
/// every other rank's did.
pub fn verify_own(
    dir: &Path,
    config: &RunConfig,
    comm: &dyn Communicator,
) -> Result<RankRecord, TrainError> {
    let rank = comm.rank();
    let own = super::verify_rank(dir, rank).and_then(|record| {
        // Rank 0 wrote the step's commit; the others may not see it (a
        // disk of each node), their own records carry the same stamp.
        if rank == 0 {
            let meta = super::read_meta(dir)?;
            check_compatible(dir, &meta, config, comm.world_size())?;
        }
        check_compatible(dir, &record.meta, config, comm.world_size())?;
        if record.meta.step != named_step(dir, &record) {
            return Err(bad(dir, "a rank's record of another step"));
        }
        Ok(record)
    });
    all_succeeded(comm, own, || {
        format!("could not use its files of checkpoint {}", dir.display())
    })
}

/// The step a step directory's name says.
fn named_step(dir: &Path, record: &RankRecord) -> u64 {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(record.meta.step)
}

/// Every rank's list of steps (ascending), all-gathered.
fn all_gather_steps(comm: &dyn Communicator, own: &[u64]) -> Result<Vec<Vec<u64>>, TrainError> {
    let bytes: Vec<u8> = own.iter().flat_map(|step| step.to_le_bytes()).collect();
    Ok(all_gather_bytes(comm, &bytes)?
        .iter()
        .map(|list| {
            list.chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::Duration;
    use terse_comm::LocalComm;

    /// Every rank's outcome of [`agree_on_latest`] on one shared run
    /// directory, errors as text.
    fn agreed(run_dir: &Path, ranks: usize) -> Vec<Result<Option<PathBuf>, String>> {
        LocalComm::run(ranks, Duration::from_secs(10), |comm| {
            agree_on_latest(run_dir, comm).map_err(|e| e.to_string())
        })
        .into_iter()
        .map(Result::unwrap)
        .collect()
    }

    #[test]
    fn a_run_directory_without_checkpoints_starts_from_step_0() {
        let run = tempfile::tempdir().unwrap();
        assert_eq!(agreed(run.path(), 2), [Ok(None), Ok(None)]);
        fs::create_dir_all(checkpoints_dir(run.path())).unwrap();
        assert_eq!(agreed(run.path(), 2), [Ok(None), Ok(None)]);
    }

    #[test]
    fn a_version_1_checkpoint_is_refused_not_restarted_over() {
        let run = tempfile::tempdir().unwrap();
        let dir = step_dir(run.path(), 20);
        fs::create_dir_all(&dir).unwrap();
        // Version 1: every rank's checksums in trainer.json, no rank-R.json.
        fs::write(
            dir.join(META),
            r#"{"format": "terse-checkpoint", "version": 1, "step": 20, "files": {}}"#,
        )
        .unwrap();
        fs::write(dir.join("model-rank-0.safetensors"), b"weights").unwrap();
        let outcomes = agreed(run.path(), 2);
        let lead = outcomes[0].as_ref().unwrap_err();
        assert!(
            lead.contains(&dir.join(META).display().to_string()) && lead.contains("version 1"),
            "{lead}"
        );
        let other = outcomes[1].as_ref().unwrap_err();
        assert!(
            other.starts_with("rank 0 failed: found a checkpoint in"),
            "{other}"
        );
        assert!(dir.join(META).exists(), "the checkpoint was left as it was");
    }

    #[test]
    fn a_current_trainer_json_without_rank_0_s_record_names_its_directory() {
        let run = tempfile::tempdir().unwrap();
        let dir = step_dir(run.path(), 8);
        fs::create_dir_all(&dir).unwrap();
        let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let config = RunConfig::load(&configs.join("train-mlp-fashion-mnist.toml")).unwrap();
        let meta = crate::checkpoint::CheckpointMeta::new(8, "warmup", None, 1, &config);
        fs::write(dir.join(META), serde_json::to_string(&meta).unwrap()).unwrap();
        let outcomes = agreed(run.path(), 1);
        let error = outcomes[0].as_ref().unwrap_err();
        assert!(
            error.contains(&dir.display().to_string()) && error.contains("no rank-0.json"),
            "{error}"
        );
    }

    /// A kill during the first checkpoint leaves rank 1's own files of a
    /// step rank 0 never committed: nothing to resume, a fresh start.
    #[test]
    fn another_rank_s_files_of_an_uncommitted_first_step_start_afresh() {
        let run = tempfile::tempdir().unwrap();
        let dir = step_dir(run.path(), 10);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(record_file(1)), "{}").unwrap();
        assert_eq!(agreed(run.path(), 2), [Ok(None), Ok(None)]);
    }
}
