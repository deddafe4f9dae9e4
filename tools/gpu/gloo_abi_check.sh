#!/usr/bin/env bash
# Why the CUDA worker has no Gloo: pip's torch wheel ships its Gloo inside libtorch_cpu.so but no Gloo
# headers, and Debian's libgloo-dev headers are older than the Gloo it was built with. This checks
# that by the ABI, not by reading headers: it compiles the wheel's ProcessGroupGloo.hpp against
# Debian's Gloo headers, which emits c10d::ProcessGroupGloo::GlooStore's vtable (every virtual of it
# is inline), and compares that vtable's size with the one in the wheel's libtorch_cpu.so. Different
# sizes mean the classes a worker would compile do not match the library's, so Gloo cannot be had.
#
#   bash tools/gpu/gloo_abi_check.sh      # after tools/setup-torch.sh; tools/gpu/rehearse.sh runs it
#
# Exits 0 when the layouts differ (the finding docs/gpu.md states: the worker is right to build
# without Gloo), 1 when they match (then Gloo can be had: build the worker with it, and run the
# multi-rank tests on 2.x), 2 when it cannot tell.
set -euo pipefail
cd "$(dirname "$0")/../.."
torch=$PWD/.venv-torch/lib/python3.11/site-packages/torch
[[ -f "$torch/lib/libtorch_cpu.so" ]] || { echo "gloo_abi_check: no torch in .venv-torch: run tools/setup-torch.sh" >&2; exit 2; }
[[ -f /usr/include/gloo/rendezvous/store.h ]] ||
  { echo "gloo_abi_check: no Debian Gloo headers: apt-get install libgloo-dev (tools/install-deps.sh)" >&2; exit 2; }
[[ ! -d "$torch/include/gloo" ]] || echo "gloo_abi_check: note: this torch ships Gloo headers ($torch/include/gloo)"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/glooStore.cc" <<'CC'
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
c10d::ProcessGroupGloo::GlooStore* MakeGlooStore(const c10::intrusive_ptr<c10d::Store>& store) {
  return new c10d::ProcessGroupGloo::GlooStore(store);
}
CC
# The wheel's headers first, Debian's Gloo from /usr/include (the wheel has none of its own).
g++ -std=c++17 -c -O0 -DUSE_C10D_GLOO -I"$torch/include" -I"$torch/include/torch/csrc/api/include" \
  "$scratch/glooStore.cc" -o "$scratch/glooStore.o" 2>"$scratch/compile.log" ||
  { tail -n 20 "$scratch/compile.log" >&2; echo "gloo_abi_check: the wheel's ProcessGroupGloo.hpp does not compile against Debian's Gloo headers" >&2; exit 0; }

vtable_size() { nm "$@" | awk '$4 == "vtable" && $6 == "c10d::ProcessGroupGloo::GlooStore" { print $2 }'; }
compiled=$(vtable_size -SC "$scratch/glooStore.o")
library=$(vtable_size -DSC "$torch/lib/libtorch_cpu.so")
[[ "$compiled" =~ ^[0-9a-f]+$ && "$library" =~ ^[0-9a-f]+$ ]] ||
  { echo "gloo_abi_check: GlooStore's vtable not found (compiled: '${compiled}', libtorch_cpu.so: '${library}')" >&2; exit 2; }
compiled=$((16#$compiled))
library=$((16#$library))
echo "gloo_abi_check: GlooStore's vtable: $compiled bytes compiled against Debian's Gloo headers, $library bytes in the wheel's libtorch_cpu.so"
if ((compiled != library)); then
  echo "gloo_abi_check: the layouts differ: a worker with Gloo from Debian's headers would call the wrong virtual functions; it builds without Gloo"
  exit 0
fi
echo "gloo_abi_check: the layouts match: Gloo can be had for the 2.x build (worker/CMakeLists.txt, Debian's headers), and the multi-rank worker tests can run on it" >&2
exit 1
