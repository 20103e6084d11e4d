import json,struct,sys,hashlib,glob
# Hash of every tensor's bytes in a run's checkpoints, by file and name
# (the safetensors header's metadata is a map written in no fixed order).
d=sys.argv[1]; h=hashlib.sha256()
for f in sorted(glob.glob(d+'/checkpoints/*/*.safetensors')):
    b=open(f,'rb').read(); n=struct.unpack('<Q',b[:8])[0]; hd=json.loads(b[8:8+n]); data=b[8+n:]
    for k in sorted(x for x in hd if x!='__metadata__'):
        s,e=hd[k]['data_offsets']; h.update(f.split('/checkpoints/')[1].encode()); h.update(k.encode()); h.update(data[s:e])
print(h.hexdigest()[:16])
