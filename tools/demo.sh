#!/usr/bin/env bash
# The README's demo command: installs what is missing, builds, starts fitrund with its defaults
# (state in ./fitrun-state, virtual CPU devices when there is no GPU), shows the devices and the
# plan, submits deploy/examples/fashion-mnist-mlp.yaml, follows it live to the end, prints the
# result and what /metrics shows of it, and stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install-deps.sh
bash tools/setup-python.sh
bazel build //server:fitrund //worker:fitrun-worker //client:fitrun

state_dir=${FITRUN_STATE_DIR:-fitrun-state}
spec=${1:-deploy/examples/fashion-mnist-mlp.yaml}
mkdir -p "$state_dir"
rm -f "$state_dir/fitrund.address" "$state_dir/fitrund.metrics_address"

bazel-bin/server/fitrund --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state_dir" \
  --devices=auto >>"$state_dir/fitrund.log" 2>&1 &
daemon=$!
stop_daemon() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
}
trap stop_daemon EXIT

for _ in $(seq 1 300); do
  [[ -s "$state_dir/fitrund.metrics_address" ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$state_dir/fitrund.log"; exit 1; }
  sleep 0.1
done
address=$(cat "$state_dir/fitrund.address")
echo "fitrund is serving on $address (metrics: http://$(cat "$state_dir/fitrund.metrics_address")/metrics)"

fitrun() { bazel-bin/client/fitrun --coordinator="$address" "$@"; }
echo; echo "\$ fitrun devices"; fitrun devices
echo; echo "\$ fitrun plan $spec"; fitrun plan "$spec"
echo; echo "\$ fitrun submit $spec --watch"; fitrun submit "$spec" --watch

# What Prometheus sees of it: the estimator's error (one observation per rank of the finished
# attempt) and the devices' memory.
metrics_address=$(cat "$state_dir/fitrund.metrics_address")
echo; echo "\$ curl -s http://$metrics_address/metrics | grep -E 'memory_prediction_ratio_(count|sum)|device_memory'"
curl -s "http://$metrics_address/metrics" | grep -E '^fitrun_(memory_prediction_ratio_(count|sum)|device_memory_)'
echo; echo "(while fitrund runs, its web page is at http://$metrics_address/)"
