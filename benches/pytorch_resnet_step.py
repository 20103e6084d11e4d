#!/usr/bin/env python3
"""PyTorch eager CPU baseline for one ResNet-20 training step, to compare terse against.

How to run (a venv with torch; `cargo xtask bench model` makes or finds one):

    python benches/pytorch_resnet_step.py [--batch 128] [--warmup 2] [--steps 5] [--threads N]

The model is terse's ResNet-20 (models/src/resnet.rs; He et al. 2016, CIFAR style): a 3x3
convolution to 16 channels, BatchNorm, ReLU; three stages of three basic blocks (16, 32, 64
channels, stride 2 at the first block of stages 2 and 3); option-A shortcuts (identity,
subsampled by the stride and zero-padded with the new channels where the shape changes); global
average pooling; a linear layer to 10 classes. Convolutions have no bias.

One step = zero_grad, forward in train mode on 32x32x3 images (uniform in [-1, 1] from a fixed
seed, built once and reused), mean cross-entropy against random labels, backward, AdamW (lr 1e-4,
betas (0.9, 0.999), eps 1e-6, weight decay 0.01 on every parameter), as terse's side of the
benchmark does.

Prints one JSON line: {"preset": "resnet20", "batch", "threads", "samples_per_s", "step_ms", ...}
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(c_in, c_out, stride):
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(c_in, c_out, stride), nn.BatchNorm2d(c_out)
        self.conv2, self.bn2 = conv3x3(c_out, c_out, 1), nn.BatchNorm2d(c_out)
        self.stride, self.pad = stride, c_out - c_in

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = x[:, :, :: self.stride, :: self.stride]
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.pad))
        return F.relu(h + shortcut)


class Resnet20(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem, self.stem_bn = conv3x3(3, 16, 1), nn.BatchNorm2d(16)
        blocks, c_in = [], 16
        for stage, width in enumerate([16, 32, 64]):
            for i in range(3):
                blocks.append(Block(c_in, width, 2 if stage > 0 and i == 0 else 1))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        h = self.blocks(F.relu(self.stem_bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Resnet20()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.rand(args.batch, 3, 32, 32, generator=gen) * 2 - 1
    labels = torch.randint(0, 10, (args.batch,), generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times, loss = [], None
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    mean = statistics.fmean(times)
    print(json.dumps({
        "preset": "resnet20",
        "batch": args.batch,
        "image": [3, 32, 32],
        "threads": torch.get_num_threads(),
        "samples_per_s": round(args.batch / mean, 3),
        "step_ms": round(mean * 1e3, 2),
        "torch_version": torch.__version__,
        "step_ms_median": round(statistics.median(times) * 1e3, 2),
        "step_ms_min": round(min(times) * 1e3, 2),
        "warmup": args.warmup,
        "steps": args.steps,
        "params": sum(p.numel() for p in model.parameters()),
        "last_loss": round(loss, 4),
    }), flush=True)


if __name__ == "__main__":
    main()
