//! Flags xtask passes to `terse` as they are.
//!
//! Most of a training command's flags mean nothing to xtask: it only hands
//! them on. Declaring each of them once more with terse's long help, and
//! pushing each with its own `if let`, is how the two command lines drifted
//! (issue 51). [`forwarded!`] declares such flags in one line each and
//! derives the `--flag value` words from the declaration itself, so a
//! forwarded flag cannot be parsed under one name and passed on under
//! another; terse's own `--help` stays the one place that explains them.

/// A parsed flag's words on terse's command line.
pub trait Forward {
    /// Appends `flag` and its value to `args` when the flag was given.
    fn forward(&self, flag: &'static str, args: &mut Vec<String>);
}

/// A flag's value as one word of terse's command line.
pub trait Word {
    /// The word.
    fn word(&self) -> String;
}

impl Word for String {
    fn word(&self) -> String {
        self.clone()
    }
}

impl Word for std::path::PathBuf {
    fn word(&self) -> String {
        self.display().to_string()
    }
}

impl Word for u32 {
    fn word(&self) -> String {
        self.to_string()
    }
}

impl Word for u64 {
    fn word(&self) -> String {
        self.to_string()
    }
}

/// A switch: the flag alone.
impl Forward for bool {
    fn forward(&self, flag: &'static str, args: &mut Vec<String>) {
        if *self {
            args.push(flag.into());
        }
    }
}

/// A flag that takes a value, given at most once.
impl<T: Word> Forward for Option<T> {
    fn forward(&self, flag: &'static str, args: &mut Vec<String>) {
        if let Some(value) = self {
            args.extend([flag.into(), value.word()]);
        }
    }
}

/// A flag whose value may be left out (`--resume [CHECKPOINT]`).
impl Forward for Option<Option<String>> {
    fn forward(&self, flag: &'static str, args: &mut Vec<String>) {
        if let Some(value) = self {
            args.push(flag.into());
            args.extend(value.clone());
        }
    }
}

/// A repeatable flag (`--set`): each value after its own flag, in order.
impl<T: Word> Forward for Vec<T> {
    fn forward(&self, flag: &'static str, args: &mut Vec<String>) {
        for value in self {
            args.extend([flag.into(), value.word()]);
        }
    }
}

/// Declares `pub struct $name` of flags passed to `terse` as they are, one
/// `#[arg(long = "FLAG", …)] field: Type,` line each (with a doc line, its
/// one-line `--help` entry), and `$name::forward`, which appends each given
/// flag to terse's arguments as `--FLAG value`, in declaration order.
macro_rules! forwarded {
    (
        $(#[$outer:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                #[arg(long = $flag:literal $($arg:tt)*)] $field:ident: $ty:ty,
            )*
        }
    ) => {
        #[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
        $(#[$outer])*
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[arg(long = $flag $($arg)*)]
                pub $field: $ty,
            )*
        }

        impl $name {
            /// Appends every given flag to `args` as terse takes it.
            pub fn forward(&self, args: &mut Vec<String>) {
                $(
                    $crate::forward::Forward::forward(
                        &self.$field,
                        concat!("--", $flag),
                        args,
                    );
                )*
            }
        }
    };
}

pub(crate) use forwarded;
