// fitrun-instant-worker: a rank that trains nothing. It speaks the whole rank contract through the
// real runtime (the environment, the WorkerChannel stream with its Hello and job token, one progress
// report, RankFinished, the exit code) but does no LibTorch work, so it starts and ends in
// milliseconds. Load tests pass it to fitrund as --worker_binary to run thousands of jobs through
// fitrund's real launcher, store and event streams where the real worker's start-up (about a second
// of LibTorch per rank) would make them take hours. It has no --probe: run fitrund with
// --memory_probe=false.
#include <cstdio>
#include <optional>
#include <string>

#include "proto/contract/log.h"
#include "worker/options.h"
#include "worker/runtime/rank_runtime.h"

namespace fitrun::worker {
namespace {

class InstantProgram final : public TrainingProgram {
 public:
  int Run(RankRuntime& runtime) override {
    StepProgress progress;
    progress.rank = runtime.options().rank;
    progress.step = 1;
    progress.total_steps = 1;
    progress.epoch = 1;
    progress.loss = 1.0;
    runtime.sink().OnProgress(progress);
    fitrun::v1::RankFinished finished;
    finished.set_steps(1);
    finished.set_final_loss(1.0);
    return runtime.Finish(finished, "finished 1 step (instant worker: nothing trained)");
  }
};

}  // namespace
}  // namespace fitrun::worker

int main() {
  absl::StatusOr<fitrun::worker::WorkerOptions> options =
      fitrun::worker::WorkerOptionsFromEnvironment([](const std::string& name) -> std::optional<std::string> {
        const char* value = std::getenv(name.c_str());
        return value == nullptr ? std::nullopt : std::optional<std::string>(value);
      });
  if (!options.ok()) {
    fitrun::contract::LogError("%s", options.status().message());
    return fitrun::contract::launch::kExitBadConfiguration;
  }
  fitrun::worker::InstantProgram program;
  return fitrun::worker::RunRank(*options, program);
}
