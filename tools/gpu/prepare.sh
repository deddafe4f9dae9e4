#!/usr/bin/env bash
# Prepares, on this Debian 12 machine, everything a GPU machine needs to build and check fitrun with no
# network and no Bazel there (Ubuntu 24.04, pip's PyTorch, g++, cmake, ninja), into gpu-kit/ (git-ignored):
#
#   bash tools/gpu/prepare.sh [KIT]      # KIT defaults to gpu-kit
#
#   KIT/fitrun-bundle.tar.gz   fitrund + fitrun with their shared libraries (tools/bundle.sh)
#   KIT/debs/*.deb             Debian 12 packages the worker's CMake build takes its protobuf, gRPC and
#                              Abseil from (headers, static archives, protoc, grpc_cpp_plugin); check.sh
#                              unpacks them with dpkg -x
#   KIT/datasets/fashion-mnist the four IDX .gz files (package dataset-fashion-mnist), for the data path
#   KIT/MANIFEST               what is in it: commit, package versions, sizes
#
# Then, on the GPU machine, in the repository root with KIT present: bash tools/gpu/check.sh.
# The whole working tree plus the carried KIT must stay under the device tool's 64 MiB: this prints
# each part's size and the total, and fails past the limit.
#
# Which packages: the -dev packages whose headers and static archives the worker links, and the
# programs that compile the protos with their shared libraries. Their full Depends closure is computed
# (apt-cache depends --recurse) and every package in it is either fetched or left out for a reason
# printed below; a package in the closure that is in neither list stops this script, so a change in
# Debian's dependencies is looked at rather than silently missed.
set -euo pipefail
cd "$(dirname "$0")/../.."

kit=${1:-gpu-kit}
limit_mib=64

log() { printf '[prepare %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "prepare: $*" >&2; exit 1; }

# Headers and static archives the worker links (worker/CMakeLists.txt names each archive's package).
dev_packages=(libprotobuf-dev libgrpc++-dev libgrpc-dev libabsl-dev libre2-dev libc-ares-dev libssl-dev zlib1g-dev)
# protoc and grpc_cpp_plugin, and the shared libraries they run with (libgrpc29 holds
# libgrpc_plugin_support.so, which the plugin needs).
tool_packages=(protobuf-compiler protobuf-compiler-grpc libprotoc32 libprotobuf32 libgrpc29)
# In the closure but not needed there, and why:
#   the GPU machine has them (glibc, the compiler and its runtime, zlib's and Kerberos' runtimes):
provided_there=(libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libnsl2 libnsl-dev
  libtirpc3 libtirpc-dev libtirpc-common rpcsvc-proto gcc-12-base libgcc-s1 libstdc++6 zlib1g
  libcom-err2 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0)
#   shared runtimes of what the worker links statically (nothing there loads them):
linked_statically=(libabsl20220623 libgrpc++1.51 libre2-9 libc-ares2 libprotobuf-lite32 libssl3)
#   pkg-config: the CMake build names files, it asks pkg-config nothing:
not_used=(pkgconf pkgconf-bin libpkgconf3)

command -v apt-get >/dev/null || die "apt-get is missing: this runs on Debian 12"
[[ -d /usr/share/datasets/fashion-mnist ]] ||
  die "/usr/share/datasets/fashion-mnist is missing: apt-get install dataset-fashion-mnist (tools/install-deps.sh)"
mkdir -p "$kit"

# 1. The worker's CMake source list must still match Bazel's, or the GPU build would build another worker.
log "worker/CMakeLists.txt against bazel query"
bash tools/gpu/check_sources.sh

# 2. The bundle.
log "bundle (bazel build //server:fitrund //client:fitrun, then tools/bundle.sh)"
bash tools/bundle.sh "$kit/fitrun-bundle.tar.gz"

# 3. The .debs.
log "Debian packages"
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances "${dev_packages[@]}" "${tool_packages[@]}" | grep -v '^ ' | grep -v '^<' | sort -u)
wanted=("${dev_packages[@]}" "${tool_packages[@]}")
accounted=" ${wanted[*]} ${provided_there[*]} ${linked_statically[*]} ${not_used[*]} "
unaccounted=()
for package in $closure; do
  [[ "$accounted" == *" $package "* ]] || unaccounted+=("$package")
