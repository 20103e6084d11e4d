//! The binary version of CIFAR-10 and CIFAR-100 (Krizhevsky 2009,
//! <https://www.cs.toronto.edu/~kriz/cifar.html>, "Binary version"): fixed
//! records of the label byte(s) followed by 3,072 pixels, the red, green and
//! blue 32×32 planes each in row-major order — already the CHW layout
//! training wants, so a record's pixels are copied as they are.
//!
//! - CIFAR-10 (`cifar-10-batches-bin/`): `data_batch_1.bin` …
//!   `data_batch_5.bin` (10,000 records each) and `test_batch.bin`; records
//!   of 1 label byte (0–9) + 3,072 pixels = 3,073 bytes.
//! - CIFAR-100 (`cifar-100-binary/`): `train.bin` (50,000) and `test.bin`
//!   (10,000); records of a coarse label byte (0–19), a fine label byte
//!   (0–99) + 3,072 pixels = 3,074 bytes. The fine label is the class.
//!
//! No package registry ships the real files, so the tests write files in
//! this layout and read a committed three-record fixture.

use std::path::Path;

use super::ImageSet;
use crate::DataError;

/// Pixels per record: 3 channels of 32×32.
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
    /// The dataset's name, as error messages give it.
    pub fn name(self) -> &'static str {
        match self {
            CifarKind::Cifar10 => "CIFAR-10",
            CifarKind::Cifar100 => "CIFAR-100",
        }
    }

    /// Label bytes at the start of each record.
    pub fn label_bytes(self) -> usize {
        match self {
            CifarKind::Cifar10 => 1,
            CifarKind::Cifar100 => 2,
        }
    }

    /// Number of classes (CIFAR-100: fine classes).
    pub fn classes(self) -> u16 {
        match self {
            CifarKind::Cifar10 => 10,
            CifarKind::Cifar100 => 100,
        }
    }

    /// Bytes per record: the label bytes and 3,072 pixels.
    pub fn record_bytes(self) -> usize {
        self.label_bytes() + PIXELS
    }

    /// The file names of a split (`train = true` for training), in the
    /// order their records are concatenated.
    pub fn files(self, train: bool) -> &'static [&'static str] {
        match (self, train) {
            (CifarKind::Cifar10, true) => &[
                "data_batch_1.bin",
                "data_batch_2.bin",
                "data_batch_3.bin",
                "data_batch_4.bin",
                "data_batch_5.bin",
            ],
            (CifarKind::Cifar10, false) => &["test_batch.bin"],
            (CifarKind::Cifar100, true) => &["train.bin"],
            (CifarKind::Cifar100, false) => &["test.bin"],
        }
    }
}

/// Reads one binary file into a 3×32×32 set; labels are the class
/// (CIFAR-100: the fine label, after checking the coarse one).
pub fn read_cifar_file(path: &Path, kind: CifarKind) -> Result<ImageSet, DataError> {
    let mut set = empty_set();
    append_file(path, kind, &mut set)?;
    Ok(set)
}

/// A 3×32×32 set without images yet.
fn empty_set() -> ImageSet {
    ImageSet {
        channels: 3,
        height: 32,
        width: 32,
        pixels: Vec::new(),
        labels: Vec::new(),
    }
}

/// Appends the records of the file at `path`; errors name the file.
fn append_file(path: &Path, kind: CifarKind, set: &mut ImageSet) -> Result<(), DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    append_records(&bytes, kind, set).map_err(|detail| DataError::Format {
        path: path.to_path_buf(),
        detail,
    })
}

/// Reads every file of a split from the extracted `cifar-10-batches-bin/`
/// or `cifar-100-binary/` directory, concatenated in [`CifarKind::files`]
/// order. A missing file is named before any file is read.
pub fn read_cifar_split(dir: &Path, kind: CifarKind, train: bool) -> Result<ImageSet, DataError> {
    let files = kind.files(train);
    for name in files {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(DataError::Format {
                path,
                detail: format!(
                    "missing: the {} {} split is {}",
                    kind.name(),
                    if train { "training" } else { "test" },
                    files.join(", ")
                ),
            });
        }
    }
    let mut set = empty_set();
    for name in files {
        append_file(&dir.join(name), kind, &mut set)?;
    }
    Ok(set)
}

/// Appends the records of one file's bytes to `set`; the error names the
/// record (0-based) and the byte offset of the bad label in the file.
fn append_records(bytes: &[u8], kind: CifarKind, set: &mut ImageSet) -> Result<(), String> {
    let record = kind.record_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(format!(
            "{} bytes is not a whole number of {record}-byte {} records \
             ({} label byte(s) + {PIXELS} pixels)",
            bytes.len(),
            kind.name(),
            kind.label_bytes()
        ));
    }
    let count = bytes.len() / record;
    set.pixels.reserve(count * PIXELS);
    set.labels.reserve(count);
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        let start = i * record;
        if kind == CifarKind::Cifar100 && r[0] >= 20 {
            return Err(format!(
                "record {i} (byte {start}): coarse label {} is not in 0..20",
                r[0]
            ));
        }
        // The class is the last label byte: CIFAR-10's only one, CIFAR-100's fine one.
        let at = kind.label_bytes() - 1;
        let label = u16::from(r[at]);
        if label >= kind.classes() {
            return Err(format!(
                "record {i} (byte {}): label {label} is not in 0..{}",
                start + at,
                kind.classes()
            ));
        }
        set.labels.push(label);
        set.pixels.extend_from_slice(&r[kind.label_bytes()..]);
    }
    Ok(())
}
