"""The launch contract, as Python names it: the environment a rank starts with and its exit codes.

Mirrors proto/contract/launch_contract.h (fitrund and fitrun-worker name the same strings there);
change both together.
"""

# torchrun's variables: an unchanged torchrun script reads these (init_process_group with env://).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# torchrun's agent store: every rank a client of the store fitrund holds for a local attempt.
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

# fitrun's own.
COORDINATOR = "FITRUN_COORDINATOR"
JOB_ID = "FITRUN_JOB_ID"
ATTEMPT = "FITRUN_ATTEMPT"
JOB_TOKEN = "FITRUN_JOB_TOKEN"
JOB_TOKEN_FD = "FITRUN_JOB_TOKEN_FD"
ASSIGNMENT = "FITRUN_ASSIGNMENT"
# A warm fitrun-worker's pipe and id (fitrund --warm_ranks); never a script's.
WARM_FD = "FITRUN_WARM_FD"
WARM_RANK = "FITRUN_WARM_RANK"
# A built-in job's rank's OpenBLAS threads (its device's share of the cores).
OPEN_BLAS_THREADS = "OPENBLAS_NUM_THREADS"
TLS_CA = "FITRUN_TLS_CA"
CUDA_ALLOCATOR_CONFIG = "PYTORCH_CUDA_ALLOC_CONF"

# The plan, for script ranks.
PER_DEVICE_BATCH = "FITRUN_PER_DEVICE_BATCH"
GRAD_ACCUM_STEPS = "FITRUN_GRAD_ACCUM_STEPS"
LEARNING_RATE = "FITRUN_LR"
GLOBAL_BATCH_SIZE = "FITRUN_GLOBAL_BATCH_SIZE"
CHECKPOINT_DIR = "FITRUN_CHECKPOINT_DIR"
MAX_STEPS = "FITRUN_MAX_STEPS"
PROBE = "FITRUN_PROBE"
# The plan's strategy, for a script that applies it (Run.apply_strategy).
ACTIVATION_CHECKPOINTING = "FITRUN_ACTIVATION_CHECKPOINTING"
ZERO_STAGE = "FITRUN_ZERO_STAGE"
PRECISION = "FITRUN_PRECISION"

# The pipes to the supervising fitrun-worker: JSON lines out, "stop <reason>" lines in.
REPORT_FD = "FITRUN_REPORT_FD"
CONTROL_FD = "FITRUN_CONTROL_FD"

# The device's cap (the preloaded allocator's on a CPU device; on a GPU slice, torch.cuda's).
MEMORY_CAP_BYTES = "FITRUN_MEMORY_CAP_BYTES"
# The supervisor's memory meter (proto/contract/memory_meter.h): a page of int64 figures at these
# offsets, written by the preloaded allocator on a CPU device and by this module on a GPU.
MEMORY_METER_FD = "FITRUN_MEMORY_METER_FD"
METER_PEAK = 0
METER_LIVE = 8
METER_REFUSED = 16
METER_LIVE_AT_REFUSAL = 24
METER_WRITER = 32
METER_RESERVED_PEAK = 40
METER_DEVICE_PEAK = 48
METER_WRITER_CPU_ALLOCATOR = 1
METER_WRITER_CUDA_MODULE = 2
# The kind of device the rank runs on: "cpu" or "cuda".
DEVICE_KIND = "FITRUN_DEVICE_KIND"
DEVICE_KIND_CPU = "cpu"
DEVICE_KIND_CUDA = "cuda"

# How a rank ends.
EXIT_SUCCESS = 0
EXIT_TRAINING_FAILED = 1
EXIT_BAD_CONFIGURATION = 2
EXIT_OUT_OF_MEMORY = 3
EXIT_STOPPED = 143
