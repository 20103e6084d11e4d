//! Running a tool xtask needs (apt-get, cargo, tar) to its end: one way to
//! say that it could not start or that it failed, naming it, so that each
//! caller does not check the exit status by hand.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs `command`, inheriting stdin, stdout and stderr, and fails unless
/// it exits with status 0; `what` names it in the errors (`` `tar` ``).
pub fn finish(command: &mut Command, what: &str) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot start {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
