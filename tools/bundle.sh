#!/usr/bin/env bash
# Packs fitrund and the fitrun CLI with the shared libraries they load into one relocatable tarball,
# for machines that are not Debian 12 (a GPU node with another distribution, the lent GPU machine):
#
#   bash tools/bundle.sh [OUT]                     # bazel build //server:fitrund //client:fitrun, then pack
#   bash tools/bundle.sh --fitrund F --fitrun C OUT  # pack these binaries (tests/bundle_test passes its own)
#
# OUT defaults to fitrun-bundle.tar.gz. The tarball holds one folder, fitrun/:
#   bin/fitrund, bin/fitrun   with DT_RPATH $ORIGIN/../lib
#   bin/libfitrun-civetweb-ssl.so   what TLS on the metrics port loads (server/web/civetweb_ssl_shim.cc),
#                             beside fitrund where it looks for it
#   lib/                      every shared library `ldd` lists for them except glibc's own and the
#                             compiler runtime (libstdc++, libgcc_s), which every Linux has in a newer
#                             version: Abseil, gRPC, protobuf, OpenSSL, re2, c-ares, civetweb,
#                             prometheus-cpp, SQLite, yaml-cpp, zlib (each with DT_RPATH $ORIGIN), and
#                             libcrypto.so -> libcrypto.so.3, the name civetweb loads it by
#   README                    how to start it
# fitrund needs no other file at run time: the web page and the Slurm rank shim are compiled in. The
# worker is not in the bundle: it links a LibTorch, so it is built where that LibTorch is (the CMake
# build in worker/CMakeLists.txt, tools/gpu/check.sh); start fitrund with --worker_binary=PATH.
#
# Why DT_RPATH rather than DT_RUNPATH: DT_RPATH is searched before LD_LIBRARY_PATH, so a node whose
# environment points at other protobuf or gRPC builds (conda, CUDA images) still gets the bundle's; and
# the libraries carry it too, so each finds its own dependencies in lib/ whatever loaded it.
# The binaries and libraries are patched copies (Debian's patchelf); the Bazel outputs are untouched.
# Needs: Debian 12 with the project's packages (tools/install-deps.sh installs patchelf).
set -euo pipefail
cd "$(dirname "$0")/.."

fitrund="" fitrun="" out=""
while (($#)); do
  case "$1" in
    --fitrund) fitrund=$2; shift 2 ;;
    --fitrun) fitrun=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "bundle: unknown flag $1 (see $0 --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
out=${out:-fitrun-bundle.tar.gz}

for tool in patchelf ldd tar; do
  command -v "$tool" >/dev/null || { echo "bundle: $tool is missing: run tools/install-deps.sh (or apt-get install $tool)" >&2; exit 1; }
done

if [[ -z "$fitrund" && -z "$fitrun" ]]; then
  bazel build //server:fitrund //client:fitrun
  bin_dir=$(bazel info bazel-bin 2>/dev/null)
  fitrund=$bin_dir/server/fitrund
  fitrun=$bin_dir/client/fitrun
elif [[ -z "$fitrund" || -z "$fitrun" ]]; then
  echo "bundle: give both --fitrund and --fitrun, or neither (then Bazel builds them)" >&2
  exit 2
fi
for binary in "$fitrund" "$fitrun"; do
  [[ -x "$binary" ]] || { echo "bundle: $binary is not an executable" >&2; exit 1; }
done

# Everything glibc installs, plus the compiler's runtime: the target machine's own, newer copies must be
# used (a bundled libc would not match the target's dynamic loader).
is_system_library() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*| \
    libresolv.so.*|libutil.so.*|libanl.so.*|libnss_*|libBrokenLocale.so.*|libthread_db.so.*| \
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/fitrun
mkdir -p "$root/bin" "$root/lib"
cp -L "$fitrund" "$root/bin/fitrund"
cp -L "$fitrun" "$root/bin/fitrun"
# Beside fitrund when installed, in web/ beneath it in Bazel's output tree.
ssl_shim=libfitrun-civetweb-ssl.so
fitrund_dir=$(dirname "$(readlink -f "$fitrund")")
for candidate in "$fitrund_dir/$ssl_shim" "$fitrund_dir/web/$ssl_shim" ""; do
  [[ -z "$candidate" ]] && { echo "bundle: $ssl_shim is not beside $fitrund (nor in web/): bazel build //server:fitrund" >&2; exit 1; }
  [[ -e "$candidate" ]] && { cp -L "$candidate" "$root/bin/$ssl_shim"; break; }
