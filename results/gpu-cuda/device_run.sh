#!/usr/bin/env bash
# One call on a lent GPU machine (no Rust, no network): terse's BERT step on
# `cuda` beside PyTorch, a per-kernel profile, and the device-parity runs on
# cuda against the CPU. Run from the repository root with `.gpu/` carried:
#   .gpu/terse-gpu-bundle.tar.xz   `cargo xtask bundle` at the commit measured
#   .gpu/autotune.tar.xz           bin/model_step built with burn's autotune
#                                  (the same tree, burn's features + autotune)
#   .gpu/cache.tar.xz              tc/: the BERT-Tiny data (TERSE_CACHE)
# Everything goes to $OUT as it is measured; sections past the time budget
# are skipped (and say so), most important first.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
start=$(date +%s)
budget=${BUDGET_S:-500}
left() { echo $((budget - ($(date +%s) - start))); }
section() {
    echo "== [$(($(date +%s) - start)) s] $*"
}
# run SECONDS NAME COMMAND...: at most SECONDS, and not past the budget.
run() {
    local limit=$1 name=$2
    shift 2
    local l
    l=$(left)
    if ((l < 20)); then
        echo "SKIPPED (budget): $name"
        return 1
    fi
    ((limit > l)) && limit=$l
    section "$name (limit ${limit}s)"
    timeout "$limit" "$@"
    local rc=$?
    ((rc != 0)) && echo "FAILED ($rc): $name"
    return $rc
}

cd /tmp
tar xJf "$repo/.gpu/terse-gpu-bundle.tar.xz"
tar xJf "$repo/.gpu/autotune.tar.xz" -C /tmp/terse-gpu-bundle
tar xJf "$repo/.gpu/cache.tar.xz"
B=/tmp/terse-gpu-bundle
export TERSE_CACHE=/tmp/tc XDG_RUNTIME_DIR=/tmp
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! ldconfig -p | grep -q 'libnvrtc\.so'; then
    nvrtc=$(find /usr/local/cuda*/ /opt/torch "$(python3 -c 'import nvidia,os;print(list(nvidia.__path__)[0])' 2>/dev/null)" \
        -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -n 1)
    [[ -n $nvrtc ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nvrtc")"
fi
[[ -d /usr/local/cuda/include ]] && export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
{
    date -u
    nvidia-smi
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH CUDA_PATH=${CUDA_PATH:-}"
    ls -l "$B/bin"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    nproc
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt" | grep -E "H100|H200|Driver|torch" || true

bench() { # bench NAME BINARY BATCH [extra env]
    local name=$1 bin=$2 batch=$3
    TERSE_BENCH_KERNELS=1 run 170 "terse $name b$batch" "$bin" --presets base --batch "$batch" --seq 128 \
        --device cuda --warmup 2 --steps 5 >> "$out/terse.jsonl" 2>> "$out/terse-stderr.txt"
    tail -n 1 "$out/terse.jsonl"
}
torch() { # torch BATCH PRECISION
    run 90 "pytorch $2 b$1" python3 "$B/benches/pytorch_bert_step.py" --presets base --batch "$1" --seq 128 \
        --device cuda --precision "$2" --warmup 2 --steps 5 | tee -a "$out/pytorch.jsonl"
}

if [[ ${PART:-all} == all ]]; then
# 1. Does terse run on cuda at all (BERT-Tiny, a few steps)?
run 90 "smoke: terse model_step BERT-Tiny on cuda" "$B/bin/model_step" --presets tiny --batch 8 --seq 128 \
    --device cuda --warmup 1 --steps 2 | tee -a "$out/terse.jsonl"

# 2. BERT-base batch 32: terse as built, terse + autotune, PyTorch.
bench built "$B/bin/model_step" 32
bench autotune "$B/bin/model_step_autotune" 32
for p in fp32 tf32 bf16; do torch 32 "$p"; done

# 3. Where a step's time goes: cubecl's per-kernel profile (autotune build).
mkdir -p /tmp/profile && cd /tmp/profile
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/profile/cubecl-profile.log"\n' > cubecl.toml
run 120 "profile autotune b32" "$B/bin/model_step_autotune" --presets base --batch 32 --seq 128 \
    --device cuda --warmup 2 --steps 2 >> "$out/terse.jsonl" 2>> "$out/terse-stderr.txt"
cd /tmp
if [[ -f /tmp/profile/cubecl-profile.log ]]; then
    # The last summary block (the last timed step's sync), and the whole log compressed.
    xz -T0 -6 -c /tmp/profile/cubecl-profile.log > "$out/cubecl-profile.log.xz"
    ls -l /tmp/profile/cubecl-profile.log "$out/cubecl-profile.log.xz"
fi
fi

# 4. Parity with the CPU: the device-parity test's runs on cuda.
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
if [[ ${PART:-all} == all ]]; then
par adam cpu adam-cpu
par adam cuda adam-cuda
par adam cuda adam-cuda-resumed --resume /tmp/parity/adam-cuda/checkpoints/step-00000003
python3 "$repo/results/gpu-cuda/parity.py" /tmp/parity > "$out/parity.jsonl" 2>&1

# 5. Batch 8.
bench built "$B/bin/model_step" 8
bench autotune "$B/bin/model_step_autotune" 8
fi
for p in fp32 tf32 bf16; do torch 8 "$p"; done

# 6. The other optimizers' parity.
for o in lamb onebit_adam onebit_lamb slamb; do
    par "$o" cpu "$o-cpu" && par "$o" cuda "$o-cuda"
done
python3 "$repo/results/gpu-cuda/parity.py" /tmp/parity > "$out/parity.jsonl" 2>&1
cat "$out/parity.jsonl"
grep -h "error\|panicked" /tmp/parity/*.out | head -20
section "done"
