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

# CUDA's headers, for the kernels that include them (half, tensor cores).
# cubecl hands NVRTC $CUDA_PATH/include, else /usr/local/cuda's or
# /opt/cuda's: a runtime-only CUDA image has /usr/local/cuda without
# headers, so what counts is cuda_fp16.h there, not the directory.
cuda_env_root=${CUDA_PATH:-}
[[ -z $cuda_env_root && -d /usr/local/cuda ]] && cuda_env_root=/usr/local/cuda
[[ -z $cuda_env_root && -d /opt/cuda ]] && cuda_env_root=/opt/cuda
if [[ -n $cuda_env_nvidia && ! -f $cuda_env_root/include/cuda_fp16.h ]]; then
    cuda_env_header=$(find "$cuda_env_nvidia" -path '*/include/cuda_fp16.h' 2>/dev/null | head -n 1)
    if [[ -n $cuda_env_header ]]; then
        export CUDA_PATH=$(dirname "$(dirname "$cuda_env_header")")
        cuda_env_why="no CUDA toolkit here"
        [[ -n $cuda_env_root ]] && cuda_env_why="$cuda_env_root has none"
        echo "CUDA headers from PyTorch's wheels: CUDA_PATH=$CUDA_PATH ($cuda_env_why)"
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
