//! The shard file: pre-training examples in fixed-size records with a
//! checksum, read into memory when opened.
//!
//! Opening reads the whole file and checks its CRC-32C, so a shard altered
//! or truncated after it was written (a bad disk, an edit, a copy cut
//! short) is an error naming the file rather than wrong examples trained
//! on silently. Reading instead of memory-mapping also means a file
//! truncated while a run holds it cannot end the run with SIGBUS; the
//! shards of the corpora here are tens of MB, a corpus of many GB would
//! want a mapping checked page range by page range instead.
//!
//! Layout (little-endian):
//! ```text
//! header, 64 bytes:
//!   0  magic  b"TRSPRE01"
//!   8  u32    format version (2; version 1 had no checksum)
//!  12  u32    max_seq
//!  16  u32    max_predictions
//!  20  u32    bytes per token id (2 when the vocabulary fits in u16, else 4)
//!  24  u32    vocabulary size
//!  28  u32    reserved (0)
//!  32  u64    number of examples
//!  40  u32    CRC-32C of every byte after the header
//!  44  20 bytes reserved (0)
//! record, for each example:
//!   u16 length (tokens, [CLS] and both [SEP] included)
//!   u16 segment_a_len ([CLS] A [SEP])
//!   u16 number of masked positions
//!   u8  is_random_next, u8 reserved (0)
//!   max_seq token ids (zero-padded)
//!   max_predictions u16 positions, then max_predictions label ids (zero-padded)
//! ```
//! A file is written under a temporary name and renamed when complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::instances::PretrainExample;
use super::masking::MaskedLm;
use crate::DataError;

const MAGIC: &[u8; 8] = b"TRSPRE01";
/// The format version; part of the shard cache's key, so a version change
/// makes new shards instead of refusing old ones.
pub const VERSION: u32 = 2;
const HEADER: usize = 64;

/// The fixed parameters of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    /// Tokens per record.
    pub max_seq: usize,
    /// Masked positions per record.
    pub max_predictions: usize,
    /// Token ids are below this.
    pub vocab_size: u32,
    /// Examples in the file.
    pub count: usize,
}

impl ShardHeader {
    fn id_bytes(&self) -> usize {
        if self.vocab_size <= 1 << 16 { 2 } else { 4 }
    }

    /// Bytes per record.
    pub fn record_bytes(&self) -> usize {
        8 + self.max_seq * self.id_bytes() + self.max_predictions * (2 + self.id_bytes())
    }
}

fn put_id(out: &mut Vec<u8>, id: u32, bytes: usize) {
    out.extend_from_slice(&id.to_le_bytes()[..bytes]);
}

/// Writes `examples` to `path` (via `path.tmp`, renamed when complete).
pub fn write_shard(
    path: &Path,
    examples: &[PretrainExample],
    max_seq: usize,
    max_predictions: usize,
    vocab_size: u32,
) -> Result<(), DataError> {
    let header = ShardHeader {
        max_seq,
        max_predictions,
        vocab_size,
        count: examples.len(),
    };
    let ib = header.id_bytes();
    let mut out = Vec::with_capacity(HEADER + examples.len() * header.record_bytes());
    out.extend_from_slice(MAGIC);
    for v in [
        VERSION,
        max_seq as u32,
        max_predictions as u32,
        ib as u32,
        vocab_size,
        0,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(examples.len() as u64).to_le_bytes());
    out.resize(HEADER, 0);
    if max_seq > usize::from(u16::MAX) || max_predictions > usize::from(u16::MAX) {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            detail: format!(
                "max_seq {max_seq} and max_predictions {max_predictions} must fit the u16 length fields"
            ),
        });
    }
    for (i, e) in examples.iter().enumerate() {
        // Refuse what the reader would refuse, so a written shard always reads.
        if let Some(problem) = invalid(e, &header) {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                detail: format!("example {i}: {problem}"),
            });
        }
        let (n, m) = (e.input_ids.len(), e.masked.positions.len());
        for v in [n as u16, e.segment_a_len as u16, m as u16] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&[u8::from(e.is_random_next), 0]);
        for k in 0..max_seq {
            put_id(&mut out, e.input_ids.get(k).copied().unwrap_or(0), ib);
        }
        for k in 0..max_predictions {
            out.extend_from_slice(
                &e.masked
                    .positions
                    .get(k)
                    .copied()
                    .unwrap_or(0)
                    .to_le_bytes(),
            );
        }
        for k in 0..max_predictions {
            put_id(&mut out, e.masked.labels.get(k).copied().unwrap_or(0), ib);
        }
    }
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| DataError::Io { path: p, source }
    };
    let crc = crc32c::crc32c(&out[HEADER..]);
    out[40..44].copy_from_slice(&crc.to_le_bytes());
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(&out).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// What makes `e` unfit for a shard of `h`, if anything: the rules the
/// reader checks on every record.
fn invalid(e: &PretrainExample, h: &ShardHeader) -> Option<String> {
    let (n, m, a_len) = (e.input_ids.len(), e.masked.positions.len(), e.segment_a_len);
    if n > h.max_seq || m > h.max_predictions || m != e.masked.labels.len() {
        return Some(format!(
            "length {n} (at most {}), {m} masked positions and {} labels (at most {})",
            h.max_seq,
            e.masked.labels.len(),
            h.max_predictions
        ));
    }
    if a_len < 2 || a_len >= n {
        return Some(format!(
            "segment A length {a_len} outside 2..{n} ([CLS] A [SEP] before B [SEP])"
        ));
    }
    if let Some(t) = e
        .input_ids
        .iter()
        .chain(&e.masked.labels)
        .find(|&&t| t >= h.vocab_size)
    {
        return Some(format!("token id {t} ≥ vocabulary size {}", h.vocab_size));
    }
    if let Some(p) = e.masked.positions.iter().find(|&&p| p as usize >= n) {
        return Some(format!("masked position {p} ≥ length {n}"));
    }
    None
}

