// fitrun-worker --probe: one rank's peak device memory at any micro-batch size, measured by running
// real training steps of a job's spec under the counting allocator. The coordinator drives it (which
// batches to measure is its calibration's business: server/core/memory/memory_curve.h); the worker only
// measures, one batch after another in one process, so the dataset and LibTorch load once.
#ifndef FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
#define FITRUN_WORKER_PROBE_MEMORY_PROBE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "fitrun/v1/worker.pb.h"
#include "worker/memory/capped_allocator.h"
#include "worker/options.h"
#include "worker/models/workload.h"
#include "worker/probe/probe_protocol.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {

// Measures what one rank of a job needs on its device, without a process group. Create loads the
// spec's workload, installs `counter` (not installed yet; its cap, if any, is the probe's byte
// budget: a measurement past it fails with ResourceExhausted) as the process's CPU allocator and
// moves the model's state into it; each Measure then runs real steps (forward, backward, the
// spec's optimizer and precision) with one flat buffer the size of all gradients standing in for
// DDP's buckets, starting from no gradients and no optimizer state, as a fresh rank would. Uses
// assignment.cpu_threads[0] threads (1 if unset) as rank 0 would.
//
// Step times: the planner weighs strategies by them (activation checkpointing against accumulation),
// so they must come from the device the job runs on. When the plan names a GPU (plan.device_ids[0],
// which fitrund sets to the GPU its jobs run on), a second copy of the model lives there and each
// Measure also times the same steps on it, the training set and the steps as a rank's, capped at
// the probe's budget; its step_seconds are the GPU's (0 when the GPU could not run that batch).
// Memory is still measured on the host by the counting allocator. Without a GPU in the plan (or in
// a worker built without CUDA, which says so on stderr) the steps are timed on the host, as before.
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

  // Where the steps are timed: the plan's GPU, or the host.
  c10::Device timing_device() const { return timing_device_; }

 private:
  MemoryProbe(const fitrun::v1::WorkerAssignment& assignment, Workload workload, CappedCpuAllocator* counter)
      : assignment_(assignment), workload_(std::move(workload)), counter_(counter) {}

  // The options of a probe run at `batch` on `device`.
  TrainerOptions RunOptions(int64_t batch, int steps, const c10::Device& device) const;
  // The last of `steps` steps at `batch` on the timing device, in seconds.
  absl::StatusOr<double> TimeOnDevice(int64_t batch, int steps);

  const fitrun::v1::WorkerAssignment assignment_;
  Workload workload_;
  CappedCpuAllocator* const counter_;
  int64_t model_state_bytes_ = 0;
  c10::Device timing_device_ = c10::Device(c10::kCPU);
  // The model (and data) the steps are timed with on a GPU; none on the host.
  std::optional<Workload> timed_;
};

// The GPU the assignment's plan names for the probe to time its steps on (plan.device_ids[0], a
// "cuda:N" or a slice of it); nullopt for none, or a CPU device.
std::optional<PlanDevice> ProbeTimingDeviceOf(const fitrun::v1::WorkerAssignment& assignment);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_PROBE_MEMORY_PROBE_H_
