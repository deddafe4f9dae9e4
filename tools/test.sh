#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything, runs the tests, and ends
# with one line `tests: N passed, N failed` (individual test cases, counted from Bazel's reports; a
# skipped case is named on its own line and counted as "N skipped, " in front). The full tier reruns
# every test (no cached results) and each test tagged "timing" 20 times; a case that fails in any
# run fails. The full tier then checks fitrund's lock discipline with clang's thread-safety analysis
# (tools/thread_safety.sh) and proves the GPU path as far as a machine without a GPU can
# (tools/gpu/rehearse.sh: the CUDA worker built against the GPU machines' torch 2.11, its unit tests
# on CPU, the kit, the GPU check rehearsed on CPU devices), and counts their cases with Bazel's.
#
#   bash tools/test.sh           every test: what CI runs
#   bash tools/test.sh --quick   the unit tests, for the inner loop: no test tagged e2e (real daemons,
#                                real ranks) or slow (the LibTorch 2.x syntax check, pip installs)
#   bash tools/test.sh --asan    the unit tests under AddressSanitizer and UndefinedBehaviorSanitizer,
#                                in output directories of their own (a full build of its own the
#                                first time); tests tagged no_asan are left out
set -uo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
  "") ;;
  --quick) mode=quick ;;
  --asan) mode=asan ;;
  *) echo "usage: bash tools/test.sh [--quick | --asan]" >&2; exit 2 ;;
esac

fail() {
  echo "$1"
  echo "tests: 0 passed, 1 failed"
  exit 1
}

bash tools/install-deps.sh || fail "install-deps failed"
bash tools/setup-python.sh || fail "setup-python failed"

config=()
case $mode in
  # The full tier builds the CUDA worker against LibTorch 2.11 with CMake (tools/gpu/rehearse.sh, below),
  # which compiles every source //worker:libtorch_2_11_syntax_test only parses, against the same headers:
  # the parse is for runs without that build (`bazel test //worker:libtorch_2_11_syntax_test`).
  full) query='tests(//...) except attr(tags, "syntax_check", tests(//...))' ;;
  quick) query='tests(//...) except attr(tags, "e2e|slow", tests(//...))' ;;
  asan)
    query='tests(//server/... + //client/... + //worker/... + //proto/...) except attr(tags, "e2e|slow|no_asan", tests(//...))'
    config=(--config=asan)
    ;;
esac
targets=$(bazel query "$query" 2>/dev/null) || fail "bazel query failed"

# Everything must build, tests or not; the sanitizer build makes only what its tests need.
if [[ $mode != asan ]] && ! bazel build //...; then
  fail "build failed"
fi

# Every run of the full tier runs every test: a result Bazel kept from an earlier run (its disk
# state survives a clean clone on the same machine) would let a flaky test that passed once stand.
# And the tests tagged "timing" (threads, waits, streams) run 20 times each, so a race shows before
# it lands.
runs=()
if [[ $mode == full ]]; then
  runs+=(--nocache_test_results)
  timing=$(bazel query 'attr(tags, "timing", tests(//...))' 2>/dev/null | sed 's/$/$/' | paste -sd, -)
  if [[ -n $timing ]]; then runs+=("--runs_per_test=$timing@20"); fi
  # The GPU machines' torch (an earlier full run installed it): the rendezvous fitrund holds is
  # checked against its TCPStore too (server/launcher:rendezvous_store_test).
  if [[ -x .venv-torch/bin/python ]]; then runs+=("--test_env=FITRUN_TORCH2_PYTHON=$PWD/.venv-torch/bin/python"); fi
fi

log=$(mktemp)
# shellcheck disable=SC2086  # one target per word
bazel test "${config[@]}" "${runs[@]}" --test_output=errors $targets 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

gpu_reports=()
if [[ $mode == full ]]; then
  bash tools/thread_safety.sh lock-reports
  bash tools/gpu/rehearse.sh gpu-work/reports
  gpu_reports=(--junit=lock-reports --junit=gpu-work/reports)
fi

/usr/bin/python3 tools/test_summary.py "$log" "${config[@]}" "${gpu_reports[@]}" $targets
summary=$?
rm -f "$log"
if [[ $status -ne 0 || $summary -ne 0 ]]; then exit 1; fi
exit 0
