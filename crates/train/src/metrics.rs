//! What a run reports: one JSON line per optimizer step (written by rank 0
//! to `metrics.jsonl`, appended to on resume) and evaluation lines, as
//! TensorBoard scalars too; the end-of-run summary is `run_summary.rs`.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::TrainError;
use crate::tensorboard::EventWriter;

/// One optimizer step, as logged.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    /// The step (from 1).
    pub step: u64,
    /// The epoch the step's examples come from (from 0).
    pub epoch: u64,
    /// Seconds since this process started training (a resumed run starts
    /// again from 0).
    pub elapsed_s: f64,
    /// Training loss, averaged over the step's micro-batches and all ranks.
    pub loss: f64,
    /// The step's learning rate.
    pub lr: f64,
    /// `full`, `warmup`, `compression`, `sparse` or `local`.
    pub stage: String,
    /// Bytes this rank sent in the optimizer's collectives.
    pub bytes_sent: u64,
    /// The optimizer's collective calls on this rank: its communication
    /// rounds (a compressed allreduce is several).
    pub collectives: u64,
    /// Forward passes, batch collation included.
    pub forward_ms: f64,
    /// Backward passes and gradient accumulation.
    pub backward_ms: f64,
    /// Time inside the optimizer's collectives.
    pub comm_ms: f64,
    /// The rest of the optimizer step (update, compression, copies).
    pub optimizer_ms: f64,
    /// Examples per second over all ranks for this step.
    pub samples_per_s: f64,
    /// The gradient's global norm before clipping (the root mean square of
    /// the ranks' norms; see `train.max_grad_norm`; 0 on a skipped step).
    pub grad_norm: f64,
    /// fp16: the loss scale the step tried (absent in other precisions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// fp16: the step overflowed on some rank and every rank skipped it
    /// (its batch consumed, nothing updated).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// On a cubecl device: how long rank 0 waited at the step's end for the
    /// device to finish the work the step queued (the phases above time
    /// the host queueing it; absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_wait_ms: Option<f64>,
    /// On a cubecl device: rank 0's device → host reads in the step, by
    /// phase (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_reads: Option<StepReads>,
    /// On a cubecl device: rank 0's device memory at the step's end
    /// (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory_mb: Option<DeviceMemoryMb>,
}

#[cfg(test)]
impl StepRecord {
    /// A record of step `step` with these numbers and nothing else.
    pub(crate) fn example(step: u64, loss: f64, lr: f64, stage: &str, samples_per_s: f64) -> Self {
        Self {
            step,
            epoch: 0,
            elapsed_s: 0.0,
            loss,
            lr,
            stage: stage.into(),
            bytes_sent: 0,
            collectives: 0,
            forward_ms: 0.0,
            backward_ms: 0.0,
            comm_ms: 0.0,
            optimizer_ms: 0.0,
            samples_per_s,
            grad_norm: 0.0,
            loss_scale: None,
            skipped: false,
            device_wait_ms: None,
            host_reads: None,
            device_memory_mb: None,
        }
    }
}

/// A device's memory as cubecl's memory manager counts it, in MB (10⁶
/// bytes): what PyTorch calls allocated and reserved memory
/// (`torch.cuda.memory_allocated`, `memory_reserved`), DeepSpeed's `MA` and
/// `CA`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeviceMemoryMb {
    /// Bytes of live allocations (tensors, buffers, optimizer state).
    pub in_use: f64,
    /// Bytes of the pages the memory pools hold, live or free for reuse.
    pub reserved: f64,
}

impl From<cubecl::MemoryUsage> for DeviceMemoryMb {
    fn from(usage: cubecl::MemoryUsage) -> Self {
        Self {
            in_use: usage.bytes_in_use as f64 / 1e6,
            reserved: usage.bytes_reserved as f64 / 1e6,
        }
    }
}

/// A step's device → host reads by phase (each waits for the device to
/// finish what was queued before it; `terse_kernels::host_reads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepReads {
    /// Before the optimizer's step: forward, backward, the gradient into
    /// the flat buffer, fp16's overflow check and clipping.
    pub before_update: u64,
    /// In the optimizer's step (its rules and collectives).
    pub update: u64,
    /// After it was queued: the step's loss and gradient norm.
    pub after_update: u64,
}

/// An evaluation, as logged: `{"step": 300, "eval": {"mlm_accuracy": 0.41,
/// …}}`, metrics in the task's order.
#[derive(Debug, Clone, Serialize)]
pub struct EvalRecord {
    /// The step evaluated after.
    pub step: u64,
    /// Metric name → value.
    #[serde(serialize_with = "pairs_as_map")]
    pub eval: Vec<(String, f64)>,
}

/// The last line of a run whose loss stopped being a number: `{"step": 23,
/// "diverged": true}` (the step whose loss was not finite; no step line is
/// written for it), so that readers of metrics.jsonl (`cargo xtask plot`)
/// can tell a divergence from a run that was stopped.
#[derive(Debug, Clone, Serialize)]
pub struct DivergedRecord {
    /// The step whose loss was not finite.
    pub step: u64,
    /// Always `true`.
    pub diverged: bool,
}

