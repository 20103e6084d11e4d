#!/usr/bin/env bash
# Prepared for the next lent GPU machine (no Rust, no network), issue 50: the
# one call a session's 15 minutes of device time fit (a machine's start takes
# one or two of them; BUDGET_S 540 under the tool's 600 s limit). Is the
# BERT-base step faster on CUDA with terse's named reduction routine (stop 68),
# which cubek matmul routine should the linear layers name, and are the
# answers still right there? In order of importance, each section bounded and
# skipped past the budget:
#   1. the bundle's run.sh at batch 32: terse fp32 and bf16 beside PyTorch
#      fp32/tf32/bf16/fp16, like for like; then the NCCL checks (a world of
#      one: NCCL from host and GPU buffers, the step's own exchanges);
#   2. every matmul routine on each of the step's products beside torch.mm,
#      and the fastest complete one on the whole step against the default
#      (results/gpu-cuda-matmul/device_run.sh, as a section);
#   3. the device-parity runs on cuda against the CPU: adam with burn's
#      matmul, then adam and its resume with that routine (train.matmul);
#   4. cubecl's per-kernel profile of a batch-32 step with the routine;
#   5. the step's phases with --sync-phases (the round trip and AdamW
#      against their memory floor);
#   6. the other optimizers' parity.
# Run from the repository root with `.gpu/terse-gpu-bundle.tar.xz` carried
# (`cargo xtask bundle` at the commit measured). DEVICE and PRESET (cuda,
# base) change what runs, for a dry run here:
#   DEVICE=lavapipe PRESET=tiny OUT=/tmp/dry BUDGET_S=1500 \
#     bash results/gpu-cuda-reductions/device_run.sh
# The device tool brings back at most 8 files: $OUT gets log.txt and the
# small summaries as they are made, and everything in results.tar.xz at the
# end.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
work=/tmp/results
rm -rf "$work" /tmp/parity /tmp/parity-routine /tmp/profile && mkdir -p "$out" "$work"
exec > >(tee -a "$out/log.txt") 2>&1
tee_pid=$!
exec 3>&1
start=$(date +%s)
budget=${BUDGET_S:-540}
source "$repo/results/gpu-run-helpers.sh"

cd /tmp
rm -rf /tmp/terse-gpu-bundle
tar xJf "$repo/.gpu/terse-gpu-bundle.tar.xz" || {
    echo "no bundle at $repo/.gpu/terse-gpu-bundle.tar.xz (cargo xtask bundle, then copy it there)"
    exit 1
}
B=/tmp/terse-gpu-bundle
dev=${DEVICE:-cuda} preset=${PRESET:-base}
# The parity runs pre-train BERT-Tiny: its data comes in the bundle (the
# machine has no network).
export XDG_RUNTIME_DIR=/tmp TERSE_CACHE=${TERSE_CACHE:-$B/cache}
finish() {
    section "archive"
    tar cJf "$out/results.tar.xz" -C /tmp results
    # Everything printed reaches log.txt before the call returns.
    exec 1>&- 2>&- 3>&-
    wait "$tee_pid"
}

# 1. terse beside PyTorch (run.sh finds NVRTC, NCCL and CUDA's headers in
#    PyTorch's wheels when the machine has no toolkit).
# Each row within 75 s (KILL 5 s after): a hung terse bf16 row costs at most
# 80 s of the section's 180, not all that is left of it; run.sh runs terse's
# fp32 row and PyTorch's fp32 and tf32 first, the pair the call is for.
bench=(--device "$dev" --presets "$preset" --batches "${BENCH_BATCHES:-32}"
    --row-limit "${ROW_LIMIT_S:-75}" --out "$work/bench")
run 180 "run.sh ${bench[*]}" bash "$B/run.sh" "${bench[@]}"
cat "$work"/bench/terse.jsonl "$work"/bench/pytorch.jsonl > "$out/bench.jsonl" 2> /dev/null
# The machine (driver, torch, library paths) in the log, not only the archive.
cat "$work/bench/machine.txt" 2> /dev/null

# run.sh's library paths, for the sections below.
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source "$B/cuda_env.sh"

# 1b. NCCL, never run before: every collective in a world of one (from host
#     and GPU buffers) against the host path, then the training step's own
#     exchanges on cubecl's CUDA buffers against local's bits. Started
#     without mpirun, NCCL is bootstrapped without MPI. Each bounded: an
#     NCCL start that hangs costs 45 s, not the call.
if [[ $dev == cuda* ]]; then
    run 45 "nccl check" "$B/bin/terse-comm-check" --nccl > "$work/nccl-check.txt" 2>&1
    run 45 "gpu exchange check" "$B/bin/terse-gpu-exchange-check" --device "$dev" \
        >> "$work/nccl-check.txt" 2>&1
    cat "$work/nccl-check.txt"
    cp "$work/nccl-check.txt" "$out/"
fi

