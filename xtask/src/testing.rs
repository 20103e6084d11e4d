//! Helpers for the command tests: parse an argument vector the way a user
//! would type it, and run it to get the error a command returns.

use crate::not_implemented::NotImplemented;
use crate::{Cli, Command, run};
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

/// Parses and runs `cargo xtask <args…>` and returns its [`NotImplemented`]
/// error, panicking if it succeeds or fails in any other way.
pub fn not_implemented(args: &[&str]) -> NotImplemented {
    let err = run(&parse(args)).expect_err("a command that is not implemented succeeded");
    err.downcast::<NotImplemented>()
        .unwrap_or_else(|other| panic!("{args:?} failed with another error: {other:#}"))
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
