#!/usr/bin/env bash
# Builds fitrun-worker and checks fitrun on a GPU machine with no network and no Bazel, from what
# tools/gpu/prepare.sh put in gpu-kit/. Run THERE, in the repository root, with gpu-kit/ beside it:
#
#   bash tools/gpu/check.sh [STEP...]      # no STEP: every step, in order
#
# With the device tool: run(command="bash tools/gpu/check.sh", carry=["gpu-kit"]); $OUT/results.txt
# comes back. The tool sends the checkout of the session that calls it: gpu-kit/ must be in that one.
#
# What the GPU machine has (../shared/gpu/README.md): Ubuntu 24.04, glibc 2.39, g++ 13.3, cmake 4.x,
# ninja, Python 3.12 with pip's PyTorch 2.11+cu130 (LibTorch and its CMake files inside the wheel),
# nvidia-smi, NVML. What it lacks and this brings: Bazel (the worker is built with CMake,
# worker/CMakeLists.txt), gRPC/protobuf/Abseil (Debian 12 .debs unpacked with dpkg -x, linked statically
# and kept private from LibTorch's own protobuf), fitrund and the CLI (the relocatable bundle), and
# Fashion-MNIST.
#
# Everything it makes goes to gpu-work/ (git-ignored, beside gpu-kit/ rather than in it, so that a kit
# tried here first is still small enough to carry): the unpacked .debs, the CMake build (the worker at
# gpu-work/build/worker/fitrun-worker), the unpacked bundle, fitrund's state, one log per step.
#
# Steps (each logged with its time to gpu-work/logs/STEP.log; a failed step's log tail goes to the
# results; a step whose prerequisite failed is skipped):
#   environment  the machine: OS, glibc, compilers, Python, torch, GPUs
#   deps         unpack KIT/debs/*.deb into gpu-work/deps (dpkg -x)
#   configure    cmake -G Ninja against the machine's torch (python3 -c 'import torch' finds it)
#   build        ninja: fitrun-worker, libfitrun_memory.so; the link is followed by the privacy check
#   privacy      check_private_symbols.sh again, and every protobuf/gRPC/Abseil header the compiler
#                read came from gpu-work/deps (not from LibTorch's include/, which carries protobuf 3.13)
#   worker       the built worker starts (all its libraries load, static initialisers run)
#   bundle       unpack KIT/fitrun-bundle.tar.gz; every non-glibc library resolves inside it
#   fitrund      fitrund from the bundle on OS-chosen ports (NVML's GPUs with --worker_cuda where there
#                are GPUs, virtual CPU devices where not) with the built worker
#   devices      fitrun devices
#   plan         fitrun plan deploy/examples/fashion-mnist-mlp.yaml (data path pointed at the kit's copy)
#   cpu_job      without a GPU only: the mlp as a real 2-rank job on virtual CPU devices through fitrund
#   gpu_job      the mlp, cnn and gpt recommender on a whole cuda:0 (1 rank, NCCL), each plan's
#                predicted device memory against the rank's measured footprint (within [100%, 115%])
#   gpu_slices   the cnn with AdamW on a 1 GiB and a 2 GiB slice: no OOM, allocated peak >= 80% of it
#   gpu_oom      a real CUDA out-of-memory error on a slice, the re-plan and the resume from a checkpoint
#   gpu_precision  the mlp in fp32, bf16 and fp16 (accuracy within 0.01 of fp32's); the fp16, bf16 and
#                PowerSGD communication hooks on CUDA tensors
#   gpu_script_job  tools/gpu/gpu_script.py with the machine's own torch under fitrun-supervisor, 1 rank
#                and 2 ranks over Gloo on two slices of cuda:0
#
# Results: ONE file, $OUT/results.txt when OUT is set (the device tool brings $OUT back), else
# gpu-work/results.txt; with OUT set the logs come back too, as $OUT/logs.tar.gz.
#
# Settings (environment):
#   FITRUN_GPU_KIT             the kit folder (default gpu-kit)
#   FITRUN_GPU_WORK            where the build and logs go (default gpu-work)
#   PYTHON                     the Python whose torch to build against (default python3)
#   FITRUN_TORCH_CMAKE_PREFIX  a folder holding Torch/TorchConfig.cmake, instead of the Python's torch
#                              (on Debian 12, to try this build here: /usr/lib/x86_64-linux-gnu/cmake,
#                              Debian's LibTorch 1.13)
#   JOBS                       ninja's parallelism (default: nproc)
#
# Every process this starts is stopped on the way out (trap), whatever happened.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