# 2. The matmul routines, each product and the whole step.
# The matmul section: PyTorch's products (seconds), the sweep, and one
# round of the whole step with the fastest routine against the default
# (2 x 50 s kept by the section for it); the rest of the call keeps 200 s
# for the answers (adam's parity), the profile and the phases.
mm_budget=$(($(left) - 200))
((mm_budget > 200)) && mm_budget=200
if ((mm_budget >= 140)); then
    section "matmul routines (budget ${mm_budget}s)"
    (cd "$repo" && BUNDLE_READY=1 BUDGET_S=$mm_budget ROUNDS=1 STEP_S=50 OUT="$work/matmul" \
        bash results/gpu-cuda-matmul/device_run.sh > /dev/null 2>&1)
    cat "$work/matmul/log.txt"
    cp "$work/matmul/summary.txt" "$out/matmul-summary.txt" 2> /dev/null
else
    echo "SKIPPED (budget): matmul routines" >&3
fi
best=$(cat "$work/matmul/best-routine.txt" 2> /dev/null)
matmul=(${best:+--set "train.matmul=\"$best\""})

# 3. Parity with the CPU: the device-parity test's runs (BERT-Tiny, 6 steps,
#    2 local ranks, a checkpoint at step 3 resumed; the device runs are
#    named `-cuda`, what parity.py reads, whatever DEVICE is). With burn's
#    matmul in /tmp/parity, with the routine in /tmp/parity-routine.
par() { # par ROOT OPTIMIZER DEVICE DIR [extra]
    local root=$1 optimizer=$2 device=$3 dir=$4
    shift 4
    local extra=()
    [[ $optimizer == onebit* ]] && extra+=(--set optimizer.freeze_step=3)
    [[ $optimizer == *adam ]] && extra+=(--set schedule.peak=1e-4)
    mkdir -p "$root"
    run 60 "parity $optimizer $device $dir ${*}" "$B/bin/terse" pretrain --no-progress \
        --config "$repo/configs/pretrain-bert-tiny.toml" --device "$device" --local-ranks 2 \
        --optimizer "$optimizer" --set train.steps=6 --set train.global_batch=4 --set train.micro_batch=2 \
        --set train.eval_every=0 --set train.checkpoint_every=3 --set task.max_seq=32 \
        --run-dir "$root/$dir" "${extra[@]}" "$@" > "$root/$dir.out" 2>&1
    local rc=$?
    tail -n 2 "$root/$dir.out"
    return $rc
}
parity() { # parity ROOT NAME
    python3 "$repo/results/gpu-cuda/parity.py" "$1" > "$work/$2.jsonl" 2>&1
    cat "$work/$2.jsonl"
    cp "$work/$2.jsonl" "$out/"
}
par /tmp/parity adam cpu adam-cpu
par /tmp/parity adam "$dev" adam-cuda
if [[ -n $best ]]; then
    mkdir -p /tmp/parity-routine
    cp -r /tmp/parity/adam-cpu /tmp/parity-routine/
    par /tmp/parity-routine adam "$dev" adam-cuda "${matmul[@]}"
    par /tmp/parity-routine adam "$dev" adam-cuda-resumed "${matmul[@]}" \
        --resume /tmp/parity-routine/adam-cuda/checkpoints/step-00000003
    parity /tmp/parity-routine parity-routine
else
    par /tmp/parity adam "$dev" adam-cuda-resumed --resume /tmp/parity/adam-cuda/checkpoints/step-00000003
fi
parity /tmp/parity parity

# 4. Where a batch-32 step's GPU time goes now: cubecl's per-kernel profile,
#    with the routine if one was found.
mkdir -p /tmp/profile && cd /tmp/profile
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/profile/cubecl-profile.log"\n' > cubecl.toml
run 80 "profile b32 ${best:-default matmul}" "$B/bin/model_step" --presets "$preset" --batch 32 \
    --seq 128 --device "$dev" --warmup 2 --steps 2 ${best:+--matmul "$best"} \
    >> "$work/terse-profiled.jsonl" 2> "$work/terse-profiled.stderr" ||
    tail -n 3 "$work/terse-profiled.stderr"
cat "$work/terse-profiled.jsonl" 2> /dev/null
cd /tmp
[[ -f /tmp/profile/cubecl-profile.log ]] &&
    xz -T0 -6 -c /tmp/profile/cubecl-profile.log > "$work/cubecl-profile.log.xz"

# 5. The step's phases each charged their own device time (--sync-phases:
#    the device waited for after backward, the gradients' copy into the
#    flat buffer, AdamW and the write-back): what the round trip and the
#    optimizer cost against their memory floor.
run 50 "phases b32" "$B/bin/model_step" --presets "$preset" --batch 32 --seq 128 \
    --device "$dev" --warmup 2 --steps 5 --sync-phases ${best:+--matmul "$best"} \
    >> "$work/terse-phases.jsonl" 2> "$work/terse-phases.stderr" ||
    tail -n 3 "$work/terse-phases.stderr"
cat "$work/terse-phases.jsonl" 2> /dev/null

# 6. The other optimizers' parity, with burn's matmul, while time is left.
for o in lamb onebit_adam onebit_lamb slamb; do
    par /tmp/parity "$o" cpu "$o-cpu" && par /tmp/parity "$o" "$dev" "$o-cuda"
done
parity /tmp/parity parity
grep -h "error\|panicked" /tmp/parity*/*.out | head -20
# The runs' logs and metrics, not their checkpoints (GBs to copy past the
# budget, and parity.py has read them).
for dir in parity parity-routine; do
    [[ -d /tmp/$dir ]] && tar -C /tmp --exclude='*.safetensors' -cf - "$dir" | tar -C "$work" -xf -
done
section "done"
finish
