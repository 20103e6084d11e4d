//! `cargo xtask bench`: benchmark one layer of the stack.
//!
//! The papers' speed-ups come from three places: cheap compression kernels, an
//! optimizer step that adds little over Adam, and collectives that move fewer
//! bytes. Each suite times one of them and prints ratios against a baseline
//! measured in the same run (STYLE.md): `kernels` (against memcpy), `optim`
//! (`crates/optim/benches/optim_step.rs`, against Adam and memory
//! bandwidth), `comm` (`crates/comm/benches/comm_allreduce.rs`, under
//! `mpirun -np 4`, against MPI_Allreduce) and `model` (a BERT training step
//! against PyTorch eager on the same CPU) and `workers` (simulated workers:
//! local ranks against MPI processes, `bench_workers.rs`), all built in the
//! workspace's one profile.

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::mpi;
use crate::terse_binary;

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The suite to run
    #[arg(value_enum)]
    pub name: Suite,

    /// Fewer sizes and repetitions: a smoke run for CI, not numbers to quote
    #[arg(long)]
    pub quick: bool,

    /// `bench kernels`: where the cubecl kernels run [default: lavapipe].
    /// `bench optim`: a device to step every optimizer on beside the same
    /// step on the CPU.
    /// `bench model`: a device to time the training step on beside the
    /// same step on the CPU (without it: the CPU beside PyTorch). lavapipe
    /// is Vulkan on the CPU (always available), wgpu the machine's default
    /// adapter (a GPU where there is one), cuda an NVIDIA GPU through
    /// burn's CUDA backend (the driver, NVRTC and CUDA's headers at run
    /// time; `bench optim` and `bench model` only)
    #[arg(long, value_enum)]
    pub device: Option<KernelDevice>,

    /// `bench model`: a Python with torch and transformers for the PyTorch
    /// side [default: $TERSE_BENCH_PYTHON, else a virtualenv created in
    /// ~/.cache/terse/bench-venv (pip install torch transformers, ~6 GB)]
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<std::path::PathBuf>,

    /// `bench model` on the CPU: BERT mini and base in this precision
    /// (bf16, fp16: the trainer's autocast) beside PyTorch's autocast in the
    /// same precision (fp16 with its GradScaler); ResNet-20 is left out
    #[arg(long, value_name = "PRECISION", value_parser = ["fp32", "bf16", "fp16"])]
    pub precision: Option<String>,

    /// `bench model --device`: then the device's steps once more with every
    /// kernel timed on the device (model_step --kernel-times): the step's
    /// kernel time by kind (matmul, elementwise, reduce, copy, other) in its
    /// line, the costliest kernels on stderr; checked to time every dispatch
    /// once and to fit in the step
    #[arg(long)]
    pub kernel_times: bool,
}

/// The device `bench kernels` launches the cubecl kernels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelDevice {
    /// Mesa's software Vulkan device
    Lavapipe,
    /// The default wgpu adapter (a GPU where there is one)
    Wgpu,
    /// CUDA through cubecl-cuda
    Cuda,
}

/// A benchmark suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Compression kernels (1-bit pack/unpack, error feedback, masking), CPU and GPU
    Kernels,
    /// One step of each optimizer on a BERT-sized flat parameter vector, against Adam
    Optim,
    /// Compressed vs fp32 allreduce (time, bytes) on 4 MPI ranks; results/bench/comm.json
    Comm,
    /// A BERT mini and base pre-training step (seq 128) on flex, and ResNet-20, beside PyTorch eager CPU
    Model,
    /// BERT-Tiny and mini pre-training on 1, 2, 4 local ranks and 2 mpirun processes, each 5 times in turn (medians compared); results/bench/workers.json
    Workers,
}

/// Runs `bench`, once its flags are known to apply to the suite.
pub fn run(args: &Args) -> Result<()> {
    flags_apply(args)?;
    match (args.name, args.device) {
        (Suite::Comm, _) => run_comm(args.quick),
        (Suite::Kernels, device) => {
            run_kernels(args.quick, device.unwrap_or(KernelDevice::Lavapipe))
        }
        (Suite::Model, Some(device)) => run_model_on(args.quick, device, args.kernel_times),
        (Suite::Model, None) => {
            run_model(args.quick, args.python.clone(), args.precision.as_deref())
        }
        (Suite::Optim, Some(device)) => run_optim_on(args.quick, device),
        (Suite::Optim, None) => run_cargo_bench("optim_step", quick_flag(args.quick)),
        (Suite::Workers, _) => crate::bench_workers::run(args.quick),
    }
}

