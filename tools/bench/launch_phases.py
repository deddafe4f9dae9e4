#!/usr/bin/python3
"""Where a launch's time goes: each phase from `fitrun submit --watch` to the first step, beside PyTorch's
DDP script started directly, in one run.

For deploy/examples/fashion-mnist-mlp.yaml cut to --steps steps (2 ranks on this machine's two virtual
CPU devices; their sums through shared memory) it times, on a fresh fitrund each time:
  - bare: fitrund with no users, no job cgroups, plain-text gRPC;
  - secured (root only): TLS on the API and the ranks' channel, a user whose jobs run as a throwaway Unix
    account, each attempt in a cgroup of its own (--job_cgroups=on);
  - secured+warm: the same with --warm_ranks=2, so that the second submit runs on ranks started, as the
    user's account, when the first one's ranks exited;
each with a first submit (empty state directory: no dataset cache) and a second submit of the same spec
--pause seconds after the first ended (a user reading the result; 0: back to back, when the warm ranks
are still loading LibTorch as the second job takes them);
and tools/bench/torch_ddp_direct.py, the same job as a PyTorch user's script, two processes started
directly.

The phases come from what each side reports as it goes: fitrund's RUNNING event says how long the queue,
the plan, the job directory (the assignment, written as the owner), the cgroup and the ranks' spawn took;
each rank says how long after its fork its main() began (the account switch, the exec, the shared
libraries; a warm rank: how long after it was handed its job), how long its data and its rendezvous took. The milestones are the arrival times of those
lines at the watching client, from the moment `fitrun submit` starts; PyTorch's rank 0 prints its own.

A program that prints figures, not a test: nothing is asserted. Usage (from the repository root):
  bazel build -c opt //server:fitrund //worker:fitrun-worker //client:fitrun
  /usr/bin/python3 tools/bench/launch_phases.py [--runs 5] [--steps 50] [--pause 2]
                                                [--settings bare,secured,secured+warm]
--short (one run of 3 steps) is what the test suite runs so that the program cannot rot.
"""
import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accounts  # noqa: E402  throwaway Unix accounts, as the owners' tests make them
from jobs import Fitrund  # noqa: E402
from time_to_train import start_direct_ranks  # noqa: E402

SPEC = os.path.join(ROOT, "deploy", "examples", "fashion-mnist-mlp.yaml")
TOKEN = "launch-phases-bench-token"

# fitrund's own phases, as its RUNNING event names them, in order.
FITRUND_PHASES = ["queue", "plan", "job directory", "cgroup", "spawn"]
# The milestones both sides reach, seconds from the start of the submit (or of the PyTorch ranks).
MILESTONES = ["submitted", "launched", "ranks up", "data loaded", "joined", "first step", "end"]


def seconds_of(text):
    """An absl duration as the worker prints it ("525.9ms", "1.2s", "850us") in seconds."""
    value, unit = re.fullmatch(r"([0-9.]+)(ns|us|ms|s|m)", text).groups()
    return float(value) * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


class Setting:
    """How one fitrund is configured, and what the client needs to reach it."""

    def __init__(self, name, work, bin_dir):
        self.name = name
        self.work = work
        self.bin_dir = bin_dir
        self.account = None
        self.client_flags = []
        self.fitrund_flags = ["--devices=auto"]
        self.worker = os.path.join(bin_dir, "worker", "fitrun-worker")
        if name.endswith("+warm"):
            self.fitrund_flags.append("--warm_ranks=2")
        if name.startswith("bare"):
            self.fitrund_flags.append("--job_cgroups=off")
            return
        if os.geteuid() != 0:
            sys.exit(f"--settings={name} runs jobs as another Unix account and in cgroups: run as root")
        self.account = f"fitrunbench{os.getpid()}"
        accounts.useradd(self.account)
        # The ranks run as the account: their binary and the CA they verify fitrund with must be
        # readable by it (Bazel's outputs lie under /root, 0700).
        install = os.path.join(work, "install")
        os.makedirs(os.path.join(install, "worker"))
        shutil.copy(self.worker, os.path.join(install, "worker", "fitrun-worker"))
        self.worker = os.path.join(install, "worker", "fitrun-worker")
        tls = make_certificates(os.path.join(work, "tls"))
        accounts.world_readable(install)
        with open(os.path.join(work, "tokens"), "w") as f:
            f.write(f"bench user {hashlib.sha256(TOKEN.encode()).hexdigest()} {self.account}\n")
        self.fitrund_flags += ["--job_cgroups=on", f"--auth_tokens={os.path.join(work, 'tokens')}",
                               f"--tls_cert={tls['cert']}", f"--tls_key={tls['key']}"]
        self.client_flags = [f"--ca={tls['ca']}", f"--token={TOKEN}"]

    def start(self, state):
        return Fitrund(state, flags=self.fitrund_flags, fitrund=os.path.join(self.bin_dir, "server", "fitrund"),
                       worker=self.worker, data_roots=None)

    def close(self):
        if self.account:
            accounts.userdel(self.account)


