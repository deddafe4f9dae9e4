// fitrun-worker --probe: one rank's peak device memory at any micro-batch size, measured by running
// real training steps of a job's spec under the counting allocator. The coordinator drives it (which
// batches to measure is its calibration's business: server/core/memory/memory_curve.h); the worker only
// measures, one batch after another in one process, so the dataset and LibTorch load once.
#ifndef FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
#define FITRUN_WORKER_PROBE_MEMORY_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/memory/capped_allocator.h"
#include "worker/models/workload.h"
#include "worker/probe/probe_protocol.h"

namespace fitrun::worker {

// Measures what one rank of a job needs on its device, without a process group. Create loads the
// spec's workload, installs `counter` (not installed yet; its cap, if any, is the probe's byte
// budget: a measurement past it fails with ResourceExhausted) as the process's CPU allocator and
// moves the model's state into it; each Measure then runs real steps (forward, backward, the
// spec's optimizer and precision) with one flat buffer the size of all gradients standing in for
// DDP's buckets, starting from no gradients and no optimizer state, as a fresh rank would. Uses
// assignment.cpu_threads[0] threads (1 if unset) as rank 0 would; the plan is not used.
// Not thread-safe: one measuring thread.
class MemoryProbe {
 public:
  // Errors are InvalidArgument naming the field (spec.*, cpu_threads).
  static absl::StatusOr<std::unique_ptr<MemoryProbe>> Create(const fitrun::v1::WorkerAssignment& assignment,
                                                             CappedCpuAllocator* counter);

  // Parameters and buffers, as counted once they moved into the allocator.
  int64_t model_state_bytes() const { return model_state_bytes_; }
  // The largest micro-batch that can be measured: the training split's size.
  int64_t train_samples() const { return workload_.train.size(); }

  // `steps` >= 2 real optimizer steps at `batch` (1..train_samples()): the first allocates the
  // optimizer's state, later ones show the steady state with it and the gradients kept.
  absl::StatusOr<ProbePeak> Measure(int64_t batch, int steps = 3);

 private:
  MemoryProbe(const fitrun::v1::WorkerAssignment& assignment, Workload workload, CappedCpuAllocator* counter)
      : assignment_(assignment), workload_(std::move(workload)), counter_(counter) {}

  const fitrun::v1::WorkerAssignment assignment_;
  Workload workload_;
  CappedCpuAllocator* const counter_;
  int64_t model_state_bytes_ = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
