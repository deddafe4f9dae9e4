#!/usr/bin/python3
"""fitrun-worker vs PyTorch's DistributedDataParallel on this machine, in one run, on equal terms.

Same model, data (Fashion-MNIST), initial weights, sample order, global batch (256 = 2 ranks x 128),
optimizer (SGD, momentum 0.9), one compute thread per rank. Each round runs every side once, one after
the other: fitrun-worker summing through shared memory (as ranks of one machine do) and over Gloo on
loopback (as between machines, FITRUN_ALL_REDUCE=gloo), and PyTorch's DDP (Gloo on loopback) on the
model as PyTorch users write it ("as written") and in the built-in model's layout ("matched": the cnn
channels-last with its pooling before the second ReLU, and glibc keeping freed blocks for reuse as
fitrun's CPU ranks keep theirs). Prints each side's median samples/s with the spread over the rounds,
fitrun's against PyTorch's matched and as written, and fitrun's exposed communication: the time its
training thread spent on gradient communication backward did not hide (sums it ran itself through
shared memory, collectives it started, its waits) over training time. A program that prints figures,
not a test: nothing is asserted.

Usage (from the repository root):
  bazel build -c opt //worker:fitrun-worker && /usr/bin/python3 tools/bench/ddp_bench.py [--models mlp,cnn]
      [--worker PATH] (another fitrun-worker binary, e.g. a copy of an earlier build, to compare)
      [--repeat N] (rounds, 3 by default: each side's median and spread over them)
      [--all-reduce shared-memory,gloo] (fitrun's sides: shared memory, Gloo, or both, the default)
      [--reference plain,matched] (PyTorch's sides: as written, matched, or both, the default)
      [--comm-hooks none,fp16,bf16,powersgd] (a row per spec.ddp.comm_hook, PyTorch with the same hook;
      PowerSGD compresses from step --powersgd-start-iter + 1, 10 by default, so most steps compress)
      [--epoch-accuracy] (instead: one epoch of deploy/examples/fashion-mnist-mlp.yaml, global batch 256
      on 2 ranks, per hook, and the test accuracy rank 0 reports; fitrun-worker only)
      [--link-rate RATE] (e.g. 1gbit: every rank of both sides runs in a fresh network namespace whose
      loopback is rate-limited by a tc token bucket, a stand-in on one machine for a link between nodes
      where bytes cost time; also prints the bytes each rank put on that loopback per step. fitrun's
      ranks then sum over Gloo only. The namespace is deleted at the end, also on Ctrl-C. Needs root,
      ip and tc)
      [--link-mtu N] (lo's MTU in that namespace, 9000 by default: jumbo frames, below tbf's 64 KB burst)

Prints, per hook, the bytes of gradient payload each rank sends per step, computed from the model's
parameter count and what the worker logs (float32 4 bytes per element for none, 2 for fp16 and bf16,
PowerSGD's elements after compression from its `elements compressed to` figure): at 2 ranks a Gloo
all-reduce (ring: half in the reduce-scatter, half in the all-gather) and the 2-rank all-gather of
fp16 and bf16 each send that payload once per rank.

Also prints where fitrun-worker's step time went (rank 0's `step time:` line of its median run):
batch assembly, forward, backward (with the reducer's hooks, and through shared memory the sums of
every bucket but the last), synchronize (the last bucket's sum and the wait) and optimizer.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The -c opt output itself: bazel-bin follows whichever configuration the tree's last build used.
WORKER = os.path.join(ROOT, "bazel-out", "k8-opt", "bin", "worker", "fitrun-worker")
REFERENCE = os.path.join(ROOT, "tests", "parity", "torch_ddp_reference.py")
# What a "matched" PyTorch side's processes run with besides the built-in model's layout: glibc keeps
# freed blocks below 32 MiB for reuse instead of unmapping them and faulting them in again the next
# step, as fitrun's CPU ranks reuse theirs (worker/memory/caching_cpu_allocator.h).
MATCHED_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
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


class RateLimitedLink:
    """A network namespace of this run's own whose loopback goes through a token bucket of `rate`.

    The ranks of both sides run in it (`ip netns exec`), so their Gloo traffic, both directions, passes
    the one tbf qdisc on its lo: a rate-limited loopback on one machine standing in for a link between
    nodes. Nothing else runs in the namespace, so any port is free there and lo's byte counter counts
    only the ranks' traffic. lo's MTU comes down from 65536 to `mtu`: tbf drops every packet larger
    than its 64 KB burst, and TCP's full-size segments at lo's own MTU are larger (the connection stalls).
    """

    def __init__(self, rate, mtu):
        self.rate = rate
        self.mtu = mtu
        self.name = f"fitrun-bench-{os.getpid()}"
        self.next_port = 29500

    def __enter__(self):
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            for cmd in (["ip", "link", "set", "lo", "mtu", str(self.mtu), "up"],
                        ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.rate, "burst", "64kb",
                         "latency", "100ms"]):
                subprocess.run(["ip", "netns", "exec", self.name] + cmd, check=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        subprocess.run(["ip", "netns", "delete", self.name], check=False)

    def wrap(self, cmd):
        return ["ip", "netns", "exec", self.name] + list(cmd)

    def port(self):
        # A new port per run: the previous run's connections may still be in TIME_WAIT.
        self.next_port += 1
        return self.next_port

    def tx_bytes(self):
        out = subprocess.run(["ip", "-n", self.name, "-s", "-j", "link", "show", "dev", "lo"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)[0]["stats64"]["tx"]["bytes"]


LINK = None  # the RateLimitedLink of --link-rate, for the whole run


def run_ranks(commands, env_extra, timeout):
    """Runs one command per rank; returns their outputs and, with --link-rate, the bytes they sent."""
    port = LINK.port() if LINK else free_port()
    sent_before = LINK.tx_bytes() if LINK else 0
    procs = []
    try:
        for rank, cmd in enumerate(commands):
            # OMP_NUM_THREADS=1 as torchrun sets it for several processes a node (OpenBLAS reads it too).
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1", **env_extra)
            if LINK:
                env["GLOO_SOCKET_IFNAME"] = "lo"  # the namespace has no other interface
                cmd = LINK.wrap(cmd)
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
    return outputs, (LINK.tx_bytes() - sent_before if LINK else None)


def ddp_spec(hook, args):
    spec = f"comm_hook: COMM_HOOK_{hook.upper()}"
    if hook == "powersgd":
        spec += f" powersgd_rank: {args.powersgd_rank} powersgd_start_iter: {args.powersgd_start_iter}"
    return spec


def run_worker(worker, model, hook, args, dump, lr, seed, steps, steps_per_epoch=0, all_reduce="gloo"):
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
    env = {"FITRUN_ASSIGNMENT": assignment, "FITRUN_DUMP_INITIAL_STATE": dump}
    if all_reduce == "gloo" or LINK:
        env["FITRUN_ALL_REDUCE"] = "gloo"
    outputs, sent = run_ranks([[worker]] * 2, env, timeout=600)
    return outputs[0], sent


def gradient_elements(dump):
    """The model's parameter count, from the manifest the worker dumps (name and shape per line)."""
    total = 0
    with open(os.path.join(dump, "parameters.txt")) as manifest:
        for line in manifest:
            count = 1
            for d in line.split()[1:]:
                count *= int(d)
            total += count
    return total


