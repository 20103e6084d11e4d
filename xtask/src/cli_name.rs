//! The name a user types for a value of a `ValueEnum` (e.g. `fashion-mnist`),
//! so messages quote the command line as it was written.

use clap::ValueEnum;

/// The command-line spelling of `value`.
pub fn cli_name(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|possible| possible.get_name().to_owned())
        .unwrap_or_else(|| String::from("<hidden>"))
}
