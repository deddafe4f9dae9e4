#!/usr/bin/python3
"""Time to train: `fitrun submit --watch` against PyTorch DDP launched directly, in one run.

For deploy/examples/fashion-mnist-mlp.yaml and fashion-mnist-cnn.yaml (one epoch, global batch 256, two
ranks on this machine's two virtual CPU devices) it measures, in each round and in this order:
  - fitrun, first submit: a fresh fitrund (empty state directory: no calibration, no dataset cache)
    already serving; from starting `fitrun submit SPEC --watch` to its exit at SUCCEEDED;
  - fitrun, second submit of the same spec to the same fitrund (a model seen before);
    both with the ranks' sums through shared memory, and again over Gloo on loopback (fitrund and so
    its ranks run with FITRUN_ALL_REDUCE=gloo), as PyTorch's ranks sum;
  - PyTorch: tools/bench/torch_ddp_direct.py, the same job as a user's script, two processes started
    directly; from their start to both exiting; the model as PyTorch's example writes it ("as
    written") and in the built-in model's layout with glibc keeping freed blocks ("matched", see
    ddp_bench.py).
Both sides' clocks start when this program starts the command (`fitrun submit`, or the two PyTorch
processes) and stop when it reads the line that says so: the first step is the watch's `step 1/` line
(fitrun's rank 0 reports its first step through fitrund) or rank 0's own `first step done`, printed
after its first optimizer step. fitrund itself is started before the clock, as a service is. samples/s:
rank 0's own figure over its training loop. For each fitrun submit it also prints where the time
before the first step and after the last went, from the arrival times of the watch's lines.

A program that prints figures, not a test: nothing is asserted. Usage (from the repository root):
  bazel build -c opt //server:fitrund //worker:fitrun-worker //client:fitrun
  /usr/bin/python3 tools/bench/time_to_train.py [--runs 3] [--models mlp,cnn]
      [--all-reduce shared-memory,gloo] [--reference plain,matched] [--bin DIR]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The -c opt outputs themselves by default: bazel-bin follows whichever configuration the tree's last
# build used. --bin names another (bazel-bin after a plain `bazel build`, which .bazelrc also builds at -O2).
BIN = os.path.join(ROOT, "bazel-out", "k8-opt", "bin")
SPECS = {m: os.path.join(ROOT, "deploy", "examples", f"fashion-mnist-{m}.yaml") for m in ("mlp", "cnn")}
DIRECT = os.path.join(ROOT, "tools", "bench", "torch_ddp_direct.py")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_bench import MATCHED_MALLOC_ENV, free_port  # noqa: E402


class Fitrund:
    def __init__(self, work, env=None):
        self.state = os.path.join(work, "state")
        os.makedirs(self.state)
        self.log = open(os.path.join(work, "fitrund.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "server", "fitrund"), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             f"--state_dir={self.state}", "--devices=auto",
             f"--worker_binary={os.path.join(BIN, 'worker', 'fitrun-worker')}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        address_file = os.path.join(self.state, "fitrund.address")
        deadline = time.monotonic() + 60
        while not (os.path.exists(address_file) and os.path.getsize(address_file) > 0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"fitrund did not start; see {self.log.name}")
            time.sleep(0.05)
        with open(address_file) as f:
            self.address = f.read().strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# Milestones of a fitrun job in the watch's output, in the order they happen.
MILESTONES = [
    ("launched", re.compile(r"-> RUNNING|state: RUNNING")),
    ("data loaded", re.compile(r"training samples loaded in")),
    ("joined", re.compile(r"joined the process group")),
    ("first step", re.compile(r"^step 1/")),
    ("last rank finished", re.compile(r"^rank \d+ finished")),
]


def submit_and_watch(fitrund, spec):
    """Seconds from starting `fitrun submit --watch` to each milestone, to its exit, and samples/s."""
    start = time.monotonic()
    proc = subprocess.Popen([os.path.join(BIN, "client", "fitrun"), f"--coordinator={fitrund.address}", "submit",
                             spec, "--watch"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, lines = {}, []
    for line in proc.stdout:
        now = time.monotonic() - start
        lines.append(line)
        for name, pattern in MILESTONES:
            if pattern.search(line):
                # The last rank to load, join or finish is the one the job waits for.
                if name in ("data loaded", "joined", "last rank finished") or name not in seen:
                    seen[name] = now
    proc.wait()
    seen["exit"] = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"fitrun submit failed ({proc.returncode}):\n{''.join(lines[-40:])}")
    rank0 = [l for l in lines if l.startswith("rank 0: communication:")]
    speed = re.search(r"([0-9.]+) samples/s", rank0[-1]) if rank0 else None
    seen["samples_per_second"] = float(speed.group(1)) if speed else float("nan")
    accuracy = re.search(r"test accuracy:\s+([0-9.]+)", "".join(lines))
    seen["accuracy"] = float(accuracy.group(1)) if accuracy else float("nan")
    return seen


def start_direct_ranks(model, work, *extra, layout="plain"):
    """torch_ddp_direct.py's two ranks, started as a user would (the torchrun contract by hand); returns
    when they started and the processes (rank 0's output on a pipe)."""
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank in range(2):
        # OMP_NUM_THREADS=1 as torchrun sets it for several processes a node (OpenBLAS reads it too).
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", **(MATCHED_MALLOC_ENV if layout == "matched" else {}))
        procs.append(subprocess.Popen(
            ["/usr/bin/python3", DIRECT, "--model", model, "--layout", layout, "--checkpoint",
             os.path.join(work, f"{model}.pt"), *extra],
            env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=subprocess.STDOUT,
            text=True))
    return start, procs


def torch_direct(model, work, layout):
    start, procs = start_direct_ranks(model, work, layout=layout)
    first_step, result = None, None
    for line in procs[0].stdout:
        if line.startswith("first step done"):
            first_step = time.monotonic() - start
        if line.startswith("{"):
            result = json.loads(line)
    for p in procs:
        p.wait()
    wall = time.monotonic() - start
    if any(p.returncode != 0 for p in procs) or result is None:
        sys.exit(f"the PyTorch ranks failed: {[p.returncode for p in procs]}")
    return {"first step": first_step, "exit": wall, "samples_per_second": result["samples_per_second"],
            "accuracy": result["test_accuracy"]}


def startup_seconds(command, runs=5):
    """Wall seconds of a command that only starts and exits, median of `runs`."""
    times = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.monotonic() - start)
    return statistics.median(times)


