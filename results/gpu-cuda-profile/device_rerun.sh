#!/usr/bin/env bash
# The second call, on the same machine while it was still held (its /tmp
# kept): the first call's $OUT came back with 8 files only, so this one
# measures again what did not come back (terse's batch-32 step with its
# dispatches per kernel, torch.profiler's tables) plus the third round, gives
# the autotune build's cached pass the time left, and packs everything into
# one archive.
set -uo pipefail
repo=$(pwd)
out=${OUT:-/tmp/out}
o=/tmp/out2
mkdir -p "$o"
exec > >(tee -a "$o/log.txt") 2>&1
B=/tmp/terse-gpu-bundle
export XDG_RUNTIME_DIR=/tmp LD_LIBRARY_PATH="$B/lib"
nvrtc=$(find "$(python3 -c 'import nvidia;print(list(nvidia.__path__)[0])' 2>/dev/null)" /usr/local/cuda*/ \
    -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -n 1)
[[ -n $nvrtc ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nvrtc")"
[[ -d /usr/local/cuda/include ]] && export CUDA_PATH=/usr/local/cuda
step() { TERSE_BENCH_KERNELS=1 timeout "$1" "$2" --presets base --batch 32 --seq 128 --device cuda \
    --warmup 2 --steps 5 >> "$o/$3.jsonl" 2>> "$o/$3-stderr.txt"; echo "-- $3 rc $?"; }
torch() { timeout 40 python3 "$B/benches/pytorch_bert_step.py" --presets base --batch 32 --seq 128 \
    --device cuda --precision "$@"; echo "-- torch $* rc $?" >&2; }
step 40 "$B/bin/model_step" terse-built
torch tf32 --profile --steps 3 2> "$o/torch-profile-tf32.txt" >> "$o/pytorch.jsonl"
torch fp32 --profile --steps 3 2> "$o/torch-profile-fp32.txt" >> "$o/pytorch.jsonl"
torch fp32 >> "$o/pytorch.jsonl"
torch tf32 >> "$o/pytorch.jsonl"
cd /tmp/at && step "${AUTOTUNE_S:-80}" "$B/bin/model_step_autotune" terse-autotune-cached2; cd /tmp
cp /tmp/at/autotune.log "$o/autotune-full.log" 2>/dev/null
ls -la /tmp/at > "$o/autotune-cache-files.txt"
tar cJf "$out/out2.tar.xz" -C /tmp out2
ls -la "$out"
