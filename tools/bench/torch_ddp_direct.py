"""The job of deploy/examples/fashion-mnist-{mlp,cnn}.yaml written as a PyTorch user writes it without
fitrun: one DDP process per rank over Gloo, started directly (the torchrun contract set by hand:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Debian's torchrun does not start under Python 3.11), one
compute thread per rank (what torchrun sets with more than one process per node). It reads the
Fashion-MNIST gz files, trains one epoch (global batch 256, SGD with momentum 0.9, lr 0.05), saves a
checkpoint and evaluates on the test split on rank 0, as a fitrun job does. With --device cuda (the GPU
check, tools/gpu/check.sh) each rank takes its LOCAL_RANK's GPU and all-reduces over NCCL, the dataset
on the GPU; --max-steps past one epoch goes on into the next.

Rank 0 prints `first step done` right after its first optimizer step, then one JSON line with its
training seconds, samples/s and test accuracy; with --print-phases, before those, `phase NAME SECONDS` as
each phase of its start ends (imported: from the process's fork to `import torch` done; joined: the
process group and DDP's broadcast; data: reading the training split). tools/bench/time_to_train.py and
tools/bench/launch_phases.py start it.
"""
import argparse
import json
import os
import sys
import time


def since_fork():
    """Seconds since the kernel started this process (/proc/self/stat's starttime, clock ticks since boot)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


import torch  # noqa: E402  after since_fork, which times it
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
from torch_ddp_reference import load, make_model  # noqa: E402  fitrun's two models, its normalization


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--layout", choices=["plain", "matched"], default="plain",
                        help="the cnn as PyTorch's example writes it, or in fitrun's built-in layout")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: one epoch)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--print-phases", action="store_true")
    args = parser.parse_args()
    imported = since_fork()

    def phase(name, seconds):
        if args.print_phases and int(os.environ["RANK"]) == 0:
            print(f"phase {name} {seconds:.4f}", flush=True)

    phase("imported", imported)
    torch.set_num_threads(1)
    torch.manual_seed(1)
    began = time.perf_counter()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(make_model(args.model, args.layout).to(device),
                                                      device_ids=[device.index] if device.type == "cuda" else None)
    phase("joined", time.perf_counter() - began)
    began = time.perf_counter()
    images, labels = load(args.data, "train")
    images, labels = images.to(device), labels.to(device)
    phase("data", time.perf_counter() - began)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(images, labels), seed=1)
    batch = args.global_batch // world
    order = torch.tensor(list(iter(sampler)), device=device)
    steps_per_epoch = len(order) // batch
    steps = args.max_steps if args.max_steps > 0 else steps_per_epoch

    start = time.perf_counter()
    for step in range(steps):
        if step > 0 and step % steps_per_epoch == 0:
            sampler.set_epoch(step // steps_per_epoch)
            order = torch.tensor(list(iter(sampler)), device=device)
        i = step % steps_per_epoch
        idx = order[i * batch:(i + 1) * batch]
        optimizer.zero_grad()
        F.cross_entropy(model(images.index_select(0, idx)), labels.index_select(0, idx)).backward()
        optimizer.step()
        if step == 0 and rank == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            print("first step done", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    result = {"train_seconds": seconds, "samples_per_second": steps * batch * world / seconds}
    if rank == 0:
        tmp = args.checkpoint + ".tmp"
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        os.replace(tmp, args.checkpoint)
        test_x, test_y = (t.to(device) for t in load(args.data, "t10k"))
        model.eval()
        with torch.no_grad():
            correct = sum(int((model.module(test_x[i:i + batch]).argmax(1) == test_y[i:i + batch]).sum())
                          for i in range(0, len(test_y), batch))
        result["test_accuracy"] = correct / len(test_y)
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
