//! `cargo xtask`: the one entry point for setting up, training, reproducing and
//! measuring terse.
//!
//! Every workflow is a named command here, so `cargo xtask --help` is the map
//! of the project. It stays light (no workspace crate, no system library; see
//! ARCHITECTURE.md) so that it compiles on a fresh machine before anything
//! else does. This file only parses the command line and dispatches; each
//! command lives in its own file.

mod bench;
mod bench_workers;
mod bundle;
mod child_signals;
mod cli_name;
mod data;
mod finetune;
mod finish;
mod forward;
mod inspect;
mod machine;
mod mpi;
mod netlab;
mod pretrain;
mod reproduce;
mod run_args;
mod run_plot;
mod setup;
/// The shipped configs' names, from the file terse lists them with
/// (xtask links no workspace crate).
#[path = "../../crates/cli/src/shipped_names.rs"]
mod shipped_configs;
mod system_packages;
mod terse_binary;
mod test;
#[cfg(test)]
mod testing;
mod train;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// The command line of `cargo xtask`.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "terse: train with communication-efficient optimizers (1-bit Adam, 1-bit LAMB, SLAMB) and reproduce their papers"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The commands; each variant's first doc line is its entry in `--help`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Pre-train BERT with masked LM + next sentence on N ranks with the chosen optimizer
    Pretrain(pretrain::Args),
    /// Fine-tune a pre-trained BERT on SQuAD v1.1 or a GLUE task and report its metric
    Finetune(finetune::Args),
    /// Train an image classifier (ResNet, VGG) on N ranks and report test accuracy
    Train(train::Args),
    /// Score a saved run's checkpoint on its task's held-out data
    Eval(inspect::Args),
    /// Write a saved run's predictions on its task's held-out data (GLUE-style and SQuAD runs)
    Predict(inspect::Args),
    /// Write a checkpoint's model in HuggingFace's layout into --out DIR
    Export(inspect::Args),
    /// Re-run one of the papers' experiments and write its table and plots to results/
    Reproduce(reproduce::Args),
    /// Benchmark kernels, optimizer steps or collectives against an in-run baseline
    Bench(bench::Args),
    /// Write a self-contained GPU benchmark bundle (binaries, libraries, run.sh) for a machine without Rust
    Bundle(bundle::Args),
    /// Draw runs' training loss and evaluation metrics as PNGs, side by side
    Plot(run_plot::Args),
    /// List datasets and pretrained weights, fetch and verify them, build BERT pre-training shards
    Data(data::Args),
    /// Bring up or down a rate-limited network of N hosts (namespaces) and run MPI ranks on it
    Netlab(netlab::Args),
    /// Run the whole test suite (`cargo test --workspace`) after checking the system packages
    Test(test::Args),
    /// Check the Debian packages terse needs and install the missing ones (as root); builds nothing
    Setup,
}

/// The checkout's root, whose `configs/`, `runs/` and `target/` every
/// command names by relative paths.
fn checkout_root() -> std::path::PathBuf {
    root_of(std::env::var_os("CARGO_MANIFEST_DIR"))
}

/// The checkout's root from the `CARGO_MANIFEST_DIR` that `cargo run`
/// (`cargo xtask`) sets for this run, else from the one this binary was
/// built in. Two checkouts sharing one CARGO_TARGET_DIR share this binary
/// (cargo finds the same sources fresh and does not rebuild it), and the
/// path built in is then the other checkout's: `cargo xtask` in the second
/// was refused with "cd there first", naming the first.
fn root_of(set_by_cargo: Option<std::ffi::OsString>) -> std::path::PathBuf {
    set_by_cargo
        .map_or_else(
            || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
            std::path::PathBuf::from,
        )
        .join("..")
}

/// Refuses a working directory other than the checkout's root: `cargo
/// xtask` runs from any directory of the checkout, and from a
/// subdirectory its shipped configs were "no such config" and its runs
/// landed in a `runs/` there.
fn at_checkout_root(cwd: &std::path::Path, root: &std::path::Path) -> Result<()> {
    let canonical = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    if canonical(cwd) != canonical(root) {
        anyhow::bail!(
            "cargo xtask runs from the checkout's root, {} (its configs/ and runs/ are taken \
             from there, as are relative paths on the command line): cd there first",
            canonical(root).display()
        );
    }
    Ok(())
}

/// Runs the parsed command.
fn run(cli: &Cli) -> Result<()> {
    at_checkout_root(&std::env::current_dir()?, &checkout_root())?;
    match &cli.command {
        Command::Pretrain(args) => pretrain::run(args),
        Command::Finetune(args) => finetune::run(args),
        Command::Train(args) => train::run(args),
        Command::Eval(args) => inspect::run("eval", args),
        Command::Predict(args) => inspect::run("predict", args),
        Command::Export(args) => inspect::run("export", args),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Bundle(args) => bundle::run(args),
        Command::Plot(args) => run_plot::run(args),
        Command::Data(args) => data::run(args),
        Command::Netlab(args) => netlab::run(args),
        Command::Test(args) => test::run(args),
        Command::Setup => setup::run(),
    }
}

/// Prints `err` as one `terse: …` line on stderr; exit status 1, or the
/// status of the `terse` run that failed (3: diverged).
fn report(err: &anyhow::Error) -> ExitCode {
    eprintln!("terse: {err:#}");
    match err.downcast_ref::<terse_binary::ChildFailed>() {
        Some(child) => ExitCode::from(child.code()),
        None => ExitCode::FAILURE,
    }
}

fn main() -> ExitCode {
    match run(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => report(&err),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_every_command_with_an_explanation() {
        let help = Cli::command().render_help().to_string();
        for name in [
            "pretrain",
            "finetune",
            "train",
            "eval",
            "predict",
            "reproduce",
            "bench",
            "data",
            "netlab",
            "test",
            "setup",
        ] {
            let line = help
                .lines()
                .find(|line| line.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("`{name}` missing from --help:\n{help}"));
            let explanation = line.trim_start()[name.len()..].trim();
            assert!(
                explanation.split_whitespace().count() >= 5,
                "`{name}` has no real explanation: {line:?}"
            );
        }
    }

    #[test]
    fn only_the_checkout_root_is_a_working_directory() {
        let root = checkout_root();
        at_checkout_root(&root, &root).unwrap();
        let error = at_checkout_root(&root.join("crates"), &root)
            .unwrap_err()
            .to_string();
        assert!(error.contains("runs from the checkout's root"), "{error}");
    }

    #[test]
    fn a_command_is_required() {
        let err = Cli::try_parse_from(["cargo xtask"]).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
    }

    #[test]
    fn the_root_is_the_checkout_cargo_runs_it_for() {
        let other = std::path::Path::new("/home/me/second-clone/xtask");
        assert_eq!(super::root_of(Some(other.into())), other.join(".."));
        assert_eq!(
            super::root_of(None),
            Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
        );
    }

    /// STYLE.md habit 10, for this crate: every source file opens with a
    /// module doc saying why it exists.
    #[test]
    fn every_file_starts_with_a_module_doc() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        let mut dirs = vec![root.join("src"), root.join("tests")];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let text = fs::read_to_string(&path).unwrap();
                    assert!(
                        text.starts_with("//! "),
                        "{} has no //! doc",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked >= 20, "only {checked} files found");
    }
}
