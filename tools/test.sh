#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything, runs every test, and ends
# with one line `tests: N passed, N failed` (individual test cases, counted from Bazel's reports).
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/install-deps.sh || { echo "tests: 0 passed, 1 failed"; exit 1; }
bash tools/setup-python.sh || { echo "tests: 0 passed, 1 failed"; exit 1; }

if ! bazel build //...; then
  echo "build failed"
  echo "tests: 0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
bazel test //... --test_output=errors 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

/usr/bin/python3 tools/test_summary.py "$log"
summary=$?
rm -f "$log"
if [[ $status -ne 0 || $summary -ne 0 ]]; then exit 1; fi
exit 0
