//! Writing a checkpoint collectively, each rank committing only its own
//! files: what works on a filesystem every node shares and on a disk of
//! each node alike.
//!
//! 1. Every rank serialises its files and learns which ranks write onto
//!    its filesystem (`sharing.rs`) and which of its files a lower rank
//!    there writes alike (`shared_copies.rs`).
//! 2. Into its own hidden temporary directory (`.step-N.rank-R.tmp`) each
//!    rank writes and syncs the files no lower rank writes alike; once all
//!    have, it hard-links the others from that rank's temporary directory.
//! 3. Each rank records its files' SHA-256 in `rank-R.json` and renames
//!    them into the step's directory, the record last: the record is the
//!    rank's commit.
//! 4. The ranks all-gather whether they committed; only if all did, rank 0
//!    writes `trainer.json`, the step's commit, and the ranks agree on that
//!    too, so every rank returns the same outcome.
//! 5. Each rank removes its own files of the steps it no longer keeps.
//!
//! A crash anywhere leaves the previous step committed on every rank, and
//! a step whose `trainer.json` exists committed on every rank.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use terse_comm::Communicator;

use super::shared_copies::{
    RankFile, canonical_safetensors, link_or_write, link_sources, write_synced,
};
use super::{
    CheckpointMeta, KEEP, META, RankRecord, checkpoints_dir, held, io, ranks_sharing, record_file,
    step_dir, step_dirs,
};
use crate::out_of_memory::gigabytes;
use crate::rank_exchange::all_succeeded;
use crate::{LossScaler, RunConfig, TrainError};

/// Writes one checkpoint collectively: every rank calls it with its own
/// `files` (which serialises that rank's files). Returns the checkpoint's
/// path once every rank has committed it.
pub fn write(
    run_dir: &Path,
    step: u64,
    stage: &str,
    loss_scaler: Option<LossScaler>,
    config: &RunConfig,
    comm: &dyn Communicator,
    files: impl FnOnce() -> Result<Vec<RankFile>, TrainError>,
) -> Result<PathBuf, TrainError> {
    let rank = comm.rank();
    let started = std::time::Instant::now();
    let done = step_dir(run_dir, step);
    let meta = CheckpointMeta::new(step, stage, loss_scaler, comm.world_size(), config);
    let mut files = all_succeeded(comm, files(), || {
        format!("could not serialise its checkpoint of step {step}")
    })?;
    // Safetensors headers in one key order, so that files of the same
    // tensors are the same bytes on every rank (and link below).
    for file in &mut files {
        file.bytes = canonical_safetensors(std::mem::take(&mut file.bytes));
    }
    let digests: Vec<String> = files
        .iter()
        .map(|file| terse_data::fetch::sha256_bytes(&file.bytes))
        .collect();
    let sharing = ranks_sharing(&checkpoints_dir(run_dir), comm)?;
    let sources = link_sources(comm, &sharing, &digests)?;
    let tmp = temporary(run_dir, step, rank);
    let written = write_unshared(&tmp, rank, &files, &sources);
    all_succeeded(comm, written, || {
        format!("could not write its files of the checkpoint of step {step}")
    })?;
    let linked = link_shared(run_dir, step, &tmp, rank, &files, &sources);
    let linked = all_succeeded(comm, linked, || {
        format!("could not write its files of the checkpoint of step {step}")
    })?;
    let names: BTreeMap<String, String> = files
        .iter()
        .map(|file| (file.name)(rank))
        .zip(digests)
        .collect();
    let written = files.iter().map(|f| f.bytes.len() as u64).sum::<u64>() - linked;
    drop(files);
    let own = commit_own(run_dir, &done, rank, &meta, &tmp, names);
    all_succeeded(comm, own, || {
        format!("could not write its files of the checkpoint of step {step}")
    })?;
    let whole = if rank == 0 {
        commit_step(&done, &meta)
    } else {
        Ok(())
    };
    all_succeeded(comm, whole, || {
        format!("could not commit the checkpoint of step {step} ({META})")
    })?;
    // The step is committed on every rank by now: a file that cannot be
    // removed costs disk space, not the run (nor, in a stop, its exit
    // status), and is removed again at the next checkpoint.
    if let Err(e) = prune_own(run_dir, rank, step) {
        tracing::warn!("rank {rank}: could not remove an older checkpoint's files: {e}");
    }
    tracing::debug!(
        "checkpoint of step {step} in {:.2} s: wrote {}, linked {} of lower ranks' copies \
         ({} on this filesystem)",
        started.elapsed().as_secs_f64(),
        gigabytes(written),
        gigabytes(linked),
        super::room::ranks_text(&sharing),
    );
    Ok(done)
}

/// A fresh temporary directory `tmp` holding, written and synced, those of
/// this rank's `files` no lower rank writes alike (`sources[j]` none).
fn write_unshared(
    tmp: &Path,
    rank: usize,
    files: &[RankFile],
    sources: &[Option<usize>],
) -> Result<(), TrainError> {
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(io(tmp))?;
    }
    fs::create_dir_all(tmp).map_err(io(tmp))?;
    for (file, source) in files.iter().zip(sources) {
        if source.is_none() {
            write_synced(&tmp.join((file.name)(rank)), &file.bytes)?;
        }
    }
    Ok(())
}

