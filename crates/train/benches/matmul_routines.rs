//! The matmuls of a BERT training step, each timed with each of cubek's
//! routines that a run can name (`terse_fused::name_linear_matmul`), on a
//! cubecl device: which routine to name for the linear layers, measured
//! shape by shape instead of trusted to autotune (which terse keeps off:
//! its pick varies between runs and with it the summation order).
//!
//! The products are those of BERT's linear layers at `--rows` rows (batch ×
//! seq; BERT-base at batch 32, seq 128 by default): per layer the forward
//! `x·W`, x's gradient `∂y·Wᵀ` and W's gradient `xᵀ·∂y`, the transposes
//! as views (as the layers pass them), the tied MLM decoder (W stored
//! `[vocab, hidden]`) on the masked 15% of rows, and the pooler and the
//! NSP head on one row per sequence (`--sequences`: the step's narrowest
//! products, k = 2 in the NSP head's x gradient, where cubecl-cuda pads a
//! `[768, 2]` weight's rows to 4). Each line says how many
//! times a step runs that product (`per_step`), so a routine's step total
//! is `Σ per_step · ms`.
//!
//! Each product's answer is checked at 64 entries against float64 on the
//! host (`rel_error`: TF32 tensor cores give ~3e-4, f32 arithmetic ~1e-7);
//! `declined` counts products the routine could not take on this device,
//! which burn's matmul ran instead (its time is then not the routine's).
//! A routine that fails on a shape says so on its line and the sweep goes
//! on.
//!
//! Its arguments (after `--` under cargo) are `matmul_routines --help`'s.
//! Prints one JSON line per (product, routine), each product's operands
//! made once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use terse_fused as fused;
use terse_rng::SplitMix64;

/// One product of the step: `[m, k] · [k, n]`, either operand possibly a
/// transposed view of a contiguous `[k, m]` / `[n, k]`.
struct Product {
    name: String,
    per_step: usize,
    m: usize,
    k: usize,
    n: usize,
    lhs_transposed: bool,
    rhs_transposed: bool,
}

impl Product {
    /// The product's JSON fields (without braces), shared by `--shapes`
    /// and the timed lines.
    fn fields(&self) -> String {
        format!(
            "\"product\": \"{}\", \"per_step\": {}, \"m\": {}, \"k\": {}, \"n\": {}, \"lhs_transposed\": {}, \"rhs_transposed\": {}",
            self.name,
            self.per_step,
            self.m,
            self.k,
            self.n,
            self.lhs_transposed,
            self.rhs_transposed
        )
    }
}

