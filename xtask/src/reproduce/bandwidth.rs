//! `reproduce bandwidth` (1-bit Adam appendix Fig. 9; SLAMB Fig. 4): the
//! step time of each optimizer on 4 netlab hosts as the links slow from
//! 10 Gbit/s to 50 Mbit/s, and its speed-up over Adam.
//!
//! The step here is the optimizer's: the gradient's or momentum's
//! synchronisation and the update over a BERT-base-sized buffer, without
//! forward and backward (`reproduce step-profile` has those). Adam
//! allreduces fp32 gradients; 1-bit Adam and 1-bit LAMB are measured in
//! their compression stage after one warmup step and one settling step, SLAMB
//! after one settling step.

use anyhow::Result;

use super::network::{Bench, OPTIMIZERS, RANKS, Run, StepRow, mean, rows_of};
use super::plot::{Chart, Series, draw, human, times};
use super::report::Table;
use super::{Claim, Context, Outcome, num};
use crate::netlab::lab::{Lab, Shape};
use crate::netlab::rate::{self, Rate};

/// BERT-base's parameter count.
const ELEMENTS: u64 = 110_000_000;

/// One optimizer at one rate: the means of its measured steps.
struct Point {
    optimizer: &'static str,
    rate: Rate,
    step_ms: f64,
    comm_ms: f64,
    collective_ms: f64,
    /// What the busiest rank's bytes take at the link rate alone: the
    /// collective's time on a network with free endpoints.
    line_rate_ms: f64,
}

pub fn run(ctx: &Context) -> Result<Outcome> {
    let rates = rate::parse_all(ctx.pick(
        &[
            "10gbit", "2.5gbit", "1gbit", "500mbit", "250mbit", "100mbit", "50mbit",
        ][..],
        &["10gbit", "1gbit", "100mbit"][..],
    ))?;
    let elements = ctx.pick(ELEMENTS, 4_000_000);
    let fast = Shape::at(rates[0]);
    let points = Points(measure(ctx, &rates, elements, fast)?);
    let table = points.table(&rates);
    draw_speedups(ctx, &rates, &points)?;
    let claims = claims(ctx, &rates, &points)?;
    let body = format!(
        "## Step time against link rate\n\n{elements} elements{}, {RANKS} ranks on {RANKS} \
         netlab hosts, every link shaped to the rate in both directions; means over each \
         optimizer's measured steps (2 at 500 Mbit/s and above, 1 below), which \
         follow the 1-bit optimizers' fp32 warmup step and one settling step on {} \
         links. \
         \"In collectives\" is the time inside MPI calls (the network and the waiting); \
         \"communication\" adds the compression around them, which on this 2-core machine \
         runs 4 ranks on 2 cores and is far slower than a GPU's. \
         \"Bytes at line rate\" is the busiest rank's metered bytes divided by the link rate: \
         the time the collective would take at full link speed with free endpoints. The \
         endpoints are not free here: the 4 ranks' TCP stacks and reductions share 2 cores \
         (unshaped, an fp32 allreduce of BERT-base runs at about 1 Gbit/s per rank), so at \
         10 and 2.5 Gbit/s the measured times are the CPU's rather than the link's. The \
         collectives are OpenMPI's bandwidth-optimal ones (ring allreduce as NCCL's, pairwise \
         all-to-all, ring allgather; netlab's mpirun selects them). The claim below is checked against both.\n\n{}\n![speed-up against \
         link rate](plot.png)\n",
        ctx.pick(" (a BERT-base-sized gradient)", ""),
        fast.rate,
        table.markdown()
    );
    Ok(Outcome {
        title: "Optimizer step time against network bandwidth (1-bit Adam Fig. 9, SLAMB Fig. 4)"
            .into(),
        body,
        claims,
    })
}

/// Every optimizer's step at every rate, in that order: measured on a lab
/// of `fast` links, or with `--from-results` the committed steps, drawn
/// and checked again without measuring (no build, no lab).
fn measure(ctx: &Context, rates: &[Rate], elements: u64, fast: Shape) -> Result<Vec<Point>> {
    let log = ctx.report.path("metrics.jsonl");
    let measuring = match &ctx.replay {
        None => Some((Bench::build()?, Lab::up(RANKS, fast)?)),
        Some(_) => None,
    };
    let mut points = Vec::new();
    for &rate in rates {
        // Below 500 Mbit/s an fp32 step of BERT-base takes minutes and
        // varies little: one step is enough there.
        let steps = if rate.bps() < 5e8 { 1 } else { 2 };
        for optimizer in OPTIMIZERS {
            let warmup = u64::from(optimizer.starts_with("onebit"));
            // The fp32 warmup step and one more cross the fastest links;
            // the links drop to `rate` for the measured steps only. The
            // extra step is every optimizer's first touch of its state
            // (Adam's moments, the 1-bit error buffers), seconds on this
            // machine whatever the rate.
            let run = Run {
                optimizer,
                elements,
                warmup,
                settle: 1,
                steps,
                label: rate.to_string(),
                measure_at: Some(rate),
            };
            let rows = rows_of(measuring.as_ref(), fast, &run, &log)?;
            let stage: Vec<&StepRow> = run.measured(&rows);
            points.push(Point {
                optimizer,
                rate,
                step_ms: mean(&stage, |r| r.step_ms),
                comm_ms: mean(&stage, |r| r.comm_ms),
                collective_ms: mean(&stage, |r| r.collective_ms),
                line_rate_ms: mean(&stage, |r| r.bytes_sent_max as f64 * 8.0 / rate.bps() * 1e3),
            });
        }
    }
    Ok(points)
}

