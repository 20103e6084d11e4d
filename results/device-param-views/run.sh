#!/usr/bin/env bash
# The write-back before and after the padded parameter buffer, on lavapipe,
# alternating in one run. /tmp/ms-before and /tmp/ms-after are the
# model_step bench built (`cargo test --workspace --bench model_step
# --no-run`, target/debug/deps/model_step-*) at the commit before and after
# the change.
set -euo pipefail
export XDG_RUNTIME_DIR=/tmp
for v in before after; do
    TERSE_BENCH_KERNELS=1 /tmp/ms-$v --presets tiny --batch 8 --seq 128 --device lavapipe \
        --warmup 1 --steps 2 2> kernels-$v.txt | grep '^{' > dispatches-$v.jsonl
done
for i in 1 2 3; do
    for v in before after; do
        /tmp/ms-$v --presets tiny --batch 8 --seq 128 --device lavapipe --warmup 1 \
            --steps 3 --sync-phases 2> /dev/null | grep '^{' |
            sed "s/^{/{\"variant\": \"$v\", \"run\": $i, /" >> phases.jsonl
    done
done
