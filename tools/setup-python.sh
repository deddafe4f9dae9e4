#!/usr/bin/env bash
# Makes `import fitrun` work for Debian's Python (/usr/bin/python3) from any directory, as
# `pip install -e client/python` would, without pip: generates the gRPC stubs into the package
# (client/python/fitrun/v1/, not committed) with the system protoc and grpc_python_plugin, and puts a
# fitrun.pth naming this checkout's client/python into Python's site directory.
# Idempotent: the stubs are regenerated only when a .proto is newer than them (or they are missing),
# and the .pth is rewritten only when it names another checkout. Bazel tests do not depend on this:
# they use the stubs //client/python:fitrun generates into their runfiles.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=/usr/bin/python3
package_root="$root/client/python"
out="$package_root/fitrun/v1"

for tool in protoc grpc_python_plugin "$python"; do
  if ! command -v "$tool" >/dev/null; then
    echo "setup-python: $tool is missing; run tools/install-deps.sh first" >&2
    exit 1
  fi
done

protos=(proto/fitrun/v1/*.proto)
stale=0
for proto in "${protos[@]}"; do
  base=$(basename "$proto" .proto)
  for generated in "$out/${base}_pb2.py" "$out/${base}_pb2_grpc.py"; do
    if [[ ! -f "$generated" || "$proto" -nt "$generated" ]]; then stale=1; fi
  done
done
[[ -f "$out/__init__.py" ]] || stale=1

if ((stale)); then
  # Generated aside and renamed into place, so a Python process importing meanwhile never reads a
  # half-written module. --python_out=client/python puts them at fitrun/v1/, where the generated
  # `from fitrun.v1 import job_pb2` finds them inside our own package.
  tmp=$(mktemp -d "$package_root/.stubs.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  protoc -Iproto --python_out="$tmp" --grpc_python_out="$tmp" \
    --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "${protos[@]}"
  : >"$tmp/fitrun/v1/__init__.py"
  mkdir -p "$out"
  for file in "$tmp"/fitrun/v1/*.py; do mv -f "$file" "$out/"; done
  echo "setup-python: generated $(ls "$out"/*_pb2*.py | wc -l) stub modules in client/python/fitrun/v1"
fi

site_dir=$("$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null ||
  echo /usr/local/lib/python3.11/dist-packages)
pth="$site_dir/fitrun.pth"
if [[ "$(cat "$pth" 2>/dev/null)" != "$package_root" ]]; then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO mkdir -p "$site_dir"
  echo "$package_root" | $SUDO tee "$pth" >/dev/null
  echo "setup-python: $pth -> $package_root"
fi

# Checked from / so the checkout's own directory on sys.path cannot make it pass by accident, and
# against the path, so another checkout's fitrun.pth (or an installed fitrun) cannot either.
check='import fitrun.v1.coordinator_pb2_grpc as m; print(m.__file__)'
found=$(cd / && "$python" -c "$check" 2>&1) || true
if [[ "$found" != "$out/"* ]]; then
  echo "setup-python: $python does not import fitrun from $package_root:" >&2
  echo "$found" >&2
  exit 1
fi
echo "setup-python: $python imports fitrun from $package_root"