/// The rest of this rank's files into `tmp`: each a hard link of the copy
/// its source rank wrote into its temporary directory (or written here,
/// where that cannot be linked). The bytes linked.
fn link_shared(
    run_dir: &Path,
    step: u64,
    tmp: &Path,
    rank: usize,
    files: &[RankFile],
    sources: &[Option<usize>],
) -> Result<u64, TrainError> {
    let mut linked = 0;
    for (file, source) in files.iter().zip(sources) {
        if let Some(source) = *source {
            let from = temporary(run_dir, step, source).join((file.name)(source));
            if link_or_write(&from, &tmp.join((file.name)(rank)), &file.bytes)? {
                linked += file.bytes.len() as u64;
            }
        }
    }
    Ok(linked)
}

fn sync(path: &Path) -> Result<(), TrainError> {
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

fn temporary(run_dir: &Path, step: u64, rank: usize) -> PathBuf {
    checkpoints_dir(run_dir).join(format!(".step-{step:08}.rank-{rank}.tmp"))
}

/// Commits this rank's files of a step, written into `tmp` with the
/// SHA-256 of each by name (`files`), into `done`.
fn commit_own(
    run_dir: &Path,
    done: &Path,
    rank: usize,
    meta: &CheckpointMeta,
    tmp: &Path,
    files: BTreeMap<String, String>,
) -> Result<(), TrainError> {
    let record = RankRecord {
        meta: meta.clone(),
        rank,
        files,
    };
    let record_name = record_file(rank);
    let record_tmp = tmp.join(&record_name);
    let json = serde_json::to_string_pretty(&record).expect("serialises");
    fs::write(&record_tmp, json).map_err(io(&record_tmp))?;
    sync(&record_tmp)?;
    fs::create_dir_all(done).map_err(io(done))?;
    // The step is written again (a run resumed from an older one): it is
    // not this rank's, nor the run's, until it is committed anew.
    let mut stale = vec![record_file(rank)];
    if rank == 0 {
        stale.push(META.to_string());
    }
    for name in stale {
        let path = done.join(name);
        if path.exists() {
            fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    for name in record.files.keys().chain([&record_name]) {
        let to = done.join(name);
        fs::rename(tmp.join(name), &to).map_err(io(&to))?;
    }
    sync(done)?;
    fs::remove_dir(tmp).map_err(io(tmp))?;
    let parent = checkpoints_dir(run_dir);
    sync(&parent)
}

/// Rank 0's commit of the whole step: `trainer.json`, written aside and
/// renamed into place.
fn commit_step(done: &Path, meta: &CheckpointMeta) -> Result<(), TrainError> {
    let tmp = done.join(format!(".{META}.tmp"));
    let json = serde_json::to_string_pretty(meta).expect("serialises");
    fs::write(&tmp, json).map_err(io(&tmp))?;
    sync(&tmp)?;
    let path = done.join(META);
    fs::rename(&tmp, &path).map_err(io(&path))?;
    sync(done)
}

/// Removes this rank's files of every step older than the [`KEEP`] newest
/// it holds up to `step` (the one just committed: a newer one is a leftover,
/// never one to keep in its place), and the step directories that leaves
/// empty (on a shared filesystem the last rank to leave one removes it; one
/// left by two ranks leaving at once goes at the next checkpoint).
fn prune_own(run_dir: &Path, rank: usize, step: u64) -> Result<(), TrainError> {
    let mut kept = held(run_dir, rank)?;
    kept.retain(|&held| held <= step);
    let Some(&oldest_kept) = kept.get(kept.len().saturating_sub(KEEP)) else {
        return Ok(());
    };
    for (step, dir) in step_dirs(run_dir)? {
        if step < oldest_kept {
            remove_own(&dir, rank)?;
        }
    }
    Ok(())
}

/// Removes this rank's `.step-N.rank-R.tmp` directories: writes an earlier
/// run of this rank cut short (the lead rank removes every rank's it sees
/// when it claims the run directory; on a disk of each node, each rank
/// removes its own).
pub(super) fn remove_own_temporaries(run_dir: &Path, rank: usize) -> Result<(), TrainError> {
    let dir = checkpoints_dir(run_dir);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(());
    };
    let suffix = format!(".rank-{rank}.tmp");
    for entry in entries {
        let path = entry.map_err(io(&dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(".step-") && name.ends_with(&suffix) {
            fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Removes this rank's files from a step directory: its commit first (rank
/// 0's includes the step's), then what it listed, then the directory if
/// that left it empty.
pub(super) fn remove_own(dir: &Path, rank: usize) -> Result<(), TrainError> {
    let record_path = dir.join(record_file(rank));
    let listed: Vec<String> = fs::read_to_string(&record_path)
        .ok()
        .and_then(|text| serde_json::from_str::<RankRecord>(&text).ok())
        .map(|record| record.files.into_keys().collect())
        .unwrap_or_default();
    let mut names = Vec::new();
    if rank == 0 {
        names.push(META.to_string());
    }
    names.push(record_file(rank));
    names.extend(listed);
    names.extend([
        super::model_file(rank),
        super::optimizer_file(rank),
        super::optimizer_own_file(rank),
    ]);
    for name in names {
        let path = dir.join(&name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
            _ => {}
        }
    }
    // Not empty (another rank's files remain) or already gone: both fine.
    let _ = fs::remove_dir(dir);
    Ok(())
}

/// Removes every checkpoint file of this rank in the run directory, and its
/// temporaries: what a fresh run does first on every rank. The lead rank
/// has already refused (or, with `--overwrite`, removed) an earlier run it
/// sees; this clears what it cannot see — the other nodes' disks — and
/// files of steps never committed, which would otherwise count as this
/// rank's newest.
pub fn clear_own(run_dir: &Path, rank: usize) -> Result<(), TrainError> {
    remove_own_temporaries(run_dir, rank)?;
    for (_, dir) in step_dirs(run_dir)? {
        remove_own(&dir, rank)?;
    }
    Ok(())
}
