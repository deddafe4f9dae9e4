// The memory probe for script jobs: a user's script is opaque, so each micro-batch is one short run
// of it as a single rank (the torchrun environment with WORLD_SIZE=1, FITRUN_PROBE=1, a few steps),
// and the run's peak is the measurement: on the host, the preloaded allocator's, which counts every
// CPU tensor; on a GPU, torch.cuda's allocated peak, which the fitrun module reports (the preload
// sees none of a script's CUDA tensors).
#ifndef FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_
#define FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/options.h"
#include "worker/probe/probe_protocol.h"
#include "worker/script/script_process.h"

namespace fitrun::worker {

class ScriptProbe {
 public:
  // Optimizer steps per run: the first allocates the optimizer's state, the later ones show the
  // steady state.
  static constexpr int64_t kSteps = 3;
  static constexpr absl::Duration kRunTimeout = absl::Minutes(5);

  // InvalidArgument when the assignment has no script, its command cannot run here or its device is
  // not one; FailedPrecondition when what counts the script's memory there is not beside the binary.
  static absl::StatusOr<std::unique_ptr<ScriptProbe>> Create(const fitrun::v1::WorkerAssignment& assignment);
  // As above, with the support files found elsewhere than beside this binary (tests).
  static absl::StatusOr<std::unique_ptr<ScriptProbe>> Create(const fitrun::v1::WorkerAssignment& assignment,
                                                             SupportFiles support);

  // One run at `batch`: its peak, ResourceExhausted when it ran out of the assignment's cap (the
  // budget), Internal with the tail of its stderr when it failed otherwise.
  absl::StatusOr<ProbePeak> Measure(int64_t batch);

 private:
  ScriptProbe(const fitrun::v1::WorkerAssignment& assignment, PlanDevice device, SupportFiles support)
      : assignment_(assignment), device_(device), support_(std::move(support)) {}

  const fitrun::v1::WorkerAssignment assignment_;
  const PlanDevice device_;
  const SupportFiles support_;
};

// The device a script's probe measures on: the one plan.device_ids[0] names when the assignment
// carries a plan, the host otherwise. Errors name the field.
absl::StatusOr<PlanDevice> ScriptProbeDevice(const fitrun::v1::WorkerAssignment& assignment);

// What the probe's run at `batch` on `device` is told (the port, checkpoint directory and peak file
// are the run's own, filled in by Measure). On the host the allocator is preloaded and writes the
// peak file; on a GPU nothing is preloaded, the script sees that GPU alone, and FITRUN_DEVICE_KIND
// tells the fitrun module to write torch.cuda's allocated peak into the same file.
ScriptRunSettings ScriptProbeRunSettings(const fitrun::v1::WorkerAssignment& assignment, const PlanDevice& device,
                                         int64_t batch);

// A script's probe in the protocol's terms: the header says nothing is known of its size and data (they
// are the script's own), then each batch's measurement.
absl::Status ProbeScript(const fitrun::v1::WorkerAssignment& assignment, const std::vector<int64_t>& batches);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_SCRIPT_PROBE_H_
