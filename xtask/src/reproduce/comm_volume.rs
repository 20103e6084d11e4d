//! `reproduce comm-volume`: the bytes each optimizer puts on the network per
//! step, measured three ways, beside the papers' reduction factors (1-bit
//! Adam 5×, 1-bit LAMB 4.6× / 4.1×, SLAMB 9.1×).
//!
//! Every optimizer steps a BERT-base-sized buffer on 4 netlab hosts through
//! its warmup into its compressed stage. Per step: the traffic meter's count
//! (the collectives' bandwidth-optimal volumes), the bytes rank 0's link
//! actually carried (TCP/IP headers included, jumbo frames), and the
//! analytic volume of ALGORITHMS.md. The papers' end-to-end factors then
//! follow from the measured per-step bytes and each paper's schedule (its
//! warmup share, SLAMB's sync period) against their baseline: fp16 gradients
//! for the 1-bit papers, fp32 for SLAMB.

use anyhow::Result;

use super::network::{Bench, OPTIMIZERS, RANKS, Run, StepRow, mean};
use super::report::Table;
use super::{Claim, Context, Outcome, num};
use crate::netlab::lab::{Lab, Shape};
use crate::netlab::rate::Rate;

/// BERT-base's parameter count.
const BERT_BASE: u64 = 110_000_000;

/// terse-comm's analytic volumes (ALGORITHMS.md), compiled here from the
/// same file: xtask links no workspace crate.
#[path = "../../../crates/comm/src/analytic.rs"]
mod analytic_volumes;

/// Analytic bytes one rank sends per step in each stage, for `d` elements
/// on [`RANKS`] ranks (`small` of them always synchronised by SLAMB, whose
/// `k` is 0.1 here).
fn analytic(optimizer: &str, compressed: bool, d: f64, small: f64) -> f64 {
    match (optimizer, compressed) {
        (_, false) => analytic_volumes::fp32_allreduce_bytes(d, RANKS),
        ("slamb", true) => analytic_volumes::sparse_allreduce_bytes(d, RANKS, 0.1, small),
        (_, true) => analytic_volumes::onebit_allreduce_bytes(d, RANKS),
    }
}

/// Elements in segments under SLAMB's `always_sync_below` (9,000), which
/// every step synchronises: the BERT-like layout's 768-element biases.
fn always_synced(d: u64) -> f64 {
    let matrix = 768.0 * 768.0;
    let bias = 768.0;
    (d as f64 / (matrix + bias)).floor() * bias
}

/// A paper's end-to-end figure: its schedule and its stated reduction.
struct PaperFigure {
    what: &'static str,
    optimizer: &'static str,
    /// Total steps and warmup steps (T, T_w); SLAMB: its sync period H as T.
    steps: f64,
    warmup: f64,
    /// The uncompressed baseline's bytes per element (2 = fp16, 4 = fp32).
    baseline_bytes: f64,
    stated: f64,
}

impl PaperFigure {
    /// The reduction over the whole schedule given the bytes per step of an
    /// fp32 allreduce, of a warmup step and of a compressed step. terse's
    /// warmup allreduces fp32; the papers' allreduced their baseline's
    /// precision, so the warmup step is counted at that precision.
    fn end_to_end(&self, fp32: f64, warmup_step: f64, compressed_step: f64) -> f64 {
        let precision = self.baseline_bytes / 4.0;
        let baseline = fp32 * precision;
        let warmup_step = warmup_step * precision;
        if self.optimizer == "slamb" {
            // Every step sends the sparse momentum; every H-th also the fp32 x.
            baseline / (compressed_step + fp32 / self.steps)
        } else {
            let total = self.warmup * warmup_step + (self.steps - self.warmup) * compressed_step;
            self.steps * baseline / total
        }
    }
}

