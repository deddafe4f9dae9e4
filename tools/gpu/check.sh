#!/usr/bin/env bash
# The GPU check: fitrun on a real GPU, from the kit tools/gpu/kit.sh builds on Debian 12 (the bundle,
# the CUDA worker built against the GPU machines' torch, data). In parts, each one device call (parts 1
# and 2 together about 5 minutes on an H200, each of parts 3-8 at most 6, part 5 8), in the repository root with
# gpu-kit/ beside it:
#
#   bash tools/gpu/check.sh 1            # the machine, the kit's worker, fitrund, whole-GPU jobs with their
#                                        # memory against NVML, the mlp's wall against torchrun's,
#                                        # precisions and communication hooks
#   bash tools/gpu/check.sh 2            # slices of a GPU filled without an OOM, an OOM re-planned and
#                                        # resumed, script jobs on the machine's PyTorch
#   bash tools/gpu/check.sh 3            # activation checkpointing on GPU slices: the plan's choice
#                                        # against both strategies pinned, each trained
#   bash tools/gpu/check.sh 4            # the seeds' built-in workloads (sasrec, the GPT recommender) at
#                                        # their sizes, fp16 and bf16, whole GPU and slices, each plan
#                                        # against NVML; a slice's OOM spoken of as the slice's
#   bash tools/gpu/check.sh 5            # the seeds' example scripts (sasrec with fp16 AMP, protein,
#                                        # mnist-ddp) and a script's real OOM on a slice
#   bash tools/gpu/check.sh 6            # submit to first step of a script job, first and second
#                                        # submit, against the same script under torchrun
#                                        # (tools/bench/script_start.py)
#   bash tools/gpu/check.sh 7            # the pace: a GPT-2-small-shaped gpt (12 x 768, context 1024,
#                                        # bf16) and the seed's sasrec under fitrun, against the same
#                                        # models in PyTorch eager and under torch.compile, and MFU
#   bash tools/gpu/check.sh 8            # the mlp and the cnn: fitrun's samples/s against torchrun's
#   bash tools/gpu/check.sh --rehearse   # every part here, on CPU devices with the kit's worker and
#                                        # .venv-torch's Python (tools/setup-torch.sh): every spec and
#                                        # command the GPU runs, the CUDA-only figures skipped by name
#
# With the device tool: run(command="bash tools/gpu/check.sh 1 2", carry=["gpu-kit"], timeout_s=500), or
# one of parts 3-8 a call (timeout_s=420; part 5 560); $OUT/results.tsv (and $OUT/logs.tar.gz) come back. The
# machine, the kit's worker and the bundle are checked once a call, before its first part.
#
# Every figure is read back from fitrund's own record of the job (fitrun get --json, fitrun events)
# by tools/gpu/figures.py and held against its goal in results.tsv (part, step, what, figure, value,
# goal, verdict); a figure that is missing fails. Device memory is NVML's per process, sampled every
# 0.1 s during each job (nvidia-smi --query-compute-apps) for the job's rank pids. Every wait is
# bounded: a job has JOB_SECONDS (default 150; 400 in a rehearsal) from submit to its end, a part
# PART_SECONDS (default 450 for parts 1-3, 330 for parts 4-8, 480 for part 5; 900 in a rehearsal), and on a GPU no job
# gets more than what is left of its part; a job still running then is cancelled and its figures fail. A script rank's own Python runs under its supervisor: its pid
# is found during the job (its FITRUN_ASSIGNMENT) so that NVML's figure is the script's.
#
# The worker: the kit's, when the machine's torch is the one the kit was built against (its MANIFEST);
# worker/ finds the machine's torch through gpu-work/kit/torch-lib and cuda-lib, links made here to
# its torch/lib and nvidia/cu13/lib. Another torch: built here from the kit's Debian packages when
# it has them (kit.sh --with-debs: 3-5 minutes), otherwise the check fails naming what to do.
#
# Settings (environment): FITRUN_GPU_KIT (default gpu-kit), FITRUN_GPU_WORK (default gpu-work), PYTHON
# (the machine's Python with torch; default python3, .venv-torch's in a rehearsal).
#
# Every process this starts is stopped on the way out (trap), whatever happened.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

rehearse=0
parts=()
for arg in "$@"; do
  case $arg in
    --rehearse) rehearse=1 ;;
    [1-8]) parts+=("$arg") ;;
    *) echo "usage: bash tools/gpu/check.sh PART... | --rehearse [PART...]   (PART: 1-8)" >&2; exit 2 ;;
  esac
