#!/usr/bin/env python3
"""The built-in gpt and sasrec as PyTorch users write them, in eager mode or under torch.compile, for the
pace the GPU check holds fitrun's own training to (tools/gpu/check.sh, part 7).

A mirror of worker/models/gpt.cc and worker/models/sasrec.cc (with worker/models/attention.cc): the same
layers in the same order, sizes, initialisation (GPT-2's N(0, 0.02) with zero biases; Xavier-normal
with the padding item zeroed), no dropout, the same losses (next-byte cross-entropy; SASRec's binary
cross-entropy of the next item against one negative per position, redrawn up to 4 times while it is one
of the row's own items), the optimizer the spec names with its settings (torch.optim's Adam or AdamW,
betas and eps at their defaults as LibTorch's), autocast in the spec's precision with fp16's loss
scaled (torch.amp.GradScaler), and the same data: the text workload's windows of context + 1 bytes of
the first 90% of the file, or each MovieLens user's items but the held-out last one (worker/data/text.h,
movielens.h), the whole set kept on the device and a shuffled order each epoch. Attention is PyTorch's
scaled_dot_product_attention by default (--attention math: the worker's masked softmax written out).

    python3 pace_reference.py gpt --data corpus.txt --layers 12 --heads 12 --hidden 768 --context 1024 \\
        --batch 32 --precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --mode compile
    python3 pace_reference.py sasrec --data ratings.dat --blocks 3 --heads 4 --hidden 100 --max-len 100 \\
        --batch 1024 --precision fp16 --optimizer adam --lr 0.002
    python3 pace_reference.py peak            # a bf16 matmul's TFLOP/s on this GPU

One process: --warmup steps (torch.compile compiles there), then --repeats timed windows of --steps
steps each, the device synchronised at both ends of a window and nowhere inside it (the loss is read
once a window). Prints one JSON line: samples/s of each window, the model FLOPs of one sample's
training step (forward matmuls x 3: a backward costs two forwards), the parameters, the final loss.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NEGATIVE_REDRAWS = 4  # worker/models/sasrec.cc kNegativeRedraws


def causal_attention(q, k, v, heads, attention):
    """[B, T, H] projections -> [B, T, H], as worker/models/attention.cc."""
    b, t, h = q.shape
    split = [x.view(b, t, heads, h // heads).transpose(1, 2) for x in (q, k, v)]
    if attention == "sdpa":
        mixed = F.scaled_dot_product_attention(*split, is_causal=True)
    else:
        scores = split[0] @ split[1].transpose(-2, -1) / math.sqrt(h // heads)
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        mixed = scores.masked_fill(future, float("-inf")).softmax(-1) @ split[2]
    return mixed.transpose(1, 2).contiguous().view(b, t, h)


class GptBlock(nn.Module):
    def __init__(self, hidden, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_proj = nn.Linear(4 * hidden, hidden)
        for linear in (self.qkv, self.proj, self.fc, self.fc_proj):
            nn.init.normal_(linear.weight, 0.0, 0.02)
            nn.init.zeros_(linear.bias)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, -1)
        h = x + self.proj(causal_attention(q, k, v, self.heads, self.attention))
        return h + self.fc_proj(F.gelu(self.fc(self.ln2(h))))


class Gpt(nn.Module):
    """worker/models/gpt.cc's byte-level language model; forward returns the mean next-byte loss."""

    def __init__(self, layers, heads, hidden, context, attention, vocabulary=256):
        super().__init__()
        self.vocabulary = vocabulary
        self.token_embedding = nn.Embedding(vocabulary, hidden)
        self.position_embedding = nn.Embedding(context, hidden)
        self.blocks = nn.ModuleList(GptBlock(hidden, heads, attention) for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocabulary, bias=False)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.normal_(self.token_embedding.weight, 0.0, 0.02)
        nn.init.normal_(self.position_embedding.weight, 0.0, 0.02)

    def forward(self, inputs, targets):
        tokens = inputs.long()
        x = self.token_embedding(tokens) + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.reshape(-1, self.vocabulary), targets.long().reshape(-1))


