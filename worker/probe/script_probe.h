// The memory probe for script jobs: a user's script is opaque, so each micro-batch is one short run
// of it as a single rank (the torchrun environment with WORLD_SIZE=1, FITRUN_PROBE=1, a few steps),
// with the preloaded allocator counting every tensor, and the run's peak is the measurement.
#ifndef FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_
#define FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/probe/probe_protocol.h"
#include "worker/script/script_process.h"

namespace fitrun::worker {

class ScriptProbe {
 public:
  // Optimizer steps per run: the first allocates the optimizer's state, the later ones show the
  // steady state.
  static constexpr int64_t kSteps = 3;
  static constexpr absl::Duration kRunTimeout = absl::Minutes(5);

  // InvalidArgument when the assignment has no script or its command cannot run here.
  static absl::StatusOr<std::unique_ptr<ScriptProbe>> Create(const fitrun::v1::WorkerAssignment& assignment);

  // One run at `batch`: its peak, ResourceExhausted when it ran out of the assignment's cap (the
  // budget), Internal with the tail of its stderr when it failed otherwise.
  absl::StatusOr<ProbePeak> Measure(int64_t batch);

 private:
  ScriptProbe(const fitrun::v1::WorkerAssignment& assignment, SupportFiles support)
      : assignment_(assignment), support_(std::move(support)) {}

  const fitrun::v1::WorkerAssignment assignment_;
  const SupportFiles support_;
};

// A script's probe in the protocol's terms: the header says nothing is known of its size and data (they
// are the script's own), then each batch's measurement.
absl::Status ProbeScript(const fitrun::v1::WorkerAssignment& assignment, const std::vector<int64_t>& batches);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_
