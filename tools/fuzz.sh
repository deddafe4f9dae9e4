#!/usr/bin/env bash
# Builds every libFuzzer target (fitrun_fuzz_target in a BUILD file) with Debian's clang, under
# AddressSanitizer, and fuzzes each for a time, starting from a copy of its seeds in
# tests/fuzz/corpus/<name>. Prints one line per target: executions, corpus growth, crashes.
#
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET_NAME...]      e.g. tools/fuzz.sh 600 job_spec_fuzz
#
# The clang build lives in an output base of its own, so it never evicts the ordinary gcc build.
# Work (grown corpora, crash files, logs) goes to $FUZZ_DIR (default /tmp/fitrun-fuzz); a crash
# file reproduces with: <fuzzer binary> <crash file>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
work=${FUZZ_DIR:-/tmp/fitrun-fuzz}
output_base=${CLANG_OUTPUT_BASE:-$HOME/.cache/fitrun-clang-bazel}
mkdir -p "$work"

bazel_fuzz() {
  # --symlink_prefix=/: no bazel-* links, which would point the workspace's at this output base.
  bazel --output_base="$output_base" "$@" --symlink_prefix=/ \
    --repo_env=CC=clang --repo_env=CXX=clang++ \
    --copt=-fsanitize=fuzzer-no-link,address --copt=-fno-omit-frame-pointer --copt=-O1 -c opt \
    --linkopt=-fsanitize=address
}

labels=$(bazel --output_base="$output_base" query --noshow_progress 'attr(name, "_fuzz_fuzzer$", //server/... + //worker/... + //client/... + //tests/...)' 2>/dev/null)
if (($# > 0)); then
  wanted=$(printf '%s_fuzzer\n' "$@")
  labels=$(grep -F -f <(echo "$wanted") <<<"$labels")
fi
[[ -n "$labels" ]] || { echo "fuzz: no fuzz target matches" >&2; exit 2; }

echo "fuzz: building $(wc -l <<<"$labels") targets with clang (first build takes several minutes)"
# shellcheck disable=SC2086
bazel_fuzz build --noshow_progress $labels
bin=$(bazel_fuzz info bazel-bin 2>/dev/null)

printf '%-18s %12s %10s %14s %8s\n' target executions "exec/s" "corpus (seeds)" crashes
status=0
for label in $labels; do
  package=${label#//}
  package=${package%%:*}
  target=${label##*:}
  name=${target%_fuzzer}
  seeds=tests/fuzz/corpus/${name%_fuzz}
  corpus=$work/corpus/$name
  crashes=$work/crashes/$name
  mkdir -p "$corpus" "$crashes"
  cp -n "$seeds"/* "$corpus"/
  log=$work/$name.log
  # -rss_limit_mb: LibTorch's own footprint is ~1 GB; -timeout: one input taking 10 s is a finding.
  set +e
  "$bin/$package/$target" "$corpus" -max_total_time="$seconds" -print_final_stats=1 \
    -rss_limit_mb=4096 -timeout=10 -artifact_prefix="$crashes/" >"$log" 2>&1
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  found=$(find "$crashes" -type f | wc -l)
  ((found == 0)) || status=1
  printf '%-18s %12s %10s %14s %8s\n' "$name" "${runs:-?}" "${rate:-?}" \
    "$(find "$corpus" -type f | wc -l) ($(find "$seeds" -type f | wc -l))" "$found"
done
echo "fuzz: logs, grown corpora and crash files under $work"
exit $status
