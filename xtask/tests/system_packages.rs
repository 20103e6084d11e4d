//! The system-package check of the real `cargo xtask` binary on a machine
//! where a package is missing.
//!
//! The machine is played by stand-ins on `PATH`: `dpkg-query` reports every
//! package installed except those listed in a state file, `id -u` prints the
//! uid the case asks for, `apt-get` records its arguments (and an `install`
//! marks the packages installed), and the `cargo` xtask starts (`$CARGO`)
//! records that it was called. Each stand-in appends one line to a shared
//! log, so the order of what happened is visible.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A package of xtask/system-packages.txt, reported missing.
const MISSING: &str = "libopenmpi-dev";

struct FakeMachine {
    dir: PathBuf,
    /// Removes `dir` (stand-ins, state file and log) when the machine drops.
    _scratch: tempfile::TempDir,
}

impl FakeMachine {
    fn new(name: &str, uid: u32) -> Self {
        let scratch = tempfile::Builder::new()
            .prefix(&format!("terse-xtask-packages-{name}-"))
            .tempdir()
            .unwrap();
        let dir = scratch.path().to_path_buf();
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("missing"), format!("{MISSING}\n")).unwrap();
        let log = dir.join("log");
        let missing = dir.join("missing");
        // `dpkg-query --show --showformat=… PKG…`: one status line per
        // known package, as dpkg prints them; the missing one is unknown.
        script(
            &dir,
            "dpkg-query",
            &format!(
                r#"printf '%s\n' "dpkg-query $*" >> {log}
shift 2
for p in "$@"; do
  if grep -qx "$p" {missing}; then echo "dpkg-query: no packages found matching $p" >&2
  else echo "$p install ok installed"; fi
done
exit 0"#,
                log = log.display(),
                missing = missing.display()
            ),
        );
        script(&dir, "id", &format!("echo {uid}"));
        script(
            &dir,
            "apt-get",
            &format!(
                r#"printf '%s\n' "apt-get $*" >> {log}
if [ "$1" = install ]; then : > {missing}; fi
exit 0"#,
                log = log.display(),
                missing = missing.display()
            ),
        );
        script(
            &dir,
            "cargo",
            &format!(
                "printf '%s\\n' \"cargo $*\" >> {log}\necho 'fake cargo: not building' >&2\nexit 1",
                log = log.display()
            ),
        );
        Self {
            dir,
            _scratch: scratch,
        }
    }

    /// Runs `cargo xtask <args…>` with the stand-ins first on `PATH`.
    fn xtask(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .env("PATH", path)
            .env("CARGO", self.dir.join("bin/cargo"))
            .output()
            .unwrap()
    }

    /// The stand-ins' log, a line per call, in order.
    fn log(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join("bin").join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn without_root_it_stops_before_building_with_the_install_line() {
    let machine = FakeMachine::new("user", 1000);
    for command in [
        &["pretrain", "bert-tiny", "--ranks", "2"][..],
        &["test"][..],
    ] {
        let output = machine.xtask(command);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?} succeeded: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{command:?}: not one line:\n{stderr}");
        assert!(
            lines[0].contains(&format!(
                "sudo apt-get install -y --no-install-recommends {MISSING}"
            )),
            "{command:?}: no install line:\n{stderr}"
        );
    }
    let log = machine.log();
    assert!(
        log.iter().all(|line| !line.starts_with("cargo")),
        "cargo started before the packages were there: {log:?}"
    );
    assert!(
        log.iter().all(|line| !line.starts_with("apt-get")),
        "apt-get ran without root: {log:?}"
    );
}

#[test]
fn as_root_it_installs_the_missing_package_then_builds() {
    let machine = FakeMachine::new("root", 0);
    let output = machine.xtask(&["pretrain", "bert-tiny", "--ranks", "2"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The stand-in cargo fails the build; what matters is what ran before.
    assert!(!output.status.success(), "{stderr}");
    let log = machine.log();
    let calls: Vec<&str> = log
        .iter()
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        calls,
        ["dpkg-query", "apt-get", "apt-get", "dpkg-query", "cargo"],
        "{log:#?}"
    );
    assert_eq!(log[1], "apt-get update");
    assert_eq!(
        log[2],
        format!("apt-get install -y --no-install-recommends {MISSING}")
    );
    assert!(log[4].starts_with("cargo build"), "{log:#?}");
    assert!(
        stderr.contains(&format!(
            "apt-get install -y --no-install-recommends {MISSING}"
        )),
        "the install command is not shown:\n{stderr}"
    );
}

#[test]
fn with_everything_installed_nothing_is_installed() {
    let machine = FakeMachine::new("installed", 1000);
    fs::write(machine.dir.join("missing"), "").unwrap();
    let output = machine.xtask(&["setup"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let log = machine.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].starts_with("dpkg-query"));
}
