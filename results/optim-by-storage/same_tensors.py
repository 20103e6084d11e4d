"""Whether two run directories' last checkpoints hold the same tensors, bit
for bit (every .safetensors file: optimizer state of each rank, model).
The files' bytes are not compared: their metadata is a map whose order
differs between processes."""
import glob
import os
import sys

from safetensors.numpy import load_file

a_dir, b_dir = sys.argv[1], sys.argv[2]
last_a = sorted(glob.glob(a_dir + "/checkpoints/step-*"))[-1]
last_b = sorted(glob.glob(b_dir + "/checkpoints/step-*"))[-1]
same = os.path.basename(last_a) == os.path.basename(last_b)
for name in sorted(os.listdir(last_a)):
    if name.endswith(".safetensors"):
        a, b = load_file(f"{last_a}/{name}"), load_file(f"{last_b}/{name}")
        same &= a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
print(("tensors-same" if same else "TENSORS-DIFFER") + ":" + os.path.basename(last_a))
