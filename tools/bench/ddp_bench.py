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
      [--comm-hooks none,fp16,bf16,powersgd] (a row per spec.ddp.comm_hook, PyTorch with the same hook;
      PowerSGD compresses from step --powersgd-start-iter + 1, 10 by default, so most steps compress)
      [--epoch-accuracy] (instead: one epoch of deploy/examples/fashion-mnist-mlp.yaml, global batch 256
      on 2 ranks, per hook, and the test accuracy rank 0 reports; fitrun-worker only)

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
# deploy/examples/fashion-mnist-mlp.yaml, for --epoch-accuracy.
EXAMPLE_LR = 0.05
EXAMPLE_SEED = 1
TRAIN_SAMPLES = 60000


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


def ddp_spec(hook, args):
    spec = f"comm_hook: COMM_HOOK_{hook.upper()}"
    if hook == "powersgd":
        spec += f" powersgd_rank: {args.powersgd_rank} powersgd_start_iter: {args.powersgd_start_iter}"
    return spec


def run_worker(worker, model, hook, args, dump, lr, seed, steps, steps_per_epoch=0):
    """A 2-rank fitrun-worker run; returns rank 0's log."""
    os.makedirs(dump, exist_ok=True)
    assignment = os.path.join(dump, "assignment.textproto")
    with open(assignment, "w") as f:
        f.write(f"""
spec {{ model {{ builtin: "{model}" }} data {{ kind: DATA_KIND_FASHION_MNIST path: "{DATA}" }}
  optimizer {{ kind: OPTIMIZER_KIND_SGD lr: {lr} momentum: 0.9 }} seed: {seed} ddp {{ {ddp_spec(hook, args)} }} }}
plan {{ device_ids: "cpu:0" device_ids: "cpu:1" per_device_batch: {PER_RANK_BATCH} grad_accum_steps: 1
  learning_rate: {lr} total_steps: {steps} steps_per_epoch: {steps_per_epoch} }}
cpu_threads: 1 cpu_threads: 1
""")
    return run_ranks([[worker]] * 2, {"FITRUN_ASSIGNMENT": assignment, "FITRUN_DUMP_INITIAL_STATE": dump},
                     timeout=600)[0]


def bench(worker, model, steps, work, hook, args):
    dump = os.path.join(work, f"{model}-{hook}")
    out = run_worker(worker, model, hook, args, dump, LR, 1, steps)
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
               "--local-loss", "--comm-hooks", hook, "--powersgd-rank", str(args.powersgd_rank),
               "--powersgd-start-iter", str(args.powersgd_start_iter)]
    ref_out = run_ranks([ref_cmd] * 2, {}, timeout=600)[0]
    torch_run = json.loads([l for l in ref_out.splitlines() if l.startswith("{")][-1])
    return fitrun, torch_run


def epoch_accuracy(args):
    """One epoch of the example mlp job per hook: test accuracy and loss as rank 0 reports them."""
    steps = TRAIN_SAMPLES // (2 * PER_RANK_BATCH)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for hook in args.comm_hooks.split(","):
            out = run_worker(args.worker, "mlp", hook, args, os.path.join(work, hook), EXAMPLE_LR, EXAMPLE_SEED,
                             steps, steps)
            accuracy = re.search(r"test accuracy ([0-9.]+) \((\d+) of (\d+)\)", out)
            final = re.search(r"final loss ([0-9.eE+-]+)", out)
            exposed = re.search(r"= ([0-9.]+)% of [0-9.]+ s training", out)
            if accuracy is None or final is None:
                sys.exit(f"no test accuracy in the worker's log:\n{out}")
            rows.append((hook, float(accuracy.group(1)), accuracy.group(2), accuracy.group(3), float(final.group(1)),
                         float(exposed.group(1)) if exposed else float("nan")))
            print(f"{hook}: done", file=sys.stderr, flush=True)
    print(f"fashion-mnist-mlp, 1 epoch ({steps} steps), global batch {2 * PER_RANK_BATCH} on 2 ranks, "
          f"SGD lr {EXAMPLE_LR} momentum 0.9, seed {EXAMPLE_SEED}"
          + (f"; powersgd rank {args.powersgd_rank} from step {args.powersgd_start_iter + 1}"
             if "powersgd" in args.comm_hooks else ""))
    print("| comm hook | test accuracy | vs none | final loss | exposed comm |")
    print("| --- | ---: | ---: | ---: | ---: |")
    baseline = dict((r[0], r[1]) for r in rows).get("none")
    for hook, accuracy, correct, total, final, exposed in rows:
        delta = f"{accuracy - baseline:+.4f}" if baseline is not None else "-"
        print(f"| {hook} | {accuracy:.4f} ({correct}/{total}) | {delta} | {final:.4f} | {exposed:.1f}% |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--mlp-steps", type=int, default=200)
    parser.add_argument("--cnn-steps", type=int, default=30)
    parser.add_argument("--worker", default=WORKER)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--comm-hooks", default="none", help="comma-separated none, fp16, bf16, powersgd")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start-iter", type=int, default=10)
    parser.add_argument("--epoch-accuracy", action="store_true")
    args = parser.parse_args()
    if not os.path.exists(args.worker):
        sys.exit("build first: bazel build -c opt //worker:fitrun-worker")
    if args.epoch_accuracy:
        epoch_accuracy(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            for hook in args.comm_hooks.split(","):
                steps = args.mlp_steps if model == "mlp" else args.cnn_steps
                fitrun, torch_run = None, None
                for _ in range(args.repeat):
                    f, t = bench(args.worker, model, steps, work, hook, args)
                    if fitrun is None or f["samples_per_second"] > fitrun["samples_per_second"]:
                        fitrun = f
                    if torch_run is None or t["samples_per_second"] > torch_run["samples_per_second"]:
                        torch_run = t
                rows.append((model, hook, steps, fitrun, torch_run))
                print(f"{model} {hook}: done", file=sys.stderr, flush=True)
    print(f"2 ranks x 1 thread, Gloo on loopback, global batch {2 * PER_RANK_BATCH}, SGD momentum, "
          f"{os.cpu_count()} cores, fastest of {args.repeat} run(s) per side"
          + (f"; powersgd rank {args.powersgd_rank} from step {args.powersgd_start_iter + 1}"
             if "powersgd" in args.comm_hooks else ""))
    print("| model | comm hook | steps | fitrun-worker samples/s | PyTorch DDP samples/s | ratio | fitrun buckets | "
          "fitrun exposed comm |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model, hook, steps, fitrun, torch_run in rows:
        ratio = fitrun["samples_per_second"] / torch_run["samples_per_second"]
        print(f"| {model} | {hook} | {steps} | {fitrun['samples_per_second']:.0f} | "
              f"{torch_run['samples_per_second']:.0f} | {ratio:.2f}x | {fitrun['buckets']} | "
              f"{fitrun['exposed']:.1f}% |")
    for model, hook, _, fitrun, _ in rows:
        print(f"{model} {hook}: fitrun-worker rank 0 step time: {fitrun['step_time']}")


if __name__ == "__main__":
    main()