fn pairs_as_map<S: serde::Serializer>(
    pairs: &[(String, f64)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(Some(pairs.len()))?;
    for (name, value) in pairs {
        map.serialize_entry(name, value)?;
    }
    map.end()
}

/// Rank 0's metrics file (other ranks hold a sink that writes nothing).
pub struct MetricsLog {
    file: Option<BufWriter<File>>,
    path: PathBuf,
    /// The same records as TensorBoard scalars (`train/<field>`,
    /// `eval/<metric>`), in an event file beside metrics.jsonl.
    events: Option<EventWriter>,
    /// Whether the log already holds the evaluation after the step the run
    /// starts from (a resumed run that stopped before it, on a signal at
    /// an evaluation step, makes it; one that made it does not again).
    evaluated_at_start: bool,
}

impl MetricsLog {
    /// Opens `dir/metrics.jsonl` for appending when `write`, first dropping
    /// the lines of steps after `from_step` (a resumed run logs them again).
    /// A run from step 0 — fresh, or resumed with no checkpoint yet —
    /// starts an empty log and drops the directory's earlier TensorBoard
    /// event files: its steps replace theirs (kept, TensorBoard drew both).
    pub fn open(dir: &Path, write: bool, from_step: u64) -> Result<Self, TrainError> {
        let path = dir.join("metrics.jsonl");
        let mut evaluated_at_start = false;
        if write && from_step == 0 {
            start_over(dir, &path)?;
        } else if write && path.exists() {
            evaluated_at_start = keep_through(&path, from_step)?;
        }
        let events = if write {
            Some(EventWriter::create(dir, from_step)?)
        } else {
            None
        };
        let file = if write {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|source| TrainError::Io {
                    path: path.clone(),
                    source,
                })?;
            Some(BufWriter::new(file))
        } else {
            None
        };
        Ok(Self {
            file,
            path,
            events,
            evaluated_at_start,
        })
    }

    /// Whether the log holds the evaluation after the step the run
    /// started from (`open`'s `from_step`, > 0).
    pub fn evaluated_at_start(&self) -> bool {
        self.evaluated_at_start
    }

    /// Appends one JSON line and flushes it (a crash loses no logged step),
    /// and writes its numbers as TensorBoard scalars.
    pub fn line<T: Serialize>(&mut self, record: &T) -> Result<(), TrainError> {
        if let Some(file) = &mut self.file {
            let json = serde_json::to_string(record).expect("records serialise");
            writeln!(file, "{json}")
                .and_then(|()| file.flush())
                .map_err(|source| TrainError::Io {
                    path: self.path.clone(),
                    source,
                })?;
        }
        if let Some(events) = &mut self.events {
            let value = serde_json::to_value(record).expect("records serialise");
            let (step, scalars) = scalars_of(&value);
            let scalars: Vec<(&str, f64)> = scalars.iter().map(|(t, v)| (t.as_str(), *v)).collect();
            if !scalars.is_empty() {
                events.scalars(step, &scalars)?;
            }
        }
        Ok(())
    }
}

/// A record's step and its numbers as TensorBoard tags: a step record's
/// fields as `train/<field>`, an evaluation's metrics as `eval/<metric>`.
fn scalars_of(record: &serde_json::Value) -> (u64, Vec<(String, f64)>) {
    let step = record["step"].as_u64().unwrap_or(0);
    let mut scalars = Vec::new();
    if let Some(eval) = record["eval"].as_object() {
        for (name, value) in eval {
            if let Some(value) = value.as_f64() {
                scalars.push((format!("eval/{name}"), value));
            }
        }
    } else if let Some(fields) = record.as_object() {
        for (name, value) in fields {
            if let Some(value) = value.as_f64()
                && name != "step"
            {
                scalars.push((format!("train/{name}"), value));
            }
        }
    }
    (step, scalars)
}

/// Rewrites `path` (atomically) with only the lines of steps ≤ `step`;
/// returns whether an evaluation of step `step` is among them.
fn keep_through(path: &Path, step: u64) -> Result<bool, TrainError> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(io)?;
    let mut evaluated = false;
    let kept: String = text
        .lines()
        .filter(|line| {
            let record = serde_json::from_str::<serde_json::Value>(line).ok();
            let at = record
                .as_ref()
                .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64));
            if at == Some(step) && record.as_ref().is_some_and(|v| v.get("eval").is_some()) {
                evaluated = true;
            }
            at.is_some_and(|s| s <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let tmp = path.with_extension("jsonl.tmp");
    std::fs::write(&tmp, kept).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(evaluated)
}

/// A run from step 0 in `dir`: no metrics lines and, where an earlier run
/// logged them (its metrics.jsonl is there), no TensorBoard event files.
fn start_over(dir: &Path, metrics: &Path) -> Result<(), TrainError> {
    // Emptied in place, as the append below would open it (a file on a
    // filesystem that hangs hangs here, where the run names its phase).
    let emptied = OpenOptions::new().write(true).truncate(true).open(metrics);
    match emptied {
        // No earlier run logged here: event files in the directory are
        // not one's to drop.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TrainError::Io {
            path: metrics.to_path_buf(),
            source,
        }),
        Ok(_) => crate::run_dir::remove_event_files(dir),
    }
}

