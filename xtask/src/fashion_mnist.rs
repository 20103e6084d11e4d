//! Fashion-MNIST for the commands that train on it: Debian's
//! `dataset-fashion-mnist` package (the only registry that ships it here),
//! installed with the other system packages (system_packages.rs), and
//! checked file by file against the checksums recorded below, so a truncated
//! or altered file is named instead of silently training on it.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use md5::{Digest, Md5};

/// Where the package puts the files.
pub const DIR: &str = "/usr/share/datasets/fashion-mnist";
const PACKAGE: &str = "dataset-fashion-mnist";

/// `(file, bytes, md5)` of the package's files, read off the Debian 12 package
/// (the gzip files are Debian's own compression of the official IDX data).
const FILES: [(&str, u64, &str); 4] = [
    (
        "train-images-idx3-ubyte.gz",
        26_421_856,
        "cf8536b0aa1a6ac5fa3f23001093305c",
    ),
    (
        "train-labels-idx1-ubyte.gz",
        29_491,
        "10bea18fdb374794d4bb42e356e600c9",
    ),
    (
        "t10k-images-idx3-ubyte.gz",
        4_422_079,
        "f78720b4224f21cce2f2ccf2d7a94c9a",
    ),
    (
        "t10k-labels-idx1-ubyte.gz",
        5_125,
        "0d30e22e447f3c33dab9ed536400ac01",
    ),
];

/// Makes sure the dataset is installed and intact; returns its directory.
pub fn ensure() -> Result<PathBuf> {
    let dir = PathBuf::from(DIR);
    if !FILES.iter().all(|(name, _, _)| dir.join(name).is_file()) {
        // The package is on the system package list: installed (as root)
        // or named in the install line there.
        crate::system_packages::ensure()?;
    }
    for (name, bytes, md5) in FILES {
        let path = dir.join(name);
        let data =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let actual = format!("{:x}", Md5::digest(&data));
        if data.len() as u64 != bytes || actual != md5 {
            bail!(
                "{} is corrupt: {} bytes with md5 {actual}, expected {bytes} bytes with md5 {md5}; \
                 reinstall with `apt-get install --reinstall {PACKAGE}`",
                path.display(),
                data.len()
            );
        }
    }
    eprintln!("data: Fashion-MNIST in {DIR} (4 files, md5 verified)");
    Ok(dir)
}
