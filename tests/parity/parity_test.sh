#!/usr/bin/env bash
# Parity with PyTorch: two fitrun-worker ranks and two ranks of PyTorch's DistributedDataParallel
# (Debian's python3-torch) train the mlp on Fashion-MNIST from the same initial weights and the same
# sample order; their global losses after step 1 and after the last step must agree within
# TOLERANCE. Real processes on OS-chosen ports, killed on exit whatever happens.
set -euo pipefail

STEPS=30
BATCH=32          # per rank; global batch 64
LR=0.05
MOMENTUM=0.9
TOLERANCE=0.0005  # absolute, on losses of 0.5-2.3: fp32 summation order differs between the two
DATA=/usr/share/datasets/fashion-mnist

runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-fitrun}"
worker="$runfiles/worker/fitrun-worker"
reference="$runfiles/tests/parity/torch_ddp_reference.py"
work="${TEST_TMPDIR:-$(mktemp -d)}/parity"
rm -rf "$work" && mkdir -p "$work/dump"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

cat > "$work/assignment.textproto" <<EOT
job_id: "parity"
spec {
  model { builtin: "mlp" }
  data { kind: DATA_KIND_FASHION_MNIST path: "$DATA" }
  optimizer { kind: OPTIMIZER_KIND_SGD lr: $LR momentum: $MOMENTUM }
  seed: 17
  ddp { collective_timeout_seconds: 30 }
}
plan {
  device_ids: "cpu:0" device_ids: "cpu:1"
  per_device_batch: $BATCH grad_accum_steps: 1 learning_rate: $LR total_steps: $STEPS
}
cpu_threads: 1 cpu_threads: 1
EOT

port=$(free_port)
for rank in 0 1; do
  env RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    FITRUN_ASSIGNMENT="$work/assignment.textproto" FITRUN_DUMP_INITIAL_STATE="$work/dump" \
    "$worker" > "$work/worker$rank.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do
  if ! timeout 120 tail --pid="$p" -f /dev/null; then echo "worker did not finish"; exit 1; fi
  wait "$p" || { echo "worker failed:"; cat "$work"/worker*.log; exit 1; }
done
pids=()

port=$(free_port)
for rank in 0 1; do
  env RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    /usr/bin/python3 "$reference" --data "$DATA" --dump "$work/dump" --model mlp --steps $STEPS \
    --batch $BATCH --lr $LR --momentum $MOMENTUM > "$work/torch$rank.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || { echo "PyTorch rank failed:"; cat "$work"/torch*.log; exit 1; }
done
pids=()

/usr/bin/python3 - "$work" "$TOLERANCE" "$STEPS" <<'EOPY'
import json, re, sys
work, tolerance, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
log = open(f"{work}/worker0.log").read()
first = float(re.search(r"step 1/\d+ epoch \d+ loss ([0-9.]+)", log).group(1))
final = float(re.search(r"final loss ([0-9.eE+-]+)", log).group(1))
torch_run = json.loads([l for l in open(f"{work}/torch0.log") if l.startswith("{")][-1])
t_first, t_final = torch_run["losses"][0], torch_run["losses"][-1]
print(f"step 1:      fitrun {first:.4f}  pytorch {t_first:.4f}")
print(f"step {steps}:     fitrun {final:.6f}  pytorch {t_final:.6f}  (tolerance {tolerance})")
# The run must actually have trained, or agreement would prove nothing.
assert final < first - 0.3, f"loss did not fall: {first} -> {final}"
assert abs(first - t_first) <= tolerance, "step-1 losses differ"
assert abs(final - t_final) <= tolerance, "final losses differ"
print("PASS")
EOPY
