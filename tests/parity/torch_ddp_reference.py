"""One rank of PyTorch's own DistributedDataParallel training the fitrun builtin models.

Launched with the torchrun environment contract set by hand (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), since Debian's torchrun does not start under Python 3.11. It reads the state a
fitrun-worker wrote with FITRUN_DUMP_INITIAL_STATE (initial parameters and sample order), so both
implementations start from the same weights and see the same samples in the same steps. Rank 0
prints one JSON line with the per-step global losses and its timing.
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # worker/data/fashion_mnist.h


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_train(data_dir):
    with gzip.open(os.path.join(data_dir, "train-images-idx3-ubyte.gz")) as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, 1, rows, cols)
    with gzip.open(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    x = torch.from_numpy(images.copy()).float().div_(255.0).sub_(MEAN).div_(STD)
    return x, torch.from_numpy(labels.astype(np.int64))


def load_initial_parameters(model, dump_dir):
    raw = np.fromfile(os.path.join(dump_dir, "parameters.f32"), dtype="<f4")
    named = dict(model.named_parameters())
    offset = 0
    with open(os.path.join(dump_dir, "parameters.txt")) as manifest, torch.no_grad():
        for line in manifest:
            name, *shape = line.split()
            # LibTorch names Linear/Conv2d parameters exactly as PyTorch does (fc1.weight, ...).
            p = named[name]
            assert list(p.shape) == [int(d) for d in shape], (name, p.shape, shape)
            p.copy_(torch.from_numpy(raw[offset:offset + p.numel()].copy()).view_as(p))
            offset += p.numel()
    assert offset == raw.size, "parameters.f32 has more values than the manifest names"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--dump", required=True)
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="per-rank batch")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--local-loss", action="store_true",
                        help="record this rank's loss without an extra all-reduce (for timing)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    images, labels = load_train(args.data)
    n = labels.numel()
    order = torch.from_numpy(np.fromfile(os.path.join(args.dump, "sample_order.i64"), dtype="<i8").copy())
    epochs = order.numel() // n
    shares = [order[e * n:(e + 1) * n][rank::world][: n // world] for e in range(epochs)]
    steps_per_epoch = n // (args.batch * world)

    model = Mlp() if args.model == "mlp" else Cnn()
    load_initial_parameters(model, args.dump)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)

    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        epoch, in_epoch = divmod(step, steps_per_epoch)
        idx = shares[epoch][in_epoch * args.batch:(in_epoch + 1) * args.batch]
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(images.index_select(0, idx)), labels.index_select(0, idx))
        loss.backward()
        optimizer.step()
        if args.local_loss:
            losses.append(loss.item())
            continue
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"losses": losses, "seconds": seconds,
                          "samples_per_second": args.steps * args.batch * world / seconds}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
