//! What the issue-10 measurements share: the `optim_network` benchmark run
//! one rank per netlab host, and its per-step lines.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::netlab::lab::{Lab, Shape};
use crate::netlab::launch;
use crate::netlab::rate::Rate;
use crate::terse_binary;

/// Ranks (and lab hosts) of every measurement: the papers' node count is
/// larger, but 4 is what one machine's cores can drive.
pub const RANKS: usize = 4;

/// The optimizers measured, in table order.
pub const OPTIMIZERS: [&str; 4] = ["adam", "onebit_adam", "onebit_lamb", "slamb"];

/// One optimizer step as the benchmark logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub optimizer: String,
    pub elements: u64,
    pub step: u64,
    pub stage: String,
    pub step_ms: f64,
    pub comm_ms: f64,
    pub collective_ms: f64,
    pub bytes_sent: u64,
    pub bytes_sent_max: u64,
    pub wire_bytes_sent: Option<u64>,
    /// Payload bytes TCP retransmitted within `wire_bytes_sent` (lines
    /// from before it was measured have none).
    pub wire_bytes_retransmitted: Option<u64>,
}

impl StepRow {
    fn parse(line: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(line)?;
        let text = |k: &str| v[k].as_str().map(str::to_string).context(k.to_string());
        let int = |k: &str| v[k].as_u64().with_context(|| k.to_string());
        let float = |k: &str| v[k].as_f64().with_context(|| k.to_string());
        Ok(Self {
            optimizer: text("optimizer")?,
            elements: int("elements")?,
            step: int("step")?,
            stage: text("stage")?,
            step_ms: float("step_ms")?,
            comm_ms: float("comm_ms")?,
            collective_ms: float("collective_ms")?,
            bytes_sent: int("bytes_sent")?,
            bytes_sent_max: int("bytes_sent_max")?,
            wire_bytes_sent: v["wire_bytes_sent"].as_u64(),
            wire_bytes_retransmitted: v["wire_bytes_retransmitted"].as_u64(),
        })
    }

    /// Whether the step compressed (or sparsified) its communication.
    pub fn compressed(&self) -> bool {
        matches!(self.stage.as_str(), "compression" | "sparse")
    }
}

/// One benchmark run: an optimizer stepping a buffer for `warmup` steps
/// before its freeze, `settle` steps after it and then `steps` measured ones.
#[derive(Debug, Clone)]
pub struct Run<'a> {
    pub optimizer: &'a str,
    pub elements: u64,
    pub warmup: u64,
    /// Steps after the freeze that are not measured: the first compressed
    /// step allocates and first touches the error buffers.
    pub settle: u64,
    pub steps: u64,
    /// Tags the lines (e.g. the link rate).
    pub label: String,
    /// Reshape every link to this rate after the warmup and settling steps
    /// (which then run at the lab's current rate).
    pub measure_at: Option<Rate>,
}

impl Run<'_> {
    /// The measured steps among `rows`: those after warmup and settling.
    pub fn measured<'r>(&self, rows: &'r [StepRow]) -> Vec<&'r StepRow> {
        rows.iter()
            .filter(|r| r.step > self.warmup + self.settle)
            .collect()
    }
}

/// The built benchmark.
pub struct Bench {
    exe: PathBuf,
}

impl Bench {
    /// Builds `optim_network` in the workspace's one profile.
    pub fn build() -> Result<Self> {
        Ok(Self {
            exe: terse_binary::build_bench("optim_network")?,
        })
    }

    /// Runs `run` on the first [`RANKS`] hosts of `lab`, appending its lines
    /// to `log`, and returns them.
    pub fn measure(&self, lab: &Lab, run: &Run<'_>, log: &Path) -> Result<Vec<StepRow>> {
        if lab.hosts() < RANKS {
            bail!("the lab has {} hosts, {RANKS} needed", lab.hosts());
        }
        let out = log.with_extension("part");
        let _ = std::fs::remove_file(&out);
        let mut args: Vec<String> = [
            "--elements",
            &run.elements.to_string(),
            "--optimizer",
            run.optimizer,
            "--warmup",
            &run.warmup.to_string(),
            "--settle",
            &run.settle.to_string(),
            "--steps",
            &run.steps.to_string(),
            "--label",
            &run.label,
            "--out",
            &out.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(rate) = run.measure_at {
            let xtask = crate::terse_binary::xtask_exe()?;
            // Last: every argument after it is the command (argv, no shell).
            args.push("--after-warmup".into());
            args.push(xtask.to_string_lossy().into_owned());
            args.extend(["netlab", "shape", "--hosts"].map(String::from));
            args.push(lab.hosts().to_string());
            args.push("--rate".into());
            args.push(rate.to_string());
        }
        eprintln!(
            "reproduce: {} on {RANKS} lab hosts, {} elements, {} ({} + {} + {} steps)",
            run.optimizer, run.elements, run.label, run.warmup, run.settle, run.steps
        );
        let status = launch::mpirun(RANKS, &self.exe, &args)?
            .stdout(std::process::Stdio::null())
            .status()
            .context("cannot start mpirun")?;
        if !status.success() {
            bail!(
                "optim_network ({} at {}) failed ({status})",
                run.optimizer,
                run.label
            );
        }
        let text = std::fs::read_to_string(&out)
            .with_context(|| format!("the benchmark wrote no {}", out.display()))?;
        let rows = text
            .lines()
            .map(StepRow::parse)
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("bad line in {}", out.display()))?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut file| file.write_all(text.as_bytes()))
            .with_context(|| format!("cannot append to {}", log.display()))?;
        std::fs::remove_file(&out)?;
        Ok(rows)
    }
}

