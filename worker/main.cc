// fitrun-worker: one rank of a fitrun job. Started by fitrund (or by hand) with the torchrun
// environment plus FITRUN_*; see worker/options.h for the contract and ExitCode for what the exit
// status means. A script job's rank supervises the user's script (worker/programs/script_rank.h). With --probe it instead measures one rank's peak memory at the micro-batch sizes the
// coordinator's calibration asks for (worker/probe/memory_probe.h).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"
#include "worker/options.h"
#include "worker/probe/probe_mode.h"
#include "worker/programs/builtin_training.h"
#include "worker/programs/script_rank.h"
#include "worker/runtime/rank_runtime.h"

namespace fitrun::worker {
namespace {

std::optional<std::string> GetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace
}  // namespace fitrun::worker

int main(int argc, char** argv) {
  // Without Abseil's lock-order checks, which Debian's build leaves on (see server/main.cc); the
  // unit tests keep them.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  constexpr int kBadConfiguration = fitrun::contract::launch::kExitBadConfiguration;
  // A warm rank idles here, its libraries loaded, until fitrund hands it a job. Failing to take one
  // is not the job's configuration (exit 1, a crash: the attempt is retried).
  if (absl::Status warm = fitrun::worker::AwaitWarmIdentity(); absl::IsCancelled(warm)) {
    return 0;
  } else if (!warm.ok()) {
    fitrun::contract::LogError("warm rank: %s", warm.message());
    return 1;
  }
  absl::StatusOr<fitrun::worker::CommandLine> command_line = fitrun::worker::ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr,
                 "fitrun-worker: %s\n"
                 "usage: %s                              train one rank\n"
                 "       %s --probe [--probe_batches=B1,B2,...]  measure peak memory at micro-batch sizes\n"
                 "                         (without --probe_batches: one size per line on stdin)\n"
                 "Configured by the environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
                 "MASTER_PORT, FITRUN_ASSIGNMENT, and optionally FITRUN_COORDINATOR, FITRUN_JOB_ID,\n"
                 "FITRUN_ATTEMPT, FITRUN_JOB_TOKEN_FD (or FITRUN_JOB_TOKEN). The probe reads only FITRUN_ASSIGNMENT.\n",
                 std::string(command_line.status().message()).c_str(), argv[0], argv[0]);
    return kBadConfiguration;
  }
  if (command_line->probe) return fitrun::worker::RunProbeMode(command_line->probe_batches);
  absl::StatusOr<fitrun::worker::WorkerOptions> options =
      fitrun::worker::WorkerOptionsFromEnvironment(fitrun::worker::GetEnv);
  if (!options.ok()) {
    fitrun::contract::LogError("%s", options.status().message());
    return kBadConfiguration;
  }
  // A script job's rank supervises the user's script; any other trains a built-in workload. An
  // assignment that cannot be read is the built-in program's to report.
  absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = fitrun::worker::LoadAssignment(options->assignment_path);
  const bool script = assignment.ok() && assignment->spec().has_script();
  // A peer that dies while Gloo writes to it must fail this rank's collective with EPIPE (reported as
  // RankFailed, exit 1), not kill it with SIGPIPE. A script's supervisor keeps the default, which the
  // script it spawns inherits.
  if (!script) std::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<fitrun::worker::TrainingProgram> program =
      script ? fitrun::worker::MakeScriptRank(*options) : fitrun::worker::MakeBuiltinTraining(*options);
  return fitrun::worker::RunRank(*options, *program);
}
