#!/usr/bin/env python3
"""A masked-residue protein language model (BERT-style), trained data-parallel with DDP.

A small transformer encoder reads amino-acid tokens; 15% of the residues of every sequence are chosen,
and of those 80% become [MASK], 10% a random amino acid and 10% stay as they are; the model predicts
the original residue at each chosen position. Every 10th sequence of the FASTA file is held out and
the masked-residue accuracy on it is measured after each epoch. On a GPU each process takes LOCAL_RANK's,
as torchrun scripts do, and the ranks all-reduce over NCCL (over Gloo on CPUs, and when ranks share a GPU).

The usual torchrun script, plus the fitrun module for what fitrun plans and watches:

    torchrun --nproc_per_node=2 train.py --epochs 2 --batch_size 8     # by hand
    fitrun submit deploy/examples/scripts/protein/protein.yaml --watch   # fitrun picks devices and batch

Under fitrun, the per-device batch, gradient accumulation, learning rate (already scaled to the global
batch), step limit and checkpoint directory come from the plan (run.*); by hand they come from the flags.
Rank 0 saves a checkpoint every --checkpoint_every steps and at the end; a restarted job resumes from
the latest one, at the same sample of the same epoch even when the new plan has fewer devices.
"""
import argparse
import contextlib
import gc
import gzip
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import fitrun
from fitrun.contract import EXIT_BAD_CONFIGURATION, EXIT_STOPPED  # the exit codes fitrun reads

HERE = os.path.dirname(os.path.abspath(__file__))
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PAD, MASK, UNKNOWN = 0, 1, 2  # UNKNOWN: X, B, Z, U, O and anything else that is not one of the 20
FIRST_RESIDUE = 3
VOCAB = FIRST_RESIDUE + len(AMINO_ACIDS)
IGNORE = -100  # cross_entropy's ignore_index: positions that were not chosen for masking