/// A product's operands on the device and their values on the host (for
/// the float64 check), made once and timed with every routine.
struct Operands {
    lhs: Tensor<2>,
    rhs: Tensor<2>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Operands {
    fn new(p: &Product, device: &Device) -> Self {
        let (lhs, a) = operand(p.m, p.k, p.lhs_transposed, 1, device);
        let (rhs, b) = operand(p.k, p.n, p.rhs_transposed, 2, device);
        Self { lhs, rhs, a, b }
    }
}

/// The sweep's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "matmul_routines",
    bin_name = "matmul_routines",
    about = "Times each of BERT's linear-layer matmuls with each of cubek's routines on a \
             cubecl device, checked against float64; one JSON line per (product, routine)"
)]
struct Args {
    /// The cubecl device: cuda, cuda:N, wgpu, wgpu:N, lavapipe (needed but with --shapes)
    #[arg(long, required_unless_present = "shapes_only")]
    device: Option<terse_train::DeviceChoice>,
    /// Routines, comma-separated [default: all that a run can name]
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    routines: Vec<String>,
    /// Rows of the products (batch × seq)
    #[arg(long, default_value_t = 4096)]
    rows: usize,
    /// Sequences in the batch (the pooler's and the NSP head's rows)
    #[arg(long, default_value_t = 32)]
    sequences: usize,
    /// BERT's hidden size
    #[arg(long, default_value_t = 768)]
    hidden: usize,
    /// BERT's feed-forward size
    #[arg(long, default_value_t = 3072)]
    intermediate: usize,
    /// The vocabulary (the tied MLM decoder's products)
    #[arg(long, default_value_t = 30522)]
    vocab: usize,
    /// Timed repetitions of each product
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Print the products as JSON lines and stop (what benches/pytorch_matmul_shapes.py times)
    #[arg(long = "shapes")]
    shapes_only: bool,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse() -> Args {
    use clap::Parser as _;
    let mut args = Args::parse();
    if args.routines.is_empty() {
        args.routines = fused::matmul_routine_names().map(str::to_string).collect();
    }
    args
}

/// The three products of a linear layer `[rows, d_in] → [rows, d_out]`
/// (`count` of them per step); W stored `[d_out, d_in]` when `stored_t`.
fn layer_products(
    out: &mut Vec<Product>,
    name: &str,
    count: usize,
    (rows, d_in, d_out): (usize, usize, usize),
    stored_t: bool,
) {
    let product = |what: &str, (m, k, n), lhs_transposed, rhs_transposed| Product {
        name: format!("{name} {what}"),
        per_step: count,
        m,
        k,
        n,
        lhs_transposed,
        rhs_transposed,
    };
    // W [in, out] is a transposed view of the stored [out, in] when
    // `stored_t`; ∂x's Wᵀ is then the stored layout, contiguous.
    out.push(product("forward", (rows, d_in, d_out), false, stored_t));
    out.push(product("x grad", (rows, d_out, d_in), false, !stored_t));
    out.push(product("W grad", (d_in, rows, d_out), true, false));
}

/// BERT's linear products per training step (12 layers for BERT-base's
/// hidden 768; the layer count only scales `per_step`).
fn products(args: &Args) -> Vec<Product> {
    let (r, h, f) = (args.rows, args.hidden, args.intermediate);
    let masked = (r * 15).div_ceil(100);
    let layers = 12;
    let mut out = Vec::new();
    layer_products(
        &mut out,
        "attention q/k/v/out",
        4 * layers,
        (r, h, h),
        false,
    );
    layer_products(&mut out, "ffn up", layers, (r, h, f), false);
    layer_products(&mut out, "ffn down", layers, (r, f, h), false);
    layer_products(&mut out, "mlm transform", 1, (masked, h, h), false);
    layer_products(&mut out, "mlm decoder", 1, (masked, h, args.vocab), true);
    layer_products(&mut out, "pooler", 1, (args.sequences, h, h), false);
    layer_products(&mut out, "nsp head", 1, (args.sequences, h, 2), false);
    out
}

/// The operand `[rows, cols]` (a transposed view of `[cols, rows]` when
/// `transposed`) and its values in row-major `[rows, cols]` order.
fn operand(
    rows: usize,
    cols: usize,
    transposed: bool,
    seed: u64,
    device: &Device,
) -> (Tensor<2>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let stored: Vec<f32> = (0..rows * cols).map(|_| rng.symmetric()).collect();
    if !transposed {
        let t = Tensor::<2>::from_data(TensorData::new(stored.clone(), [rows, cols]), device);
        return (t, stored);
    }
    let t =
        Tensor::<2>::from_data(TensorData::new(stored.clone(), [cols, rows]), device).transpose();
    let values = (0..rows * cols)
        .map(|i| stored[(i % cols) * rows + i / cols])
        .collect();
    (t, values)
}

/// The RMS error of 64 entries of `got` `[m, n]` against float64 products
/// of `a` `[m, k]` and `b` `[k, n]`, relative to their RMS.
fn sampled_error(got: &[f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> f64 {
    let mut rng = SplitMix64::new(5);
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    for _ in 0..64 {
        let (i, j) = (rng.next_u64() as usize % m, rng.next_u64() as usize % n);
        let exact: f64 = (0..k)
            .map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j]))
            .sum();
        err2 += (f64::from(got[i * n + j]) - exact).powi(2);
        ref2 += exact * exact;
    }
    (err2 / ref2).sqrt()
}

