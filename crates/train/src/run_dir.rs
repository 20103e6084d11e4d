//! The run directory belongs to one run at a time, and a new run does not
//! silently mix with an old one.
//!
//! Two runs writing one directory race on its temporary checkpoints and
//! interleave their metrics; a fresh run in an old directory would have its
//! new checkpoints pruned against the old ones (pruning keeps the highest
//! steps). So the lead rank claims the directory before any rank writes to
//! it: an exclusive lock on `.lock` (an OS file lock, released when the
//! process ends however it ends, `kill -9` included), a refusal to start a
//! fresh run over an earlier one unless told to continue it (`--resume`) or
//! to replace it (`--overwrite`, as the HF Trainer's
//! `overwrite_output_dir`), and the removal of checkpoints a killed run left
//! half-written.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::TrainError;
use crate::checkpoint::{self, io};

/// The lock file inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// What a fresh run may do with an earlier run's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Continue from its checkpoint (`--resume`): keep everything.
    Resume,
    /// Delete its metrics, checkpoints and export first (`--overwrite`).
    Overwrite,
    /// Refuse if there is one.
    Refuse,
}

/// The claim on a run directory: held until dropped (or the process ends).
#[derive(Debug)]
pub struct RunDirClaim {
    _lock: File,
}

/// The files and directories a run writes, which `--overwrite` deletes
/// (anything else in the directory is the user's and stays).
const RUN_OUTPUTS: &[&str] = &[
    "metrics.jsonl",
    "config.toml",
    "terse.log",
    "checkpoints",
    "export",
    "predictions.json",
    "nbest_predictions.json",
    "loss.png",
    "summary.json",
];

/// Claims `dir` for this run: creates it, takes its lock (refusing, with
/// the holder's pid and host, when another run has it), applies `existing`
/// to an earlier run's outputs and removes stale temporary checkpoints.
pub fn claim(dir: &Path, existing: Existing) -> Result<RunDirClaim, TrainError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(LOCK_FILE);
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path))?;
    match try_lock_patiently(&lock) {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(TrainError::RunDir {
                path: dir.to_path_buf(),
                reason: format!(
                    "another run is using it ({}): wait for it to end, or pick another --run-dir",
                    if holder.is_empty() {
                        "it has not said who it is yet"
                    } else {
                        holder
                    }
                ),
            });
        }
        Err(fs::TryLockError::Error(source)) => return Err(TrainError::Io { path, source }),
    }
    let host = host_name().unwrap_or_else(|| "an unknown host".into());
    let me = format!("pid {} on {host}\n", std::process::id());
    lock.set_len(0)
        .and_then(|()| lock.rewind())
        .and_then(|()| lock.write_all(me.as_bytes()))
        .map_err(io(&path))?;

    if existing != Existing::Resume
        && let Some(earlier) = earlier_run(dir)?
    {
        if existing == Existing::Refuse {
            return Err(TrainError::RunDir {
                path: dir.to_path_buf(),
                reason: format!(
                    "it holds an earlier run ({earlier}): continue it with --resume, \
                     replace it with --overwrite (deletes its metrics, checkpoints and \
                     export), or pick another --run-dir"
                ),
            });
        }
        for name in RUN_OUTPUTS {
            remove(&dir.join(name))?;
        }
        remove_event_files(dir)?;
        tracing::info!(
            "--overwrite: removed the earlier run in {} ({earlier})",
            dir.display()
        );
    }
    remove_stale_temporaries(dir)?;
    Ok(RunDirClaim { _lock: lock })
}

/// How long a claim waits for a lock that is held: a run just killed
/// (`kill -9`, mpirun ending its ranks) holds it until the kernel has
/// finished ending the process, which a resume started right after can
/// race; a live run holds it far longer.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

