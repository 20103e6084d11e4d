//! Builds and runs the per-rank `terse` binary.
//!
//! It goes through `cargo run` in the workspace's dev profile (dependencies at
//! opt-level 3): the one profile CI and the tests build, so a command after
//! `cargo test` compiles only the binary itself.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs `terse <args…>` on one rank, inheriting stdin, stdout and stderr.
pub fn run(args: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .args([
            "run",
            "--quiet",
            "--package",
            "terse-cli",
            "--bin",
            "terse",
            "--",
        ])
        .args(args)
        .status()
        .context("cannot start cargo to build and run `terse`")?;
    if !status.success() {
        bail!("`terse {}` failed ({status})", args.join(" "));
    }
    Ok(())
}
