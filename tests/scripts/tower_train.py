"""A DDP script whose activations dwarf its weights (a tower of cheap blocks over a long sequence), that
takes fitrun's strategy with run.apply_strategy: for the script-job tests of recomputing and sharding.
Each rank prints the strategy it applied; --oom_at_step runs out of memory once, on attempt --oom_on_attempt
(1 unless given)."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fitrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--length", type=int, default=65536, help="positions per sample")
parser.add_argument("--width", type=int, default=16)
parser.add_argument("--depth", type=int, default=40)
parser.add_argument("--oom_at_step", type=int, default=0)
parser.add_argument("--oom_on_attempt", type=int, default=1)
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mix = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.mix(x)
        return x + torch.tanh(h) * torch.sigmoid(h)


class Tower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(args.width) for _ in range(args.depth))
        self.head = torch.nn.Linear(args.width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(dim=(1, 2))


run = fitrun.init()
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
batch = run.per_device_batch or 1
model = DistributedDataParallel(Tower())
optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr or 1e-3)
model, optimizer = run.apply_strategy(model, optimizer)
print(f"rank {dist.get_rank()}: batch {batch} x {run.grad_accum_steps}, activation checkpointing "
      f"{run.activation_checkpointing}, optimizer {type(optimizer).__name__}", flush=True)
state, start = run.load_latest_checkpoint()
if state is not None:
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    run.log(f"resumed from the checkpoint of step {start}")

generator = torch.Generator().manual_seed(dist.get_rank())
for step in range(start + 1, (run.max_steps or args.steps) + 1):
    if args.oom_at_step == step and run.attempt == args.oom_on_attempt and not run.probe:
        memory = run.memory()
        torch.empty(memory["cap"] - memory["live"] + (1 << 20), dtype=torch.uint8)
    optimizer.zero_grad()
    for _ in range(run.grad_accum_steps):
        x = torch.randn(batch, args.length, args.width, generator=generator)
        loss = model(x).square().mean() / run.grad_accum_steps
        loss.backward()
    optimizer.step()
    run.report(step=step, loss=loss.item() * run.grad_accum_steps, samples=batch * run.grad_accum_steps)
    # Every rank gathers a sharded optimizer's states; rank 0 writes them.
    run.save_checkpoint({"model": model.module.state_dict(), "optimizer": run.optimizer_state_dict(optimizer)}, step)
    if run.should_stop():
        break
dist.destroy_process_group()
