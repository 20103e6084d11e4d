//! Checkpoints: directories `checkpoints/step-NNNNNNNN/` of a run holding
//! every rank's module (`model-rank-R.safetensors`, burn's own names, buffers
//! included) and optimizer state (`optimizer-rank-R.safetensors`: every flat
//! state tensor, error buffers included), and `trainer.json`: the step, the
//! stage, the world size, the resolved config and the SHA-256 of every other
//! file.
//!
//! Nothing else is needed to continue bit-identically: the data order and
//! the dropout masks are functions of `(seed, step, rank)`, so the step is
//! the whole data cursor and RNG state.
//!
//! Written into a hidden temporary directory, synced, and renamed into place
//! by rank 0 once every rank has written its files; a crash at any moment
//! leaves either the whole checkpoint or none. The checksums catch what a
//! rename cannot: a file damaged afterwards is refused, naming it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::store::{ModuleSnapshot, SafetensorsStore};
use serde::{Deserialize, Serialize};
use terse_comm::Communicator;

use crate::{RunConfig, TrainError};

const FORMAT: &str = "terse-checkpoint";
const VERSION: u32 = 1;
const META: &str = "trainer.json";
/// Checkpoints kept on disk: the newest and the one before it, so that a
/// crash while one is written never leaves a run without a whole one.
const KEEP: usize = 2;

/// `trainer.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Always `terse-checkpoint`.
    pub format: String,
    /// Layout version.
    pub version: u32,
    /// Optimizer steps taken.
    pub step: u64,
    /// The optimizer's stage at that step.
    pub stage: String,
    /// Ranks that wrote it.
    pub world_size: usize,
    /// The resolved config of the run.
    pub config: RunConfig,
    /// SHA-256 (hex) of every other file, by name.
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

/// The finished checkpoints of a run, oldest first.
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let dir = checkpoints_dir(run_dir);
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io(&dir))? {
        let path = entry.map_err(io(&dir))?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(step) = step {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The newest checkpoint of a run, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    Ok(list(run_dir)?.pop().map(|(_, path)| path))
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

/// Reads `trainer.json` of `dir` and checks every file it lists against its
/// SHA-256: a damaged, truncated or missing file is an error naming it.
pub fn verify(dir: &Path) -> Result<CheckpointMeta, TrainError> {
    let meta_path = dir.join(META);
    let text = fs::read_to_string(&meta_path).map_err(|e| {
        bad(
            dir,
            format!("cannot read {META}: {e} (incomplete checkpoint)"),
        )
    })?;
    let meta: CheckpointMeta = serde_json::from_str(&text)
        .map_err(|e| bad(&meta_path, format!("not a checkpoint description: {e}")))?;
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(bad(
            &meta_path,
            format!(
                "format `{}` v{}, expected `{FORMAT}` v{VERSION}",
                meta.format, meta.version
            ),
        ));
    }
    for (name, want) in &meta.files {
        let path = dir.join(name);
        if !path.exists() {
            return Err(bad(&path, "missing (listed in trainer.json)"));
        }
        let got = sha256_file(&path)?;
        if &got != want {
            return Err(bad(
                &path,
                format!(
                    "SHA-256 {got} does not match {want} recorded in {META}: the file is \
                     corrupted; delete this checkpoint directory to resume from the one before"
                ),
            ));
        }
    }
    Ok(meta)
}

/// Writes one checkpoint collectively: every rank calls it with its own
/// `write_files` (which writes that rank's files into the directory it is
/// given); rank 0 then records the checksums and renames the directory into
/// place. Returns the checkpoint's final path.
pub fn write(
    run_dir: &Path,
    step: u64,
    stage: &str,
    config: &RunConfig,
    comm: &dyn Communicator,
    write_files: impl FnOnce(&Path) -> Result<(), TrainError>,
) -> Result<PathBuf, TrainError> {
    let tmp = checkpoints_dir(run_dir).join(format!(".step-{step:08}.tmp"));
    let done = step_dir(run_dir, step);
    if comm.rank() == 0 {
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    }
    comm.barrier()?;
    write_files(&tmp)?;
    comm.barrier()?;
    if comm.rank() == 0 {
        let mut files = BTreeMap::new();
        for entry in fs::read_dir(&tmp).map_err(io(&tmp))? {
            let path = entry.map_err(io(&tmp))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            files.insert(name.to_string(), sha256_file(&path)?);
        }
        let meta = CheckpointMeta {
            format: FORMAT.into(),
            version: VERSION,
            step,
            stage: stage.into(),
            world_size: comm.world_size(),
            config: config.clone(),
            files,
        };
        let meta_path = tmp.join(META);
        let json = serde_json::to_string_pretty(&meta).expect("serialises");
        fs::write(&meta_path, json).map_err(io(&meta_path))?;
        for entry in fs::read_dir(&tmp).map_err(io(&tmp))? {
            let path = entry.map_err(io(&tmp))?.path();
            fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io(&path))?;
        }
        if done.exists() {
            fs::remove_dir_all(&done).map_err(io(&done))?;
        }
        fs::rename(&tmp, &done).map_err(io(&done))?;
        let parent = checkpoints_dir(run_dir);
        fs::File::open(&parent)
            .and_then(|f| f.sync_all())
            .map_err(io(&parent))?;
        let all = list(run_dir)?;
        for (_, old) in all.iter().take(all.len().saturating_sub(KEEP)) {
            fs::remove_dir_all(old).map_err(io(old))?;
        }
    }
    comm.barrier()?;
    Ok(done)
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
