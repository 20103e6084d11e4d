#!/usr/bin/env python3
"""Summarises the matmul sweep of device_run.sh: for each of cubek's
routines (terse's `matmul_routines` bench) and each PyTorch mode
(`pytorch_matmul_shapes.py`), the step's matmul time Σ per_step · ms over
the products it ran, and for each product the fastest routine.

    python3 summarize.py matmul-routines.jsonl pytorch-matmuls.jsonl \
        [--shapes=shapes.jsonl] [--best]

A routine counts for the step total only if every product ran without a
failure and with an error a TF32 or f32 product can have (rel_error <
2e-3). A product the routine declined ran as burn's matmul, as it would in
a run naming the routine, and counts with that time; the line says how
many were declined, and a routine that declined every product (cuBLAS off
CUDA) is not a candidate for `--best`. Every product is the step's (the
`--shapes` file, `matmul_routines --shapes`'s lines), not only those the
sweep reached: a sweep cut off by its time limit has run the routines
listed first on the first products only, and none of them is complete. `--best` prints only the name of the
fastest such routine (what the script times on the whole step next).
"""

import json
import sys


def lines(path):
    """The JSON lines of `path`; a line that does not parse (Rust writes a
    non-finite error as `inf`, which JSON has not) is passed over."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        print(f"passed over (not JSON): {line.strip()}", file=sys.stderr)
    except FileNotFoundError:
        pass
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    terse, torch = lines(args[0]), lines(args[1]) if len(args) > 1 else []
    shapes = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--shapes=")), None)
    products = [r["product"] for r in lines(shapes)] if shapes else []
    for r in terse:
        if r["product"] not in products:
            products.append(r["product"])
    totals = {}
    for name in dict.fromkeys(r["routine"] for r in terse):
        rows = [r for r in terse if r["routine"] == name]
        ok = [r for r in rows if "ms" in r and r["rel_error"] < 2e-3]
        complete = {r["product"] for r in ok} >= set(products)
        declined = sum(1 for r in ok if r["declined"] > 0)
        total = sum(r["per_step"] * r["ms"] for r in ok)
        totals[name] = (total, complete, len(products) - len(ok), declined)
    if "--best" in sys.argv:
        candidates = {n: t for n, (t, c, _, d) in totals.items() if c and d < len(products)}
        if candidates:
            print(min(candidates, key=candidates.get))
        return
    print("step's matmul time (Σ per_step · ms)")
    for mode in dict.fromkeys(r["mode"] for r in torch):
        total = sum(r["per_step"] * r["ms"] for r in torch if r["mode"] == mode)
        print(f"  pytorch {mode:<24} {total:9.2f} ms")
    for name, (total, whole, missing, declined) in sorted(totals.items(), key=lambda kv: kv[1][0]):
        note = f"     ({declined} of {len(products)} declined to burn's matmul)" if declined else ""
        if whole:
            print(f"  terse {name:<26} {total:9.2f} ms{note}")
        else:
            print(f"  terse {name:<26} {'-':>9}     ({missing} products failed, wrong or not reached)")
    print("\nfastest per product (ms): terse routine | pytorch fp32 | tf32")
    for product in products:
        rows = [r for r in terse if r["product"] == product and "ms" in r
                and r["declined"] == 0 and r["rel_error"] < 2e-3]
        best = min(rows, key=lambda r: r["ms"]) if rows else None
        torch_ms = {r["mode"]: r["ms"] for r in torch if r["product"] == product}
        shape = next((f"{r['m']}x{r['k']}x{r['n']}" for r in terse if r["product"] == product), "not reached")
        cell = f"{best['routine']} {best['ms']:.3f}" if best else "none"
        print(f"  {product:<30} {shape:<16} {cell:<32} {torch_ms.get('fp32', float('nan')):8.3f} "
              f"{torch_ms.get('tf32', float('nan')):8.3f}")


if __name__ == "__main__":
    main()
