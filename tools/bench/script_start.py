#!/usr/bin/env python3
"""Submit to first optimizer step for a script job: fitrun against the same script launched as torchrun
launches it.

The script is tools/bench/scripts/lm_train.py (a 3-layer byte-level transformer LM, AdamW, one thread a
rank, its batch from --batch_size), the same file on both sides. Each run:

  - fitrun, first submit: a fresh fitrund (an empty state directory: nothing measured, nothing cached),
    already serving; `fitrun submit` of a spec running the script on --ranks devices;
  - fitrun, second submit of the same spec to the same fitrund, once the first has ended;
  - fitrun, a variant: the same spec but for an argument that changes no memory (`--tag b`);
  - the reference: the same script started as torchrun starts it, --ranks processes with RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (--launcher env, for
    Debian's torchrun, which does not start under Python 3.11), or under torchrun itself
    (--launcher torchrun: `python -m torch.distributed.run --standalone --nproc_per_node=N`), at the
    per-device batch the fitrun job planned.

Every clock starts just before the command (`fitrun submit`, or the reference's processes) and stops at
the script's own wall-clock timestamp for its first optimizer step (`rank R: first optimizer step done
at T`, from each rank's log): the last rank's. The order of fitrun and the reference alternates from run
to run. It prints each run, the medians and the ratios fitrun/torchrun, and with --json writes them all
(tools/gpu/figures.py script_start reads that file in the GPU check).

A program that prints figures, not a test: nothing is asserted. Standard library only, so the GPU
machine's Python runs it. From the repository root:

  bazel build //server:fitrund //worker:fitrun-worker //worker:fitrun-supervisor \\
      //worker/memory:libfitrun_memory.so //client:fitrun
  /usr/bin/python3 tools/bench/script_start.py [--runs 3]
"""
import argparse
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tools", "bench", "scripts")
SCRIPT = "lm_train.py"
FIRST_STEP = re.compile(r"rank (\d+): first optimizer step done at ([0-9.]+)")
SIDES = ("first", "second", "variant", "torchrun")
FINAL_STATES = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_ranks_of(state_dir):
    """SIGKILLs every process a fitrund with this state directory started and left (its ranks and probes
    carry FITRUN_ASSIGNMENT under it)."""
    needle = f"FITRUN_ASSIGNMENT={state_dir}/".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if any(v.startswith(needle) for v in f.read().split(b"\0")):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


