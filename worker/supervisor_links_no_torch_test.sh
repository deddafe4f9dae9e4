#!/usr/bin/env bash
# fitrun-supervisor must load no LibTorch (libtorch*, libc10*) and no Gloo, directly or through the
# libraries it needs: a script job's rank then runs with whatever PyTorch the machine has.
set -euo pipefail
binary="$1"
loaded=$(ldd "$binary")
if grep -E 'libtorch|libc10|libgloo' <<<"$loaded"; then
  echo "FAIL: $binary loads LibTorch or Gloo (above)"
  exit 1
fi
# And it runs: without an environment it says what it needs and exits with the bad-configuration code.
set +e
"$binary" >/dev/null 2>"${TEST_TMPDIR:-/tmp}/stderr"
code=$?
set -e
grep -q "not set" "${TEST_TMPDIR:-/tmp}/stderr" || { cat "${TEST_TMPDIR:-/tmp}/stderr"; echo "FAIL: no word of its environment"; exit 1; }
[[ $code == 2 ]] || { echo "FAIL: exit code $code, want 2"; exit 1; }
echo "PASS: $(wc -l <<<"$loaded") libraries, none of LibTorch"