/// Every optimizer's point at every rate.
struct Points(Vec<Point>);

impl Points {
    fn at(&self, optimizer: &str, rate: Rate) -> &Point {
        self.0
            .iter()
            .find(|p| p.optimizer == optimizer && p.rate == rate)
            .expect("every optimizer at every rate")
    }

    /// Adam's step time over `optimizer`'s at `rate`.
    fn speedup(&self, optimizer: &str, rate: Rate) -> f64 {
        self.at("adam", rate).step_ms / self.at(optimizer, rate).step_ms
    }

    /// One row per rate and optimizer.
    fn table(&self, rates: &[Rate]) -> Table {
        let mut table = Table::new(&[
            "link rate",
            "optimizer",
            "step ms",
            "communication ms (incl. compression)",
            "in collectives ms",
            "bytes at line rate ms",
            "speed-up over Adam",
        ]);
        for &rate in rates {
            let adam = self.at("adam", rate).step_ms;
            for optimizer in OPTIMIZERS {
                let p = self.at(optimizer, rate);
                table.row(vec![
                    rate.to_string(),
                    optimizer.into(),
                    num(p.step_ms),
                    num(p.comm_ms),
                    num(p.collective_ms),
                    num(p.line_rate_ms),
                    format!("{}×", num(adam / p.step_ms)),
                ]);
            }
        }
        table
    }
}

/// plot.png: each compressing optimizer's speed-up over Adam against the
/// link rate.
fn draw_speedups(ctx: &Context, rates: &[Rate], points: &Points) -> Result<()> {
    let series: Vec<Series> = OPTIMIZERS[1..]
        .iter()
        .map(|&optimizer| Series {
            label: optimizer.into(),
            points: rates
                .iter()
                .rev()
                .map(|&rate| (rate.bps() / 1e6, points.speedup(optimizer, rate)))
                .collect(),
        })
        .collect();
    draw(
        &ctx.report.path("plot.png"),
        &Chart {
            y_ticks: Some(times),
            // A tick at every rate measured.
            x_key_points: Some(rates.iter().map(|r| r.bps() / 1e6).collect()),
            ..Chart::logarithmic(
                "Optimizer step on 4 hosts: speed-up over Adam against link rate",
                "link rate (log scale)",
                "speed-up over Adam (step time)",
                link_rate,
            )
        },
        &series,
    )
}

/// 1-bit Adam's collectives against Adam's at the claim's rate, and its
/// speed-up growing as bandwidth shrinks.
fn claims(ctx: &Context, rates: &[Rate], points: &Points) -> Result<Vec<Claim>> {
    // The bar is set for a BERT-base gradient at 1 Gbit/s; the quick
    // run's small buffer only clears a lower one, at its slowest rate.
    let (claim_rate, factor): (Rate, f64) =
        ctx.pick(("1gbit".parse()?, 10.0), ("100mbit".parse()?, 5.0));
    let (slowest, fastest) = (rates[rates.len() - 1], rates[0]);
    let fp32 = points.at("adam", claim_rate);
    let onebit = points.at("onebit_adam", claim_rate);
    let speedup = |rate| points.speedup("onebit_adam", rate);
    Ok(vec![
        Claim::new(
            fp32.collective_ms.min(fp32.line_rate_ms) >= factor * onebit.collective_ms,
            format!(
                "at {claim_rate}, 1-bit Adam's compression stage spends ≥ {factor}× less time \
                 in collectives than Adam's fp32 allreduce: {} ms against {} ms ({}×; against \
                 the fp32 bytes at line rate, {} ms: {}×; with compression on this machine's \
                 shared cores: {} ms, {}×)",
                num(onebit.collective_ms),
                num(fp32.collective_ms),
                num(fp32.collective_ms / onebit.collective_ms),
                num(fp32.line_rate_ms),
                num(fp32.line_rate_ms / onebit.collective_ms),
                num(onebit.comm_ms),
                num(fp32.comm_ms / onebit.comm_ms)
            ),
        ),
        Claim::new(
            speedup(slowest) > speedup(fastest),
            format!(
                "1-bit Adam's speed-up over Adam grows as bandwidth shrinks: {}× at {slowest} \
                 against {}× at {fastest} (paper: up to 10.8× at low bandwidth, training \
                 throughput)",
                num(speedup(slowest)),
                num(speedup(fastest))
            ),
        ),
    ])
}

/// A tick at Mbit/s as a link rate: 100 Mbit/s, 1 Gbit/s, 2.5 Gbit/s.
fn link_rate(mbit: f64) -> String {
    if mbit >= 1000.0 {
        format!("{} Gbit/s", human(mbit / 1000.0))
    } else {
        format!("{} Mbit/s", human(mbit))
    }
}
