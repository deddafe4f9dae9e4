#!/bin/sh
# One rank of a fitrun attempt on a Slurm cluster: `srun rank_shim.sh COMMAND [ARGS...]`.
#
# fitrund's batch script runs every rank through this shim (built-in ranks and script jobs alike:
# both are fitrun-worker). It turns Slurm's per-task variables into the torchrun ones a rank reads,
#   RANK = SLURM_PROCID, LOCAL_RANK = SLURM_LOCALID, GROUP_RANK = SLURM_NODEID,
#   WORLD_SIZE = SLURM_NTASKS, LOCAL_WORLD_SIZE = this node's tasks (the plan puts as many on each),
# runs COMMAND, passes SIGTERM and SIGINT on to it (scancel --signal=TERM --full reaches this shell
# too), and writes COMMAND's exit status to $FITRUN_EXIT_DIR/rank-$RANK.exit, atomically: how fitrund
# learns each rank's own exit status, which Slurm only reports for the whole step. MASTER_ADDR and
# MASTER_PORT are the batch script's (one per allocation).
set -u
: "${SLURM_PROCID:?not run by srun}" "${SLURM_LOCALID:?}" "${SLURM_NODEID:?}" "${SLURM_NTASKS:?}"
RANK=$SLURM_PROCID
LOCAL_RANK=$SLURM_LOCALID
GROUP_RANK=$SLURM_NODEID
WORLD_SIZE=$SLURM_NTASKS
# SLURM_TASKS_PER_NODE is "2(x2)" or "2,2": the first node's count, as every node has the same.
per_node=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-$SLURM_NTASKS}}
per_node=${per_node%%(*}
LOCAL_WORLD_SIZE=${per_node%%,*}
export RANK LOCAL_RANK GROUP_RANK WORLD_SIZE LOCAL_WORLD_SIZE

# The traps come first: a signal that arrives while the rank starts is passed on once it has a pid,
# not lost (nor the shim killed by it, leaving the rank running).
child=
pending=
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; else pending=TERM; fi' TERM
trap 'if [ -n "$child" ]; then kill -INT "$child" 2>/dev/null; else pending=INT; fi' INT
"$@" &
child=$!
if [ -n "$pending" ]; then kill -"$pending" "$child" 2>/dev/null; fi
wait "$child"
status=$?
# A trapped signal ends `wait` early: wait again until the rank itself is gone.
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
  status=$?
done
if [ -n "${FITRUN_EXIT_DIR:-}" ]; then
  printf '%s\n' "$status" > "$FITRUN_EXIT_DIR/rank-$RANK.exit.tmp" &&
    mv -f "$FITRUN_EXIT_DIR/rank-$RANK.exit.tmp" "$FITRUN_EXIT_DIR/rank-$RANK.exit"
fi
exit "$status"
