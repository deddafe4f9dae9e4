#!/usr/bin/env bash
# Installs every Debian package fitrun needs to build, test and run its demo.
# Idempotent: packages already present are skipped, so re-running costs only a dpkg query.
set -euo pipefail

packages=(
  # build
  bazel-bootstrap bazel-platforms g++
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev prometheus-cpp-dev libsqlite3-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # worker: LibTorch (CPU) with Gloo, and a fast BLAS behind Debian's libblas.so.3 alternative
  libtorch-dev libgloo-dev libopenblas0-pthread
  # data
  dataset-fashion-mnist
  # tests and tools
  curl procps
  # the parity test and the benchmark run PyTorch's own DistributedDataParallel as the reference
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
