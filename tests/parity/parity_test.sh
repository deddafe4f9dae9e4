#!/usr/bin/env bash
# Parity with PyTorch: two fitrun-worker ranks and two ranks of PyTorch's DistributedDataParallel
# (Debian's python3-torch) train the mlp on Fashion-MNIST from the same initial weights and the same
# sample order, once per communication hook (spec.ddp.comm_hook: none, fp16, bf16, powersgd; PyTorch
# with the same hook registered, PowerSGD compressing from step POWERSGD_START + 1); their global
# losses after step 1 and after the last step must agree within TOLERANCE. Both sides' DDP buckets
# must hold the same parameters, for the mlp here and for the cnn (a short run each).
# Real processes on OS-chosen ports, killed on exit whatever happens.
set -euo pipefail

STEPS=30
BATCH=32          # per rank; global batch 64
LR=0.05
MOMENTUM=0.9
POWERSGD_START=10
HOOKS="none fp16 bf16 powersgd"
TOLERANCE=0.0001  # absolute, on losses of 0.5-2.3: fp32 summation order differs between the two
DATA=/usr/share/datasets/fashion-mnist

runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-fitrun}"
worker="$runfiles/worker/fitrun-worker"
reference="$runfiles/tests/parity/torch_ddp_reference.py"
work="${TEST_TMPDIR:-$(mktemp -d)}/parity"
rm -rf "$work" && mkdir -p "$work"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run_pair NAME LOG_PREFIX COMMAND...: two ranks of COMMAND, logs in $work/LOG_PREFIX{0,1}.log.
run_pair() {
  local what=$1 prefix=$2 port
  shift 2
  port=$(free_port)
  for rank in 0 1; do
    # OMP_NUM_THREADS=1 as torchrun sets it: PyTorch's OpenBLAS then computes on one thread, as a fitrun
    # rank's does (worker/runtime/compute_threads.h), and the sums come out in the same order.
    env RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 "$@" \
      > "$work/$prefix$rank.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    if ! timeout 120 tail --pid="$p" -f /dev/null; then echo "$what did not finish"; exit 1; fi
    wait "$p" || { echo "$what failed:"; cat "$work/$prefix"*.log; exit 1; }
  done
  pids=()
}

# worker_run MODEL HOOK STEPS: a 2-rank fitrun-worker run; its initial state in $work/dump-MODEL.
worker_run() {
  local model=$1 hook=$2 steps=$3 ddp
  ddp="collective_timeout_seconds: 30 comm_hook: COMM_HOOK_${hook^^}"
  if [[ $hook == powersgd ]]; then ddp="$ddp powersgd_start_iter: $POWERSGD_START"; fi
  mkdir -p "$work/dump-$model"
  cat > "$work/assignment-$model-$hook.textproto" <<EOT
job_id: "parity"
spec {
  model { builtin: "$model" }
  data { kind: DATA_KIND_FASHION_MNIST path: "$DATA" }
  optimizer { kind: OPTIMIZER_KIND_SGD lr: $LR momentum: $MOMENTUM }
  seed: 17
  ddp { $ddp }
}
plan {
  device_ids: "cpu:0" device_ids: "cpu:1"
  per_device_batch: $BATCH grad_accum_steps: 1 learning_rate: $LR total_steps: $steps
}
cpu_threads: 1 cpu_threads: 1
EOT
  run_pair "fitrun-worker ($model, $hook)" "worker-$model-$hook-" \
    env FITRUN_ASSIGNMENT="$work/assignment-$model-$hook.textproto" FITRUN_DUMP_INITIAL_STATE="$work/dump-$model" \
    "$worker"
}

for hook in $HOOKS; do worker_run mlp "$hook" $STEPS; done
worker_run cnn none 1

run_pair "PyTorch (mlp)" "torch-mlp-" /usr/bin/python3 "$reference" --data "$DATA" --dump "$work/dump-mlp" \
  --model mlp --steps $STEPS --batch $BATCH --lr $LR --momentum $MOMENTUM --comm-hooks "${HOOKS// /,}" \
  --powersgd-start-iter $POWERSGD_START
# Two steps: DDP rebuilds its buckets after the first.
run_pair "PyTorch (cnn)" "torch-cnn-" /usr/bin/python3 "$reference" --data "$DATA" --dump "$work/dump-cnn" \
  --model cnn --steps 2 --batch $BATCH --lr $LR --momentum $MOMENTUM

/usr/bin/python3 - "$work" "$TOLERANCE" "$STEPS" "$HOOKS" <<'EOPY'
import json, re, sys
work, tolerance, steps, hooks = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()

def torch_runs(model):
    return {run["comm_hook"]: run for run in
            (json.loads(l) for l in open(f"{work}/torch-{model}-0.log") if l.startswith("{"))}

def worker_buckets(log):
    line = re.search(r"ddp: \d+ buckets (.*), comm hook", log).group(1)
    return [b.split() for b in re.findall(r"\[([^\]]*)\]", line)]

failures = []
torch_mlp = torch_runs("mlp")
for hook in hooks:
    log = open(f"{work}/worker-mlp-{hook}-0.log").read()
    first = float(re.search(r"step 1/\d+ epoch \d+ loss ([0-9.]+)", log).group(1))
    final = float(re.search(r"final loss ([0-9.eE+-]+)", log).group(1))
    t_first, t_final = torch_mlp[hook]["losses"][0], torch_mlp[hook]["losses"][-1]
    print(f"{hook:9s} step 1: fitrun {first:.4f} pytorch {t_first:.4f}   step {steps}: fitrun {final:.6f} "
          f"pytorch {t_final:.6f}  difference {abs(final - t_final):.1e} (tolerance {tolerance})")
    # The run must actually have trained, or agreement would prove nothing.
    if not final < first - 0.3: failures.append(f"{hook}: loss did not fall: {first} -> {final}")
    if abs(first - t_first) > tolerance: failures.append(f"{hook}: step-1 losses differ")
    if abs(final - t_final) > tolerance: failures.append(f"{hook}: final losses differ")
    if not re.search(rf"comm hook {hook}\b", log): failures.append(f"{hook}: the worker did not run the hook")
# PowerSGD must have compressed, or its agreement would be the plain all-reduce's.
if "powersgd" in hooks:
    if abs(torch_mlp["powersgd"]["losses"][-1] - torch_mlp["none"]["losses"][-1]) < 0.01:
        failures.append("powersgd: ended where the plain all-reduce did; did it compress?")

for model, runs, log in [("mlp", torch_mlp, f"{work}/worker-mlp-none-0.log"),
                         ("cnn", torch_runs("cnn"), f"{work}/worker-cnn-none-0.log")]:
    ours, theirs = worker_buckets(open(log).read()), runs["none"]["buckets"]
    print(f"{model} buckets: fitrun {ours}\n{' ' * len(model)}          pytorch {theirs}")
    # The order inside a bucket may differ (PyTorch's follows the first backward's ready order):
    # every hook works per element or per parameter, so only membership changes numbers.
    if [sorted(b) for b in ours] != [sorted(b) for b in theirs]:
        failures.append(f"{model}: bucket layouts differ")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PASS")
EOPY
