#!/bin/bash
# `bench workers`' measurement (BERT-Tiny and BERT-mini, configs/pretrain-bert-tiny.toml:
# 1-bit LAMB, 16 steps, 12 of warmup and 4 compressing; 1, 2, 4 local ranks and
# 2 mpirun processes), for two builds of terse taking turns: /tmp/ab/terse-base
# (0d63321, before issue 51's changes of stops 63-64) and /tmp/ab/terse-head.
# Prints one JSON line per run: samples/s over every step but the first
# (harmonic mean, as xtask/src/bench_workers.rs computes it).
set -euo pipefail
REPEATS=${REPEATS:-3}
rate() {
  python3 - "$1" <<'PY'
import json, sys
r = [json.loads(l)["samples_per_s"] for l in open(sys.argv[1]) if '"samples_per_s"' in l]
later = r[1:]
print(round(len(later) / sum(1 / x for x in later), 2))
PY
}
for repeat in $(seq 1 "$REPEATS"); do
  for preset in tiny mini; do
    for world in local1 local2 local4 mpirun2; do
      for which in base head; do
        dir=/tmp/ab/run-$which
        rm -rf "$dir"
        args=(pretrain --no-progress --config configs/pretrain-bert-tiny.toml
              --set "model.preset=\"$preset\"" --set train.steps=16 --set train.eval_every=0
              --run-dir "$dir")
        case $world in
          local*) /tmp/ab/terse-$which "${args[@]}" --local-ranks "${world#local}" > /dev/null 2>&1 ;;
          mpirun2) RAYON_NUM_THREADS=1 \
                     mpirun --allow-run-as-root --bind-to none -np 2 --oversubscribe -x RAYON_NUM_THREADS /tmp/ab/terse-$which "${args[@]}" > /dev/null 2>&1 ;;
        esac
        echo "{\"build\": \"$which\", \"run\": $repeat, \"preset\": \"$preset\", \"world\": \"$world\", \"samples_per_s\": $(rate "$dir/metrics.jsonl")}"
        rm -rf "$dir"
      done
    done
  done
done
