#!/usr/bin/env bash
# terse's GPU benchmark bundle (written by `cargo xtask bundle`): a BERT
# pre-training step (MLM + NSP, dropout 0.1, AdamW, seq 128) timed in terse
# and in PyTorch on the same GPU, in one call, writing as it goes.
set -uo pipefail

usage() {
    cat <<'EOF'
usage: run.sh [--device cuda|cuda:N|wgpu|lavapipe] [--presets base] [--batches "32 8"]
              [--precisions "fp32 bf16"] [--python PYTHON] [--out DIR] [--quick]
              [--repeats N] [--row-limit S] [--budget S] [--details DIR]
              [--kernel-times] [--nccl-check]

Times terse's training step (bin/model_step) on the device for each batch
size and precision, and PyTorch's (benches/pytorch_bert_step.py, if PYTHON
has torch and transformers) on CUDA in fp32 (TF32 off), tf32, bf16 autocast
(when terse runs fp16), and prints terse beside each. Each of terse's rows
is followed by the PyTorch rows it is compared with (fp32: fp32 and tf32;
bf16: bf16; ...), the rest of PyTorch's after, the largest batch first, so
that a run cut short keeps whole pairs of the numbers that matter most.
PyTorch runs its MLM head at the masked positions only, as terse does (see
benches/pytorch_bert_step.py --mlm-positions). Every number goes to DIR as
it is measured, in at most 7 files (a lent GPU's call returns 8):
  log.txt              everything this script printed
  terse.jsonl          one line per (preset, batch, precision, repeat):
                       samples/s, the forward/backward/optimizer split,
                       kernel dispatches per step by kind
  pytorch.jsonl        one line per (preset, batch, precision, repeat)
  summary.txt          terse beside PyTorch, the median of the repeats
  machine.txt          nvidia-smi, the bundle's binaries, torch's and
                       transformers' versions (or why they do not import)
  matmul-precision.json  an f32 matmul on the device against float64: TF32
                       (relative error ~1e-4..1e-3) or full f32 (~1e-6)
  details.tar.xz       the rest, archived again after every row: each row's
                       stderr (terse-kernels-*.txt: dispatches per step by
                       kernel), terse-kernel-times.jsonl and
                       terse-kernel-times-*.txt, nccl-check.txt,
                       timed-out.txt, skipped.txt, terse-refused.txt

  --device   where terse runs [cuda]; cuda needs the NVIDIA driver, NVRTC
             (libnvrtc.so.12/.13 on LD_LIBRARY_PATH, e.g. pip's
             nvidia-cuda-nvrtc-cu12) and CUDA's headers ($CUDA_PATH/include,
             default /usr/local/cuda: cuda_fp16.h, cuda_bf16.h, mma.h,
             crt/mma.h; cuda_env.sh takes them from PyTorch's wheels where
             the toolkit lacks them); terse names whichever is missing
  --presets  BERT presets, comma-separated [base]
  --batches  batch sizes, in the order they run [32 8]
  --precisions  what terse computes in (train.precision's names: fp32, tf32,
             bf16, fp16) [on cuda "fp32 bf16", else fp32]; a precision the
             device lacks is refused by terse in one line, recorded in
             terse-refused.txt, and the rest still run. On CUDA sm_80+
             terse's fp32 matmuls are TF32 (cubecl stages f32 as TF32), so
             its fp32 row is compared with PyTorch's tf32 column
  --python   a Python with torch and transformers [python3]
  --out      where the numbers go [$OUT, else ./out]
  --details  where the per-row files go before they are archived into
             OUT/details.tar.xz [a temporary directory]
  --quick    BERT-Tiny, batch 8, 1 warmup + 2 timed steps (a smoke run)
  --repeats  every row (terse's and PyTorch's) N times, in turns: the
             summary takes each one's median [1; 3 for the three runs a
             claim needs, e.g. --batches 32 --repeats 3]
  --row-limit  seconds each row (one framework, batch and precision) may
             take, kernel compilation and model set-up included; a row
             past it is stopped, named in timed-out.txt, and the rest still
             run [no limit]
  --budget   seconds the whole run may take: a row (kernel-times and NCCL
             checks too) is started only while what is left holds its
             --row-limit (or, without one, while any is left); the rows
             skipped are named in skipped.txt [no limit]
  --kernel-times  after every row, terse's steps once more per batch and
             precision with each kernel timed on the device (model_step
             --kernel-times, 1 warmup + 2 steps): kernel milliseconds per
             step by kind in terse-kernel-times.jsonl, the costliest
             kernels in terse-kernel-times-b<batch>-<precision>.txt. Apart
             from the timed rows (timing adds three round trips to
             cubecl's server per launch), and after PyTorch's, so a run cut short keeps the
             comparison. While the GPU waits for the host a kernel's
             window also holds its launch: an upper bound then
  --nccl-check  last, `bin/terse-comm-check --nccl` on the GPU of this
             process (a world of one: every collective through NCCL, from
             host and from GPU buffers, against the host path bit for bit),
             then on cuda `bin/terse-gpu-exchange-check` (the training
             step's exchanges by device address on cubecl's buffers: the
             fp32 mean, the compressed allreduce made to compress alone,
             against local's bits), to nccl-check.txt, each within 90 s;
             NCCL as libnccl.so on LD_LIBRARY_PATH, or PyTorch's
             nvidia-nccl wheel (linked as libnccl.so here); no MPI needed
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
device=cuda presets=base batches="32 8" precisions="" python=python3 out=${OUT:-./out} quick=0
nccl_check=0 row_limit="" kernel_times=0 repeats=1 budget="" details=""
while [[ $# -gt 0 ]]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --quick) quick=1; presets=tiny; batches=8; shift; continue ;;
        --nccl-check) nccl_check=1; shift; continue ;;
        --kernel-times) kernel_times=1; shift; continue ;;
    esac
    if [[ $# -lt 2 ]]; then
        echo "run.sh: $1 takes a value (see --help)" >&2
        exit 2
    fi
    case $1 in
        --device) device=$2 ;;
        --presets) presets=$2 ;;
        --batches) batches=$2 ;;
        --precisions) precisions=$2 ;;
        --python) python=$2 ;;
        --out) out=$2 ;;
        --details) details=$2 ;;
        --repeats) repeats=$2 ;;
        --row-limit) row_limit=$2 ;;
        --budget) budget=$2 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift 2
