#!/usr/bin/env python3
"""The table in README.md, recomputed from the raw outputs of the two calls
(run1/: the full script, run2/: PART=rest on the same machine, still held).

usage: python3 results/gpu-cuda/summarize.py"""
import json
import pathlib

here = pathlib.Path(__file__).parent


def lines(name):
    out = []
    for run in ("run1", "run2"):
        path = here / run / name
        if path.exists():
            out += [json.loads(l) for l in path.read_text().splitlines() if l.startswith("{")]
    return out


terse = [t for t in lines("terse.jsonl") if t["preset"] == "base"]
torch = lines("pytorch.jsonl")
print("| batch | terse cuda | PyTorch fp32 | PyTorch TF32 | PyTorch bf16 | terse / fp32 | terse / TF32 | terse / bf16 |")
print("|---|---|---|---|---|---|---|---|")
for t in sorted(terse, key=lambda t: -t["batch"]):
    ref = {p["precision"]: p["samples_per_s"] for p in torch if p["batch"] == t["batch"]}
    s = t["samples_per_s"]
    print(f"| {t['batch']} | {s:.1f} | {ref['fp32']:.1f} | {ref['tf32']:.1f} | {ref['bf16']:.1f} "
          f"| {s / ref['fp32']:.2f}× | {s / ref['tf32']:.2f}× | {s / ref['bf16']:.2f}× |")
print()
for t in terse:
    print(f"terse b{t['batch']}: step {t['step_ms']} ms, dispatches/step {t['dispatches_per_step']} "
          f"{t['dispatches_by_kind']}")
print()
for p in (json.loads(l) for l in (here / "run2" / "parity.jsonl").read_text().splitlines()):
    if "optimizer" in p:
        print(f"{p['optimizer']:<12} loss≤{p['worst_loss_relative']:.1e} L2 step3 {p['l2_step3']:.1e} "
              f"step6 {p['l2_step6']:.1e} bytes_equal={p['bytes_sent_equal']} "
              f"ranks_identical cpu/cuda={p['ranks_identical_cpu']}/{p['ranks_identical_cuda']} ok={p['ok']}")
    else:
        print(f"{p['case']}: losses_equal={p['losses_equal']} weights_identical={p['weights_identical']} ok={p['ok']}")