kit=$(readlink -f "${FITRUN_GPU_KIT:-gpu-kit}")
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
if [[ ! -d "$kit" ]]; then
  echo "check: $kit is missing: run bash tools/gpu/prepare.sh on Debian 12 and carry gpu-kit here" >&2
  exit 1
fi
mkdir -p "${FITRUN_GPU_WORK:-gpu-work}"
work=$(readlink -f "${FITRUN_GPU_WORK:-gpu-work}")
logs=$work/logs
deps=$work/deps
build=$work/build
bundle_root=$work/bundle/fitrun
state=$work/fitrund-state
if [[ -n "${OUT:-}" ]]; then results=$OUT/results.txt; else results=$work/results.txt; fi

mkdir -p "$logs"
: >"$results"

# --- the step framework -----------------------------------------------------------------------------
declare -A outcome=()   # step -> PASS / FAIL / SKIP / PENDING
now() { date +%s.%N; }
note() { echo "$*" | tee -a "$results"; }   # a line for the results file (and the console)
# Inside a step: say why it is skipped (exit code 77) or that it is a placeholder (78).
skip() { echo "$*"; exit 77; }
pending() { echo "$*"; exit 78; }

# wanted NAME: whether this run includes step NAME (every step when none was named).
wanted() { ((${#selected[@]} == 0)) || [[ " ${selected[*]} " == *" $1 "* ]]; }

# step NAME [REQUIRED_STEP...]: runs step_NAME in a subshell, its output to logs/NAME.log and the
# console; records the outcome and time. Lines the step writes to $summary go to the results file. A
# required step that ran and did not pass skips this one; one this run left out (steps were named) is
# taken as done by an earlier run.
step() {
  local name=$1; shift
  wanted "$name" || return 0
  local required
  for required in "$@"; do
    if [[ -n "${outcome[$required]:-}" && "${outcome[$required]}" != PASS ]]; then
      outcome[$name]=SKIP
      note "$(printf '%-8s %-14s' SKIP "$name")  (needs $required, which did not pass)"
      return 0
    fi
  done
  local summary=$work/summary.$name status start end seconds
  : >"$summary"
  printf '\n[check %s] ==== %s\n' "$(date +%H:%M:%S)" "$name"
  start=$(now)
  set +e
  (set -euo pipefail; "step_$name") 2>&1 | tee "$logs/$name.log"
  status=${PIPESTATUS[0]}
  set -e
  end=$(now)
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  case $status in
    0) outcome[$name]=PASS ;;
    77) outcome[$name]=SKIP ;;
    78) outcome[$name]=PENDING ;;
    *) outcome[$name]=FAIL ;;
  esac
  printf '[check %s] ==== %s: %s in %s s\n' "$(date +%H:%M:%S)" "$name" "${outcome[$name]}" "$seconds"
  note "$(printf '%-8s %-14s %8s s' "${outcome[$name]}" "$name" "$seconds")"
  sed 's/^/           /' "$summary" >>"$results"
  if [[ ${outcome[$name]} == SKIP || ${outcome[$name]} == PENDING ]]; then
    tail -n 1 "$logs/$name.log" | sed 's/^/           /' >>"$results"
  elif [[ ${outcome[$name]} == FAIL ]]; then
    echo "           last 40 lines of logs/$name.log:" >>"$results"
    tail -n 40 "$logs/$name.log" | sed 's/^/           | /' >>"$results"
  fi
  rm -f "$summary"
}

