#!/usr/bin/env bash
# Builds the CUDA worker with worker/CMakeLists.txt against the PyTorch of .venv-torch
# (tools/setup-torch.sh), here on Debian 12 with the CUDA toolkit of /usr/local/cuda and Debian's own
# protobuf, gRPC and Abseil archives:
#
#   bash tools/gpu/build-worker.sh BUILD_DIR [CMAKE_ARG...]   # e.g. -DFITRUN_BUILD_TESTS=ON
#
# BUILD_DIR keeps the build between runs (a second run rebuilds what changed), and ccache, where
# installed (tools/install-deps.sh), keeps the objects between clean clones. Out: BUILD_DIR/worker/
# fitrun-worker, fitrun-supervisor, memory/libfitrun_memory.so, and BUILD_DIR/client/python/fitrun/.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 ]] || { echo "usage: $0 BUILD_DIR [CMAKE_ARG...]" >&2; exit 2; }
build=$1
shift
torch_dir=$PWD/.venv-torch/lib/python3.11/site-packages/torch
[[ -f "$torch_dir/share/cmake/Torch/TorchConfig.cmake" ]] ||
  { echo "build-worker: no LibTorch at $torch_dir: run tools/setup-torch.sh" >&2; exit 1; }
[[ -x /usr/local/cuda/bin/nvcc ]] || { echo "build-worker: no CUDA toolkit at /usr/local/cuda" >&2; exit 1; }
mkdir -p "$build"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths under the clone are hashed relative to it, so a fresh clone (its BUILD_DIR and .venv-torch
  # inside it, at the same places) hits the objects an earlier clone compiled.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
cmake -S worker -B "$build" -G Ninja -Wno-dev \
  -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake" -DFITRUN_DEPS_PREFIX=/ -DCUDAToolkit_ROOT=/usr/local/cuda \
  -DFITRUN_TORCH_PYTHON="$PWD/.venv-torch/bin/python" "${launcher[@]}" "$@" >"$build/cmake.log" 2>&1 ||
  { cat "$build/cmake.log" >&2; exit 1; }
grep -h '^-- fitrun: ' "$build/cmake.log" | sed 's/^-- //' || true
ninja -C "$build" -j "${JOBS:-$(nproc)}"
