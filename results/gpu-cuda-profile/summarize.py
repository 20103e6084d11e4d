#!/usr/bin/env python3
"""The tables in README.md, recomputed from what the two calls wrote.

usage: python3 results/gpu-cuda-profile/summarize.py  (reads call1/ and call2/)

- the matmul precision line;
- samples/s of terse and PyTorch at each round (rounds interleave terse,
  PyTorch fp32 and TF32 in one call), their medians and ratios;
- cubecl's per-kernel profile of terse's step: the profiled run timed 4
  steps with every kernel timed on its own; the kernels from after one
  AdamW launch through the next are one whole step, summed by kernel family
  and by class (matmul, reduce, elementwise, copy, other);
- torch.profiler's totals and matmul time per step."""
import json
import lzma
import pathlib
import re
import statistics
from collections import defaultdict

here = pathlib.Path(__file__).parent
calls = [here / "call1", here / "call2"]


def log_json(call, pattern):
    """JSON lines of `call`'s log.txt that match `pattern` (the first call's
    $OUT came back without its .jsonl files, whose lines the log repeats)."""
    out = []
    for line in (call / "log.txt").read_text().splitlines():
        if line.startswith("{") and re.search(pattern, line):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # cut at 300 characters by the script
                fields = re.findall(r'"(\w+)": ("[^"]*"|[0-9][0-9.e-]*[0-9])[,}]', line)
                out.append({k: json.loads(v) for k, v in fields})
    return out


for t in log_json(calls[0], "matmul_precision"):
    print(f"matmul precision on {t['device']}: {t['m']}x{t['k']}x{t['n']} relative RMS error "
          f"{t['relative_rms_error']:.2e} ({t['arithmetic']})")
print()

# The terse lines of the log: the smoke run (tiny) and the built binary at
# batch 32, each printed once by its run; the script's `tail` repeats the
# last one when a later run is skipped, so repeats are dropped.
built = []
for t in log_json(calls[0], '"framework": "terse"'):
    if t.get("preset") == "base" and (not built or built[-1] != t):
        built.append(t)
torch = [json.loads(l) for call in calls for l in (call / "pytorch.jsonl").read_text().splitlines()
         if l.startswith("{")]
series = {"terse cuda": [t["samples_per_s"] for t in built]}
for p in ("fp32", "tf32", "bf16"):
    series[f"PyTorch {p}"] = [t["samples_per_s"] for t in torch if t["precision"] == p]
print("| BERT-base b32 seq 128 | runs (samples/s) | median | step ms (median) |")
print("|---|---|---|---|")
med = {}
for name, xs in series.items():
    if xs:
        med[name] = statistics.median(xs)
        print(f"| {name} | {', '.join(f'{x:.1f}' for x in xs)} | {med[name]:.1f} | {32e3 / med[name]:.1f} |")
print()
for p in ("fp32", "tf32", "bf16"):
    key = f"PyTorch {p}"
    if "terse cuda" in med and key in med:
        print(f"terse / {key}: {med['terse cuda'] / med[key]:.2f}x (medians)")
for t in built:
    print(f"terse step split: forward {t['forward_ms']} ms, backward {t['backward_ms']} ms, "
          f"round trip + AdamW {t['optimizer_ms']} ms")
print()

CLASSES = [
    ("matmul", re.compile(r"matmul|Matmul|Gemm|gemm")),
    ("reduce", re.compile(r"Reduce|reduce|SharedSum|Sum|Argmax|Softmax")),
    ("copy", re.compile(r"Slice|Copy|copy|Gather|Scatter|Cat|Into|Layout|Repeat|Select")),
    ("elementwise", re.compile(r"Elemwise|Binop|Unary|Scalar|Fuse|Mask|Clamp|Cast|Prng|Dropout")),
]


def kind(name):
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def kernel_lines(log):
    """The profile's `| duration | name` lines as (name without its hash, ms)."""
    rows = []
    for line in lzma.open(log, "rt", errors="replace"):
        m = re.match(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.+?)\s*$", line)
        if not m or "Total" in line or "Duration" in line:
            continue
        value, unit, name = float(m[1]), m[2], m[3]
        scale = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
        rows.append((re.sub(r"_[0-9a-f]{8}\b", "", name), value * scale))
    return rows


def last_whole_step(rows):
    """The kernels from after the second-to-last AdamW launch through the last
    one: one whole training step (AdamW is the step's last kernel, launched
    once per step; the log's tail may lack the final step's)."""
    adam = [i for i, (name, _) in enumerate(rows) if name.startswith("AdamKernel")]
    return rows[adam[-2] + 1:adam[-1] + 1]


log = calls[0] / "cubecl-profile-built.log.xz"
if log.exists():
    rows = last_whole_step(kernel_lines(log))
    by_name, by_kind = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])
    for name, ms in rows:
        short = " ".join(name.replace("|", " ").split()[:2])
        by_name[short][0] += ms
        by_name[short][1] += 1
        by_kind[kind(name)][0] += ms
        by_kind[kind(name)][1] += 1
    total = sum(ms for ms, _ in by_kind.values())
    print(f"cubecl profile, one BERT-base batch-32 step: {len(rows)} kernels, {total:.1f} ms of "
          "kernel time (each kernel timed on its own, so launch gaps are not in it)")
    print()
    print("| class | kernels | ms | share |")
    print("|---|---|---|---|")
    for k, (ms, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"| {k} | {n} | {ms:.1f} | {ms / total:.0%} |")
    print()
    print("| kernel | launches | ms |")
    print("|---|---|---|")
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"| {name} | {n} | {ms:.2f} |")
    print()

def self_cuda_ms(row):
    value, unit = re.findall(r"([0-9.]+)(ms|us)\s+[0-9.]+%", row)[-1]
    return float(value) / (1000 if unit == "us" else 1)


for p in ("tf32", "fp32"):
    path = calls[1] / f"torch-profile-{p}.txt"
    if path.exists():
        text = path.read_text().splitlines()
        total = [l for l in text if "Self CUDA time total" in l]
        # Self CUDA is the last "time  percent" pair of a row.
        mm = sum(self_cuda_ms(l) for l in text if re.match(r"\s*aten::(mm|addmm|bmm)\s", l))
        print(f"torch.profiler {p}, 3 steps: {total[0].strip() if total else '(no total)'}; "
              f"aten::mm+addmm+bmm {mm:.1f} ms, {mm / 3:.1f} ms per step")