/// Refuses `--device`, `--precision`, `--python` and `--kernel-times` where the suite has no use for
/// them, rather than running without them.
fn flags_apply(args: &Args) -> Result<()> {
    if args.precision.is_some() && (args.name != Suite::Model || args.device.is_some()) {
        bail!("--precision applies to `bench model` on the CPU (beside PyTorch) only");
    }
    if args.device.is_some() && !matches!(args.name, Suite::Kernels | Suite::Optim | Suite::Model) {
        bail!("--device applies to `bench kernels`, `bench optim` and `bench model` only");
    }
    if args.python.is_some() && (args.name != Suite::Model || args.device.is_some()) {
        bail!(
            "--python applies to `bench model` on the CPU (beside PyTorch) only; on a GPU, \
             `cargo xtask bundle`'s run.sh times PyTorch beside terse"
        );
    }
    if args.kernel_times && (args.name != Suite::Model || args.device.is_none()) {
        bail!("--kernel-times applies to `bench model --device` only");
    }
    Ok(())
}

fn quick_flag(quick: bool) -> &'static [&'static str] {
    if quick { &["--quick"] } else { &[] }
}

/// Runs bench target `bench` through `cargo test` with `args` after `--`.
/// `--workspace` resolves features as the tests do, so nothing is rebuilt.
fn run_cargo_bench(bench: &str, args: &[&str]) -> Result<()> {
    crate::finish::finish(
        terse_binary::cargo()?
            .args(["test", "--quiet", "--workspace", "--bench", bench, "--"])
            .args(args),
        &format!("the `{bench}` benchmark"),
    )
}

/// Each optimizer's step on `device` beside the same step on the CPU
/// (`crates/optim/benches/optim_device.rs`).
fn run_optim_on(quick: bool, device: KernelDevice) -> Result<()> {
    let device = match device {
        KernelDevice::Lavapipe => "lavapipe",
        KernelDevice::Wgpu => "wgpu",
        KernelDevice::Cuda => "cuda",
    };
    let mut args = quick_flag(quick).to_vec();
    args.extend(["--device", device]);
    run_cargo_bench("optim_device", &args)
}

/// Builds and runs the kernels benchmark (CPU against memcpy, cubecl on
/// `device` for information).
fn run_kernels(quick: bool, device: KernelDevice) -> Result<()> {
    if device == KernelDevice::Cuda {
        bail!(
            "bench kernels times the compression kernels on wgpu devices (lavapipe, wgpu); on \
             an NVIDIA GPU `bench optim --device cuda` runs them through CUDA in every \
             optimizer's step"
        );
    }
    let mut args = quick_flag(quick).to_vec();
    if device == KernelDevice::Wgpu {
        args.extend(["--device", "wgpu"]);
    }
    run_cargo_bench("kernels", &args)
}

