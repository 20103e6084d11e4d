//! `reproduce step-profile` (1-bit Adam Table 1; SLAMB Tables 5, 12): where
//! a training step's time goes (forward, backward, communication,
//! optimizer) and the communication's share, for Adam, 1-bit Adam and SLAMB
//! at two link rates.
//!
//! BERT-base pre-training on the real corpus by 4 MPI ranks, one per netlab
//! host, each with a micro-batch of one sequence: the compute is what 2
//! cores give 4 ranks, the communication is a BERT-base gradient over
//! shaped links. 1-bit Adam freezes after its first step; the first two
//! steps of every run are left out of the means (see [`profile`]).

use anyhow::{Context as _, Result, bail};

use super::network::RANKS;
use super::plot::{Chart, Series, draw, whole};
use super::report::Table;
use super::runner::{RunLog, Variant, command_line, read_log, remove_checkpoints};
use super::{Claim, Context, Outcome, num};
use crate::netlab::lab::{Lab, Shape};
use crate::netlab::launch;
use crate::netlab::rate::{self, Rate};

const CONFIG: &str = "configs/pretrain-bert-base.toml";

/// The optimizers profiled: label and `--set optimizer=…`.
const OPTIMIZERS: [(&str, &str); 3] = [
    ("adam", "{ name = \"adam\", weight_decay = 0.01 }"),
    (
        "onebit_adam",
        "{ name = \"onebit_adam\", weight_decay = 0.01, freeze_step = 1 }",
    ),
    ("slamb", "{ name = \"slamb\", weight_decay = 0.01 }"),
];

/// Mean milliseconds per step of each phase.
#[derive(Debug, Clone, Copy, Default)]
struct Profile {
    forward: f64,
    backward: f64,
    comm: f64,
    optimizer: f64,
}

impl Profile {
    fn total(&self) -> f64 {
        self.forward + self.backward + self.comm + self.optimizer
    }

    fn comm_share(&self) -> f64 {
        self.comm / self.total()
    }
}

fn variant(ctx: &Context, label: &str, optimizer: &str, steps: u64) -> Variant {
    Variant::new(label, &["pretrain"], CONFIG, 1)
        .set("model.preset", ctx.pick("\"base\"", "\"tiny\""))
        .set("optimizer", optimizer)
        .set("train.steps", steps)
        .set("train.global_batch", RANKS)
        .set("train.micro_batch", 1)
        .set("train.checkpoint_every", 0)
        .set("train.eval_every", 0)
}

/// The means over steps 3.. of the run's logged steps: step 1 first
/// touches the moments, step 2 (1-bit Adam's first compressed one) the
/// error buffers.
fn profile(log: &RunLog) -> Result<Profile> {
    let mean = |field: &str| -> Result<f64> {
        let measured: Vec<f64> = log
            .series(field)
            .into_iter()
            .filter(|&(step, _)| step > 2)
            .map(|(_, value)| value)
            .collect();
        if measured.is_empty() {
            bail!("{} logged no {field} after step 2", log.dir.display());
        }
        Ok(measured.iter().sum::<f64>() / measured.len() as f64)
    };
    Ok(Profile {
        forward: mean("forward_ms")?,
        backward: mean("backward_ms")?,
        comm: mean("comm_ms")?,
        optimizer: mean("optimizer_ms")?,
    })
}

pub fn run(ctx: &Context) -> Result<Outcome> {
    let steps = ctx.pick(5, 4);
    // The quick run's BERT-Tiny gradient (17.7 MB) takes ~0.2 s at 1gbit,
    // as long as 4 ranks contending for 2 cores take to compute and
    // compress it at any rate: 1gbit and 10gbit gave it equal shares (81.1%
    // and 81.3% in one CI run). At 100mbit its allreduce takes ~2 s, so the
    // claim measures the link, not the scheduler.
    let rates = rate::parse_all(ctx.pick(&["1gbit", "10gbit"][..], &["100mbit", "10gbit"][..]))?;
    let mut profiles = Vec::new();
    let mut logs = Vec::new();
    // `--from-results`: the committed runs, drawn and checked again
    // without measuring (no lab, no training).
    if let Some(results) = &ctx.replay {
        for &rate in &rates {
            for (label, _) in OPTIMIZERS {
                let log = super::runner::replay(results, &ctx.runs, &format!("{rate}-{label}"))?;
                profiles.push((rate, label, profile(&log)?));
                logs.push(log);
            }
        }
        return report(ctx, &logs, &profiles, &rates, steps);
    }
    // The lab's namespaces have no route out: fetch the corpus, the
    // tokenizer and build the shards first, with one step on one rank.
    let warm = variant(ctx, "prepare", OPTIMIZERS[0].1, 1);
    let status = std::process::Command::new(ctx.terse()?)
        .args(command_line(&warm, &ctx.runs.join("prepare")))
        .status()
        .context("cannot start terse")?;
    if !status.success() {
        bail!("preparing the data failed ({status})");
    }
    remove_checkpoints(&ctx.runs.join("prepare"))?;
    let lab = Lab::up(RANKS, Shape::at(rates[0]))?;
    for &rate in &rates {
        lab.reshape(Shape::at(rate))?;
        for (label, optimizer) in OPTIMIZERS {
            let dir = ctx.runs.join(format!("{rate}-{label}"));
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            eprintln!("reproduce: {label} at {rate} on {RANKS} lab hosts");
            let run = variant(ctx, label, optimizer, steps);
            let mut args = command_line(&run, &dir);
            args.push("--no-progress".into());
            let status = launch::run(RANKS, ctx.terse()?, &args)?;
            if !status.success() {
                bail!("terse pretrain ({label} at {rate}) failed ({status})");
            }
            let mut log = read_log(&run, &dir)?;
            profiles.push((rate, label, profile(&log)?));
            log.label = format!("{rate}-{label}");
            logs.push(log);
            // Only the metrics are read; BERT-base's end-of-run checkpoint
            // (4 ranks × ~1.3 GB) would pile up over the six runs.
            remove_checkpoints(&dir)?;
        }
    }
    drop(lab);
    // Every step's phases, committed beside the table.
    ctx.report.write_runs(&logs)?;
    report(ctx, &logs, &profiles, &rates, steps)
}