def parse_args(run):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(HERE, "globins630.fa"),
                   help="FASTA file of protein sequences (.gz too)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max_len", type=int, default=128, help="longer sequences are cropped to a random window")
    p.add_argument("--batch_size", type=int, default=run.per_device_batch or 8, help="sequences per process")
    p.add_argument("--grad_accum_steps", type=int, default=run.grad_accum_steps or 1)
    p.add_argument("--lr", type=float, default=5e-4, help="used unless fitrun sets the learning rate")
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--max_steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--mask_ratio", type=float, default=0.15)
    p.add_argument("--hidden_dim", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=2)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--log_every", type=int, default=5, help="optimizer steps between progress reports")
    p.add_argument("--checkpoint_every", type=int, default=20, help="optimizer steps between checkpoints (0: end only)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def fail(message):
    print(f"protein-mlm: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_CONFIGURATION)


def pick_device():
    """LOCAL_RANK's GPU when there is one (ranks sharing one GPU take it in turn), else the CPU; a rank on
    one of fitrun's virtual CPU devices (FITRUN_DEVICE_KIND=cpu) stays on the CPU."""
    if os.environ.get("FITRUN_DEVICE_KIND") == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def init_distributed(device):
    """torchrun's env:// rendezvous; a single process of its own when started without a launcher. NCCL
    between GPUs, Gloo on CPUs and between ranks that share a GPU (NCCL refuses two ranks on one)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = "nccl" if device.type == "cuda" and local_world <= torch.cuda.device_count() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = os.path.join(tempfile.mkdtemp(prefix="protein-mlm-"), "store")
        dist.init_process_group(backend, init_method="file://" + store, rank=0, world_size=1)


def read_fasta(path):
    opener = gzip.open if path.endswith(".gz") else open
    names, seqs, current = [], [], None
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line.startswith(">"):
                names.append(line[1:].strip())
                current = []
                seqs.append(current)
            elif line and current is not None:
                current.append(line)
    # Alignment files mark inserts in lower case and gaps with '-' or '.': keep the residues only.
    return names, ["".join(c for c in "".join(parts).upper() if c.isalpha()) for parts in seqs]


def encode(seq):
    index = {a: FIRST_RESIDUE + i for i, a in enumerate(AMINO_ACIDS)}
    return torch.tensor([index.get(c, UNKNOWN) for c in seq], dtype=torch.long)


class Masker:
    """Crops, pads and BERT-masks a list of encoded sequences; its generator makes runs repeatable."""

    def __init__(self, max_len, mask_ratio):
        self.max_len, self.mask_ratio = max_len, mask_ratio
        self.generator = torch.Generator()

    def reseed(self, seed):
        self.generator.manual_seed(seed)

    def crop_and_pad(self, seqs):
        tokens = torch.full((len(seqs), self.max_len), PAD, dtype=torch.long)
        for row, seq in enumerate(seqs):
            start = 0
            if len(seq) > self.max_len:
                start = int(torch.randint(len(seq) - self.max_len + 1, (1,), generator=self.generator))
            window = seq[start:start + self.max_len]
            tokens[row, :len(window)] = window
        return tokens

    def mask(self, tokens):
        g = self.generator
        residues = tokens != PAD
        chosen = (torch.rand(tokens.shape, generator=g) < self.mask_ratio) & residues
        for row in torch.nonzero(~chosen.any(dim=1)).flatten().tolist():  # at least one per sequence
            positions = torch.nonzero(residues[row]).flatten()
            chosen[row, positions[torch.randint(len(positions), (1,), generator=g)]] = True
        labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE))
        roll = torch.rand(tokens.shape, generator=g)
        inputs = tokens.clone()
        inputs[chosen & (roll < 0.8)] = MASK
        replace = chosen & (roll >= 0.8) & (roll < 0.9)
        inputs[replace] = torch.randint(FIRST_RESIDUE, VOCAB, (int(replace.sum()),), generator=g)
        return inputs, labels

    def __call__(self, seqs):  # the DataLoader's collate_fn
        return self.mask(self.crop_and_pad(seqs))


class ProteinMLM(nn.Module):
    def __init__(self, max_len, dim, layers, heads, dropout):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.positions = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, inputs):
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.tokens(inputs) + self.positions(positions)
        x = self.encoder(x, src_key_padding_mask=inputs == PAD)
        return self.head(self.norm(x))


def masked_stats(logits, labels):
    """Summed cross-entropy, correct predictions and count over the masked positions."""
    flat_logits, flat_labels = logits.reshape(-1, VOCAB), labels.reshape(-1)
    loss_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE, reduction="sum")
    chosen = flat_labels != IGNORE
    correct = (flat_logits.argmax(dim=1)[chosen] == flat_labels[chosen]).sum()
    return loss_sum, correct, chosen.sum()


@torch.no_grad()
def evaluate(model, val_batches, device):
    """Masked-residue loss and accuracy over the held-out set, each rank a share, summed over ranks."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for inputs, labels in val_batches:
        loss_sum, correct, count = masked_stats(model(inputs.to(device)), labels.to(device))
        totals += torch.tensor([loss_sum.item(), correct.item(), count.item()], dtype=torch.float64, device=device)
    model.train()
    dist.all_reduce(totals)
    return totals[0].item() / max(totals[2].item(), 1), totals[1].item() / max(totals[2].item(), 1)


def train(run, args, device):
    """Trains (or resumes) to the end or to a stop request; returns the exit code."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)

    if not os.path.exists(args.data):
        fail(f"no FASTA file {args.data}")
    _, seqs = read_fasta(args.data)
    if len(seqs) < 20:
        fail(f"{args.data}: {len(seqs)} sequences; need at least 20")
    encoded = [encode(s) for s in seqs]
    train_set = [s for i, s in enumerate(encoded) if i % 10 != 0]
    val_set = [s for i, s in enumerate(encoded) if i % 10 == 0]

    batch, accum = args.batch_size, max(1, args.grad_accum_steps)
    lr = run.lr if run.lr is not None else args.lr
    max_steps = run.max_steps or args.max_steps or None
    global_batch = batch * accum * world
    steps_per_epoch = len(train_set) // global_batch
    if steps_per_epoch == 0:
        fail(f"{len(train_set)} training sequences are fewer than one global batch of {global_batch}")
    total_steps = steps_per_epoch * args.epochs
    if max_steps:
        total_steps = min(total_steps, max_steps) if not run.probe else max_steps

    masker = Masker(args.max_len, args.mask_ratio)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler, collate_fn=masker)

    model = ProteinMLM(args.max_len, args.hidden_dim, args.num_layers, args.num_heads, args.dropout)
    model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=lr, weight_decay=args.weight_decay)
    # The plan's strategy, where the spec lets fitrun choose one (script.applies_strategy): the encoder
    # layers recomputed in backward, the AdamW states sharded over the ranks. Unchanged otherwise.
    ddp, optimizer = run.apply_strategy(ddp, optimizer)

    step, epoch, samples_in_epoch = 0, 0, 0
    if not run.probe:
        state, saved_step = run.load_latest_checkpoint()
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            for group in optimizer.param_groups:
                group["lr"] = lr  # this attempt's plan may scale it differently
            step, epoch, samples_in_epoch = saved_step, state["epoch"], state["samples_in_epoch"]

    def save(at_step, at_epoch, at_samples):
        run.save_checkpoint({"model": model.state_dict(), "optimizer": run.optimizer_state_dict(optimizer),
                             "epoch": at_epoch, "samples_in_epoch": at_samples, "args": vars(args)}, at_step)

    if rank == 0:
        print(f"protein-mlm: {len(train_set)} training and {len(val_set)} held-out sequences from {args.data}; "
              f"{world} rank(s) x batch {batch} x {accum} accumulation = {global_batch} per step, lr {lr:g}, "
              f"{total_steps} steps on {device}{f' (resuming at step {step})' if step else ''}"
              f"{' [memory probe]' if run.probe else ''}", flush=True)

    # The held-out set is masked once, the same way on every rank, and split between the ranks.
    val_masker = Masker(args.max_len, args.mask_ratio)
    val_masker.reseed(args.seed + 7919)
    val_inputs, val_labels = val_masker(val_set)
    # Evaluated in batches of the training batch, so that the whole run's memory follows the plan's
    # batch: a fixed, larger evaluation batch would set the peak whatever batch fitrun chose.
    mine = torch.arange(rank, len(val_set), world)
    val_batches = [(val_inputs[mine[i:i + batch]], val_labels[mine[i:i + batch]]) for i in range(0, len(mine), batch)]

    stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, masked positions since the last report
    samples_since_report, start = 0, time.time()
    epoch_samples = steps_per_epoch * global_batch
    evaluated = None  # (step, held-out loss, held-out accuracy) of the last evaluation
    loss = None  # the training loss last reported
    step_epoch = epoch + 1 if samples_in_epoch else max(epoch, 1)  # the epoch the last step belongs to
    while step < total_steps:
        sampler.set_epoch(epoch)
        masker.reseed(args.seed * 1_000_003 + epoch * 1009 + rank)
        batches = iter(loader)
        # Resuming mid-epoch: the global batch is the plan's invariant, so the samples already used are
        # the first samples_in_epoch of this epoch's order whatever the number of ranks now.
        for _ in range(samples_in_epoch // (batch * world)):
            next(batches)
        while samples_in_epoch + global_batch <= epoch_samples and step < total_steps:
            for micro in range(accum):
                inputs, labels = (t.to(device) for t in next(batches))
                sync = contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync()
                with sync:
                    loss_sum, correct, count = masked_stats(ddp(inputs), labels)
                    (loss_sum / count.clamp(min=1) / accum).backward()
                stats += torch.tensor([loss_sum.item(), correct.item(), count.item()], dtype=torch.float64,
                                      device=device)
                samples_since_report += inputs.shape[0]
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            samples_in_epoch += global_batch
            step_epoch = epoch + 1

            if step % args.log_every == 0 or step == total_steps:
                dist.all_reduce(stats)  # the loss and accuracy of every rank's masked residues
                loss, accuracy = stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()
                run.report(step, loss=loss, samples=samples_since_report, total_steps=total_steps,
                           epoch=step_epoch, metrics={"masked_accuracy": accuracy})
                if rank == 0:
                    print(f"step {step}/{total_steps} epoch {step_epoch} loss {loss:.4f} "
                          f"masked accuracy {accuracy:.3f}", flush=True)
                stats.zero_()
                samples_since_report = 0
            if not run.probe and args.checkpoint_every and step % args.checkpoint_every == 0 and step < total_steps:
                save(step, epoch, samples_in_epoch)

            # A stop request reaches each rank on its own; they agree on it so none waits in a collective.
            stop = torch.tensor([1.0 if run.should_stop() else 0.0], device=device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                save(step, epoch, samples_in_epoch)
                if rank == 0:
                    print(f"stopping at step {step} as asked; checkpoint saved", flush=True)
                return EXIT_STOPPED
        if samples_in_epoch + global_batch > epoch_samples:  # the epoch is done
            epoch, samples_in_epoch = epoch + 1, 0
            if not run.probe:
                evaluated = (step,) + evaluate(model, val_batches, device)
                if rank == 0:
                    print(f"epoch {epoch}: held-out loss {evaluated[1]:.4f}, "
                          f"masked accuracy {evaluated[2]:.3f}", flush=True)

    if run.probe:
        # One evaluation batch, so that fitrund's memory probe measures what a real run does.
        evaluate(model, val_batches[:1], device)
    else:
        if evaluated is None or evaluated[0] != step:
            evaluated = (step,) + evaluate(model, val_batches, device)
        _, val_loss, val_accuracy = evaluated
        save(step, epoch, samples_in_epoch)
        if rank == 0:
            run.report(step, loss=loss, total_steps=total_steps, epoch=step_epoch,
                       metrics={"val_loss": val_loss, "val_masked_accuracy": val_accuracy})
            print(f"done: {step} steps in {time.time() - start:.1f}s; held-out loss {val_loss:.4f}, "
                  f"masked accuracy {val_accuracy:.3f}", flush=True)
    return 0


def main():
    run = fitrun.init()
    args = parse_args(run)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = pick_device()
    init_distributed(device)
    code = train(run, args, device)
    # train's DistributedDataParallel is gone by now, so the process group is torn down here, with the
    # GIL released. Left to DDP's reducer (when it holds the last reference) torch 1.13 tears the group
    # down holding the GIL, which can deadlock with a Gloo thread freeing a collective's tensor.
    gc.collect()
    dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
