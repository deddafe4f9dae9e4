#!/usr/bin/env bash
# Installs the fitrun Python package (client/python: fitrun.init for script ranks, fitrun.Client for
# notebooks and scripts) the usual way: `pip install ./client/python` (its own build backend, which
# generates the gRPC stubs with protoc and grpc_python_plugin; no package index) into the project's
# virtual environment .venv (git-ignored), made from Debian's /usr/bin/python3 with
# --system-site-packages so that Debian's python3-torch, python3-grpcio and python3-protobuf are the
# ones it uses. Then:
#
#   .venv/bin/python -c 'import fitrun; print(fitrun.Client)'     # or: source .venv/bin/activate
#
# Why a venv, and not Debian's /usr/bin/python3 itself: Debian's Python is "externally managed" (PEP
# 668), so pip installs nothing into it short of --break-system-packages, which is not for a project's
# own code; the fitrun.pth earlier versions of this script wrote into its site directory made every
# Python on the machine import one checkout's sources, whichever checkout ran the set-up last. A venv is
# where a user of the package expects it, and `pip install ./client/python` puts it into any other
# venv the same way.
#
# Who uses what:
# - Script jobs keep naming /usr/bin/python3 (see the README): fitrun-worker puts its own copy of the
#   package (from its runfiles, the same version as the worker that reads the rank's reports) first on
#   every script rank's PYTHONPATH, so ranks import fitrun without this venv.
# - Bazel tests do not use it either: they run /usr/bin/python3 on the stubs //client/python:fitrun
#   generates into their runfiles.
# - Python that talks to fitrund from outside (a notebook, tools/screenshots.py,
#   tools/bench/script_memory_bench.py) runs with .venv/bin/python.
#
# Idempotent: the venv is made once (again only when it is not one of /usr/bin/python3 with the
# system's packages), the package is rebuilt and reinstalled only when its sources, the protos or
# protoc changed since the last install (their hash is kept in .venv/fitrun-source.sha256), and a
# fitrun.pth that an earlier version of this script wrote is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=/usr/bin/python3
venv="$root/.venv"

for tool in protoc grpc_python_plugin "$python"; do
  if ! command -v "$tool" >/dev/null; then
    echo "setup-python: $tool is missing; run tools/install-deps.sh first" >&2
    exit 1
  fi
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

# What earlier versions of this script left in Debian's Python: fitrun.pth, one line naming a
# checkout's client/python. Left there it would put that checkout's sources on every sys.path,
# the venv's included (it sees the system's site directories).
while read -r site_dir; do
  pth="$site_dir/fitrun.pth"
  [[ -f "$pth" ]] || continue
  named=$(cat "$pth")
  if [[ $(wc -l <"$pth") -le 1 && "$named" =~ ^/.*/client/python$ ]]; then
    $SUDO rm -f "$pth"
    echo "setup-python: removed $pth, which put $named on every sys.path"
  fi
done < <("$python" -c 'import site; print("\n".join(site.getsitepackages()))')

# The venv, made again when it is not one of this Python with the system's packages (a venv made by
# hand from another Python, or from a Debian Python since upgraded).
venv_ok() {
  [[ -x "$venv/bin/python" ]] && grep -qx 'include-system-site-packages = true' "$venv/pyvenv.cfg" &&
    [[ "$("$venv/bin/python" -c 'import sys; print(sys.base_prefix, sys.version)' 2>/dev/null)" == \
      "$("$python" -c 'import sys; print(sys.base_prefix, sys.version)')" ]]
}
if ! venv_ok; then
  if [[ -e "$venv" ]]; then
    echo "setup-python: $venv is not a venv of $python with its system packages; making it again"
  fi
  if ! "$python" -m venv --clear --system-site-packages "$venv"; then
    echo "setup-python: $python -m venv failed (Debian's python3-venv missing?); run tools/install-deps.sh first" >&2
    exit 1
  fi
  rm -f "$venv/fitrun-source.sha256"
  echo "setup-python: made $venv (from $python, with its system packages)"
fi

installed() {
  local check='import fitrun, fitrun.client, fitrun.v1.coordinator_pb2_grpc as m; print(m.__file__)'
  local site found
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # From / and without PYTHONPATH, so that nothing but what is installed can be what imports.
  found=$(cd / && env -u PYTHONPATH "$venv/bin/python" -c "$check" 2>&1) || true
  [[ "$found" == "$site/fitrun/v1/"* ]]
}

mapfile -t sources < <(
  ls client/python/pyproject.toml client/python/README.md client/python/build_backend/*.py proto/fitrun/v1/*.proto
  find client/python/fitrun -name '*.py' -not -path 'client/python/fitrun/v1/*' | sort
)
stamp=$( (sha256sum "${sources[@]}" && protoc --version) | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$venv/fitrun-source.sha256" 2>/dev/null)" != "$stamp" ]] || ! installed; then
  # --no-index: nothing is fetched; grpcio and protobuf are found installed (Debian's, through
  # --system-site-packages), and the build needs nothing (pyproject.toml: requires = []).
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet --no-index ./client/python
  echo "$stamp" >"$venv/fitrun-source.sha256"
fi

if ! installed; then
  echo "setup-python: $venv/bin/python does not import fitrun as installed in $venv:" >&2
  (cd / && env -u PYTHONPATH "$venv/bin/python" -c 'import fitrun.v1.coordinator_pb2_grpc as m; print(m.__file__)') >&2 ||
    true
  exit 1
fi
version=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("fitrun"))')
echo "setup-python: .venv/bin/python imports fitrun $version (installed from client/python)"
