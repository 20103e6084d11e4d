//! Builds and runs the per-rank `terse` binary.
//!
//! It goes through `cargo run` in the workspace's dev profile (dependencies at
//! opt-level 3): the one profile CI and the tests build, so a command after
//! `cargo test` compiles only the binary itself.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// A `cargo` command: the one running this xtask (`$CARGO`), else from `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

/// Runs `terse <args…>` on one rank, inheriting stdin, stdout and stderr.
pub fn run(args: &[String]) -> Result<()> {
    let status = cargo()
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