def payload_bytes(hook, elements, log):
    """Bytes of gradient payload one rank sends per step (on compressed steps for PowerSGD).

    none: the buckets in float32 with the loss as one more element; fp16, bf16: the buckets in 2 bytes
    and the loss in a 1-element float32 all-reduce; powersgd: P, Q and the uncompressed gradients in
    float32, from the worker's `N elements compressed to M` (N counts every gradient element of every
    compressed step), and the loss. At 2 ranks each of these collectives sends its payload once per rank.
    """
    if hook == "none":
        return 4 * (elements + 1)
    if hook in ("fp16", "bf16"):
        return 2 * elements + 4
    if hook == "powersgd":
        m = re.search(r"(\d+) elements compressed to (\d+)", log)
        if m is None:
            return None  # no compressed step in this run
        return 4 * (int(m.group(2)) * elements // int(m.group(1)) + 1)
    return None


COMMUNICATION = re.compile(
    r"communication: (\d+) buckets, exposed ([0-9.]+) s over (\d+) steps = ([0-9.]+)% of ([0-9.]+) s training "
    r"\(collectives run or started on the training thread ([0-9.]+) s, all-reduce wait ([0-9.]+) s\); "
    r"([0-9.]+) samples/s")


def bench_fitrun(worker, model, steps, work, hook, args, all_reduce):
    """One 2-rank fitrun-worker run: rank 0's figures."""
    dump = os.path.join(work, f"{model}-{hook}")
    out, sent = run_worker(worker, model, hook, args, dump, LR, 1, steps, all_reduce=all_reduce)
    comm = COMMUNICATION.search(out)
    if comm is None:
        sys.exit(f"no communication line in the worker's log:\n{out}")
    fitrun = {"buckets": int(comm.group(1)), "exposed": float(comm.group(4)), "seconds": float(comm.group(5)),
              "started": float(comm.group(6)), "wait": float(comm.group(7)),
              "samples_per_second": float(comm.group(8))}
    breakdown = re.search(r"step time: (.*) of [0-9.]+ s training", out)
    fitrun["step_time"] = breakdown.group(1) if breakdown else "(not logged by this worker)"
    fitrun["payload"] = payload_bytes(hook, gradient_elements(dump), out)
    fitrun["sent"] = sent
    return fitrun


def bench_torch(model, steps, work, hook, args, layout):
    """One 2-rank run of PyTorch's DDP from the state the worker dumped: rank 0's figures."""
    dump = os.path.join(work, f"{model}-{hook}")
    ref_cmd = ["/usr/bin/python3", REFERENCE, "--data", DATA, "--dump", dump, "--model", model, "--layout", layout,
               "--steps", str(steps), "--batch", str(PER_RANK_BATCH), "--lr", str(LR), "--momentum", "0.9",
               "--local-loss", "--comm-hooks", hook, "--powersgd-rank", str(args.powersgd_rank),
               "--powersgd-start-iter", str(args.powersgd_start_iter)]
    ref_outs, ref_sent = run_ranks([ref_cmd] * 2, MATCHED_MALLOC_ENV if layout == "matched" else {}, timeout=600)
    torch_run = json.loads([l for l in ref_outs[0].splitlines() if l.startswith("{")][-1])
    torch_run["sent"] = ref_sent
    return torch_run


def epoch_accuracy(args):
    """One epoch of the example mlp job per hook: test accuracy and loss as rank 0 reports them."""
    steps = TRAIN_SAMPLES // (2 * PER_RANK_BATCH)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for hook in args.comm_hooks.split(","):
            out, _ = run_worker(args.worker, "mlp", hook, args, os.path.join(work, hook), EXAMPLE_LR,
                                EXAMPLE_SEED, steps, steps, all_reduce=args.all_reduce.split(",")[0])
            accuracy = re.search(r"test accuracy ([0-9.]+) \((\d+) of (\d+)\)", out)
            final = re.search(r"final loss ([0-9.eE+-]+)", out)
            exposed = re.search(r"= ([0-9.]+)% of [0-9.]+ s training", out)
            if accuracy is None or final is None:
                sys.exit(f"no test accuracy in the worker's log:\n{out}")
            rows.append((hook, float(accuracy.group(1)), accuracy.group(2), accuracy.group(3), float(final.group(1)),
                         float(exposed.group(1)) if exposed else float("nan")))
            print(f"{hook}: done", file=sys.stderr, flush=True)
    print(f"fashion-mnist-mlp, 1 epoch ({steps} steps), global batch {2 * PER_RANK_BATCH} on 2 ranks, "
          f"SGD lr {EXAMPLE_LR} momentum 0.9, seed {EXAMPLE_SEED}, {link_description(args)}"
          + (f"; powersgd rank {args.powersgd_rank} from step {args.powersgd_start_iter + 1}"
             if "powersgd" in args.comm_hooks else ""))
    print("| comm hook | test accuracy | vs none | final loss | exposed comm |")
    print("| --- | ---: | ---: | ---: | ---: |")
    baseline = dict((r[0], r[1]) for r in rows).get("none")
    for hook, accuracy, correct, total, final, exposed in rows:
        delta = f"{accuracy - baseline:+.4f}" if baseline is not None else "-"
        print(f"| {hook} | {accuracy:.4f} ({correct}/{total}) | {delta} | {final:.4f} | {exposed:.1f}% |")


def link_description(args):
    if LINK is None:
        return "PyTorch's Gloo on loopback"
    return (f"Gloo on a loopback rate-limited to {LINK.rate} (tc tbf in network namespace {LINK.name}, MTU "
            f"{LINK.mtu}; both directions share it), standing in for a link between nodes")


def byte_count(n):
    if n is None:
        return "-"
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


# The sides of a comparison, in the order each round runs them.
FITRUN_SIDES = {"shared-memory": "fitrun, shared memory", "gloo": "fitrun, Gloo"}
TORCH_SIDES = {"plain": "PyTorch DDP, as written", "matched": "PyTorch DDP, matched"}


def median_run(runs):
    """The run whose samples/s is the median (the upper of the two middle ones for an even count)."""
    return sorted(runs, key=lambda r: r["samples_per_second"])[len(runs) // 2]


def spread(values, digits=0):
    values = sorted(values)
    text = f"{statistics.median(values):.{digits}f}"
    return text if len(values) == 1 else f"{text} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


def sides(args):
    fitrun = ["gloo"] if LINK else args.all_reduce.split(",")
    return [("fitrun", a) for a in fitrun] + [("torch", r) for r in args.reference.split(",")]


def run(args):
    if args.epoch_accuracy:
        epoch_accuracy(args)
        return
    runs = {}  # (model, hook, side name) -> the runs of that side, one per round
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            for hook in args.comm_hooks.split(","):
                steps = args.mlp_steps if model == "mlp" else args.cnn_steps
                for round_ in range(args.repeat):
                    # The sides in turn, each round: load on the machine reaches all of them alike.
                    for kind, variant in sides(args):
                        if kind == "fitrun":
                            result = bench_fitrun(args.worker, model, steps, work, hook, args, variant)
                            name = FITRUN_SIDES[variant]
                        else:
                            result = bench_torch(model, steps, work, hook, args, variant)
                            name = TORCH_SIDES[variant]
                        runs.setdefault((model, hook, name), []).append(result)
                    print(f"{model} {hook}: round {round_ + 1} done (load average {os.getloadavg()[0]:.2f})",
                          file=sys.stderr, flush=True)
    print_tables(args, runs)


def print_tables(args, runs):
    print(f"2 ranks x 1 thread, {link_description(args)}, global batch {2 * PER_RANK_BATCH}, SGD momentum, "
          f"{os.cpu_count()} cores; median (min-max) of {args.repeat} round(s), the sides interleaved"
          + (f"; powersgd rank {args.powersgd_rank} from step {args.powersgd_start_iter + 1}"
             if "powersgd" in args.comm_hooks else ""))
    references = [TORCH_SIDES[r] for r in args.reference.split(",")]
    header = ("| model | comm hook | steps | side | samples/s | "
              + " | ".join(f"vs {r}" for r in references)
              + " | exposed communication | fitrun payload sent per rank per step |")
    rule = "| --- | --- | ---: | --- | ---: | " + " | ".join("---:" for _ in references) + " | ---: | ---: |"
    if LINK:
        # lo's transmit counter over the whole run (both ranks, start-up and the uncompressed first
        # steps included) / 2 ranks / steps.
        header += " sent on lo per rank per step |"
        rule += " ---: |"
    print(header)
    print(rule)
    for model in args.models.split(","):
        steps = args.mlp_steps if model == "mlp" else args.cnn_steps
        for hook in args.comm_hooks.split(","):
            reference_median = {r: statistics.median(x["samples_per_second"] for x in runs[(model, hook, r)])
                                for r in references}
            for kind, variant in sides(args):
                name = FITRUN_SIDES[variant] if kind == "fitrun" else TORCH_SIDES[variant]
                side_runs = runs[(model, hook, name)]
                speed = statistics.median(x["samples_per_second"] for x in side_runs)
                ratios = " | ".join(f"{speed / reference_median[r]:.2f}x" for r in references)
                if kind == "fitrun":
                    exposed = spread([x["exposed"] for x in side_runs], 1) + "%"
                    payload = byte_count(side_runs[0]["payload"])
                else:
                    exposed, payload = "-", "-"
                line = (f"| {model} | {hook} | {steps} | {name} | {spread([x['samples_per_second'] for x in side_runs])} | "
                        f"{ratios} | {exposed} | {payload} |")
                if LINK:
                    line += f" {byte_count(median_run(side_runs)['sent'] / 2 / steps)} |"
                print(line)
    if "powersgd" in args.comm_hooks:
        print(f"powersgd payload: on compressed steps; the first {args.powersgd_start_iter} steps send what none sends")
    print("PyTorch's exposed communication is not measured (its script does not time its all-reduce wait).")
    for model in args.models.split(","):
        for hook in args.comm_hooks.split(","):
            for kind, variant in sides(args):
                if kind != "fitrun":
                    continue
                median = median_run(runs[(model, hook, FITRUN_SIDES[variant])])
                print(f"{model} {hook} {FITRUN_SIDES[variant]}: rank 0 of its median run: step time "
                      f"{median['step_time']}; communication {median['started']:.3f} s started or run on the "
                      f"training thread, {median['wait']:.3f} s waiting")


def main():
    global LINK
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--mlp-steps", type=int, default=200)
    parser.add_argument("--cnn-steps", type=int, default=30)
    parser.add_argument("--worker", default=WORKER)
    parser.add_argument("--repeat", type=int, default=3, help="rounds: medians and spreads over them")
    parser.add_argument("--comm-hooks", default="none", help="comma-separated none, fp16, bf16, powersgd")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--powersgd-start-iter", type=int, default=10)
    parser.add_argument("--epoch-accuracy", action="store_true")
    parser.add_argument("--link-rate", help="run the ranks on a loopback rate-limited to this tc rate, e.g. 1gbit")
    parser.add_argument("--link-mtu", type=int, default=9000, help="lo's MTU with --link-rate (jumbo frames)")
    parser.add_argument("--all-reduce", default="shared-memory,gloo",
                        help="how fitrun-worker's ranks sum: shared-memory, gloo, or both (--link-rate takes gloo)")
    parser.add_argument("--reference", default="plain,matched",
                        help="PyTorch's model: plain (as written), matched (the built-in layout), or both")
    args = parser.parse_args()
    for value, allowed, flag in ((args.all_reduce, FITRUN_SIDES, "--all-reduce"), (args.reference, TORCH_SIDES, "--reference")):
        if not value or any(v not in allowed for v in value.split(",")):
            sys.exit(f"{flag}: a comma-separated list of {', '.join(allowed)}")
    if not os.path.exists(args.worker):
        sys.exit("build first: bazel build -c opt //worker:fitrun-worker")
    if not args.link_rate:
        run(args)
        return
    # SIGTERM as well as Ctrl-C unwinds through the with below, which deletes the namespace.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with RateLimitedLink(args.link_rate, args.link_mtu) as LINK:
        run(args)


if __name__ == "__main__":
    main()
