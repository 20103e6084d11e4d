#!/bin/bash
# usage: slamb_bits.sh BINARY TAG
for n in 1 2 4; do for mask in hash cyclic; do
  d=/tmp/slamb-$2-$n-$mask; rm -rf $d
  $1 pretrain --no-progress --config configs/pretrain-bert-tiny.toml --set 'model.preset="mini"' --optimizer slamb --set optimizer.sync_every=5 --set "optimizer.mask=\"$mask\"" --set optimizer.always_sync_below=1000 --steps 12 --local-ranks $n --run-dir $d > $d.log 2>&1
  python3 - $d $n $mask <<'PY'
import json,sys,hashlib,glob,os
d,n,mask=sys.argv[1:]
rows=[json.loads(l) for l in open(d+'/metrics.jsonl') if '"loss"' in l]
h=hashlib.sha256()
for f in sorted(glob.glob(d+'/checkpoints/*/*.safetensors')): h.update(open(f,'rb').read())
print(n, mask, rows[-1]['step'], repr(rows[-1]['loss']), rows[-1]['bytes_sent'], h.hexdigest()[:16])
PY
done; done