done
if ((${#parts[@]} == 0)); then
  ((rehearse)) || { echo "usage: bash tools/gpu/check.sh PART... | --rehearse [PART...]   (PART: 1-8)" >&2; exit 2; }
  parts=(1 2 3 4 5 6 7 8)
fi

kit=$(readlink -f "${FITRUN_GPU_KIT:-gpu-kit}")
[[ -d "$kit" ]] || { echo "check: $kit is missing: run bash tools/gpu/kit.sh on Debian 12 and carry it" >&2; exit 1; }
mkdir -p "${FITRUN_GPU_WORK:-gpu-work}"
work=$(readlink -f "${FITRUN_GPU_WORK:-gpu-work}")
if ((rehearse)); then
  python=${PYTHON:-$repo/.venv-torch/bin/python}
  work=$work/rehearsal
else
  python=${PYTHON:-python3}
fi
# On the GPU each part fits one device call; a rehearsal's CPU devices are slower and share two cores
# with whatever else runs, so there the same jobs get longer before they count as hung.
if ((rehearse)); then
  job_seconds=${JOB_SECONDS:-400}
else
  job_seconds=${JOB_SECONDS:-150}
fi
part_budget() {
  if [[ -n "${PART_SECONDS:-}" ]]; then echo "$PART_SECONDS"
  elif ((rehearse)); then echo 900
  elif (($1 <= 3)); then echo 450
  elif (($1 == 5)); then echo 480   # three scripts twice each
  else echo 330
  fi
}
logs=$work/logs
installed=$work/kit        # the kit's worker and bundle, unpacked
bundle_root=$work/bundle/fitrun
mkdir -p "$logs" "$work/jobs" "$work/specs"
if [[ -n "${OUT:-}" ]]; then results=$OUT/results.tsv; else results=$work/results.tsv; fi
[[ -s "$results" ]] || printf 'part\tstep\twhat\tfigure\tvalue\tgoal\tverdict\n' >"$results"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# Seconds left of the part (at least 30).
part_time_left() {
  awk -v a="$part_started" -v b="$(now)" -v t="$part_seconds" 'BEGIN { l = t - (b - a); if (l < 30) l = 30; printf "%d", l }'
}
# Seconds a job (or a reference run) may take now: JOB_SECONDS, or on a GPU what is left of the part if
# less (at least 10), so that a part ends within its device call whatever its jobs do. A rehearsal has
# no device call to fit: its jobs get JOB_SECONDS, however loaded the machine is.
job_limit() {
  if ((rehearse)); then echo "$job_seconds"; return; fi
  awk -v a="$part_started" -v b="$(now)" -v t="$part_seconds" -v j="$job_seconds" \
    'BEGIN { l = t - (b - a); if (l > j) l = j; if (l < 10) l = 10; printf "%d", l }'
}
have_gpu() { ((rehearse == 0)) && command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

# --- steps ----------------------------------------------------------------------------------------
# step PART NAME: runs step_NAME with its output to logs/NAME.log; a step's figures go to results.tsv
# as rows; a step that fails, or overruns the part, is a FAIL row of its own.
declare -A outcome=()
part_started=0
step() {
  local part=$1 name=$2 status start
  if (( $(awk -v a="$part_started" -v b="$(now)" -v t="$part_seconds" 'BEGIN { print (b - a > t) }') )); then
    printf '%s\t%s\t-\tstep\t-\twithin %s s of the part\tFAIL (out of time)\n' "$part" "$name" "$part_seconds" >>"$results"
    outcome[$name]=FAIL
    return 0
  fi
  printf '\n[check %s] ==== part %s: %s\n' "$(date +%H:%M:%S)" "$part" "$name"
  start=$(now)
  set +e
  (set -euo pipefail; current_part=$part; current_step=$name; "step_$name") 2>&1 | tee "$logs/$name.log"
  status=${PIPESTATUS[0]}
  set -e
  outcome[$name]=$([[ $status -eq 0 ]] && echo PASS || echo FAIL)
  printf '%s\t%s\t-\tstep_seconds\t%s\t-\t%s\n' "$part" "$name" "$(since "$start")" "${outcome[$name]}" >>"$results"
  printf '[check %s] ==== %s: %s\n' "$(date +%H:%M:%S)" "$name" "${outcome[$name]}"
}
# figure FIGURE VALUE GOAL VERDICT: one row of the current step's.
figure() {
  printf '%s\t%s\t-\t%s\t%s\t%s\t%s\n' "$current_part" "$current_step" "$1" "$2" "$3" "$4" | tee -a "$results"
}
figures() { "$python" "$repo/tools/gpu/figures.py" "$@" | tee -a "$results"; return "${PIPESTATUS[0]}"; }

# --- fitrund and its ranks, stopped on the way out -----------------------------------------------------
# A step starts its fitrund in its own subshell: the pid and the state directory are kept in files,
# so that the next step, and the trap, stop it and whatever ranks it left.
sampler_pid=""
pids_pid=""
state=""
stop_fitrund() {
  local pid state_dir
  pid=$(cat "$work/fitrund.pid" 2>/dev/null || true)
  state_dir=$(cat "$work/fitrund.state" 2>/dev/null || true)
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$work/fitrund.pid" "$work/fitrund.state"
  [[ -n "$state_dir" ]] || return 0
  local environ left=()
  for environ in /proc/[0-9]*/environ; do
    grep -qzF "FITRUN_ASSIGNMENT=$state_dir/" "$environ" 2>/dev/null && left+=("$(basename "$(dirname "$environ")")")
  done
  ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
}
stop_sampler() {
  [[ -n "$sampler_pid" ]] && kill "$sampler_pid" 2>/dev/null || true
  [[ -n "$pids_pid" ]] && kill "$pids_pid" 2>/dev/null || true
  sampler_pid=""
  pids_pid=""
}
# sample_rank_pids OUT: writes, until stopped, every pid whose FITRUN_ASSIGNMENT lies under the current
# fitrund's jobs/ (ranks and the scripts under their supervisors; not probes): NVML lists a script's
# own Python, not its supervisor.
sample_rank_pids() {
  "$python" - "$state/jobs/" >"$1" <<'PY' &
import os, sys, time
needle, checked = ("FITRUN_ASSIGNMENT=" + sys.argv[1]).encode(), set()
while True:  # a process's environment is its parent's from the fork on: each pid is read once
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid not in checked:
            checked.add(pid)
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read():
                        print(pid, flush=True)
            except OSError:
                pass
    time.sleep(0.2)
PY
  pids_pid=$!
}
finish() {
  local status=$?
  stop_sampler
  stop_fitrund
  [[ -z "${OUT:-}" ]] || tar -C "$work" -czf "$OUT/logs.tar.gz" logs jobs 2>/dev/null || true
  echo
  echo "check: results in $results"
  exit $status
}
trap finish EXIT
trap 'exit 130' INT TERM

# fitrund NAME DEVICES [FLAG...]: a fitrund of the step's own, with the kit's worker. NAME@STATE starts
# it on the state directory an earlier fitrund of the step left (state-STATE), so that what that one
# measured (a workload's probe, a GPU's costs) is not measured again.
fitrund() {
  local name=$1 devices=$2
  shift 2
  stop_fitrund
  if [[ $name == *@* ]]; then
    state=$work/state-${name#*@}
    name=${name%@*}
    rm -f "$state/fitrund.address" "$state/fitrund.metrics_address"
  else
    state=$work/state-$name
    rm -rf "$state"
  fi
  mkdir -p "$state"
  local flags=(--listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state" --devices="$devices"
    --worker_binary="$installed/worker/fitrun-worker" --stop_workers_on_exit
    --data_roots="$installed/datasets,$work/specs,$repo")
  have_gpu && flags+=(--worker_cuda)
  echo "fitrund ${flags[*]} $*" >"$logs/fitrund-$name.cmdline"
  "$bundle_root/bin/fitrund" "${flags[@]}" "$@" >"$logs/fitrund-$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$work/fitrund.pid"
  echo "$state" >"$work/fitrund.state"
  for _ in $(seq 1 300); do
    [[ -s "$state/fitrund.metrics_address" ]] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "fitrund ($devices $*) exited:"; cat "$logs/fitrund-$name.log"; return 1; }
    sleep 0.1
  done
  echo "fitrund did not serve within 30 s"
  return 1
}
fitrun() { "$bundle_root/bin/fitrun" --coordinator="$(cat "$state/fitrund.address")" "$@"; }

# spec NAME YAML: a spec file in $work/specs (FASHION: the kit's Fashion-MNIST).
spec() {
  printf 'name: %s\n%s\n' "$1" "$2" | sed "s|FASHION|$installed/datasets/fashion-mnist|" >"$work/specs/$1.yaml"
  echo "$work/specs/$1.yaml"
}

# run_job NAME SPEC: submits, waits (at most JOB_SECONDS) for the end while NVML is sampled, and keeps
# the job's record and events in $work/jobs/NAME.{json,events,nvml}. Non-zero when it was refused
# or did not end in time.
run_job() {
  local name=$1 file=$2 id deadline
  rm -f "$work/jobs/$name".*
  if have_gpu; then
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 100 >"$work/jobs/$name.nvml" 2>/dev/null &
    sampler_pid=$!
    sample_rank_pids "$work/jobs/$name.pids"
  fi
  if ! id=$(fitrun submit "$file" 2>"$work/jobs/$name.submit"); then
    stop_sampler
    echo "$name: not submitted: $(cat "$work/jobs/$name.submit")"
    return 1
  fi
  id=$(awk '/submitted job/ { print $3 }' <<<"$id")
  echo "$name: job $id"
  local limit
  limit=$(job_limit)
  timeout "$limit" "$bundle_root/bin/fitrun" --coordinator="$(cat "$state/fitrund.address")" watch "$id" \
    >"$work/jobs/$name.watch" 2>&1 || true
  stop_sampler
  if ! fitrun get --json "$id" | "$python" -c 'import json, sys; s = json.load(sys.stdin)["state"]; sys.exit(s not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"))'; then
    echo "$name: not ended after $limit s: cancelled"
    fitrun cancel "$id" --reason "the GPU check's time for it ran out" >/dev/null || true
    sleep 3
  fi
  fitrun get --json "$id" >"$work/jobs/$name.json"
  fitrun events "$id" >"$work/jobs/$name.events"
  tail -n 3 "$work/jobs/$name.watch"
}
rehearsal_flag() { ((rehearse)) && echo --rehearsal || true; }

# --- part 1 ---------------------------------------------------------------------------------------------
step_environment() {
  local os torch
  os=$(. /etc/os-release && echo "$PRETTY_NAME")
  torch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable by $python")
  figure machine "$os, $(nproc) cores" recorded PASS
  figure torch "$torch" "the kit's: $(sed -n 's/^torch=//p' "$kit/MANIFEST")" PASS
  if have_gpu; then
    figure gpu "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)" recorded PASS
  elif ((rehearse)); then
    figure gpu none "a rehearsal: CPU devices" PASS
  else
    figure gpu none "a GPU" FAIL
    return 1
  fi
}

step_worker() {
  rm -rf "$installed"
  mkdir -p "$installed"
  local machine_torch kit_torch torch_dir
  torch_dir=$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  machine_torch=$("$python" -c 'import torch; print(torch.__version__)')
  kit_torch=$(sed -n 's/^torch=//p' "$kit/MANIFEST")
  cp -r "$kit/datasets" "$installed/"
  if [[ "$machine_torch" == "$kit_torch" ]]; then
    tar -C "$installed" -xJf "$kit/worker.tar.xz"
    figure worker "the kit's, built for torch $kit_torch" "the machine's torch ($machine_torch)" PASS
  elif [[ -d "$kit/debs" ]]; then
    echo "torch $machine_torch here, the kit's worker was built for $kit_torch: building it here"
    local deps=$work/deps deb
    rm -rf "$deps" && mkdir -p "$deps"
    for deb in "$kit"/debs/*.deb; do dpkg -x "$deb" "$deps"; done
    cmake -S "$repo/worker" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake" \
      -DFITRUN_DEPS_PREFIX="$deps" -DFITRUN_TORCH_PYTHON="$(command -v "$python")" >"$logs/cmake.log"
    ninja -C "$work/build" -j "$(nproc)" >"$logs/ninja.log"
    mkdir -p "$installed/worker/memory" "$installed/client/python"
    cp "$work/build/worker/fitrun-worker" "$work/build/worker/fitrun-supervisor" "$installed/worker/"
    cp "$work/build/worker/memory/libfitrun_memory.so" "$installed/worker/memory/"
    cp -r "$work/build/client/python/fitrun" "$installed/client/python/"
    figure worker "built here for torch $machine_torch" "the machine's torch" PASS
  else
    figure worker "the kit's is for torch $kit_torch" "the machine's torch ($machine_torch)" FAIL
    echo "the kit was built for torch $kit_torch and this machine has $machine_torch: set tools/gpu/torch-requirements.txt" \
      "to it and rebuild the kit, or rebuild it with tools/gpu/kit.sh --with-debs to build here"
    return 1
  fi
  # What the kit's RUNPATH names: this machine's torch and its CUDA runtime.
  ln -sfn "$torch_dir/lib" "$installed/torch-lib"
  ln -sfn "$(dirname "$torch_dir")/nvidia/cu13/lib" "$installed/cuda-lib"
  local missing start status=0 output
  missing=$(ldd "$installed/worker/fitrun-worker" | grep 'not found' || true)
  [[ -z "$missing" ]] || { echo "$missing"; figure libraries "$missing" "all found" FAIL; return 1; }
  start=$(now)
  output=$("$installed/worker/fitrun-worker" --no-such-flag 2>&1) || status=$?
  figure worker_start_s "$(since "$start")" "starts, prints its usage, exits 2" \
    "$([[ $status -eq 2 && "$output" == *usage:* ]] && echo PASS || echo FAIL)"
  [[ $status -eq 2 ]]
}

step_bundle() {
  rm -rf "$work/bundle" && mkdir -p "$work/bundle"
  tar -C "$work/bundle" -xzf "$kit/fitrun-bundle.tar.gz"
  local bad
  bad=$(ldd "$bundle_root/bin/fitrund" "$bundle_root/bin/fitrun" | awk '$2 == "=>" { print $1, $3 }' |
    grep -vE '^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libresolv|libmvec)\.so' |
    while read -r name path; do
      [[ "$path" != not && "$(readlink -f "$path")" == "$bundle_root/lib/"* ]] || echo "$name => $path"
    done)
  figure bundle_libraries "$(ls "$bundle_root/lib" | wc -l)" "every one resolved inside the bundle" \
    "$([[ -z "$bad" ]] && echo PASS || echo FAIL)"
  [[ -z "$bad" ]] || { echo "$bad"; return 1; }
}

MLP="model: {builtin: mlp}
data: {kind: fashion_mnist, path: FASHION}"
CNN="model: {builtin: cnn}
data: {kind: fashion_mnist, path: FASHION}"

step_whole_gpu() {
  local devices=cuda:0
  ((rehearse)) && devices=cpu:1x4GiB
  fitrund whole "$devices" --memory_probe=true
  fitrun devices | tee "$work/jobs/devices.txt"
  local status=0 ratings=$work/specs/ratings.dat
  "$python" "$repo/tools/make_movielens_sample.py" "$ratings" >/dev/null
  run_job mlp "$(spec gpu-mlp "$MLP
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
max_steps: 300
seed: 1")" || status=1
  figures job "1	whole_gpu	mlp" "$work/jobs/mlp.json" "$work/jobs/mlp.events" --nvml "$work/jobs/mlp.nvml" \
    --accuracy-floor 0.75 $(rehearsal_flag) || status=1
  run_job cnn "$(spec gpu-cnn "$CNN
optimizer: {kind: adam, lr: 0.001}
global_batch_size: 256
max_steps: 150")" || status=1
  figures job "1	whole_gpu	cnn" "$work/jobs/cnn.json" "$work/jobs/cnn.events" --nvml "$work/jobs/cnn.nvml" \
    --accuracy-floor 0.75 $(rehearsal_flag) || status=1
  run_job gpt-recommender "$(spec gpu-gpt-recommender "model: {builtin: gpt, gpt: {layers: 2, heads: 2, hidden: 64, context: 50}}
data: {kind: movielens, path: $ratings}
optimizer: {kind: adam, lr: 0.001}
global_batch_size: 128
max_steps: 60")" || status=1
  figures job "1	whole_gpu	gpt-recommender" "$work/jobs/gpt-recommender.json" "$work/jobs/gpt-recommender.events" \
    --nvml "$work/jobs/gpt-recommender.nvml" --metric hr@10:0.0 $(rehearsal_flag) || status=1
  return $status
}

# The same job as the whole-GPU mlp's (300 steps of 256 with SGD, a checkpoint, the test split) as a
# PyTorch user runs it, one rank under torchrun (tools/bench/torch_ddp_direct.py --device cuda), timed
# from the command's start to its first step and to its end, beside the fitrun job's submit to first
# step and to its end: a first submit's wall against PyTorch DDP's on the same GPU.
step_torchrun() {
  local device=cuda start first="" end line result=""
  ((rehearse)) && device=cpu
  start=$(now)
  while IFS= read -r line; do
    echo "$line"
    [[ -z "$first" && "$line" == "first step done" ]] && first=$(since "$start")
    [[ "$line" == "{"* ]] && result=$line
  done < <(timeout "$job_seconds" "$python" -m torch.distributed.run --standalone --nproc_per_node=1 \
    "$repo/tools/bench/torch_ddp_direct.py" --device "$device" --data "$installed/datasets/fashion-mnist" \
    --checkpoint "$work/torchrun-mlp.pt" --max-steps 300 2>&1)
  end=$(since "$start")
  [[ -n "$first" && -n "$result" ]] || { figure torchrun_first_step_s - "the reference ran" FAIL; return 1; }
  figures torchrun "1	torchrun	mlp" "$work/jobs/mlp.json" "$work/jobs/mlp.events" --first-step "$first" \
    --wall "$end" --result "$result" $(rehearsal_flag)
}

step_precision() {
  local devices=cuda:0
  ((rehearse)) && devices=cpu:1x4GiB
  fitrund precision "$devices" --memory_probe=false
  local status=0 precision hook
  for precision in fp32 bf16 fp16; do
    local file
    file=$(spec "gpu-mlp-$precision" "$MLP
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
max_steps: 300
precision: $precision
seed: 1")
    if ((rehearse)) && [[ $precision == fp16 ]]; then
      # On CPUs the planner refuses fp16, naming why: the spec is otherwise accepted.
      local refused
      refused=$(fitrun plan "$file" 2>&1 || true)
      figure fp16_on_cpu "$(grep -o 'fp16 needs CUDA devices' <<<"$refused" || echo "$refused" | head -n 1)" \
        "refused: fp16 needs CUDA devices" "$([[ "$refused" == *"fp16 needs CUDA devices"* ]] && echo PASS || echo FAIL)"
      continue
    fi
    run_job "mlp-$precision" "$file" || status=1
    if [[ $precision == fp32 ]]; then
      figures job "1	precision	mlp-fp32" "$work/jobs/mlp-fp32.json" "$work/jobs/mlp-fp32.events" \
        --accuracy-floor 0.75 --rehearsal || status=1
    else
      figures compare "1	precision	mlp-$precision" "$work/jobs/mlp-fp32.json" "$work/jobs/mlp-$precision.json" \
        --within 0.01 --floor 0.75 || status=1
    fi
  done
  # The hooks compress every bucket (a cast, PowerSGD's low-rank factors) even with one rank, the
  # most a GPU takes of one job: the accuracy stays within 0.02 of fp32's.
  for hook in fp16 bf16 powersgd; do
    run_job "mlp-hook-$hook" "$(spec "gpu-mlp-hook-$hook" "$MLP
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
max_steps: 300
seed: 1
ddp: {comm_hook: $hook$([[ $hook == powersgd ]] && echo ', powersgd_rank: 4, powersgd_start_iter: 10')}")" || status=1
    figures compare "1	precision	mlp-hook-$hook" "$work/jobs/mlp-fp32.json" "$work/jobs/mlp-hook-$hook.json" \
      --within 0.02 || status=1
  done
  return $status
}

# --- part 2 ---------------------------------------------------------------------------------------------
step_slices() {
  local status=0 cap devices
  for cap in 1 2; do
    devices="cuda:0@${cap}GiB"
    ((rehearse)) && devices="cpu:1x${cap}GiB"
    fitrund "slice-$cap" "$devices" --memory_probe=true
    # The micro-batch is the largest divisor of the global batch whose need fits, so 6720's divisors
    # bound the fill: on CPU devices 1680 and 3360 fit (0.89 of each cap); on an H200, where the
    # allocator is charged 1.08x its peak, 1344 and 2240 (0.79 and 0.63), the next ones needing more
    # than the slice. The figure held is the plan's estimate against the run's allocated peak.
    run_job "cnn-adamw-${cap}GiB" "$(spec "gpu-slice-$cap" "$CNN
optimizer: {kind: adamw, lr: 0.001}
global_batch_size: 6720
max_steps: 2
resources: {memory_headroom: 0.05}
fault_tolerance: {max_oom_retries: 0}")" || status=1
    figures slice "2	slices	cnn-adamw-${cap}GiB" "$work/jobs/cnn-adamw-${cap}GiB.json" $((cap << 30)) --fill 0.8 \
      --nvml "$work/jobs/cnn-adamw-${cap}GiB.nvml" $(rehearsal_flag) || status=1
  done
  return $status
}

step_oom() {
  local devices=cuda:0@1GiB
  ((rehearse)) && devices=cpu:1x1GiB
  fitrund oom "$devices" --memory_probe=true
  # Step 3 of attempt 1 asks for more than the device has: a real out-of-memory error, the re-plan
  # to a smaller batch and the resume from step 2's checkpoint.
  run_job oom "$(spec gpu-oom "$CNN
optimizer: {kind: sgd, lr: 0.01}
global_batch_size: 2048
max_steps: 6
checkpoint: {every_steps: 2}
fault_injection: {kind: oom, rank: 0, at_step: 3}")" || return 1
  figures oom "2	oom	cnn" "$work/jobs/oom.json" "$work/jobs/oom.events"
}

step_script() {
  [[ -x "$installed/worker/fitrun-supervisor" ]] || { echo "no fitrun-supervisor in the kit"; return 1; }
  local devices=cuda:0@20GiBx2 word=cuda status=0 ranks
  ((rehearse)) && devices=cpu:2x1GiB && word=cpu
  fitrund script "$devices" --memory_probe=true
  for ranks in 1 2; do
    run_job "script-$ranks" "$(spec "gpu-script-$ranks" "script:
  command: [$(command -v "$python"), gpu_script.py]
  working_dir: $repo/tools/gpu
global_batch_size: 128
max_steps: 20
resources: {min_devices: $ranks, max_devices: $ranks}")" || status=1
    local id
    id=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$work/jobs/script-$ranks.json")
    figures script "2	script	$ranks rank(s)" "$work/jobs/script-$ranks.json" "$state/jobs/$id/attempt-1" \
      --ranks "$ranks" --device-word "$word" || status=1
  done
  return $status
}

# --- part 3 ---------------------------------------------------------------------------------------------
# tools/bench/strategies_bench.py's two checkpointing cases on a GPU: a gpt on a device where
# recomputing its blocks' activations fits the whole batch in one pass and keeping them a part of it,
# submitted as it is (the plan chooses) and with activation_checkpointing pinned each way. Each trains;
# the figures: their batches, the same loss, and the chosen plan's samples/s against the faster pinned
# one. A GPU slice binds the caching allocator, which a plan charges 1.08x its peak: the slices are
# the CPU devices' sizes that much larger, for the same choice.
step_strategies() {
  local status=0 corpus=$work/specs/corpus.txt steps=60
  ((rehearse)) && steps=6
  cat "$repo"/docs/*.md >"$corpus"
  local case devices layers heads hidden context batch variant pin
  for case in "6x384:454MiB:420MiB:6:6:384:256:8" "8x256:216MiB:200MiB:8:8:256:128:16"; do
    IFS=: read -r name gpu_size cpu_size layers heads hidden context batch <<<"$case"
    devices="cuda:0@$gpu_size"
    ((rehearse)) && devices="cpu:1x$cpu_size"
    fitrund "strategies-$name" "$devices" --memory_probe=true
    for variant in chosen recomputed kept; do
      pin=""
      [[ $variant == recomputed ]] && pin=", activation_checkpointing: true"
      [[ $variant == kept ]] && pin=", activation_checkpointing: false"
      run_job "gpt-$name-$variant" "$(spec "gpu-gpt-$name-$variant" "model:
  builtin: gpt
  gpt: {layers: $layers, heads: $heads, hidden: $hidden, context: $context$pin}
data: {kind: text, path: $corpus}
optimizer: {kind: adamw, lr: 0.0003, weight_decay: 0.01, lr_scaling: none}
global_batch_size: $batch
max_steps: $steps
seed: 1")" || status=1
    done
    figures strategies "3	strategies	gpt-$name" "$work/jobs/gpt-$name-chosen.json" \
      "$work/jobs/gpt-$name-recomputed.json" "$work/jobs/gpt-$name-kept.json" $(rehearsal_flag) || status=1
  done
  return $status
}

# --- parts 4-8: the seeds' workloads, a script's start, the pace ----------------------------------------
# On a GPU a precision; in a rehearsal, where CPU devices refuse fp16, bf16 stands in for it.
on_cpu_bf16() { if ((rehearse)) && [[ $1 == fp16 ]]; then echo bf16; else echo "$1"; fi; }
job_id() { "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$work/jobs/$1.json"; }
nvml_of() { echo --nvml "$work/jobs/$1.nvml" --pids "$work/jobs/$1.pids"; }
# The python a script job runs, as its spec names it (an absolute path, found on the PATH).
script_python() { command -v "$python"; }

# A ratings file of MovieLens-1M's size (6,040 users, 3,706 items, about a million ratings; a small one
# in a rehearsal), written once by tools/make_movielens_sample.py.
seed_ratings() {
  local file=$work/specs/ratings-seed.dat
  if [[ ! -s $file ]]; then
    if ((rehearse)); then
      "$python" "$repo/tools/make_movielens_sample.py" "$file" --users 600 --items 300 >/dev/null
    else
      "$python" "$repo/tools/make_movielens_sample.py" "$file" --users 6040 --items 3706 --min-ratings 20 \
        --max-ratings 300 >/dev/null
    fi
  fi
  echo "$file"
}

# sasrec_seed PRECISION STEPS [YAML]: the SASRec guide's model (3 blocks of 100, 4 heads, 100 items of
# history, Adam at 0.002, 1024 users a step), a tiny one in a rehearsal.
sasrec_seed() {
  local shape="{max_len: 100, hidden: 100, blocks: 3, heads: 4}" batch=1024
  ((rehearse)) && shape="{max_len: 20, hidden: 32, blocks: 1, heads: 2}" && batch=64
  printf 'model: {builtin: sasrec, sasrec: %s}\ndata: {kind: movielens, path: %s}\noptimizer: {kind: adam, lr: 0.002, lr_scaling: none}\nglobal_batch_size: %s\nmax_steps: %s\nprecision: %s\nseed: 1\n%s' \
    "$shape" "$(seed_ratings)" "$batch" "$2" "$(on_cpu_bf16 "$1")" "${3:-}"
}

# gpt_recommender_seed PRECISION STEPS: the recommender guide's GPT (embed_dim 64, as
# deploy/examples/gpt-recommender-movielens.yaml shapes it) at its batch of 2048 users.
gpt_recommender_seed() {
  local batch=2048
  ((rehearse)) && batch=32
  printf 'model: {builtin: gpt, gpt: {layers: 2, heads: 2, hidden: 64, context: 50}}\ndata: {kind: movielens, path: %s}\noptimizer: {kind: adam, lr: 0.001, lr_scaling: none}\nglobal_batch_size: %s\nmax_steps: %s\nprecision: %s\nseed: 1\n' \
    "$(seed_ratings)" "$batch" "$2" "$(on_cpu_bf16 "$1")"
}

# --- part 4 ---------------------------------------------------------------------------------------------
# The seeds' built-in workloads at their sizes, each on the whole GPU and in the other precision on a
# 2 GiB slice, each plan's predicted device memory against NVML's peak for the rank's process (goal
# 1.00-1.10) and its HR@10 read back. Then an out-of-memory error on a slice (fault injection at step 3,
# resumed from step 2): its event, the re-plan's reason and the driver's figures must give the slice's
# 2 GiB, not the GPU's.
step_seeds_builtin() {
  local status=0 whole=cuda:0 slice=cuda:0@2GiB cap=$((2 << 30)) steps=60 name
  ((rehearse)) && whole=cpu:1x4GiB && slice=cpu:1x1GiB && cap=$((1 << 30)) && steps=6
  seed_ratings >/dev/null
  fitrund seeds-whole "$whole" --memory_probe=true
  run_job sasrec-seed-fp16 "$(spec gpu-sasrec-seed-fp16 "$(sasrec_seed fp16 "$steps")")" || status=1
  run_job gpt-recommender-seed-bf16 "$(spec gpu-gpt-recommender-seed-bf16 "$(gpt_recommender_seed bf16 $((steps / 2)))")" ||
    status=1
  fitrund seeds-slice@seeds-whole "$slice" --memory_probe=true
  run_job sasrec-seed-bf16-slice "$(spec gpu-sasrec-seed-bf16-slice "$(sasrec_seed bf16 "$steps")")" || status=1
  run_job gpt-recommender-seed-fp16-slice \
    "$(spec gpu-gpt-recommender-seed-fp16-slice "$(gpt_recommender_seed fp16 $((steps / 2)))")" || status=1
  for name in sasrec-seed-fp16 gpt-recommender-seed-bf16 sasrec-seed-bf16-slice gpt-recommender-seed-fp16-slice; do
    figures job "4	seeds_builtin	$name" "$work/jobs/$name.json" "$work/jobs/$name.events" $(nvml_of "$name") \
      --nvml-goal 1.00-1.10 --metric hr@10:0.0 $(rehearsal_flag) || status=1
  done
  fitrund seeds-oom@seeds-whole "$slice" --memory_probe=true
  run_job sasrec-seed-oom-slice "$(spec gpu-sasrec-seed-oom-slice "$(sasrec_seed bf16 6 "checkpoint: {every_steps: 2}
fault_injection: {kind: oom, rank: 0, at_step: 3}")")" || status=1
  figures oom_slice "4	seeds_builtin	sasrec-oom-slice" "$work/jobs/sasrec-seed-oom-slice.json" \
    "$work/jobs/sasrec-seed-oom-slice.events" --cap "$cap" $(rehearsal_flag) || status=1
  return $status
}

# --- part 5 ---------------------------------------------------------------------------------------------
# script_twice JOB WHAT SPEC FIGURE_FLAGS...: a script fitrund has not seen is submitted twice. The first
# submit is its own measurement: it must predict nothing and leave its first steps' peak on record. The
# second, the same spec, is planned from that run: its prediction is held against the rank's peak
# (NVML's on a GPU, goal 1.00-1.10). JOB_DIR in a flag stands for each run's job directory.
script_twice() {
  local job=$1 what=$2 file=$3 status=0 run flags arg
  shift 3
  for run in "$job-first" "$job"; do
    run_job "$run" "$file" || status=1
    flags=()
    for arg in "$@"; do flags+=("${arg//JOB_DIR/$state/jobs/$(job_id "$run")}"); done
    if [[ $run == "$job-first" ]]; then
      figures job "5	seeds_scripts	$what-first" "$work/jobs/$run.json" "$work/jobs/$run.events" --first-seen \
        "${flags[@]}" $(rehearsal_flag) || status=1
    else
      figures job "5	seeds_scripts	$what" "$work/jobs/$run.json" "$work/jobs/$run.events" $(nvml_of "$run") \
        --nvml-goal 1.00-1.10 "${flags[@]}" $(rehearsal_flag) || status=1
    fi
  done
  return $status
}

# The seeds' example scripts (deploy/examples/scripts) with the machine's PyTorch under
# fitrun-supervisor: sasrec as the SASRec guide runs it (--use_amp: fp16 and a loss scaler; 3 blocks of
# 100, 4 heads, 1024 users a step) and mnist-ddp (an unchanged torchrun script) on the whole GPU, protein
# as the protein guide sizes it (hidden 256, 3 layers, 32 sequences a step, bf16) on a 3 GiB slice; each
# SUCCEEDED with its metric, each submitted twice (script_twice): the first run measures, the second's
# plan is held against NVML (goal 1.00-1.10). Then a script's real out-of-memory
# error on the slice (tools/bench/scripts/lm_train.py --oom_at_step 3): what fitrun says of it must be
# the slice's.
step_seeds_scripts() {
  [[ -x "$installed/worker/fitrun-supervisor" ]] || { echo "no fitrun-supervisor in the kit"; return 1; }
  local status=0 whole=cuda:0 slice=cuda:0@3GiB cap=$((3 << 30)) py
  local sasrec_sizes='--num_heads, "4", --num_blocks, "3", --hidden_units, "100", --maxlen, "100"' sasrec_batch=1024
  local protein_sizes='--hidden_dim, "256", --num_layers, "3", --num_heads, "4"' steps=60 mnist_steps=100
  if ((rehearse)); then
    whole=cpu:2x2GiB slice=cpu:1x2GiB cap=$((2 << 30)) steps=4 mnist_steps=30 sasrec_batch=64
    sasrec_sizes='--num_heads, "2", --num_blocks, "1", --hidden_units, "32", --maxlen, "20"'
    protein_sizes='--hidden_dim, "64", --num_layers, "1", --num_heads, "4"'
  fi
  py=$(script_python)
  fitrund scripts-whole "$whole" --memory_probe=true
  script_twice script-sasrec sasrec-use_amp "$(spec gpu-script-sasrec "script:
  command: [$py, train.py, --ratings, $(seed_ratings), --num_epochs, \"1000\", --max_steps, \"$steps\", --use_amp, $sasrec_sizes, --dropout_rate, \"0.2\"]
  working_dir: $repo/deploy/examples/scripts/sasrec
  env: {OMP_NUM_THREADS: \"1\"}
optimizer: {kind: adam, lr: 0.002, lr_scaling: none}
global_batch_size: $sasrec_batch
resources: {min_devices: 1, max_devices: 1}")" --metric hr@10:0.0 || status=1
  script_twice script-mnist-ddp mnist-ddp "$(spec gpu-script-mnist-ddp "script:
  command: [$py, train.py, --data, $installed/datasets/fashion-mnist, --epochs, \"1\", --max_steps, \"$mnist_steps\"]
  working_dir: $repo/deploy/examples/scripts/mnist-ddp
  batch_flag: --batch_size
  env: {OMP_NUM_THREADS: \"1\"}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9, lr_scaling: none}
global_batch_size: 256
resources: {min_devices: 1, max_devices: 1}")" --unreported --log-dir JOB_DIR --log-metric "test accuracy:0.6" || status=1
  fitrund scripts-slice@scripts-whole "$slice" --memory_probe=true
  script_twice script-protein protein-bf16-slice "$(spec gpu-script-protein "script:
  command: [$py, train.py, --epochs, \"100\", --max_steps, \"$steps\", $protein_sizes]
  working_dir: $repo/deploy/examples/scripts/protein
  env: {OMP_NUM_THREADS: \"1\"}
optimizer: {kind: adamw, lr: 0.0001, weight_decay: 0.01, lr_scaling: none}
global_batch_size: 32
precision: bf16
resources: {min_devices: 1, max_devices: 1}")" --metric val_masked_accuracy:0.0 || status=1
  run_job script-oom-slice "$(spec gpu-script-oom-slice "script:
  command: [$py, lm_train.py, --max_steps, \"6\", --checkpoint_every, \"2\", --oom_at_step, \"3\"]
  working_dir: $repo/tools/bench/scripts
  batch_flag: --batch_size
  grad_accum_flag: --grad_accum_steps
  env: {OMP_NUM_THREADS: \"1\"}
optimizer: {kind: adamw, lr: 0.0003, lr_scaling: none}
global_batch_size: 16
resources: {min_devices: 1, max_devices: 1}")" || status=1
  figures oom_slice "5	seeds_scripts	lm_train-oom-slice" "$work/jobs/script-oom-slice.json" \
    "$work/jobs/script-oom-slice.events" --cap "$cap" $(rehearsal_flag) || status=1
  return $status
}

# --- part 6 ---------------------------------------------------------------------------------------------
# tools/bench/script_start.py: from just before `fitrun submit` to the script's first optimizer step
# (tools/bench/scripts/lm_train.py, bf16 on the GPU), for a first submit to a fresh fitrund, a second
# submit of the same spec and a second one differing in an argument that changes no memory, against
# the same script under torchrun itself; as many runs as fit the part (goal: at least 2).
step_script_start() {
  local args=(--fitrund "$bundle_root/bin/fitrund" --fitrun "$bundle_root/bin/fitrun"
    --worker "$installed/worker/fitrun-worker" --python "$(script_python)" --launcher torchrun
    --module-path "$installed/client/python" --work "$work/jobs/script-start"
    --json "$work/jobs/script-start.json" --job-timeout "$job_seconds")
  # The bench's bound: on a GPU what is left of the part, less the figures' time; in a rehearsal its
  # four sides' JOB_SECONDS.
  local limit=$((4 * job_seconds))
  ((rehearse)) || limit=$(( $(part_time_left) - 15 ))
  if ((rehearse)); then
    args+=(--devices cpu:1x2GiB --ranks 1 --runs 1 --max-steps 6)
  else
    # No run starts that would end past the part's time, if it takes as long as the one before.
    args+=(--devices cuda:0 --ranks 1 --runs 3 --budget $((limit - 10)) --script-args "--precision bf16"
      --fitrund-flag=--worker_cuda)
  fi
  rm -rf "$work/jobs/script-start" "$work/jobs/script-start.json"
  timeout -k 10 "$limit" "$python" "$repo/tools/bench/script_start.py" "${args[@]}" || true
  figures script_start "6	script_start	lm_train" "$work/jobs/script-start.json" \
    $( ((rehearse)) || echo --gpu) $(rehearsal_flag)
}

# --- part 7 ---------------------------------------------------------------------------------------------
# The pace: a GPT-2-small-shaped gpt (12 x 768, context 1024, bf16, AdamW) and the seed's sasrec (fp16)
# trained by fitrun's built-in models (three jobs each; samples/s from fitrund's progress events past the
# warm-up) beside the same models in PyTorch, eager and under torch.compile, on the same GPU
# (tools/bench/pace_reference.py: three timed windows after the warm-up), and each one's MFU against a
# bf16 matmul's TFLOP/s measured here first. Goals: fitrun >= 1.10x eager, >= 0.9x torch.compile, the
# gpt at >= 40% MFU. In a rehearsal: one job a model, tiny shapes, torch.compile's aot_eager backend
# (inductor's CPU code takes minutes on two cores), the ratios skipped by name.
step_pace() {
  local status=0 device=cuda:0 runs=3 reference_device=cuda corpus=$work/specs/pace-corpus.txt table=$work/jobs/pace-table.md
  local compile_args=(--mode compile) windows=(--warmup 10 --steps 20 --repeats 3) peak_size=8192
  local gpt_shape=(12 12 768 1024) gpt_batch=32 gpt_steps=60 gpt_warm=10 sasrec_steps=200 sasrec_warm=20 half=fp16 run
  if ((rehearse)); then
    device=cpu:1x4GiB runs=1 reference_device=cpu peak_size=256 gpt_shape=(2 2 64 64) gpt_batch=8 gpt_steps=12
    gpt_warm=2 sasrec_steps=12 sasrec_warm=2 half=bf16
    compile_args=(--mode compile --compile-backend aot_eager) windows=(--warmup 2 --steps 4 --repeats 1)
  fi
  for _ in 1 2 3 4; do cat "$repo"/docs/*.md; done >"$corpus"
  fitrund pace "$device" --memory_probe=false
  timeout -k 10 "$(job_limit)" "$python" "$repo/tools/bench/pace_reference.py" peak --device "$reference_device" \
    --size "$peak_size" --json "$work/jobs/pace-peak.json" || status=1
  figures peak "7	pace	matmul" "$work/jobs/pace-peak.json" || status=1
  printf '| model | side | samples/s (median) | each | vs eager | MFU |\n| --- | --- | ---: | --- | ---: | ---: |\n' >"$table"

  local gpt_spec
  gpt_spec="model:
  builtin: gpt
  gpt: {layers: ${gpt_shape[0]}, heads: ${gpt_shape[1]}, hidden: ${gpt_shape[2]}, context: ${gpt_shape[3]}}
data: {kind: text, path: $corpus}
optimizer: {kind: adamw, lr: 0.0003, weight_decay: 0.01, lr_scaling: none}
global_batch_size: $gpt_batch
max_steps: $gpt_steps
precision: bf16
resources: {min_devices: 1, max_devices: 1, per_device_batch: $gpt_batch}
seed: 1"
  local fitrun_runs=()
  for run in $(seq 1 "$runs"); do
    run_job "pace-gpt-$run" "$(spec "gpu-pace-gpt-$run" "$gpt_spec")" || status=1
    fitrun_runs+=(--fitrun "$work/jobs/pace-gpt-$run.json,$work/jobs/pace-gpt-$run.events")
  done
  for mode in eager compile; do
    local mode_args=(--mode eager)
    [[ $mode == compile ]] && mode_args=("${compile_args[@]}")
    timeout -k 10 "$(job_limit)" "$python" "$repo/tools/bench/pace_reference.py" gpt --device "$reference_device" \
      --data "$corpus" --layers "${gpt_shape[0]}" --heads "${gpt_shape[1]}" --hidden "${gpt_shape[2]}" \
      --context "${gpt_shape[3]}" --batch "$gpt_batch" --precision bf16 --optimizer adamw --lr 0.0003 \
      --weight-decay 0.01 "${windows[@]}" "${mode_args[@]}" --json "$work/jobs/pace-gpt-$mode.json" || status=1
  done
  figures pace "7	pace	gpt-12x768" "${fitrun_runs[@]}" --eager "$work/jobs/pace-gpt-eager.json" \
    --compile "$work/jobs/pace-gpt-compile.json" --peak "$work/jobs/pace-peak.json" --warmup-steps "$gpt_warm" \
    --mfu-goal 0.4 --table "$table" $(rehearsal_flag) || status=1

  local sasrec_shape=(3 4 100 100) sasrec_batch=1024
  ((rehearse)) && sasrec_shape=(1 2 32 20) && sasrec_batch=64
  fitrun_runs=()
  for run in $(seq 1 "$runs"); do
    run_job "pace-sasrec-$run" "$(spec "gpu-pace-sasrec-$run" "$(sasrec_seed fp16 "$sasrec_steps" \
      "resources: {min_devices: 1, max_devices: 1, per_device_batch: $sasrec_batch}")")" || status=1
    fitrun_runs+=(--fitrun "$work/jobs/pace-sasrec-$run.json,$work/jobs/pace-sasrec-$run.events")
  done
  for mode in eager compile; do
    local mode_args=(--mode eager)
    [[ $mode == compile ]] && mode_args=("${compile_args[@]}")
    timeout -k 10 "$(job_limit)" "$python" "$repo/tools/bench/pace_reference.py" sasrec --device "$reference_device" \
      --data "$(seed_ratings)" --blocks "${sasrec_shape[0]}" --heads "${sasrec_shape[1]}" --hidden "${sasrec_shape[2]}" \
      --max-len "${sasrec_shape[3]}" --batch "$sasrec_batch" --precision "$(on_cpu_bf16 "$half")" --optimizer adam \
      --lr 0.002 "${windows[@]}" "${mode_args[@]}" --json "$work/jobs/pace-sasrec-$mode.json" || status=1
  done
  figures pace "7	pace	sasrec-seed" "${fitrun_runs[@]}" --eager "$work/jobs/pace-sasrec-eager.json" \
    --compile "$work/jobs/pace-sasrec-compile.json" --peak "$work/jobs/pace-peak.json" --warmup-steps "$sasrec_warm" \
    --table "$table" $(rehearsal_flag) || status=1
  echo
  cat "$table"
  return $status
}

# --- part 8 ---------------------------------------------------------------------------------------------
# The mlp and the cnn (300 and 150 steps of 256, SGD with momentum) under fitrun and as a PyTorch user's
# script under torchrun (tools/bench/torch_ddp_direct.py --device cuda, one rank, the data on the GPU),
# three runs each: training samples/s over each side's whole loop, goal fitrun >= 1.0x torchrun's.
step_torchrun_pace() {
  local status=0 device=cuda:0 reference_device=cuda runs=3 model run steps
  ((rehearse)) && device=cpu:1x4GiB reference_device=cpu runs=1
  fitrund torchrun-pace "$device" --memory_probe=true
  for model in mlp cnn; do
    steps=300
    [[ $model == cnn ]] && steps=150
    ((rehearse)) && steps=$([[ $model == mlp ]] && echo 30 || echo 6)
    local fitrun_runs=() references=() model_spec=$MLP
    [[ $model == cnn ]] && model_spec=$CNN
    for run in $(seq 1 "$runs"); do
      run_job "$model-pace-$run" "$(spec "gpu-$model-pace-$run" "$model_spec
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9, lr_scaling: none}
global_batch_size: 256
max_steps: $steps
seed: 1")" || status=1
      fitrun_runs+=(--fitrun "$work/jobs/$model-pace-$run.json")
      timeout -k 10 "$(job_limit)" "$python" -m torch.distributed.run --standalone --nproc_per_node=1 \
        "$repo/tools/bench/torch_ddp_direct.py" --device "$reference_device" --model "$model" \
        --data "$installed/datasets/fashion-mnist" --checkpoint "$work/torchrun-$model.pt" --max-steps "$steps" \
        >"$work/jobs/$model-torchrun-$run.out" 2>&1 || status=1
      references+=(--reference "$work/jobs/$model-torchrun-$run.out")
    done
    figures torchrun_pace "8	torchrun_pace	$model" "${fitrun_runs[@]}" "${references[@]}" $(rehearsal_flag) || status=1
  done
  return $status
}

# --- the parts ------------------------------------------------------------------------------------------
started=$(now)
for part in "${parts[@]}"; do
  part_started=$(now)
  part_seconds=$(part_budget "$part")
  current_part=$part
  # The machine, the kit's worker and the bundle: once a call, before its first part.
  if [[ -z "${outcome[bundle]:-}" ]]; then
    step "$part" environment
    step "$part" worker
    step "$part" bundle
  fi
  if [[ ${outcome[worker]} == PASS && ${outcome[bundle]} == PASS ]]; then
    case $part in
      1) step 1 whole_gpu; step 1 torchrun; step 1 precision ;;
      2) step 2 slices; step 2 oom; step 2 script ;;
      3) step 3 strategies ;;
      4) step 4 seeds_builtin ;;
      5) step 5 seeds_scripts ;;
      6) step 6 script_start ;;
      7) step 7 pace ;;
      8) step 8 torchrun_pace ;;
    esac
  fi
  stop_fitrund
done
failed=$(awk -F'\t' 'NR > 1 && $7 ~ /^FAIL/' "$results" | wc -l)
passed=$(awk -F'\t' 'NR > 1 && $7 == "PASS"' "$results" | wc -l)
echo
column -t -s $'\t' "$results" 2>/dev/null || cat "$results"
echo "check: $passed figures passed, $failed failed, in $(since "$started") s"
((failed == 0))
