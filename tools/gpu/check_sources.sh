#!/usr/bin/env bash
# check_sources.sh [--cmake FILE] [WORKER_QUERY MEMORY_QUERY SUPERVISOR_QUERY]: fails unless worker/CMakeLists.txt
# compiles exactly the .cc files Bazel links into //worker:fitrun-worker, //worker/memory:libfitrun_memory.so
# and //worker:fitrun-supervisor.
#
# Why: the CMake build (for GPU machines without Bazel) must build the same worker as Bazel. A source
# added to a BUILD file but not to the CMake list would fail there at link time at best, hours from here.
#
# With no arguments it asks `bazel query`. With two files (the suite's //worker:cmake_sources_test passes
# the outputs of two genquery rules) it reads the labels from them. Either way the query is: the srcs of
# the binary and of every cc_library it depends on (a data dependency such as the preloaded library is
# not linked in, so its own srcs do not count; its cc_library dependencies are linked in anyway).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmake_file=$here/../../worker/CMakeLists.txt
if [[ "${1:-}" == "--cmake" ]]; then
  cmake_file=$2
  shift 2
fi
[[ -f "$cmake_file" ]] || { echo "check_sources: $cmake_file: no such file" >&2; exit 2; }

query_for() {
  echo "kind('source file', labels(srcs, kind(cc_library, deps($1)) + $1))"
}

# Labels (//pkg:path/file.cc) to repository paths (pkg/path/file.cc), .cc only.
label_paths() {
  grep -E '^//' | grep -E '\.cc$' | sed -e 's|^//||' -e 's|:|/|' -e 's|^/||' | sort -u
}

# The supervisor's: what it links, not the preloaded library it only carries beside it.
supervisor_query="kind('source file', labels(srcs, kind(cc_library, deps(//worker:fitrun-supervisor) except deps(//worker/memory:libfitrun_memory.so)) + //worker:fitrun-supervisor))"

if (($# == 3)); then
  bazel_worker=$(label_paths <"$1")
  bazel_memory=$(label_paths <"$2")
  bazel_supervisor=$(label_paths <"$3")
elif (($# == 0)); then
  cd "$here/../.."
  bazel_worker=$(bazel query --noshow_progress "$(query_for //worker:fitrun-worker)" 2>/dev/null | label_paths)
  bazel_memory=$(bazel query --noshow_progress "$(query_for //worker/memory:libfitrun_memory.so)" 2>/dev/null | label_paths)
  bazel_supervisor=$(bazel query --noshow_progress "$supervisor_query" 2>/dev/null | label_paths)
else
  echo "usage: $0 [--cmake CMakeLists.txt] [WORKER_QUERY_OUTPUT MEMORY_QUERY_OUTPUT SUPERVISOR_QUERY_OUTPUT]" >&2
  exit 2
fi

# The entries of `set(NAME` ... `)` in the CMake file, one path per line.
cmake_list() {
  awk -v name="$1" '$0 ~ "^set\\(" name "$" { on = 1; next } on && /^\)/ { on = 0 } on { print $1 }' "$cmake_file" | sort -u
}
cmake_worker=$(cmake_list FITRUN_WORKER_SOURCES)
cmake_memory=$(cmake_list FITRUN_MEMORY_LIBRARY_SOURCES)
cmake_supervisor=$(cmake_list FITRUN_SUPERVISOR_SOURCES)

status=0
compare() {
  local what=$1 bazel=$2 cmake=$3
  if [[ -z "$bazel" ]]; then
    echo "check_sources: bazel query gave no sources for $what" >&2
    status=1
    return
  fi
  if [[ "$bazel" != "$cmake" ]]; then
    echo "check_sources: $what: worker/CMakeLists.txt and Bazel disagree (< only in Bazel, > only in CMake):"
    diff <(echo "$bazel") <(echo "$cmake") | grep '^[<>]' || true
    echo "fix: make the list in worker/CMakeLists.txt match the BUILD files"
    status=1
  else
    echo "check_sources: $what: the same $(wc -l <<<"$cmake") .cc files in worker/CMakeLists.txt and Bazel"
  fi
}
compare "//worker:fitrun-worker (FITRUN_WORKER_SOURCES)" "$bazel_worker" "$cmake_worker"
compare "//worker/memory:libfitrun_memory.so (FITRUN_MEMORY_LIBRARY_SOURCES)" "$bazel_memory" "$cmake_memory"
compare "//worker:fitrun-supervisor (FITRUN_SUPERVISOR_SOURCES)" "$bazel_supervisor" "$cmake_supervisor"
exit $status
