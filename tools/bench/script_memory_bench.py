"""How close fitrund's memory plan for a script job is to what the script really takes.

    bazel build //server:fitrund //worker:fitrun-worker //worker/memory:libfitrun_memory.so \
        && /usr/bin/python3 tools/make_movielens_sample.py deploy/examples/data/ratings.dat \
        && bash tools/setup-python.sh && .venv/bin/python tools/bench/script_memory_bench.py

For each example script in deploy/examples/scripts (protein, mnist-ddp, sasrec) it starts a real
fitrund on two capped virtual CPU devices (--devices, 1 GiB each by default) and submits the example's
own spec: fitrund's script probe measures one rank (WORLD_SIZE=1) at the micro-batches of its sweep,
and the job runs on the plan. Then, at per-device batches the sweep did not measure, it submits the
same script with resources.per_device_batch fixed (2 ranks, no accumulation, a few steps) and
compares the plan's predicted peak (the probe's curve: interpolated between two measured batches, or,
beyond the largest, measured by the probe at exactly that batch before launch) with the highest
peak either rank's preloaded allocator measured in the real 2-rank DDP run.

It prints one row per run and the worst errors; docs/benchmarks.md quotes the table.
"""

import argparse
import copy
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fitrun.client import Client  # noqa: E402
from fitrun.v1 import job_pb2  # noqa: E402
from jobs import Fitrund, run_to_end  # noqa: E402

EXAMPLES = [
    # (name, spec, per-device batches to run at: odd, so a doubling sweep never measured them)
    ("protein", "deploy/examples/scripts/protein/protein.yaml", [3, 7, 13, 27]),
    ("mnist-ddp", "deploy/examples/scripts/mnist-ddp/mnist-ddp.yaml", [7, 19, 50, 200]),
    ("sasrec", "deploy/examples/scripts/sasrec/sasrec.yaml", [7, 19, 50, 100]),
]


def mib(n):
    return f"{n / (1 << 20):.2f}"


def memory_reason(job):
    for reason in job.plan.reasons:
        if reason.startswith("memory estimate:"):
            return reason
    return ""


def how_estimated(plan):
    """How the plan's peak at its fixed batch comes from the probe's curve (the planner says so)."""
    text = " ".join(plan.reasons)
    if "its peak is between the measured micro-batches" in text:
        return "interpolated"
    if "its peak is measured at micro-batch" in text:
        return "a sweep point"
    if "its peak is extrapolated" in text:
        return "probed before launch"
    return f"? ({text})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fitrund", default=os.path.join(ROOT, "bazel-bin/server/fitrund"))
    parser.add_argument("--worker", default=os.path.join(ROOT, "bazel-bin/worker/fitrun-worker"))
    parser.add_argument("--devices", default="cpu:2x1GiB", help="fitrund's --devices: two capped devices")
    parser.add_argument("--examples", default=",".join(name for name, _, _ in EXAMPLES))
    args = parser.parse_args()
    if not os.path.exists(os.path.join(ROOT, "deploy/examples/data/ratings.dat")):
        sys.exit("the sasrec example reads deploy/examples/data/ratings.dat: "
                 "run tools/make_movielens_sample.py deploy/examples/data/ratings.dat")

    # The repository's examples are a data root of this fitrund's (none is by default).
    state_dir = tempfile.mkdtemp(prefix="fitrun-script-bench-")
    daemon = Fitrund(state_dir, [f"--devices={args.devices}"], fitrund=args.fitrund, worker=args.worker,
                     data_roots=f"{ROOT},/usr/share/datasets", cwd=ROOT)
    if daemon.address is None:
        sys.exit(f"fitrund did not start:\n{daemon.log()}")
    rows = []
    errors = []
    try:
        client = Client(daemon.address, timeout=30)
        os.chdir(ROOT)  # the specs' working_dir is relative to the repository
        for name, path, batches in EXAMPLES:
            if name not in args.examples.split(","):
                continue
            base = client.plan(path).spec
            # The example as it is: fitrund probes the script, then runs it on the plan.
            started = time.monotonic()
            job, _ = run_to_end(client, base, timeout=900)
            if job.state != job_pb2.JOB_STATE_SUCCEEDED:
                raise RuntimeError(f"{name}: {job_pb2.JobState.Name(job.state)}: {job.failure_reason}")
            print(f"{name}: the example SUCCEEDED in {time.monotonic() - started:.0f} s at per-device batch "
                  f"{job.plan.per_device_batch}; {memory_reason(job)}", flush=True)
            for batch in batches:
                spec = copy.deepcopy(base)
                spec.name = f"{name}-at-{batch}"
                spec.global_batch_size = 2 * batch
                spec.resources.min_devices = 2
                spec.resources.max_devices = 2
                spec.resources.per_device_batch = batch
                spec.max_steps = 4
                # Beyond the sweep's largest batch the job's plan is the probe's measurement at that batch.
                how = how_estimated(client.plan(spec).plan)
                if how == "a sweep point":
                    continue
                run, _ = run_to_end(client, spec, timeout=900)
                attempt = run.attempt_history[-1]
                if run.state != job_pb2.JOB_STATE_SUCCEEDED or attempt.measured_peak_bytes <= 0:
                    rows.append((name, batch, how, mib(attempt.predicted_peak_bytes), "-", "-",
                                 f"{job_pb2.JobState.Name(run.state)} {run.failure_reason[:80]}"))
                    continue
                error = 100.0 * (attempt.predicted_peak_bytes - attempt.measured_peak_bytes) / attempt.measured_peak_bytes
                errors.append(error)
                rows.append((name, batch, how, mib(attempt.predicted_peak_bytes),
                             mib(attempt.measured_peak_bytes), f"{error:+.1f}%", ""))
                print("| " + " | ".join(str(c) for c in rows[-1]) + " |", flush=True)
    finally:
        daemon.stop()
        shutil.rmtree(state_dir, ignore_errors=True)

    print(f"\nScript jobs on {args.devices}: the plan's predicted peak (from fitrund's one-rank script probe) "
          f"against a 2-rank DDP run's measured peak\n")
    print("| script | per-device batch | predicted how | predicted (MiB) | measured peak (MiB) | error | note |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    if errors:
        print(f"\nover {len(errors)} runs: the lowest error {min(errors):+.1f}%, the highest {max(errors):+.1f}% "
              f"(target: within 10% of the measured peak)")


if __name__ == "__main__":
    main()