/// The terse side (`crates/train/benches/model_step/`: BERT mini and
/// base, ResNet-20), then the same steps in PyTorch
/// (`benches/pytorch_bert_step.py`, `benches/pytorch_resnet_step.py`) in
/// the same run; prints terse ÷ PyTorch per model and appends every line,
/// numbered as the next run, to `results/bench/model.jsonl`. The quick mode
/// runs the terse side alone (CI has no PyTorch).
fn run_model(
    quick: bool,
    python: Option<std::path::PathBuf>,
    precision: Option<&str>,
) -> Result<()> {
    let precision = precision.unwrap_or("fp32");
    if quick {
        return run_cargo_bench("model_step", &["--quick", "--precision", precision]);
    }
    // Mixed precision is BERT's only (the image models compute in fp32).
    let half = precision != "fp32";
    let terse = capture_lines(
        model_step()?
            .args([
                "--presets",
                if half {
                    "mini,base"
                } else {
                    "mini,base,resnet20"
                },
            ])
            .args(bert_shape(precision)),
        "the model_step benchmark",
    )?;
    let python = match python.or_else(|| std::env::var_os("TERSE_BENCH_PYTHON").map(Into::into)) {
        Some(python) => python,
        None => bench_venv()?,
    };
    let mut pytorch = capture_lines(
        std::process::Command::new(&python)
            .args(["benches/pytorch_bert_step.py", "--presets", "mini,base"])
            .args(bert_shape(precision)),
        "the PyTorch BERT step (is torch installed for that python?)",
    )?;
    if !half {
        pytorch.extend(capture_lines(
            std::process::Command::new(&python).args([
                "benches/pytorch_resnet_step.py",
                "--batch",
                "128",
            ]),
            "the PyTorch ResNet-20 step",
        )?);
    }
    let rate = |line: &serde_json::Value| line["samples_per_s"].as_f64().unwrap_or(f64::NAN);
    println!("model      terse samples/s   PyTorch samples/s   terse ÷ PyTorch");
    for t in &terse {
        let preset = t["preset"].as_str().unwrap_or("?");
        if let Some(p) = pytorch
            .iter()
            .find(|p| p["preset"].as_str() == Some(preset))
        {
            println!(
                "{preset:<10} {:>15.3} {:>19.3} {:>16.2}×",
                rate(t),
                rate(p),
                rate(t) / rate(p)
            );
        }
    }
    append_run("results/bench/model.jsonl", &terse, &pytorch)
}

/// The step both sides of `bench model` time: a batch of 8 sequences of
/// 128 tokens, in `precision`.
fn bert_shape(precision: &str) -> [&str; 6] {
    ["--batch", "8", "--seq", "128", "--precision", precision]
}

/// `cargo test --bench model_step --`, for the benchmark's own arguments.
fn model_step() -> Result<std::process::Command> {
    let mut command = terse_binary::cargo()?;
    command.args([
        "test",
        "--quiet",
        "--workspace",
        "--bench",
        "model_step",
        "--",
    ]);
    Ok(command)
}

/// `bench model --device D`: the terse training step on the CPU and on
/// `device`, each as its own run of `model_step`, and the ratio; with
/// `kernel_times` a third run on `device` times each kernel and is checked
/// ([`kernel_times_hold`]).
fn run_model_on(quick: bool, device: KernelDevice, kernel_times: bool) -> Result<()> {
    let name = match device {
        KernelDevice::Lavapipe => "lavapipe",
        KernelDevice::Wgpu => "wgpu",
        KernelDevice::Cuda => "cuda",
    };
    let presets = if quick { "tiny" } else { "mini,base" };
    // With --kernel-times the device's steps a third time, timed kernel by
    // kernel: the table's rates are the untimed runs', whatever timing
    // costs (three round trips to cubecl's server per launch).
    let timed_run = kernel_times.then_some((name, true));
    let (mut lines, mut untimed) = (Vec::new(), 0);
    for (on, timed) in [("cpu", false), (name, false)].into_iter().chain(timed_run) {
        let run = capture_lines(
            model_step()?
                .args(["--presets", presets, "--batch", "8", "--seq", "128"])
                .args(["--device", on])
                .args(if quick {
                    &["--warmup", "1", "--steps", "2"][..]
                } else {
                    &[][..]
                })
                .args(if timed {
                    &["--kernel-times"][..]
                } else {
                    &[][..]
                }),
            "the model_step benchmark",
        )?;
        if timed {
            // A timed run that printed nothing (or fewer models) would
            // otherwise pass unchecked.
            if run.is_empty() || run.len() != untimed {
                bail!(
                    "model_step --kernel-times printed {} lines for the {untimed} of the \
                     untimed run on {name}",
                    run.len()
                );
            }
            run.iter().try_for_each(kernel_times_hold)?;
        } else {
            if on != "cpu" {
                untimed = run.len();
            }
            lines.extend(run);
        }
    }
    let rate = |line: &serde_json::Value| line["samples_per_s"].as_f64().unwrap_or(f64::NAN);
    println!("model      cpu samples/s   {name} samples/s   {name} ÷ cpu");
    for cpu in lines.iter().filter(|l| l["device"] == "cpu") {
        let preset = &cpu["preset"];
        if let Some(other) = lines
            .iter()
            .find(|l| l["device"] == name && &l["preset"] == preset)
        {
            println!(
                "{:<10} {:>13.3} {:>17.3} {:>12.2}×",
                preset.as_str().unwrap_or("?"),
                rate(cpu),
                rate(other),
                rate(other) / rate(cpu)
            );
        }
    }
    Ok(())
}

