//! Runs an experiment's variants through the `terse` binary and reads back
//! what each one logged.
//!
//! A variant is a committed config plus `--set` overrides, so the difference
//! between, say, Adam and 1-bit Adam is the override on the command line and
//! nothing else. Each variant has its own run directory under
//! `runs/reproduce/`; a finished one is reused and an interrupted one resumed
//! from its last checkpoint (bit-identically), so re-running an experiment
//! after a crash or a Ctrl-C loses no finished work.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::Context;
use super::commit;
use super::replay::{EXPLODED, ended_diverging};
use super::same_settings::{self, Resolved};
use super::shelf::{FINISHED, Shelf};

/// One run of an experiment.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Short name: the legend entry and the run directory's name.
    pub label: String,
    /// The `terse` subcommand and its positional arguments, e.g. `["pretrain"]`.
    pub command: Vec<String>,
    /// The committed config the variant starts from.
    pub config: PathBuf,
    /// `--set` overrides (`key=value`).
    pub overrides: Vec<String>,
    /// Ranks, as threads of one process (the `local` backend).
    pub ranks: usize,
    /// Config keys this variant may differ in from the others of its
    /// comparison besides its optimizer's own fields (see `same_settings`).
    pub varies: Vec<String>,
}

impl Variant {
    /// A variant of `command` on `config` over `ranks` local ranks.
    pub fn new(label: &str, command: &[&str], config: &str, ranks: usize) -> Self {
        Self {
            label: label.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            config: PathBuf::from(config),
            overrides: Vec::new(),
            ranks,
            varies: Vec::new(),
        }
    }

    /// Declares that this variant differs from the others in `key` on
    /// purpose (the subject of the comparison, e.g. `train.seed`).
    pub fn varies(mut self, key: &str) -> Self {
        self.varies.push(key.to_string());
        self
    }

    /// Adds a `--set key=value` override.
    pub fn set(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        self.overrides.push(format!("{key}={value}"));
        self
    }

    /// The overrides of a pre-training run of `steps` steps of `batch`
    /// samples in micro-batches of `micro`: a checkpoint and an evaluation
    /// every quarter of the run, the learning rate warmed up over `warmup`
    /// steps and scheduled over the whole run.
    pub fn pretraining(self, (steps, batch, micro): (u64, usize, usize), warmup: u64) -> Self {
        self.set("train.steps", steps)
            .set("train.global_batch", batch)
            .set("train.micro_batch", micro)
            .set("train.checkpoint_every", steps / 4)
            .set("train.eval_every", steps / 4)
            .set("schedule.warmup_steps", warmup)
            .set("schedule.total_steps", steps)
    }
}

/// What one variant logged: its step and evaluation lines, in order.
#[derive(Debug, Clone)]
pub struct RunLog {
    /// The variant's label.
    pub label: String,
    /// Its run directory.
    pub dir: PathBuf,
    /// Every line of its metrics.jsonl.
    pub lines: Vec<Value>,
    /// The loss stopped being a number and `terse` stopped the run: the
    /// lines end at the last finite step.
    pub diverged: bool,
}