/// Milliseconds since `since`, as the records report durations.
pub(crate) fn ms(since: std::time::Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_names_every_step_field_and_no_other() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let mut documented: Vec<String> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| step-line field |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .flat_map(|row| {
                let cell = row.split('|').nth(1).unwrap_or("");
                cell.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        documented.sort();
        let record = StepRecord::example(1, 0.0, 0.0, "", 0.0);
        let value = serde_json::to_value(&record).unwrap();
        let mut written: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        written.sort();
        assert_eq!(
            documented, written,
            "README's step-line table against StepRecord"
        );
    }

    #[test]
    fn a_divergence_is_its_own_line() {
        let line = serde_json::to_string(&DivergedRecord {
            step: 23,
            diverged: true,
        })
        .unwrap();
        assert_eq!(line, r#"{"step":23,"diverged":true}"#);
    }

    /// The metrics format is a contract with `cargo xtask reproduce`, which
    /// reads the same committed fixture in its own test
    /// (xtask/src/reproduce/runner.rs). A change to a record's fields fails
    /// here first: update the fixture, then xtask's reader.
    #[test]
    fn the_records_serialise_as_the_committed_fixture() {
        let metrics = |pairs: [(&str, f64); 3]| -> Vec<(String, f64)> {
            pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
        };
        let step = |step, loss, lr, stage: &str, bytes_sent, phases: [f64; 4], rates: [f64; 2]| {
            serde_json::to_string(&StepRecord {
                step,
                epoch: 0,
                elapsed_s: step as f64 * 0.5,
                loss,
                lr,
                stage: stage.to_string(),
                bytes_sent,
                collectives: if stage == "warmup" { 1 } else { 3 },
                forward_ms: phases[0],
                backward_ms: phases[1],
                comm_ms: phases[2],
                optimizer_ms: phases[3],
                samples_per_s: rates[0],
                grad_norm: rates[1],
                loss_scale: None,
                skipped: false,
                device_wait_ms: None,
                host_reads: None,
                device_memory_mb: None,
            })
            .unwrap()
        };
        let lines = [
            serde_json::to_string(&EvalRecord {
                step: 0,
                eval: metrics([
                    ("mlm_loss", 10.25),
                    ("mlm_accuracy", 0.0),
                    ("mlm_majority_accuracy", 0.0705),
                ]),
            })
            .unwrap(),
            step(
                1,
                10.5,
                1e-4,
                "warmup",
                1_048_576,
                [12.5, 25.0, 3.25, 1.5],
                [376.5, 4.5],
            ),
            step(
                2,
                9.75,
                2e-4,
                "compression",
                32_768,
                [12.0, 24.5, 0.5, 2.0],
                [410.0, 2.25],
            ),
            serde_json::to_string(&EvalRecord {
                step: 2,
                eval: metrics([
                    ("mlm_loss", 9.5),
                    ("mlm_accuracy", 0.125),
                    ("mlm_majority_accuracy", 0.0705),
                ]),
            })
            .unwrap(),
        ];
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/metrics.jsonl");
        let fixture = std::fs::read_to_string(&path).unwrap();
        let committed: Vec<&str> = fixture.lines().collect();
        assert_eq!(
            committed,
            lines,
            "{} no longer matches the records",
            path.display()
        );
    }

    #[test]
    fn a_run_from_step_zero_replaces_the_earlier_runs_lines_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = dir.path().join("metrics.jsonl");
        let lines =
            "{\"step\":0,\"eval\":{}}\n{\"step\":1}\n{\"step\":1,\"eval\":{}}\n{\"step\":2}\n";
        std::fs::write(&metrics, lines).unwrap();
        let events = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with("events")
                })
                .count()
        };
        let resumed = MetricsLog::open(dir.path(), true, 1).unwrap();
        assert!(resumed.evaluated_at_start());
        assert_eq!(
            std::fs::read_to_string(&metrics).unwrap().lines().count(),
            3
        );
        drop(resumed);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(
            !MetricsLog::open(dir.path(), true, 2)
                .unwrap()
                .evaluated_at_start()
        );
        assert_eq!(events(), 2);
        let fresh = MetricsLog::open(dir.path(), true, 0).unwrap();
        assert!(!fresh.evaluated_at_start());
        assert_eq!(std::fs::read_to_string(&metrics).unwrap(), "");
        assert_eq!(events(), 1);
        // Event files where no terse run logged are not this run's to drop.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("events.out.tfevents.1.host.2"), b"").unwrap();
        drop(MetricsLog::open(other.path(), true, 0).unwrap());
        let kept = std::fs::read_dir(other.path()).unwrap().count();
        assert_eq!(kept, 3, "theirs, ours and metrics.jsonl");
    }
}
