#!/bin/bash
# rank_shim.sh: Slurm's task variables become torchrun's, the rank's exit status is recorded for
# fitrund, and SIGTERM reaches the rank.
set -euo pipefail
shim="$(dirname "$0")/rank_shim.sh"
[ -f "$shim" ] || shim="$TEST_SRCDIR/$TEST_WORKSPACE/worker/slurm/rank_shim.sh"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/shim.XXXXXX")
fail() { echo "FAIL: $*" >&2; exit 1; }

# The mapping, and a non-zero exit recorded and passed on.
set +e
SLURM_PROCID=3 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_NTASKS=4 SLURM_TASKS_PER_NODE='2(x2)' FITRUN_EXIT_DIR="$dir" \
  sh "$shim" sh -c 'echo "$RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE" > "$FITRUN_EXIT_DIR/env"; exit 3'
code=$?
set -e
[ "$code" = 3 ] || fail "shim exited $code, the rank 3"
[ "$(cat "$dir/env")" = "3 1 1 4 2" ] || fail "mapped to '$(cat "$dir/env")', want '3 1 1 4 2'"
[ "$(cat "$dir/rank-3.exit")" = 3 ] || fail "rank-3.exit says '$(cat "$dir/rank-3.exit")'"
[ ! -e "$dir/rank-3.exit.tmp" ] || fail "the temporary exit file was left behind"

# SIGTERM to the shim reaches the rank, which exits on its own terms (143 here) and is recorded.
SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 FITRUN_EXIT_DIR="$dir" \
  sh "$shim" sh -c 'trap "echo got-term > \"$FITRUN_EXIT_DIR/term\"; exit 143" TERM; echo up > "$FITRUN_EXIT_DIR/up"; while :; do sleep 0.05; done' &
shim_pid=$!
for _ in $(seq 100); do [ -e "$dir/up" ] && break; sleep 0.05; done
[ -e "$dir/up" ] || fail "the rank never started"
kill -TERM "$shim_pid"
set +e
wait "$shim_pid"
code=$?
set -e
[ "$code" = 143 ] || fail "shim exited $code after SIGTERM, the rank 143"
[ "$(cat "$dir/term")" = got-term ] || fail "the rank never saw SIGTERM"
[ "$(cat "$dir/rank-0.exit")" = 143 ] || fail "rank-0.exit says '$(cat "$dir/rank-0.exit")'"

# Not under srun: a clear error, nothing run.
set +e
out=$(sh "$shim" true 2>&1)
code=$?
set -e
[ "$code" != 0 ] || fail "ran without SLURM_PROCID"
echo "$out" | grep -q "not run by srun" || fail "unclear error: $out"
echo PASS
