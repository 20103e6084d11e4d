//! Finished variants kept in the committed results, so an experiment longer
//! than one session survives a move to a fresh machine.
//!
//! Variants run, resume and are reused in `runs/`, which git ignores and a
//! new machine does not have. An experiment whose variants are only read for
//! their metrics (never for their exported model: the fine-tune
//! comparisons) also copies each finished variant's command line, resolved
//! config and metrics, with the commit it finished at, to
//! `results/<name>/finished/<label>/`. Committed, that directory carries the
//! finished work to the next machine, where the runner restores a variant
//! from it instead of running it again — but only while its command line
//! and its config as today's `terse` resolves it are unchanged, so a change
//! to a default or an override runs it afresh. Once the whole experiment
//! has run, its report holds every variant and the shelf is removed;
//! machine.txt names the variants that were restored and where they ran.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// Written in a run directory after `terse` exits successfully (or the run
/// is restored from the shelf): the run is complete.
pub(super) const FINISHED: &str = "finished";

/// The shelf's directory inside an experiment's results.
pub const DIR: &str = "finished";

/// What a shelved variant keeps: enough to read its log back (`RunLog`) and
/// to decide whether it is still the same variant.
const KEPT: [&str; 3] = ["variant.txt", "config.toml", "metrics.jsonl"];

/// Kept as well where the run wrote it.
const OPTIONAL: [&str; 1] = ["diverged"];

/// Where and at which commit the variant finished.
const ORIGIN: &str = "origin.txt";

/// The finished variants of one experiment.
pub struct Shelf {
    dir: PathBuf,
    restored: RefCell<Vec<String>>,
}

impl Shelf {
    /// The shelf of the experiment whose results directory is `results`.
    pub fn new(results: &Path) -> Self {
        Self {
            dir: results.join(DIR),
            restored: RefCell::new(Vec::new()),
        }
    }

    /// Copies the finished run directory `run_dir` of `label` onto the
    /// shelf, with `origin` (the commit and date it finished at).
    pub fn put(&self, label: &str, run_dir: &Path, origin: &str) -> Result<()> {
        let target = self.dir.join(label);
        std::fs::create_dir_all(&target)
            .with_context(|| format!("cannot create {}", target.display()))?;
        for name in KEPT.iter().chain(&OPTIONAL) {
            let from = run_dir.join(name);
            if from.is_file() || KEPT.contains(name) {
                std::fs::copy(&from, target.join(name))
                    .with_context(|| format!("cannot shelve {}", from.display()))?;
            }
        }
        std::fs::write(target.join(ORIGIN), format!("{origin}\n"))
            .with_context(|| format!("cannot write {}", target.join(ORIGIN).display()))
    }

    /// Whether the shelf holds a variant named `label` (whatever its
    /// command line).
    pub fn holds(&self, label: &str) -> bool {
        KEPT.iter()
            .all(|name| self.dir.join(label).join(name).is_file())
    }

    /// Restores `label` into `run_dir` (replacing whatever is there) when
    /// the shelved variant had the command line `command_line` and the
    /// resolved config `config`; returns whether it did, marking the run
    /// directory finished as the runner does.
    pub fn restore(
        &self,
        label: &str,
        command_line: &str,
        config: &str,
        run_dir: &Path,
    ) -> Result<bool> {
        let shelved = self.dir.join(label);
        let read = |name: &str| {
            let path = shelved.join(name);
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))
        };
        if read("variant.txt")?.trim() != command_line.trim()
            || read("config.toml")?.trim() != config.trim()
        {
            return Ok(false);
        }
        if run_dir.exists() {
            std::fs::remove_dir_all(run_dir)
                .with_context(|| format!("cannot clear {}", run_dir.display()))?;
        }
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        for name in KEPT.iter().chain(&OPTIONAL).chain(&[ORIGIN]) {
            let from = shelved.join(name);
            if from.is_file() {
                std::fs::copy(&from, run_dir.join(name))
                    .with_context(|| format!("cannot restore {}", from.display()))?;
            }
        }
        std::fs::write(run_dir.join(FINISHED), "")?;
        let origin = read(ORIGIN).unwrap_or_default();
        self.restored
            .borrow_mut()
            .push(format!("{label} ({})", origin.trim()));
        Ok(true)
    }

    /// The variants restored in this invocation, each with its origin.
    pub fn restored(&self) -> Vec<String> {
        self.restored.borrow().clone()
    }

    /// Removes the shelf: the experiment's report now holds every variant.
    pub fn remove(&self) -> Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("cannot remove {}", self.dir.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_dir(root: &Path, command_line: &str, config: &str) -> PathBuf {
        let dir = root.join("runs").join("adam_seed1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("variant.txt"), format!("{command_line}\n")).unwrap();
        std::fs::write(dir.join("config.toml"), config).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1,\"loss\":0.5}\n").unwrap();
        std::fs::write(dir.join("terse.log"), "not kept").unwrap();
        dir
    }

    #[test]
    fn a_shelved_variant_is_restored_only_while_it_is_the_same_variant() {
        let root = tempfile::tempdir().unwrap();
        let shelf = Shelf::new(&root.path().join("results"));
        let dir = run_dir(
            root.path(),
            "finetune glue --set a=1",
            "[train]\nsteps = 4\n",
        );
        shelf.put("adam_seed1", &dir, "commit abc").unwrap();
        assert!(shelf.holds("adam_seed1"));
        assert!(!shelf.holds("adam_seed2"));
        std::fs::remove_dir_all(&dir).unwrap();

        // Another override, or a config `terse` now resolves differently
        // (a changed default): run it again.
        let config = "[train]\nsteps = 4\n";
        assert!(
            !shelf
                .restore("adam_seed1", "finetune glue --set a=2", config, &dir)
                .unwrap()
        );
        assert!(
            !shelf
                .restore(
                    "adam_seed1",
                    "finetune glue --set a=1",
                    "[train]\nsteps = 5\n",
                    &dir
                )
                .unwrap()
        );
        assert!(!dir.exists());

        assert!(
            shelf
                .restore("adam_seed1", "finetune glue --set a=1", config, &dir)
                .unwrap()
        );
        assert!(dir.join("finished").is_file());
        assert_eq!(
            std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
            "{\"step\":1,\"loss\":0.5}\n"
        );
        assert!(!dir.join("terse.log").exists());
        assert_eq!(
            shelf.restored(),
            vec!["adam_seed1 (commit abc)".to_string()]
        );

        shelf.remove().unwrap();
        assert!(!shelf.holds("adam_seed1"));
    }
}
