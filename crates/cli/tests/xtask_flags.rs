//! `cargo xtask pretrain | finetune | train` take every flag the `terse`
//! command of the same name takes (xtask builds its own command line, links
//! no workspace crate, and had drifted: its `--comm` help left out `local`
//! and it had no `--local-ranks`). The flags `terse <command> --help` lists
//! are compared with the ones xtask's sources declare, so a flag added to
//! terse's `RunFlags` and not to xtask fails here by name.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

/// terse flags xtask leaves out on purpose, with why: (command, flag, why).
const NOT_IN_XTASK: &[(&str, &str, &str)] = &[
    (
        "pretrain",
        "from",
        "fine-tuning's start point: terse refuses it outside glue and squad runs",
    ),
    (
        "train",
        "from",
        "fine-tuning's start point: terse refuses it outside glue and squad runs",
    ),
];

/// The long flags of `terse <command> --help`'s options, without `help`.
fn terse_flags(command: &str) -> BTreeSet<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_terse"))
        .args([command, "--help"])
        .output()
        .unwrap();
    assert!(output.status.success(), "terse {command} --help failed");
    let help = String::from_utf8(output.stdout).unwrap();
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            let flag = line.strip_prefix("--")?;
            Some(flag.split([' ', '<', '[']).next().unwrap().to_string())
        })
        .filter(|flag| flag != "help")
        .collect()
}

/// The long flags declared in an xtask source file: each `#[arg(long…)]`
/// attribute's `long = "name"`, or else the field it sits on, in kebab case.
fn xtask_flags(file: &str) -> BTreeSet<String> {
    let path = common::workspace().join("xtask/src").join(file);
    let source = std::fs::read_to_string(&path).unwrap();
    let mut flags = BTreeSet::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if !line.starts_with("#[arg(") || !line.contains("long") {
            continue;
        }
        if let Some(named) = line.split("long = \"").nth(1) {
            flags.insert(named.split('"').next().unwrap().to_string());
            continue;
        }
        // The field follows the attribute (which may span lines).
        let field = lines
            .by_ref()
            .map(str::trim)
            .find(|l| !l.starts_with(')') && !l.starts_with('#') && l.contains(':'))
            .unwrap();
        let name = field.trim_start_matches("pub ").split(':').next().unwrap();
        flags.insert(name.replace('_', "-"));
    }
    flags
}

#[test]
fn xtask_takes_every_flag_of_the_terse_command_it_runs() {
    let shared = xtask_flags("run_args.rs");
    assert!(
        shared.contains("optimizer") && shared.contains("set") && shared.contains("local-ranks"),
        "the parser lost xtask's flags: {shared:?}"
    );
    for (command, file) in [
        ("pretrain", "pretrain.rs"),
        ("finetune", "finetune.rs"),
        ("train", "train.rs"),
    ] {
        let xtask: BTreeSet<String> = shared.union(&xtask_flags(file)).cloned().collect();
        let missing: Vec<String> = terse_flags(command)
            .into_iter()
            .filter(|flag| !xtask.contains(flag))
            .filter(|flag| {
                !NOT_IN_XTASK
                    .iter()
                    .any(|(c, f, _)| *c == command && f == flag)
            })
            .collect();
        assert!(
            missing.is_empty(),
            "`cargo xtask {command}` lacks terse's --{} (xtask/src/run_args.rs passes the \
             shared ones on; or list the flag in NOT_IN_XTASK with why)",
            missing.join(", --")
        );
    }
}
