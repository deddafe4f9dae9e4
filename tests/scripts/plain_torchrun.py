"""A plain torchrun script, no fitrun import: it must run under fitrun as it runs under torchrun."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, required=True)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    loss = model(torch.randn(args.batch_size, 32)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {dist.get_rank()} step {step + 1} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
