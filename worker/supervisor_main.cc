// fitrun-supervisor: one rank of a script job, without LibTorch. It supervises the user's script
// (worker/programs/script_rank.h) and, with --probe, measures the script's memory at micro-batch
// sizes (worker/probe/script_probe.h), exactly as fitrun-worker does for a script job, but it links
// only the launch contract and the WorkerChannel, so the script runs with whatever PyTorch the
// machine has (pip's CUDA build on a GPU machine) and nothing of fitrun's LibTorch is loaded beside it.
// fitrund starts it for script jobs when it is installed beside fitrun-worker.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/contract/launch_contract.h"
#include "proto/contract/log.h"
#include "worker/options.h"
#include "worker/probe/probe_protocol.h"
#include "worker/probe/script_probe.h"
#include "worker/programs/script_rank.h"
#include "worker/runtime/rank_runtime.h"

namespace {

constexpr int kBadConfiguration = fitrun::contract::launch::kExitBadConfiguration;

std::optional<std::string> GetEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

constexpr char kNotAScript[] =
    "the assignment is not a script job; fitrun-supervisor runs spec.script jobs only (the built-in models "
    "need fitrun-worker)";

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<fitrun::worker::CommandLine> command_line = fitrun::worker::ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::fprintf(stderr,
                 "fitrun-supervisor: %s\n"
                 "usage: %s                              supervise one rank of a script job\n"
                 "       %s --probe [--probe_batches=B1,B2,...]  measure the script's peak memory\n"
                 "Configured by the environment, as fitrun-worker (RANK, WORLD_SIZE, FITRUN_ASSIGNMENT, ...).\n",
                 std::string(command_line.status().message()).c_str(), argv[0], argv[0]);
    return kBadConfiguration;
  }
  if (command_line->probe) {
    absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = fitrun::worker::LoadProbeAssignment();
    absl::Status status = assignment.status();
    if (assignment.ok()) {
      status = assignment->spec().has_script()
                   ? fitrun::worker::ProbeScript(*assignment, command_line->probe_batches)
                   : absl::InvalidArgumentError(kNotAScript);
    }
    return fitrun::worker::ProbeExitCode("fitrun-supervisor", status);
  }
  absl::StatusOr<fitrun::worker::WorkerOptions> options = fitrun::worker::WorkerOptionsFromEnvironment(GetEnv);
  if (!options.ok()) {
    fitrun::contract::LogError("%s", options.status().message());
    return kBadConfiguration;
  }
  absl::StatusOr<fitrun::v1::WorkerAssignment> assignment = fitrun::worker::LoadAssignment(options->assignment_path);
  if (!assignment.ok() || !assignment->spec().has_script()) {
    fitrun::contract::LogError("%s", assignment.ok() ? kNotAScript : std::string(assignment.status().message()));
    return kBadConfiguration;
  }
  std::unique_ptr<fitrun::worker::TrainingProgram> program = fitrun::worker::MakeScriptRank(*options);
  return fitrun::worker::RunRank(*options, *program);
}