/// A `--kernel-times` line's times are whole and fit: every dispatch of
/// the step timed once (or counted unmeasured) and the kernels' time within
/// the step's (one queue runs them one after another inside it; 5% for the
/// clocks' difference). A timing lost or counted twice fails it.
fn kernel_times_hold(line: &serde_json::Value) -> Result<()> {
    let number = |key: &str| {
        line[key]
            .as_f64()
            .with_context(|| format!("model_step's line has no {key}: {line}"))
    };
    line["kernel_ms_by_kind"]
        .as_object()
        .context("no kernel_ms_by_kind")?;
    let (total, step) = (number("kernel_ms_per_step")?, number("step_ms")?);
    let timed = number("kernels_timed_per_step")? + number("kernels_unmeasured_per_step")?;
    // Printed with one decimal: a kernel missing in 2 or 5 steps moves the
    // count by at least 0.2.
    let dispatched = number("dispatches_per_step")?;
    if (timed - dispatched).abs() > 0.06 {
        bail!(
            "{timed} kernels timed per step for {dispatched} dispatched (a measurement \
             cubecl refused or lost is in neither): {line}"
        );
    }
    if !(total > 0.0 && total <= 1.05 * step) {
        bail!("{total:.2} ms of kernels in a {step:.1} ms step: {line}");
    }
    Ok(())
}

/// Runs `command`, echoing its standard output, and returns the lines that
/// parse as JSON objects.
fn capture_lines(
    command: &mut std::process::Command,
    what: &str,
) -> Result<Vec<serde_json::Value>> {
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {what}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    if !output.status.success() {
        bail!("{what} failed ({})", output.status);
    }
    Ok(stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v.is_object())
        .collect())
}

/// Appends one run's lines to `path`, each with `"run"` one past the file's
/// last, the framework and the CPU named.
fn append_run(
    path: &str,
    terse: &[serde_json::Value],
    pytorch: &[serde_json::Value],
) -> Result<()> {
    use std::io::Write;
    let existing = std::fs::read_to_string(path).unwrap_or_default();
    let run = existing
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|v| v["run"].as_u64())
        .max()
        .unwrap_or(0)
        + 1;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {path}"))?;
    let cpu = crate::machine::cpu_model();
    for (framework, lines) in [("terse", terse), ("pytorch", pytorch)] {
        for line in lines {
            let mut record = serde_json::Map::new();
            record.insert("run".into(), run.into());
            record.insert("framework".into(), framework.into());
            record.insert("cpu".into(), cpu.clone().into());
            if let Some(fields) = line.as_object() {
                for (key, value) in fields {
                    record.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            writeln!(file, "{}", serde_json::Value::Object(record))
                .with_context(|| format!("cannot write {path}"))?;
        }
    }
    println!("appended run {run} to {path}");
    Ok(())
}

/// A throwaway virtualenv with torch and transformers, made once.
fn bench_venv() -> Result<std::path::PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let venv = std::path::Path::new(&home).join(".cache/terse/bench-venv");
    let python = venv.join("bin/python");
    if python.exists() {
        return Ok(python);
    }
    eprintln!(
        "creating {} with torch and transformers (benchmark only, ~6 GB)",
        venv.display()
    );
    let ok = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && std::process::Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "torch", "transformers"])
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "could not create {} (needs python3 with venv and pip); or pass --python",
            venv.display()
        );
    }
    Ok(python)
}

/// Ranks of the comm benchmark (the setting).
const COMM_RANKS: usize = 4;

/// Builds the comm benchmark and starts it under `mpirun`.
fn run_comm(quick: bool) -> Result<()> {
    mpi::require_mpirun()?;
    let executable = terse_binary::build_bench("comm_allreduce")?;
    let mut args = Vec::new();
    if quick {
        args.push("--quick".to_string());
    }
    mpi::launch(COMM_RANKS, &executable, &args)
}

