#ifndef FITRUN_WORKER_TRAINER_MICRO_BATCHES_H_
#define FITRUN_WORKER_TRAINER_MICRO_BATCHES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "worker/data/sampler.h"
#include "worker/data/tensor_dataset.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// Where a rank's training set lives while it trains, and so how each micro-batch reaches the device.
enum class DataPlacement {
  // On the host; each micro-batch gathered there and copied to the device when it is needed. On a
  // CPU device the copy is none: the CPU's way.
  kHost,
  // Moved to the device once (with each epoch's sample order): micro-batches are gathered there, and
  // the host is not in the loop.
  kDevice,
  // On the host, gathered ahead of the trainer on a thread of its own into page-locked (pinned)
  // memory, from which the copy to a GPU is asynchronous: for a set the device has no room for.
  kPinnedPrefetch,
};

std::string DataPlacementName(DataPlacement placement);

// Where a training set goes on `device`: the host on a CPU; on a GPU the device itself when
// `dataset_bytes` fit in half the room the plan leaves there (`room_bytes`: what the device may hold
// less the plan's predicted peak), else pinned host memory with prefetching. Half, because the plan's
// prediction is a prediction, and a set that crowds out the training it feeds has cost more than it
// saved.
DataPlacement ChooseDataPlacement(const c10::Device& device, int64_t dataset_bytes, int64_t room_bytes);

// Bytes of every tensor of `set`.
int64_t DatasetBytes(const TensorDataset& set);

// One micro-batch on the device: rows of the training set's inputs and targets.
struct MicroBatch {
  ModelInputs inputs;
  at::Tensor targets;
};

// The order the trainer consumes micro-batches in: steps first_step..total_steps, each of
// grad_accum_steps micro-batches of per_device_batch rows, micro-batch m of step s taking positions
// [((s - 1) % steps_per_epoch * grad_accum_steps + m) * per_device_batch, + per_device_batch) of this
// rank's share of epoch (s - 1) / steps_per_epoch.
struct MicroBatchOrder {
  int64_t first_step = 1;
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
  int64_t grad_accum_steps = 1;
  int64_t per_device_batch = 1;
};

// Where the trainer's micro-batches come from, in MicroBatchOrder. Owned by the training thread.
class MicroBatchSource {
 public:
  virtual ~MicroBatchSource() = default;
  // Micro-batch `micro_batch` of `step`, on the device. Steps and micro-batches come in the order's
  // sequence (a prefetching source refuses any other with FailedPrecondition). ResourceExhausted
  // when the device's memory ran out; Internal for another LibTorch error.
  virtual absl::StatusOr<MicroBatch> Get(int64_t step, int64_t micro_batch) = 0;
};

// The source `placement` names, over `train` (held on the host) as `sampler` orders it, for `device`.
// kDevice moves the set now: ResourceExhausted when the device has no room for it after all. `depth`
// is how many micro-batches kPinnedPrefetch gathers ahead of the trainer.
absl::StatusOr<std::unique_ptr<MicroBatchSource>> CreateMicroBatchSource(DataPlacement placement,
                                                                         const TensorDataset& train,
                                                                         const DistributedSampler& sampler,
                                                                         const MicroBatchOrder& order,
                                                                         const c10::Device& device, int depth = 2);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_TRAINER_MICRO_BATCHES_H_