/// A shard, read and checked.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    map: Vec<u8>,
    header: ShardHeader,
}

impl Shard {
    /// Reads the file and checks its header, size and checksum.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let bad = |detail: String| DataError::Format {
            path: path.to_path_buf(),
            detail,
        };
        let map = std::fs::read(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if map.len() < HEADER || &map[..8] != MAGIC {
            return Err(bad("not a terse pre-training shard (bad magic)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(map[o..o + 4].try_into().expect("4 bytes"));
        if u32_at(8) != VERSION {
            return Err(bad(format!(
                "format version {}, expected {VERSION}",
                u32_at(8)
            )));
        }
        let count = u64::from_le_bytes(map[32..40].try_into().expect("8 bytes")) as usize;
        let header = ShardHeader {
            max_seq: u32_at(12) as usize,
            max_predictions: u32_at(16) as usize,
            vocab_size: u32_at(24),
            count,
        };
        if u32_at(20) as usize != header.id_bytes() || header.max_seq < 3 {
            return Err(bad(format!(
                "header: id width {} for vocabulary {}, max_seq {}",
                u32_at(20),
                header.vocab_size,
                header.max_seq
            )));
        }
        let expected = count
            .checked_mul(header.record_bytes())
            .and_then(|b| b.checked_add(HEADER));
        if expected != Some(map.len()) {
            return Err(bad(format!(
                "{} bytes, but the header promises {count} records of {} bytes after {HEADER} (truncated or corrupted)",
                map.len(),
                header.record_bytes()
            )));
        }
        let stored = u32_at(40);
        let actual = crc32c::crc32c(&map[HEADER..]);
        if stored != actual {
            return Err(bad(format!(
                "checksum {actual:08x}, but the header says {stored:08x}: the file changed \
                 after it was written"
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    /// The header.
    pub fn header(&self) -> ShardHeader {
        self.header
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.header.count
    }

    /// Whether the shard has no example.
    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// Example `i`, checked (a corrupted record is an error naming it).
    pub fn get(&self, i: usize) -> Result<PretrainExample, DataError> {
        let h = self.header;
        let bad = |detail: String| DataError::Format {
            path: self.path.clone(),
            detail: format!("record {i}: {detail}"),
        };
        if i >= h.count {
            return Err(bad(format!("out of range (the shard has {})", h.count)));
        }
        let ib = h.id_bytes();
        let r = &self.map[HEADER + i * h.record_bytes()..HEADER + (i + 1) * h.record_bytes()];
        let u16_at = |o: usize| u16::from_le_bytes([r[o], r[o + 1]]) as usize;
        let id_at = |o: usize| {
            let mut b = [0u8; 4];
            b[..ib].copy_from_slice(&r[o..o + ib]);
            u32::from_le_bytes(b)
        };
        let (n, a_len, m) = (u16_at(0), u16_at(2), u16_at(4));
        if n > h.max_seq || m > h.max_predictions || a_len < 2 || a_len >= n || r[6] > 1 {
            return Err(bad(format!(
                "length {n}, segment A {a_len}, {m} masked, NSP byte {}",
                r[6]
            )));
        }
        let input_ids: Vec<u32> = (0..n).map(|k| id_at(8 + k * ib)).collect();
        let positions_at = 8 + h.max_seq * ib;
        let labels_at = positions_at + 2 * h.max_predictions;
        let positions: Vec<u16> = (0..m)
            .map(|k| u16_at(positions_at + 2 * k) as u16)
            .collect();
        let labels: Vec<u32> = (0..m).map(|k| id_at(labels_at + k * ib)).collect();
        let example = PretrainExample {
            input_ids,
            segment_a_len: a_len,
            masked: MaskedLm { positions, labels },
            is_random_next: r[6] == 1,
        };
        match invalid(&example, &h) {
            Some(problem) => Err(bad(problem)),
            None => Ok(example),
        }
    }
}
