//! One copy on disk of the checkpoint files that ranks on one filesystem
//! would write alike.
//!
//! Data-parallel ranks hold the same parameters after every step (all
//! rules but SLAMB between its averagings) and, under AdamW, LAMB and SGD,
//! the same optimizer state: on a filesystem the nodes share, 64 ranks
//! wrote 64 identical copies of the model (BERT-large: 64 × 1.3 GB per
//! checkpoint, three checkpoints on disk while one is written). Now a rank
//! whose file has the same SHA-256 as a lower rank's on its filesystem
//! makes its file a hard link of that rank's: each rank still has its own
//! file under its own name, listed and checksummed in its own record, so
//! resuming, verifying and pruning are unchanged (a file is gone when its
//! last rank removes its name). Files that differ — the compressed
//! optimizers' error buffers, SLAMB's parameters between averagings — are
//! written by each rank, as are all files on a disk of each node but the
//! node's first rank's.

use std::fs;
use std::path::Path;

use terse_comm::Communicator;

use crate::TrainError;

/// One of a rank's files of a checkpoint, serialised.
pub struct RankFile {
    /// The file's name for a rank (`model_file`, `optimizer_file`): the
    /// ranks' files at one position of their lists have the same role.
    pub name: fn(usize) -> String,
    /// Its contents.
    pub bytes: Vec<u8>,
}

/// Collectively: for each of this rank's files (position `j` of `digests`,
/// every rank's list as long), the lowest rank below it among `sharing`
/// whose file `j` has the same SHA-256, whose copy it links; `None`: it
/// writes its own. With lists of different lengths on some ranks, none.
pub(super) fn link_sources(
    comm: &dyn Communicator,
    sharing: &[usize],
    digests: &[String],
) -> Result<Vec<Option<usize>>, TrainError> {
    let world = comm.world_size();
    let mut counts = vec![0u32; world];
    comm.all_gather_u32(&[digests.len() as u32], &mut counts)?;
    if counts.iter().any(|&c| c as usize != digests.len()) {
        return Ok(vec![None; digests.len()]);
    }
    const DIGEST: usize = 64; // hex characters of a SHA-256
    let own: Vec<u8> = digests
        .iter()
        .flat_map(|d| {
            let mut fixed = d.as_bytes().to_vec();
            fixed.resize(DIGEST, 0);
            fixed
        })
        .collect();
    let mut all = vec![0u8; own.len() * world];
    comm.all_gather_u8(&own, &mut all)?;
    let of = |rank: usize, j: usize| {
        let start = (rank * digests.len() + j) * DIGEST;
        &all[start..start + DIGEST]
    };
    let rank = comm.rank();
    Ok((0..digests.len())
        .map(|j| {
            sharing
                .iter()
                .copied()
                .take_while(|&q| q < rank)
                .find(|&q| of(q, j) == of(rank, j))
        })
        .collect())
}

/// A safetensors file's bytes with its JSON header's keys in sorted order
/// (the tensors' entries and the metadata's), padded with spaces to its
/// length as before: the same tensors and metadata, the same bytes. The
/// writers emit the metadata in a `HashMap`'s order, which differs between
/// maps, so two ranks' files of the same state differed in their first
/// kilobyte and never matched. Bytes that are not safetensors are returned
/// as they are.
pub(super) fn canonical_safetensors(mut bytes: Vec<u8>) -> Vec<u8> {
    let Some(len) = bytes
        .get(..8)
        .map(|n| u64::from_le_bytes(n.try_into().expect("8")))
    else {
        return bytes;
    };
    let Some(end) = usize::try_from(len).ok().and_then(|n| n.checked_add(8)) else {
        return bytes;
    };
    let Some(header) = bytes.get(8..end) else {
        return bytes;
    };
    // serde_json's map is a BTreeMap (no `preserve_order` in this build):
    // written back, every object's keys come sorted.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(header) else {
        return bytes;
    };
    let mut sorted = serde_json::to_vec(&value).expect("a parsed value serialises");
    if sorted.len() > header.len() {
        return bytes;
    }
    sorted.resize(header.len(), b' ');
    bytes[8..end].copy_from_slice(&sorted);
    bytes
}

/// `to` as a hard link of rank `source`'s copy `from` (in its temporary
/// directory, written and synced before this is called), or, where that
/// cannot be (another filesystem after all, a file that is not there or
/// not `bytes.len()` long), `bytes` written and synced there. Whether it
/// was linked.
pub(super) fn link_or_write(from: &Path, to: &Path, bytes: &[u8]) -> Result<bool, TrainError> {
    let same_size = fs::metadata(from).is_ok_and(|m| m.len() == bytes.len() as u64);
    if same_size && fs::hard_link(from, to).is_ok() {
        return Ok(true);
    }
    write_synced(to, bytes)?;
    Ok(false)
}

