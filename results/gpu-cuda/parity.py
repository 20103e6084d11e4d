#!/usr/bin/env python3
"""CUDA against the CPU on the device-parity test's runs
(crates/cli/tests/device_parity.rs): BERT-Tiny, 2 local ranks, 6 steps of
global batch 4 at sequence length 32, checkpoints at 3 and 6.

usage: parity.py RUNS_DIR > parity.json

RUNS_DIR holds {optimizer}-cpu/ and {optimizer}-cuda/ run directories, and
adam-cuda-resumed/ (adam on cuda resumed from adam-cuda's step 3). The same
checks as the lavapipe test (no step reading device memory back before its
update is queued among them: `host_reads`), printed as one JSON object per
case, with `ok` saying whether the test's bounds hold; each device step's
wait at its end (`device_wait_ms`) is recorded."""
import json
import pathlib
import sys

import numpy as np

try:
    from safetensors.numpy import load_file
except ImportError:  # a machine without safetensors: its format read here

    def load_file(path):
        """safetensors' layout: an 8-byte little-endian header length, the
        JSON header (name -> dtype, shape, data_offsets), the raw data."""
        raw = pathlib.Path(path).read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + size])
        data = raw[8 + size :]
        dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "U32": np.uint32}
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            out[name] = np.frombuffer(data[start:end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
        return out


runs = pathlib.Path(sys.argv[1])
STEPS, TOL = 6, 1e-4


def steps(run):
    out = []
    for line in (runs / run / "metrics.jsonl").read_text().splitlines():
        try:
            v = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in v:
            out.append((v["step"], v["loss"], v["bytes_sent"]))
    return out


def device_fields(run):
    """Each step line's host reads by phase and device wait (device runs)."""
    lines = [json.loads(l) for l in (runs / run / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
    return [v.get("host_reads") for v in lines], [v.get("device_wait_ms") for v in lines]


def model(run, step, rank):
    path = runs / run / "checkpoints" / f"step-{step:08}" / f"model-rank-{rank}.safetensors"
    return dict(sorted(load_file(str(path)).items()))


def rel_l2(a, b):
    assert a.keys() == b.keys()
    diff = sum(float(np.sum((a[k].astype(np.float64) - b[k].astype(np.float64)) ** 2)) for k in a)
    norm = sum(float(np.sum(b[k].astype(np.float64) ** 2)) for k in b)
    return (diff / norm) ** 0.5


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


def compare(optimizer, cpu_run, dev_run, cpu, dev, uncompressed, loss_tol):
    """The parity record of one optimizer's CPU and device runs."""
    worst = max(abs(d[1] - c[1]) / abs(c[1]) for d, c in zip(dev, cpu)) if dev else None
    record = {
        "optimizer": optimizer,
        "steps_logged": [len(cpu), len(dev)],
        "losses_cpu": [s[1] for s in cpu],
        "losses_cuda": [s[1] for s in dev],
        "worst_loss_relative": worst,
        "bytes_sent_equal": [s[2] for s in cpu] == [s[2] for s in dev],
        "l2_step3": rel_l2(model(dev_run, 3, 0), model(cpu_run, 3, 0)),
        "l2_step6": rel_l2(model(dev_run, STEPS, 0), model(cpu_run, STEPS, 0)),
        "ranks_identical_cpu": same(model(cpu_run, STEPS, 1), model(cpu_run, STEPS, 0)),
        "ranks_identical_cuda": same(model(dev_run, STEPS, 1), model(dev_run, STEPS, 0)),
    }
    # Nothing read back before the update is queued (device_parity.rs's check).
    reads, waits = device_fields(dev_run)
    record["host_reads_cuda"], record["device_wait_ms_cuda"] = reads, waits
    record["reads_after_update_only"] = all(
        r is not None and r["before_update"] == 0 and r["after_update"] == 2 for r in reads
    )
    ok = (
        len(cpu) == len(dev) == STEPS
        and worst <= loss_tol
        and record["bytes_sent_equal"]
        and record["ranks_identical_cpu"] == record["ranks_identical_cuda"]
        and record["reads_after_update_only"]
    )
    if uncompressed:
        ok = ok and record[f"l2_step{uncompressed}"] <= TOL
    record["ok"] = bool(ok)
    return record


for optimizer, uncompressed, loss_tol in [
    ("adam", STEPS, TOL),
    ("lamb", STEPS, TOL),
    ("onebit_adam", 3, TOL),
    ("onebit_lamb", 3, TOL),
    ("slamb", 0, 1e-3),
]:
    cpu_run, dev_run = f"{optimizer}-cpu", f"{optimizer}-cuda"
    try:
        cpu, dev = steps(cpu_run), steps(dev_run)
    except FileNotFoundError as e:
        print(json.dumps({"optimizer": optimizer, "missing": str(e)}), flush=True)
        continue
    try:
        record = compare(optimizer, cpu_run, dev_run, cpu, dev, uncompressed, loss_tol)
    except Exception as e:  # one run cut short must not cost the others' records
        record = {"optimizer": optimizer, "ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(record), flush=True)

# cuda -> cuda resume from step 3: bit-identical steps 4-6 and weights.
try:
    after = lambda log: [s for s in log if s[0] > 3]
    written, resumed = "adam-cuda", "adam-cuda-resumed"
    record = {
        "case": "adam on cuda resumed from step 3",
        "losses_equal": after(steps(resumed)) == after(steps(written)),
        "weights_identical": all(same(model(resumed, STEPS, r), model(written, STEPS, r)) for r in (0, 1)),
        "losses_written": [s[1] for s in after(steps(written))],
        "losses_resumed": [s[1] for s in after(steps(resumed))],
    }
    record["ok"] = record["losses_equal"] and record["weights_identical"]
    print(json.dumps(record), flush=True)
except Exception as e:
    print(json.dumps({"case": "resume", "ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
