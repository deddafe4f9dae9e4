"""How a rank trains, side by side: the plan fitrund chooses against the strategies it could have taken.

    bazel build -c opt //server:fitrund //worker:fitrun-worker \
        && bash tools/setup-python.sh && .venv/bin/python tools/bench/strategies_bench.py [--cases sharding,checkpointing]

Each case starts a real fitrund on capped virtual CPU devices and submits one spec several times: as it
is (the planner's choice) and with each strategy pinned or forbidden in the spec (spec.ddp.zero_stage,
spec.model.gpt.activation_checkpointing). Every run gets its own calibrated plan (fitrund probes each
workload once) and trains a few steps; the table shows the plan (per-device batch x accumulation, the
strategy), its predicted peak against the highest peak a rank measured, and the samples/s rank 0
trained at, with the chosen plan marked. A run the planner refuses shows why.

- sharding: a GPT-2-small-shaped gpt (12 x 768, context 256, AdamW, fp32) on two 1700 MiB devices, where
  keeping every optimizer state on every rank does not fit, and on two 4 GiB devices, where it does.
- checkpointing: a 6 x 384 gpt (context 256, global batch 8) on one tight device, where recomputing the
  blocks in backward fits the whole batch in one pass and keeping their activations fits a quarter of it;
  and an 8 x 256 gpt (context 128, global batch 16) on another, a shape the step-time model was not
  tuned to. The planner weighs the two by its step-time model (docs/memory-plans.md); the verdict
  says whether its choice was the faster one measured.

docs/benchmarks.md quotes the table, with the machine it ran on.
"""

import argparse
import copy
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fitrun.client import Client, ClientError  # noqa: E402
from fitrun.v1 import job_pb2  # noqa: E402
from jobs import Fitrund, run_to_end  # noqa: E402

TEXT = "/usr/share/common-licenses/GPL-3"

def gpt_spec(name, layers, heads, hidden, global_batch, devices, context=256, steps=6):
    """A gpt over the GPL's text, AdamW in fp32, `steps` steps on exactly `devices` devices."""
    return f"""name: {name}
model:
  builtin: gpt
  gpt: {{layers: {layers}, heads: {heads}, hidden: {hidden}, context: {context}}}
data: {{kind: text, path: {TEXT}}}
optimizer: {{kind: adamw, lr: 0.0003, weight_decay: 0.01, lr_scaling: none}}
global_batch_size: {global_batch}
max_steps: {steps}
precision: fp32
resources: {{min_devices: {devices}, max_devices: {devices}}}
seed: 1
"""


GPT2_SMALL = gpt_spec("gpt2-small-shape", layers=12, heads=12, hidden=768, global_batch=2, devices=2)
GPT_6X384 = gpt_spec("gpt-6x384", layers=6, heads=6, hidden=384, global_batch=8, devices=1)
GPT_8X256 = gpt_spec("gpt-8x256", layers=8, heads=8, hidden=256, global_batch=16, devices=1, context=128, steps=12)


def pin_sharding(stage):
    def apply(spec):
        spec.ddp.zero_stage = stage
    return apply


def pin_checkpointing(on):
    def apply(spec):
        spec.model.gpt.activation_checkpointing = on
    return apply


# (case, devices, spec, [(variant, how to change the spec or None for the planner's choice)])
CASES = [
    ("sharding", "cpu:2x1700MiB", GPT2_SMALL, [("as submitted", None), ("zero_stage: 0", pin_sharding(0))]),
    ("sharding", "cpu:2x4GiB", GPT2_SMALL, [("as submitted", None), ("zero_stage: 1", pin_sharding(1))]),
    ("checkpointing", "cpu:1x420MiB", GPT_6X384,
     [("as submitted", None), ("activation_checkpointing: true", pin_checkpointing(True)),
      ("activation_checkpointing: false", pin_checkpointing(False))]),
    ("checkpointing", "cpu:1x200MiB", GPT_8X256,
     [("as submitted", None), ("activation_checkpointing: true", pin_checkpointing(True)),
      ("activation_checkpointing: false", pin_checkpointing(False))]),
]


