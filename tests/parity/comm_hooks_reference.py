"""PyTorch's own DDP communication hooks on fixed gradients, recorded for fitrun's C++ hooks to replay.

Run as `comm_hooks_reference.py --out DIR`: it starts two ranks of itself (Gloo over loopback, a
FileStore in DIR) and each trains nothing: a DistributedDataParallel module whose parameters have
the shapes below receives fixed per-rank, per-step gradients (the backward of sum(p * G)), and every
bucket DDP hands to the hook is recorded as it went in and as the hook left it. For each
configuration and rank, DIR/<config>.rank<r>.txt lists the buckets ("<step> <index> <is_last>
<shape>;<shape>...") and DIR/<config>.rank<r>.f32 holds each bucket's input then output, float32
little-endian. The configurations: PyTorch's fp16_compress_hook; the bf16 hook as fitrun runs it
on Gloo (bf16_compress_hook with its bfloat16 all-reduce done as NCCL's arithmetic: the bfloat16
values summed in float32, rounded to bfloat16, since Gloo in PyTorch 1.13 cannot reduce bfloat16);
powerSGD_hook at rank 1 (Gram-Schmidt) and rank 4 (QR), with error feedback and warm start, over
enough steps that both matter. DIR/numpy.txt holds numpy's RandomState(0).randint(1_000_000_000)
draws, the seeds of PowerSGD's first Qs.
"""
import argparse
import gc
import os
import subprocess
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from torch_ddp_reference import bf16_compress_hook_on_gloo

WORLD = 2
STEPS = 6
# Registration order. A bucket holds (10, 40), (8, 16), (10, 40): PowerSGD takes its matrices
# grouped by shape; (6, 4, 3) is compressed at rank 1 and not at rank 4; vectors and (3, 2) never.
SHAPES = [(32, 20), (20,), (6, 4, 3), (32, 20), (10, 40), (8, 16), (10, 40), (3, 2)]
CONFIGS = {
    "fp16": ("fp16", 0, 0),
    "bf16": ("bf16", 0, 0),
    "powersgd_rank1": ("powersgd", 1, 2),
    "powersgd_rank4": ("powersgd", 4, 3),
}


class Params(nn.Module):
    def __init__(self):
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in SHAPES])

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.params, grads))


def gradients(rank, step):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    # Scales that change from step to step, so error feedback carries real information.
    return [torch.randn(s, generator=generator) * (1 + step % 3) for s in SHAPES]


def run_config(name, rank, out):
    hook_name, matrix_rank, start = CONFIGS[name]
    model = Params()
    # Small buckets, so several buckets (and their per-bucket PowerSGD state) take part.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 3000
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=3000 / (1 << 20))
    records = []
    if hook_name == "fp16":
        hook, state = default_hooks.fp16_compress_hook, None
    elif hook_name == "bf16":
        hook, state = bf16_compress_hook_on_gloo, None
    else:
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                                       start_powerSGD_iter=start)
        hook = powersgd.powerSGD_hook
    step_of = {"step": 0}
    previous = []

    def recording_hook(state, bucket):
        # One bucket at a time: powerSGD_hook issues its later all-reduces from Gloo's completion
        # callbacks, so with several buckets in flight the two ranks can issue collectives in
        # different orders (Gloo aborts). Waiting for the previous bucket changes no number.
        if previous:
            previous.pop().wait()
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        record = [step_of["step"], bucket.index(), bucket.is_last(), shapes, bucket.buffer().clone(), None]
        records.append(record)

        def keep_output(fut):
            # DDP reuses the bucket's buffer next step: the output is copied as the hook leaves it,
            # before DDP sees the result.
            record[5] = fut.value().clone()
            return fut.value()

        fut = hook(state, bucket).then(keep_output)
        previous.append(fut)
        return fut

    ddp.register_comm_hook(state, recording_hook)
    for step in range(STEPS):
        step_of["step"] = step
        ddp(gradients(rank, step)).backward()
    assert all(record[5] is not None for record in records)
    with open(os.path.join(out, f"{name}.rank{rank}.txt"), "w") as manifest, \
            open(os.path.join(out, f"{name}.rank{rank}.f32"), "wb") as values:
        manifest.write(f"{hook_name} {matrix_rank} {start}\n")
        for step, index, is_last, shapes, before, after in records:
            manifest.write(f"{step} {index} {int(is_last)} "
                           + ";".join("x".join(str(d) for d in s) if s else "scalar" for s in shapes) + "\n")
            values.write(before.numpy().astype("<f4").tobytes())
            values.write(after.detach().numpy().astype("<f4").tobytes())
    return ddp


def rank_main(rank, out):
    # Python's collector may run on a Gloo thread inside a hook's callback and tear down an earlier
    # configuration's DDP there, which aborts the process (std::terminate, about 1 run in 4): the
    # modules stay alive until the rank exits, and nothing is collected meanwhile.
    gc.disable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'store')}", rank=rank,
                            world_size=WORLD)
    kept = [run_config(name, rank, out) for name in CONFIGS]
    dist.barrier()
    sys.stdout.flush()
    os._exit(0 if kept else 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, default=-1, help="internal: run one rank")
    args = parser.parse_args()
    if args.rank >= 0:
        rank_main(args.rank, args.out)
        return
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.RandomState(0)
    with open(os.path.join(args.out, "numpy.txt"), "w") as f:
        f.write(" ".join(str(rng.randint(1_000_000_000)) for _ in range(8)) + "\n")
    ranks = [subprocess.Popen([sys.executable, __file__, "--out", args.out, "--rank", str(r)])
             for r in range(WORLD)]
    try:
        codes = [p.wait(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")


if __name__ == "__main__":
    main()
