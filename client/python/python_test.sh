#!/usr/bin/env bash
# Runs a Python unit test of the fitrun package with Debian's python3 (python3-torch, python3-grpcio)
# on the package from this test's runfiles: python_test.sh TEST.py
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-fitrun}"
cd "${TEST_TMPDIR:-/tmp}"
PYTHONPATH="$runfiles/client/python:$runfiles/tests" PYTHONDONTWRITEBYTECODE=1 exec /usr/bin/python3 "$runfiles/$1"
