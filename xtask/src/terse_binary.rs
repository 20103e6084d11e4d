//! Builds and runs the per-rank `terse` binary.
//!
//! One build for every command: the workspace's dev profile (dependencies at
//! opt-level 3) and the workspace's feature resolution. `cargo build -p
//! terse-cli` would resolve the dependencies' features for that package
//! alone and differ from `cargo test --workspace` (num-traits, byteorder, …:
//! the whole burn stack compiled twice); `cargo build --workspace --lib
//! --bins` resolves them as the tests do and also builds every dependency the
//! tests need, so after a training command `cargo xtask test` compiles only
//! the workspace's own crates and test targets (and after the tests, a
//! training command compiles nothing).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::child_signals;

/// A `cargo` command: the one running this xtask (`$CARGO`), else from `PATH`.
///
/// Every cargo this xtask starts comes from here, after the system packages
/// the build needs are checked (and installed as root): nothing is compiled
/// before that check.
pub fn cargo() -> Result<Command> {
    crate::system_packages::ensure()?;
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()));
    // `cargo run` gave this process xtask's own package variables. Build
    // scripts that watch them (ring's `rerun-if-env-changed=CARGO_PKG_NAME`,
    // …) would see them change between a cargo started here and one started
    // from a shell, and rebuild (ring, rustls, ureq) every time the two
    // alternate; the inner cargo gets the user's environment instead.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(&name);
        }
    }
    Ok(command)
}

/// Whether `name` is one of the variables `cargo run` sets for the program
/// it runs (as opposed to the user's `CARGO_HOME`, `CARGO_TARGET_DIR`, …).
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// The path of this xtask binary, for commands that start it again (netlab's
/// launch agent).
///
/// The workspace build above also links the `xtask` binary (under the
/// workspace's feature resolution) and so replaces `target/debug/xtask`
/// while this process runs from it; Linux then reports the running file as
/// `<path> (deleted)`. The path itself names the same program, just built
/// again, so the suffix is dropped when that path exists.
pub fn xtask_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the xtask binary")?;
    let text = exe.to_string_lossy();
    match text.strip_suffix(" (deleted)") {
        Some(path) if std::path::Path::new(path).is_file() => Ok(PathBuf::from(path)),
        _ => Ok(exe),
    }
}

/// Builds the workspace's binaries and runs `name <args…>`, inheriting
/// stdin, stdout and stderr.
pub fn run_binary(name: &str, args: &[String]) -> Result<()> {
    let exe = binary(name)?;
    Running::start(Command::new(&exe).args(args), &exe, false)?
        .finish(&exe, || format!("`{name} {}`", args.join(" ")))
}

/// A started child in its own process group, the signals this process
/// receives forwarded to it until it ends: every run of a workspace binary,
/// so that Ctrl-C stops it (and mpirun's ranks) the one way.
struct Running {
    child: std::process::Child,
    forwarder: child_signals::Forwarder,
}

impl Running {
    /// Starts `command` (running `exe`; `via_mpirun`: an mpirun job).
    fn start(command: &mut Command, exe: &std::path::Path, via_mpirun: bool) -> Result<Self> {
        let child = child_signals::own_group(command)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let forwarder = child_signals::Forwarder::start(&child, via_mpirun);
        Ok(Self { child, forwarder })
    }

    /// Waits for the child; a failure is a [`ChildFailed`] naming `what`.
    fn finish(self, exe: &std::path::Path, what: impl FnOnce() -> String) -> Result<()> {
        let Self {
            mut child,
            forwarder,
        } = self;
        let status = child
            .wait()
            .with_context(|| format!("cannot wait for {}", exe.display()));
        drop(forwarder);
        let status = status?;
        if !status.success() {
            return Err(ChildFailed {
                what: what(),
                status,
            }
            .into());
        }
        Ok(())
    }
}

/// Builds the `terse` binary in the one profile and returns its path.
pub fn build() -> Result<PathBuf> {
    binary("terse")
}

