//! Checkpoints: directories `checkpoints/step-NNNNNNNN/` of a run holding
//! every rank's module (`model-rank-R.safetensors`, burn's own names, buffers
//! included) and optimizer state (`optimizer-rank-R.safetensors`: the flat
//! state tensors; where part of the state is each rank's own, the 1-bit
//! rules' error buffers, that part in `optimizer-own-rank-R.safetensors`
//! and the rest naming no rank), every rank's record of them
//! (`rank-R.json`: the SHA-256 of each of its files, with the step's
//! description), and rank 0's `trainer.json`: the step, the stage, the world
//! size and the resolved config, written once every rank has committed its
//! files — the step's commit.
//!
//! Nothing else is needed to continue bit-identically: the data order and
//! the dropout masks are functions of `(seed, step, rank)`, so the step is
//! the whole data cursor and RNG state.
//!
//! Each rank writes and commits only its own files ([`write`]), so the run
//! directory may be one filesystem all nodes share or a disk of each node;
//! ranks on one filesystem keep one copy of the files they write alike
//! (`shared_copies.rs`: hard links, each rank's name listed in its record);
//! a resume continues from the newest step every rank holds, each rank
//! checking only its own files ([`agree`]). A crash at any moment leaves
//! every rank's previous step whole. The checksums catch what a rename
//! cannot: a file damaged afterwards is refused, naming it.

mod agree;
mod room;
mod shared_copies;
mod sharing;
mod write;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::store::{ModuleSnapshot, SafetensorsStore};
use serde::{Deserialize, Serialize};

use crate::{LossScaler, RunConfig, TrainError};

pub use agree::{agree_on_latest, remove_leftovers_after, verify_own};
pub use room::{Sizes, warn_if_first_will_not_fit, warn_if_next_will_not_fit};
pub use shared_copies::RankFile;
pub(crate) use sharing::MARKER;
pub(crate) use sharing::ranks_sharing;
pub use write::{clear_own, write};

const FORMAT: &str = "terse-checkpoint";
/// 2: each rank's files recorded in its own `rank-R.json` (1: every rank's
/// checksums in `trainer.json`, written by rank 0 over a shared filesystem).
const VERSION: u32 = 2;
const META: &str = "trainer.json";
/// Checkpoints kept on disk: the newest and the one before it, so that a
/// crash while one is written never leaves a run without a whole one.
const KEEP: usize = 2;

/// `trainer.json`: what a step's checkpoint is, written by rank 0 once every
/// rank has committed its files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Always `terse-checkpoint`.
    pub format: String,
    /// Layout version.
    pub version: u32,
    /// Steps taken (the optimizer's too, except fp16's skipped ones).
    pub step: u64,
    /// The optimizer's stage at that step.
    pub stage: String,
    /// Ranks that wrote it.
    pub world_size: usize,
    /// fp16's loss scaler at that step (absent in other precisions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
    /// The resolved config of the run.
    pub config: RunConfig,
}

impl CheckpointMeta {
    fn new(
        step: u64,
        stage: &str,
        loss_scaler: Option<LossScaler>,
        world_size: usize,
        config: &RunConfig,
    ) -> Self {
        Self {
            format: FORMAT.into(),
            version: VERSION,
            step,
            stage: stage.into(),
            world_size,
            loss_scaler,
            config: config.clone(),
        }
    }
}

/// `rank-R.json`: one rank's commit of its files of a step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankRecord {
    /// The step's description, as `trainer.json` has it.
    #[serde(flatten)]
    pub meta: CheckpointMeta,
    /// The rank whose files these are.
    pub rank: usize,
    /// SHA-256 (hex) of each of the rank's files, by name.
    pub files: BTreeMap<String, String>,
}

/// A rank's module file in a checkpoint.
pub fn model_file(rank: usize) -> String {
    format!("model-rank-{rank}.safetensors")
}

