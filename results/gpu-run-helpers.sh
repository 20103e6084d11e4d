# Sourced by the prepared GPU calls that have not run yet
# (results/gpu-cuda-reductions/device_run.sh, results/gpu-cuda-matmul/
# device_run.sh): the time budget, the bounded run of one section, and the
# libraries CUDA needs from PyTorch's wheels. The calls that already ran keep
# their own copies, as the records of what ran.
#
# The caller sets `start` (epoch seconds) and `budget` (seconds) and opens
# fd 3 on its log: a section's own output may be redirected to a file, the
# section lines are not.

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
    # KILL 10 s after TERM: terse takes TERM as "finish the step and save a
    # checkpoint", which a process stuck on the GPU never does.
    timeout -k 10 "$limit" "$@"
    local rc=$?
    ((rc != 0)) && echo "FAILED ($rc): $name" >&3
    return $rc
}

# NVRTC and CUDA's headers from PyTorch's wheels when the machine has no
# toolkit (as the bundle's run.sh finds them), for what runs outside run.sh.
cuda_from_pytorch_wheels() {
    local nvidia nvrtc cublas nccl links header
    nvidia=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
    [[ -d $nvidia ]] || nvidia=""
    if [[ -n $nvidia ]]; then
        nvrtc=$(find "$nvidia" -name 'libnvrtc.so*' -not -name '*builtins*' 2>/dev/null | head -n 1)
        [[ -n $nvrtc ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nvrtc")"
        # train.matmul = "cublas" / "cublas_tf32" (model_step --matmul).
        cublas=$(find "$nvidia" -name 'libcublas.so*' 2>/dev/null | head -n 1)
        [[ -n $cublas ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cublas")"
        if [[ -z ${CUDA_PATH:-} && ! -d /usr/local/cuda ]]; then
            header=$(find "$nvidia" -path '*/include/cuda_fp16.h' 2>/dev/null | head -n 1)
            [[ -n $header ]] && export CUDA_PATH=$(dirname "$(dirname "$header")")
        fi
    fi
    # The NCCL checks (terse-comm-check --nccl, terse-gpu-exchange-check).
    # cudarc opens NCCL as libnccl.so, never by its soname libnccl.so.2,
    # the only name the wheel and Debian's libnccl2 install: the one found
    # (the wheel's, else the system's), linked under the name cudarc opens,
    # as the bundle's run.sh does.
    if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
        nccl=""
        [[ -n $nvidia ]] && nccl=$(find "$nvidia" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
        [[ -z $nccl ]] && nccl=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" { print $NF; exit }')
        if [[ -n $nccl ]]; then
            links=$(mktemp -d)
            ln -s "$nccl" "$links/libnccl.so"
            export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$links"
        fi
    fi
    return 0
}