/// Builds the workspace's libraries and binaries (the tests' feature
/// resolution, see the module doc) and returns the path of binary `name`.
pub fn binary(name: &str) -> Result<PathBuf> {
    let output = cargo()?
        .args(["build", "--workspace", "--lib", "--bins"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo to build the workspace")?;
    if !output.status.success() {
        bail!("building `{name}` failed ({})", output.status);
    }
    executable(&String::from_utf8_lossy(&output.stdout), name)
}

/// Runs `terse <args…>` on `ranks` ranks: itself for one, through `mpirun`
/// for more (one process per rank). Rank 0's standard output is passed
/// through line by line; the run directory it reports at the end
/// (`terse: run directory DIR`) is returned.
pub fn launch(ranks: usize, args: &[String]) -> Result<Option<PathBuf>> {
    launch_on(ranks, None, args)
}

/// [`launch`] on the hosts of `hostfile` (see [`crate::mpi::command_on`]).
pub fn launch_on(
    ranks: usize,
    hostfile: Option<&std::path::Path>,
    args: &[String],
) -> Result<Option<PathBuf>> {
    let exe = build()?;
    let via_mpirun = ranks > 1 || hostfile.is_some();
    let mut command = if via_mpirun {
        crate::mpi::require_mpirun()?;
        crate::mpi::command_on(ranks, hostfile, &exe, args)
    } else {
        let mut command = Command::new(&exe);
        command.args(args);
        command
    };
    // The line a stopped run ends with names the command the user typed
    // (terse turns it into its resume form; the words are joined by ASCII's
    // unit separator, see terse's resume_line.rs). Local ranks inherit
    // mpirun's environment.
    let typed: Vec<String> = ["cargo".to_string(), "xtask".to_string()]
        .into_iter()
        .chain(std::env::args().skip(1))
        .collect();
    command.env("TERSE_LAUNCHED_AS", typed.join("\u{1f}"));
    let mut running = Running::start(command.stdout(Stdio::piped()), &exe, via_mpirun)?;
    let mut run_dir = None;
    let stdout = running.child.stdout.take().expect("piped above");
    for line in BufReader::new(stdout).lines() {
        let line = line.context("cannot read the output of `terse`")?;
        println!("{line}");
        if let Some(dir) = line.strip_prefix(RUN_DIRECTORY) {
            run_dir = Some(PathBuf::from(dir.trim()));
        }
    }
    running.finish(&exe, || {
        format!("`terse {}` on {ranks} rank(s)", args.join(" "))
    })?;
    Ok(run_dir)
}

/// A `terse` (or other workspace binary) run that failed: xtask exits with
/// its status, so that a caller sees 3 for a diverged run as it would from
/// `terse` itself (and 128 + N for a run ended by signal N).
#[derive(Debug)]
pub struct ChildFailed {
    /// The command, for the message.
    pub what: String,
    /// How it ended.
    pub status: std::process::ExitStatus,
}

impl ChildFailed {
    /// The exit status to pass on.
    pub fn code(&self) -> u8 {
        use std::os::unix::process::ExitStatusExt;
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(1).max(1),
            (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
            (None, None) => 1,
        }
    }
}

impl std::fmt::Display for ChildFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // terse's own last lines say why; this line names how it ended,
        // not "failed" for a stop the user asked for.
        match self.status.code() {
            Some(3) => write!(f, "{} diverged ({})", self.what, self.status),
            Some(code @ (130 | 143)) => write!(
                f,
                "{} stopped by a signal after its checkpoint (exit status: {code})",
                self.what
            ),
            _ => write!(f, "{} failed ({})", self.what, self.status),
        }
    }
}

impl std::error::Error for ChildFailed {}

/// How `terse` names the run directory on its last line (crates/cli/src/launch.rs).
const RUN_DIRECTORY: &str = "terse: run directory ";

/// One line of cargo's `--message-format json` output: the fields read
/// here, the rest ignored. With `json-render-diagnostics` cargo prints the
/// compiler's diagnostics to stderr itself, so no `compiler-message` (and no
/// rendered text) reaches this parser; a line that does not parse as a
/// message is skipped.
#[derive(serde::Deserialize)]
struct CargoMessage {
    /// `compiler-artifact`, `build-script-executed`, `build-finished`, ….
    reason: String,
    /// The target an artifact was built for (absent on `build-finished`).
    target: Option<Target>,
    /// The artifact's executable: `null` for a library, absent on other
    /// reasons.
    executable: Option<PathBuf>,
}

/// The `target` of a cargo message.
#[derive(serde::Deserialize)]
struct Target {
    /// The target's name: the binary's or bench's, or the crate's.
    name: String,
}

/// The executable cargo reported for target `name` in its JSON messages
/// (one `compiler-artifact` object per line).
fn executable(messages: &str, name: &str) -> Result<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<CargoMessage>(line).ok())
        .filter(|message| message.reason == "compiler-artifact")
        .filter(|message| message.target.as_ref().is_some_and(|t| t.name == name))
        .find_map(|message| message.executable)
        .with_context(|| format!("cargo did not report an executable for `{name}`"))
}

/// Builds bench target `bench` (harness-less, in the one profile) and
/// returns the path of its executable, read from cargo's JSON messages.
/// `--workspace` resolves features exactly as `cargo test --workspace` does,
/// so the build reuses the tests' artifacts instead of rebuilding burn.
pub fn build_bench(bench: &str) -> Result<PathBuf> {
    let output = cargo()?
        .args(["test", "--workspace", "--bench", bench, "--no-run"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start cargo to build bench `{bench}`"))?;
    if !output.status.success() {
        bail!("building bench `{bench}` failed ({})", output.status);
    }
    executable(&String::from_utf8_lossy(&output.stdout), bench)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(script: &str) -> ChildFailed {
        ChildFailed {
            what: script.into(),
            status: Command::new("sh").args(["-c", script]).status().unwrap(),
        }
    }

    #[test]
    fn a_failed_runs_status_is_passed_on() {
        assert_eq!(failed("exit 3").code(), 3);
        assert_eq!(failed("exit 1").code(), 1);
        // Ended by SIGTERM: 128 + 15, as a shell reports it.
        assert_eq!(failed("kill -TERM $$").code(), 143);
        // The line says how it ended.
        assert!(
            failed("exit 3")
                .to_string()
                .ends_with("diverged (exit status: 3)")
        );
        assert!(
            failed("exit 130")
                .to_string()
                .ends_with("stopped by a signal after its checkpoint (exit status: 130)")
        );
        assert!(
            failed("exit 1")
                .to_string()
                .ends_with("failed (exit status: 1)")
        );
    }

    #[test]
    fn finds_the_executable_of_the_named_target_in_cargos_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"terse-data","kind":["bin"]},"executable":"/t/debug/terse-data"}
{"reason":"compiler-artifact","target":{"name":"terse_train","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"terse","kind":["bin"]},"executable":"/t/debug/terse"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            executable(messages, "terse").unwrap(),
            PathBuf::from("/t/debug/terse")
        );
        assert!(executable(messages, "terse_train").is_err());
        assert!(executable(messages, "xtask").is_err());
    }

    #[test]
    fn the_user_cargo_settings_reach_the_inner_cargo_and_xtasks_own_do_not() {
        for own in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
        ] {
            assert!(set_by_cargo_run(own), "{own}");
        }
        for user in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_TERM_COLOR",
            "CARGO",
        ] {
            assert!(!set_by_cargo_run(user), "{user}");
        }
    }
}