const FIGURES: [PaperFigure; 4] = [
    PaperFigure {
        what: "1-bit Adam, BERT-Large seq128 (T 152K, T_w 23K), vs fp16",
        optimizer: "onebit_adam",
        steps: 152_000.0,
        warmup: 23_000.0,
        baseline_bytes: 2.0,
        stated: 5.0,
    },
    PaperFigure {
        what: "1-bit LAMB, BERT-Large seq128 (T 5993, T_w 1000), vs fp16",
        optimizer: "onebit_lamb",
        steps: 5993.0,
        warmup: 1000.0,
        baseline_bytes: 2.0,
        stated: 4.6,
    },
    PaperFigure {
        what: "1-bit LAMB, BERT-Large seq512 (T 555, T_w 107), vs fp16",
        optimizer: "onebit_lamb",
        steps: 555.0,
        warmup: 107.0,
        baseline_bytes: 2.0,
        stated: 4.1,
    },
    PaperFigure {
        what: "SLAMB, k 0.1, x synchronised every H = 100 steps, vs fp32",
        optimizer: "slamb",
        steps: 100.0,
        warmup: 0.0,
        baseline_bytes: 4.0,
        stated: 9.1,
    },
];

pub fn run(ctx: &Context) -> Result<Outcome> {
    let d = ctx.pick(BERT_BASE, 4_000_000);
    let (warmup, steps) = ctx.pick((2, 3), (1, 2));
    let rate = "10gbit".parse()?;
    let measured = measure(ctx, d, warmup, steps, rate)?;
    let fp32 = analytic("adam", false, d as f64, 0.0);
    let per_step = per_step(&measured, d, fp32);
    let (figures, worst_figure) = figures(&per_step.bytes, fp32);
    let claims = vec![
        Claim::new(
            per_step.worst_meter < 0.02,
            format!(
                "the traffic meter's bytes per step are within 2% of the analytic volumes \
                 (largest difference {:.2}%)",
                100.0 * per_step.worst_meter
            ),
        ),
        Claim::new(
            per_step.worst_wire < 0.02,
            format!(
                "the bytes the links carried (headers included), less the payload TCP \
                 retransmitted, are within 2% of the analytic volumes (largest difference \
                 {:.2}%; {})",
                100.0 * per_step.worst_wire,
                per_step.retransmissions(),
            ),
        ),
        Claim::new(
            worst_figure < 0.1,
            format!(
                "the papers' end-to-end reductions (5×, 4.6×, 4.1×, 9.1×) follow from the \
                 measured per-step bytes within 10% (largest difference {:.1}%; each paper's \
                 schedule applied to them by formula, not a whole run measured)",
                100.0 * worst_figure
            ),
        ),
    ];
    let body = format!(
        "## Bytes per step\n\n{} elements{}, {RANKS} ranks, one per netlab \
         host, links at {rate} with 9000-byte frames; {warmup} warmup and {steps} compressed \
         steps per optimizer (SLAMB is sparse from its first step). Bytes are what rank 0 \
         sent: metered by terse's traffic meter, and on the wire as its link's transmit \
         counter saw them, of which TCP retransmitted some (a resent segment crosses the link \
         twice: on 2 cores with 4 busy ranks a step sometimes resends a few per cent; the \
         check subtracts their payload, their headers stay counted). The analytic volumes: fp32 ring allreduce 2(n-1)/n·4d, 1-bit \
         allreduce 2(n-1)/n·d/8, SLAMB 2(n-1)/n·4·(0.1·d + the always-synchronised small \
         segments).\n\n{}\n## The papers' end-to-end reductions\n\nEach paper's schedule \
         applied to the bytes per step measured above (the ratios do not depend on the \
         buffer's size).\n\n{}",
        d,
        ctx.pick(" (BERT-base-sized)", ""),
        per_step.table.markdown(),
        figures.markdown()
    );
    Ok(Outcome {
        title: "Communication volume per step and end to end (1-bit Adam, 1-bit LAMB, SLAMB)"
            .into(),
        body,
        claims,
    })
}

