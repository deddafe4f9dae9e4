#!/usr/bin/env bash
# libfitrun_memory.so preloaded into the real /usr/bin/python3 (Debian's python3-torch): the allocator
# counts the tensors Python creates, reports its peak in a file at exit, refuses an allocation past
# the cap as torch.cuda.OutOfMemoryError, and names the variable when the cap is not a number.
# Usage: preload_test.sh <path of libfitrun_memory.so>
set -euo pipefail

lib="$(realpath "$1")"
work="${TEST_TMPDIR:-$(mktemp -d)}/preload"
rm -rf "$work" && mkdir -p "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs a Python snippet with the library preloaded; extra VAR=value arguments go to its environment.
run_python() {
  local script="$1"
  shift
  env -u FITRUN_MEMORY_CAP_BYTES -u FITRUN_MEMORY_PEAK_FILE "$@" LD_PRELOAD="$lib" \
    /usr/bin/python3 -c "$script"
}

# What every snippet starts with: the library's functions through ctypes, as a script would use them.
prelude='
import ctypes, sys, torch
lib = ctypes.CDLL(None)
for name in ("live", "peak", "cap", "last_failed_request", "live_at_last_failure"):
    getattr(lib, "fitrun_memory_" + name).restype = ctypes.c_int64
lib.fitrun_memory_reset_peak.restype = None
def check(condition, what):
    if not condition:
        print("check failed:", what, "live", lib.fitrun_memory_live(), "peak", lib.fitrun_memory_peak(),
              file=sys.stderr)
        sys.exit(1)
'

echo "--- count only: live and peak follow a tensor, the peak file is written at exit"
peak_file="$work/count.peak"
run_python "$prelude"'
check(lib.fitrun_memory_cap() == 0, "cap 0")
before = lib.fitrun_memory_live()
lib.fitrun_memory_reset_peak()
check(lib.fitrun_memory_peak() == before, "reset peak starts from live")
t = torch.empty(10_000_000, dtype=torch.uint8)
check(lib.fitrun_memory_live() >= before + 10_000_000, "live counts the tensor")
check(lib.fitrun_memory_peak() >= before + 10_000_000, "peak counts the tensor")
del t
check(lib.fitrun_memory_live() == before, "live gives the tensor back")
check(lib.fitrun_memory_peak() >= before + 10_000_000, "peak remembers the tensor")
lib.fitrun_memory_reset_peak()
check(lib.fitrun_memory_peak() < 10_000_000, "reset peak forgets the tensor")
u = torch.ones(1_000_000, dtype=torch.uint8)
check(lib.fitrun_memory_peak() >= 1_000_000, "peak after reset counts a new tensor")
lib.fitrun_memory_reset_peak()
t = torch.empty(10_000_000, dtype=torch.uint8)
del t
check(lib.fitrun_memory_last_failed_request() == 0, "nothing refused without a cap")
' FITRUN_MEMORY_CAP_BYTES=0 FITRUN_MEMORY_PEAK_FILE="$peak_file" || fail "count-only run failed"
[[ -f "$peak_file" ]] || fail "no peak file at $peak_file"
[[ ! -e "$peak_file.tmp" ]] || fail "temporary peak file left behind"
read -r peak live refused live_at_refusal extra < "$peak_file" || fail "peak file is not one line: $(cat "$peak_file")"
[[ "$peak" =~ ^[0-9]+$ && "$live" =~ ^[0-9]+$ && "$refused" == 0 && "$live_at_refusal" == 0 && -z "$extra" ]] ||
  fail "peak file is not '<peak> <live> 0 0' (nothing refused): $(cat "$peak_file")"
((peak >= 10000000)) || fail "peak $peak < 10000000 after a 10 MB tensor"
((live < 10000000)) || fail "live $live at exit still holds the freed 10 MB tensor"
echo "peak file: $peak $live"

echo "--- no peak file variable: nothing written, nothing fails"
(cd "$work" && run_python "$prelude"'
check(lib.fitrun_memory_cap() == 0, "cap 0 without the variable")
t = torch.empty(1000, dtype=torch.uint8)
check(lib.fitrun_memory_live() >= 1000, "counts without the variable")
') || fail "run without the variables failed"
[[ -z "$(ls "$work" | grep -v '^count.peak$')" ]] || fail "files written without a peak file variable: $(ls "$work")"

echo "--- a 64 MiB cap: 32 MiB fits, 100 MiB is torch.cuda.OutOfMemoryError"
set +e
run_python "$prelude"'
MiB = 1 << 20
check(lib.fitrun_memory_cap() == 64 * MiB, "cap from the environment")
fits = torch.empty(32 * MiB, dtype=torch.uint8)
del fits
try:
    too_big = torch.empty(100 * MiB, dtype=torch.uint8)
except torch.cuda.OutOfMemoryError as e:
    check("cap" in str(e), "the message names the cap: " + str(e))
    check(lib.fitrun_memory_last_failed_request() == 100 * MiB, "the refused request")
    check(lib.fitrun_memory_live_at_last_failure() < 64 * MiB, "live when refused")
    check(lib.fitrun_memory_peak() < 64 * MiB, "a refused request leaves the peak alone")
    sys.exit(42)
sys.exit(0)
' FITRUN_MEMORY_CAP_BYTES=$((64 << 20)) FITRUN_MEMORY_PEAK_FILE="$work/refused.peak"
code=$?
set -e
((code == 42)) || fail "100 MiB under a 64 MiB cap: exit code $code, want 42 (torch.cuda.OutOfMemoryError caught)"
# The file says what was refused, so a supervisor can name the size that failed.
read -r _ _ refused live_at_refusal < "$work/refused.peak" || fail "no peak file after the refusal"
((refused == 100 << 20 && live_at_refusal < 64 << 20)) ||
  fail "peak file after the refusal: $(cat "$work/refused.peak"), want the 100 MiB request and what was live"
rm -f "$work/refused.peak"

echo "--- a cap that is not a number: said on stderr, then counting without a cap"
for bad in "64MiB" "-1" "lots"; do
  run_python "$prelude"'
check(lib.fitrun_memory_cap() == 0, "no cap after a bad value")
t = torch.empty(100 << 20, dtype=torch.uint8)
check(lib.fitrun_memory_live() >= 100 << 20, "still counting")
' FITRUN_MEMORY_CAP_BYTES="$bad" 2> "$work/stderr" || fail "a bad cap ($bad) stopped the process: $(cat "$work/stderr")"
  grep -q "FITRUN_MEMORY_CAP_BYTES=\"$bad\"" "$work/stderr" ||
    fail "stderr does not name FITRUN_MEMORY_CAP_BYTES for \"$bad\": $(cat "$work/stderr")"
  cat "$work/stderr"
done

echo "PASS"
