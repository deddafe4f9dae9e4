// How fitrund starts a rank and how a rank says how it ended: the environment every rank gets (the
// torchrun variables and fitrun's own) and the exit codes it answers with. Beside the protos because it
// is as much the API between the coordinator and its ranks as they are: fitrund, fitrun-worker and its
// memory probe name these constants instead of spelling the strings; the Python module mirrors them in
// client/python/fitrun/contract.py.
#ifndef FITRUN_PROTO_CONTRACT_LAUNCH_CONTRACT_H_
#define FITRUN_PROTO_CONTRACT_LAUNCH_CONTRACT_H_

namespace fitrun::contract::launch {

// The torchrun contract: an unchanged torchrun script reads these (dist.init_process_group with env://).
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
// torchrun's agent store: with "True", every rank is a client of the store at MASTER_ADDR:MASTER_PORT
// and none hosts it (torch.distributed's env:// rendezvous, and fitrun-worker, read it). On one machine
// fitrund holds that store for the attempt (server/launcher/rendezvous_store.h). The restart count
// is torchrun's too (1.13 prefixes the store's keys with it): the attempt's number less one.
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";

// fitrun's own: where to report (the WorkerChannel address), as which job, attempt and with which
// token, and the file holding the rank's WorkerAssignment (spec, plan, checkpoint directory, caps).
inline constexpr char kCoordinator[] = "FITRUN_COORDINATOR";
inline constexpr char kJobId[] = "FITRUN_JOB_ID";
inline constexpr char kAttempt[] = "FITRUN_ATTEMPT";
// The token is a secret of fitrund's and the rank's: the job's own code (a script, whatever a user
// starts beside it) must not be able to speak for the rank. A rank run as its owner's account is
// handed it through a pipe it inherits as descriptor kJobTokenDescriptor (named by
// FITRUN_JOB_TOKEN_FD), which it reads and closes before it makes itself undumpable, so the job's
// other processes (the same account) can read it neither in /proc/<pid>/environ nor in its memory.
// A rank run as fitrund's own user, or by a launcher that cannot hand a descriptor (a Slurm batch
// script), gets FITRUN_JOB_TOKEN: the former shares fitrund's user anyway.
inline constexpr char kJobToken[] = "FITRUN_JOB_TOKEN";
inline constexpr char kJobTokenFd[] = "FITRUN_JOB_TOKEN_FD";
inline constexpr int kJobTokenDescriptor = 3;
inline constexpr char kAssignment[] = "FITRUN_ASSIGNMENT";
// A warm rank (fitrund --warm_ranks): a fitrun-worker started before its job, LibTorch loaded, that
// learns who it is from descriptor kJobTokenDescriptor (named by FITRUN_WARM_FD) rather than from
// its environment: its working directory, its log file and each variable above as NUL-terminated
// entries ("KEY=VALUE" for a variable), an empty entry, then the job token up to the end of the
// pipe, which it then reads as FITRUN_JOB_TOKEN_FD's. The pipe's end before any entry (fitrund
// stopped, or let the rank go) makes it exit 0. FITRUN_WARM_RANK is the id a restarted fitrund
// recognises it by in /proc/<pid>/environ, since the job's own variables are never there.
inline constexpr char kWarmFd[] = "FITRUN_WARM_FD";
// A built-in job's rank: the threads of a threaded OpenBLAS (Debian's LibTorch's BLAS), its
// device's cpu_threads; read once, when the library loads (1 for a warm rank, which its job then
// raises at run time). Without it OpenBLAS keeps a thread per core waiting in sched_yield, which cost
// two ranks on two cores about a tenth of their cnn throughput.
inline constexpr char kOpenBlasThreads[] = "OPENBLAS_NUM_THREADS";
inline constexpr char kWarmRank[] = "FITRUN_WARM_RANK";
// When fitrund serves TLS: the PEM file of the CA its certificate chains to, for the rank to verify
// fitrund when it dials back (the rank authenticates with its job token).
inline constexpr char kTlsCa[] = "FITRUN_TLS_CA";
// For the parity test: where rank 0 writes its initial parameters and sample order.
inline constexpr char kDumpInitialState[] = "FITRUN_DUMP_INITIAL_STATE";
// A built-in job's ranks sum their gradients through shared memory when they all share a machine;
// "gloo" keeps them on Gloo's sockets, as ranks on separate machines are (the DDP benchmark's
// comparisons and its slowed link). Nothing sets it but a person or a benchmark.
inline constexpr char kAllReduce[] = "FITRUN_ALL_REDUCE";
inline constexpr char kAllReduceOverGloo[] = "gloo";

// Ranks on CUDA devices: PyTorch's caching-allocator settings, as the plan assumed them
// (Plan.cuda_allocator_config; expandable segments unless fitrund's environment or the script's
// spec.script.env says otherwise).
inline constexpr char kCudaAllocatorConfig[] = "PYTORCH_CUDA_ALLOC_CONF";

// What a script rank (spec.script) is told besides the torchrun variables: its share of the plan, a
// checkpoint directory that outlives attempts, and the step limit when the spec sets one.
inline constexpr char kPerDeviceBatch[] = "FITRUN_PER_DEVICE_BATCH";
inline constexpr char kGradAccumSteps[] = "FITRUN_GRAD_ACCUM_STEPS";
inline constexpr char kLearningRate[] = "FITRUN_LR";
inline constexpr char kGlobalBatchSize[] = "FITRUN_GLOBAL_BATCH_SIZE";
inline constexpr char kCheckpointDir[] = "FITRUN_CHECKPOINT_DIR";
inline constexpr char kMaxSteps[] = "FITRUN_MAX_STEPS";
// How the plan has the script train beyond its batch, for a script that applies it (the fitrun
// module's run.apply_strategy): "1" to recompute its blocks' activations in backward, "1" to shard its
// optimizer states over the ranks (ZeRO stage 1, torch's ZeroRedundancyOptimizer), and the precision
// to autocast to ("fp32", "bf16" or "fp16"). Every script rank gets all three; "0" and "fp32" are
// plain training.
inline constexpr char kActivationCheckpointing[] = "FITRUN_ACTIVATION_CHECKPOINTING";
inline constexpr char kZeroStage[] = "FITRUN_ZERO_STAGE";
inline constexpr char kPrecision[] = "FITRUN_PRECISION";
// "1" when the run is fitrund's memory probe (one rank, a few steps), so a script may skip its
// evaluation and checkpoints.
inline constexpr char kProbe[] = "FITRUN_PROBE";
// The pipes between a script rank and the fitrun-worker that supervises it: the script writes JSON
// lines to the report descriptor (the Python module's run.report and friends) and reads "stop
// <reason>" lines from the control descriptor.
inline constexpr char kReportFd[] = "FITRUN_REPORT_FD";
inline constexpr char kControlFd[] = "FITRUN_CONTROL_FD";
// Read by the preloaded allocator (libfitrun_memory.so): the device's cap in bytes (0: count only).
// On a GPU nothing is preloaded: the cap binds torch.cuda's allocator. Where the figures go is the
// memory meter (memory_meter.h, FITRUN_MEMORY_METER_FD).
inline constexpr char kMemoryCapBytes[] = "FITRUN_MEMORY_CAP_BYTES";
// The kind of device a script rank (or its probe) runs on: where its memory is counted.
inline constexpr char kDeviceKind[] = "FITRUN_DEVICE_KIND";
inline constexpr char kDeviceKindCpu[] = "cpu";
inline constexpr char kDeviceKindCuda[] = "cuda";

// How a rank ends.
enum ExitCode : int {
  kExitSuccess = 0,
  kExitTrainingFailed = 1,    // a collective, LibTorch or the loss failed: a crash, worth a restart
  kExitBadConfiguration = 2,  // environment, assignment, flags or dataset unusable: a restart cannot help
  kExitOutOfMemory = 3,       // the device's memory ran out; an OutOfMemory report went out first
  kExitStopped = 143,         // the coordinator said stop (128 + SIGTERM, as if terminated)
};

}  // namespace fitrun::contract::launch

#endif  // FITRUN_PROTO_CONTRACT_LAUNCH_CONTRACT_H_
