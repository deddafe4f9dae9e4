#!/usr/bin/env python3
"""A small byte-level causal transformer language model trained with DDP: a user's torchrun script.

The script tools/bench/script_start.py times from submit (or from the launcher's start) to its first
optimizer step, and the GPU check (tools/gpu/check.sh) runs on GPUs and slices. It reads torchrun's
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and its own flags, as on any
cluster:

    torchrun --nproc_per_node=2 lm_train.py --batch_size 8 --max_steps 20

and under fitrun (a spec with `batch_flag: --batch_size`) it gets the planned per-device batch the same
way. Of fitrun's variables it reads only FITRUN_CHECKPOINT_DIR (rank 0 checkpoints there and a
restarted rank resumes from the newest checkpoint), FITRUN_MAX_STEPS (the memory probe's few steps)
and FITRUN_PRECISION (the spec's precision, unless --precision says one); when the fitrun module is
importable it reports its steps through it, and otherwise runs without it.

Each rank prints `rank R: first optimizer step done at T`, T the wall clock (time.time()) when its
first optimizer step returned, then `rank R: done: ...` at the end. The data: a text file (--data), or
synthetic bytes (a seeded random walk over a small alphabet, so that the loss falls). --oom_at_step
asks for more memory than the device has at that step of a job's first attempt (a new attempt resumes
past it): a real out-of-memory error, for the checks that fitrun catches and reports it.
"""
import argparse
import contextlib
import gc
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # fitrun's module when it is there (fitrun puts it on a rank's PYTHONPATH); plain torchrun without it
    import fitrun
except ImportError:
    fitrun = None

VOCABULARY = 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=int(os.environ.get("FITRUN_PER_DEVICE_BATCH") or 8),
                   help="sequences per process")
    p.add_argument("--grad_accum_steps", type=int, default=int(os.environ.get("FITRUN_GRAD_ACCUM_STEPS") or 1))
    p.add_argument("--max_steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--data", default="", help="a text file (default: synthetic bytes)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                   default=os.environ.get("FITRUN_PRECISION") or "fp32")
    p.add_argument("--checkpoint_every", type=int, default=10, help="steps between checkpoints (0: end only)")
    p.add_argument("--log_every", type=int, default=5)
    p.add_argument("--oom_at_step", type=int, default=0,
                   help="at this step of a first attempt, ask for more memory than the device has")
    p.add_argument("--tag", default="", help="a label for the run; changes nothing")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and a 4x GELU MLP, each with a residual."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_proj = nn.Linear(4 * hidden, hidden)

    def attention(self, x):
        b, t, h = x.shape
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(h // self.heads)
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return y.transpose(1, 2).reshape(b, t, h)

    def forward(self, x):
        x = x + self.proj(self.attention(self.ln1(x)))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class LanguageModel(nn.Module):
    def __init__(self, layers, hidden, heads, context):
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, hidden)
        self.positions = nn.Embedding(context, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCABULARY, bias=False)
        for module in self.modules():  # GPT-2's initialisation
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def corpus(path, seed):
    """The training bytes: the file's, or 1 MiB of a seeded random walk over 32 letters."""
    if path:
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    generator = torch.Generator().manual_seed(seed)
    steps = torch.randint(-2, 3, (1 << 20,), generator=generator)
    return (steps.cumsum(0) % 32 + ord("a")).long()


def exhaust(device):
    """Holds 64 MiB more at a time until the device refuses one (the caching allocator at a GPU's or a
    slice's limit, the capped allocator at a virtual CPU device's cap): a real out-of-memory error, the
    refused request a batch's worth, as when a step outgrows its device."""
    held = []
    for _ in range(1 << 14):  # 1 TiB: a device with no limit at all is not what this is for
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device=device))
    raise RuntimeError(f"lm_train: --oom_at_step: {len(held) * 64} MiB on {device} and no limit was reached")