done
for whole in "--row-limit:$row_limit" "--budget:$budget" "--repeats:$repeats"; do
    if [[ -n ${whole#*:} && ! ${whole#*:} =~ ^[1-9][0-9]*$ ]]; then
        echo "run.sh: ${whole%%:*} takes a whole number (seconds for the limits), not '${whole#*:}'" >&2
        exit 2
    fi
done
if [[ -z $precisions ]]; then
    if [[ $device == cuda* ]]; then precisions="fp32 bf16"; else precisions=fp32; fi
fi
steps=(--warmup 2 --steps 5)
[[ $quick == 1 ]] && steps=(--warmup 1 --steps 2)
mkdir -p "$out"
# Everything printed goes to log.txt too: a call's output tail keeps only
# its end, and the summary and each row's line are in the middle.
exec > >(tee -a "$out/log.txt") 2>&1
tee_pid=$!
# Milliseconds since the script started (EPOCHREALTIME: $SECONDS ticks in
# whole seconds of the clock, not of the run).
now_ms() {
    local t=${EPOCHREALTIME/[.,]/}
    echo $((t / 1000 - started_ms))
}
started_ms=0
started_ms=$(now_ms)
own_details=0
if [[ -z $details ]]; then
    details=$(mktemp -d "${TMPDIR:-/tmp}/terse-run-details.XXXXXX")
    own_details=1
fi
mkdir -p "$details"
# pack: the per-row files, archived into OUT after every row (a run cut
# short keeps what its rows wrote), so that OUT holds 7 files at most.
pack() {
    tar -C "$details" -cJf "$out/details.tar.xz.part" . 2> /dev/null &&
        mv "$out/details.tar.xz.part" "$out/details.tar.xz"
}
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

# Without a CUDA toolkit, NVRTC, cuBLAS, NCCL and CUDA's headers may still
# come with PyTorch's pip wheels: cuda_env.sh puts what it finds on the paths.
if [[ $device == cuda* || $nccl_check == 1 ]]; then
    PYTHON=$python source "$here/cuda_env.sh"
fi

{
    date -u
    nvidia-smi 2>&1 | head -20 || true
    ls -l "$here/bin"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "CUDA_PATH=${CUDA_PATH:-}"
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
    "$python" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 || true
} > "$out/machine.txt"

failed=0
# What precision the device's f32 matmuls have (TF32 tensor cores on CUDA
# sm_80+, full f32 elsewhere): the column to compare terse with. Bounded:
# the first work on the device, where a driver or NVRTC that hangs shows.
timeout --foreground -k 5 60 "$here/bin/model_step" --matmul-precision --presets '' --device "$device" \
    2> "$details/matmul-precision.err" | tee "$out/matmul-precision.json"
# started NAME: whether the row NAME may start within --budget; if not, it
# is named in skipped.txt.
started() {
    [[ -z $budget ]] && return 0
    local left_ms=$((budget * 1000 - $(now_ms)))
    if ((left_ms > 0)) && [[ -z $row_limit || $left_ms -ge $((row_limit * 1000)) ]]; then
        return 0
    fi
    echo "$1: skipped, $((left_ms / 1000)) s of the --budget left" | tee -a "$details/skipped.txt" >&2
    return 1
}
# row NAME COMMAND...: one row, within --row-limit when one is given (KILL
# 5 s after TERM); a row past it is named in timed-out.txt. --foreground
# keeps the row in run.sh's process group: a caller's own timeout (the GPU
# call's 180 s) or Ctrl-C then stops the row with run.sh, where timeout's
# own group would leave it running on the GPU beside whatever comes next.
row() {
    local name=$1 status
    shift
    if [[ -z $row_limit ]]; then
        "$@"
        status=$?
    else
        timeout --foreground -k 5 "$row_limit" "$@"
        status=$?
        if [[ $status == 124 || $status == 137 ]]; then
            echo "$name: stopped after $row_limit s (--row-limit)" | tee -a "$details/timed-out.txt" >&2
        fi
    fi
    pack
    return $status
}

terse_row() {
    local batch=$1 precision=$2
    started "terse batch $batch $precision" || return
    echo "== terse on $device, batch $batch, $precision"
    local kernels="$details/terse-kernels-b$batch-$precision-r$repeat.txt"
    if ! row "terse batch $batch $precision" env TERSE_BENCH_KERNELS=1 "$here/bin/model_step" \
        --presets "$presets" --batch "$batch" --seq 128 --device "$device" \
        --precision "$precision" "${steps[@]}" >> "$out/terse.jsonl" 2> "$kernels"; then
        # A precision the device lacks is refused in one line before any
        # work: recorded, not a failure of the run.
        if grep -q "cannot run on device" "$kernels"; then
            grep "cannot run on device" "$kernels" | tee -a "$details/terse-refused.txt" >&2
            refused+="$precision "
            return
        fi
        echo "terse failed on $device (batch $batch, $precision):" >&2
        grep -v "per step" "$kernels" | tail -5 >&2
        failed=1
        return
    fi
    tail -n 1 "$out/terse.jsonl"
    [[ $repeat == 1 ]] && ran+=("$batch $precision")
}

# kernel_times_row BATCH PRECISION: terse's steps with every kernel timed
# on the device, apart from the timed rows.
kernel_times_row() {
    local batch=$1 precision=$2
    started "terse kernel times batch $batch $precision" || return
    echo "== terse kernel times on $device, batch $batch, $precision"
    local kernels="$details/terse-kernel-times-b$batch-$precision.txt"
    if ! row "terse kernel times batch $batch $precision" "$here/bin/model_step" \
        --presets "$presets" --batch "$batch" --seq 128 --device "$device" \
        --precision "$precision" --warmup 1 --steps 2 --kernel-times \
        >> "$details/terse-kernel-times.jsonl" 2> "$kernels"; then
        echo "terse's kernel times failed on $device (batch $batch, $precision):" >&2
        tail -5 "$kernels" >&2
        failed=1
        return
    fi
    tail -n 1 "$details/terse-kernel-times.jsonl"
    grep " ms per step " "$kernels" | cut -c 1-150
}

torch_row() {
    local batch=$1 precision=$2
    started "PyTorch batch $batch $precision" || return
    echo "== PyTorch on cuda, batch $batch, $precision"
    if ! row "PyTorch batch $batch $precision" "$python" "$here/benches/pytorch_bert_step.py" \
        --presets "$presets" --batch "$batch" --seq 128 --device cuda \
        --precision "$precision" "${steps[@]}" | tee -a "$out/pytorch.jsonl"; then
        echo "PyTorch failed on cuda (batch $batch, $precision)" >&2
        failed=1
    fi
}

# torch_once BATCH PRECISION: PyTorch's row, unless this batch had it
# (torch_done, reset per batch).
torch_once() {
    [[ $torch_done == *" $2 "* ]] && return
    torch_done+="$2 "
    torch_row "$1" "$2"
}

with_torch=0
if [[ $device == cuda* ]] && "$python" -c 'import torch, transformers' 2>> "$out/machine.txt"; then
    with_torch=1
else
    echo "(no PyTorch comparison: --device is not cuda, or $python lacks torch/transformers:" \
        "machine.txt says why)"
fi
# The PyTorch rows each of terse's is compared with: terse's fp32 matmuls
# are TF32 on CUDA sm_80+, so its fp32 row meets both fp32 and tf32.
compared_with() {
    case $1 in
        fp32) echo "fp32 tf32" ;;
        *) echo "$1" ;;
    esac
}
# PyTorch's columns: fp32, tf32 and bf16 always, fp16 beside terse's fp16.
theirs_all="fp32 tf32 bf16"
[[ " $precisions " == *" fp16 "* ]] && theirs_all+=" fp16"
ran=() refused=" "
for repeat in $(seq "$repeats"); do
    for batch in $batches; do
        torch_done=" "
        for precision in $precisions; do
            # A precision terse refused once is refused every time.
            [[ $refused == *" $precision "* ]] || terse_row "$batch" "$precision"
            [[ $with_torch == 1 ]] || continue
            for theirs in $(compared_with "$precision"); do
                torch_once "$batch" "$theirs"
            done
        done
        [[ $with_torch == 1 ]] || continue
        for theirs in $theirs_all; do
            torch_once "$batch" "$theirs"
        done
    done
done

# The summary needs Python's standard library alone: any python3 will do.
"$(command -v python3 || echo "$python")" - "$out" "$device" <<'PY' 2>&1 | tee "$out/summary.txt"
import json, pathlib, statistics, sys
out, device = pathlib.Path(sys.argv[1]), sys.argv[2]
def lines(name):
    path = out / name
    return [json.loads(l) for l in path.read_text().splitlines() if l.startswith("{")] if path.exists() else []
terse, torch = lines("terse.jsonl"), lines("pytorch.jsonl")
# Each (preset, batch, precision)'s repeats, and their median samples/s.
def runs(rows):
    keyed = {}
    for r in rows:
        keyed.setdefault((r["preset"], r["batch"], r.get("precision", "fp32")), []).append(r)
    return keyed
terse_runs, torch_runs = runs(terse), runs(torch)
median = lambda rows: statistics.median(r["samples_per_s"] for r in rows)
# Like for like: terse's fp32 matmuls are TF32 on CUDA (sm_80+), so its fp32
# row meets PyTorch's tf32; each half type meets PyTorch's autocast in it.
like = {"fp32": "tf32" if device.startswith("cuda") else "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}
print("samples/s, the median of each row's runs (n); terse/torch like for like is the comparison"
      " (terse's fp32 matmuls are TF32 on CUDA sm_80+)")
print("preset  batch  precision  terse samples/s (n)  like-for-like torch  samples/s (n)  terse/torch"
      "  terse/torch fp32  MB in use at step end: terse / torch (torch's peak)")
for (preset, batch, p), mine in terse_runs.items():
    row = f"{preset:<7} {batch:>5}  {p:<9} {median(mine):>15.1f} ({len(mine)})"
    same, fp32 = torch_runs.get((preset, batch, like[p])), torch_runs.get((preset, batch, "fp32"))
    if same:
        row += f"  {like[p]:>19}  {median(same):>9.1f} ({len(same)})  {median(mine) / median(same):>10.2f}x"
    if fp32:
        row += f"  {median(mine) / median(fp32):>15.2f}x"
    memory, theirs = mine[-1].get("device_memory_mb"), (same or [{}])[-1].get("device_memory_mb")
    if memory and theirs:
        row += f"  {memory['in_use']:.0f} / {theirs['in_use']:.0f} ({theirs['peak_in_use']:.0f})"
    print(row)
PY
if [[ $kernel_times == 1 ]]; then
    [[ ${#ran[@]} == 0 ]] && echo "(--kernel-times: no row of terse's ran, nothing to time)" >&2
    for pair in ${ran[@]+"${ran[@]}"}; do
        kernel_times_row $pair
    done
fi
if [[ $nccl_check == 1 ]]; then
    # A world of one without mpirun (bootstrapped without MPI, which on a
    # bare machine would lack OpenMPI's plugins): NCCL on this process's
    # GPU, checked against the in-process local backend. Last, and each
    # bounded (KILL 5 s after TERM), so that an NCCL start that hangs costs
    # the benchmark nothing.
    checked="$details/nccl-check.txt"
    if started "terse-comm-check --nccl"; then
        echo "== terse-comm-check --nccl"
        if ! timeout -k 5 90 "$here/bin/terse-comm-check" --nccl > "$checked" 2>&1; then
            failed=1
        fi
        cat "$checked"
    fi
    if [[ $device == cuda* ]] && started "terse-gpu-exchange-check"; then
        echo "== terse-gpu-exchange-check --device $device" | tee -a "$checked"
        if ! timeout -k 5 90 "$here/bin/terse-gpu-exchange-check" --device "$device" \
            >> "$checked" 2>&1; then
            failed=1
        fi
        sed -n '/^== terse-gpu-exchange-check/,$p' "$checked" | tail -n +2
    fi
    pack
fi
pack
[[ $own_details == 1 ]] && rm -rf "$details"
# log.txt whole before run.sh returns: its tee ends once nothing writes.
exec >&- 2>&-
wait "$tee_pid"
exit $failed