class SasRecBlock(nn.Module):
    def __init__(self, hidden, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.attention_norm = nn.LayerNorm(hidden)
        self.query, self.key, self.value, self.out = (nn.Linear(hidden, hidden) for _ in range(4))
        self.forward_norm = nn.LayerNorm(hidden)
        self.conv1, self.conv2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def forward(self, x, keep):
        q = self.attention_norm(x)
        h = q + self.out(causal_attention(self.query(q), self.key(x), self.value(x), self.heads, self.attention))
        h = self.forward_norm(h)
        return (h + self.conv2(F.relu(self.conv1(h)))) * keep


class SasRec(nn.Module):
    """worker/models/sasrec.cc; forward returns the masked mean binary cross-entropy, given the negatives."""

    def __init__(self, num_items, max_len, hidden, blocks, heads, attention):
        super().__init__()
        self.hidden = hidden
        self.item_embedding = nn.Embedding(num_items + 1, hidden, padding_idx=0)
        self.position_embedding = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(SasRecBlock(hidden, heads, attention) for _ in range(blocks))
        self.final_norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.xavier_normal_(p)
            self.item_embedding.weight[0].zero_()

    def forward(self, inputs, positives, negatives):
        items = inputs.long()
        keep = items.ne(0).unsqueeze(-1).float()
        x = self.item_embedding(items) * math.sqrt(self.hidden) + \
            self.position_embedding(torch.arange(items.shape[1], device=items.device))
        x = x * keep
        for block in self.blocks:
            x = block(x, keep)
        features = self.final_norm(x)
        positive = (features * self.item_embedding(positives)).sum(-1)
        negative = (features * self.item_embedding(negatives)).sum(-1)
        real = positives.ne(0).float()
        per_position = F.binary_cross_entropy_with_logits(positive, torch.ones_like(positive), reduction="none") + \
            F.binary_cross_entropy_with_logits(negative, torch.zeros_like(negative), reduction="none")
        return (per_position * real).sum() / real.sum().clamp_min(1)


def sample_negatives(inputs, positives, num_items):
    """One item per position, redrawn while it is one of the row's own items (at most 4 rounds, each
    asking the device whether any collides, as the worker's loss does)."""
    own = torch.cat([inputs, positives], 1).unsqueeze(1)
    negatives = torch.randint(1, num_items + 1, positives.shape, device=positives.device)
    for _ in range(NEGATIVE_REDRAWS):
        collides = negatives.unsqueeze(2).eq(own).any(2)
        if not collides.any().item():
            break
        negatives = torch.where(collides, torch.randint(1, num_items + 1, positives.shape, device=positives.device),
                                negatives)
    return negatives


def text_windows(path, context):
    """worker/data/text.cc's training split: windows of context + 1 bytes, stride context, of the first 90%."""
    with open(path, "rb") as f:
        data = f.read()
    train = torch.frombuffer(bytearray(data[:len(data) * 9 // 10]), dtype=torch.uint8)
    windows = (len(train) - 1) // context
    framed = train.as_strided((windows, context + 1), (context, 1))
    return framed[:, :context].clone(), framed[:, 1:].clone()


def movielens_rows(path, max_len):
    """worker/data/movielens.cc's training split: per user (3+ items, time order, items renumbered by
    ascending id), the items before the last training item and the next item at each position."""
    events = {}
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f):
            fields = line.strip().split("::")
            if len(fields) == 4:
                events.setdefault(int(fields[0]), []).append((int(fields[3]), number, int(fields[1])))
    ids = {item: i + 1 for i, item in enumerate(sorted({e[2] for seq in events.values() for e in seq}))}
    inputs, targets = [], []
    for user in sorted(events):
        items = [ids[e[2]] for e in sorted(events[user])]
        if len(items) < 3:
            continue
        train = items[:-1]
        history, following = train[:-1][-max_len:], train[1:][-max_len:]
        inputs.append([0] * (max_len - len(history)) + history)
        targets.append([0] * (max_len - len(following)) + following)
    return torch.tensor(inputs), torch.tensor(targets), len(ids)


def gpt_flops_per_sample(layers, hidden, context, vocabulary=256):
    """Matmul FLOPs of one sample's training step: per layer 24 T h^2 (qkv, proj, fc, fc_proj) and 4 T^2 h
    (scores and mixing, the whole square as PaLM counts it), the head 2 T h V; times 3."""
    forward = layers * (24 * context * hidden ** 2 + 4 * context ** 2 * hidden) + 2 * context * hidden * vocabulary
    return 3 * forward


def sasrec_flops_per_sample(blocks, hidden, max_len):
    """Per block 12 T h^2 (query, key, value, out, conv1, conv2) and 4 T^2 h; the two logits 4 T h; times 3."""
    forward = blocks * (12 * max_len * hidden ** 2 + 4 * max_len ** 2 * hidden) + 4 * max_len * hidden
    return 3 * forward


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak(args, device):
    """TFLOP/s of one large bf16 matmul, the best of --repeats timings of 10 products each."""
    n = args.size
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        synchronize(device)
        best = max(best, 10 * 2 * n ** 3 / (time.perf_counter() - start))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"what": "bf16 matmul", "n": n, "device": name, "tflops": best / 1e12}


def train(args, device):
    torch.manual_seed(args.seed)
    if args.model == "gpt":
        inputs, targets = text_windows(args.data, args.context)
        model = Gpt(args.layers, args.heads, args.hidden, args.context, args.attention)
        flops = gpt_flops_per_sample(args.layers, args.hidden, args.context)
    else:
        inputs, targets, num_items = movielens_rows(args.data, args.max_len)
        model = SasRec(num_items, args.max_len, args.hidden, args.blocks, args.heads, args.attention)
        flops = sasrec_flops_per_sample(args.blocks, args.hidden, args.max_len)
    if len(inputs) < args.batch:
        sys.exit(f"pace_reference: {len(inputs)} samples, fewer than a batch of {args.batch}")
    inputs, targets = inputs.to(device), targets.to(device)  # the whole set on the device
    model.to(device)
    parameters = sum(p.numel() for p in model.parameters())
    kind = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    optimizer = kind(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step_loss = torch.compile(model, backend=args.compile_backend) if args.mode == "compile" else model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
    generator = torch.Generator(device="cpu")
    order, position, epoch = None, len(inputs), 0

    def next_rows():
        nonlocal order, position, epoch
        if position + args.batch > len(inputs):  # a new epoch: a new order (the worker's sampler's role)
            generator.manual_seed(args.seed * 1_000_003 + epoch)
            order = torch.randperm(len(inputs), generator=generator).to(device)
            position, epoch = 0, epoch + 1
        rows = order[position:position + args.batch]
        position += args.batch
        return rows

    def step():
        rows = next_rows()
        batch_inputs, batch_targets = inputs.index_select(0, rows), targets.index_select(0, rows)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            if args.model == "gpt":
                loss = step_loss(batch_inputs, batch_targets)
            else:
                loss = step_loss(batch_inputs, batch_targets, sample_negatives(batch_inputs, batch_targets, num_items))
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    began = time.perf_counter()
    for _ in range(args.warmup):
        step()
    synchronize(device)
    warmup_seconds = time.perf_counter() - began
    rates, loss = [], None
    for _ in range(args.repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        loss = loss.item()
        synchronize(device)
        rates.append(args.steps * args.batch / (time.perf_counter() - start))
    return {"model": args.model, "mode": args.mode, "compile_backend": args.compile_backend if args.mode == "compile" else "",
            "attention": args.attention, "precision": args.precision, "batch": args.batch, "steps": args.steps,
            "warmup": args.warmup, "warmup_seconds": warmup_seconds, "samples_per_second": rates,
            "flops_per_sample": flops, "parameters": parameters, "final_loss": loss,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["gpt", "sasrec", "peak"])
    parser.add_argument("--data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--attention", choices=["sdpa", "math"], default="sdpa")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    parser.add_argument("--optimizer", choices=["adam", "adamw"], default="adamw")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=8192, help="peak: the matmul's n")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default="", help="also write the result here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.precision == "fp16" and device.type != "cuda":
        sys.exit("pace_reference: fp16 needs a CUDA device (bf16 or fp32 on the CPU), as fitrun's worker")
    if args.model != "peak" and not args.data:
        sys.exit("pace_reference: --data names the text file (gpt) or the ratings file (sasrec)")
    result = measure_peak(args, device) if args.model == "peak" else train(args, device)
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
