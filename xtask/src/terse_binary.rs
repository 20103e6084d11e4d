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

/// Builds the `terse` binary in the one profile and returns its path.
pub fn build() -> Result<std::path::PathBuf> {
    let output = cargo()
        .args(["build", "--package", "terse-cli", "--bin", "terse"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot start cargo to build `terse`")?;
    if !output.status.success() {
        bail!("building `terse` failed ({})", output.status);
    }
    executable(&String::from_utf8_lossy(&output.stdout), "terse")
}

/// Runs `terse <args…>` on `ranks` ranks: itself for one, through `mpirun`
/// for more (one process per rank).
pub fn launch(ranks: usize, args: &[String]) -> Result<()> {
    let exe = build()?;
    if ranks > 1 {
        crate::mpi::require_mpirun()?;
        return crate::mpi::launch(ranks, &exe, args);
    }
    let status = Command::new(&exe)
        .args(args)
        .status()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    if !status.success() {
        bail!("`terse {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The executable cargo reported for target `name` in its JSON messages.
fn executable(messages: &str, name: &str) -> Result<std::path::PathBuf> {
    let marker = format!("\"name\":\"{name}\"");
    messages
        .lines()
        .filter(|line| line.contains(&marker) && line.contains("\"executable\":\""))
        .find_map(|line| {
            let start = line.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = start + line[start..].find('"')?;
            Some(std::path::PathBuf::from(&line[start..end]))
        })
        .with_context(|| format!("cargo did not report an executable for `{name}`"))
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
    executable(&String::from_utf8_lossy(&output.stdout), bench)
}
