// The job manager's planning room: a job's plan from its spec, its account's calibration and the
// devices it may have, and nothing else. It holds no job table and takes no lock (the calibrator
// and the device-costs book guard themselves): the manager hands it devices and the host memory
// still to promise, gathered under its own lock, and gets a plan back.
#ifndef FITRUN_SERVER_CORE_JOBS_JOB_PLANNER_H_
#define FITRUN_SERVER_CORE_JOBS_JOB_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/calibration/device_costs_book.h"
#include "server/core/calibration/memory_calibration.h"
#include "server/core/memory/estimator.h"
#include "server/core/memory/planner.h"

namespace fitrun::server {

class JobPlanner {
 public:
  struct Options {
    // The most nodes a plan may span (0: any), and why, for a spec that asks for more.
    int max_nodes = 1;
    std::string max_nodes_reason;
    // The operator's ceiling on one rank's host memory (0: none), and the host memory every running
    // job's ranks may be promised together (0: unbounded).
    int64_t max_rank_host_memory_bytes = 0;
    int64_t host_memory_bytes = 0;
    EstimatorOptions estimator;
    // Measured workloads' curves and GPU models' costs; nullptr: analytic estimates, an H100's costs.
    MemoryCalibrator* memory_calibrator = nullptr;
    DeviceCostsBook* device_costs = nullptr;
    // The caching allocator's settings ranks on GPUs run with, unless a script sets its own.
    std::string cuda_allocator_config;
  };
  explicit JobPlanner(Options options) : options_(std::move(options)) {}

  // The plan for a job on `devices`, with what its earlier attempts' out-of-memory errors taught (a
  // smaller per-device batch, a corrected per-sample cost) and its account's GPU costs.
  // `host_room`: the host memory its ranks may still be promised (-1: unbounded).
  absl::StatusOr<fitrun::v1::Plan> PlanForJob(const fitrun::v1::Job& job, const std::vector<DeviceCapacity>& devices,
                                              int64_t host_room) const;
  // A spec's plan before it is a job (a submit's, a dry run's), on `devices` as CapacityOf made them.
  absl::StatusOr<fitrun::v1::Plan> PlanForSpec(const fitrun::v1::JobSpec& spec, const std::string& run_as,
                                               const std::vector<DeviceCapacity>& devices, int64_t host_room) const;

  // A device as a plan sees it: `bytes` it may use, and on a GPU what a rank's process holds there
  // beyond its tensors with the allocator settings `allocator_config`, as `run_as`'s runs taught.
  DeviceCapacity CapacityOf(const fitrun::v1::Device& device, int64_t bytes, const std::string& allocator_config,
                            const std::string& run_as = "") const;
  // A GPU model's costs beyond the tensors with `allocator_config`, as `run_as`'s runs taught them.
  DeviceCosts GpuCosts(const std::string& gpu_model, const std::string& allocator_config,
                       const std::string& run_as) const;
  // The allocator settings a job's ranks run with on GPUs: its script's own, or fitrund's.
  std::string AllocatorConfigFor(const fitrun::v1::JobSpec& spec) const;
  // The host memory an idle host may promise (-1: unbounded).
  int64_t HostRoomWhenIdle() const { return options_.host_memory_bytes > 0 ? options_.host_memory_bytes : -1; }
  int64_t host_memory_bytes() const { return options_.host_memory_bytes; }

  // The spec's model profile, calibrated when the memory probe has measured it (`run_as`: the
  // job's account, whose calibration it is), with its recomputing twin where the plan may choose.
  absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec, const std::string& run_as) const;

 private:
  // PlanJob within the host memory `host_room` (-1: unbounded): as many devices as their ranks'
  // host memory fits in (PlanLimits.max_devices), and the plan's host_memory_bytes set.
  absl::StatusOr<fitrun::v1::Plan> PlanWithinHost(const fitrun::v1::JobSpec& spec, const ModelProfile& profile,
                                                  const std::vector<DeviceCapacity>& devices, PlanLimits limits,
                                                  int64_t host_room) const;
  PlanLimits NodeLimits() const;

  const Options options_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_JOB_PLANNER_H_
