#ifndef FITRUN_WORKER_DDP_OPTIMIZER_STATE_SHARDING_H_
#define FITRUN_WORKER_DDP_OPTIMIZER_STATE_SHARDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fitrun::worker {

// Which rank keeps the optimizer states of each parameter, given each parameter's element count in
// the model's order: largest first, each to the rank that holds the fewest elements so far (the
// lowest such rank on a tie), as PyTorch's ZeroRedundancyOptimizer partitions. A pure function, so
// every rank computes the same owners. world_size >= 1.
std::vector<int> PartitionParameters(const std::vector<int64_t>& element_counts, int world_size);

// Optimizer states sharded over the ranks (ZeRO stage 1): each rank keeps the states of the
// parameters it owns and steps only those; every gradient is still reduced on every rank, so the
// step each owner takes is plain DDP's. After the step each owner's parameters go to every other
// rank. The trainer calls it on its own thread; it knows no c10d.
class OptimizerStateSharding {
 public:
  virtual ~OptimizerStateSharding() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // owners()[i]: the rank that keeps the states of, and steps, the model's parameter i.
  virtual const std::vector<int>& owners() const = 0;

  // After every rank stepped the parameters it owns: each parameter from its owner to every other
  // rank. An error means a collective failed (a peer died or timed out).
  virtual absl::Status ShareSteppedParameters() = 0;

  // Whether `ok` holds on every rank; every rank waits for all of them (a checkpoint is complete only
  // when every rank's share of it is on disk). An error means a collective failed.
  virtual absl::StatusOr<bool> AllRanksSucceeded(bool ok) = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DDP_OPTIMIZER_STATE_SHARDING_H_
