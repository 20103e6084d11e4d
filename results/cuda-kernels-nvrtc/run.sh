#!/usr/bin/env bash
# terse-kernels' cubecl kernels as the CUDA C++ cubecl-cuda writes for an
# sm_90 device, compiled by NVRTC, on a machine without a GPU or a CUDA
# toolkit. NVRTC is the `cuda-nvrtc` dataset (data/manifests/cuda-nvrtc.toml:
# libnvrtc from PyPI's nvidia-cuda-nvrtc wheel) and its headers the
# `cuda-headers` and `cuda-crt-headers` datasets (PyPI's nvidia-cuda-runtime
# and nvidia-cuda-crt wheels), which the test fetches itself; `cargo xtask
# test` runs the same test in CI. This script only records its output.
# Usage: bash results/cuda-kernels-nvrtc/run.sh [OUT_DIR]
set -euo pipefail
out=${1:-results/cuda-kernels-nvrtc}
cargo test --workspace --lib every_kernel_compiles_with_nvrtc -- --nocapture 2>&1 |
    grep -E 'compiles|kernels|every_kernel|test result: ok\. 1 ' | tee "$out/nvrtc.txt"
