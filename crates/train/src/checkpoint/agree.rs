//! Resuming: the checkpoint every rank continues from, agreed over the
//! communicator, so that it works whether the ranks see one run directory
//! or each its own disk's copy of it.

use std::path::{Path, PathBuf};

use terse_comm::Communicator;

use super::write::{remove_own, remove_own_temporaries};
use super::{RankRecord, bad, check_compatible, checkpoints_dir, held, step_dir, step_dirs};
use crate::rank_exchange::{all_gather_bytes, all_succeeded};
use crate::{RunConfig, TrainError};

/// The newest step every rank holds: rank 0's committed steps (those with
/// `trainer.json`) and every other rank's own committed files, all-gathered.
/// `None` when rank 0 has committed none (a fresh run); an error naming
/// what each rank holds when some rank lacks every step rank 0 committed
/// (a node's disk replaced, another run directory).
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
            return Ok(None);
        }
        let holdings: Vec<String> = lists
            .iter()
            .enumerate()
            .map(|(r, steps)| format!("rank {r} {steps:?}"))
            .collect();
        return Err(bad(
            &checkpoints_dir(run_dir),
            format!(
                "no committed step is held by every rank (steps held: {}): a rank's disk \
                 lost its checkpoints, the ranks see different run directories, or fewer \
                 ranks wrote the run (a resume needs the same world size)",
                holdings.join(", ")
            ),
        ));
    };
    for (newer, dir) in step_dirs(run_dir)? {
        if newer > step && own.contains(&newer) {
            tracing::debug!(
                "rank {rank}: removing its files of step {newer}, which the run never committed"
            );
            remove_own(&dir, rank)?;
        }
    }
    Ok(Some(step_dir(run_dir, step)))
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