/// `run`'s rows: measured by `bench` on `lab` after its links are reset to
/// `fast`, or, with no lab (`--from-results`), read back from the
/// committed `log`.
pub fn rows_of(
    measuring: Option<&(Bench, Lab)>,
    fast: Shape,
    run: &Run<'_>,
    log: &Path,
) -> Result<Vec<StepRow>> {
    match measuring {
        Some((bench, lab)) => {
            lab.reshape(fast)?;
            bench.measure(lab, run, log)
        }
        None => committed_rows(log, &run.label, run.optimizer),
    }
}

/// The rows of one run in a committed metrics.jsonl (`--from-results`):
/// those with `label` and `optimizer`, in file order.
pub fn committed_rows(metrics: &Path, label: &str, optimizer: &str) -> Result<Vec<StepRow>> {
    let text = std::fs::read_to_string(metrics)
        .with_context(|| format!("cannot read {}", metrics.display()))?;
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("bad line in {}", metrics.display()))?;
        if value["label"].as_str() == Some(label) && value["optimizer"].as_str() == Some(optimizer)
        {
            rows.push(StepRow::parse(line)?);
        }
    }
    if rows.is_empty() {
        bail!("{}: no lines of {optimizer} at {label}", metrics.display());
    }
    Ok(rows)
}

/// The mean of `f` over `rows`.
pub fn mean(rows: &[&StepRow], f: impl Fn(&StepRow) -> f64) -> f64 {
    rows.iter().map(|r| f(r)).sum::<f64>() / rows.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_benchmark_line() {
        let row = StepRow::parse(
            r#"{"label":"1gbit","optimizer":"onebit_adam","elements":4000512,"ranks":4,"step":3,"stage":"compression","step_ms":189.0,"comm_ms":171.4,"collective_ms":91.2,"bytes_sent":750120,"bytes_sent_max":750120,"wire_bytes_sent":754364,"wire_bytes_retransmitted":8948}"#,
        )
        .unwrap();
        assert!(row.compressed());
        assert_eq!(row.wire_bytes_sent, Some(754364));
        assert_eq!(row.wire_bytes_retransmitted, Some(8948));
        let outside = StepRow::parse(
            r#"{"label":"","optimizer":"adam","elements":8,"ranks":4,"step":1,"stage":"full","step_ms":1,"comm_ms":1,"collective_ms":1,"bytes_sent":48,"bytes_sent_max":48,"wire_bytes_sent":null}"#,
        )
        .unwrap();
        assert_eq!(outside.wire_bytes_sent, None);
        assert_eq!(outside.wire_bytes_retransmitted, None);
    }

    #[test]
    fn measured_steps_follow_warmup_and_settling() {
        let rows: Vec<StepRow> = (1..=4)
            .map(|step| StepRow {
                optimizer: "onebit_adam".into(),
                elements: 8,
                step,
                stage: if step == 1 { "warmup" } else { "compression" }.into(),
                step_ms: 1.0,
                comm_ms: 1.0,
                collective_ms: 1.0,
                bytes_sent: 8,
                bytes_sent_max: 8,
                wire_bytes_sent: None,
                wire_bytes_retransmitted: None,
            })
            .collect();
        let run = Run {
            optimizer: "onebit_adam",
            elements: 8,
            warmup: 1,
            settle: 1,
            steps: 2,
            label: String::new(),
            measure_at: None,
        };
        let steps: Vec<u64> = run.measured(&rows).iter().map(|r| r.step).collect();
        assert_eq!(steps, [3, 4]);
    }
}
