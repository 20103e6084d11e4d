//! Which ranks write onto one filesystem: all of them where the run
//! directory is a filesystem the nodes share, those of one node where it
//! is a disk of each node. Nothing in a rank's view of a path says which,
//! so each rank leaves a marker and reads the others'.
//!
//! Used to size a checkpoint against the free space (`room.rs`), to keep
//! one copy of the files ranks on one filesystem would write alike
//! (`write.rs`), and to make pre-training's examples once per data cache
//! (`tasks/pretrain.rs`).

use std::fs;
use std::path::Path;

use terse_comm::Communicator;

use crate::TrainError;

/// The start of a marker's name ([`ranks_sharing`]); one a killed run left
/// is removed with its half-written checkpoints (`run_dir.rs`).
pub(crate) const MARKER: &str = ".present-";

/// Collectively: the ranks that write onto the filesystem of `dir` (created
/// if need be), this one included, in rank order. Each rank leaves a marker
/// named by a token of rank 0's and its rank, lists the markers of that
/// token it sees between two barriers, then removes its own. Only this rank
/// where its marker cannot be written (the checkpoint will say why).
pub(crate) fn ranks_sharing(dir: &Path, comm: &dyn Communicator) -> Result<Vec<usize>, TrainError> {
    let mut token = [std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id()];
    comm.broadcast_u32(&mut token, 0)?;
    let prefix = format!("{MARKER}{:08x}.rank-", token[0]);
    let marker = dir.join(format!("{prefix}{}", comm.rank()));
    let written = fs::create_dir_all(dir).and_then(|()| fs::write(&marker, b""));
    comm.barrier()?;
    let mut seen: Vec<usize> = fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok())
                .collect()
        },
    );
    comm.barrier()?;
    if written.is_ok() {
        let _ = fs::remove_file(&marker);
    } else {
        seen = Vec::new();
    }
    if !seen.contains(&comm.rank()) {
        seen.push(comm.rank());
    }
    seen.sort_unstable();
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_on_a_filesystem_are_listed_and_leave_no_marker() {
        use std::time::Duration;
        use terse_comm::LocalComm;
        // Ranks 0 and 2 share a directory, rank 1 has its own (a disk of
        // its node).
        let shared = tempfile::tempdir().unwrap();
        let own = tempfile::tempdir().unwrap();
        let lists = LocalComm::run(3, Duration::from_secs(10), |comm| {
            let dir = if comm.rank() == 1 {
                own.path()
            } else {
                shared.path()
            };
            ranks_sharing(&dir.join("checkpoints"), comm).unwrap()
        });
        let lists: Vec<Vec<usize>> = lists.into_iter().map(Result::unwrap).collect();
        assert_eq!(lists, [vec![0, 2], vec![1], vec![0, 2]]);
        for dir in [shared.path(), own.path()] {
            let left = fs::read_dir(dir.join("checkpoints")).unwrap().count();
            assert_eq!(left, 0, "a marker was left in {}", dir.display());
        }
    }
}
