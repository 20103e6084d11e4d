#!/usr/bin/env python3
"""PyTorch (cuBLAS) on the matmuls of a BERT training step, beside terse's
`matmul_routines` bench: the same products, with the same transposed views.

How to run (on a CUDA machine with torch):

    matmul_routines --shapes > shapes.jsonl      # the products, from terse
    python3 benches/pytorch_matmul_shapes.py shapes.jsonl [--modes fp32,tf32,bf16] [--reps 10]

Each product `[m, k] · [k, n]` runs as `torch.mm(a, b)`, an operand marked
transposed being the `.t()` view of a contiguous `[k, m]` / `[n, k]` tensor,
as terse's layers pass it. Modes: fp32 (TF32 off), tf32 (TF32 matmuls),
bf16 (both operands bfloat16, as under autocast). Time: the mean of `reps`
products after two untimed ones, the device synchronised on both ends, as
the Rust bench does.

Prints one JSON line per (mode, product):
  {"framework": "pytorch", "mode", "product", "per_step", "m", "k", "n", "ms", "tflops"}
"""

import argparse
import json
import time

import torch


def operand(rows, cols, transposed, dtype):
    if transposed:
        return torch.randn(cols, rows, device="cuda", dtype=dtype).t()
    return torch.randn(rows, cols, device="cuda", dtype=dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", help="`matmul_routines --shapes` output (JSON lines)")
    parser.add_argument("--modes", default="fp32,tf32,bf16")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    with open(args.shapes) as f:
        products = [json.loads(line) for line in f if line.strip()]
    torch.manual_seed(0)
    for mode in args.modes.split(","):
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        for p in products:
            a = operand(p["m"], p["k"], p["lhs_transposed"], dtype)
            b = operand(p["k"], p["n"], p["rhs_transposed"], dtype)
            for _ in range(2):
                torch.mm(a, b)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.reps):
                torch.mm(a, b)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3 / args.reps
            tflops = 2 * p["m"] * p["k"] * p["n"] / (ms * 1e-3) / 1e12
            line = {"framework": "pytorch", "mode": mode, "product": p["product"],
                    "per_step": p["per_step"], "m": p["m"], "k": p["k"], "n": p["n"],
                    "ms": round(ms, 4), "tflops": round(tflops, 2),
                    "torch_version": torch.__version__}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
