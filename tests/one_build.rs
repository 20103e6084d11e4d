//! The README's main command (`cargo build`: no dev-dependencies) and its
//! test command (`cargo test`: every crate's dev-dependencies too) must
//! build every dependency with the same features, or cargo compiles the
//! dependency and everything above it twice. A dev-dependency that turned
//! on one feature of proc-macro2 (tidy's `span-locations`) made the tests
//! build cubecl, cubek and all of burn a second time: ~20 minutes of CI on
//! 2 cores, which then ran out of time.
//!
//! `cargo tree` prints each package with the features it is built with
//! (host and target apart); a feature set the build uses must still be there
//! when dev-dependencies join. A new one (a package only tests use, or one
//! only tests need on another platform) builds one more unit, nothing again.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use terse_tests::workspace_root;

/// Package ("name vX.Y.Z") → the feature sets it is built with.
type FeatureSets = BTreeMap<String, BTreeSet<String>>;

/// `cargo tree` over the workspace with these edge kinds, each package with
/// its features.
fn feature_sets(edges: &str) -> FeatureSets {
    let output = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["tree", "--workspace", "--offline", "--prefix", "none"])
        .args(["--edges", edges, "--format", "{p}|{f}"])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree --edges {edges}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse(&String::from_utf8(output.stdout).unwrap())
}

/// `name vX.Y.Z (source)|features` lines; a repeated subtree's line ends in
/// ` (*)`, a proc macro's name carries ` (proc-macro)`.
fn parse(tree: &str) -> FeatureSets {
    let mut sets = FeatureSets::new();
    for line in tree.lines().filter(|l| l.contains('|')) {
        let (package, features) = line.split_once('|').unwrap();
        let mut name = package.split_whitespace().take(2);
        let package = format!("{} {}", name.next().unwrap(), name.next().unwrap_or(""));
        let features = features.trim_end_matches(" (*)").trim().to_string();
        sets.entry(package).or_default().insert(features);
    }
    sets
}

/// The build's feature sets that the tests' build does not have.
fn lost_to_dev_dependencies(build: &FeatureSets, tests: &FeatureSets) -> Vec<String> {
    let mut lost = Vec::new();
    for (package, sets) in build {
        for features in sets {
            if !tests.get(package).is_some_and(|t| t.contains(features)) {
                let now: Vec<&String> = tests.get(package).into_iter().flatten().collect();
                lost.push(format!(
                    "{package}: [{features}] in the build, only {now:?} with dev-dependencies"
                ));
            }
        }
    }
    lost
}

#[test]
fn dev_dependencies_change_no_dependency_the_build_uses() {
    let build = feature_sets("normal,build");
    let tests = feature_sets("normal,build,dev");
    assert!(
        build.len() > 100,
        "cargo tree listed {} packages",
        build.len()
    );
    let lost = lost_to_dev_dependencies(&build, &tests);
    assert!(
        lost.is_empty(),
        "`cargo test` would build these again (and all above them) with other features \
         than `cargo build`; name the features the dev-dependency adds in a normal \
         dependency too (see tests/Cargo.toml's proc-macro2):\n{}",
        lost.join("\n")
    );
}

#[test]
fn a_feature_only_the_tests_turn_on_is_caught() {
    let build = parse(
        "proc-macro2 v1.0.107|default,proc-macro\n\
         proc-macro2 v1.0.107|default,proc-macro,span-locations (*)\n\
         awint v0.19.0|default,std\n",
    );
    let tests = parse(
        "proc-macro2 v1.0.107|default,proc-macro,span-locations\n\
         awint v0.19.0|default,std (*)\n\
         syn v2.0.119 (proc-macro)|full,visit\n",
    );
    assert_eq!(
        lost_to_dev_dependencies(&build, &tests),
        [
            "proc-macro2 v1.0.107: [default,proc-macro] in the build, only \
          [\"default,proc-macro,span-locations\"] with dev-dependencies"
        ]
    );
    assert!(lost_to_dev_dependencies(&tests, &tests).is_empty());
}
