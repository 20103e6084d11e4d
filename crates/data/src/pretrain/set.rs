//! All shards of a directory as one indexable set of examples.

use std::path::{Path, PathBuf};

use super::instances::PretrainExample;
use super::shard::{Shard, ShardHeader};
use crate::DataError;

/// The `*.shard` files of a directory, in name order, as one sequence.
#[derive(Debug)]
pub struct ShardSet {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// Index of the first example of each shard, and the total at the end.
    starts: Vec<usize>,
}

impl ShardSet {
    /// Opens every shard of `dir`; they must agree on `max_seq`,
    /// `max_predictions` and the vocabulary.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        let paths = super::files_with_extension(dir, "shard")?;
        if paths.is_empty() {
            return Err(DataError::Format {
                path: dir.to_path_buf(),
                detail: "no *.shard files".into(),
            });
        }
        let shards = paths
            .iter()
            .map(|p| Shard::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        let first = shards[0].header();
        for (shard, path) in shards.iter().zip(&paths) {
            let h = shard.header();
            if (h.max_seq, h.max_predictions, h.vocab_size)
                != (first.max_seq, first.max_predictions, first.vocab_size)
            {
                return Err(DataError::Format {
                    path: path.clone(),
                    detail: format!(
                        "max_seq {}, max_predictions {}, vocabulary {} differ from {}'s",
                        h.max_seq,
                        h.max_predictions,
                        h.vocab_size,
                        paths[0].display()
                    ),
                });
            }
        }
        let mut starts = vec![0];
        for shard in &shards {
            starts.push(starts.last().expect("non-empty") + shard.len());
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            shards,
            starts,
        })
    }

    /// The shared parameters (count = the whole set's).
    pub fn header(&self) -> ShardHeader {
        ShardHeader {
            count: self.len(),
            ..self.shards[0].header()
        }
    }

    /// Examples in all shards.
    pub fn len(&self) -> usize {
        *self.starts.last().expect("non-empty")
    }

    /// Whether there is no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `i` of the whole set (shards in name order, each in file
    /// order), unpadded: `input_ids` has the example's own length and the
    /// masked lists their own count; the shard's zero padding is dropped.
    pub fn get(&self, i: usize) -> Result<PretrainExample, DataError> {
        if i >= self.len() {
            return Err(DataError::Format {
                path: self.dir.clone(),
                detail: format!("example {i} out of range (the set has {})", self.len()),
            });
        }
        // The shard whose range holds i: the last start ≤ i. Empty shards
        // share their start with the next one and are skipped by `<=`.
        let s = self.starts.partition_point(|&start| start <= i) - 1;
        self.shards[s].get(i - self.starts[s])
    }
}
