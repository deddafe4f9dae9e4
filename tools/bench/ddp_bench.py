#!/usr/bin/python3
"""fitrun-worker vs PyTorch's DistributedDataParallel on this machine, in one run.

Same model, data (Fashion-MNIST), initial weights, sample order, global batch (256 = 2 ranks x 128),
optimizer (SGD, momentum 0.9), one compute thread per rank, Gloo over loopback. Prints samples/s of
both, their ratio, and fitrun's exposed communication (time blocked in the final wait for the gradient
buckets / training time). A program that prints figures, not a test: nothing is asserted.

Usage (from the repository root):
  bazel build -c opt //worker:fitrun-worker && /usr/bin/python3 tools/bench/ddp_bench.py [--models mlp,cnn]
      [--worker PATH] (another fitrun-worker binary, e.g. a copy of an earlier build, to compare)
      [--repeat N] (alternate the two sides N times and keep each side's fastest run: other processes on
      the machine only ever slow a run down, so the fastest is the least disturbed)

Also prints where fitrun-worker's step time went (rank 0's `step time:` line): batch assembly,
forward, backward (with the reducer's hooks), synchronize (the exposed all-reduce wait) and optimizer.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The -c opt output itself: bazel-bin follows whichever configuration the tree's last build used.
WORKER = os.path.join(ROOT, "bazel-out", "k8-opt", "bin", "worker", "fitrun-worker")
REFERENCE = os.path.join(ROOT, "tests", "parity", "torch_ddp_reference.py")
DATA = "/usr/share/datasets/fashion-mnist"
PER_RANK_BATCH = 128
LR = 0.02


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(commands, env_extra, timeout):
    port = free_port()
    procs = []
    try:
        for rank, cmd in enumerate(commands):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), **env_extra)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            sys.exit(f"a rank failed:\n{out}")
    return outputs


def bench(worker, model, steps, work):
    dump = os.path.join(work, model)
    os.makedirs(dump, exist_ok=True)
    assignment = os.path.join(dump, "assignment.textproto")
    with open(assignment, "w") as f:
        f.write(f"""
spec {{ model {{ builtin: "{model}" }} data {{ kind: DATA_KIND_FASHION_MNIST path: "{DATA}" }}
  optimizer {{ kind: OPTIMIZER_KIND_SGD lr: {LR} momentum: 0.9 }} seed: 1 }}
plan {{ device_ids: "cpu:0" device_ids: "cpu:1" per_device_batch: {PER_RANK_BATCH} grad_accum_steps: 1
  learning_rate: {LR} total_steps: {steps} }}
cpu_threads: 1 cpu_threads: 1
""")
    out = run_ranks([[worker]] * 2, {"FITRUN_ASSIGNMENT": assignment, "FITRUN_DUMP_INITIAL_STATE": dump},
                    timeout=600)[0]
    comm = re.search(r"communication: (\d+) buckets, exposed all-reduce wait ([0-9.]+) s over (\d+) steps = "
                     r"([0-9.]+)% of ([0-9.]+) s training; ([0-9.]+) samples/s", out)
    if comm is None:
        sys.exit(f"no communication line in the worker's log:\n{out}")
    fitrun = {"buckets": int(comm.group(1)), "exposed": float(comm.group(4)),
              "seconds": float(comm.group(5)), "samples_per_second": float(comm.group(6))}
    breakdown = re.search(r"step time: (.*) of [0-9.]+ s training", out)
    fitrun["step_time"] = breakdown.group(1) if breakdown else "(not logged by this worker)"

    ref_cmd = ["/usr/bin/python3", REFERENCE, "--data", DATA, "--dump", dump, "--model", model, "--steps",
               str(steps), "--batch", str(PER_RANK_BATCH), "--lr", str(LR), "--momentum", "0.9",
               "--local-loss"]
    ref_out = run_ranks([ref_cmd] * 2, {}, timeout=600)[0]
    torch_run = json.loads([l for l in ref_out.splitlines() if l.startswith("{")][-1])
    return fitrun, torch_run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--mlp-steps", type=int, default=200)
    parser.add_argument("--cnn-steps", type=int, default=30)
    parser.add_argument("--worker", default=WORKER)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if not os.path.exists(args.worker):
        sys.exit("build first: bazel build -c opt //worker:fitrun-worker")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            steps = args.mlp_steps if model == "mlp" else args.cnn_steps
            fitrun, torch_run = None, None
            for _ in range(args.repeat):
                f, t = bench(args.worker, model, steps, work)
                if fitrun is None or f["samples_per_second"] > fitrun["samples_per_second"]:
                    fitrun = f
                if torch_run is None or t["samples_per_second"] > torch_run["samples_per_second"]:
                    torch_run = t
            rows.append((model, steps, fitrun, torch_run))
            print(f"{model}: done", file=sys.stderr, flush=True)
    print(f"2 ranks x 1 thread, Gloo on loopback, global batch {2 * PER_RANK_BATCH}, SGD momentum, "
          f"{os.cpu_count()} cores, fastest of {args.repeat} run(s) per side")
    print("| model | steps | fitrun-worker samples/s | PyTorch DDP samples/s | ratio | fitrun buckets | "
          "fitrun exposed comm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model, steps, fitrun, torch_run in rows:
        ratio = fitrun["samples_per_second"] / torch_run["samples_per_second"]
        print(f"| {model} | {steps} | {fitrun['samples_per_second']:.0f} | {torch_run['samples_per_second']:.0f} | "
              f"{ratio:.2f}x | {fitrun['buckets']} | {fitrun['exposed']:.1f}% |")
    for model, _, fitrun, _ in rows:
        print(f"{model}: fitrun-worker rank 0 step time: {fitrun['step_time']}")


if __name__ == "__main__":
    main()
