#!/usr/bin/env bash
# terse-kernels' cubecl kernels as the CUDA C++ cubecl-cuda writes for an
# sm_90 device, compiled by NVRTC, on a machine without a GPU or a CUDA
# toolkit: NVRTC and CUDA's headers from NVIDIA's wheels on PyPI.
# Usage: bash results/cuda-kernels-nvrtc/run.sh [OUT_DIR]
set -euo pipefail
out=${1:-results/cuda-kernels-nvrtc}
wheels=$(mktemp -d)
python3 -m pip download --no-deps -q -d "$wheels" nvidia-cuda-nvrtc nvidia-cuda-runtime
(cd "$wheels" && for w in *.whl; do python3 -m zipfile -e "$w" .; done)
cuda=$(dirname "$(dirname "$(find "$wheels" -name cuda_fp16.h | head -n 1)")")
ls "$wheels"/*.whl | xargs -n1 basename > "$out/wheels.txt"
cargo test --workspace --lib --no-run
binary=$(ls -t target/debug/deps/terse_kernels-* | grep -v '\.d$' | head -n 1)
TERSE_NVRTC_CUDA=$cuda LD_LIBRARY_PATH=$cuda/lib \
    "$binary" --ignored --nocapture every_kernel_compiles_with_nvrtc 2>&1 | tee "$out/nvrtc.txt"
rm -rf "$wheels"
