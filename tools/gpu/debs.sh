#!/usr/bin/env bash
# Fetches the Debian 12 packages a GPU machine builds the worker from when the kit's prebuilt one does
# not fit its torch (tools/gpu/kit.sh --with-debs; tools/gpu/check.sh unpacks them with dpkg -x and
# builds with worker/CMakeLists.txt): the headers and static archives of protobuf, gRPC and Abseil,
# and protoc and grpc_cpp_plugin with their shared libraries.
#
#   bash tools/gpu/debs.sh DIR
#
# Their full Depends closure is computed (apt-cache depends --recurse) and every package in it is
# either fetched or left out for a reason given below; a package in the closure that is in neither
# list stops this script, so a change in Debian's dependencies is looked at rather than silently missed.
set -euo pipefail
out=${1:?usage: debs.sh DIR}
die() { echo "debs: $*" >&2; exit 1; }
log() { printf '[debs %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

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
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
if ! (cd "$out.tmp" && apt-get download -q "${wanted[@]}" >/dev/null 2>download.log); then
  cat "$out.tmp/download.log" >&2
  die "apt-get download failed: Debian's archive must be reachable (apt-get update first)"
fi
rm -f "$out.tmp/download.log"
# Plain names, the package's own (libgrpc++-dev as libgrpcpp-dev.deb): the device tool's transfers are
# safest with letters, digits, '.', '_' and '-' (apt names files with %3a epochs, + and ~), and dpkg -x
# reads the package from inside the file anyway. The versions are in MANIFEST.
for deb in "$kit"/debs.tmp/*.deb; do
  plain=$(dpkg-deb --field "$deb" Package | sed -e 's/+/p/g' -e 's/[^A-Za-z0-9._-]/-/g').deb
  mv "$deb" "$out.tmp/$plain"
done
rm -rf "$out"
mv "$out.tmp" "$out"

