#!/usr/bin/env bash
# The GPU path, proven as far as a machine without a GPU can: tools/test.sh's full tier runs this after
# the Bazel tests, and counts what it reports with them.
#
#   bash tools/gpu/rehearse.sh REPORTS_DIR
#
# 1. .venv-torch: the GPU machines' torch (tools/setup-torch.sh; pip's CUDA 13 wheels, once).
# 2. Gloo for the 2.x build: the wheel's libtorch_cpu.so against Debian's Gloo headers, by the ABI
#    (tools/gpu/gloo_abi_check.sh).
# 3. The CUDA worker and its unit tests built with CMake against that torch, the tests run on CPU
#    (tools/gpu/worker_tests.sh build-cuda): one JUnit report per test binary.
# 4. The kit a GPU machine is carried (tools/gpu/kit.sh), within what a device call carries.
# 5. The GPU check on CPU devices with the kit's worker (tools/gpu/check.sh --rehearse), every part: a
#    case per figure, the figures only a GPU gives and the timings skipped by name.
#
# Out: REPORTS_DIR/*.xml (JUnit, the format of Bazel's test.xml) and REPORTS_DIR/*.log. A stage that
# cannot run (a download, a build) is one failed case naming its log; the stages after it, which need
# it, are not run. Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# -eq 1 ]] || { echo "usage: $0 REPORTS_DIR" >&2; exit 2; }
reports=$(realpath -m "$1")
rm -rf "$reports"
mkdir -p "$reports"

log() { printf '[rehearse %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# stage NAME COMMAND...: runs COMMAND with its output to REPORTS_DIR/NAME.log, and writes
# REPORTS_DIR/NAME.xml with one case, passed, or failed with the log's last lines.
stage() {
  local name=$1 start status
  shift
  log "$name: $*"
  start=$SECONDS
  "$@" >"$reports/$name.log" 2>&1
  status=$?
  log "$name: $([[ $status -eq 0 ]] && echo passed || echo "failed (exit $status)") in $((SECONDS - start)) s"
  local failure=()
  ((status == 0)) || failure=(--failure "exit $status" --log "$reports/$name.log")
  /usr/bin/python3 tools/gpu/junit.py "$reports/$name.xml" gpu_path "$name" "${failure[@]}"
  return "$status"
}

stage setup_torch bash tools/setup-torch.sh || exit 1

# Why the CUDA worker has no Gloo, held by the ABI of the wheel's library (see the script).
stage gloo_abi bash tools/gpu/gloo_abi_check.sh
gloo_status=$?

# The worker and its tests built (a failed build is one failed case), then the tests run: each case
# counts from the test's own report, and a test that left none (it crashed) is a failed case.
stage worker_build bash tools/gpu/build-worker.sh build-cuda -DFITRUN_BUILD_TESTS=ON \
  -DFITRUN_TEST_REPORTS="$PWD/build-cuda/test-reports" || exit 1
log "worker_tests: bash tools/gpu/worker_tests.sh build-cuda"
bash tools/gpu/worker_tests.sh build-cuda >"$reports/worker_tests.log" 2>&1
tests_status=$?
cp build-cuda/test-reports/*.xml "$reports/" 2>/dev/null
missing=()
for test in $(ctest --test-dir build-cuda -N | sed -n 's/^ *Test *#[0-9]*: //p'); do
  [[ -s "build-cuda/test-reports/$test.xml" ]] || missing+=("$test")
done
for test in "${missing[@]}"; do
  /usr/bin/python3 tools/gpu/junit.py "$reports/missing-$test.xml" gpu_path.worker_tests "$test" \
    --failure "ran without a report of its own (a crash?): see worker_tests.log"
done
log "worker_tests: exit $tests_status, ${#missing[@]} test(s) without a report"

stage kit bash tools/gpu/kit.sh || exit 1

rm -rf gpu-work/rehearsal
stage check bash tools/gpu/check.sh --rehearse
status=$?
if [[ -s gpu-work/rehearsal/results.tsv ]]; then
  /usr/bin/python3 tools/gpu/figures.py junit gpu-work/rehearsal/results.tsv "$reports/check_figures.xml"
fi
exit $((status != 0 || gloo_status != 0 || tests_status != 0 || ${#missing[@]} != 0))
