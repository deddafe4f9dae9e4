#!/usr/bin/env bash
# Installs the PyTorch of tools/gpu/torch-requirements.txt (the GPU machines' version, pip's CUDA 13
# build, 2.6 GB with its nvidia-* libraries) into the venv .venv-torch/ (git-ignored), made from
# Debian's /usr/bin/python3 without Debian's packages, so that nothing of Debian's torch 1.13 is seen:
#
#   bash tools/setup-torch.sh        # idempotent: does nothing when that version is installed
#   .venv-torch/bin/python -c 'import torch; print(torch.__version__)'
#
# What uses it: the CUDA worker's CMake build (its LibTorch is the wheel's torch/include, torch/lib
# and torch/share/cmake), the worker's tests on LibTorch 2.x, script jobs on PyTorch 2.x, the GPU kit
# (tools/gpu/kit.sh). The fitrun module comes from the tree (PYTHONPATH), as script ranks get it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/.venv-torch"
requirements=tools/gpu/torch-requirements.txt
wanted=$(sed -n 's/^torch==//p' "$requirements")
[[ -n "$wanted" ]] || { echo "setup-torch: no torch==VERSION line in $requirements" >&2; exit 1; }

# Installed means every pinned package at its pinned version.
pinned_installed() {
  "$venv/bin/python" - "$requirements" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, pinned = line.split("==")
        if version(name).split("+")[0] != pinned:
            sys.exit(1)
PY
}
have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if pinned_installed; then
  echo "setup-torch: .venv-torch has torch $have"
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --clear "$venv" || {
    echo "setup-torch: /usr/bin/python3 -m venv failed (Debian's python3-venv missing?); run tools/install-deps.sh" >&2
    exit 1
  }
fi
echo "setup-torch: installing $(grep -v '^#' "$requirements" | tr '\n' ' ')into .venv-torch (about 2.6 GB the first time)"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet -r "$requirements"
have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
echo "setup-torch: .venv-torch has torch $have"