done
chmod 0755 "$root/bin/fitrund" "$root/bin/fitrun" "$root/bin/$ssl_shim"

# ldd resolves the whole closure (libraries' own dependencies too), as the loader would here.
copied=0
while read -r name path; do
  is_system_library "$name" && continue
  if [[ "$path" == "not" || -z "$path" ]]; then
    echo "bundle: $name is not found on this machine (ldd): install the package that holds it" >&2
    exit 1
  fi
  if [[ ! -e "$root/lib/$name" ]]; then
    cp -L "$path" "$root/lib/$name"   # under its soname, the name the loader looks for
    chmod 0644 "$root/lib/$name"
    copied=$((copied + 1))
  fi
done < <(env -u LD_LIBRARY_PATH ldd "$root/bin/fitrund" "$root/bin/fitrun" "$root/bin/$ssl_shim" |
  awk '$2 == "=>" { print $1, $3 }' | sort -u)

patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$root/bin/fitrund" "$root/bin/fitrun" "$root/bin/$ssl_shim"
for lib in "$root"/lib/*; do
  patchelf --force-rpath --set-rpath '$ORIGIN' "$lib"
done
# civetweb dlopens OpenSSL by its development names: libssl.so is the shim fitrund loads first, and
# libcrypto.so is found through civetweb's DT_RPATH here.
[[ -e "$root/lib/libcrypto.so.3" ]] || { echo "bundle: libcrypto.so.3 is not in lib/ (ldd of fitrund)" >&2; exit 1; }
ln -s libcrypto.so.3 "$root/lib/libcrypto.so"

# The copy must resolve every non-system library inside itself before it is packed.
# (ldd prints the path as the loader built it, bin/../lib/...: compared once resolved.)
unresolved=$(env -u LD_LIBRARY_PATH ldd "$root/bin/fitrund" "$root/bin/fitrun" "$root/bin/$ssl_shim" "$root"/lib/* 2>&1 |
  awk '$2 == "=>" { print $1, $3 }' |
  while read -r name path; do
    is_system_library "$name" && continue
    [[ "$path" != not && "$(readlink -f "$path")" == "$root/lib/"* ]] || echo "$name => $path"
  done | sort -u)
if [[ -n "$unresolved" ]]; then
  echo "bundle: these libraries do not resolve inside the bundle's lib/:" >&2
  echo "$unresolved" >&2
  exit 1
fi

cat >"$root/README" <<'EOF'
fitrund and the fitrun CLI with their shared libraries (built on Debian 12; needs glibc >= 2.36 and
libstdc++ from GCC >= 12 on the machine). Unpack anywhere; nothing needs installing or LD_LIBRARY_PATH.

  fitrun/bin/fitrund --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir=STATE \
      --worker_binary=/path/to/fitrun-worker [--devices=auto --worker_cuda]
  fitrun/bin/fitrun --coordinator=$(cat STATE/fitrund.address) devices

fitrun-worker links a LibTorch and is built where that LibTorch is: worker/CMakeLists.txt in the
sources (tools/gpu/check.sh shows the whole sequence). See fitrund --help for every flag.
EOF

# Reproducible: fixed order, owner and times, so the same binaries give the same tarball.
mkdir -p "$(dirname "$out")"
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime='@0' -cf - fitrun | gzip -9n >"$out.tmp"
mv "$out.tmp" "$out"
echo "bundle: $out: $(du -h "$out" | cut -f1) packed, $copied libraries ($(du -sh "$root/lib" | cut -f1) unpacked)"