def newest_checkpoint(folder):
    if not folder or not os.path.isdir(folder):
        return None
    names = sorted(n for n in os.listdir(folder) if n.startswith("lm-step-") and n.endswith(".pt"))
    return os.path.join(folder, names[-1]) if names else None


def main():
    args = parse_args()
    run = fitrun.init() if fitrun is not None else None
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(name, value)  # started by hand: a group of one
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # NCCL refuses two ranks on one GPU (slices of it): those talk over Gloo, which carries CUDA tensors.
        backend = "nccl" if local_world <= torch.cuda.device_count() else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    probe = os.environ.get("FITRUN_PROBE") == "1"
    max_steps = int(os.environ.get("FITRUN_MAX_STEPS") or args.max_steps)
    checkpoints = "" if probe else os.environ.get("FITRUN_CHECKPOINT_DIR", "")
    attempt = int(os.environ.get("FITRUN_ATTEMPT") or 1)

    torch.manual_seed(args.seed)
    data = corpus(args.data, args.seed)
    windows = (len(data) - 1) // args.context
    if windows < args.batch_size * world:
        sys.exit(f"lm_train: {len(data)} bytes make {windows} windows of {args.context}, fewer than one batch")
    model = LanguageModel(args.layers, args.hidden, args.heads, args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step = 0
    resumed = newest_checkpoint(checkpoints)
    if resumed:
        state = torch.load(resumed, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    use_amp = args.precision != "fp32" and (device.type == "cuda" or args.precision == "bf16")
    amp_dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
    scaler = None
    if args.precision == "fp16" and device.type == "cuda":
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") \
            else torch.cuda.amp.GradScaler()
    accum = max(1, args.grad_accum_steps)
    generator = torch.Generator().manual_seed(args.seed * 1009 + rank)
    if rank == 0:
        print(f"lm_train: {sum(p.numel() for p in model.parameters())} parameters, {args.layers} x {args.hidden}, "
              f"context {args.context}; {world} rank(s) x batch {args.batch_size} x {accum} on {device} "
              f"({backend}, {args.precision}), {max_steps} steps"
              f"{f', resuming at step {step}' if step else ''}{' [memory probe]' if probe else ''}", flush=True)

    def save(at_step):
        if rank != 0 or not checkpoints:
            return
        path = os.path.join(checkpoints, f"lm-step-{at_step:08d}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": at_step}, path + ".tmp")
        os.replace(path + ".tmp", path)

    started, first_done, loss_value, samples = time.time(), step, float("nan"), 0
    while step < max_steps:
        if args.oom_at_step and step + 1 == args.oom_at_step and attempt == 1 and not resumed:
            exhaust(device)
        for micro in range(accum):
            starts = torch.randint(0, windows, (args.batch_size,), generator=generator) * args.context
            rows = starts.unsqueeze(1) + torch.arange(args.context + 1)
            tokens = data[rows].to(device, non_blocking=True)
            sync = contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync()
            with sync:
                with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
                    logits = ddp(tokens[:, :-1])
                    loss = F.cross_entropy(logits.float().reshape(-1, VOCABULARY), tokens[:, 1:].reshape(-1))
                objective = loss / accum
                (scaler.scale(objective) if scaler else objective).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        samples += args.batch_size * accum
        if step == first_done + 1:
            print(f"rank {rank}: first optimizer step done at {time.time():.6f}", flush=True)
        if step % args.log_every == 0 or step == max_steps:
            loss_value = loss.item()
            if run is not None:
                run.report(step, loss=loss_value, samples=samples, total_steps=max_steps)
            samples = 0
            if rank == 0:
                print(f"step {step}/{max_steps} loss {loss_value:.4f}", flush=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < max_steps:
            save(step)
    save(step)
    print(f"rank {rank}: done: {step} steps in {time.time() - started:.2f}s, loss {loss_value:.4f}", flush=True)
    del ddp
    gc.collect()  # DDP first: torch 1.13 tears the group down holding the GIL when DDP drops it last
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
