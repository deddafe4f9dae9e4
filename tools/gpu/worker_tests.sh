#!/usr/bin/env bash
# Builds the worker's unit tests with worker/CMakeLists.txt (-DFITRUN_BUILD_TESTS=ON) against the
# GPU machines' LibTorch, pip's torch 2.11 in .venv-torch (tools/gpu/build-worker.sh: CUDA on, the
# private-symbol check after the link), and runs them on CPU with ctest: what differs between LibTorch
# 1.13 (the Bazel build, `bazel test //worker/...`) and 2.11 fails here, without a GPU.
#
#   bash tools/gpu/worker_tests.sh BUILD_DIR
#
# Out: BUILD_DIR/test-reports/NAME.xml, one JUnit report per test (gtest's, the format of Bazel's
# test.xml: a skipped case is a <skipped> with its reason; tools/test.sh counts them), and
# BUILD_DIR/ctest.log. Exits non-zero when something does not build or a test fails; a test that needs
# several CPU ranks is skipped, not failed, where the LibTorch has no Gloo (pip's wheels: see
# worker/ddp/thread_ranks.h). BUILD_DIR keeps the build between runs, and is the kit's build too
# (tools/gpu/kit.sh): a second run rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(realpath -m "$1")
reports=$build/test-reports

bash tools/gpu/build-worker.sh "$build" -DFITRUN_BUILD_TESTS=ON -DFITRUN_TEST_REPORTS="$reports"
# Only this run's reports: a test that wrote none (it crashed) must not be read from an earlier run's.
rm -rf "$reports"
# One test at a time, as the timing tests (collective timeouts, dead peers) assume an idle machine.
status=0
ctest --test-dir "$build" --output-on-failure >"$build/ctest.log" 2>&1 || status=1
tail -n 3 "$build/ctest.log"
((status == 0)) || grep -E 'Failed|\*\*\*' "$build/ctest.log" || true
echo "worker_tests: JUnit reports in $reports"
exit "$status"