/// The plot, the table and the claims of the runs' `logs` and their
/// per-step `profiles`.
fn report(
    ctx: &Context,
    logs: &[RunLog],
    profiles: &[(Rate, &str, Profile)],
    rates: &[Rate],
    steps: u64,
) -> Result<Outcome> {
    // The step time per run as a plot.
    let series: Vec<Series> = logs
        .iter()
        .map(|log| {
            let phase = |field: &str| log.series(field);
            let (f, b, c, o) = (
                phase("forward_ms"),
                phase("backward_ms"),
                phase("comm_ms"),
                phase("optimizer_ms"),
            );
            Series {
                label: log.label.clone(),
                points: f
                    .iter()
                    .zip(&b)
                    .zip(&c)
                    .zip(&o)
                    .map(|(((f, b), c), o)| (f.0 as f64, f.1 + b.1 + c.1 + o.1))
                    .collect(),
            }
        })
        .collect();
    draw(
        &ctx.report.path("plot.png"),
        &Chart::logarithmic(
            "Step time per step: forward + backward + communication + optimizer",
            "step",
            "ms",
            whole,
        ),
        &series,
    )?;

    let mut table = Table::new(&[
        "link rate",
        "optimizer",
        "forward ms",
        "backward ms",
        "communication ms",
        "optimizer ms",
        "step ms",
        "communication share",
    ]);
    for (rate, label, p) in profiles {
        table.row(vec![
            rate.to_string(),
            label.to_string(),
            num(p.forward),
            num(p.backward),
            num(p.comm),
            num(p.optimizer),
            num(p.total()),
            format!("{:.1}%", 100.0 * p.comm_share()),
        ]);
    }
    let get = |rate: Rate, label: &str| {
        profiles
            .iter()
            .find(|(r, l, _)| *r == rate && *l == label)
            .map(|p| p.2)
            .expect("every optimizer at every rate")
    };
    let (slow, fast) = (rates[0], rates[1]);
    let claims = vec![
        Claim::new(
            get(slow, "adam").comm_share() > get(fast, "adam").comm_share(),
            format!(
                "Adam's communication share grows as the links slow: {:.1}% at {slow} against \
                 {:.1}% at {fast}",
                100.0 * get(slow, "adam").comm_share(),
                100.0 * get(fast, "adam").comm_share()
            ),
        ),
        Claim::new(
            get(slow, "onebit_adam").comm < get(slow, "adam").comm
                && get(slow, "slamb").comm < get(slow, "adam").comm,
            format!(
                "at {slow}, 1-bit Adam's and SLAMB's communication take less time than Adam's: \
                 {} and {} ms against {} ms per step",
                num(get(slow, "onebit_adam").comm),
                num(get(slow, "slamb").comm),
                num(get(slow, "adam").comm)
            ),
        ),
    ];
    let body = format!(
        "## Time per step\n\nBERT-{} pre-training (seq 128, the SOTU and SQuAD corpus), \
         {RANKS} MPI ranks on {RANKS} netlab hosts, one sequence per rank per step; means of \
         steps 3–{steps}. Communication includes compression; on this machine the 4 ranks \
         share 2 cores, so compute is slow and the shares differ from the papers' GPU \
         clusters. Every step's phases: metrics.jsonl (one run per rate and \
         optimizer).\n\n{}\n![step time per step](plot.png)\n",
        ctx.pick("base", "tiny"),
        table.markdown()
    );
    Ok(Outcome {
        title: "Step-time profile: forward, backward, communication, optimizer (1-bit Adam \
                Table 1, SLAMB Tables 5, 12)"
            .into(),
        body,
        claims,
    })
}
