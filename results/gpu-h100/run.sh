#!/bin/bash
# The first call on the lent GPU machine (2026-11-26), kept as it ran. It ran from
# the repository root with these paths carried beside the tree (git ignores them):
#   .gl/               the Vulkan and GL loaders as Debian packages (unpacked into /)
#   .gpu/bins.tar.xz   terse, model_step and optim_device, built here and stripped
#   .gpu/cache.tar.xz  TERSE_CACHE: sotu, squad-v1.1, minilm/tokenizer.json, the shards
#   .gpu/lib/          the libraries the binaries link that the machine lacks (OpenMPI's)
#   .gpu/commands/N.txt  `cargo xtask reproduce onebit-adam --model mini --device wgpu
#                      --steps N --print-commands` for N = 1000, 800, …, 100
# Everything it measures goes to $OUT as it happens (the device tool returns $OUT).
set -u
T0=$(date +%s)
DEADLINE=${DEADLINE:-540}         # seconds from the start the whole script must end by
now() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(now)s] $*" | tee -a "$OUT/steps.log"; }
[ -n "${SKIP_GL:-}" ] || { for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; }
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export XDG_RUNTIME_DIR=/tmp TERSE_CACHE=$PWD/.gpu/cache RUST_BACKTRACE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
python3 - <<'PY'
import tarfile
for archive, into in ((".gpu/bins.tar.xz", ".gpu/bin"), (".gpu/cache.tar.xz", ".gpu/cache")):
    with tarfile.open(archive) as t:
        t.extractall(into, filter="tar")
PY
chmod +x .gpu/bin/*
COMMANDS=${COMMANDS:-.gpu/commands}
STEP_CHOICES=${STEP_CHOICES:-1000,800,600,500,400,300,200,100}
BENCH_PRESETS=${BENCH_PRESETS:-mini,base}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  grep -m1 'model name' /proc/cpuinfo; nproc; grep MemTotal /proc/meminfo; uname -r; } > "$OUT/machine.txt" 2>&1
log "machine: $(head -2 "$OUT/machine.txt" | tail -1)"

# 1. Vulkan through wgpu on the GPU at all
if ! timeout 90 .gpu/bin/model_step --presets tiny --device wgpu --warmup 1 --steps 2 \
      > "$OUT/check.jsonl" 2> "$OUT/check.err"; then
  log "wgpu check failed"; tail -30 "$OUT/check.err"
  ls -l /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>&1
  ldconfig -p | grep -i -E "vulkan|nvidia" | head; exit 1
fi
# the adapters wgpu sees (an index past the last makes terse list them all)
.gpu/bin/terse pretrain --config configs/reproduce-onebit-adam.toml --device wgpu:9 --set train.steps=1 \
  --run-dir /tmp/adapters --no-progress 2>&1 | grep -o "among the adapters.*" | cut -c1-400 | tee -a "$OUT/machine.txt"
log "check: $(cat "$OUT/check.jsonl")"

# 2. the probe: the five variants at once, 12 steps, to size the experiment
mkdir -p probe
probe_line() { sed -e 's#runs/reproduce/#probe/#' <<<"$1"; }
pids=()
while IFS= read -r line; do
  label=$(sed -e 's#.*--run-dir [^ ]*/\([^ /]*\).*#\1#' <<<"$line")
  eval ".gpu/bin/$(probe_line "$line") --set train.steps=12 --set train.eval_every=1000 --set train.checkpoint_every=1000 --no-progress" \
    > "probe/$label.out" 2>&1 &
  pids+=($!)
done < "$COMMANDS/1000.txt"
t_probe=$(now)
for p in "${pids[@]}"; do wait "$p" || log "probe $p failed"; done
probe_wall=$(( $(now) - t_probe )); log "probe done in ${probe_wall}s"
# seconds per step from step 4 to 12 (the slowest variant)
per_step=$(python3 - <<'PY'
import json, glob
worst = 0
for f in glob.glob("probe/*/*/metrics.jsonl"):
    e = {}
    for l in open(f):
        d = json.loads(l)
        if "elapsed_s" in d: e[d["step"]] = d["elapsed_s"]
    if 4 in e and 12 in e: worst = max(worst, (e[12] - e[4]) / 8)
print(f"{worst:.4f}")
PY
)
log "probe: ${per_step}s per step with 5 variants at once"
tar czf "$OUT/probe.tar.gz" --exclude=checkpoints --exclude=export probe 2>/dev/null

# 3. the experiment, as many steps as fit before DEADLINE - 150 (benchmarks after)
left=$(( DEADLINE - ${BENCH_RESERVE:-130} - $(now) ))
# the probe's wall time beyond its 12 steps is start-up, 2 evaluations and 1 checkpoint;
# the experiment has 5 of each kind: about 2.5 times that
steps=$(python3 -c "
p=float('$per_step') or 1e9; fixed=2.5*max(0, $probe_wall - 12*p)
s=int(($left - fixed)/p)
print(max([c for c in [$STEP_CHOICES] if c<=s] or [0]))")
log "experiment: $steps steps (left ${left}s)"
if [ "$steps" -gt 0 ]; then
  pids=()
  while IFS= read -r line; do
    label=$(sed -e 's#.*--run-dir [^ ]*/\([^ /]*\).*#\1#' <<<"$line")
    dir=$(sed -e 's#.*--run-dir \([^ ]*\).*#\1#' <<<"$line")
    mkdir -p runs/log "$dir"
    # the stamp `cargo xtask reproduce` writes (its arguments joined by spaces), and its
    # `finished` mark when terse exits 0: the harness then reads the run as its own
    python3 -c 'import shlex,sys; print(" ".join(shlex.split(sys.argv[1])[1:]))' "$line" > "$dir/variant.txt"
    ( eval ".gpu/bin/$line --no-progress" > "runs/log/$label.out" 2>&1 && touch "$dir/finished" ) &
    pids+=($!)
  done < "$COMMANDS/$steps.txt"
  ( while sleep 30; do log "progress: $(for f in runs/reproduce/*/*/metrics.jsonl; do tail -1 $f | cut -c1-40; done | tr '\n' ' ')"; done ) &
  watcher=$!
  for p in "${pids[@]}"; do wait "$p" || log "variant $p exited $?"; done
  kill $watcher
  log "experiment done"
  tar czf "$OUT/experiment.tar.gz" --exclude=checkpoints --exclude=export runs 2>/dev/null
fi

# 4. benchmarks: terse on wgpu beside PyTorch eager on CUDA, same step
left=$(( DEADLINE - $(now) ))
log "benchmarks ($left s left)"
timeout $(( left / 2 )) .gpu/bin/model_step --presets $BENCH_PRESETS --device wgpu --batch 8 --seq 128 \
  > "$OUT/model_wgpu.jsonl" 2> "$OUT/model_wgpu.err"; log "model_step wgpu: $?"
timeout 60 python3 benches/pytorch_bert_step.py --presets $BENCH_PRESETS --batch 8 --seq 128 --device cuda \
  > "$OUT/pytorch_cuda.jsonl" 2> "$OUT/pytorch_cuda.err"; log "pytorch cuda: $?"
left=$(( DEADLINE - 10 - $(now) ))
[ $left -gt 20 ] && { timeout $left .gpu/bin/optim_device --device wgpu \
  > "$OUT/optim_wgpu.txt" 2>&1; log "optim_device wgpu: $?"; }
log "end"
