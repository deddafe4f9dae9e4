"""One rank of PyTorch's own DistributedDataParallel training the fitrun builtin models.

Launched with the torchrun environment contract set by hand (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), since Debian's torchrun does not start under Python 3.11. It reads the state a
fitrun-worker wrote with FITRUN_DUMP_INITIAL_STATE (initial parameters and sample order), so both
implementations start from the same weights and see the same samples in the same steps. Rank 0
prints one JSON line per communication hook (--comm-hooks none,fp16,...: one run each, from the same
initial state) with the per-step global losses, its timing and DDP's buckets (after DDP rebuilt them
in the order the first step's gradients were ready), by parameter name.
"""
import argparse
import gc
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

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
    """fitrun's cnn as PyTorch's examples/mnist writes it (`matched=False`), or with the layout the
    built-in model computes in (worker/models/model.cc, `matched=True`): the images channels-last,
    oneDNN's own layout, and the pooling before the second ReLU (the same values and gradients, on a
    quarter of the elements). The parameters keep PyTorch's layout either way."""

    def __init__(self, matched=False):
        super().__init__()
        self.matched = matched
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        if not self.matched:
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.fc2(F.relu(self.fc1(x.flatten(1))))
        if x.device.type == "cpu":
            # Set by strides: a one-channel image counts as contiguous either way, so
            # x.contiguous(memory_format=torch.channels_last) would keep it NCHW.
            x = torch.empty(x.shape, dtype=x.dtype, memory_format=torch.channels_last).copy_(x)
        x = F.relu(self.conv1(x))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_model(name, layout="plain"):
    """fitrun's built-in `name` ("mlp" or "cnn") in `layout`: "plain" as PyTorch users write it,
    "matched" as the built-in model computes (only the cnn differs)."""
    return Mlp() if name == "mlp" else Cnn(matched=layout == "matched")



def bf16_compress_hook_on_gloo(process_group, bucket):
    """default_hooks.bf16_compress_hook, its bfloat16 all-reduce replaced by the same arithmetic.

    Gloo in PyTorch 1.13 cannot reduce bfloat16 ("Invalid scalar type"), so PyTorch's own hook fails
    on CPU devices. NCCL's bfloat16 sum adds in float32 and rounds to bfloat16; for bfloat16 values
    the float32 all-reduce below followed by one rounding is the same number at 2 ranks. fitrun's bf16
    hook computes it so on Gloo (worker/ddp/compress_hooks.h).
    """
    group_to_use = process_group if process_group is not None else dist.group.WORLD
    world_size = group_to_use.size()
    compressed_tensor = bucket.buffer().to(torch.bfloat16).div_(world_size)
    widened = compressed_tensor.float()
    fut = dist.all_reduce(widened, group=group_to_use, async_op=True).get_future()

    def decompress(fut):
        decompressed_tensor = bucket.buffer()
        decompressed_tensor.copy_(fut.value()[0].to(torch.bfloat16))
        return decompressed_tensor

    return fut.then(decompress)


def one_bucket_at_a_time(hook):
    """`hook`, each bucket's call waiting until the previous bucket's reduction is done.

    powerSGD_hook issues its second and third all-reduce from Gloo's completion callbacks, so with
    two buckets in flight the ranks can issue collectives in different orders, and Gloo aborts
    (`op.preamble.length <= op.nbytes`, seen on the mlp). Serializing the buckets changes no number.
    """
    previous = []

    def serialized(state, bucket):
        if previous:
            previous.pop().wait()
        fut = hook(state, bucket)
        previous.append(fut)
        return fut

    return serialized


def register_comm_hook(ddp, name, powersgd_rank, powersgd_start_iter):
    """fitrun's spec.ddp.comm_hook values as PyTorch hooks ("none": DDP's own all-reduce)."""
    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, bf16_compress_hook_on_gloo)
    elif name == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                       start_powerSGD_iter=powersgd_start_iter)
        ddp.register_comm_hook(state, one_bucket_at_a_time(powersgd.powerSGD_hook))
    elif name != "none":
        raise ValueError(f"unknown comm hook {name}")


def bucket_layout(ddp, model):
    """DDP's current buckets, by parameter name, in bucket order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def load(data_dir, split="train"):
    """One split of Fashion-MNIST (`train` or `t10k`), normalized as the worker does."""
    with gzip.open(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz")) as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, 1, rows, cols)
    with gzip.open(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")) as f:
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
    parser.add_argument("--layout", choices=["plain", "matched"], default="plain",
                        help="the cnn as PyTorch's example writes it, or in the built-in model's layout")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="per-rank batch")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--local-loss", action="store_true",
                        help="record this rank's loss without an extra all-reduce (for timing)")
    parser.add_argument("--comm-hooks", default="none",
                        help="comma-separated none, fp16, bf16, powersgd: one run each")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start-iter", type=int, default=1000)
    args = parser.parse_args()
    # Hooks' callbacks run Python on Gloo's threads; a collection there may tear down an earlier
    # run's DDP, which aborts the process. Every run's objects stay alive until the end instead.
    gc.disable()

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    images, labels = load(args.data)
    n = labels.numel()
    order = torch.from_numpy(np.fromfile(os.path.join(args.dump, "sample_order.i64"), dtype="<i8").copy())
    epochs = order.numel() // n
    shares = [order[e * n:(e + 1) * n][rank::world][: n // world] for e in range(epochs)]
    steps_per_epoch = n // (args.batch * world)

    kept = []
    for hook in args.comm_hooks.split(","):
        kept.append(train(args, hook, rank, world, images, labels, shares, steps_per_epoch))
    dist.destroy_process_group()


def train(args, hook, rank, world, images, labels, shares, steps_per_epoch):
    model = make_model(args.model, args.layout)
    load_initial_parameters(model, args.dump)
    ddp = nn.parallel.DistributedDataParallel(model)
    register_comm_hook(ddp, hook, args.powersgd_rank, args.powersgd_start_iter)
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
        print(json.dumps({"comm_hook": hook, "losses": losses, "seconds": seconds,
                          "samples_per_second": args.steps * args.batch * world / seconds,
                          "buckets": bucket_layout(ddp, model)}), flush=True)
    return ddp


if __name__ == "__main__":
    main()