# --- processes: fitrund and the ranks it starts, stopped on the way out --------------------------------
daemon_pid=""
fitrund_started=""
# Ranks run in process groups of their own; they are found by the assignment path under $state that
# their environment names (as tests/with_fitrund.sh does).
ranks_of_state() {
  local environ
  for environ in /proc/[0-9]*/environ; do
    if grep -qzF "FITRUN_ASSIGNMENT=$state/" "$environ" 2>/dev/null; then
      environ=${environ#/proc/}
      echo "${environ%/environ}"
    fi
  done
}
stop_fitrund() {
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  daemon_pid=""
  local left
  left=$(ranks_of_state)
  if [[ -n "$left" ]]; then
    echo "check: stopping ranks fitrund left behind: $left"
    kill -KILL $left 2>/dev/null || true
  fi
}
finish() {
  local status=$?
  stop_fitrund
  if [[ -n "${OUT:-}" ]]; then
    tar -C "$work" -czf "$OUT/logs.tar.gz" logs 2>/dev/null || true
  fi
  echo
  echo "check: results in $results"
  exit $status
}
trap finish EXIT
trap 'exit 130' INT TERM

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
fitrun_cli() { "$bundle_root/bin/fitrun" --coordinator="$(cat "$state/fitrund.address")" "$@"; }

# --- the steps --------------------------------------------------------------------------------------
step_environment() {
  local os torch
  os=$(. /etc/os-release && echo "$PRETTY_NAME")
  {
    echo "machine: $os, $(uname -m), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "glibc: $(ldd --version | head -n 1 | awk '{ print $NF }'); g++: $(g++ -dumpfullversion 2>/dev/null || echo missing);" \
      "cmake: $(cmake --version 2>/dev/null | head -n 1 | awk '{ print $3 }'); ninja: $(ninja --version 2>/dev/null || echo missing)"
    torch=$("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch.compiled_with_cxx11_abi())' 2>/dev/null ||
      echo "not importable by $python")
    echo "python: $("$python" --version 2>&1); torch: $torch"
    if have_gpu; then
      nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv,noheader | sed 's/^/gpu: /'
    else
      echo "gpu: none (no nvidia-smi, or it lists no GPU): the GPU steps are skipped"
    fi
    echo "kit: $(head -n 1 "$kit/MANIFEST" 2>/dev/null || echo 'no MANIFEST')"
  } | tee -a "$summary"
  local tool missing=()
  for tool in g++ cmake ninja dpkg readelf nm tar; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if ((${#missing[@]})); then
    echo "missing: ${missing[*]} (the build needs g++, cmake, ninja; dpkg unpacks the .debs; binutils checks symbols)"
    return 1
  fi
}

step_deps() {
  local debs=("$kit"/debs/*.deb)
  [[ -e "${debs[0]}" ]] || { echo "no .debs in $kit/debs: run tools/gpu/prepare.sh on Debian 12"; return 1; }
  # Unpacked afresh: a folder left from an older kit could mix versions.
  rm -rf "$deps"
  mkdir -p "$deps"
  local deb
  for deb in "${debs[@]}"; do dpkg -x "$deb" "$deps"; done
  echo "${#debs[@]} .debs ($(du -ch "${debs[@]}" | tail -n 1 | cut -f1)) unpacked into $deps ($(du -sh "$deps" | cut -f1))" | tee -a "$summary"
  LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu "$deps/usr/bin/protoc" --version | tee -a "$summary"
}

step_configure() {
  local torch_cmake
  if [[ -n "${FITRUN_TORCH_CMAKE_PREFIX:-}" ]]; then
    torch_cmake=$FITRUN_TORCH_CMAKE_PREFIX
  else
    local torch_dir
    torch_dir=$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))') ||
      { echo "$python cannot import torch: install PyTorch for it, or set PYTHON or FITRUN_TORCH_CMAKE_PREFIX"; return 1; }
    torch_cmake=$torch_dir/share/cmake
  fi
  [[ -f "$torch_cmake/Torch/TorchConfig.cmake" ]] ||
    { echo "$torch_cmake/Torch/TorchConfig.cmake is missing: not a LibTorch with CMake files"; return 1; }
  echo "LibTorch's CMake files: $torch_cmake" | tee -a "$summary"
  # The build folder is kept between runs (a warm machine keeps git-ignored folders), so a second run
  # rebuilds only what changed; rm -rf gpu-work for a clean one.
  cmake -S "$repo/worker" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_cmake" -DFITRUN_DEPS_PREFIX="$deps" |
    tee "$work/cmake.out"
  grep -h '^-- fitrun: ' "$work/cmake.out" | sed 's/^-- fitrun: //' >>"$summary" || true
}

step_build() {
  ninja -C "$build" -j "$jobs"
  ls -l "$build/worker/fitrun-worker" "$build/worker/memory/libfitrun_memory.so" |
    awk '{ printf "%s: %.0f KiB\n", $NF, $5 / 1024 }' | sed "s|$build/||" | tee -a "$summary"
}

step_privacy() {
  local worker=$build/worker/fitrun-worker
  bash "$repo/tools/gpu/check_private_symbols.sh" "$worker" | tee -a "$summary"
  # The compiler's own record of the headers it read (ninja's deps log): every protobuf, gRPC and
  # Abseil header must be the unpacked Debian one.
  local headers outside
  headers=$(ninja -C "$build" -t deps | awk '$1 ~ /\// { print $1 }' | grep -E '/(google/protobuf|grpcpp?|absl)/' | sort -u)
  [[ -n "$headers" ]] || { echo "ninja's deps log lists no protobuf/gRPC/Abseil header"; return 1; }
  outside=$(grep -v "^$deps/" <<<"$headers" || true)
  if [[ -n "$outside" ]]; then
    echo "protobuf/gRPC/Abseil headers read from outside $deps:"
    head -n 20 <<<"$outside"
    return 1
  fi
  echo "headers: all $(wc -l <<<"$headers") protobuf/gRPC/Abseil headers the compiler read are under $deps" | tee -a "$summary"
  readelf -d "$worker" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ' | sed 's/^/NEEDED: /' | tee -a "$summary"
  echo | tee -a "$summary"
}

step_worker() {
  local worker=$build/worker/fitrun-worker status=0 output start end
  if env -u LD_LIBRARY_PATH ldd "$worker" | grep -q 'not found'; then
    env -u LD_LIBRARY_PATH ldd "$worker" | grep 'not found'
    return 1
  fi
  # An unknown argument: the worker loads LibTorch, runs every static initialiser (both protobufs'
  # descriptor pools among them), then prints its usage and exits 2 (kExitBadConfiguration).
  start=$(now)
  output=$(env -u LD_LIBRARY_PATH "$worker" --no-such-flag 2>&1) || status=$?
  end=$(now)
  echo "$output"
  [[ $status -eq 2 && "$output" == *"usage:"* ]] || { echo "expected the usage and exit 2, got exit $status"; return 1; }
  echo "fitrun-worker starts and exits in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') s" \
    "($(env -u LD_LIBRARY_PATH ldd "$worker" | grep -c '=> /') shared libraries, LibTorch's and theirs)" | tee -a "$summary"
}

step_bundle() {
  [[ -f "$kit/fitrun-bundle.tar.gz" ]] || { echo "$kit/fitrun-bundle.tar.gz is missing: run tools/gpu/prepare.sh"; return 1; }
  rm -rf "$work/bundle"
  mkdir -p "$work/bundle"
  tar -C "$work/bundle" -xzf "$kit/fitrun-bundle.tar.gz"
  local bad=""
  # glibc's and the compiler runtime's are the machine's own by design (tools/bundle.sh); the loader's
  # path is bin/../lib/..., so compared once resolved.
  bad=$(env -u LD_LIBRARY_PATH ldd "$bundle_root/bin/fitrund" "$bundle_root/bin/fitrun" | awk '$2 == "=>" { print $1, $3 }' |
    grep -vE '^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libresolv|libmvec)\.so' |
    while read -r name path; do
      [[ "$path" != not && "$(readlink -f "$path")" == "$bundle_root/lib/"* ]] || echo "$name => $path"
    done)
  if [[ -n "$bad" ]]; then
    echo "libraries the bundle's binaries resolve outside its lib/:"
    echo "$bad"
    return 1
  fi
  echo "bundle: $(ls "$bundle_root/lib" | wc -l) libraries ($(du -sh "$bundle_root/lib" | cut -f1)); every non-glibc" \
    "dependency of bin/fitrund and bin/fitrun resolves inside it" | tee -a "$summary"
}

# fitrund runs in the background beyond its step; the trap stops it. It is started in this shell, not
# in a step's subshell, so that its pid stays known here.
start_fitrund() {
  rm -rf "$state"
  mkdir -p "$state" "$work/specs"
  local flags=(--listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$state"
    --worker_binary="$build/worker/fitrun-worker" --stop_workers_on_exit
    --data_roots="$kit/datasets,$work/specs,$repo"
      # The steps that run jobs start fitrunds of their own; this one serves the inventory and a plan.
    --memory_probe=false)
  if have_gpu; then
    flags+=(--devices=auto --worker_cuda)
  else
    flags+=(--devices=cpu:2x2GiB)
  fi
  echo "fitrund ${flags[*]}" >"$logs/fitrund-daemon.cmdline"
  fitrund_started=$(now)
  "$bundle_root/bin/fitrund" "${flags[@]}" >"$logs/fitrund-daemon.log" 2>&1 &
  daemon_pid=$!
}

step_fitrund() {
  local end
  # Written once fitrund serves: its gRPC address, then its metrics address.
  for _ in $(seq 1 300); do
    [[ -s "$state/fitrund.metrics_address" ]] && break
    kill -0 "$daemon_pid" 2>/dev/null || { echo "fitrund exited before serving:"; cat "$logs/fitrund-daemon.log"; return 1; }
    sleep 0.1
  done
  [[ -s "$state/fitrund.address" ]] || { echo "fitrund did not write its address in 30 s"; cat "$logs/fitrund-daemon.log"; return 1; }
  end=$(now)
  cat "$logs/fitrund-daemon.cmdline" | tee -a "$summary"
  echo "fitrund from the bundle serves on $(cat "$state/fitrund.address") (metrics $(cat "$state/fitrund.metrics_address"))," \
    "$(awk -v a="$fitrund_started" -v b="$end" 'BEGIN { printf "%.2f", b - a }') s after its start" | tee -a "$summary"
  grep -i 'nvml\|device' "$logs/fitrund-daemon.log" | head -n 5 | tee -a "$summary" || true
}

step_devices() {
  fitrun_cli devices | tee -a "$summary"
}

# The example spec with its data path pointed at the kit's Fashion-MNIST.
write_spec() {
  mkdir -p "$work/specs"
  sed "s|path: /usr/share/datasets/fashion-mnist|path: $kit/datasets/fashion-mnist|" \
    "$repo/deploy/examples/fashion-mnist-mlp.yaml" >"$work/specs/fashion-mnist-mlp.yaml"
  grep -q "$kit/datasets/fashion-mnist" "$work/specs/fashion-mnist-mlp.yaml" ||
    { echo "deploy/examples/fashion-mnist-mlp.yaml no longer names /usr/share/datasets/fashion-mnist"; return 1; }
}

step_plan() {
  write_spec
  fitrun_cli plan "$work/specs/fashion-mnist-mlp.yaml" | tee -a "$summary"
}

step_cpu_job() {
  have_gpu && skip "a GPU machine: its jobs are the gpu_* steps (this fitrund plans on the GPUs)"
  write_spec
  local start end
  start=$(now)
  fitrun_cli submit "$work/specs/fashion-mnist-mlp.yaml" --watch | tee "$work/cpu_job.out"
  end=$(now)
  grep -q 'SUCCEEDED' "$work/cpu_job.out" || { echo "the job did not succeed"; return 1; }
  grep -E '^(plan|test accuracy|final loss|train time)' "$work/cpu_job.out" >>"$summary" || true
  echo "submit to end: $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s" | tee -a "$summary"
}

# --- the GPU steps ------------------------------------------------------------------------------------
# Each job runs through a fitrund of the step's own (own_fitrund: its devices, a state directory of its
# own, stopped with every rank when the step ends), and each figure is read back from fitrund's own
# record of the job (fitrun get --json), never made up: what a step cannot measure it reports as such.

own_state=""
own_pid=""
# own_fitrund NAME FLAG...: a fitrund from the bundle with the built worker (and the supervisor beside
# it) and these device flags; fitrun_own talks to it.
own_fitrund() {
  local name=$1; shift
  own_state="$work/state-$name"
  rm -rf "$own_state" && mkdir -p "$own_state" "$work/specs"
  "$bundle_root/bin/fitrund" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --state_dir="$own_state" \
    --worker_binary="$build/worker/fitrun-worker" --stop_workers_on_exit --worker_cuda \
    --data_roots="$kit/datasets,$work/specs,$repo" "$@" >"$logs/fitrund-$name.log" 2>&1 &
  own_pid=$!
  trap stop_own_fitrund EXIT
  for _ in $(seq 1 300); do
    [[ -s "$own_state/fitrund.metrics_address" ]] && return 0
    kill -0 "$own_pid" 2>/dev/null || { echo "fitrund ($*) exited:"; cat "$logs/fitrund-$name.log"; return 1; }
    sleep 0.1
  done
  echo "fitrund ($*) did not serve within 30 s"
  return 1
}
stop_own_fitrund() {
  [[ -n "$own_pid" ]] || return 0
  kill -TERM "$own_pid" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$own_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$own_pid" 2>/dev/null || true
  local environ left=()
  for environ in /proc/[0-9]*/environ; do
    grep -qzF "FITRUN_ASSIGNMENT=$own_state/" "$environ" 2>/dev/null && left+=("$(basename "$(dirname "$environ")")")
  done
  ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
  own_pid=""
}
fitrun_own() { "$bundle_root/bin/fitrun" --coordinator="$(cat "$own_state/fitrund.address")" "$@"; }

# gpu_spec NAME MODEL_AND_DATA_YAML EXTRA_YAML: a spec in $work/specs, Fashion-MNIST from the kit.
gpu_spec() {
  local file="$work/specs/$1.yaml"
  printf 'name: %s\n%s\n%s\n' "$1" "$2" "$3" | sed "s|FASHION|$kit/datasets/fashion-mnist|" >"$file"
  echo "$file"
}
readonly MLP="model: {builtin: mlp}
data: {kind: fashion_mnist, path: FASHION}"
readonly CNN="model: {builtin: cnn}
data: {kind: fashion_mnist, path: FASHION}"

# run_job NAME SPEC: submits, watches to the end, and writes one line of the job's figures (the plan,
# the device memory predicted against what the rank measured, the result) to the summary; returns
# non-zero unless it SUCCEEDED. Its JSON record is left at $work/jobs/NAME.json.
run_job() {
  local name=$1 spec=$2 id
  mkdir -p "$work/jobs"
  id=$(fitrun_own submit "$spec" | awk '/submitted job/ { print $3 }')
  [[ -n "$id" ]] || { echo "$name: not submitted"; return 1; }
  fitrun_own watch "$id" >"$work/jobs/$name.watch" 2>&1 || true
  fitrun_own get --json "$id" >"$work/jobs/$name.json"
  "$python" - "$name" "$work/jobs/$name.json" "$work/jobs/$name.watch" <<'PY' | tee -a "$summary"
import json, re, sys
name, path, watch = sys.argv[1:4]
job = json.load(open(path))
attempt = (job.get("attemptHistory") or [{}])[-1]
plan = job.get("plan", {})
predicted = int(attempt.get("predictedPeakBytes", 0))
device = int(attempt.get("measuredDevicePeakBytes", 0))
allocated = int(attempt.get("measuredPeakBytes", 0))
reserved = int(attempt.get("measuredReservedPeakBytes", 0))
mib = lambda b: f"{b / 2**20:.0f} MiB"
first = next((l for l in open(watch) if l.startswith("step 1/")), "")
line = (f"{name}: {job.get('state')}; plan {len(plan.get('deviceIds', []))} x {plan.get('perDeviceBatch')} "
        f"x {plan.get('gradAccumSteps')}, {plan.get('cudaAllocatorConfig', '')}; predicted {mib(predicted)}, "
        f"measured allocated {mib(allocated)} reserved {mib(reserved)} device {mib(device)}")
if device:
    line += f" ({100 * predicted / device:.0f}% of measured: {'within' if device <= predicted <= 1.15 * device else 'OUTSIDE'} [100%, 115%])"
result = job.get("result", {})
if "testAccuracy" in result:
    line += f"; test accuracy {result['testAccuracy']:.4f}"
print(line)
sys.exit(0 if job.get("state") == "JOB_STATE_SUCCEEDED" else 1)
PY
}

step_gpu_job() {
  have_gpu || skip "no GPU"
  own_fitrund whole --devices=cuda:0 --memory_probe=true
  fitrun_own devices | tee -a "$summary"
  local status=0 ratings="$work/specs/ratings.dat"
  "$python" "$repo/tools/make_movielens_sample.py" "$ratings" >/dev/null
  run_job mlp "$(gpu_spec gpu-mlp "$MLP" "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
epochs: 1")" || status=1
  run_job cnn "$(gpu_spec gpu-cnn "$CNN" "optimizer: {kind: adam, lr: 0.001}
global_batch_size: 256
epochs: 1")" || status=1
  run_job gpt-recommender "$(gpu_spec gpu-gpt-recommender "model: {builtin: gpt, gpt: {layers: 2, heads: 2, hidden: 64, context: 50}}
data: {kind: movielens, path: $ratings}" "optimizer: {kind: adam, lr: 0.001}
global_batch_size: 128
epochs: 5")" || status=1
  # Submit to the first step, as the watch saw it, beside PyTorch's own DDP script there (9.1-11.1 s).
  grep -m1 -E '^step 1/' "$work/jobs/mlp.watch" >/dev/null && \
    echo "mlp: first step reported; its time is in $work/jobs/mlp.watch" | tee -a "$summary"
  return $status
}

step_gpu_slices() {
  have_gpu || skip "no GPU"
  local status=0 cap
  for cap in 1 2; do
    own_fitrund "slice-${cap}" --devices="cuda:0@${cap}GiB" --memory_probe=true
    run_job "cnn-adamw-${cap}GiB" "$(gpu_spec "gpu-slice-${cap}" "$CNN" "optimizer: {kind: adamw, lr: 0.001}
global_batch_size: 55440
max_steps: 3
resources: {memory_headroom: 0.05}
fault_tolerance: {max_oom_retries: 0}")" || status=1
    "$python" - "$work/jobs/cnn-adamw-${cap}GiB.json" "$cap" <<'PY' | tee -a "$summary" || status=1
import json, sys
job = json.load(open(sys.argv[1])); cap = int(sys.argv[2]) << 30
allocated = int((job.get("attemptHistory") or [{}])[-1].get("measuredPeakBytes", 0))
print(f"  slice {sys.argv[2]} GiB: allocated peak {100 * allocated / cap:.1f}% of the slice (target >= 80%), "
      f"{len(job.get('oomHistory', []))} out-of-memory error(s)")
sys.exit(0 if allocated >= 0.8 * cap and not job.get("oomHistory") else 1)
PY
    stop_own_fitrund
  done
  return $status
}

step_gpu_oom() {
  have_gpu || skip "no GPU"
  own_fitrund oom --devices=cuda:0@1GiB --memory_probe=true
  # Step 3 of the first attempt asks the caching allocator for more than the slice: a real CUDA
  # out-of-memory error, the re-plan to a smaller batch and the resume from step 2's checkpoint.
  run_job oom "$(gpu_spec gpu-oom "$CNN" "optimizer: {kind: sgd, lr: 0.01}
global_batch_size: 2048
max_steps: 6
checkpoint: {every_steps: 2}
fault_injection: {kind: oom, rank: 0, at_step: 3}")" || return 1
  grep -E 'out of memory|resumed from the checkpoint|training resumed' "$work/jobs/oom.watch" | head -n 4 | tee -a "$summary"
  grep -q 'resumed from the checkpoint' "$work/jobs/oom.watch"
}

step_gpu_precision() {
  have_gpu || skip "no GPU"
  own_fitrund precision --devices=cuda:0 --memory_probe=false
  local precision status=0
  for precision in fp32 bf16 fp16; do
    run_job "mlp-$precision" "$(gpu_spec "gpu-mlp-$precision" "$MLP" "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
epochs: 1
precision: $precision
seed: 1")" || status=1
  done
  "$python" - "$work/jobs" <<'PY' | tee -a "$summary" || status=1
import json, os, sys
accuracy = {p: json.load(open(os.path.join(sys.argv[1], f"mlp-{p}.json"))).get("result", {}).get("testAccuracy", 0)
            for p in ("fp32", "bf16", "fp16")}
close = all(abs(accuracy[p] - accuracy["fp32"]) <= 0.01 for p in ("bf16", "fp16"))
print("accuracy " + ", ".join(f"{p} {a:.4f}" for p, a in accuracy.items()) + f" ({'within' if close else 'NOT within'} 0.01 of fp32)")
sys.exit(0 if close else 1)
PY
  for hook in fp16 bf16 powersgd; do
    run_job "mlp-hook-$hook" "$(gpu_spec "gpu-mlp-hook-$hook" "$MLP" "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
global_batch_size: 256
max_steps: 50
ddp: {comm_hook: $hook, powersgd_start_iter: 10}")" || status=1
  done
  return $status
}

step_gpu_script_job() {
  have_gpu || skip "no GPU"
  local status=0
  [[ -x "$build/worker/fitrun-supervisor" ]] || { echo "no fitrun-supervisor beside the worker"; return 1; }
  own_fitrund script --devices=cuda:0@20GiBx2 --memory_probe=true
  local script_spec
  for ranks in 1 2; do
    script_spec=$(gpu_spec "gpu-script-$ranks" "script:
  command: [$python, gpu_script.py]
  working_dir: $repo/tools/gpu" "global_batch_size: 128
max_steps: 20
resources: {min_devices: $ranks, max_devices: $ranks}")
    run_job "script-$ranks-rank" "$script_spec" || status=1
  done
  grep -h 'steps on cuda' "$own_state"/jobs/*/attempt-*/rank-*.log | head -n 3 | tee -a "$summary" || status=1
  return $status
}

# --- the sequence -----------------------------------------------------------------------------------
selected=("$@")
all_steps=" environment deps configure build privacy worker bundle fitrund devices plan cpu_job gpu_job gpu_slices gpu_oom gpu_precision gpu_script_job "
for name in "${selected[@]}"; do
  [[ "$all_steps" == *" $name "* ]] || { echo "check: no step '$name' (steps:$all_steps)" >&2; exit 2; }
done

note "fitrun GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), repository $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')"
started=$(now)
step environment
step deps
step configure deps
step build configure
step privacy build
step worker build
step bundle
# fitrund serves every step after it; started when one of them runs and what it needs is there.
if [[ "${outcome[bundle]:-PASS}" == PASS && "${outcome[build]:-PASS}" == PASS ]] &&
  { wanted fitrund || wanted devices || wanted plan || wanted cpu_job || wanted gpu_job ||
    wanted gpu_oom || wanted gpu_slices || wanted gpu_precision || wanted gpu_script_job; }; then
  start_fitrund
  wanted fitrund || selected+=(fitrund)   # its step waits until it serves
fi
step fitrund bundle build
step devices fitrund
step plan fitrund
step cpu_job fitrund
step gpu_job build bundle
step gpu_slices build bundle
step gpu_oom build bundle
step gpu_precision build bundle
step gpu_script_job build bundle
stop_fitrund

failed=0 passed=0
for name in "${!outcome[@]}"; do
  case ${outcome[$name]} in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; esac
done
note ""
note "$passed passed, $failed failed, $(awk -v a="$started" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }') s in all"
((failed == 0))
