//! An experiment's output directory: the table, the curves, every logged
//! line, the resolved configs and the machine it ran on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::commit;
use super::runner::RunLog;

/// The directory an experiment writes (results/<name>/, or a scratch
/// directory for `--quick`).
pub struct Report {
    dir: PathBuf,
    /// Opened for `--from-results`: its metrics and configs are the input.
    replay: bool,
}

impl Report {
    /// Creates (or empties) `dir`, keeping the finished variants an
    /// earlier, unfinished run of the experiment left there (`shelf`).
    pub fn create(dir: &Path) -> Result<Self> {
        if dir.exists() {
            let entries =
                std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
            for entry in entries {
                let path = entry?.path();
                if path.file_name() == Some(std::ffi::OsStr::new(super::shelf::DIR)) {
                    continue;
                }
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                }
                .with_context(|| format!("cannot clear {}", path.display()))?;
            }
        }
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            replay: false,
        })
    }

    /// An existing report directory, kept as it is (`--from-results`).
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.join("metrics.jsonl").is_file() {
            anyhow::bail!("{}: no committed metrics.jsonl to re-check", dir.display());
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            replay: true,
        })
    }

    /// `dir` as the report's place, neither created nor emptied:
    /// `--print-commands` writes no report.
    pub fn untouched(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            replay: false,
        }
    }

    /// Whether this is a committed report re-checked by `--from-results`.
    pub fn replaying(&self) -> bool {
        self.replay
    }

    /// A path inside the report.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// metrics.jsonl: every line of every run, tagged with `"run": label`;
    /// configs/<label>.toml: each run's resolved config.
    ///
    /// With `--from-results` they are the input and stay as committed: read
    /// and printed again, a float can come back one digit off in its last
    /// place (serde_json's parser without `float_roundtrip`, which the
    /// workspace does not enable).
    pub fn write_runs(&self, logs: &[RunLog]) -> Result<()> {
        if self.replay {
            return Ok(());
        }
        let mut all = String::new();
        for log in logs {
            for line in &log.lines {
                let mut tagged = serde_json::Map::new();
                tagged.insert("run".into(), log.label.clone().into());
                if let Some(fields) = line.as_object() {
                    tagged.extend(fields.clone());
                }
                writeln!(all, "{}", serde_json::Value::Object(tagged))?;
            }
            let config = log.dir.join("config.toml");
            if config.is_file() {
                let target = self.dir.join("configs").join(format!("{}.toml", log.label));
                std::fs::create_dir_all(target.parent().expect("has a parent"))?;
                std::fs::copy(&config, &target)
                    .with_context(|| format!("cannot copy {}", config.display()))?;
            }
        }
        self.write("metrics.jsonl", &all)
    }

    /// machine.txt: CPU, cores, memory, toolchain, commit, date, command,
    /// the variants `restored` from an earlier session (`shelf`) and those
    /// `reused` from `runs/`, each with the commit it finished at.
    pub fn write_machine(
        &self,
        command: &str,
        restored: &[String],
        reused: &[String],
    ) -> Result<()> {
        let cpu = crate::machine::cpu_model();
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .next()
                    .map(|l| l.replace("MemTotal:", "").trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let mut text = format!(
            "command: cargo xtask {command}\n\
             date: {}\n\
             commit: {}\n\
             cpu: {cpu}\n\
             cores: {cores}\n\
             memory: {memory}\n\
             rustc: {}\n\
             os: {}\n",
            commit::output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            commit::commit(),
            commit::output("rustc", &["--version"]),
            commit::output("uname", &["-srm"]),
        );
        for variant in restored {
            writeln!(text, "restored from an earlier session: {variant}")?;
        }
        for variant in reused {
            writeln!(text, "reused, not run again: {variant}")?;
        }
        self.write("machine.txt", &text)
    }

    /// Writes `name` inside the report.
    pub fn write(&self, name: &str, text: &str) -> Result<()> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// A markdown table.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as headers).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    /// The table in GitHub markdown.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = line(&self.header);
        out.push_str(&line(&vec!["---".to_string(); self.header.len()]));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}
