#!/usr/bin/env bash
# Runs a Python test that starts its own fitrund (tests/jobs.py's Fitrund): Debian's python3 on the
# fitrun package from this test's runfiles.   run_python_test.sh TEST.py [ARGS...]
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-fitrun}"
test_file="$runfiles/$1"
shift
cd "${TEST_TMPDIR:-/tmp}"
PYTHONPATH="$runfiles/client/python:$runfiles/tests" PYTHONDONTWRITEBYTECODE=1 exec /usr/bin/python3 "$test_file" "$@"