/// Steps each optimizer over `d` elements on a lab of links at `rate`:
/// `warmup` steps, then `steps` compressed ones.
fn measure(
    ctx: &Context,
    d: u64,
    warmup: u64,
    steps: u64,
    rate: Rate,
) -> Result<Vec<(&'static str, Vec<StepRow>)>> {
    let bench = Bench::build()?;
    let lab = Lab::up(RANKS, Shape::at(rate))?;
    let log = ctx.report.path("metrics.jsonl");
    let mut measured = Vec::new();
    for optimizer in OPTIMIZERS {
        let run = Run {
            optimizer,
            elements: d,
            warmup,
            settle: 0,
            steps,
            label: rate.to_string(),
            measure_at: None,
        };
        measured.push((optimizer, bench.measure(&lab, &run, &log)?));
    }
    Ok(measured)
}

/// The bytes per step of each optimizer's stages against their analytic
/// volumes.
struct PerStep {
    table: Table,
    /// The largest relative difference of the metered bytes and of the
    /// wire's (less TCP's retransmissions) from the analytic volumes.
    worst_meter: f64,
    worst_wire: f64,
    /// The largest share of a stage's wire bytes that were retransmitted,
    /// `None` where some step's retransmissions were not measured.
    worst_retransmitted: Option<f64>,
    /// `(optimizer, compressed stage, metered bytes per step)`.
    bytes: Vec<(&'static str, bool, f64)>,
}

impl PerStep {
    /// What the wire check subtracted, for its claim.
    fn retransmissions(&self) -> String {
        match self.worst_retransmitted {
            Some(share) => format!(
                "TCP retransmitted at most {:.2}% of a stage's wire bytes",
                100.0 * share
            ),
            None => "retransmissions not measured: none subtracted".into(),
        }
    }
}

/// The mean bytes per step of each optimizer's uncompressed and
/// compressed stage (where it has one), metered and on the wire, beside
/// the analytic volumes and the fp32 allreduce's `fp32` bytes.
fn per_step(measured: &[(&'static str, Vec<StepRow>)], d: u64, fp32: f64) -> PerStep {
    let mut table = Table::new(&[
        "optimizer",
        "stage",
        "metered MB/step",
        "on the wire MB/step",
        "of which retransmitted",
        "analytic MB/step",
        "wire / analytic",
        "(wire − retransmitted) / analytic",
        "less than fp32",
    ]);
    let small = always_synced(d);
    let mut worst_meter: f64 = 0.0;
    let mut worst_wire: f64 = 0.0;
    let mut worst_retransmitted = Some(0.0f64);
    let mut bytes = Vec::new();
    for (optimizer, rows) in measured {
        for compressed in [false, true] {
            let stage: Vec<&StepRow> = rows
                .iter()
                .filter(|r| r.compressed() == compressed)
                .collect();
            if stage.is_empty() {
                continue;
            }
            let metered = mean(&stage, |r| r.bytes_sent as f64);
            let wire = mean(&stage, |r| r.wire_bytes_sent.unwrap_or(0) as f64);
            let retransmitted = stage
                .iter()
                .all(|r| r.wire_bytes_retransmitted.is_some())
                .then(|| mean(&stage, |r| r.wire_bytes_retransmitted.unwrap_or(0) as f64));
            let first_sent = wire - retransmitted.unwrap_or(0.0);
            let expected = analytic(optimizer, compressed, d as f64, small);
            worst_meter = worst_meter.max((metered / expected - 1.0).abs());
            worst_wire = worst_wire.max((first_sent / expected - 1.0).abs());
            worst_retransmitted = worst_retransmitted
                .zip(retransmitted)
                .map(|(worst, r)| worst.max(r / wire));
            bytes.push((*optimizer, compressed, metered));
            table.row(vec![
                optimizer.to_string(),
                stage[0].stage.clone(),
                num(metered / 1e6),
                num(wire / 1e6),
                retransmitted.map_or("–".into(), |r| format!("{:.2}%", 100.0 * r / wire)),
                num(expected / 1e6),
                format!("{:.4}", wire / expected),
                format!("{:.4}", first_sent / expected),
                format!("{}×", num(fp32 / metered)),
            ]);
        }
    }
    PerStep {
        table,
        worst_meter,
        worst_wire,
        worst_retransmitted,
        bytes,
    }
}

/// Each paper's end-to-end figure from the measured bytes per step, and
/// the largest relative difference from the stated ones.
fn figures(per_step: &[(&str, bool, f64)], fp32: f64) -> (Table, f64) {
    let bytes = |optimizer: &str, compressed: bool| {
        per_step
            .iter()
            .find(|(o, c, _)| *o == optimizer && *c == compressed)
            .map_or(f64::NAN, |p| p.2)
    };
    let mut figures = Table::new(&["paper's setting", "paper", "ours (measured bytes)", "ratio"]);
    let mut worst_figure: f64 = 0.0;
    for f in &FIGURES {
        let ours = f.end_to_end(fp32, bytes(f.optimizer, false), bytes(f.optimizer, true));
        worst_figure = worst_figure.max((ours / f.stated - 1.0).abs());
        figures.row(vec![
            f.what.into(),
            format!("{}×", f.stated),
            format!("{}×", num(ours)),
            format!("{:.3}", ours / f.stated),
        ]);
    }
    (figures, worst_figure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analytic_volumes_match_the_papers_per_step_factors() {
        let d = 1e8;
        let fp32 = analytic("adam", false, d, 0.0);
        assert_eq!(fp32, 6e8);
        assert_eq!(fp32 / analytic("onebit_adam", true, d, 0.0), 32.0);
        assert!((fp32 / analytic("slamb", true, d, 0.0) - 10.0).abs() < 1e-9);
        // SLAMB's end to end at H = 100: 1/(k + 1/H) = 9.09.
        let end_to_end = fp32 / (analytic("slamb", true, d, 0.0) + fp32 / 100.0);
        assert!((end_to_end - 9.0909).abs() < 1e-3);
    }

    #[test]
    fn the_papers_figures_follow_from_the_analytic_volumes() {
        let d = 1e8;
        let fp32 = analytic("adam", false, d, 0.0);
        for (figure, expected) in FIGURES.iter().zip([4.894, 4.568, 4.110, 9.091]) {
            let ours = figure.end_to_end(fp32, fp32, analytic(figure.optimizer, true, d, 0.0));
            assert!((ours - expected).abs() < 0.01, "{}: {ours}", figure.what);
        }
    }

    fn step(wire: f64, retransmitted: Option<f64>) -> StepRow {
        StepRow {
            optimizer: "adam".into(),
            elements: 1_000_000,
            step: 1,
            stage: "full".into(),
            step_ms: 1.0,
            comm_ms: 1.0,
            collective_ms: 1.0,
            bytes_sent: 6_000_000,
            bytes_sent_max: 6_000_000,
            wire_bytes_sent: Some(wire as u64),
            wire_bytes_retransmitted: retransmitted.map(|r| r as u64),
        }
    }

    #[test]
    fn the_wire_check_subtracts_what_tcp_retransmitted() {
        let d = 1_000_000;
        let fp32 = analytic("adam", false, d as f64, 0.0);
        // 1% headers, and in one of two steps 4% resent: 3% over on average.
        let rows = vec![
            step(1.01 * fp32, Some(0.0)),
            step(1.05 * fp32, Some(0.04 * fp32)),
        ];
        let measured = per_step(&[("adam", rows.clone())], d, fp32);
        assert!(
            (measured.worst_wire - 0.01).abs() < 1e-6,
            "{}",
            measured.worst_wire
        );
        let share = measured.worst_retransmitted.unwrap();
        assert!((share - 0.02 / 1.03).abs() < 1e-6, "{share}");
        assert!(measured.retransmissions().contains("at most 1.94%"));
        // A step without the count: nothing subtracted, and the claim says so.
        let unmeasured = vec![rows[0].clone(), step(1.05 * fp32, None)];
        let measured = per_step(&[("adam", unmeasured)], d, fp32);
        assert!(
            (measured.worst_wire - 0.03).abs() < 1e-6,
            "{}",
            measured.worst_wire
        );
        assert_eq!(measured.worst_retransmitted, None);
        assert!(measured.retransmissions().contains("not measured"));
    }
}