#[cfg(test)]
mod tests {
    use crate::testing;

    #[test]
    fn quick_is_off_unless_given() {
        for (argv, quick) in [
            (&["bench", "kernels"][..], false),
            (&["bench", "comm", "--quick"][..], true),
        ] {
            let args = testing::parsed_as!(Bench, argv);
            assert_eq!(args.quick, quick, "{argv:?}");
        }
    }

    #[test]
    fn flags_are_refused_where_they_do_nothing() {
        for (argv, refused) in [
            (&["bench", "comm", "--device", "lavapipe"][..], "--device"),
            (&["bench", "workers", "--device", "wgpu"][..], "--device"),
            (&["bench", "comm", "--precision", "bf16"][..], "--precision"),
            (
                &["bench", "kernels", "--precision", "bf16"][..],
                "--precision",
            ),
            (
                &[
                    "bench",
                    "model",
                    "--device",
                    "lavapipe",
                    "--precision",
                    "bf16",
                ][..],
                "--precision",
            ),
            (&["bench", "model", "--kernel-times"][..], "--kernel-times"),
            (&["bench", "optim", "--python", "python3"][..], "--python"),
            (
                &["bench", "model", "--device", "cuda", "--python", "python3"][..],
                "--python",
            ),
            (
                &["bench", "optim", "--device", "lavapipe", "--kernel-times"][..],
                "--kernel-times",
            ),
        ] {
            let args = testing::parsed_as!(Bench, argv);
            let error = super::flags_apply(&args).unwrap_err().to_string();
            assert!(error.starts_with(refused), "{argv:?}: {error}");
        }
        for argv in [
            &["bench", "kernels", "--device", "wgpu"][..],
            &["bench", "optim", "--device", "lavapipe"][..],
            &["bench", "model", "--precision", "bf16"][..],
            &["bench", "model", "--python", "python3"][..],
            &["bench", "model", "--device", "lavapipe", "--kernel-times"][..],
        ] {
            let args = testing::parsed_as!(Bench, argv);
            assert!(super::flags_apply(&args).is_ok(), "{argv:?}");
        }
    }

    #[test]
    fn rejects_unknown_suite() {
        let message = testing::rejection(&["bench", "models"]);
        for valid in ["kernels", "optim", "comm"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
    }

    /// A device line of `model_step --kernel-times` shaped like stop 95's
    /// (BERT-Tiny on lavapipe), one launch unmeasured, with `change`
    /// applied.
    fn kernel_line(change: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
        let mut line = serde_json::json!({
            "step_ms": 6664.9, "dispatches_per_step": 213.0,
            "kernel_ms_per_step": 6477.1,
            "kernel_ms_by_kind": {"matmul": 4739.92, "reduce": 235.92, "copy": 76.21,
                                  "elementwise": 789.58, "other": 635.47},
            "kernels_timed_per_step": 212.0, "kernels_unmeasured_per_step": 1.0,
        });
        change(&mut line);
        line
    }

    #[test]
    fn kernel_times_must_cover_every_dispatch_once_and_fit_in_the_step() {
        assert!(super::kernel_times_hold(&kernel_line(|_| ())).is_ok());
        for (change, why) in [
            (
                (|l: &mut serde_json::Value| l["kernels_timed_per_step"] = 424.0.into())
                    as fn(&mut serde_json::Value),
                "timed per step",
            ),
            (
                |l| l["kernels_unmeasured_per_step"] = 0.0.into(),
                "timed per step",
            ),
            (
                |l| {
                    l["kernel_ms_per_step"] = 12954.2.into();
                    l["kernel_ms_by_kind"]["matmul"] = 11217.02.into();
                },
                "in a 6664.9 ms step",
            ),
            (
                |l| l["kernel_ms_by_kind"] = "none".into(),
                "kernel_ms_by_kind",
            ),
        ] {
            let error = super::kernel_times_hold(&kernel_line(change))
                .unwrap_err()
                .to_string();
            assert!(error.contains(why), "{why}: {error}");
        }
    }
}
