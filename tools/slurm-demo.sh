#!/usr/bin/env bash
# The README's Slurm demo: starts a real three-node Slurm cluster on this machine (tests/slurm/cluster.py:
# Debian's munged, slurmctld and three `slurmd -N`), fitrund --cluster=slurm on it with two virtual CPU
# devices per node and a shared directory, and runs deploy/examples/fashion-mnist-mlp-2-nodes.yaml across
# two of its nodes; prints what Slurm saw of it, and tears everything down. Needs root (slurmd).
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install-deps.sh
bash tools/setup-python.sh
bazel build //server:fitrund //worker:fitrun-worker //client:fitrun
exec /usr/bin/python3 tools/slurm_demo.py "${1:-deploy/examples/fashion-mnist-mlp-2-nodes.yaml}"
