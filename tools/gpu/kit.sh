#!/usr/bin/env bash
# Builds, here on Debian 12 (no GPU), everything a GPU machine's check (tools/gpu/check.sh) runs, into
# gpu-kit/ (git-ignored). The GPU machine has pip's PyTorch, g++, cmake and ninja, but no Bazel and no
# network, and a device call carries the working tree plus the kit, 64 MiB at most:
#
#   bash tools/gpu/kit.sh [--with-debs] [KIT]      # KIT defaults to gpu-kit
#
#   KIT/fitrun-bundle.tar.gz   fitrund and fitrun with their shared libraries (tools/bundle.sh)
#   KIT/worker.tar.xz          the CUDA worker built here against tools/gpu/torch-requirements.txt's
#                              torch (tools/gpu/build-worker.sh): worker/fitrun-worker,
#                              worker/fitrun-supervisor, worker/memory/libfitrun_memory.so and
#                              client/python/fitrun/, laid out as the worker looks for them, stripped,
#                              their RUNPATH $ORIGIN/../torch-lib and $ORIGIN/../cuda-lib: the links
#                              check.sh makes to the machine's own torch/lib and nvidia/cu13/lib
#   KIT/datasets/fashion-mnist Fashion-MNIST's first 20,000 training images and its 10,000 test images
#                              (IDX .gz): the whole 60,000 would take half of what a call carries
#   KIT/MANIFEST               what is in it (key=value): the commit, the torch and NCCL the worker was
#                              built against, each part's size
#   KIT/debs/*.deb             with --with-debs: Debian 12's protobuf, gRPC and Abseil packages, for
#                              check.sh to build the worker there when the machine's torch is another
#                              version than the kit's (without them it fails, naming this option)
#
# The working tree plus the kit must stay within 56 MiB, which leaves room for what a check brings back:
# this fails past it, naming each part's size.
set -euo pipefail
cd "$(dirname "$0")/../.."

with_debs=0
if [[ "${1:-}" == "--with-debs" ]]; then
  with_debs=1
  shift
fi
kit=${1:-gpu-kit}
limit_mib=56

log() { printf '[kit %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "kit: $*" >&2; exit 1; }
size() { du -scb "$@" | tail -n 1 | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

[[ -d /usr/share/datasets/fashion-mnist ]] ||
  die "/usr/share/datasets/fashion-mnist is missing: apt-get install dataset-fashion-mnist (tools/install-deps.sh)"
rm -rf "$kit"
mkdir -p "$kit"

# 1. The worker's CMake source list must still match Bazel's, or the kit would hold another worker.
log "worker/CMakeLists.txt against bazel query"
bash tools/gpu/check_sources.sh

# 2. The bundle.
log "bundle (bazel build //server:fitrund //client:fitrun, then tools/bundle.sh)"
bash tools/bundle.sh "$kit/fitrun-bundle.tar.gz" >/dev/null

# 3. The CUDA worker, its supervisor, the memory library and the Python module.
log "the CUDA worker (tools/gpu/build-worker.sh build-cuda)"
bash tools/setup-torch.sh
bash tools/gpu/build-worker.sh build-cuda
torch_version=$(.venv-torch/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null)
nccl_version=$(.venv-torch/bin/python -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/worker/memory" "$staging/client/python"
cp build-cuda/worker/fitrun-worker build-cuda/worker/fitrun-supervisor "$staging/worker/"
cp build-cuda/worker/memory/libfitrun_memory.so "$staging/worker/memory/"
cp -r build-cuda/client/python/fitrun "$staging/client/python/"
strip --strip-unneeded "$staging/worker/fitrun-worker" "$staging/worker/fitrun-supervisor" \
  "$staging/worker/memory/libfitrun_memory.so"
# Found at start on the machine: check.sh links torch-lib and cuda-lib beside worker/ to its own
# torch's lib/ and nvidia/cu13/lib/ (the CUDA runtime the worker calls itself).
patchelf --set-rpath '$ORIGIN/../torch-lib:$ORIGIN/../cuda-lib' "$staging/worker/fitrun-worker"
patchelf --set-rpath '$ORIGIN/../../torch-lib:$ORIGIN/../../cuda-lib' "$staging/worker/memory/libfitrun_memory.so"
tar -C "$staging" -cJf "$kit/worker.tar.xz" worker client

# 4. Fashion-MNIST: the first 20,000 training images and every test image.
log "Fashion-MNIST (20,000 training images, 10,000 test)"
/usr/bin/python3 tools/gpu/idx_subset.py /usr/share/datasets/fashion-mnist "$kit/datasets/fashion-mnist" 20000

# 5. The .debs for a build there, on request.
if ((with_debs)); then
  log "Debian packages for a build on the GPU machine"
  bash tools/gpu/debs.sh "$kit/debs"
fi

# 6. What went in, and what it weighs against what a device call carries.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
{
  echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+uncommitted')"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "torch=$torch_version"
  echo "nccl=$nccl_version"
  echo "bundle_mib=$(mib "$(size "$kit/fitrun-bundle.tar.gz")")"
  echo "worker_mib=$(mib "$(size "$kit/worker.tar.xz")")"
  echo "datasets_mib=$(mib "$(size "$kit/datasets")")"
  if ((with_debs)); then echo "debs_mib=$(mib "$(size "$kit/debs")")"; fi
  echo "tree_mib=$(mib "$tree_bytes")"
} >"$kit/MANIFEST"
kit_bytes=$(size "$kit")
total=$((tree_bytes + kit_bytes))
echo "total_mib=$(mib "$total")" >>"$kit/MANIFEST"
cat "$kit/MANIFEST"
log "kit $(mib "$kit_bytes") MiB + working tree $(mib "$tree_bytes") MiB = $(mib "$total") MiB of $limit_mib"
((total <= limit_mib * 1048576)) || die "over the $limit_mib MiB a device call may carry with room for its results"
log "done: carry '$kit' to the GPU machine and run tools/gpu/check.sh there (its header says how)"
