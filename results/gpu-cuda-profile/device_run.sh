#!/usr/bin/env bash
# One call on a lent GPU machine (no Rust, no network), issue 50: what
# precision terse's f32 matmuls have on CUDA, terse's BERT-base batch-32 step
# beside PyTorch (three runs each), where each step's GPU time goes (cubecl's
# per-kernel profile beside torch.profiler's), and burn's autotune with its
# persistent cache (a first process that tunes, a second that reads the cache).
# Run from the repository root with `.gpu/` carried:
#   .gpu/terse-gpu-bundle.tar.xz   `cargo xtask bundle` at the commit measured
#                                  (bin/terse taken out: unused here, and the
#                                  call carries at most 64 MiB)
#   .gpu/autotune.tar.xz           bin/model_step_autotune: the same tree with
#                                  burn's `autotune` and `persistence` added
# DEVICE, PRESET, BATCH and TORCH_DEVICE (cuda, base, 32, cuda) change what
# runs, for a dry run of the script here (DEVICE=lavapipe PRESET=tiny).
# Everything goes to $OUT as it is measured; sections past the time budget
# are skipped (and say so).
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
# The script's own lines go to fd 3 (the log), whatever a command's output is sent to.
exec 3>&1
start=$(date +%s)
budget=${BUDGET_S:-560}
left() { echo $((budget - ($(date +%s) - start))); }
section() { echo "== [$(($(date +%s) - start)) s] $*" >&3; }
# run SECONDS NAME COMMAND...: at most SECONDS, and not past the budget.
run() {
    local limit=$1 name=$2
    shift 2
    local l
    l=$(left)
    if ((l < 15)); then
        echo "SKIPPED (budget): $name" >&3
        return 1
    fi
    ((limit > l)) && limit=$l
    section "$name (limit ${limit}s)"
    local t0
    t0=$(date +%s%N)
    timeout "$limit" "$@"
    local rc=$?
    echo "-- $name: rc $rc, $((($(date +%s%N) - t0) / 1000000)) ms" >&3
    ((rc != 0)) && echo "FAILED ($rc): $name" >&3
    return $rc
}

cd /tmp
tar xJf "$repo/.gpu/terse-gpu-bundle.tar.xz"
tar xJf "$repo/.gpu/autotune.tar.xz" -C /tmp/terse-gpu-bundle
B=/tmp/terse-gpu-bundle
dev=${DEVICE:-cuda} preset=${PRESET:-base} b=${BATCH:-32} tdev=${TORCH_DEVICE:-cuda}
export XDG_RUNTIME_DIR=/tmp
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
grep -E "H100|H200|Driver|torch" "$out/machine.txt" || true

terse() { # terse NAME BINARY BATCH [model_step args]
    local name=$1 bin=$2 batch=$3
    shift 3
    TERSE_BENCH_KERNELS=1 run 90 "terse $name b$batch" "$bin" --presets "$preset" --batch "$batch" --seq 128 \
        --device "$dev" --warmup 2 --steps 5 "$@" >> "$out/terse-$name.jsonl" 2>> "$out/terse-stderr-$name.txt"
    tail -n 1 "$out/terse-$name.jsonl" | cut -c1-300
}
torch() { # torch BATCH PRECISION [args]
    local batch=$1 precision=$2
    shift 2
    run 90 "pytorch $precision b$batch $*" python3 "$B/benches/pytorch_bert_step.py" --presets "$preset" --batch "$batch" \
        --seq 128 --device "$tdev" --precision "$precision" --warmup 2 --steps 5 "$@" | tee -a "$out/pytorch.jsonl"
}

# 1. The precision of an f32 matmul on cuda (and a smoke run of BERT-Tiny).
run 60 "matmul precision + smoke" "$B/bin/model_step" --matmul-precision --presets tiny --batch 8 --seq 128 \
    --device "$dev" --warmup 1 --steps 2 | tee -a "$out/terse-smoke.jsonl"

# 2. Batch 32, first round: terse as built, PyTorch fp32 (TF32 off), TF32, bf16.
terse built "$B/bin/model_step" "$b"
torch "$b" fp32
torch "$b" tf32
torch "$b" bf16

# 3. Where a step's GPU time goes: cubecl's per-kernel profile of the build
#    every command uses (each kernel timed on its own), then torch.profiler's.
mkdir -p /tmp/profile && cd /tmp/profile
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/profile/cubecl-profile.log"\n' > cubecl.toml
run 90 "profile built b$b" "$B/bin/model_step" --presets "$preset" --batch "$b" --seq 128 \
    --device "$dev" --warmup 2 --steps 2 >> "$out/terse-profiled.jsonl" 2> /dev/null
cd /tmp
if [[ -f /tmp/profile/cubecl-profile.log ]]; then
    xz -T0 -6 -c /tmp/profile/cubecl-profile.log > "$out/cubecl-profile-built.log.xz"
    ls -l /tmp/profile/cubecl-profile.log "$out/cubecl-profile-built.log.xz"
fi
for p in tf32 fp32; do
    torch "$b" "$p" --profile --steps 3 2> "$out/torch-profile-$p.txt" > /dev/null
done

# 4. burn's autotune with the persistent cache: the first process tunes and
#    writes the cache, the second reads it.
mkdir -p /tmp/at && cd /tmp/at
cat > cubecl.toml <<'TOML'
[autotune]
level = "minimal"
[autotune.logger]
level = "minimal"
file = "/tmp/at/autotune.log"
[compilation]
cache = true
[environment]
path = "local"
TOML
for pass in tune cached; do
    limit=60
    [[ $pass == tune ]] && limit=210
    TERSE_BENCH_KERNELS=1 run "$limit" "terse autotune-$pass b$b" "$B/bin/model_step_autotune" --presets "$preset" \
        --batch "$b" --seq 128 --device "$dev" --warmup 2 --steps 5 >> "$out/terse-autotune-$pass.jsonl" 2>> "$out/terse-stderr-autotune-$pass.txt"
    tail -n 1 "$out/terse-autotune-$pass.jsonl" | cut -c1-300
    du -sh /tmp/at
done
[[ -f /tmp/at/autotune.log ]] && xz -T0 -c /tmp/at/autotune.log > "$out/autotune.log.xz"
find /tmp/at -maxdepth 3 | head -30 > "$out/autotune-cache-files.txt"
cd /tmp

# 5. Batch 32, rounds two and three.
for round in 2 3; do
    terse built "$B/bin/model_step" "$b"
    torch "$b" fp32
    torch "$b" tf32
done
section "done"
