#!/usr/bin/env bash
# //worker:cmake_tests_test: check_cmake_tests.py on the workspace's worker/ (found through the
# CMakeLists.txt runfile, a link into it: the BUILD files of every package are read from there).
set -euo pipefail
worker=$(dirname "$(readlink -f "$2")")
exec /usr/bin/python3 "$1" "$worker"
