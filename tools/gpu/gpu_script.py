"""A small DDP script for the GPU check (tools/gpu/check.sh): the machine's own PyTorch, over Gloo
(which carries CUDA tensors, so two ranks may share one GPU where NCCL refuses them), reporting
through the fitrun module, checkpointing in the folder it is given. Its GPU is chosen the torchrun
way, torch.cuda.set_device(LOCAL_RANK): fitrun makes the job's GPUs on this node visible in
local-rank order. Two ranks on slices of one GPU see that one GPU."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fitrun

run = fitrun.init()
dist.init_process_group("gloo")
if torch.cuda.is_available():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank if local_rank < torch.cuda.device_count() else 0)
    device = torch.device("cuda", torch.cuda.current_device())
else:
    device = torch.device("cpu")
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(device),
    device_ids=[device.index] if device.type == "cuda" else None)
optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr or 1e-3)
batch = run.per_device_batch or 64
steps = run.max_steps or 20
for step in range(1, steps + 1):
    for _ in range(run.grad_accum_steps):
        x = torch.randn(batch, 1024, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y) / run.grad_accum_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    run.report(step=step, loss=loss.item() * run.grad_accum_steps, samples=batch * run.grad_accum_steps,
               total_steps=steps, metrics={"cuda": float(device.type == "cuda")})
if dist.get_rank() == 0 and os.environ.get("FITRUN_CHECKPOINT_DIR"):
    torch.save(model.module.state_dict(), os.path.join(os.environ["FITRUN_CHECKPOINT_DIR"], "gpu_script.pt"))
print(f"rank {dist.get_rank()}: {steps} steps on {device}, torch {torch.__version__}", file=sys.stderr)
