#!/bin/bash
# coordinator_bench in a short form (5 watchers, 2,000 flooded and 1,000 paced events), so that the
# benchmark docs/benchmarks.md quotes cannot rot: it must run every part, and every paced event must
# reach every watcher exactly once (the bench exits 1 when an event was lost or a stream ended early).
# Asserts no time.
#
#   coordinator_bench_test.sh COORDINATOR_BENCH
set -uo pipefail
out=$("$1" 5 2000 2000 1000 2>&1)
status=$?
echo "$out"
fail() {
  echo "FAIL: $1"
  exit 1
}
[ "$status" -eq 0 ] || fail "coordinator_bench exited $status"
grep -q '^  pass 2 (every device busy' <<<"$out" || fail "no second scheduling pass"
grep -q '^  accepted into the store and published: [0-9]* events/s' <<<"$out" || fail "no ingest figure"
# 1,000 paced events times 5 watchers, each one timed: none missed, none twice.
grep -q '(5000 samples of 5000, 0 missed' <<<"$out" || fail "the paced events did not reach every watcher once"
grep -q '^  of which rank -> coordinator' <<<"$out" || fail "no split of the latency"
grep -q '^  fan-out (paced): [1-9][0-9]* passes' <<<"$out" || fail "no fan-out figures"
echo "PASS"