def make_certificates(directory):
    """A CA and a certificate for 127.0.0.1 signed by it; the CA readable by every account."""
    os.makedirs(directory)
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, cwd=directory, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench-ca")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "server.ext")
    os.chmod(directory, 0o755)
    os.chmod(os.path.join(directory, "ca.pem"), 0o644)
    return {"ca": os.path.join(directory, "ca.pem"), "cert": os.path.join(directory, "server.pem"),
            "key": os.path.join(directory, "server.key")}


def fitrun_submit(setting, fitrund, spec):
    """Milestones (seconds from starting `fitrun submit --watch`) and phases (seconds) of one submit."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [os.path.join(setting.bin_dir, "client", "fitrun"), f"--coordinator={fitrund.address}",
         *setting.client_flags, "submit", spec, "--watch"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    at, phases, lines = {}, {}, []
    for line in proc.stdout:
        now = time.monotonic() - start
        lines.append(line)
        if line.startswith("submitted job"):
            at["submitted"] = now
        elif launched := re.search(r"-> RUNNING \(launched .*; in [0-9.]+ ms: (.*)\)$", line):
            at["launched"] = now
            warm = re.search(r"rank\(s\) \(([0-9]+) warm\)", line)
            phases["warm ranks"] = int(warm.group(1)) if warm else 0
            for part in launched.group(1).split(", "):
                name, ms = part.rsplit(" ", 2)[0], part.rsplit(" ", 2)[1]
                phases[name] = float(ms) / 1000
        elif up := re.search(r"process up ([0-9]+) ms after its fork|warm rank: its job taken ([0-9]+) ms ago", line):
            at["ranks up"] = now  # the last rank's line is the one the job waits for
            phases["rank start"] = max(phases.get("rank start", 0.0), int(up.group(1) or up.group(2)) / 1000)
        elif data := re.search(r"training samples loaded in ([0-9.]+[a-z]+)", line):
            at["data loaded"] = now
            phases["data"] = max(phases.get("data", 0.0), seconds_of(data.group(1)))
        elif joined := re.search(r"joined the process group at \S+ in ([0-9.]+[a-z]+)", line):
            at["joined"] = now
            phases["rendezvous"] = max(phases.get("rendezvous", 0.0), seconds_of(joined.group(1)))
        elif line.startswith("step 1/") and "first step" not in at:
            at["first step"] = now
    proc.wait()
    at["end"] = time.monotonic() - start
    if proc.returncode != 0 or len(at) != len(MILESTONES):
        sys.exit(f"fitrun submit ended {proc.returncode}, milestones {sorted(at)}:\n{''.join(lines[-40:])}")
    return at, phases


def torch_direct(work, steps):
    """PyTorch's milestones from its ranks' start, and the same phases where it has them."""
    start, procs = start_direct_ranks("mlp", work, "--max-steps", str(steps), "--print-phases")
    at, phases = {}, {}
    for line in procs[0].stdout:
        now = time.monotonic() - start
        if phase := re.match(r"phase (\S+) ([0-9.]+)", line):
            phases[phase.group(1)] = float(phase.group(2))
            at[{"imported": "ranks up", "data": "data loaded", "joined": "joined"}[phase.group(1)]] = now
        elif line.startswith("first step done"):
            at["first step"] = now
    for p in procs:
        p.wait()
    at["end"] = time.monotonic() - start
    if any(p.returncode != 0 for p in procs) or "first step" not in at:
        sys.exit(f"the PyTorch ranks failed: {[p.returncode for p in procs]}")
    return at, {"rank start": phases["imported"], "data": phases["data"], "rendezvous": phases["joined"]}


def median(rows, key, index):
    values = [row[index][key] for row in rows if key in row[index]]
    return statistics.median(values) if values else None


def cell(value, scale=1.0, digits=2):
    return "-" if value is None else f"{value * scale:.{digits}f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--settings", default="bare,secured,secured+warm" if os.geteuid() == 0 else "bare,bare+warm")
    parser.add_argument("--bin", default=os.path.join(ROOT, "bazel-out", "k8-opt", "bin"),
                        help="where server/fitrund, worker/fitrun-worker and client/fitrun are (default: -c opt's)")
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds between the first submit's end and the second submit")
    parser.add_argument("--short", action="store_true", help="one run of 3 steps: the test suite's form")
    args = parser.parse_args()
    if args.short:
        args.runs, args.steps = 1, 3
    args.bin = os.path.abspath(args.bin)
    for binary in ("server/fitrund", "worker/fitrun-worker", "client/fitrun"):
        if not os.path.exists(os.path.join(args.bin, binary)):
            sys.exit("build first: bazel build -c opt //server:fitrund //worker:fitrun-worker //client:fitrun")
    settings = args.settings.split(",")
    results = {}  # side -> [(milestones, phases)] over the runs
    with tempfile.TemporaryDirectory(prefix="fitrun-launch-") as work:
        os.chmod(work, 0o755)  # the secured setting's account reaches its binary and CA below it
        spec = os.path.join(work, "spec.yaml")
        with open(SPEC) as f:
            text = f.read()
        with open(spec, "w") as f:
            f.write(re.sub(r"^epochs: .*$", f"max_steps: {args.steps}", text, flags=re.M))
        for name in settings:
            setting = Setting(name, os.path.join(work, name), args.bin)
            try:
                for run in range(args.runs):
                    with setting.start(os.path.join(work, name, f"state-{run}")) as fitrund:
                        if fitrund.address is None:
                            sys.exit(f"fitrund did not start:\n{fitrund.log()}")
                        results.setdefault(f"fitrun {name}, first", []).append(fitrun_submit(setting, fitrund, spec))
                        time.sleep(args.pause)  # the scenario's think time, the same for every setting
                        results.setdefault(f"fitrun {name}, second", []).append(fitrun_submit(setting, fitrund, spec))
            finally:
                setting.close()
        for run in range(args.runs):
            results.setdefault("PyTorch DDP, direct", []).append(torch_direct(work, args.steps))

    print(f"Fashion-MNIST mlp, {args.steps} steps, global batch 256, 2 ranks x 1 thread; {os.cpu_count()} "
          f"cores; second submit {args.pause:g} s after the first ended; median of {args.runs} run(s)")
    print()
    print("milestones, seconds from the start of `fitrun submit --watch` (PyTorch: of its two processes):")
    print("| side | " + " | ".join(MILESTONES) + " | end vs PyTorch |")
    print("| --- | " + " | ".join("---:" for _ in MILESTONES) + " | ---: |")
    torch_end = median(results["PyTorch DDP, direct"], "end", 0)
    for side, rows in results.items():
        print(f"| {side} | " + " | ".join(cell(median(rows, m, 0)) for m in MILESTONES) +
              f" | {median(rows, 'end', 0) / torch_end:.2f}x |")
    print()
    phases = ["warm ranks"] + FITRUND_PHASES + ["rank start", "data", "rendezvous"]
    print("phases, milliseconds (warm ranks: how many of the 2 were; rank start: a rank's fork to its main, a warm "
          "rank's job handed to its main, or `import torch`; data and rendezvous: the slowest rank's own figure):")
    print("| side | " + " | ".join(phases) + " |")
    print("| --- | " + " | ".join("---:" for _ in phases) + " |")
    for side, rows in results.items():
        print(f"| {side} | " + " | ".join(cell(median(rows, p, 1), 1, 0) if p == "warm ranks" else
                                          cell(median(rows, p, 1), 1000, 1) for p in phases) + " |")


if __name__ == "__main__":
    main()
