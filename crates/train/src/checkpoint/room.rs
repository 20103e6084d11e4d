//! Whether the disk holds the next checkpoint. A checkpoint that does not
//! fit stops the run with ENOSPC at its step (`write.rs` leaves the last
//! whole one, and `--resume` continues from it); this says so ahead, while
//! there is still time to free space:
//!
//! - before step 1, from the size the model and the optimizer state will
//!   have, what is each rank's own times the ranks that write onto the same
//!   filesystem (`sharing.rs`), what is alike on every rank once
//!   (`shared_copies.rs`): a first checkpoint hours away is named at once;
//! - after each checkpoint, from the step directory as each rank sees it
//!   (all ranks' files on a filesystem the nodes share, its node's on a
//!   disk of each node). The next checkpoint is written while the
//!   [`KEEP`](super::KEEP) newest are still there, so it needs about that
//!   much again.
//!
//! The ranks exchange their readings; rank 0 logs one warning line.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use terse_comm::Communicator;

use crate::TrainError;
use crate::out_of_memory::gigabytes;

/// One rank's reading: the checkpoint's bytes on its filesystem and the
/// bytes free there (for an unprivileged writer), in MiB as the ranks
/// exchange them (`u32::MAX` where the free space could not be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    checkpoint_mib: u32,
    free_mib: u32,
}

impl Reading {
    /// Whether the next checkpoint, as large as this one, will not fit.
    /// No margin: a warning says "will not fit" only where the sizes say
    /// so (the logs grow by kilobytes between checkpoints).
    fn short(self) -> bool {
        self.free_mib < self.checkpoint_mib
    }
}

/// After the checkpoint `dir` of step `step`, with the next one due at step
/// `next`: collectively, every rank's reading of `dir`; rank 0 warns when
/// some rank's filesystem will not hold another checkpoint of its size.
pub fn warn_if_next_will_not_fit(
    dir: &Path,
    step: u64,
    next: u64,
    comm: &dyn Communicator,
) -> Result<(), TrainError> {
    let own = Reading {
        checkpoint_mib: mib_up(dir_bytes(dir)),
        free_mib: free_mib(dir),
    };
    let checkpoints = dir.parent().unwrap_or(dir);
    report(own, checkpoints, next, Some(step), comm)
}

/// A rank's checkpoint files by how ranks on one filesystem store them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes alike on every rank (the model where every step leaves the
    /// parameters the same bits, a state alike on every rank): stored once
    /// per filesystem (`shared_copies.rs`).
    pub once: u64,
    /// Bytes that are each rank's own: stored by every rank.
    pub per_rank: u64,
}

impl Sizes {
    /// The bytes `ranks` ranks writing onto one filesystem store there.
    fn on_filesystem_of(self, ranks: usize) -> u64 {
        self.once
            .saturating_add(self.per_rank.saturating_mul(ranks as u64))
    }
}

/// Before step 1 of a run that starts after step `start` (0: a fresh
/// run), with its next checkpoint due at step `next`: collectively, what
/// the ranks writing onto each rank's filesystem store there of checkpoint
/// files of `bytes` each (the model and the optimizer state), against the
/// space free there; rank 0 warns where it will not fit.
pub fn warn_if_first_will_not_fit(
    run_dir: &Path,
    start: u64,
    next: u64,
    bytes: Sizes,
    comm: &dyn Communicator,
) -> Result<(), TrainError> {
    let checkpoints = super::checkpoints_dir(run_dir);
    let sharing = super::ranks_sharing(&checkpoints, comm)?.len();
    let own = Reading {
        checkpoint_mib: mib_up(bytes.on_filesystem_of(sharing)),
        free_mib: free_mib(&checkpoints),
    };
    report(own, &checkpoints, next, (start > 0).then_some(start), comm)
}

