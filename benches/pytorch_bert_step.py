#!/usr/bin/env python3
"""PyTorch eager CPU baseline for one BERT pre-training step, to compare terse against.

How to run (a venv with torch and transformers, e.g. the one make_hf_fixtures.py describes):

    /tmp/hfvenv/bin/python benches/pytorch_bert_step.py --presets mini,base --batch 8 \
        [--seq 128] [--warmup 2] [--steps 5] [--threads N] [--seed 0] [--device cpu|cuda] \
        [--precision fp32|tf32|bf16|fp16] [--mlm-positions masked|all]

One step = zero_grad, BertForPreTraining forward in train mode (dropout 0.1 on hidden states and
attention probabilities, as in the config), MLM + NSP loss, backward, AdamW step (lr 1e-4,
betas (0.9, 0.999), eps 1e-6, weight decay 0.01 on every parameter, torch's default foreach
implementation). On CUDA, `--precision`: fp32 (TF32 off for matmuls and cuDNN, the default),
tf32 (TF32 matmuls); on any device bf16 (forward and loss under
`torch.autocast(dtype=torch.bfloat16)`, fp32 master weights and optimizer, as mixed-precision
training runs) and fp16 (the same in float16, with `torch.amp.GradScaler`). Inputs: token ids uniform in [999, vocab) from a fixed seed, segment A = first
half / segment B = second half of the sequence (token_type_ids 0/1), attention mask all ones; MLM
labels at a random 15% of positions (labels -100 elsewhere; those input positions replaced by
[MASK] = 103), NSP labels random 0/1. The batch is built once and reused every step.

`--mlm-positions masked` (the default) runs the MLM head (transform, LayerNorm, the tied
768 x 30522 decoder) at the masked positions only, gathered as NVIDIA's and DeepSpeed's BERT
(bing_bert) do and as terse does (models/src/bert/heads.rs): the same work on both sides.
`all` is BertForPreTraining's own forward, the head at every position (at BERT-base about a
fifth of the step's FLOPs more; terse's earlier CPU ratios were measured against it). The loss
is the same either way: MLM cross-entropy averaged over the masked positions, + NSP's.

Prints one JSON line per preset:
  {"preset", "batch", "seq", "threads", "samples_per_s", "step_ms", "torch_version", ...}
step_ms is the mean of the timed steps (median and min are reported too); samples_per_s =
batch / mean step time.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PRESETS = {  # layers, hidden, heads, intermediate; vocab 30522, 512 positions, type vocab 2
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def make_batch(batch, seq, vocab, gen):
    ids = torch.randint(999, vocab, (batch, seq), generator=gen)
    ids[:, 0] = 101  # [CLS]
    ids[:, seq // 2 - 1] = 102  # [SEP]
    ids[:, -1] = 102
    tt = torch.zeros(batch, seq, dtype=torch.int64)
    tt[:, seq // 2:] = 1
    mask = torch.ones(batch, seq, dtype=torch.int64)
    n_mask = max(1, round(0.15 * seq))
    labels = torch.full((batch, seq), -100, dtype=torch.int64)
    for b in range(batch):
        pos = torch.randperm(seq, generator=gen)[:n_mask]
        labels[b, pos] = ids[b, pos]
        ids[b, pos] = 103  # [MASK]
    nsp = torch.randint(0, 2, (batch,), generator=gen)
    return ids, tt, mask, labels, nsp


def bench(preset, args):
    from transformers import BertConfig, BertForPreTraining

    layers, hidden, heads, inter = PRESETS[preset]
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=inter,
                     max_position_embeddings=512, type_vocab_size=2,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(args.seed)
    kw = {} if args.attn == "default" else {"attn_implementation": args.attn}
    model = BertForPreTraining._from_config(cfg, **kw) if kw else BertForPreTraining(cfg)
    device = torch.device(args.device)
    model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    ids, tt, mask, labels, nsp = (t.to(device) for t in
                                  make_batch(args.batch, args.seq, cfg.vocab_size, gen))

    if device.type == "cuda":
        tf32 = args.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    autocast = (torch.autocast(device_type=device.type, dtype=half)
                if half is not None else contextlib.nullcontext())
    # fp16: dynamic loss scaling, as mixed-precision fp16 training runs.
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")

    # The masked positions, once (the batch is reused), as terse's batch
    # carries them: flat indices b * seq + t and their labels.
    at_masks = (labels.reshape(-1) != -100).nonzero().squeeze(1)
    masked_labels = labels.reshape(-1).index_select(0, at_masks)

    def loss_of_step():
        if args.mlm_positions == "all":
            return model(input_ids=ids, token_type_ids=tt, attention_mask=mask,
                         labels=labels, next_sentence_label=nsp).loss
        hidden, pooled = model.bert(input_ids=ids, token_type_ids=tt, attention_mask=mask,
                                    return_dict=False)[:2]
        gathered = hidden.reshape(-1, hidden.shape[-1]).index_select(0, at_masks)
        mlm = F.cross_entropy(model.cls.predictions(gathered), masked_labels)
        return mlm + F.cross_entropy(model.cls.seq_relationship(pooled), nsp)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_of_step()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()  # waits for the device: the step's time includes its kernels

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        step()
    if args.profile:
        # Where the step's GPU time goes, by kernel (stderr), beside terse's
        # cubecl profile of the same step; the timed steps below run unprofiled.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40,
                                        max_name_column_width=90), file=sys.stderr)
    times, loss = [], None
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    mean = statistics.fmean(times)
    # At the step's end, as terse's device_memory_mb: parameters, gradients
    # (freed only by the next step's zero_grad) and AdamW's state; the peak
    # includes the activations terse's end-of-step figure does not see.
    memory = {}
    if device.type == "cuda":
        memory["device_memory_mb"] = {
            "in_use": round(torch.cuda.memory_allocated(device) / 1e6, 3),
            "reserved": round(torch.cuda.memory_reserved(device) / 1e6, 3),
            "peak_in_use": round(torch.cuda.max_memory_allocated(device) / 1e6, 3),
        }
    return {
        **memory,
        "preset": preset,
        "batch": args.batch,
        "seq": args.seq,
        "threads": torch.get_num_threads(),
        "samples_per_s": round(args.batch / mean, 3),
        "step_ms": round(mean * 1e3, 2),
        "torch_version": torch.__version__,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "step_ms_median": round(statistics.median(times) * 1e3, 2),
        "step_ms_min": round(min(times) * 1e3, 2),
        "warmup": args.warmup,
        "steps": args.steps,
        "params": sum(p.numel() for p in model.parameters()),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "last_loss": round(loss, 4),
        "precision": args.precision,
        "mlm_positions": args.mlm_positions,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="mini,base", help="comma list of " + ",".join(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="torch device: cpu (the baseline `bench model` compares against) or cuda "
                         "(beside `bench model --device wgpu` on an NVIDIA GPU)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"],
                    help="fp32 (on CUDA TF32 off), tf32 (CUDA's TF32 matmuls), bf16 (autocast), "
                         "fp16 (autocast and GradScaler)")
    ap.add_argument("--mlm-positions", default="masked", choices=["masked", "all"],
                    help="where the MLM head runs: at the masked positions only, gathered, as "
                    "terse and NVIDIA's/DeepSpeed's BERT do (default), or at every position "
                    "(BertForPreTraining's forward)")
    ap.add_argument("--profile", action="store_true",
                    help="before the timed steps, profile as many steps with torch.profiler and "
                    "print the kernels by GPU time on stderr")
    ap.add_argument("--attn", default="default", choices=["default", "eager", "sdpa"],
                    help="transformers attention implementation (default: transformers' choice)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for preset in args.presets.split(","):
        print(json.dumps(bench(preset.strip(), args)), flush=True)


if __name__ == "__main__":
    main()
