//! `cargo xtask test`: the test suite, runnable on a fresh machine.
//!
//! `cargo test --workspace` alone fails there inside `mpi-sys` after half an
//! hour of compiling; this command checks (and as root installs) the system
//! packages first, then runs exactly `cargo test --workspace` with any extra
//! arguments passed through (`cargo xtask test --test pretrain_mpi`,
//! `cargo xtask test -- --nocapture`). The workspace's feature set is the one
//! `terse` is built with (terse_binary.rs), so after a training command only
//! the workspace's own crates and test targets compile.

use anyhow::Result;

use crate::terse_binary;

/// Arguments of `cargo xtask test`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// Passed to `cargo test --workspace` as they are (test names, `--test NAME`, `-- --nocapture`)
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CARGO_TEST_ARGS"
    )]
    pub args: Vec<String>,
}

/// `cargo`'s arguments for the suite.
fn cargo_args(args: &Args) -> Vec<String> {
    ["test", "--workspace"]
        .into_iter()
        .map(String::from)
        .chain(args.args.iter().cloned())
        .collect()
}

/// Runs `test`.
pub fn run(args: &Args) -> Result<()> {
    let cargo_args = cargo_args(args);
    let mut cargo = terse_binary::cargo()?;
    cargo.args(&cargo_args);
    if crate::system_packages::is_root() {
        // The MPI tests start real `mpirun` jobs, which OpenMPI refuses as
        // root (containers, CI) unless told twice.
        cargo.env("OMPI_ALLOW_RUN_AS_ROOT", "1");
        cargo.env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    crate::finish::finish(&mut cargo, &format!("`cargo {}`", cargo_args.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn runs_the_whole_workspace_by_default() {
        assert_eq!(
            cargo_args(&testing::parsed_as!(Test, &["test"])),
            ["test", "--workspace"]
        );
    }

    #[test]
    fn passes_every_argument_through() {
        assert_eq!(
            cargo_args(&testing::parsed_as!(
                Test,
                &["test", "--test", "tidy", "--", "--nocapture"]
            )),
            ["test", "--workspace", "--test", "tidy", "--", "--nocapture"]
        );
    }
}
