#!/usr/bin/env bash
# libfitrun_memory.so preloaded into the real /usr/bin/python3 (Debian's python3-torch): the allocator
# counts the tensors Python creates, publishes its figures in the supervisor's memory meter (a memfd
# page, proto/contract/memory_meter.h) while the script runs and at exit, and never from a forked
# child; refuses an allocation past the cap as torch.cuda.OutOfMemoryError, and names the variable
# when the cap is not a number.
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
  env -u FITRUN_MEMORY_CAP_BYTES -u FITRUN_MEMORY_METER_FD "$@" LD_PRELOAD="$lib" \
    /usr/bin/python3 -c "$script"
}

# The same under a supervisor's meter: a memfd page passed in FITRUN_MEMORY_METER_FD, as
# fitrun-supervisor does. The snippet's exit code is kept; the page's figures, as the supervisor reads
# them after the exit, go to "$meter_out" as "peak live refused live_at_refusal writer".
meter_out="$work/meter"
run_metered() {
  local script="$1"
  shift
  /usr/bin/python3 - "$lib" "$meter_out" "$script" "$@" <<'PY'
import os, struct, subprocess, sys
lib, out, script, *assignments = sys.argv[1:]
fd = os.memfd_create("meter")
os.ftruncate(fd, 4096)
env = {k: v for k, v in os.environ.items() if k not in ("FITRUN_MEMORY_CAP_BYTES", "FITRUN_MEMORY_METER_FD")}
env.update(a.split("=", 1) for a in assignments)
env.update(LD_PRELOAD=lib, FITRUN_MEMORY_METER_FD=str(fd))
code = subprocess.run(["/usr/bin/python3", "-c", script], env=env, pass_fds=[fd]).returncode
figures = struct.unpack_from("<5q", os.pread(fd, 40, 0))
with open(out, "w") as f:
    f.write(" ".join(str(x) for x in figures) + "\n")
sys.exit(code)
PY
}

# What every snippet starts with: the library's functions through ctypes, as a script would use them.
prelude='
import ctypes, sys, torch
lib = ctypes.CDLL(None)
for name in ("live", "peak", "cap", "last_failed_request", "live_at_last_failure"):
    getattr(lib, "fitrun_memory_" + name).restype = ctypes.c_int64
lib.fitrun_memory_reset_peak.restype = None
def meter():
    import mmap, os, struct
    fd = int(os.environ["FITRUN_MEMORY_METER_FD"])
    return struct.unpack_from("<5q", os.pread(fd, 40, 0))
def check(condition, what):
    if not condition:
        print("check failed:", what, "live", lib.fitrun_memory_live(), "peak", lib.fitrun_memory_peak(),
              file=sys.stderr)
        sys.exit(1)
'

echo "--- count only: live and peak follow a tensor, the meter shows them while the script runs and at exit"
run_metered "$prelude"'
check(meter()[4] == 1, "the meter names the preloaded allocator as its writer")
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
check(meter()[0] >= 10_000_000, "the meter shows the peak while the script runs")
del t
check(lib.fitrun_memory_last_failed_request() == 0, "nothing refused without a cap")
' FITRUN_MEMORY_CAP_BYTES=0 || fail "count-only run failed"
read -r peak live refused live_at_refusal writer extra < "$meter_out" || fail "no figures: $(cat "$meter_out")"
((refused == 0 && live_at_refusal == 0 && writer == 1)) ||
  fail "meter after the run is not '<peak> <live> 0 0 1' (nothing refused): $(cat "$meter_out")"
((peak >= 10000000)) || fail "peak $peak < 10000000 after a 10 MB tensor"
((live < 10000000)) || fail "live $live at exit still holds the freed 10 MB tensor"
echo "meter: $peak $live"

echo "--- a forked child's tensors are not its parent's: the meter keeps the parent's figures"
run_metered "$prelude"'
import os
lib.fitrun_memory_reset_peak()
pid = os.fork()
if pid == 0:
    t = torch.empty(50_000_000, dtype=torch.uint8)
    os._exit(0)
os.waitpid(pid, 0)
check(meter()[0] < 50_000_000, "a forked child published its peak into the meter")
' || fail "fork run failed"
read -r peak _ < "$meter_out"
((peak < 50000000)) || fail "peak $peak counts a forked child's 50 MB tensor"

echo "--- no meter: nothing fails"
(cd "$work" && run_python "$prelude"'
check(lib.fitrun_memory_cap() == 0, "cap 0 without the variable")
t = torch.empty(1000, dtype=torch.uint8)
check(lib.fitrun_memory_live() >= 1000, "counts without the variable")
') || fail "run without the variables failed"

echo "--- a 64 MiB cap: 32 MiB fits, 100 MiB is torch.cuda.OutOfMemoryError"
set +e
run_metered "$prelude"'
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
    check(meter()[2] == 100 * MiB, "the meter shows the refusal at once")
    sys.exit(42)
sys.exit(0)
' FITRUN_MEMORY_CAP_BYTES=$((64 << 20))
code=$?
set -e
((code == 42)) || fail "100 MiB under a 64 MiB cap: exit code $code, want 42 (torch.cuda.OutOfMemoryError caught)"
# The meter says what was refused, so a supervisor can name the size that failed.
read -r _ _ refused live_at_refusal _ < "$meter_out" || fail "no figures after the refusal"
((refused == 100 << 20 && live_at_refusal < 64 << 20)) ||
  fail "meter after the refusal: $(cat "$meter_out"), want the 100 MiB request and what was live"

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