fn try_lock_patiently(lock: &File) -> Result<(), fs::TryLockError> {
    let start = std::time::Instant::now();
    loop {
        match lock.try_lock() {
            Err(fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            result => return result,
        }
    }
}

/// What shows that `dir` holds an earlier run, or `None`: its metrics or
/// checkpoints (a config.toml alone is not a run: it is written before the
/// first step and says nothing was trained).
fn earlier_run(dir: &Path) -> Result<Option<String>, TrainError> {
    let checkpoints = checkpoint::list(dir)?;
    let metrics = dir.join("metrics.jsonl");
    let has_metrics = fs::metadata(&metrics).is_ok_and(|m| m.len() > 0);
    Ok(match (checkpoints.last(), has_metrics) {
        (Some((step, _)), _) => Some(format!(
            "{} checkpoint(s), the newest at step {step}",
            checkpoints.len()
        )),
        (None, true) => Some("metrics.jsonl, no checkpoint".into()),
        (None, false) => None,
    })
}

/// Removes the `.step-N.rank-R.tmp` directories of checkpoints whose writing was
/// cut short (a kill, a full disk): only a run holding the lock may, since
/// a running one writes into them. So too the ranks' markers of a run
/// killed while it counted them (`checkpoint/room.rs`).
fn remove_stale_temporaries(dir: &Path) -> Result<(), TrainError> {
    let checkpoints = checkpoint::checkpoints_dir(dir);
    let Ok(entries) = fs::read_dir(&checkpoints) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry.map_err(io(&checkpoints))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(checkpoint::MARKER) {
            remove(&path)?;
        } else if name.starts_with(".step-") && name.ends_with(".tmp") {
            tracing::info!(
                "removing {}: a checkpoint an earlier run did not finish",
                path.display()
            );
            remove(&path)?;
        }
    }
    Ok(())
}

/// How TensorBoard's event files are named (what follows: the time, the
/// host and the process; `tensorboard.rs` writes them).
pub(crate) const EVENT_FILE_PREFIX: &str = "events.out.tfevents.";

/// Removes the TensorBoard event files in `dir`: an earlier run's, which a
/// run replacing it (`--overwrite`, or one from step 0) does not add to.
pub(crate) fn remove_event_files(dir: &Path) -> Result<(), TrainError> {
    for (name, path) in checkpoint::entries(dir)? {
        if name.starts_with(EVENT_FILE_PREFIX) {
            remove(&path)?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), TrainError> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TrainError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// This machine's name (the lock's "who holds it" line, TensorBoard's
/// event file names), if the kernel says.
pub(crate) fn host_name() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("terse-run-dir-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_second_claim_is_refused_naming_the_holder_until_the_first_ends() {
        let dir = scratch();
        let first = claim(dir.path(), Existing::Refuse).unwrap();
        let error = claim(dir.path(), Existing::Resume).unwrap_err().to_string();
        let me = format!("pid {} on ", std::process::id());
        assert!(error.contains("another run is using it"), "{error}");
        assert!(error.contains(&me), "{error}");
        drop(first);
        claim(dir.path(), Existing::Resume).unwrap();
    }

    #[test]
    fn an_earlier_run_is_refused_kept_on_resume_and_removed_on_overwrite() {
        let dir = scratch();
        let step = checkpoint::checkpoints_dir(dir.path()).join("step-00000004");
        fs::create_dir_all(&step).unwrap();
        fs::write(step.join("trainer.json"), "{}").unwrap();
        fs::write(dir.path().join("metrics.jsonl"), "{\"step\": 1}\n").unwrap();
        fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        fs::write(dir.path().join("events.out.tfevents.1.host"), "x").unwrap();

        let error = claim(dir.path(), Existing::Refuse).unwrap_err().to_string();
        assert!(
            error.contains("1 checkpoint(s), the newest at step 4"),
            "{error}"
        );
        assert!(
            error.contains("--resume") && error.contains("--overwrite"),
            "{error}"
        );
        drop(claim(dir.path(), Existing::Resume).unwrap());
        assert!(step.is_dir());

        drop(claim(dir.path(), Existing::Overwrite).unwrap());
        assert!(!step.exists());
        assert!(!dir.path().join("metrics.jsonl").exists());
        assert!(!dir.path().join("events.out.tfevents.1.host").exists());
        assert!(
            dir.path().join("notes.txt").exists(),
            "the user's file stays"
        );
        // Nothing left of a run: a plain claim goes through.
        drop(claim(dir.path(), Existing::Refuse).unwrap());
    }

    #[test]
    fn a_half_written_checkpoint_is_removed_and_a_config_alone_is_no_run() {
        let dir = scratch();
        let tmp = checkpoint::checkpoints_dir(dir.path()).join(".step-00000008.rank-0.tmp");
        fs::create_dir_all(&tmp).unwrap();
        fs::write(tmp.join("model-rank-0.safetensors"), "half").unwrap();
        fs::write(dir.path().join("config.toml"), "[task]").unwrap();
        // A rank's marker a run killed while counting them left.
        let marker = checkpoint::checkpoints_dir(dir.path()).join(".present-0badcafe.rank-1");
        fs::write(&marker, "").unwrap();
        drop(claim(dir.path(), Existing::Refuse).unwrap());
        assert!(!tmp.exists());
        assert!(!marker.exists());
    }
}
