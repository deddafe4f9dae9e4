#!/usr/bin/env python3
"""Fashion-MNIST MLP (784-512-512-10) with DistributedDataParallel: a plain torchrun script.

Nothing here knows about fitrun. It reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)
and its own flags, as it would on any cluster:

    torchrun --nproc_per_node=2 train.py --batch_size 128 --epochs 1

fitrun runs it unchanged (mnist-ddp.yaml beside it): it sets the same environment and
appends the per-device batch it planned as `--batch_size N` (the spec's script.batch_flag).

On a GPU each process takes LOCAL_RANK's, as torchrun scripts do, and the ranks all-reduce over NCCL
(over Gloo on CPUs, and when ranks share a GPU). The data are the four IDX files of Debian's
dataset-fashion-mnist package, read with gzip and numpy.
"""
import argparse
import contextlib
import gc
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's training-set pixel statistics


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz")
    p.add_argument("--batch_size", type=int, default=64, help="per process")
    p.add_argument("--test_batch_size", type=int, default=0, help="per process (default: --batch_size)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--grad_accum_steps", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--log_every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--save", default="", help="rank 0 saves the trained weights here")
    return p.parse_args()


def read_idx(path):
    """An IDX file (big-endian magic, dimensions, then uint8 data) as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(folder, prefix):
    images = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.copy()).float().div_(255.0).sub_(MEAN).div_(STD)
    return TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


def pick_device():
    """LOCAL_RANK's GPU when there is one (ranks sharing one GPU take it in turn), else the CPU; a rank on
    one of fitrun's virtual CPU devices (FITRUN_DEVICE_KIND=cpu) stays on the CPU."""
    if os.environ.get("FITRUN_DEVICE_KIND") == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


class Mlp(nn.Module):
    """PyTorch's MNIST-example MLP: 784-512-512-10 with ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # Started by torchrun (or fitrun) the environment is set; by hand, a group of one.
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(name, value)
    device = pick_device()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    dist.init_process_group("nccl" if device.type == "cuda" and local_world <= torch.cuda.device_count() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    started = time.time()
    train_set = load_split(args.data, "train")
    test_set = load_split(args.data, "t10k")
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    accum = max(1, args.grad_accum_steps)
    steps_per_epoch = len(loader) // accum
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    model = DDP(Mlp().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if rank == 0:
        print(f"fashion-mnist mlp: {len(train_set)} training images loaded in {time.time() - started:.2f}s; "
              f"{world} process(es) x batch {args.batch_size} x {accum} accumulation, lr {args.lr}, "
              f"{total_steps} steps on {device}", flush=True)

    step, started, running_loss, since_log = 0, time.time(), 0.0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(steps_per_epoch):
            for micro in range(accum):
                images, labels = (t.to(device) for t in next(batches))
                # Only the last micro-batch of a step all-reduces the gradients.
                with model.no_sync() if micro < accum - 1 else contextlib.nullcontext():
                    loss = F.cross_entropy(model(images), labels) / accum
                    loss.backward()
                running_loss += loss.item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            since_log += 1
            if step % args.log_every == 0 or step == total_steps:
                mean_loss = torch.tensor([running_loss / since_log], device=device)
                dist.all_reduce(mean_loss)
                if rank == 0:
                    elapsed = time.time() - started
                    print(f"epoch {epoch + 1} step {step}/{total_steps} loss {mean_loss.item() / world:.4f} "
                          f"({step * args.batch_size * accum * world / elapsed:.0f} samples/s)", flush=True)
                running_loss, since_log = 0.0, 0
            if step == total_steps:
                break
        if step == total_steps:
            break

    # Test accuracy: each process scores its share of the test set; the counts are summed.
    model.eval()
    counts = torch.zeros(2, device=device)
    my_share = Subset(test_set, range(rank, len(test_set), world))  # no padding: each image counted once
    with torch.no_grad():
        for images, labels in DataLoader(my_share, batch_size=args.test_batch_size or args.batch_size):
            images, labels = images.to(device), labels.to(device)
            counts += torch.tensor([(model(images).argmax(dim=1) == labels).sum().item(), len(labels)], device=device)
    dist.all_reduce(counts)
    if rank == 0:
        print(f"trained {step} steps in {time.time() - started:.1f}s; test accuracy {counts[0] / counts[1]:.4f}", flush=True)
        if args.save:
            torch.save(model.module.state_dict(), args.save)
    # DDP goes first: torch 1.13 tears the process group down holding the GIL when DDP's reducer drops
    # the last reference to it, which can deadlock with a Gloo thread; destroy_process_group releases it.
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