/// The metrics of an evaluation line, in logged order: `"eval"` is a map
/// since 2026-11-24 and a list of `[name, value]` pairs before (results
/// committed earlier are read as they are).
pub fn eval_metrics(line: &Value) -> Vec<(String, f64)> {
    match line.get("eval") {
        Some(Value::Object(map)) => map
            .iter()
            .filter_map(|(name, value)| Some((name.clone(), value.as_f64()?)))
            .collect(),
        Some(Value::Array(pairs)) => pairs
            .iter()
            .filter_map(|pair| Some((pair.get(0)?.as_str()?.to_string(), pair.get(1)?.as_f64()?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The numeric fields of a step line of metrics.jsonl (terse-train's
/// `StepRecord`; the test `reads_the_trainers_metrics_fixture` ties the two
/// through the fixture the trainer's own test checks its records against).
pub const STEP_FIELDS: [&str; 12] = [
    "epoch",
    "elapsed_s",
    "loss",
    "lr",
    "bytes_sent",
    "collectives",
    "forward_ms",
    "backward_ms",
    "comm_ms",
    "optimizer_ms",
    "samples_per_s",
    "grad_norm",
];

impl RunLog {
    /// `(step, value)` of a step field (one of [`STEP_FIELDS`]).
    pub fn series(&self, field: &str) -> Vec<(u64, f64)> {
        assert!(
            STEP_FIELDS.contains(&field),
            "`{field}` is not a field of terse's step records ({STEP_FIELDS:?})"
        );
        self.lines
            .iter()
            .filter(|line| line.get("eval").is_none())
            .filter_map(|line| Some((line["step"].as_u64()?, line.get(field)?.as_f64()?)))
            .collect()
    }

    /// `(step, value)` of an evaluation metric over the run.
    pub fn eval_series(&self, metric: &str) -> Vec<(u64, f64)> {
        self.lines
            .iter()
            .filter_map(|line| {
                let value = eval_metrics(line)
                    .into_iter()
                    .find_map(|(name, value)| (name == metric).then_some(value))?;
                Some((line["step"].as_u64()?, value))
            })
            .collect()
    }

    /// The last evaluation's value of `metric`. A diverged run scores the
    /// worst value, so comparisons rank it last: an infinite loss, zero
    /// accuracy or F1.
    pub fn final_eval(&self, metric: &str) -> Result<f64> {
        if self.diverged {
            return Ok(if metric.contains("loss") {
                f64::INFINITY
            } else {
                0.0
            });
        }
        self.eval_series(metric)
            .last()
            .map(|&(_, v)| v)
            .with_context(|| format!("{}: no `{metric}` evaluation logged", self.label))
    }

    /// Mean of a step field over the last `n` steps.
    pub fn tail_mean(&self, field: &str, n: usize) -> f64 {
        let series = self.series(field);
        let tail = &series[series.len().saturating_sub(n)..];
        tail.iter().map(|&(_, v)| v).sum::<f64>() / tail.len().max(1) as f64
    }

    /// `format(value)`, or where the run diverged.
    pub fn show(&self, value: f64, format: impl Fn(f64) -> String) -> String {
        if self.diverged {
            let last = self.series("loss").last().map_or(0, |&(s, _)| s);
            format!("diverged (NaN at step {})", last + 1)
        } else {
            format(value)
        }
    }

    /// Total of a step field over the run (e.g. bytes sent).
    pub fn total(&self, field: &str) -> f64 {
        self.series(field).iter().map(|&(_, v)| v).sum()
    }
}

/// Runs every variant (reusing or resuming what an earlier invocation left
/// in `runs_dir`) and returns their logs, in order. The variants are one
/// comparison: before anything runs, their resolved configs must agree in
/// everything but their optimizers' own fields and declared keys.
///
/// With `--from-results` nothing runs: the logs are read back from the
/// experiment's committed metrics.jsonl (see [`replay`]).
pub fn run_all(ctx: &Context, runs_dir: &Path, variants: &[Variant]) -> Result<Vec<RunLog>> {
    check_comparable(ctx, &[(runs_dir, variants)])?;
    if let Some(results) = &ctx.replay {
        return variants
            .iter()
            .map(|v| replay(results, runs_dir, &v.label))
            .collect();
    }
    if ctx.print_commands {
        for variant in variants {
            let line = command_line(variant, &runs_dir.join(&variant.label));
            println!("terse {}", shell_words(&line));
        }
        return Err(super::PrintedCommands.into());
    }
    let terse = ctx.terse()?;
    // The shelf holds this experiment's own variants, not those of a
    // sibling whose run directory it shares.
    let shelf = ctx.shelf.as_ref().filter(|_| runs_dir == ctx.runs);
    let mut logs = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        eprintln!(
            "reproduce: [{}/{}] {}",
            i + 1,
            variants.len(),
            variant.label
        );
        logs.push(run_one(terse, runs_dir, variant, shelf, &ctx.reused)?);
    }
    Ok(logs)
}

/// Refuses to go on when variants compared with each other — possibly from
/// several run directories, as when an experiment reuses another's runs —
/// differ in a config key that is not their subject (`same_settings`).
/// With `--from-results` the committed configs/<label>.toml are compared.
pub fn check_comparable(ctx: &Context, groups: &[(&Path, &[Variant])]) -> Result<()> {
    let mut resolved = Vec::new();
    for (runs_dir, variants) in groups {
        for variant in variants.iter() {
            resolved.push(match &ctx.replay {
                Some(results) => {
                    let label = committed_label(results, runs_dir, &variant.label)?;
                    let path = results.join("configs").join(format!("{label}.toml"));
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    Resolved::parse(&variant.label, &text, &variant.varies)?
                }
                None => resolve(ctx.terse()?, runs_dir, variant)?,
            });
        }
    }
    same_settings::check(&resolved)
}

/// Whether an experiment's committed results hold a run of `label` (an
/// experiment re-checking results that predate one of its variants).
pub fn is_committed(results: &Path, runs_dir: &Path, label: &str) -> bool {
    committed_label(results, runs_dir, label).is_ok()
}

/// The name a variant's run has in an experiment's committed results:
/// its label, or — where the experiment reports runs of several models
/// (scale-block) — the label behind the model's prefix.
fn committed_label(results: &Path, runs_dir: &Path, label: &str) -> Result<String> {
    let prefix = if runs_dir.ends_with("vgg16") {
        "vgg16_"
    } else {
        "bert_"
    };
    for candidate in [label.to_string(), format!("{prefix}{label}")] {
        if results
            .join("configs")
            .join(format!("{candidate}.toml"))
            .is_file()
        {
            return Ok(candidate);
        }
    }
    bail!(
        "{}: no committed run `{label}` (configs/{label}.toml)",
        results.display()
    )
}

/// A variant's log as the committed results hold it: its lines of
/// metrics.jsonl (the `run` tag removed). A run whose last logged step is
/// short of the `train.steps` of its committed config diverged where its
/// metrics say so (the `"diverged": true` line) or its last loss shows it
/// ([`ended_diverging`]: runs from before that line); one that stops short
/// otherwise is incomplete, an error: scoring it as diverged would decide
/// every "ends worse" claim against it.
pub fn replay(results: &Path, runs_dir: &Path, label: &str) -> Result<RunLog> {
    let name = committed_label(results, runs_dir, label)?;
    let mut lines = read_jsonl(&results.join("metrics.jsonl"))?;
    lines.retain(|line| line.get("run").and_then(Value::as_str) == Some(name.as_str()));
    for line in &mut lines {
        if let Some(fields) = line.as_object_mut() {
            fields.remove("run");
        }
    }
    let config = results.join("configs").join(format!("{name}.toml"));
    let config = std::fs::read_to_string(&config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let steps = config
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("train")?.get("steps")?.as_integer())
        .with_context(|| format!("{name}: no train.steps in its committed config"))?;
    let last = lines
        .iter()
        .filter_map(|l| l.get("step")?.as_u64())
        .max()
        .unwrap_or(0);
    let short = last < steps as u64;
    if short && !ended_diverging(&lines) {
        bail!(
            "{}: run `{name}` ends at step {last} of its {steps} without having diverged (no \
             \"diverged\" line, its last loss finite and not {EXPLODED}× its lowest): its \
             committed metrics are incomplete",
            results.display()
        );
    }
    Ok(RunLog {
        label: label.to_string(),
        dir: results.to_path_buf(),
        diverged: short,
        lines,
    })
}

/// A variant's config as `terse` resolves it.
fn resolve(terse: &Path, runs_dir: &Path, variant: &Variant) -> Result<Resolved> {
    Resolved::parse(
        &variant.label,
        &print_config(terse, runs_dir, variant)?,
        &variant.varies,
    )
}

/// A variant's config as `terse --print-config` prints it: the text its
/// run directory's config.toml gets.
fn print_config(terse: &Path, runs_dir: &Path, variant: &Variant) -> Result<String> {
    let output = Command::new(terse)
        .args(command_line(variant, &runs_dir.join(&variant.label)))
        .arg("--print-config")
        .output()
        .with_context(|| format!("cannot start {}", terse.display()))?;
    if !output.status.success() {
        bail!(
            "variant `{}`: its config does not resolve: {}",
            variant.label,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn run_one(
    terse: &Path,
    runs_dir: &Path,
    variant: &Variant,
    shelf: Option<&Shelf>,
    reused: &RefCell<Vec<String>>,
) -> Result<RunLog> {
    let dir = runs_dir.join(&variant.label);
    let stamp = dir.join("variant.txt");
    let command_line = command_line(variant, &dir);
    let same_variant =
        std::fs::read_to_string(&stamp).is_ok_and(|text| text.trim() == command_line.join(" "));
    if same_variant && finished(&dir) {
        eprintln!(
            "reproduce: {}: finished earlier, reusing {}",
            variant.label,
            dir.display()
        );
        // Where it ran, for machine.txt: the marker's commit (empty in runs
        // that finished before the runner wrote it there).
        let origin = std::fs::read_to_string(dir.join(FINISHED)).unwrap_or_default();
        let origin = match origin.trim() {
            "" => "its commit not recorded (finished before runs recorded it)",
            origin => origin,
        };
        reused
            .borrow_mut()
            .push(format!("{} ({}): {origin}", variant.label, dir.display()));
        return read_log(variant, &dir);
    }
    if let Some(shelf) = shelf.filter(|shelf| shelf.holds(&variant.label)) {
        let config = print_config(terse, runs_dir, variant)?;
        if shelf.restore(&variant.label, &command_line.join(" "), &config, &dir)? {
            eprintln!(
                "reproduce: {}: finished in an earlier session, restored from the committed \
                 results ({})",
                variant.label,
                super::shelf::DIR
            );
            return read_log(variant, &dir);
        }
        eprintln!(
            "reproduce: {}: the committed results hold another version of it (command line or \
             resolved config differ); running it again",
            variant.label
        );
    }
    let resume = same_variant && dir.join("checkpoints").is_dir();
    if !resume && dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&stamp, command_line.join(" ") + "\n")?;
    let mut command = Command::new(terse);
    command.args(&command_line);
    if resume {
        eprintln!(
            "reproduce: {}: resuming from its last checkpoint",
            variant.label
        );
        command.arg("--resume");
    }
    let status = command
        .status()
        .with_context(|| format!("cannot start {}", terse.display()))?;
    if status.code() == Some(DIVERGED_EXIT) {
        // A result, not a failure: the experiment reports it.
        eprintln!("reproduce: {}: diverged", variant.label);
        std::fs::write(dir.join(DIVERGED), "")?;
    } else if !status.success() {
        bail!(
            "variant `{}` failed ({status}); its run directory {} is kept, and running the \
             same command again resumes it",
            variant.label,
            dir.display()
        );
    }
    let origin = format!("finished at commit {}", commit::commit());
    std::fs::write(dir.join(FINISHED), format!("{origin}\n"))?;
    if let Some(shelf) = shelf {
        shelf.put(&variant.label, &dir, &origin)?;
    }
    // A finished variant is read, never resumed: its checkpoints (every
    // rank's model and optimizer state, twice; 7 GB over finetune-parity's
    // quick variants) go, its metrics, config and export stay.
    remove_checkpoints(&dir)?;
    read_log(variant, &dir)
}

/// Removes `run_dir`'s checkpoints (its metrics, config and export stay).
pub fn remove_checkpoints(run_dir: &Path) -> Result<()> {
    let dir = run_dir.join("checkpoints");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    Ok(())
}

/// The `terse` arguments of a variant writing to `dir`.
pub fn command_line(variant: &Variant, dir: &Path) -> Vec<String> {
    let mut args = variant.command.clone();
    args.extend(["--config".into(), variant.config.display().to_string()]);
    for o in &variant.overrides {
        args.extend(["--set".into(), o.clone()]);
    }
    args.extend(["--run-dir".into(), dir.display().to_string()]);
    if variant.ranks > 1 {
        args.extend(["--local-ranks".into(), variant.ranks.to_string()]);
    }
    args
}

/// `args` as one shell line: each argument quoted where the shell would
/// split or expand it (`--set optimizer={ name = "adam", … }`).
fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|arg| {
            if arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
            {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Written beside [`FINISHED`] when the run ended by diverging.
const DIVERGED: &str = "diverged";

/// `terse`'s exit status when the loss stopped being a number.
const DIVERGED_EXIT: i32 = 3;

fn finished(dir: &Path) -> bool {
    dir.join(FINISHED).is_file() && dir.join("metrics.jsonl").is_file()
}

pub fn read_log(variant: &Variant, dir: &Path) -> Result<RunLog> {
    RunLog::read(&variant.label, dir)
}

impl RunLog {
    /// The metrics.jsonl of run directory `dir`, labelled `label`.
    pub fn read(label: &str, dir: &Path) -> Result<RunLog> {
        let lines = read_jsonl(&dir.join("metrics.jsonl"))?;
        // terse ends a diverged run's metrics with `{"step": N, "diverged":
        // true}`; the reproduction runner also marks the directory.
        let diverged = dir.join(DIVERGED).is_file()
            || lines
                .iter()
                .any(|line| line.get("diverged").and_then(Value::as_bool) == Some(true));
        Ok(RunLog {
            label: label.to_string(),
            dir: dir.to_path_buf(),
            lines,
            diverged,
        })
    }
}

/// Every line of a JSON-lines file, naming the file and line of a bad one.
pub fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_trainers_metrics_fixture() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/train/tests/fixtures");
        let log = RunLog::read("fixture", &dir).unwrap();
        assert_eq!(log.series("loss"), vec![(1, 10.5), (2, 9.75)]);
        assert_eq!(log.total("bytes_sent"), 1_081_344.0);
        assert_eq!(log.total("collectives"), 4.0);
        assert_eq!(log.series("comm_ms"), vec![(1, 3.25), (2, 0.5)]);
        assert_eq!(log.eval_series("mlm_accuracy"), vec![(0, 0.0), (2, 0.125)]);
        assert_eq!(log.final_eval("mlm_majority_accuracy").unwrap(), 0.0705);
        // Every numeric field the trainer writes is one this reader knows,
        // and every one it knows is written.
        let mut known = STEP_FIELDS.to_vec();
        known.sort_unstable();
        for line in log.lines.iter().filter(|l| l.get("eval").is_none()) {
            let mut written: Vec<&str> = line
                .as_object()
                .unwrap()
                .iter()
                .filter(|(key, value)| value.is_number() && *key != "step")
                .map(|(key, _)| key.as_str())
                .collect();
            written.sort_unstable();
            assert_eq!(written, known);
        }
    }

    #[test]
    fn printed_command_lines_quote_what_the_shell_would_split() {
        let args: Vec<String> = [
            "pretrain",
            "--set",
            r#"optimizer={ name = "adam" }"#,
            "--set",
            "train.device=wgpu:1",
            "it's",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            shell_words(&args),
            r#"pretrain --set 'optimizer={ name = "adam" }' --set train.device=wgpu:1 'it'\''s'"#
        );
    }
}
