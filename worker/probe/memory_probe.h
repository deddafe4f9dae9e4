#ifndef FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
#define FITRUN_WORKER_PROBE_MEMORY_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/memory/capped_allocator.h"

namespace fitrun::worker {

// The two micro-batch sizes the probe measures (fitrun-worker --probe_batches=B1,B2).
struct ProbeOptions {
  int64_t small_batch = 2;
  int64_t large_batch = 8;
  // Real optimizer steps per batch size: the first allocates optimizer state, later ones show the
  // steady state with gradients kept between steps.
  int steps = 3;
};

struct ProbePeak {
  int64_t batch = 0;
  int64_t peak_bytes = 0;           // the step's peak: the larger of the two below
  int64_t backward_peak_bytes = 0;  // during backward (activations and their gradients)
  int64_t other_peak_bytes = 0;     // the rest of the step: forward, optimizer step, zero_grad
};

// One rank's device memory as the larger of two lines in the batch size: backward's,
// fixed_bytes + per_sample_bytes * b, and the rest of the step's, other_fixed_bytes +
// other_per_sample_bytes * b, each fitted through the two measured batch sizes. This is the
// calibration the coordinator's estimator uses for any model (DESIGN.md, "Memory estimator").
struct ProbeResult {
  int64_t model_state_bytes = 0;  // parameters and buffers
  std::vector<ProbePeak> peaks;   // small batch first
  int64_t fixed_bytes = 0;
  int64_t per_sample_bytes = 0;
  int64_t other_fixed_bytes = 0;
  int64_t other_per_sample_bytes = 0;
};

// Measures what one rank of the assignment's job needs on its device, without a process group:
// loads the spec's workload, installs `counter` (which must have no cap and not be installed yet) as
// the process's CPU allocator, moves the model's state into it, and for each batch size runs
// `steps` real training steps (forward, backward, the spec's optimizer and precision) with one flat
// buffer the size of all gradients standing in for DDP's buckets, recording the peak of each.
// Uses assignment.cpu_threads[0] threads (1 if unset) as rank 0 would. The plan's batch, steps and
// devices are not used. Errors are InvalidArgument naming the field (spec.*, --probe_batches).
absl::StatusOr<ProbeResult> RunMemoryProbe(const fitrun::v1::WorkerAssignment& assignment,
                                           const ProbeOptions& options, CappedCpuAllocator* counter);

// {"model_state_bytes": ..., "peaks": [{"batch": B1, "peak_bytes": P1, "backward_peak_bytes": ...,
//  "other_peak_bytes": ...}, ...], "fixed_bytes": F, "per_sample_bytes": S, "other_fixed_bytes": F2,
//  "other_per_sample_bytes": S2} on one line.
std::string ProbeResultJson(const ProbeResult& result);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
