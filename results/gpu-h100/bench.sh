#!/bin/bash
# The second call on the lent GPU machine (2026-11-26): .gl, .gpu/bins.tar.xz and
# .gpu/lib carried as for run.sh.
# Three runs of the same BERT step: terse on wgpu (Vulkan) and PyTorch eager on CUDA, alternating.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export LD_LIBRARY_PATH=$PWD/.gpu/lib XDG_RUNTIME_DIR=/tmp
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
python3 -c 'import tarfile; tarfile.open(".gpu/bins.tar.xz").extractall(".gpu/bin", filter="tar")'
chmod +x .gpu/bin/*
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "tf32 matmul", torch.backends.cuda.matmul.allow_tf32)'; } > "$OUT/bench.txt" 2>&1
for run in 1 2 3; do
  timeout 60 .gpu/bin/model_step --presets mini,base --device wgpu --batch 8 --seq 128 \
    | sed "s/^{/{\"run\": $run, /" >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
  timeout 60 python3 benches/pytorch_bert_step.py --presets mini,base --batch 8 --seq 128 --device cuda \
    | sed "s/^{/{\"run\": $run, \"framework\": \"pytorch\", /" >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
done
cat "$OUT/bench.jsonl"
