//! Throughput of one optimizer step over a flat buffer, against the memory
//! bandwidth measured in the same run.
//!
//! An Adam step reads x, m, v, g and writes x, m, v: 28 bytes per parameter,
//! so a copy of the same number of bytes (read 14, write 14 per parameter) is
//! the floor a memory-bound update can approach. Printed: ms per step,
//! Gparam/s, and the step's effective bandwidth as a fraction of the copy's.
//! For scale, not measured here: PyTorch's fused AdamW steps 110M parameters
//! in 72 ms (1.5 Gparam/s) on this class of machine (brief).
//!
//! `cargo xtask bench optim` (110M parameters) or `… --quick` (10M);
//! writes `results/bench/optim.json`.

use terse_optim::WithMoments;

#[path = "common/bert_layout.rs"]
mod bert_layout;
#[path = "common/best_of.rs"]
mod best_of;

use best_of::best_of;

use terse_comm::SingleRank;
use terse_optim::{AdamConfig, LambConfig, LrSchedule, Optimizer, OptimizerConfig, SgdConfig};

fn parallel_copy(dst: &mut [f32], src: &[f32]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(1 << 16)
        .zip(src.par_chunks(1 << 16))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// The benchmark's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "optim_step",
    bin_name = "optim_step",
    about = "Times each optimizer's step over a BERT-like flat buffer on the CPU against a \
             copy of the same bytes; `cargo xtask bench optim` runs it"
)]
struct Args {
    /// A smoke run: 10M parameters (110M otherwise) and 3 repeats
    #[arg(long)]
    quick: bool,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args { quick, .. } = clap::Parser::parse();
    let layout = bert_layout::layout(if quick { 10_000_000 } else { 110_000_000 });
    let d = layout.len();
    let repeats = if quick { 3 } else { 5 };
    let threads = rayon::current_num_threads();
    println!("optimizer step benchmark: {d} parameters, {threads} threads, best of {repeats}");

    // Baseline: copy 14·d bytes (read 14·d, write 14·d) = the Adam step's
    // traffic, on all threads like the step itself.
    let src = vec![1.0f32; d * 7 / 2];
    let mut dst = vec![0.0f32; src.len()];
    let copy_s = best_of(repeats, || {
        parallel_copy(&mut dst, std::hint::black_box(&src))
    });
    let copy_bytes = 2.0 * 4.0 * src.len() as f64;
    let copy_gbs = copy_bytes / copy_s / 1e9;
    println!(
        "memcpy baseline: {:.1} ms, {copy_gbs:.1} GB/s (read + write)",
        copy_s * 1e3
    );
    drop((src, dst));

    let mut x: Vec<f32> = (0..d).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3).collect();
    let g: Vec<f32> = (0..d).map(|i| ((i % 777) as f32 - 388.0) * 1e-4).collect();
    let mut g_work = g.clone();
    let configs = [
        (
            "adam",
            OptimizerConfig::Adam(AdamConfig::default().with_weight_decay(0.01)),
            28.0,
        ),
        (
            "lamb",
            OptimizerConfig::Lamb(LambConfig::default().with_weight_decay(0.01)),
            40.0,
        ),
        ("sgd", OptimizerConfig::Sgd(SgdConfig::default()), 20.0),
    ];
    let mut rows = Vec::new();
    for (name, config, bytes_per_param) in configs {
        let mut optimizer = Optimizer::new(
            config,
            LrSchedule::Constant { lr: 1e-4 },
            layout.clone(),
            &SingleRank::new(),
        )
        .unwrap();
        let s = best_of(repeats, || {
            parallel_copy(&mut g_work, &g);
            optimizer
                .step_flat(&mut x, &mut g_work, &SingleRank::new())
                .unwrap();
        });
        // The gradient refresh is one more copy of 8 bytes per parameter; take it out.
        let refresh = best_of(repeats, || {
            parallel_copy(&mut g_work, std::hint::black_box(&g))
        });
        let step_s = (s - refresh).max(1e-9);
        let gbs = bytes_per_param * d as f64 / step_s / 1e9;
        let ratio = gbs / copy_gbs;
        println!(
            "{name:>5}: {:.1} ms/step, {:.2} Gparam/s, {gbs:.1} GB/s = {:.0}% of memcpy",
            step_s * 1e3,
            d as f64 / step_s / 1e9,
            100.0 * ratio
        );
        rows.push(format!(
            "    {{\"optimizer\": \"{name}\", \"ms_per_step\": {:.2}, \"gparam_per_s\": {:.3}, \"bytes_per_param\": {bytes_per_param}, \"fraction_of_memcpy\": {ratio:.3}}}",
            step_s * 1e3,
            d as f64 / step_s / 1e9
        ));
    }

    let json = format!(
        "{{\n  \"parameters\": {d},\n  \"threads\": {threads},\n  \"memcpy_gb_per_s\": {copy_gbs:.2},\n  \"steps\": [\n{}\n  ]\n}}\n",
        rows.join(",\n")
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/bench");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join(if quick {
        "optim-quick.json"
    } else {
        "optim.json"
    });
    std::fs::write(&file, json).unwrap();
    println!("wrote {}", file.display());
}
