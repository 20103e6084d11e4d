//! `cargo xtask data`: list, fetch and verify datasets and pretrained weights.
//!
//! `cargo test` passes without a download of its own, but training and
//! reproduction need the real files. Each dataset has a manifest in
//! `data/manifests/` (files with size and SHA-256, license, the official
//! source first and registry mirrors after); `terse-data` (a binary of the
//! `terse-data` crate, which needs no system library) tries the sources in
//! order, verifies every file and stores it in the git-ignored cache. This
//! command builds and runs it in the one profile and feature resolution
//! (terse_binary.rs).

use anyhow::Result;
use clap::Subcommand;

use crate::terse_binary;

/// Arguments of `cargo xtask data`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: DataCommand,
}

/// What to do with the datasets.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum DataCommand {
    /// Download one dataset (or all), verify its checksums and store it in the
    /// cache ($TERSE_CACHE, else $XDG_CACHE_HOME/terse, else ~/.cache/terse); a partial or corrupted file
    /// is fetched again
    Fetch {
        /// A dataset as `data list` names it (one manifest in data/manifests/), or `all`
        #[arg(value_name = "NAME|all")]
        name: String,
    },
    /// List every dataset with its size, license and whether it is in the cache
    List,
    /// Copy datasets out of the cache (fetching what it lacks) into a
    /// directory laid out as a cache, for a machine without network
    /// (`TERSE_CACHE=DIR` there), e.g. `--to /tmp/c sotu minilm:tokenizer.json`
    Copy {
        /// The directory to fill (created if missing)
        #[arg(long, value_name = "DIR")]
        to: String,
        /// Datasets as `data list` names them, each alone or as NAME:FILE
        #[arg(value_name = "NAME[:FILE]", required = true)]
        wanted: Vec<String>,
    },
    /// Build BERT pre-training shards from the corpora (options: `cargo xtask
    /// data shards --help`), e.g. `--out shards/128 --max-seq 128 --seed 1`
    #[command(disable_help_flag = true)]
    Shards {
        /// Options of `terse-data shards`
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

impl DataCommand {
    /// The `terse-data` command line for this command.
    fn terse_data_args(&self) -> Vec<String> {
        match self {
            DataCommand::Fetch { name } => vec!["fetch".into(), name.clone()],
            DataCommand::List => vec!["list".into()],
            DataCommand::Copy { to, wanted } => ["copy".to_string(), "--to".into(), to.clone()]
                .into_iter()
                .chain(wanted.iter().cloned())
                .collect(),
            DataCommand::Shards { args } => std::iter::once("shards".to_string())
                .chain(args.iter().cloned())
                .collect(),
        }
    }
}

/// Runs `terse-data` with the command's arguments.
pub fn run(args: &Args) -> Result<()> {
    let forwarded = args.command.terse_data_args();
    terse_binary::run_binary("terse-data", &forwarded)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn fetch_takes_a_name_or_all() {
        for name in ["squad-v1.1", "all"] {
            let Args { command } = testing::parsed_as!(Data, &["data", "fetch", name]);
            assert_eq!(command, DataCommand::Fetch { name: name.into() });
            assert_eq!(command.terse_data_args(), ["fetch", name]);
        }
        testing::rejection(&["data", "fetch"]);
        testing::rejection(&["data", "list", "extra"]);
    }

    #[test]
    fn shards_forwards_every_option_including_help() {
        let argv = ["data", "shards", "--max-seq", "512", "--help"];
        let Args { command } = testing::parsed_as!(Data, &argv);
        assert_eq!(command.terse_data_args(), argv[1..]);
    }

    #[test]
    fn copy_forwards_its_directory_and_datasets() {
        let argv = [
            "data",
            "copy",
            "--to",
            "/tmp/c",
            "sotu",
            "minilm:tokenizer.json",
        ];
        let Args { command } = testing::parsed_as!(Data, &argv);
        assert_eq!(command.terse_data_args(), argv[1..]);
        testing::rejection(&["data", "copy", "--to", "/tmp/c"]);
        testing::rejection(&["data", "copy", "sotu"]);
    }

    #[test]
    fn list_forwards_to_terse_data() {
        let Args { command } = testing::parsed_as!(Data, &["data", "list"]);
        assert_eq!(command.terse_data_args(), ["list"]);
    }
}
