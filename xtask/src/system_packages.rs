//! The Debian packages terse needs, checked before anything is compiled.
//!
//! `terse` links OpenMPI (whose bindings bindgen generates with libclang), its
//! GPU path opens a Vulkan device, and the plots need a font. On a fresh
//! machine cargo would compile for half an hour and then fail inside
//! `mpi-sys`, so every command that starts cargo asks [`ensure`] first (once
//! per process, through [`crate::terse_binary::cargo`]): missing packages are
//! installed with apt-get when this runs as root; otherwise the command stops
//! before building, printing the one `sudo apt-get install …` line to run.
//!
//! The list lives in `xtask/system-packages.txt`, the one copy (`.ci/run`
//! installs it through `cargo xtask setup`). The system is asked through
//! `dpkg-query`, `id` and `apt-get` found on `PATH`, so the test of this
//! module (xtask/tests/system_packages.rs) runs the real xtask binary against
//! stand-ins of those three programs.

use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// `xtask/system-packages.txt`: one package per line, `#` comments.
const LIST: &str = include_str!("../system-packages.txt");

/// The packages of [`LIST`], in its order.
pub fn packages() -> Vec<&'static str> {
    LIST.lines()
        .filter_map(|line| line.split('#').next())
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect()
}

/// Makes sure every package is installed, once per process; later calls
/// return the first call's outcome.
pub fn ensure() -> Result<()> {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| check_and_install(&packages()).map_err(|err| format!("{err:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Checks `wanted` and installs the missing ones as root; without root,
/// fails with the install line.
fn check_and_install(wanted: &[&str]) -> Result<()> {
    let Some(missing) = missing(wanted)? else {
        eprintln!(
            "terse: warning: no dpkg-query (not Debian or Ubuntu?): cannot check the system \
             packages; the build needs the equivalents of: {}",
            wanted.join(" ")
        );
        return Ok(());
    };
    if missing.is_empty() {
        return Ok(());
    }
    let install = install_args(&missing);
    if !is_root() {
        bail!(
            "missing system packages ({}); install them with: sudo apt-get update && sudo apt-get {}",
            missing.join(", "),
            install.join(" ")
        );
    }
    eprintln!(
        "terse: installing the missing system packages: {}",
        missing.join(" ")
    );
    apt_get(&["update".to_string()])?;
    apt_get(&install)?;
    let still = self::missing(&missing)?.unwrap_or_default();
    if !still.is_empty() {
        bail!(
            "apt-get install finished but these packages are still not installed: {}",
            still.join(", ")
        );
    }
    Ok(())
}

/// `apt-get`'s arguments that install `packages`.
fn install_args(packages: &[&str]) -> Vec<String> {
    ["install", "-y", "--no-install-recommends"]
        .into_iter()
        .chain(packages.iter().copied())
        .map(String::from)
        .collect()
}

/// The packages of `wanted` that dpkg does not report installed, or `None`
/// when there is no `dpkg-query` to ask.
fn missing<'a>(wanted: &[&'a str]) -> Result<Option<Vec<&'a str>>> {
    // Unknown packages make dpkg-query exit 1 with a line on stderr; the
    // known ones are still printed, so stdout alone says what is installed.
    let output = match Command::new("dpkg-query")
        .args(["--show", "--showformat=${Package} ${Status}\\n"])
        .args(wanted)
        .stderr(Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).context("cannot run dpkg-query"),
    };
    let listing = String::from_utf8_lossy(&output.stdout);
    let installed: Vec<&str> = listing
        .lines()
        .filter_map(|line| {
            // `<package> <want> <flag> <state>`, e.g. `iproute2 install ok installed`.
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() == 4 && fields[3] == "installed").then_some(fields[0])
        })
        .collect();
    Ok(Some(
        wanted
            .iter()
            .copied()
            .filter(|name| !installed.contains(name))
            .collect(),
    ))
}

/// Whether this process runs as root (`id -u` is 0).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs `apt-get <args…>` non-interactively, failing on a non-zero status.
fn apt_get(args: &[String]) -> Result<()> {
    eprintln!("terse: apt-get {}", args.join(" "));
    crate::finish::finish(
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("`apt-get {}`", args.join(" ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_what_the_build_and_the_runs_need() {
        let packages = packages();
        for needed in [
            "libopenmpi-dev",
            "openmpi-bin",
            "libclang-dev",
            "mesa-vulkan-drivers",
            "libvulkan1",
            "fonts-dejavu-core",
        ] {
            assert!(packages.contains(&needed), "{needed} missing: {packages:?}");
        }
        assert!(
            packages
                .iter()
                .all(|name| !name.contains(char::is_whitespace))
        );
    }

    #[test]
    fn installs_without_recommends_and_without_questions() {
        assert_eq!(
            install_args(&["a", "b"]),
            ["install", "-y", "--no-install-recommends", "a", "b"]
        );
    }
}
