//! `terse-optim-check`: steps every optimizer on one seeded problem across
//! the ranks of a communicator and writes each rank's final parameters, so
//! that the same run on `mpi` (under `mpirun`) and on `local` (threads) can
//! be compared bit for bit.
//!
//! Each rank pulls its parameters towards its own seeded target with its own
//! seeded noise, so the ranks' gradients differ and depend on the
//! parameters. 1-bit optimizers must agree across ranks after every step
//! (checked here with an all-gather of a fingerprint), SLAMB after its last
//! model sync.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use terse_comm::launch::{Backend, Launch};
use terse_comm::{Communicator, LocalComm, SparseValues};
use terse_optim::{
    LrSchedule, MaskKind, OneBitLambConfig, Optimizer, OptimizerConfig, ParamLayout, RatioKind,
    ScaleKind, SlambConfig, WithOneBitAllreduce,
};
use terse_rng::{SplitMix64, mix64};

/// Step every optimizer on a seeded problem and write each rank's final
/// parameters as `<out>/<label>.rank<r>.f32` (raw little-endian f32).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    launch: Launch<2>,
    /// Steps per optimizer (the 1-bit optimizers freeze after step 8).
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// Directory for the parameter files (created if missing).
    #[arg(long)]
    out: PathBuf,
}

const FREEZE: u64 = 8;

fn layout() -> ParamLayout {
    ParamLayout::from_shapes([
        ("l1.weight".to_string(), vec![64, 100]),
        ("l1.bias".to_string(), vec![64]),
        ("l2.weight".to_string(), vec![10, 64]),
        ("l2.bias".to_string(), vec![10]),
    ])
}

/// Every registered optimizer (labelled by its name, the registry's short
/// run with its freeze after step 8), then the options that change what
/// travels under labels of their own.
fn optimizers() -> Vec<(String, OptimizerConfig)> {
    let mut all: Vec<(String, OptimizerConfig)> = OptimizerConfig::short_runs(FREEZE)
        .into_iter()
        .map(|config| (config.name().to_string(), config))
        .collect();
    let variant = |name: &str| {
        all.iter()
            .find(|(label, _)| label == name)
            .map(|(_, config)| config.clone())
            .expect("registered")
    };
    let (OptimizerConfig::OnebitAdam(adam), OptimizerConfig::OnebitLamb(lamb)) =
        (variant("onebit_adam"), variant("onebit_lamb"))
    else {
        unreachable!("the registry's variants for these names")
    };
    let OptimizerConfig::Slamb(slamb) = variant("slamb") else {
        unreachable!("the registry's variant for slamb")
    };
    all.extend([
        (
            "onebit_adam_l2_block64".to_string(),
            OptimizerConfig::OnebitAdam(adam.with_scale(ScaleKind::L2).with_scale_block(Some(64))),
        ),
        (
            "onebit_lamb_variance".to_string(),
            OptimizerConfig::OnebitLamb(OneBitLambConfig {
                ratio: RatioKind::Variance,
                ..lamb
            }),
        ),
        (
            "slamb_cyclic_f16".to_string(),
            OptimizerConfig::Slamb(SlambConfig {
                mask: MaskKind::Cyclic,
                values: SparseValues::F16,
                ..slamb
            }),
        ),
    ]);
    all
}

fn seeded(seed: u64, len: usize, f: impl Fn(&mut SplitMix64) -> f32) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(seed));
    (0..len).map(|_| f(&mut rng)).collect()
}

fn fingerprint(x: &[f32]) -> [u32; 2] {
    let h = x.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        mix64(h ^ u64::from(v.to_bits()))
    });
    [h as u32, (h >> 32) as u32]
}

/// Whether every rank holds the same `x`.
fn ranks_agree(comm: &dyn Communicator, x: &[f32]) -> Result<bool, String> {
    let mine = fingerprint(x);
    let mut all = vec![0u32; 2 * comm.world_size()];
    comm.all_gather_u32(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    Ok(all.chunks(2).all(|f| f == mine))
}

fn run_one(
    comm: &dyn Communicator,
    label: &str,
    config: OptimizerConfig,
    steps: u64,
    out: &Path,
) -> Result<(), String> {
    let layout = layout();
    let d = layout.len();
    let rank = comm.rank();
    let schedule = LrSchedule::Constant { lr: 1e-2 };
    let mut opt =
        Optimizer::new(config, schedule, layout, comm).map_err(|e| format!("{label}: {e}"))?;
    // SLAMB's and 0/1 Adam's ranks step their own parameters between
    // synchronisations; every rule agrees after `finish`.
    let always_agree = opt.params_replicated();
    let mut x = seeded(1, d, |r| 0.5 * r.symmetric());
    let target = seeded(100 + rank as u64, d, |r| r.symmetric());
    for t in 1..=steps {
        let noise = seeded(t << 8 | rank as u64, d, |r| 0.1 * r.normal());
        let mut g: Vec<f32> = x
            .iter()
            .zip(&target)
            .zip(&noise)
            .map(|((x, target), noise)| x - target + noise)
            .collect();
        opt.step_flat(&mut x, &mut g, comm)
            .map_err(|e| format!("{label} step {t}: {e}"))?;
        if always_agree && !ranks_agree(comm, &x)? {
            return Err(format!("{label}: ranks disagree after step {t}"));
        }
    }
    opt.finish_flat(&mut x, comm)
        .map_err(|e| format!("{label}: {e}"))?;
    if !ranks_agree(comm, &x)? {
        return Err(format!("{label}: ranks disagree at the end"));
    }
    let path = out.join(format!("{label}.rank{rank}.f32"));
    std::fs::write(&path, bytemuck::cast_slice::<f32, u8>(&x))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if rank == 0 {
        let [lo, hi] = fingerprint(&x);
        println!(
            "{label:<24} {} ranks on {}: ranks agree, fingerprint {hi:08x}{lo:08x}",
            comm.world_size(),
            comm.backend()
        );
    }
    Ok(())
}

fn run(comm: &dyn Communicator, args: &Args) -> Result<(), String> {
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    for (label, config) in optimizers() {
        run_one(comm, &label, config, args.steps, &args.out)?;
    }
    Ok(())
}

/// Runs the check; a failing rank ends the others before it returns.
fn check(comm: &dyn Communicator, args: &Args) -> Result<(), String> {
    let result = run(comm, args);
    if let Err(message) = &result {
        comm.abort(message);
    }
    result
}

fn main() -> ExitCode {
    let args = Args::parse();
    let outcomes: Vec<Result<(), String>> = match args.launch.backend() {
        Backend::Mpi => vec![run_mpi(&args)],
        Backend::Local => {
            LocalComm::run(args.launch.local_ranks, Duration::from_secs(300), |comm| {
                check(comm, &args)
            })
            .into_iter()
            .map(|o| o.unwrap_or_else(|_| Err("panicked".to_string())))
            .collect()
        }
    };
    let mut code = ExitCode::SUCCESS;
    for outcome in outcomes {
        if let Err(message) = outcome {
            eprintln!("terse-optim-check: {message}");
            code = ExitCode::FAILURE;
        }
    }
    code
}

#[cfg(feature = "mpi")]
fn run_mpi(args: &Args) -> Result<(), String> {
    let comm = terse_comm::MpiComm::init().map_err(|e| e.to_string())?;
    check(&comm, args)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_args: &Args) -> Result<(), String> {
    Err("built without the `mpi` feature".to_string())
}
