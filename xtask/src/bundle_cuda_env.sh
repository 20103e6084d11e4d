# Sourced (written into the bundle as cuda_env.sh by `cargo xtask bundle`):
# the CUDA libraries terse opens at run time, found where a machine without
# a CUDA toolkit has them — PyTorch's pip wheels (site-packages/nvidia/...)
# — and put on LD_LIBRARY_PATH / CUDA_PATH. run.sh sources it for `--device
# cuda`; the prepared GPU calls (results/gpu-*/device_run.sh) source it from
# the extracted bundle for what they run outside run.sh. Uses PYTHON
# (default python3) to find the wheels; prints each library it adds.

cuda_env_python=${PYTHON:-python3}
# The linker's cache, read once: `ldconfig -p | grep -q` under the callers'
# pipefail fails when grep stops reading early (SIGPIPE), which would call
# a library the system has missing.
cuda_env_ldcache=$(ldconfig -p 2>/dev/null || true)
cuda_env_nvidia=$("$cuda_env_python" -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
[[ -d $cuda_env_nvidia ]] || cuda_env_nvidia=""

# cuda_env_add NAME PATTERN: the wheel's library matching PATTERN on
# LD_LIBRARY_PATH, unless the system's linker already knows one.
cuda_env_add() {
    local name=$1 pattern=$2 found
    [[ -n $cuda_env_nvidia ]] || return 0
    found=$(find "$cuda_env_nvidia" -name "$pattern" -not -name '*builtins*' 2>/dev/null | head -n 1)
    [[ -n $found ]] || return 0
    [[ $cuda_env_ldcache == *"${pattern%\*}"* ]] && return 0
    echo "$name from PyTorch's wheels: $found"
    [[ ":${LD_LIBRARY_PATH:-}:" == *":$(dirname "$found"):"* ]] && return 0
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$found")"
}
# NVRTC compiles every kernel; cuBLAS serves train.matmul = "cublas" /
# "cublas_tf32" (model_step --matmul).
cuda_env_add NVRTC 'libnvrtc.so*'
cuda_env_add cuBLAS 'libcublas.so*'

# CUDA's headers, for the kernels that include them: cuda_fp16.h and
# cuda_bf16.h (half kernels), mma.h (tensor-core matmuls: f32 as TF32 from
# sm_80, bf16, fp16) and crt/mma.h, which mma.h includes. cubecl hands NVRTC
# $CUDA_PATH/include, else /usr/local/cuda's or /opt/cuda's: a runtime-only
# CUDA image has /usr/local/cuda without headers, so what counts is the
# four files there, not the directory. Of the wheels, CUDA 13's
# nvidia-cuda-runtime and nvidia-cuda-crt share nvidia/cu13/include; CUDA
# 12's nvidia-cuda-runtime-cu12 (nvidia/cuda_runtime/include) and
# nvidia-cuda-nvcc-cu12 (nvidia/cuda_nvcc/include/crt) are linked into one
# include/ here. CCCL (cuda/barrier, which train.matmul's TMA routines
# include beside the runtime's cooperative groups) is found where cubecl
# looks, include/ or include/cccl/: CUDA 13's nvidia-cuda-cccl installs it
# into nvidia/cu13/include/cccl, CUDA 12's nvidia-cuda-cccl-cu12 into
# nvidia/cuda_cccl/include, whose entries are linked into that include/ too.
cuda_env_headers="cuda_fp16.h cuda_bf16.h mma.h crt/mma.h"
# cuda_env_has_headers DIR: whether DIR/include holds all four.
cuda_env_has_headers() {
    local header
    for header in $cuda_env_headers; do
        [[ -f $1/include/$header ]] || return 1
    done
}
cuda_env_root=${CUDA_PATH:-}
[[ -z $cuda_env_root && -d /usr/local/cuda ]] && cuda_env_root=/usr/local/cuda
[[ -z $cuda_env_root && -d /opt/cuda ]] && cuda_env_root=/opt/cuda
if [[ -n $cuda_env_nvidia ]] && ! cuda_env_has_headers "$cuda_env_root"; then
    cuda_env_why="no CUDA toolkit here"
    [[ -n $cuda_env_root ]] && cuda_env_why="$cuda_env_root lacks some of $cuda_env_headers"
    cuda_env_header=$(find "$cuda_env_nvidia" -path '*/include/cuda_fp16.h' 2>/dev/null | head -n 1 || true)
    cuda_env_crt=$(find "$cuda_env_nvidia" -path '*/include/crt/mma.h' 2>/dev/null | head -n 1 || true)
    cuda_env_cccl=$(find "$cuda_env_nvidia" -path '*/cuda/barrier' 2>/dev/null | head -n 1 || true)
    if [[ -n $cuda_env_header ]]; then
        cuda_env_include=$(dirname "$cuda_env_header")
        # What the runtime's include/ lacks and a wheel has elsewhere.
        cuda_env_crt_dir=""
        [[ -n $cuda_env_crt && ! -f $cuda_env_include/crt/mma.h ]] &&
            cuda_env_crt_dir=$(dirname "$cuda_env_crt")
        cuda_env_cccl_dir=""
        [[ -n $cuda_env_cccl ]] && cuda_env_cccl_dir=$(dirname "$(dirname "$cuda_env_cccl")")
        [[ $cuda_env_cccl_dir == "$cuda_env_include" || $cuda_env_cccl_dir == "$cuda_env_include/cccl" ]] &&
            cuda_env_cccl_dir=""
        if [[ -z $cuda_env_crt_dir && -z $cuda_env_cccl_dir ]]; then
            export CUDA_PATH=$(dirname "$cuda_env_include")
        else
            cuda_env_merged=$(mktemp -d)
            mkdir "$cuda_env_merged/include"
            ln -s "$cuda_env_include"/* "$cuda_env_merged/include/"
            cuda_env_linked=$cuda_env_include
            if [[ -n $cuda_env_crt_dir ]]; then
                rm -f "$cuda_env_merged/include/crt"
                ln -s "$cuda_env_crt_dir" "$cuda_env_merged/include/crt"
                cuda_env_linked="$cuda_env_linked, $cuda_env_crt_dir"
            fi
            if [[ -n $cuda_env_cccl_dir ]]; then
                for cuda_env_entry in "$cuda_env_cccl_dir"/*; do
                    [[ -e $cuda_env_merged/include/$(basename "$cuda_env_entry") ]] ||
                        ln -s "$cuda_env_entry" "$cuda_env_merged/include/"
                done
                cuda_env_linked="$cuda_env_linked, $cuda_env_cccl_dir"
            fi
            export CUDA_PATH=$cuda_env_merged
            cuda_env_why="$cuda_env_why; $cuda_env_linked linked into one include/"
        fi
        echo "CUDA headers from PyTorch's wheels: CUDA_PATH=$CUDA_PATH ($cuda_env_why)"
        [[ -n $cuda_env_crt ]] ||
            echo "no crt/mma.h in PyTorch's wheels (the tensor-core kernels' mma.h includes it): pip install nvidia-cuda-crt (CUDA 13) or nvidia-cuda-nvcc-cu12 (CUDA 12)"
        [[ -n $cuda_env_cccl ]] ||
            echo "no cuda/barrier (CCCL) in PyTorch's wheels (only train.matmul's TMA routines include it): pip install nvidia-cuda-cccl (CUDA 13) or nvidia-cuda-cccl-cu12 (CUDA 12)"
    fi
fi

# cudarc opens NCCL as libnccl.so (or .so.13, .so.12), never by its soname
# libnccl.so.2, the only name PyTorch's wheel and Debian's libnccl2 install:
# the one found (the wheel's, else the system's), linked under the name
# cudarc opens.
if [[ $cuda_env_ldcache != *"libnccl.so "* ]]; then
    cuda_env_nccl=""
    [[ -n $cuda_env_nvidia ]] &&
        cuda_env_nccl=$(find "$cuda_env_nvidia" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
    [[ -z $cuda_env_nccl ]] &&
        cuda_env_nccl=$(awk '$1 == "libnccl.so.2" { print $NF; exit }' <<< "$cuda_env_ldcache")
    if [[ -n $cuda_env_nccl ]]; then
        cuda_env_links=$(mktemp -d)
        ln -s "$cuda_env_nccl" "$cuda_env_links/libnccl.so"
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_env_links"
        echo "NCCL: $cuda_env_nccl (as $cuda_env_links/libnccl.so)"
    fi
fi
true