/// A rank's optimizer file in a checkpoint.
pub fn optimizer_file(rank: usize) -> String {
    format!("optimizer-rank-{rank}.safetensors")
}

/// A rank's file of the optimizer state that is its own (the compressed
/// rules' error buffers), where [`optimizer_file`] holds the rest.
pub fn optimizer_own_file(rank: usize) -> String {
    format!("optimizer-own-rank-{rank}.safetensors")
}

/// A rank's record of its files in a checkpoint.
pub fn record_file(rank: usize) -> String {
    format!("rank-{rank}.json")
}

/// Where a run keeps its checkpoints.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    checkpoints_dir(run_dir).join(format!("step-{step:08}"))
}

/// A mapper of an I/O error on `path` into the crate's error.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Every step directory of a run, committed or not, oldest first.
fn step_dirs(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let dir = checkpoints_dir(run_dir);
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut found: Vec<(u64, PathBuf)> = entries(&dir)?
        .into_iter()
        .filter_map(|(name, path)| Some((name.strip_prefix("step-")?.parse().ok()?, path)))
        .collect();
    found.sort();
    Ok(found)
}

/// The entries of `dir` with their file names (empty where not UTF-8), in
/// the order the directory lists them.
pub(crate) fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, TrainError> {
    fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|entry| {
            let path = entry.map_err(io(dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            Ok((name.to_string(), path))
        })
        .collect()
}

/// The committed checkpoints (those with rank 0's `trainer.json`) this
/// process sees in a run directory, oldest first.
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    Ok(step_dirs(run_dir)?
        .into_iter()
        .filter(|(_, dir)| dir.join(META).exists())
        .collect())
}

/// The newest committed checkpoint of a run, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    Ok(list(run_dir)?.pop().map(|(_, path)| path))
}

/// The steps whose files `rank` has committed in this process's view of
/// the run directory, oldest first; for rank 0, only the steps it has also
/// committed as a whole (`trainer.json`).
fn held(run_dir: &Path, rank: usize) -> Result<Vec<u64>, TrainError> {
    Ok(step_dirs(run_dir)?
        .into_iter()
        .filter(|(_, dir)| {
            dir.join(record_file(rank)).exists() && (rank != 0 || dir.join(META).exists())
        })
        .map(|(step, _)| step)
        .collect())
}

fn sha256_file(path: &Path) -> Result<String, TrainError> {
    Ok(terse_data::fetch::sha256_file(path)?)
}

fn bad(path: &Path, reason: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The format and version every checkpoint record starts with, read before
/// the rest so that a record of another layout is refused as such (not as
/// a missing field).
#[derive(Deserialize)]
struct Stamp {
    format: String,
    version: u32,
}

/// A JSON record of a checkpoint (`trainer.json`, `rank-R.json`), of this
/// format and version; another format or version is refused naming both.
fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let text = fs::read_to_string(path).map_err(|e| {
        bad(
            path,
            format!("cannot read {name}: {e} (incomplete checkpoint)"),
        )
    })?;
    let stamp: Stamp = serde_json::from_str(&text)
        .map_err(|e| bad(path, format!("not a checkpoint record: {e}")))?;
    if stamp.format != FORMAT || stamp.version != VERSION {
        return Err(bad(
            path,
            format!(
                "format `{}` version {}, this terse reads `{FORMAT}` version {VERSION} only \
                 (written by another version of terse)",
                stamp.format, stamp.version
            ),
        ));
    }
    serde_json::from_str(&text).map_err(|e| bad(path, format!("not a checkpoint record: {e}")))
}

/// Reads a committed checkpoint's `trainer.json`.
pub fn read_meta(dir: &Path) -> Result<CheckpointMeta, TrainError> {
    read_record(&dir.join(META))
}

