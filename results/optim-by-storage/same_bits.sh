#!/bin/bash
# Two `terse` binaries (before and after a refactor that must not change a
# bit) on BERT-mini pre-training: every optimizer, 1, 2 and 4 local ranks,
# 12 steps (the 1-bit ones frozen at step 8, so both stages run). Compares
# the last three steps' losses and bytes sent, and every tensor of the last
# checkpoint (optimizer state of every rank, model) with same_tensors.py.
# Usage: same_bits.sh BEFORE AFTER [OUT]   (needs python3 with safetensors, numpy)
set -u
before=$1 after=$2 out=${3:-/tmp/same-bits}
here=$(cd "$(dirname "$0")" && pwd)
config=$here/../../configs/pretrain-bert-tiny.toml
python=${PYTHON:-python3}
rm -rf "$out"; mkdir -p "$out"
last3() {
  grep -v '"eval"' "$1/metrics.jsonl" | python3 -c \
    "import sys,json; print([(d['loss'], d['bytes_sent']) for d in map(json.loads, sys.stdin) if 'loss' in d][-3:])"
}
for opt in adam lamb onebit_adam onebit_lamb slamb sgd; do
  for n in 1 2 4; do
    for side in before after; do
      bin=$before; [ $side = after ] && bin=$after
      extra=()
      case $opt in onebit_adam|onebit_lamb) extra=(--set optimizer.freeze_step=8);; esac
      "$bin" pretrain --no-progress --config "$config" --set 'model.preset="mini"' \
        --optimizer $opt "${extra[@]}" --steps 12 --local-ranks $n \
        --run-dir "$out/$opt-$n-$side" > "$out/$opt-$n-$side.log" 2>&1 \
        || echo "FAIL $opt $n $side: $(tail -2 "$out/$opt-$n-$side.log")"
    done
    a=$(last3 "$out/$opt-$n-before"); b=$(last3 "$out/$opt-$n-after")
    t=$($python "$here/same_tensors.py" "$out/$opt-$n-before" "$out/$opt-$n-after")
    rm -rf "$out/$opt-$n-before/checkpoints" "$out/$opt-$n-after/checkpoints" "$out"/$opt-$n-*/export
    if [ "$a" == "$b" ] && [[ "$t" == tensors-same* ]]; then echo "same $opt $n $b $t"
    else echo "DIFF $opt $n: $a | $b | $t"; fi
  done
done
