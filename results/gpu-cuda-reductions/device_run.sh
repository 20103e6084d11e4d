#!/usr/bin/env bash
# Prepared for the next lent GPU machine (no Rust, no network), issue 50:
# does terse's named reduction routine (stop 68: the linear layers, LayerNorm
# and the cross-entropy as terse's own autodiff steps on cubecl devices,
# crates/fused/src/reduce_routine.rs) make the BERT-base step faster on
# CUDA, and is it still right there? In order of importance, each section
# bounded and skipped past the budget:
#   1. the bundle's run.sh: NCCL check (a world of one), terse fp32 and bf16
#      beside PyTorch fp32/tf32/bf16/fp16 at batch 32 and 8, like for like;
#   2. the device-parity runs on cuda against the CPU (adam, its resume);
#      2b. the step's phases with --sync-phases (the round trip and AdamW
#      against their memory floor);
#   3. cubecl's per-kernel profile of a batch-32 step (the reductions'
#      share, 41% in results/gpu-cuda-profile before this change);
#   4. the other optimizers' parity.
# Run from the repository root with `.gpu/terse-gpu-bundle.tar.xz` carried
# (`cargo xtask bundle` at the commit measured). DEVICE and PRESET
# (cuda, base) change what runs, for a dry run here:
#   DEVICE=lavapipe PRESET=tiny OUT=/tmp/dry \
#     bash results/gpu-cuda-reductions/device_run.sh
# Everything goes to $OUT as it is measured.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
exec 3>&1
start=$(date +%s)
budget=${BUDGET_S:-560}
source "$repo/results/gpu-run-helpers.sh"

cd /tmp
tar xJf "$repo/.gpu/terse-gpu-bundle.tar.xz"
B=/tmp/terse-gpu-bundle
dev=${DEVICE:-cuda} preset=${PRESET:-base}
export XDG_RUNTIME_DIR=/tmp

# 1. terse beside PyTorch (run.sh finds NVRTC, NCCL and CUDA's headers in
#    PyTorch's wheels when the machine has no toolkit).
bench=(--device "$dev" --presets "$preset" --batches "32 8" --out "$out/bench")
[[ $dev == cuda* ]] && bench+=(--nccl-check)
run 330 "run.sh ${bench[*]}" bash "$B/run.sh" "${bench[@]}"

# run.sh's library paths, for the sections below.
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cuda_from_pytorch_wheels

# 2. Parity with the CPU: the device-parity test's runs (BERT-Tiny, 6 steps,
#    2 local ranks, a checkpoint at step 3 resumed; the device runs are
#    named `-cuda`, what parity.py reads, whatever DEVICE is).
par() { # par OPTIMIZER DEVICE DIR [extra]
    local optimizer=$1 device=$2 dir=$3
    shift 3
    local extra=()
    [[ $optimizer == onebit* ]] && extra+=(--set optimizer.freeze_step=3)
    [[ $optimizer == *adam ]] && extra+=(--set schedule.peak=1e-4)
    run 100 "parity $optimizer $device $dir" "$B/bin/terse" pretrain --no-progress \
        --config "$repo/configs/pretrain-bert-tiny.toml" --device "$device" --local-ranks 2 \
        --optimizer "$optimizer" --set train.steps=6 --set train.global_batch=4 --set train.micro_batch=2 \
        --set train.eval_every=0 --set train.checkpoint_every=3 --set task.max_seq=32 \
        --run-dir "/tmp/parity/$dir" "${extra[@]}" "$@" > "/tmp/parity/$dir.out" 2>&1
    tail -n 2 "/tmp/parity/$dir.out"
}
mkdir -p /tmp/parity
par adam cpu adam-cpu
par adam "$dev" adam-cuda
par adam "$dev" adam-cuda-resumed --resume /tmp/parity/adam-cuda/checkpoints/step-00000003
python3 "$repo/results/gpu-cuda/parity.py" /tmp/parity > "$out/parity.jsonl" 2>&1
cat "$out/parity.jsonl"

# 2b. The step's phases each charged their own device time (--sync-phases:
#     the device waited for after backward, the gradients' copy into the
#     flat buffer, AdamW and the write-back): what the round trip and the
#     optimizer cost against their memory floor.
run 60 "phases b32" "$B/bin/model_step" --presets "$preset" --batch 32 --seq 128 \
    --device "$dev" --warmup 2 --steps 5 --sync-phases >> "$out/terse-phases.jsonl" 2> /dev/null
cat "$out/terse-phases.jsonl" 2> /dev/null

# 3. Where a batch-32 step's GPU time goes now: cubecl's per-kernel profile.
mkdir -p /tmp/profile && cd /tmp/profile
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/profile/cubecl-profile.log"\n' > cubecl.toml
run 90 "profile b32" "$B/bin/model_step" --presets "$preset" --batch 32 --seq 128 \
    --device "$dev" --warmup 2 --steps 2 >> "$out/terse-profiled.jsonl" 2> /dev/null
cd /tmp
[[ -f /tmp/profile/cubecl-profile.log ]] &&
    xz -T0 -6 -c /tmp/profile/cubecl-profile.log > "$out/cubecl-profile.log.xz"

# 4. The other optimizers' parity.
for o in lamb onebit_adam onebit_lamb slamb; do
    par "$o" cpu "$o-cpu" && par "$o" "$dev" "$o-cuda"
done
python3 "$repo/results/gpu-cuda/parity.py" /tmp/parity > "$out/parity.jsonl" 2>&1
cat "$out/parity.jsonl"
grep -h "error\|panicked" /tmp/parity/*.out | head -20
section "done"