/// Reads `rank-R.json` of `dir` and checks each file it lists against its
/// SHA-256: a damaged, truncated or missing file is an error naming it.
pub fn verify_rank(dir: &Path, rank: usize) -> Result<RankRecord, TrainError> {
    let path = dir.join(record_file(rank));
    let record: RankRecord = read_record(&path)?;
    if record.rank != rank {
        return Err(bad(&path, format!("the record of rank {}", record.rank)));
    }
    for (name, want) in &record.files {
        let path = dir.join(name);
        if !path.exists() {
            return Err(bad(
                &path,
                format!("missing (listed in {})", record_file(rank)),
            ));
        }
        let got = sha256_file(&path)?;
        if &got != want {
            return Err(bad(
                &path,
                format!(
                    "SHA-256 {got} does not match {want} recorded in {}: the file is \
                     corrupted; delete this checkpoint directory to resume from the one before",
                    record_file(rank)
                ),
            ));
        }
    }
    Ok(record)
}

/// Reads the committed checkpoint `dir` (its `trainer.json`) and checks rank
/// 0's files, the ones `eval`, `predict` and `export` load.
pub fn verify(dir: &Path) -> Result<CheckpointMeta, TrainError> {
    let meta = read_meta(dir)?;
    verify_rank(dir, 0)?;
    Ok(meta)
}

/// Checks that a verified checkpoint can continue the run of `config` on
/// `world` ranks; the error names the difference.
pub fn check_compatible(
    dir: &Path,
    meta: &CheckpointMeta,
    config: &RunConfig,
    world: usize,
) -> Result<(), TrainError> {
    if meta.world_size != world {
        return Err(bad(
            dir,
            format!(
                "written by {} rank(s), this run has {world}: the compressed optimizers' \
                 error buffers are per rank, so a resume needs the same world size",
                meta.world_size
            ),
        ));
    }
    if let Some(difference) = config.resume_difference(&meta.config) {
        return Err(bad(dir, format!("another run's checkpoint: {difference}")));
    }
    if meta.step > config.train.steps {
        return Err(bad(
            dir,
            format!(
                "already at step {} of a run of {} steps",
                meta.step, config.train.steps
            ),
        ));
    }
    Ok(())
}

/// Loads a rank's module file into `model`; every tensor must fit.
pub fn load_model<M: ModuleSnapshot>(model: &mut M, path: &Path) -> Result<(), TrainError> {
    let mut store = SafetensorsStore::from_file(path);
    let applied = model
        .load_from(&mut store)
        .map_err(|e| bad(path, e.to_string()))?;
    if !applied.errors.is_empty() || !applied.missing.is_empty() {
        return Err(bad(
            path,
            format!(
                "does not fit the model: errors {:?}, missing {:?}",
                applied.errors, applied.missing
            ),
        ));
    }
    Ok(())
}

/// A checkpoint directory as given, or the newest checkpoint of a run
/// directory.
pub fn resolve(path: &Path) -> Result<PathBuf, TrainError> {
    if path.join(META).exists() {
        return Ok(path.to_path_buf());
    }
    latest(path)?.ok_or_else(|| {
        bad(
            path,
            "neither a checkpoint (no trainer.json) nor a run directory with checkpoints/",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_another_version_is_refused_naming_the_file_and_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(META);
        // Version 1's trainer.json had other fields (every rank's
        // checksums): the version is what is reported, not a missing field.
        fs::write(
            &path,
            r#"{"format": "terse-checkpoint", "version": 1, "step": 20, "files": {}}"#,
        )
        .unwrap();
        let error = read_meta(dir.path()).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "checkpoint {}: format `terse-checkpoint` version 1, this terse reads \
                 `terse-checkpoint` version 2 only (written by another version of terse)",
                path.display()
            )
        );
        fs::write(&path, r#"{"format": "other", "version": 2}"#).unwrap();
        let error = read_meta(dir.path()).unwrap_err().to_string();
        assert!(error.contains("format `other` version 2"), "{error}");
        fs::write(&path, r#"{"step": 3}"#).unwrap();
        let error = read_meta(dir.path()).unwrap_err().to_string();
        assert!(error.contains("not a checkpoint record"), "{error}");
    }
}