/// Times `routine` on `p` (mean of `reps` products after two untimed
/// ones, the device waited for on both ends) and checks its answer.
fn time_product(routine: &str, p: &Product, x: &Operands, device: &Device, reps: usize) -> String {
    let declined = fused::declined_matmuls();
    let timed = catch_unwind(AssertUnwindSafe(|| {
        let mut last = fused::named_matmul(x.lhs.clone(), x.rhs.clone());
        let _ = fused::named_matmul(x.lhs.clone(), x.rhs.clone());
        device.sync().expect("the device failed");
        let start = Instant::now();
        for _ in 0..reps {
            last = fused::named_matmul(x.lhs.clone(), x.rhs.clone());
        }
        device.sync().expect("the device failed");
        let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
        (ms, last.into_data().try_to_vec::<f32>().expect("f32"))
    }));
    let head = format!("{{\"routine\": \"{routine}\", {}", p.fields());
    match timed {
        Ok((ms, got)) => {
            let error = sampled_error(&got, &x.a, &x.b, (p.m, p.k, p.n));
            let tflops = 2.0 * (p.m * p.k * p.n) as f64 / (ms * 1e-3) / 1e12;
            format!(
                "{head}, \"ms\": {ms:.4}, \"tflops\": {tflops:.3}, \"rel_error\": {error:.2e}, \"declined\": {}, \"first_decline\": {:?}}}",
                fused::declined_matmuls() - declined,
                fused::first_decline_reason().unwrap_or_default()
            )
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!(
                "{head}, \"failed\": {:?}}}",
                why.lines().next().unwrap_or("")
            )
        }
    }
}

fn main() {
    let args = parse();
    let products = products(&args);
    if args.shapes_only {
        for p in &products {
            println!("{{{}}}", p.fields());
        }
        return;
    }
    // Every name checked before any timing, so a typo costs no GPU time.
    for routine in &args.routines {
        if let Err(e) = fused::name_linear_matmul(Some(routine)) {
            eprintln!("matmul_routines: error: --routines: {e}");
            std::process::exit(1)
        }
    }
    let choice = args
        .device
        .expect("clap asks for --device without --shapes");
    if choice.is_cpu() {
        eprintln!("matmul_routines: error: --device: a cubecl device (cuda, wgpu, lavapipe)");
        std::process::exit(1)
    }
    // The routines time f32 operands.
    let device = choice
        .open(terse_train::Precision::Fp32)
        .unwrap_or_else(|e| {
            eprintln!("matmul_routines: error: {e}");
            std::process::exit(1)
        });
    // A routine this machine lacks a part for (cuBLAS, a TMA routine's
    // barrier headers) fails each product with the trainer's reason, where
    // it would fail inside NVRTC or fall back to burn's matmul.
    let lacks: Vec<Option<String>> = args
        .routines
        .iter()
        .map(|routine| terse_train::matmul_machine_lacks(routine, &choice))
        .collect();
    for (routine, why) in args.routines.iter().zip(&lacks) {
        if let Some(why) = why {
            eprintln!("matmul_routines: {routine} not timed: {why}");
        }
    }
    for p in &products {
        let operands = Operands::new(p, &device);
        for (routine, lacks) in args.routines.iter().zip(&lacks) {
            if let Some(why) = lacks {
                println!(
                    "{{\"routine\": \"{routine}\", {}, \"failed\": {why:?}}}",
                    p.fields()
                );
                continue;
            }
            fused::name_linear_matmul(Some(routine)).expect("checked above");
            println!(
                "{}",
                time_product(routine, p, &operands, &device, args.reps)
            );
        }
    }
}
