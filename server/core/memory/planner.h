// The planner: how many devices, what per-device batch and how much gradient accumulation a job gets.
//
// Given the devices free now and a validated spec, it keeps the global batch exact
// (devices * per_device_batch * grad_accum_steps == global_batch_size), prefers the most devices
// (throughput), on the fewest nodes (whole nodes first: ranks on one node talk fastest; every node
// gets the same number of ranks), then the largest per-device batch whose predicted peak fits each device with the
// spec's headroom (fewest accumulation passes), and scales the learning rate by the spec's rule. Where the
// spec leaves how a rank trains open (optimizer states sharded, activations recomputed: the profile's
// `recomputing` alternative), each strategy gets its largest fitting batch and the one predicted to step
// fastest wins (passes x the probe's measured step time at the batch).
// Every choice is explained in Plan.reasons. Pure function of its inputs.
#ifndef FITRUN_SERVER_CORE_MEMORY_PLANNER_H_
#define FITRUN_SERVER_CORE_MEMORY_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/memory/device_costs.h"
#include "server/core/memory/estimator.h"
#include "server/core/memory/model_profile.h"

namespace fitrun::server {

// A device the plan may use, with the memory a rank could take on it, and the cluster node it is on
// (empty on one machine).
struct DeviceCapacity {
  std::string id;
  int64_t free_bytes = 0;
  std::string node;
  // What a rank's process holds there beyond its allocator's tensors (nothing on a CPU device), and
  // for a GPU its model's name, by which runs' lessons about those costs are kept.
  DeviceCosts costs;
  std::string gpu_model;
  // What a rank on it takes of its host's memory unless its spec says (a CPU device's memory is
  // host memory); 0 where nobody counts it.
  int64_t rank_host_bytes = 0;
};

// Bounds the coordinator adds to a spec, on top of what the spec itself allows.
struct PlanLimits {
  // After an out-of-memory error at per-device batch b (0: no bound), for the model keeping its
  // activations and the one recomputing them: below b for the form the ranks ran, at most b for the
  // other (LimitsAfterOutOfMemory).
  int64_t max_per_device_batch = 0;
  int64_t max_per_device_batch_recomputing = 0;
  // The bound for a model that keeps (false) or recomputes (true) its activations.
  int64_t MaxPerDeviceBatch(bool recomputing) const {
    return recomputing ? max_per_device_batch_recomputing : max_per_device_batch;
  }
  // The most nodes a plan may span (0: no bound), and why, for the error when a spec needs more
  // (e.g. "multi-node plans need storage every node sees: start fitrund with --shared_dir").
  int max_nodes = 0;
  std::string max_nodes_reason;
  // The most devices a plan may take now besides the spec's bound (-1: no bound), and why (e.g. the
  // host memory their ranks would need); fewer than the spec's min_devices waits (UNAVAILABLE).
  int max_devices = -1;
  std::string max_devices_reason;
};

// Why a built-in job's ranks take one GPU each, whatever slices of it (--devices=cuda:N@SIZExCOUNT) are
// free: two ranks of a job on one GPU need a collective backend for it, which the CUDA worker lacks
// (a script's own PyTorch has Gloo, which carries CUDA tensors: its ranks may share a GPU).
inline constexpr char kOneRankPerGpu[] =
    "two ranks of a job on one GPU need a collective backend that allows it: NCCL refuses them, and the "
    "CUDA worker's LibTorch (pip's) has no Gloo";

// The GPU a CUDA device is on ("cuda:0" for its slice "cuda:0#1", "n1/cuda:0" on a node); empty for a
// CPU device.
std::string GpuOf(const DeviceCapacity& device);

// fp16 plans on CUDA devices only (INVALID_ARGUMENT naming spec.precision when there are none), one
// rank of a built-in job per GPU (kOneRankPerGpu). Errors: UNAVAILABLE when fewer than min_devices are given, or fewer than min_nodes nodes with a free
// device (wait for devices to free up); FAILED_PRECONDITION when the spec needs more nodes than
// `limits` allow;
// RESOURCE_EXHAUSTED when no per-device batch fits even on the roomiest devices, with what would;
// INVALID_ARGUMENT when the spec cannot be split (e.g. a fixed per-device batch that does not divide
// the global batch on any allowed device count).
absl::StatusOr<fitrun::v1::Plan> PlanJob(const fitrun::v1::JobSpec& spec, const ModelProfile& model,
                                         const std::vector<DeviceCapacity>& devices,
                                         const EstimatorOptions& estimator = {}, const PlanLimits& limits = {});

// The learning rate after the spec's scaling rule (none, linear, sqrt) against its reference batch.
double ScaledLearningRate(const fitrun::v1::OptimizerSpec& optimizer, int64_t global_batch_size);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_PLANNER_H_