/// Gathers every rank's reading; rank 0 logs the warning, if any.
fn report(
    own: Reading,
    checkpoints: &Path,
    next: u64,
    resume_from: Option<u64>,
    comm: &dyn Communicator,
) -> Result<(), TrainError> {
    let mut all = vec![0u32; 2 * comm.world_size()];
    comm.all_gather_u32(&[own.checkpoint_mib, own.free_mib], &mut all)?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let readings: Vec<Reading> = all
        .chunks_exact(2)
        .map(|r| Reading {
            checkpoint_mib: r[0],
            free_mib: r[1],
        })
        .collect();
    if let Some(warning) = warning(&readings, checkpoints, next, resume_from) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// The warning for `readings` (one per rank), if any rank is short: the
/// short ranks, and the tightest one's numbers. `resume_from`: the step a
/// resume would continue from (none: no checkpoint yet, `next` is the
/// first).
fn warning(
    readings: &[Reading],
    checkpoints: &Path,
    next: u64,
    resume_from: Option<u64>,
) -> Option<String> {
    let short: Vec<usize> = (0..readings.len())
        .filter(|&r| readings[r].short())
        .collect();
    let worst = *short.iter().min_by_key(|&&r| {
        i64::from(readings[r].free_mib) - i64::from(readings[r].checkpoint_mib)
    })?;
    let Reading {
        checkpoint_mib,
        free_mib,
    } = readings[worst];
    let mib = |m: u32| gigabytes(u64::from(m) << 20);
    let (which, then) = match resume_from {
        Some(step) => ("next", format!("`--resume` continues from step {step}")),
        None => ("first", "there is no checkpoint to resume from".to_string()),
    };
    Some(format!(
        "the {which} checkpoint (step {next}) will not fit: it needs about {} where {} {} \
         it ({}), and {} is free there{}; free space before step {next}, or the run stops \
         there with an error and {then}",
        mib(checkpoint_mib),
        ranks_text(&short),
        if short.len() == 1 { "writes" } else { "write" },
        checkpoints.display(),
        mib(free_mib),
        // Ranks that read the same are most likely on one filesystem.
        if short.iter().any(|&r| readings[r] != readings[worst]) {
            format!(" (rank {worst}'s filesystem, the fullest)")
        } else {
            String::new()
        },
    ))
}

/// `[0, 1, 2, 5]` as "ranks 0–2, 5"; `[3]` as "rank 3".
pub(super) fn ranks_text(ranks: &[usize]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        runs.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}–{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    let word = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{word} {}", runs.join(", "))
}

/// The bytes of the files in `dir` (a step directory holds no others),
/// each file once however many names it has there (ranks on one
/// filesystem share the files they write alike, `shared_copies.rs`).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut seen = std::collections::HashSet::new();
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file() && seen.insert((m.dev(), m.ino())))
        .map(|m| m.len())
        .sum()
}

/// The bytes an unprivileged writer may still use on `path`'s filesystem
/// (statvfs's `f_bavail` blocks of `f_frsize` bytes).
fn free_bytes(path: &Path) -> Option<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer statvfs fills on success.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if status != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The MiB free on `path`'s filesystem; `u32::MAX` where unknown.
fn free_mib(path: &Path) -> u32 {
    free_bytes(path).map_or(u32::MAX, mib_down)
}

fn mib_up(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX)
}

fn mib_down(bytes: u64) -> u32 {
    u32::try_from(bytes >> 20).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(checkpoint_mib: u32, free_mib: u32) -> Reading {
        Reading {
            checkpoint_mib,
            free_mib,
        }
    }

    #[test]
    fn short_is_less_free_space_than_the_checkpoint() {
        assert!(!reading(1000, 1000).short());
        assert!(reading(1000, 999).short());
        assert!(reading(1000, 10).short());
        assert!(!reading(0, 0).short(), "no checkpoint files seen");
        assert!(!reading(1000, u32::MAX).short(), "free space unknown");
    }

    #[test]
    fn one_line_names_the_short_ranks_and_the_fullest_filesystem() {
        let dir = Path::new("runs/x/checkpoints");
        let enough = reading(1600, 90_000);
        assert_eq!(warning(&[enough, enough], dir, 80, Some(40)), None);
        let line = warning(
            &[
                reading(1600, 1200),
                enough,
                reading(1600, 300),
                reading(1600, 1000),
            ],
            dir,
            80,
            Some(40),
        )
        .unwrap();
        assert_eq!(
            line,
            "the next checkpoint (step 80) will not fit: it needs about 1.56 GiB where \
             ranks 0, 2–3 write it (runs/x/checkpoints), and 300.0 MiB is free there \
             (rank 2's filesystem, the fullest); free space before step 80, or the run \
             stops there with an error and `--resume` continues from step 40"
        );
        let shared = warning(&[reading(187, 113), reading(187, 113)], dir, 2, Some(1)).unwrap();
        assert!(
            shared
                .contains("ranks 0–1 write it (runs/x/checkpoints), and 113.0 MiB is free there;"),
            "{shared}"
        );
        let one = warning(&[enough, reading(100, 20)], dir, 1000, None).unwrap();
        assert_eq!(
            one,
            "the first checkpoint (step 1000) will not fit: it needs about 100.0 MiB where \
             rank 1 writes it (runs/x/checkpoints), and 20.0 MiB is free there; free space \
             before step 1000, or the run stops there with an error and there is no \
             checkpoint to resume from"
        );
    }

    #[test]
    fn what_ranks_write_alike_is_counted_once_per_filesystem() {
        let sizes = Sizes {
            once: 100,
            per_rank: 7,
        };
        assert_eq!(sizes.on_filesystem_of(1), 107);
        assert_eq!(sizes.on_filesystem_of(4), 128);
    }

    #[test]
    fn rank_lists_fold_runs() {
        assert_eq!(ranks_text(&[3]), "rank 3");
        assert_eq!(ranks_text(&[0, 1, 2, 5, 7, 8]), "ranks 0–2, 5, 7–8");
    }

    #[test]
    fn the_free_space_and_a_directorys_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 3 << 20]).unwrap();
        std::fs::write(dir.path().join("b"), vec![0u8; 1]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        // A second name of a file takes no more room.
        std::fs::hard_link(dir.path().join("a"), dir.path().join("a-again")).unwrap();
        assert_eq!(dir_bytes(dir.path()), (3 << 20) + 1);
        assert_eq!(mib_up(dir_bytes(dir.path())), 4);
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        assert_eq!(free_bytes(&dir.path().join("missing")), None);
    }
}