def spread(values, unit=" s", digits=2):
    values = sorted(values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{unit}"
    return f"{statistics.median(values):.{digits}f}{unit} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


FITRUN_SUMS = {"shared-memory": "", "gloo": ", Gloo"}
REFERENCES = {"plain": "PyTorch, as written", "matched": "PyTorch, matched"}


def main():
    global BIN
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--all-reduce", default="shared-memory,gloo",
                        help="how fitrun's ranks sum: shared-memory, gloo, or both")
    parser.add_argument("--reference", default="plain,matched",
                        help="PyTorch's model: plain (as written), matched (the built-in layout), or both")
    parser.add_argument("--bin", default=BIN, help="where fitrund, fitrun-worker and fitrun were built "
                        "(default: the -c opt outputs; bazel-bin for a plain build)")
    args = parser.parse_args()
    BIN = os.path.abspath(args.bin)
    for value, allowed, flag in ((args.all_reduce, FITRUN_SUMS, "--all-reduce"), (args.reference, REFERENCES, "--reference")):
        if not value or any(v not in allowed for v in value.split(",")):
            sys.exit(f"{flag}: a comma-separated list of {', '.join(allowed)}")
    for binary in ("server/fitrund", "worker/fitrun-worker", "client/fitrun"):
        if not os.path.exists(os.path.join(BIN, binary)):
            sys.exit(f"{os.path.join(BIN, binary)} is missing: build first, bazel build -c opt //server:fitrund "
                     "//worker:fitrun-worker //client:fitrun (or name the build with --bin)")
    sums = args.all_reduce.split(",")
    references = args.reference.split(",")
    fitrun_sides = [f"fitrun {submit}{FITRUN_SUMS[s]}" for s in sums for submit in ("first", "second")]
    sides = fitrun_sides + [REFERENCES[r] for r in references]
    results = {}  # (model, side) -> list of runs
    for run in range(args.runs):
        for model in args.models.split(","):
            for how in sums:
                with tempfile.TemporaryDirectory(prefix="fitrun-ttt-") as work:
                    fitrund = Fitrund(work, {"FITRUN_ALL_REDUCE": "gloo"} if how == "gloo" else None)
                    try:
                        for submit in ("first", "second"):
                            results.setdefault((model, f"fitrun {submit}{FITRUN_SUMS[how]}"), []).append(
                                submit_and_watch(fitrund, SPECS[model]))
                    finally:
                        fitrund.stop()
            for layout in references:
                with tempfile.TemporaryDirectory(prefix="fitrun-ttt-") as work:
                    results.setdefault((model, REFERENCES[layout]), []).append(torch_direct(model, work, layout))
            print(f"run {run + 1}: {model} done (load average {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)

    print(f"one epoch of Fashion-MNIST, global batch 256, 2 ranks x 1 thread (fitrun's sums through shared "
          f"memory, or over Gloo on loopback; PyTorch's over Gloo); {os.cpu_count()} cores; "
          f"median (min-max) of {args.runs} run(s), the sides interleaved")
    print("| model | side | submit to end | to first step | samples/s | test accuracy | "
          + " | ".join(f"end vs {REFERENCES[r]}" for r in references) + " |")
    print("| --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in references) + " |")
    for model in args.models.split(","):
        torch_wall = {r: statistics.median(x["exit"] for x in results[(model, REFERENCES[r])]) for r in references}
        for side in sides:
            rows = results[(model, side)]
            wall = statistics.median(r["exit"] for r in rows)
            ratios = " | ".join(f"{wall / torch_wall[r]:.2f}x" for r in references)
            print(f"| {model} | {side} | {spread([r['exit'] for r in rows])} | "
                  f"{spread([r['first step'] for r in rows])} | {spread([r['samples_per_second'] for r in rows], '', 0)} | "
                  f"{statistics.median(r['accuracy'] for r in rows):.4f} | {ratios} |")
    # What a pool of idle workers with LibTorch loaded could save at most per launch: the worker's own
    # start (it prints its usage for an unknown argument and exits), beside Python's `import torch`.
    worker = os.path.join(BIN, "worker", "fitrun-worker")
    libraries = subprocess.run(["ldd", worker], capture_output=True, text=True).stdout.count("=>")
    print()
    print(f"start-up alone (median of 5): fitrun-worker {startup_seconds([worker, '--usage']):.2f} s "
          f"({libraries} shared libraries); /usr/bin/python3 -c 'import torch' "
          f"{startup_seconds(['/usr/bin/python3', '-c', 'import torch']):.2f} s")
    print()
    print("where fitrun's time went (median seconds from the start of `fitrun submit --watch`):")
    names = [name for name, _ in MILESTONES] + ["exit"]
    print("| model | side | " + " | ".join(names) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in names) + " |")
    for model in args.models.split(","):
        for side in fitrun_sides:
            rows = results[(model, side)]
            cells = [f"{statistics.median(r[n] for r in rows if n in r):.2f}" if any(n in r for r in rows) else "-"
                     for n in names]
            print(f"| {model} | {side} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
