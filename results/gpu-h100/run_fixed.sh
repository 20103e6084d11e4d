#!/bin/bash
# The third call on the lent GPU machine (2026-11-26; carried as for run.sh, with .gpu/commands-tiny/300.txt): onebit-adam's five variants at BERT-Tiny, 300 steps,
# all at once (as run.sh's experiment, without its probe and benchmarks).
set -u
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export LD_LIBRARY_PATH=$PWD/.gpu/lib XDG_RUNTIME_DIR=/tmp TERSE_CACHE=$PWD/.gpu/cache
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
python3 - <<'PY'
import tarfile
for archive, into in ((".gpu/bins.tar.xz", ".gpu/bin"), (".gpu/cache.tar.xz", ".gpu/cache")):
    with tarfile.open(archive) as t:
        t.extractall(into, filter="tar")
PY
chmod +x .gpu/bin/*
pids=()
while IFS= read -r line; do
  label=$(sed -e 's#.*--run-dir [^ ]*/\([^ /]*\).*#\1#' <<<"$line")
  dir=$(sed -e 's#.*--run-dir \([^ ]*\).*#\1#' <<<"$line")
  mkdir -p runs/log "$dir"
  python3 -c 'import shlex,sys; print(" ".join(shlex.split(sys.argv[1])[1:]))' "$line" > "$dir/variant.txt"
  ( eval ".gpu/bin/$line --no-progress" > "runs/log/$label.out" 2>&1 && touch "$dir/finished" ) &
  pids+=($!)
done < .gpu/commands-tiny/300.txt
( while sleep 30; do echo "[$(now)s] $(for f in runs/reproduce/*/*/metrics.jsonl; do tail -1 $f | cut -c1-12; done | tr '\n' ' ')"; done ) &
watcher=$!
( sleep ${LIMIT:-270}; echo "[$(now)s] out of time: stopping"; kill "${pids[@]}" 2>/dev/null; pkill -f .gpu/bin/terse ) &
for p in "${pids[@]}"; do wait "$p"; done
kill $watcher 2>/dev/null
echo "[$(now)s] done"; grep -h "samples in" runs/log/*.out | sed 's/;.*//'
tar czf "$OUT/experiment-tiny.tar.gz" --exclude=checkpoints --exclude=export runs
