# Sourced by the prepared GPU calls that have not run yet
# (results/gpu-cuda-reductions/device_run.sh, results/gpu-cuda-matmul/
# device_run.sh): the time budget and the bounded run of one section (the
# libraries CUDA needs from PyTorch's wheels are the bundle's cuda_env.sh).
# The calls that already ran keep their own copies, as the records of what
# ran.
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