class Fitrund:
    """A fresh fitrund on ports the OS picks, its state in `work`/state."""

    def __init__(self, args, work):
        self.args = args
        self.state = os.path.join(work, "state")
        os.makedirs(self.state)
        self.log = open(os.path.join(work, "fitrund.log"), "w")
        self.proc = subprocess.Popen(
            [args.fitrund, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--state_dir={self.state}",
             f"--devices={args.devices}", f"--worker_binary={args.worker}", "--stop_workers_on_exit",
             f"--data_roots={ROOT}", *args.fitrund_flag],
            stdout=self.log, stderr=subprocess.STDOUT)
        address = os.path.join(self.state, "fitrund.address")
        deadline = time.monotonic() + 30
        while not (os.path.exists(address) and os.path.getsize(address) > 0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fitrund did not start; see {self.log.name}")
            time.sleep(0.05)
        with open(address) as f:
            self.address = f.read().strip()

    def cli(self, *words, timeout=60):
        result = subprocess.run([self.args.fitrun, f"--coordinator={self.address}", *words], capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"fitrun {' '.join(words)}: exit {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        kill_ranks_of(self.state)
        self.log.close()


def write_spec(args, work, name, extra=()):
    command = [args.python, SCRIPT, "--max_steps", str(args.max_steps), *args.script_args.split(), *extra]
    spec = {
        "name": name,
        "script": {"command": command, "working_dir": SCRIPTS, "batch_flag": "--batch_size",
                   "grad_accum_flag": "--grad_accum_steps", "env": {"OMP_NUM_THREADS": "1"}},
        "global_batch_size": args.global_batch,
        "optimizer": {"kind": "adamw", "lr": 0.0003, "lr_scaling": "none"},
        "resources": {"min_devices": args.ranks, "max_devices": args.ranks},
    }
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        json.dump(spec, f)  # JSON is YAML
    return path


def when(text):
    """An RFC 3339 time with nanoseconds and a Z, as seconds since the epoch."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d*", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()


def first_steps(text):
    """{rank: the wall clock of its first optimizer step} from a log (a rank of a restarted attempt
    prints it again: the earliest counts)."""
    stamps = {}
    for m in FIRST_STEP.finditer(text):
        rank, stamp = int(m.group(1)), float(m.group(2))
        stamps[rank] = min(stamp, stamps.get(rank, stamp))
    return stamps


def fitrun_job(args, fitrund, spec, work, name):
    """Submits `spec`, waits for its end, and returns its figures (seconds from just before the submit)."""
    start = time.time()
    try:
        submitted = fitrund.cli("submit", spec)
    except RuntimeError as refused:  # a spec refused at submit: no job, no figures, the reason kept
        return {"job": None, "state": f"REFUSED ({refused})", "first_step_s": None, "launched_s": None,
                "end_s": time.time() - start, "per_device_batch": 0, "grad_accum_steps": 1, "devices": 0,
                "attempts": 0, "ooms": 0}
    job_id = re.search(r"submitted job (\S+)", submitted).group(1)
    deadline = time.monotonic() + args.job_timeout
    job = {}
    while time.monotonic() < deadline:
        job = json.loads(fitrund.cli("get", "--json", job_id))
        if job.get("state") in FINAL_STATES:
            break
        time.sleep(0.2)
    else:
        fitrund.cli("cancel", job_id, "--reason", f"script_start.py: not ended in {args.job_timeout} s")
        job = json.loads(fitrund.cli("get", "--json", job_id))
    ended = time.time()
    events = fitrund.cli("events", job_id)
    with open(os.path.join(work, f"{name}.json"), "w") as f:
        f.write(json.dumps(job, indent=1))
    with open(os.path.join(work, f"{name}.events"), "w") as f:
        f.write(events)
    # Every attempt's rank logs, in fitrund's state directory (`fitrun logs` prints the latest attempt's):
    # a job that ran out of memory and resumed reached its first step in its first attempt.
    stamps = {}
    for log in sorted(glob.glob(os.path.join(fitrund.state, "jobs", job_id, "attempt-*", "rank-*.log"))):
        with open(log, errors="replace") as f:
            for r, stamp in first_steps(f.read()).items():
                stamps[r] = min(stamp, stamps.get(r, stamp))
    # The first RUNNING: how long planning (and any probe) held the job before its ranks launched.
    running = None
    for line in events.splitlines():
        event = json.loads(line) if line.strip() else {}
        change = event.get("stateChanged") or {}
        if running is None and change.get("to") == "JOB_STATE_RUNNING":
            running = when(event["time"])
    plan = job.get("plan") or {}
    return {
        "job": job_id,
        "state": job.get("state", "").replace("JOB_STATE_", ""),
        "first_step_s": max(stamps.values()) - start if len(stamps) == args.ranks else None,
        "launched_s": running - start if running else None,
        "end_s": ended - start,
        "per_device_batch": int(plan.get("perDeviceBatch", 0)),
        "grad_accum_steps": int(plan.get("gradAccumSteps", 0) or 1),
        "devices": len(plan.get("deviceIds", [])),
        "attempts": len(job.get("attemptHistory", [])),
        "ooms": len(job.get("oomHistory", [])),
    }


def reference(args, work, batch, run):
    """The script as torchrun starts it; its figures, seconds from just before the processes start."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.module_path:
        env["PYTHONPATH"] = args.module_path + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    script = [SCRIPT, "--max_steps", str(args.max_steps), *args.script_args.split(), "--batch_size", str(batch)]
    log_path = os.path.join(work, f"torchrun-{run}.log")
    procs = []
    with open(log_path, "w") as log:
        start = time.time()
        if args.launcher == "torchrun":
            procs.append(subprocess.Popen(
                [args.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
                 *script], cwd=SCRIPTS, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        else:
            port = free_port()
            for rank in range(args.ranks):
                rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                                LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen([args.python, *script], cwd=SCRIPTS, env=rank_env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        try:
            deadline = time.monotonic() + args.job_timeout
            for p in procs:
                p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        ended = time.time()
    with open(log_path) as f:
        stamps = first_steps(f.read())
    ok = all(p.returncode == 0 for p in procs)
    return {
        "state": "SUCCEEDED" if ok else f"FAILED (exit {[p.returncode for p in procs]})",
        "first_step_s": max(stamps.values()) - start if len(stamps) == args.ranks else None,
        "end_s": ended - start,
        "per_device_batch": batch,
    }


def one_run(args, run):
    work = os.path.join(args.work, f"run-{run}")
    os.makedirs(work)
    figures = {}

    def fitrun_side():
        fitrund = Fitrund(args, work)
        try:
            base = write_spec(args, work, "script-start")
            variant = write_spec(args, work, "script-start-variant", ("--tag", "b"))
            figures["first"] = fitrun_job(args, fitrund, base, work, "first")
            figures["second"] = fitrun_job(args, fitrund, base, work, "second")
            figures["variant"] = fitrun_job(args, fitrund, variant, work, "variant")
        finally:
            fitrund.stop()

    # The reference runs at the batch the first submit was planned (the even split of the global batch
    # when that job did not say); it goes first every other run, so that neither side always meets the
    # machine's caches first.
    even = max(1, args.global_batch // args.ranks)
    if run % 2 == 1:
        fitrun_side()
        figures["torchrun"] = reference(args, work, figures["first"]["per_device_batch"] or even, run)
    else:
        figures["torchrun"] = reference(args, work, even, run)
        fitrun_side()
    return figures


def write_json(args, runs):
    if not args.json:
        return
    medians = {side: median(r[side]["first_step_s"] for r in runs) for side in SIDES}
    conditions = {"ranks": args.ranks, "devices": args.devices, "launcher": args.launcher,
                  "global_batch": args.global_batch, "max_steps": args.max_steps, "script_args": args.script_args,
                  "python": args.python, "cores": os.cpu_count(), "runs_asked": args.runs}
    with open(args.json + ".partial", "w") as f:
        json.dump({"conditions": conditions, "runs": runs, "median_first_step_s": medians,
                   "over_torchrun": {side: ratio(medians[side], medians["torchrun"]) for side in SIDES[:3]}}, f,
                  indent=1)
    os.replace(args.json + ".partial", args.json)


def seconds(value):
    return f"{value:.2f}" if value is not None else "-"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def main():
    bin_dir = os.path.join(ROOT, "bazel-bin")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0,
                        help="seconds: start no run that the last one's length would carry past this (0: none)")
    parser.add_argument("--fitrund", default=os.path.join(bin_dir, "server", "fitrund"))
    parser.add_argument("--fitrun", default=os.path.join(bin_dir, "client", "fitrun"))
    parser.add_argument("--worker", default=os.path.join(bin_dir, "worker", "fitrun-worker"),
                        help="fitrund's --worker_binary (fitrun-supervisor beside it runs script ranks)")
    parser.add_argument("--fitrund-flag", action="append", default=[], help="another fitrund flag (repeatable)")
    parser.add_argument("--devices", default="cpu:2x4GiB", help="fitrund's --devices")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--python", default="/usr/bin/python3", help="the scripts' Python, both sides")
    parser.add_argument("--launcher", choices=["env", "torchrun"], default="env")
    parser.add_argument("--module-path", default=os.path.join(ROOT, "client", "python"),
                        help="the reference's PYTHONPATH for the fitrun module, which fitrun gives its ranks")
    parser.add_argument("--script-args", default="", help="more arguments for lm_train.py, both sides")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--job-timeout", type=float, default=300)
    parser.add_argument("--work", default="", help="a folder for the runs' state and logs (default: a temporary one)")
    parser.add_argument("--json", default="", help="write every figure here")
    args = parser.parse_args()
    for path in (args.fitrund, args.fitrun, args.worker):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: bazel build //server:fitrund //worker:fitrun-worker "
                     "//worker:fitrun-supervisor //worker/memory:libfitrun_memory.so //client:fitrun")
    args.work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="fitrun-script-start-")
    os.makedirs(args.work, exist_ok=True)
    # A TERM (the GPU check's timeout) stops like Ctrl-C: every fitrund and rank this started goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    runs, began, last = [], time.monotonic(), 0.0
    for run in range(1, args.runs + 1):
        if args.budget and runs and time.monotonic() - began + last > args.budget:
            print(f"run {run}: not started: {args.budget:.0f} s budget", file=sys.stderr, flush=True)
            break
        started = time.monotonic()
        figures = one_run(args, run)
        last = time.monotonic() - started
        runs.append(figures)
        write_json(args, runs)  # after every run: a run cut short by a deadline keeps the ones before
        print(f"run {run}: to the first step: fitrun first {seconds(figures['first']['first_step_s'])} s "
              f"(launched at {seconds(figures['first']['launched_s'])} s), second "
              f"{seconds(figures['second']['first_step_s'])} s, variant {seconds(figures['variant']['first_step_s'])} s "
              f"(launched at {seconds(figures['variant']['launched_s'])} s); torchrun "
              f"{seconds(figures['torchrun']['first_step_s'])} s; states "
              f"{', '.join(figures[s]['state'] for s in SIDES)}", flush=True)

    medians = {side: median(r[side]["first_step_s"] for r in runs) for side in SIDES}
    ratios = {side: ratio(medians[side], medians["torchrun"]) for side in SIDES[:3]}
    plans = sorted({(r["first"]["devices"], r["first"]["per_device_batch"], r["first"]["grad_accum_steps"])
                    for r in runs})
    print()
    print(f"submit to first optimizer step, {SCRIPT} on {args.ranks} rank(s) ({args.devices}; plan "
          f"{', '.join(f'{d} x {b} x {k}' for d, b, k in plans)}), global batch {args.global_batch}, "
          f"{args.launcher} launcher; {os.cpu_count()} cores; median of {len(runs)} run(s), each run's in brackets")
    print("| side | to first step (s) | launched (s) | vs torchrun |")
    print("| --- | ---: | ---: | ---: |")
    names = {"first": "fitrun, first submit (fresh fitrund)", "second": "fitrun, second submit (same spec)",
             "variant": "fitrun, second submit with `--tag b`", "torchrun": f"torchrun ({args.launcher})"}
    for side in SIDES:
        each = ", ".join(seconds(r[side]["first_step_s"]) for r in runs)
        launched = median(r[side].get("launched_s") for r in runs)
        print(f"| {names[side]} | {seconds(medians[side])} ({each}) | {seconds(launched)} | "
              f"{f'{ratios[side]:.2f}x' if side in ratios and ratios[side] is not None else '1.00x' if side == 'torchrun' else '-'} |")
    write_json(args, runs)
    return 0 if runs and all(r[s]["state"] == "SUCCEEDED" for r in runs for s in SIDES) else 1


if __name__ == "__main__":
    sys.exit(main())
