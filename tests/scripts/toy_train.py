"""A small DDP training script for fitrun's script-job tests: real ranks, real Gloo, behaviours chosen
by flags (fail, ignore the batch, run out of memory once, run slowly) so each test asks for its own."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fitrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch_size", type=int, default=8, help="per-process batch when fitrun does not set one")
parser.add_argument("--ignore_fitrun_batch", action="store_true", help="always use --batch_size")
parser.add_argument("--fail", action="store_true", help="exit 1 at the first training step, every attempt (not in the probe)")
parser.add_argument("--oom_at_step", type=int, default=0, help="on attempt 1, allocate past the device's cap here")
parser.add_argument("--step_seconds", type=float, default=0.0)
parser.add_argument("--own_checkpoints", action="store_true",
                    help="save to $FITRUN_CHECKPOINT_DIR itself each step, as a torchrun script saves to a given folder")
parser.add_argument("--leave_daemon", default="",
                    help="rank 0 starts a daemon (setsid, its parent gone) that outlives the script; its pid goes here")
parser.add_argument("--host_hog_mib", type=int, default=0,
                    help="rank 0, on attempt 1, fills this much host memory (outside torch) at --host_hog_at_step")
parser.add_argument("--host_hog_at_step", type=int, default=2)
parser.add_argument("--start_delay", type=float, default=0.0,
                    help="seconds to wait before joining the process group (not in the probe)")
args = parser.parse_args()
own_checkpoints = os.environ["FITRUN_CHECKPOINT_DIR"] if args.own_checkpoints else None

run = fitrun.init()
torch.manual_seed(0)
torch.set_num_threads(1)
if args.start_delay and not run.probe:
    time.sleep(args.start_delay)
dist.init_process_group("gloo")
if args.leave_daemon and dist.get_rank() == 0 and not run.probe:
    import subprocess
    subprocess.run(["/usr/bin/setsid", "/bin/sh", "-c",
                    f"sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {args.leave_daemon}"], check=True)
batch = args.batch_size if args.ignore_fitrun_batch else (run.per_device_batch or args.batch_size)
steps = run.max_steps or args.steps

model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=run.lr or 1e-3)
state, start = run.load_latest_checkpoint()
if state is not None:
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"resumed from the checkpoint of step {start}", flush=True)
    run.log(f"resumed from the checkpoint of step {start}")

for step in range(start + 1, steps + 1):
    if args.fail and not run.probe:
        print("toy_train: failing on purpose (--fail)", file=sys.stderr, flush=True)
        sys.exit(1)
    if args.oom_at_step == step and run.attempt <= 1 and not run.probe:
        # Just past the device's cap: the preloaded allocator refuses it as a full GPU would.
        memory = run.memory()
        torch.empty(memory["cap"] - memory["live"] + (1 << 20), dtype=torch.uint8)
    if (args.host_hog_mib and step == args.host_hog_at_step and run.attempt <= 1 and not run.probe and
            dist.get_rank() == 0):
        print(f"filling {args.host_hog_mib} MiB of host memory", flush=True)
        hog = b"\x01" * (args.host_hog_mib << 20)
    optimizer.zero_grad()
    for micro in range(run.grad_accum_steps):
        x = torch.randn(batch, 256)
        y = torch.randint(0, 10, (batch,))
        loss = torch.nn.functional.cross_entropy(model(x), y) / run.grad_accum_steps
        loss.backward()
    optimizer.step()
    time.sleep(args.step_seconds)
    run.report(step=step, loss=loss.item() * run.grad_accum_steps, samples=batch * run.grad_accum_steps,
               total_steps=steps, metrics={"batch": batch})
    run.save_checkpoint({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, step)
    if own_checkpoints and dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict()}, os.path.join(own_checkpoints, "own.pt"))
    if run.should_stop():
        break
dist.destroy_process_group()
