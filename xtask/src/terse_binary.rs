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

/// Builds bench target `bench` (harness-less, in the one profile) and
/// returns the path of its executable, read from cargo's JSON messages.
/// `--workspace` resolves features exactly as `cargo test --workspace` does,
/// so the build reuses the tests' artifacts instead of rebuilding burn.
pub fn build_bench(bench: &str) -> Result<std::path::PathBuf> {
    let output = cargo()
        .args(["test", "--workspace", "--bench", bench, "--no-run"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start cargo to build bench `{bench}`"))?;
    if !output.status.success() {
        bail!("building bench `{bench}` failed ({})", output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let marker = format!("\"name\":\"{bench}\"");
    stdout
        .lines()
        .filter(|line| line.contains(&marker) && line.contains("\"executable\":\""))
        .find_map(|line| {
            let start = line.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = start + line[start..].find('"')?;
            Some(std::path::PathBuf::from(&line[start..end]))
        })
        .with_context(|| format!("cargo did not report an executable for bench `{bench}`"))
}
