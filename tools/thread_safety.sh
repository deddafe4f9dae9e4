#!/usr/bin/env bash
# fitrund's lock discipline, checked: clang's thread-safety analysis (-Wthread-safety, every finding an
# error) over fitrund's code in server/, so each ABSL_GUARDED_BY and ABSL_EXCLUSIVE_LOCKS_REQUIRED is held
# to the code (gcc, which builds everything else, ignores them). In a Bazel output base of its own,
# since switching compilers in one base rebuilds everything; the first run builds server/ with clang
# (several minutes on two cores), later ones what changed.
#
#   bash tools/thread_safety.sh [REPORTS_DIR]
#
# With REPORTS_DIR: writes REPORTS_DIR/thread_safety.xml (one JUnit case, failed with the findings)
# and thread_safety.log, for tools/test.sh's count. Exits non-zero on any finding or a failed build.
set -uo pipefail
cd "$(dirname "$0")/.."
reports=${1:-}
output_base=${THREAD_SAFETY_OUTPUT_BASE:-$HOME/.cache/fitrun-clang-ts}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# fitrund's libraries and programs (its tests' own threads are the tests' business), unoptimised (the
# analysis is the compiler's front end; nothing built here runs), with
# --symlink_prefix=/: no bazel-* links, which would point the workspace's at this output base.
targets=$(bazel --output_base="$output_base" query 'kind("cc_library|cc_binary", //server/...)' 2>/dev/null)
if [[ -z $targets ]]; then
  echo "bazel query found no library or program under //server" >"$log"
  status=1
else
  # shellcheck disable=SC2086  # one target per word
  bazel --output_base="$output_base" build --symlink_prefix=/ --noshow_progress --keep_going \
    --repo_env=CC=clang --repo_env=CXX=clang++ \
    --copt=-Wthread-safety --copt=-Werror=thread-safety --copt=-O0 \
    $targets >"$log" 2>&1
  status=$?
fi
findings=$(grep -c -- 'error: .*-Wthread-safety' "$log")
if ((status == 0)); then
  echo "thread-safety: server/ builds with clang's -Wthread-safety, no findings"
else
  grep -B1 -A3 -- '-Wthread-safety' "$log" | head -80
  tail -20 "$log"
  echo "thread-safety: FAILED ($findings finding(s); the build's exit status $status)"
fi
if [[ -n "$reports" ]]; then
  mkdir -p "$reports"
  cp "$log" "$reports/thread_safety.log"
  failure=()
  ((status == 0)) || failure=(--failure "$findings thread-safety finding(s), or the clang build failed" --log "$log")
  /usr/bin/python3 tools/gpu/junit.py "$reports/thread_safety.xml" lock_discipline server_thread_safety "${failure[@]}"
fi
exit "$status"
