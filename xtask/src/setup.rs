//! `cargo xtask setup`: the system packages alone, without building.
//!
//! Every command that builds checks them anyway; this is for preparing a
//! machine (a CI image, a node of a cluster) and is what `.ci/run` calls, so
//! CI installs exactly the list the commands check (system-packages.txt).

use anyhow::Result;

use crate::system_packages;

/// Runs `setup`.
pub fn run() -> Result<()> {
    system_packages::ensure()?;
    eprintln!(
        "terse: system packages installed: {}",
        system_packages::packages().join(" ")
    );
    Ok(())
}
