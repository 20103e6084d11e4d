#!/usr/bin/env bash
# Prepared for a lent GPU machine (no Rust, no network), issue 50: which of
# cubek's matmul routines should terse name for its linear layers on CUDA?
# burn's default without autotune (cubek's Auto: SimpleCyclicCmma) ran
# BERT-base's matmuls 3.8x slower than PyTorch's TF32 matmuls on an H100
# (results/gpu-cuda-profile/); autotune stays off (a run's bits must not
# depend on a timing race), so the routine is named from measurements:
#   (since stop 79 the candidates include NVIDIA's cuBLAS, queued on
#   cubecl's stream: `cublas`, f32 arithmetic as PyTorch's default, and
#   `cublas_tf32`, as PyTorch's allow_tf32)
#   1. every routine on each of the step's matmul products (bin/
#      matmul_routines, checked against float64 at 64 entries), and
#      PyTorch's torch.mm on the same products in fp32, tf32 and bf16;
#   2. the fastest complete routine on the whole BERT-base batch-32 step
#      (model_step --matmul NAME) against the default, alternating, twice
#      each (ROUNDS), beside which run.sh's PyTorch step numbers are the
#      reference; the sweep leaves these runs their time (STEP_S each).
# Runs as section 2 of results/gpu-cuda-reductions/device_run.sh (the one
# call a session's 15 minutes of device time fit), or alone. The fastest
# complete routine's name goes to $OUT/best-routine.txt. Run from the repository root with
# `.gpu/terse-gpu-bundle.tar.xz` carried (`cargo xtask bundle` at the commit
# measured). DEVICE, PRESET, BATCH, ROWS and friends change what runs, for
# a dry run here:
#   DEVICE=lavapipe PRESET=tiny BATCH=2 ROWS=256 HIDDEN=128 INTERMEDIATE=512 \
#     VOCAB=2000 OUT=/tmp/dry bash results/gpu-cuda-matmul/device_run.sh
# Everything goes to $OUT as it is measured.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
tee_pid=$!
exec 3>&1
start=$(date +%s)
budget=${BUDGET_S:-420}
source "$repo/results/gpu-run-helpers.sh"

B=/tmp/terse-gpu-bundle
# Called as a section of results/gpu-cuda-reductions/device_run.sh, the
# bundle is already there (BUNDLE_READY=1).
if [[ ${BUNDLE_READY:-0} != 1 ]]; then
    rm -rf "$B" && (cd /tmp && tar xJf "$repo/.gpu/terse-gpu-bundle.tar.xz") || exit 1
fi
dev=${DEVICE:-cuda} preset=${PRESET:-base} batch=${BATCH:-32}
shape=(--rows "${ROWS:-4096}" --sequences "$batch" --hidden "${HIDDEN:-768}"
    --intermediate "${INTERMEDIATE:-3072}" --vocab "${VOCAB:-30522}")
export XDG_RUNTIME_DIR=/tmp
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source "$B/cuda_env.sh"

# 1. Each product, each routine; PyTorch on the same products.
"$B/bin/matmul_routines" --shapes "${shape[@]}" > "$out/shapes.jsonl"
# PyTorch first (seconds): the sweep may use all of its limit.
if [[ $dev == cuda* ]]; then
    run 60 "pytorch matmuls" python3 "$B/benches/pytorch_matmul_shapes.py" "$out/shapes.jsonl" \
        > "$out/pytorch-matmuls.jsonl"
fi
# One routine at a time, most likely winners first: compiling a routine's
# kernels (NVRTC) takes seconds per product, so a sweep cut off by the
# budget loses only the last routines, each of which either ran every
# product or is left out, instead of every routine reaching the first
# products only (what one sweep over all of them, product by product,
# would leave).
# The whole-step runs of part 2 keep their time (ROUNDS x 2 runs of STEP_S):
# the sweep alone used to fill the budget (a routine at most 60 s, twelve
# of them), which left part 2 skipped, and part 2 is what picks a routine.
routines=${ROUTINES:-cublas_tf32,cublas,auto,ordered_double_mma,simple_tma_mma,specialized_tma_mma,double_tma_mma,simple_cyclic_cmma,ordered_double_cmma,simple_cyclic_mma,double_cyclic_mma,specialized_cyclic_mma}
rounds=${ROUNDS:-2} step_s=${STEP_S:-50}
kept=$((rounds * 2 * step_s))
: > "$out/matmul-routines.jsonl"
for routine in ${routines//,/ }; do
    room=$(($(left) - kept))
    if ((room < 15)); then
        echo "SKIPPED (budget; ${kept}s kept for the whole-step runs): matmul routine $routine" >&3
        continue
    fi
    ((room > 60)) && room=60
    run "$room" "matmul routine $routine" "$B/bin/matmul_routines" --device "$dev" --routines "$routine" \
        "${shape[@]}" --reps 10 >> "$out/matmul-routines.jsonl" 2>> "$out/matmul-routines.stderr"
done
# Complete means every product of shapes.jsonl, reached or not.
python3 "$repo/results/gpu-cuda-matmul/summarize.py" "$out/matmul-routines.jsonl" \
    "$out/pytorch-matmuls.jsonl" --shapes="$out/shapes.jsonl" | tee "$out/summary.txt"

# 2. The fastest complete routine on the whole step, against the default.
best=$(python3 "$repo/results/gpu-cuda-matmul/summarize.py" "$out/matmul-routines.jsonl" \
    --shapes="$out/shapes.jsonl" --best)
echo "fastest complete routine: ${best:-none}"
echo "${best}" > "$out/best-routine.txt"
if [[ -n $best ]]; then
    for round in $(seq 1 "$rounds"); do
        for matmul in "" "$best"; do
            run "$step_s" "step b$batch ${matmul:-default} (round $round)" "$B/bin/model_step" \
                --presets "$preset" --batch "$batch" --seq 128 --device "$dev" --warmup 2 --steps 5 \
                ${matmul:+--matmul "$matmul"} >> "$out/steps.jsonl" 2> "$out/step.stderr" ||
                tail -n 3 "$out/step.stderr"
            tail -n 1 "$out/steps.jsonl"
        done
    done
fi
section "done"
# Everything printed reaches log.txt before the script returns (the
# calling script prints that file next).
exec 1>&- 2>&- 3>&-
wait "$tee_pid"