def mib(n):
    return f"{n / (1 << 20):.1f}"


def strategy(spec, plan):
    parts = [f"{plan.per_device_batch} x {plan.grad_accum_steps}"]
    if plan.zero_stage == 1:
        parts.append("states sharded")
    if plan.activation_checkpointing:
        parts.append("activations recomputed")
    return ", ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fitrund", default=os.path.join(ROOT, "bazel-out/k8-opt/bin/server/fitrund"))
    parser.add_argument("--worker", default=os.path.join(ROOT, "bazel-out/k8-opt/bin/worker/fitrun-worker"))
    parser.add_argument("--cases", default="sharding,checkpointing")
    args = parser.parse_args()

    rows = []
    verdicts = []
    for case, devices, yaml, variants in CASES:
        if case not in args.cases.split(","):
            continue
        state_dir = tempfile.mkdtemp(prefix="fitrun-strategies-bench-")
        daemon = Fitrund(state_dir, [f"--devices={devices}"], fitrund=args.fitrund, worker=args.worker,
                         data_roots=os.path.dirname(TEXT))
        if daemon.address is None:
            sys.exit(f"fitrund did not start:\n{daemon.log()}")
        try:
            client = Client(daemon.address, timeout=60)
            spec_path = os.path.join(state_dir, "spec.yaml")
            with open(spec_path, "w") as f:
                f.write(yaml)
            base = client.plan(spec_path).spec
            measured = []
            for variant, change in variants:
                spec = copy.deepcopy(base)
                if change is not None:
                    change(spec)
                chosen = change is None
                try:
                    job, _ = run_to_end(client, spec, timeout=1800)
                except ClientError as e:  # refused at submit: no plan fits
                    rows.append((case, devices, variant, "-", "-", "-", "-", f"refused: {str(e)[:150]}"))
                    print("| " + " | ".join(rows[-1]) + " |", flush=True)
                    continue
                if job.state != job_pb2.JOB_STATE_SUCCEEDED:
                    rows.append((case, devices, variant, "-", "-", "-", "-",
                                 f"{job_pb2.JobState.Name(job.state)}: {job.failure_reason[:110]}"))
                    print("| " + " | ".join(rows[-1]) + " |", flush=True)
                    continue
                attempt = job.attempt_history[-1]
                samples = job.result.steps * spec.global_batch_size
                rate = samples / job.result.train_seconds if job.result.train_seconds > 0 else 0.0
                measured.append((rate, variant, chosen))
                rows.append((case, devices, variant + (" (chosen)" if chosen else ""), strategy(spec, job.plan),
                             mib(attempt.predicted_peak_bytes), mib(attempt.measured_peak_bytes), f"{rate:.2f}",
                             f"loss {job.result.final_loss:.4f}"))
                print("| " + " | ".join(rows[-1]) + " |", flush=True)
                if chosen:  # why the planner chose it
                    for reason in job.plan.reasons:
                        if reason.startswith(("strategy:", "zero_stage:", "activation_checkpointing:")):
                            print(f"  {reason}", flush=True)
            chosen_rates = [rate for rate, _, chosen in measured if chosen]
            if chosen_rates and measured:
                best_rate, best_variant, _ = max(measured)
                verdicts.append(f"{case} on {devices}: the chosen plan trains at {chosen_rates[0]:.2f} samples/s, "
                                f"{100 * chosen_rates[0] / best_rate:.0f}% of the fastest feasible "
                                f"({best_variant}, {best_rate:.2f})")
        finally:
            daemon.stop()
            shutil.rmtree(state_dir, ignore_errors=True)

    print("\n| case | devices | spec | plan (batch x accumulation) | predicted (MiB) | measured peak (MiB) "
          "| samples/s | note |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()
    for verdict in verdicts:
        print(verdict)


if __name__ == "__main__":
    main()
