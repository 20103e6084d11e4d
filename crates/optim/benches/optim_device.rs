//! One optimizer step on a cubecl device (`--device lavapipe`: Vulkan on
//! the CPU; `--device wgpu`: the machine's default adapter, a GPU where
//! there is one) beside the same step on the CPU's host buffers, in the
//! same run: ms per step on each and steps/s device ÷ CPU.
//!
//! One rank: the 1-bit optimizers (frozen after step 1) and SLAMB run
//! their device kernels but send nothing, so this times the update, not
//! the communication. The device time includes waiting for the queue to
//! drain after every step.
//!
//! `cargo xtask bench optim --device lavapipe|wgpu [--quick]` (10M
//! parameters, 1M with `--quick`); writes `results/bench/optim-device-<device>.json`.

#[path = "common/bert_layout.rs"]
mod bert_layout;
#[path = "common/best_of.rs"]
mod best_of;

use best_of::best_of;

use burn::tensor::{Device, DeviceKind};
use terse_comm::SingleRank;
use terse_optim::{DeviceFlat, LrSchedule, Optimizer, OptimizerConfig};

/// Every registered optimizer (the registry's short run, its later stage
/// from step 2, so the timed steps are that stage's), by name: a rule added
/// to the registry is benchmarked without editing this file.
fn configs() -> Vec<(&'static str, OptimizerConfig)> {
    OptimizerConfig::short_runs(1)
        .into_iter()
        .map(|config| (config.name(), config))
        .collect()
}

/// Where the device side of the step runs.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Where {
    /// Mesa's CPU Vulkan driver
    Lavapipe,
    /// The default wgpu adapter (a GPU where there is one)
    Wgpu,
    /// CUDA device 0
    Cuda,
}

/// The benchmark's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "optim_device",
    bin_name = "optim_device",
    about = "Times every registered optimizer's step on a cubecl device beside the same step \
             on the CPU; `cargo xtask bench optim --device …` runs it"
)]
struct Args {
    /// A smoke run: 1M parameters (10M otherwise) and fewer repeats
    #[arg(long)]
    quick: bool,
    /// Where the device side runs
    #[arg(long, value_enum, default_value = "lavapipe")]
    device: Where,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args {
        quick,
        device: place,
        ..
    } = clap::Parser::parse();
    let (name, device) = match place {
        Where::Lavapipe => ("lavapipe", Device::wgpu(DeviceKind::Cpu)),
        Where::Wgpu => ("wgpu", Device::wgpu(DeviceKind::DefaultDevice)),
        Where::Cuda => ("cuda", Device::cuda(0)),
    };
    let layout = bert_layout::layout(if quick { 1_000_000 } else { 10_000_000 });
    let d = layout.len();
    let (warmup, repeats) = if quick { (1, 2) } else { (2, 5) };
    println!(
        "optimizer step on {name} beside the CPU: {d} parameters, {} CPU threads, best of {repeats}",
        rayon::current_num_threads()
    );
    let x0: Vec<f32> = (0..d).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3).collect();
    let g: Vec<f32> = (0..d).map(|i| ((i % 777) as f32 - 388.0) * 1e-4).collect();
    let comm = SingleRank::new();
    let schedule = LrSchedule::Constant { lr: 1e-4 };
    let mut rows = Vec::new();
    println!("optimizer     CPU ms/step   {name} ms/step   {name} ÷ CPU (steps/s)");
    for (optimizer, config) in configs() {
        let new =
            || Optimizer::new(config.clone(), schedule.clone(), layout.clone(), &comm).unwrap();

        let mut host = new();
        let mut x = x0.clone();
        let mut g_work = g.clone();
        for _ in 0..warmup {
            g_work.copy_from_slice(&g);
            host.step_flat(&mut x, &mut g_work, &comm).unwrap();
        }
        let refresh = best_of(repeats, || g_work.copy_from_slice(std::hint::black_box(&g)));
        let cpu = best_of(repeats, || {
            g_work.copy_from_slice(&g);
            host.step_flat(&mut x, &mut g_work, &comm).unwrap();
        }) - refresh;

        let mut on_device = new();
        let mut x = DeviceFlat::from_host(&x0, &device).unwrap();
        let g_device = DeviceFlat::from_host(&g, &device).unwrap();
        // The optimizers may overwrite the gradient: each step gets a copy
        // made on the device, timed apart and taken out.
        let mut step = || {
            let mut g = g_device.device_copy();
            on_device.step_device(&mut x, &mut g, &comm).unwrap();
            x.wait();
        };
        for _ in 0..warmup {
            step();
        }
        let copy = best_of(repeats, || g_device.device_copy().wait());
        let dev = best_of(repeats, step) - copy;
        let (cpu, dev) = (cpu.max(1e-9), dev.max(1e-9));
        println!(
            "{optimizer:<12} {:>12.2} {:>16.2} {:>20.2}×",
            cpu * 1e3,
            dev * 1e3,
            cpu / dev
        );
        rows.push(format!(
            "    {{\"optimizer\": \"{optimizer}\", \"cpu_ms_per_step\": {:.3}, \"device_ms_per_step\": {:.3}, \"device_over_cpu\": {:.3}}}",
            cpu * 1e3,
            dev * 1e3,
            cpu / dev
        ));
    }
    let json = format!(
        "{{\n  \"device\": \"{name}\",\n  \"parameters\": {d},\n  \"cpu_threads\": {},\n  \"steps\": [\n{}\n  ]\n}}\n",
        rayon::current_num_threads(),
        rows.join(",\n")
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/bench");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join(format!(
        "optim-device-{name}{}.json",
        if quick { "-quick" } else { "" }
    ));
    std::fs::write(&file, json).unwrap();
    println!("wrote {}", file.display());
}
