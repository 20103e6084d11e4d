//! The binary version of CIFAR-10 and CIFAR-100 (Krizhevsky 2009,
//! <https://www.cs.toronto.edu/~kriz/cifar.html>): fixed records of the
//! label byte(s) followed by 3,072 pixels, the red, green and blue 32×32
//! planes in row-major order — already the CHW layout training wants.
//! CIFAR-10: `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`,
//! records of 1 label byte (0–9). CIFAR-100: `train.bin` and `test.bin`,
//! records of a coarse (0–19) and a fine (0–99) label byte; the fine label
//! is the class.

use std::path::Path;

use super::ImageSet;
use crate::DataError;

const PIXELS: usize = 3 * 32 * 32;

/// Which CIFAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CifarKind {
    /// 10 classes, one label byte.
    Cifar10,
    /// 100 fine classes (20 coarse), two label bytes.
    Cifar100,
}

impl CifarKind {
    fn label_bytes(self) -> usize {
        match self {
            CifarKind::Cifar10 => 1,
            CifarKind::Cifar100 => 2,
        }
    }

    /// Bytes per record.
    pub fn record_bytes(self) -> usize {
        self.label_bytes() + PIXELS
    }

    /// The files of a split (`train` or `test`).
    pub fn files(self, train: bool) -> Vec<&'static str> {
        match (self, train) {
            (CifarKind::Cifar10, true) => vec![
                "data_batch_1.bin",
                "data_batch_2.bin",
                "data_batch_3.bin",
                "data_batch_4.bin",
                "data_batch_5.bin",
            ],
            (CifarKind::Cifar10, false) => vec!["test_batch.bin"],
            (CifarKind::Cifar100, true) => vec!["train.bin"],
            (CifarKind::Cifar100, false) => vec!["test.bin"],
        }
    }
}

/// Reads one binary file; labels are the class (CIFAR-100: the fine label).
pub fn read_cifar_file(path: &Path, kind: CifarKind) -> Result<ImageSet, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let record = kind.record_bytes();
    let bad = |detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail,
    };
    if bytes.is_empty() || bytes.len() % record != 0 {
        return Err(bad(format!(
            "{} bytes is not a whole number of {record}-byte {kind:?} records",
            bytes.len()
        )));
    }
    let count = bytes.len() / record;
    let mut set = ImageSet {
        channels: 3,
        height: 32,
        width: 32,
        pixels: Vec::with_capacity(count * PIXELS),
        labels: Vec::with_capacity(count),
    };
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        let (label, limit, at) = match kind {
            CifarKind::Cifar10 => (r[0], 10, 0),
            CifarKind::Cifar100 => {
                if r[0] >= 20 {
                    return Err(bad(format!(
                        "record {i} (byte {}): coarse label {} is not in 0..20",
                        i * record,
                        r[0]
                    )));
                }
                (r[1], 100, 1)
            }
        };
        if label >= limit {
            return Err(bad(format!(
                "record {i} (byte {}): label {label} is not in 0..{limit}",
                i * record + at
            )));
        }
        set.labels.push(u16::from(label));
        set.pixels.extend_from_slice(&r[kind.label_bytes()..]);
    }
    Ok(set)
}

/// Reads every file of a split from the extracted `cifar-10-batches-bin/`
/// or `cifar-100-binary/` directory, in order.
pub fn read_cifar_split(dir: &Path, kind: CifarKind, train: bool) -> Result<ImageSet, DataError> {
    let mut all: Option<ImageSet> = None;
    for name in kind.files(train) {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(DataError::Format {
                path,
                detail: format!("missing: {kind:?} needs {}", kind.files(train).join(", ")),
            });
        }
        let set = read_cifar_file(&path, kind)?;
        match &mut all {
            None => all = Some(set),
            Some(all) => {
                all.pixels.extend_from_slice(&set.pixels);
                all.labels.extend_from_slice(&set.labels);
            }
        }
    }
    Ok(all.expect("every split has a file"))
}