/// `bytes` written to `path` and synced.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    use std::io::Write;
    let mut file = fs::File::create(path).map_err(super::io(path))?;
    file.write_all(bytes).map_err(super::io(path))?;
    file.sync_all().map_err(super::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use terse_comm::LocalComm;

    fn sources(sharing: [&[usize]; 4], digests: [&[&str]; 4]) -> Vec<Vec<Option<usize>>> {
        LocalComm::run(4, Duration::from_secs(10), |comm| {
            let own: Vec<String> = digests[comm.rank()].iter().map(|d| d.to_string()).collect();
            link_sources(comm, sharing[comm.rank()], &own).unwrap()
        })
        .into_iter()
        .map(Result::unwrap)
        .collect()
    }

    #[test]
    fn a_file_links_the_lowest_rank_with_its_digest_on_its_filesystem() {
        // All four on one filesystem: the models ("m") alike, rank 2's
        // optimizer file differs from the others'.
        let all: &[usize] = &[0, 1, 2, 3];
        assert_eq!(
            sources(
                [all; 4],
                [&["m", "o"], &["m", "o"], &["m", "x"], &["m", "o"]]
            ),
            [
                vec![None, None],
                vec![Some(0), Some(0)],
                vec![Some(0), None],
                vec![Some(0), Some(0)],
            ]
        );
        // Two nodes' disks, {0, 1} and {2, 3}: each node keeps one copy.
        let (a, b): (&[usize], &[usize]) = (&[0, 1], &[2, 3]);
        assert_eq!(
            sources([a, a, b, b], [&["m"], &["m"], &["m"], &["m"]]),
            [vec![None], vec![Some(0)], vec![None], vec![Some(2)]]
        );
        // Lists of different lengths: every rank writes its own.
        assert_eq!(
            sources([all; 4], [&["m"], &["m", "o"], &["m"], &["m"]]),
            [vec![None], vec![None, None], vec![None], vec![None]]
        );
    }

    #[test]
    fn a_safetensors_header_is_written_in_one_order() {
        let data = [1.0f32, 2.0, 3.0];
        let serialised = |order: &[(&str, &str)]| {
            // A HashMap per file, as the writers build them: its order is
            // the map's own.
            let metadata: std::collections::HashMap<String, String> = order
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![3],
                bytemuck::cast_slice(&data),
            )
            .unwrap();
            let other = view.clone();
            safetensors::serialize([("b", view), ("a", other)], Some(metadata)).unwrap()
        };
        let pairs: Vec<(String, String)> = (0..12)
            .map(|i| (format!("key{i}"), format!("value {i}")))
            .collect();
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let reversed: Vec<(&str, &str)> = pairs.iter().rev().copied().collect();
        let files: Vec<Vec<u8>> = (0..8)
            .map(|i| serialised(if i % 2 == 0 { &pairs } else { &reversed }))
            .collect();
        assert!(
            files.iter().any(|f| f != &files[0]),
            "the writer's order no longer varies: this test shows nothing"
        );
        let canonical: Vec<Vec<u8>> = files.into_iter().map(canonical_safetensors).collect();
        assert!(canonical.iter().all(|f| f == &canonical[0]));
        // Still a safetensors file with the same tensors and metadata.
        let read = safetensors::SafeTensors::deserialize(&canonical[0]).unwrap();
        assert_eq!(
            read.tensor("a").unwrap().data(),
            bytemuck::cast_slice::<f32, u8>(&data)
        );
        let (_, header) = safetensors::SafeTensors::read_metadata(&canonical[0]).unwrap();
        assert_eq!(header.metadata().as_ref().unwrap()["key7"], "value 7");
        // Anything else is left alone.
        assert_eq!(
            canonical_safetensors(b"rank 0 at step 4".to_vec()),
            b"rank 0 at step 4"
        );
        assert_eq!(canonical_safetensors(vec![1, 2]), [1, 2]);
    }

    #[test]
    fn a_copy_that_is_missing_or_of_another_size_is_written_instead() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        fs::write(&source, b"abc").unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();

        let linked = dir.path().join("linked");
        assert!(link_or_write(&source, &linked, b"abc").unwrap());
        assert_eq!(ino(&linked), ino(&source));

        let other = dir.path().join("other-size");
        assert!(!link_or_write(&source, &other, b"abcd").unwrap());
        assert_ne!(ino(&other), ino(&source));
        assert_eq!(fs::read(&other).unwrap(), b"abcd");

        let missing = dir.path().join("from-missing");
        assert!(!link_or_write(&dir.path().join("nothing"), &missing, b"xyz").unwrap());
        assert_eq!(fs::read(&missing).unwrap(), b"xyz");
    }
}
