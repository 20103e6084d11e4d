//! Helpers for the command tests: parse an argument vector the way a user
//! would type it, or get clap's rejection of it.

use crate::{Cli, Command};
use clap::Parser;

/// Parses `cargo xtask <args…>`, panicking with clap's message on failure.
pub fn parse(args: &[&str]) -> Cli {
    let argv = std::iter::once("cargo xtask").chain(args.iter().copied());
    Cli::try_parse_from(argv).unwrap_or_else(|err| panic!("{args:?} did not parse:\n{err}"))
}

/// The parsed command of `cargo xtask <args…>`.
pub fn command(args: &[&str]) -> Command {
    parse(args).command
}

/// Parses `cargo xtask <args…>` and returns clap's rendered error, panicking
/// if the arguments are accepted.
pub fn rejection(args: &[&str]) -> String {
    let argv = std::iter::once("cargo xtask").chain(args.iter().copied());
    match Cli::try_parse_from(argv) {
        Ok(cli) => panic!("{args:?} was accepted: {cli:?}"),
        Err(err) => err.render().to_string(),
    }
}

/// The arguments of `cargo xtask <argv…>`, which must parse as the command
/// `Command::$variant` (a panic naming what it parsed as otherwise).
macro_rules! parsed_as {
    ($variant:ident, $argv:expr) => {
        match $crate::testing::command($argv) {
            $crate::Command::$variant(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    };
}

pub(crate) use parsed_as;
