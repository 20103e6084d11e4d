#!/usr/bin/env bash
# SQuAD's training windows and SNLI's training pairs: made (the cache file
# removed first) against read from the cache, alternated three times, each
# run stopped by `timeout 60` (its data is ready long before; the script
# takes ~10 minutes). The times are terse's own log lines
# ("... featurized in N s" / "... read from ... in N s").
#   bash results/feature-cache/run.sh > results/feature-cache/runs.txt
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
features=${TERSE_CACHE:-$HOME/.cache/terse}/features
prepare() { # TASK ARGS...: the log lines of a run stopped after its data
    rm -rf /tmp/feature-cache-run
    timeout 60 cargo xtask finetune "$@" --steps 1 --set train.eval_every=0 \
        --run-dir /tmp/feature-cache-run --no-progress 2>&1 |
        grep -m 2 -E "(featurized|encoded) in|read from" | sed 's/, kept in .*//; s/ from .*safetensors//'
}
for round in 1 2 3; do
    echo "== round $round"
    rm -f "$features"/squad-train-v1_1-seq256-*.safetensors "$features"/snli-train-seq128-*.safetensors
    echo "-- made"
    prepare squad --set task.dev_questions=10
    prepare glue --task snli
    echo "-- read"
    prepare squad --set task.dev_questions=10
    prepare glue --task snli
done
