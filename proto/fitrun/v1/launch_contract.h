// How fitrund starts a rank and how a rank says how it ended: the environment every rank gets (the
// torchrun variables and fitrun's own) and the exit codes it answers with. Beside the protos because it
// is as much the API between the coordinator and its ranks as they are: fitrund, fitrun-worker and its
// memory probe name these constants instead of spelling the strings.
#ifndef FITRUN_PROTO_FITRUN_V1_LAUNCH_CONTRACT_H_
#define FITRUN_PROTO_FITRUN_V1_LAUNCH_CONTRACT_H_

namespace fitrun::v1::launch {

// The torchrun contract: an unchanged torchrun script reads these (dist.init_process_group with env://).
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";

// fitrun's own: where to report (the WorkerChannel address), as which job, attempt and with which
// token, and the file holding the rank's WorkerAssignment (spec, plan, checkpoint directory, caps).
inline constexpr char kCoordinator[] = "FITRUN_COORDINATOR";
inline constexpr char kJobId[] = "FITRUN_JOB_ID";
inline constexpr char kAttempt[] = "FITRUN_ATTEMPT";
inline constexpr char kJobToken[] = "FITRUN_JOB_TOKEN";
inline constexpr char kAssignment[] = "FITRUN_ASSIGNMENT";
// For the parity test: where rank 0 writes its initial parameters and sample order.
inline constexpr char kDumpInitialState[] = "FITRUN_DUMP_INITIAL_STATE";

// How a rank ends.
enum ExitCode : int {
  kExitSuccess = 0,
  kExitTrainingFailed = 1,    // a collective, LibTorch or the loss failed: a crash, worth a restart
  kExitBadConfiguration = 2,  // environment, assignment, flags or dataset unusable: a restart cannot help
  kExitOutOfMemory = 3,       // the device's memory ran out; an OutOfMemory report went out first
  kExitStopped = 143,         // the coordinator said stop (128 + SIGTERM, as if terminated)
};

}  // namespace fitrun::v1::launch

#endif  // FITRUN_PROTO_FITRUN_V1_LAUNCH_CONTRACT_H_