done
if ((${#unaccounted[@]})); then
  die "Debian's dependency closure has packages this script does not account for: ${unaccounted[*]}
  decide whether the GPU build needs each (add it to tool_packages/dev_packages) or not (add it to the lists
  of what is left out, with the reason), in $0"
fi
log "closure: $(wc -w <<<"$closure") packages; fetching ${#wanted[@]}; left out: ${#provided_there[@]} the GPU machine has," \
  "${#linked_statically[@]} shared runtimes of what is linked statically, ${#not_used[@]} pkg-config"
rm -rf "$kit/debs.tmp"
mkdir -p "$kit/debs.tmp"
if ! (cd "$kit/debs.tmp" && apt-get download -q "${wanted[@]}" >/dev/null 2>download.log); then
  cat "$kit/debs.tmp/download.log" >&2
  die "apt-get download failed: Debian's archive must be reachable (apt-get update first)"
fi
rm -f "$kit/debs.tmp/download.log"
# Plain names, the package's own (libgrpc++-dev as libgrpcpp-dev.deb): the device tool's transfers are
# safest with letters, digits, '.', '_' and '-' (apt names files with %3a epochs, + and ~), and dpkg -x
# reads the package from inside the file anyway. The versions are in MANIFEST.
for deb in "$kit"/debs.tmp/*.deb; do
  plain=$(dpkg-deb --field "$deb" Package | sed -e 's/+/p/g' -e 's/[^A-Za-z0-9._-]/-/g').deb
  mv "$deb" "$kit/debs.tmp/$plain"
done
rm -rf "$kit/debs"
mv "$kit/debs.tmp" "$kit/debs"

# 4. Fashion-MNIST, for the built-in jobs' data path.
log "Fashion-MNIST"
mkdir -p "$kit/datasets/fashion-mnist"
cp /usr/share/datasets/fashion-mnist/*.gz "$kit/datasets/fashion-mnist/"
[[ $(ls "$kit/datasets/fashion-mnist"/*.gz | wc -l) -eq 4 ]] ||
  die "expected the four Fashion-MNIST .gz files in /usr/share/datasets/fashion-mnist (dataset-fashion-mnist)"

# 5. What went in, and what it weighs against the device tool's limit.
size() { du -sb "$@" | awk '{ s += $1 } END { print s }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
bundle_bytes=$(size "$kit/fitrun-bundle.tar.gz")
debs_bytes=$(size "$kit"/debs/*.deb)
data_bytes=$(size "$kit/datasets")
{
  echo "gpu-kit for fitrun $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')," \
    "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "fitrun-bundle.tar.gz  $(mib "$bundle_bytes")"
  echo "debs                  $(mib "$debs_bytes")"
  for deb in "$kit"/debs/*.deb; do
    printf '  %-28s %-26s %s\n' "$(basename "$deb")" "$(dpkg-deb --field "$deb" Version)" "$(mib "$(size "$deb")")"
  done
  echo "datasets              $(mib "$data_bytes")"
} >"$kit/MANIFEST"
kit_bytes=$(size "$kit")
total=$((tree_bytes + kit_bytes))
cat "$kit/MANIFEST"
log "kit $(mib "$kit_bytes") + working tree $(mib "$tree_bytes") = $(mib "$total") of the device tool's $limit_mib MiB"
if ((total > limit_mib * 1048576)); then
  die "over the $limit_mib MiB a device call carries: leave something out of $kit"
fi
log "done: carry '$kit' to the GPU machine and run bash tools/gpu/check.sh there"
