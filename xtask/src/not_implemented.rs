//! The error every command returns until its issue lands.
//!
//! The CLI already accepts each command's final arguments, so `--help` is the
//! map of the project; but a command that parses and then does nothing would be
//! a silent success. Instead each one fails with this error, which names the
//! issue that will implement it, and `main` turns it into exit status
//! [`EXIT_CODE`].

use std::fmt;

use clap::ValueEnum;

/// Exit status of a command that exists in the CLI but not yet in code.
pub const EXIT_CODE: u8 = 2;

/// An issue in the project's tracker: its number and what it delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    /// The issue number.
    pub number: u32,
    /// What the issue delivers, as it reads after "issue N: ".
    pub title: &'static str,
}

/// The compressed optimizers; `train mlp` (one rank) still refuses them.
pub const ISSUE_5: Issue = Issue {
    number: 5,
    title: "1-bit Adam, 1-bit LAMB and SLAMB",
};

/// How a missing command relates to the issue that will bring it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// The issue implements the command.
    In(Issue),
}

impl Tracking {
    /// The issue the command is tracked under .
    pub fn issue(self) -> Issue {
        match self {
            Tracking::In(issue) => issue,
        }
    }
}

/// A command that parsed but is not implemented yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotImplemented {
    /// The command as a user typed it, e.g. `bench kernels`.
    pub command: String,
    /// Where the work is tracked.
    pub tracking: Tracking,
}

impl NotImplemented {
    /// The error for `command`, tracked as `tracking`.
    pub fn new(command: impl Into<String>, tracking: Tracking) -> Self {
        Self {
            command: command.into(),
            tracking,
        }
    }
}

impl fmt::Display for NotImplemented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Issue { number, title } = self.tracking.issue();
        write!(
            f,
            "`{}` is not implemented yet (tracked in issue {number}: {title})",
            self.command
        )
    }
}

impl std::error::Error for NotImplemented {}

/// The name a user types for `value` (e.g. `fashion-mnist`), so messages
/// quote the command line as it was written.
pub fn cli_name(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|possible| possible.get_name().to_owned())
        .unwrap_or_else(|| String::from("<hidden>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_command_and_issue() {
        let err = NotImplemented::new("train resnet20 --dataset cifar10", Tracking::In(ISSUE_5));
        assert_eq!(
            err.to_string(),
            "`train resnet20 --dataset cifar10` is not implemented yet \
             (tracked in issue 5: 1-bit Adam, 1-bit LAMB and SLAMB)"
        );
    }

    #[test]
    fn message_is_one_line() {
        let message = NotImplemented::new("x", Tracking::In(ISSUE_5)).to_string();
        assert!(!message.contains('\n'), "{message:?}");
        assert!(message.contains(&format!("issue {}: ", ISSUE_5.number)));
    }
}
