#!/usr/bin/env bash
# check_private_symbols.sh BINARY [ARCHIVE...]: fails unless BINARY keeps its protobuf, gRPC and Abseil
# to itself.
#
# Why: LibTorch 2.x's libtorch_cpu.so EXPORTS protobuf 3.13's symbols (232 of them in pip's torch
# 2.11). A fitrun-worker that imports protobuf symbols (it needs libprotobuf.so, or an undefined
# google::protobuf symbol the loader may bind to libtorch_cpu's copy) or exports its own (so LibTorch's
# references may bind to ours) mixes two protobuf versions in one process. The CMake build
# (worker/CMakeLists.txt) links them from static archives behind -Wl,--exclude-libs,ALL with hidden
# visibility, and runs this after every link; tools/gpu/check.sh runs it again on the GPU machine.
#
# What it checks, in the dynamic section only (what the loader sees; static symbols do not matter):
#   1. no NEEDED entry for protobuf, gRPC, gpr, upb, address_sorting, Abseil, re2 or c-ares;
#   2. no DEFINED dynamic symbol of theirs (an export others could bind to);
#   3. no UNDEFINED dynamic symbol of theirs (an import from whichever library defines it).
# "Theirs" is told by name (C++ namespaces and C prefixes below), and, given the static ARCHIVEs BINARY
# was linked from (worker/CMakeLists.txt passes them), exactly: any dynamic symbol one of them defines.
# Names alone miss C symbols without a common prefix: Abseil's hooks (AbslInternalSpinLockDelay_*),
# upb's internals (_upb_Arena_SlowMalloc), gRPC's generated upb tables (envoy_*, xds_*), OpenSSL, zlib.
# Only strong definitions count: weak ones (inline functions and templates, std::'s among them) are
# instantiated by every library and belong to none.
# It prints one summary line on success; on failure, the offending entries and the fix.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 BINARY [ARCHIVE...]" >&2
  exit 2
fi
binary=$1
shift
archives=("$@")
for tool in readelf nm c++filt; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing (binutils)" >&2; exit 2; }
done
[[ -f "$binary" ]] || { echo "$0: $binary: no such file" >&2; exit 2; }
for archive in "${archives[@]}"; do
  [[ -f "$archive" ]] || { echo "$0: $archive: no such file" >&2; exit 2; }
done

# Demangled names: C++ namespaces, and the C APIs' prefixes (grpc_, gpr_, upb_, ares_).
# Abseil's and upb's C functions, and the descriptor tables of protobuf's own .protos (a protobuf of
# another version defines the same names), by name too, for a check without the archives.
pattern='google::protobuf|grpc|(^|[^[:alnum:]_])_?(gpr|upb|ares)_|absl::|re2::|^Absl(Internal|ContainerInternal)'
pattern+='|google_2fprotobuf_2f'
needed_pattern='lib(protobuf|protoc|grpc|gpr|upb|address_sorting|absl_|re2|cares)'

needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad_needed=$(grep -E "$needed_pattern" <<<"$needed" || true)
# nm -D prints "VALUE TYPE NAME" for defined symbols and "  U NAME" (or "w") for undefined ones.
dynamic=$(nm -D -C "$binary")
exported=$(awk '$1 ~ /^[0-9a-f]+$/ && $2 !~ /^[Uw]$/ { $1 = ""; $2 = ""; sub(/^  /, ""); print }' <<<"$dynamic" |
  grep -E "$pattern" || true)
imported=$(awk '($1 == "U" || $1 == "w" || $1 == "v") { $1 = ""; sub(/^ /, ""); print }' <<<"$dynamic" |
  grep -E "$pattern" || true)
# The exact test: the raw names of BINARY's dynamic symbols (less their @VERSION) that an archive defines.
if ((${#archives[@]})); then
  archive_defined=$(nm -g --defined-only "${archives[@]}" 2>/dev/null |
    awk 'NF == 3 && $2 ~ /^[TDBRGSCi]$/ { print $3 }' | sort -u)
  dynamic_raw=$(nm -D "$binary" | awk '{ sub(/@.*/, "", $NF); print ($1 ~ /^[0-9a-f]+$/ && $2 !~ /^[Uwv]$/ ? "E" : "I"), $NF }')
  from_archives=$(awk 'NR == FNR { theirs[$1] = 1; next } ($2 in theirs) { print }' \
    <(printf '%s\n' "$archive_defined") <(printf '%s\n' "$dynamic_raw"))
  demangle() { sed -n "s/^$1 //p" <<<"$from_archives" | c++filt; }
  exported=$(printf '%s\n%s\n' "$exported" "$(demangle E)" | sed '/^$/d' | sort -u)
  imported=$(printf '%s\n%s\n' "$imported" "$(demangle I)" | sed '/^$/d' | sort -u)
fi

count() { if [[ -z "$1" ]]; then echo 0; else wc -l <<<"$1"; fi; }
failed=0
if [[ -n "$bad_needed" ]]; then
  failed=1
  echo "$binary NEEDS shared protobuf/gRPC/Abseil libraries (they must be linked from static archives):"
  sed 's/^/  /' <<<"$bad_needed"
fi
if [[ -n "$exported" ]]; then
  failed=1
  echo "$binary EXPORTS $(count "$exported") protobuf/gRPC/Abseil symbols (LibTorch's references could bind to them):"
  head -n 20 <<<"$exported" | sed 's/^/  /'
fi
if [[ -n "$imported" ]]; then
  failed=1
  echo "$binary IMPORTS $(count "$imported") protobuf/gRPC/Abseil symbols (bound at run time to whichever library defines them, libtorch_cpu.so's protobuf 3.13 included):"
  head -n 20 <<<"$imported" | sed 's/^/  /'
fi
if ((failed)); then
  echo "fix: link protobuf, gRPC and Abseil from their static archives (libprotobuf.a, libgrpc++.a, ...) before"
  echo "     LibTorch on the link line, behind -Wl,--exclude-libs,ALL, and compile with -fvisibility=hidden"
  echo "     (worker/CMakeLists.txt does all three)"
  exit 1
fi
echo "private symbols: $binary needs no protobuf/gRPC/Abseil library, and exports and imports none of their" \
  "symbols ($(count "$dynamic") dynamic symbols, NEEDED: $(tr '\n' ' ' <<<"$needed"))"
