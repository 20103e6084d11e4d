//! The IDX format of MNIST and Fashion-MNIST (LeCun et al.): a big-endian
//! header `0x00 0x00 <type> <rank>` followed by `rank` u32 dimensions and the
//! values, here unsigned bytes (`type = 0x08`). Files may be gzip-compressed.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use crate::DataError;

/// Images of an IDX file: `count` row-major `rows × cols` byte images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
    /// `count · rows · cols` pixels, image after image.
    pub pixels: Vec<u8>,
}

impl IdxImages {
    /// The pixels of image `i`.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.rows * self.cols;
        &self.pixels[i * n..(i + 1) * n]
    }
}

/// Reads a rank-3 unsigned-byte IDX file (gzip-compressed or not).
pub fn read_idx_images(path: &Path) -> Result<IdxImages, DataError> {
    let (dims, pixels) = read_idx(path, 3)?;
    Ok(IdxImages {
        count: dims[0],
        rows: dims[1],
        cols: dims[2],
        pixels,
    })
}

/// Reads a rank-1 unsigned-byte IDX file of labels (gzip-compressed or not).
pub fn read_idx_labels(path: &Path) -> Result<Vec<u8>, DataError> {
    Ok(read_idx(path, 1)?.1)
}

fn read_idx(path: &Path, rank: usize) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| format_error(path, format!("corrupt gzip stream: {e}")))?;
        out
    } else {
        raw
    };
    parse_idx(&bytes, rank).map_err(|detail| format_error(path, detail))
}

/// Parses IDX bytes of the given rank; the error says which header field or
/// byte range is wrong.
fn parse_idx(bytes: &[u8], rank: usize) -> Result<(Vec<usize>, Vec<u8>), String> {
    let header_len = 4 + 4 * rank;
    if bytes.len() < header_len {
        return Err(format!(
            "{} bytes is shorter than a rank-{rank} IDX header ({header_len} bytes)",
            bytes.len()
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(format!(
            "bad magic number {:02x}{:02x}{:02x}{:02x} (expected 0000xxxx)",
            bytes[0], bytes[1], bytes[2], bytes[3]
        ));
    }
    if bytes[2] != 0x08 {
        return Err(format!(
            "value type 0x{:02x} is not unsigned byte (0x08)",
            bytes[2]
        ));
    }
    if usize::from(bytes[3]) != rank {
        return Err(format!("rank {} in the header, expected {rank}", bytes[3]));
    }
    let dims: Vec<usize> = bytes[4..header_len]
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let expected = dims.iter().product::<usize>();
    let body = &bytes[header_len..];
    if body.len() != expected {
        return Err(format!(
            "header dimensions {dims:?} need {expected} bytes of data, file has {}",
            body.len()
        ));
    }
    Ok((dims, body.to_vec()))
}

fn format_error(path: &Path, detail: String) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two 2×3 images, written byte by byte in the layout of the IDX spec.
    const TWO_IMAGES: [u8; 28] = [
        0x00, 0x00, 0x08, 0x03, // magic: unsigned byte, rank 3
        0x00, 0x00, 0x00, 0x02, // 2 images
        0x00, 0x00, 0x00, 0x02, // 2 rows
        0x00, 0x00, 0x00, 0x03, // 3 columns
        1, 2, 3, 4, 5, 6, //
        7, 8, 9, 10, 11, 255,
    ];

    #[test]
    fn parses_the_spec_layout() {
        let (dims, values) = parse_idx(&TWO_IMAGES, 3).unwrap();
        assert_eq!(dims, [2, 2, 3]);
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 255]);
    }

    #[test]
    fn reads_gzip_and_plain_files_alike() {
        use std::io::Write;
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let plain = dir.join("images-idx3-ubyte");
        std::fs::write(&plain, TWO_IMAGES).unwrap();
        let gz = dir.join("images-idx3-ubyte.gz");
        let mut encoder =
            flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), Default::default());
        encoder.write_all(&TWO_IMAGES).unwrap();
        encoder.finish().unwrap();
        let a = read_idx_images(&plain).unwrap();
        let b = read_idx_images(&gz).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.image(1), [7, 8, 9, 10, 11, 255]);
    }

    #[test]
    fn malformed_headers_are_named() {
        assert!(parse_idx(&TWO_IMAGES, 1).unwrap_err().contains("rank 3"));
        assert!(
            parse_idx(&TWO_IMAGES[..27], 3)
                .unwrap_err()
                .contains("need 12 bytes")
        );
        let mut wrong_type = TWO_IMAGES;
        wrong_type[2] = 0x0d;
        assert!(parse_idx(&wrong_type, 3).unwrap_err().contains("0x0d"));
        assert!(parse_idx(&[0, 0], 3).unwrap_err().contains("shorter"));
    }
}
