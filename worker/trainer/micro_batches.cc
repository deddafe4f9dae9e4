#include "worker/trainer/micro_batches.h"

#include <ATen/ATen.h>

#include <deque>
#include <exception>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory/oom_error.h"

namespace fitrun::worker {
namespace {

// Which rows of which epoch's share a micro-batch takes.
struct Position {
  int64_t epoch = 0;
  int64_t begin = 0;
};

Position PositionOf(const MicroBatchOrder& order, int64_t step, int64_t micro_batch) {
  const int64_t step_in_epoch = (step - 1) % order.steps_per_epoch;
  return {(step - 1) / order.steps_per_epoch,
          (step_in_epoch * order.grad_accum_steps + micro_batch) * order.per_device_batch};
}

// This rank's share of each epoch, computed when the epoch changes.
class EpochShards {
 public:
  explicit EpochShards(const DistributedSampler& sampler) : sampler_(sampler) {}
  const std::vector<int64_t>& Of(int64_t epoch) {
    if (epoch != epoch_) {
      shard_ = sampler_.EpochIndices(epoch);
      epoch_ = epoch;
    }
    return shard_;
  }

 private:
  const DistributedSampler sampler_;
  std::vector<int64_t> shard_;
  int64_t epoch_ = -1;
};

// Rows [begin, begin + n) of `shard` as an index tensor over the host's vector (no copy).
at::Tensor HostIndices(const std::vector<int64_t>& shard, int64_t begin, int64_t n) {
  return at::from_blob(const_cast<int64_t*>(shard.data()) + begin, {n}, at::kLong);
}

// Gathered on the host each time, then copied: what the trainer always did on the CPU, where the
// copy is none. From pageable memory a copy to a GPU makes the host wait for it.
class HostBatches final : public MicroBatchSource {
 public:
  HostBatches(const TensorDataset& train, const DistributedSampler& sampler, const MicroBatchOrder& order,
              const c10::Device& device)
      : train_(train), shards_(sampler), order_(order), device_(device) {}

  absl::StatusOr<MicroBatch> Get(int64_t step, int64_t micro_batch) override {
    const Position at = PositionOf(order_, step, micro_batch);
    const at::Tensor indices = HostIndices(shards_.Of(at.epoch), at.begin, order_.per_device_batch);
    auto rows = [&](const at::Tensor& host) {
      return host.index_select(0, indices).to(at::TensorOptions().device(device_), /*non_blocking=*/true);
    };
    MicroBatch batch;
    try {
      for (const at::Tensor& input : train_.inputs) batch.inputs.push_back(rows(input));
      batch.targets = rows(train_.targets);
    } catch (const std::exception& e) {
      return StatusFromTorchException(e, absl::StrCat("micro-batch ", micro_batch, " of step ", step));
    }
    return batch;
  }

 private:
  const TensorDataset train_;
  EpochShards shards_;
  const MicroBatchOrder order_;
  const c10::Device device_;
};

// The whole set on the device, and each epoch's order copied there once: a micro-batch is a gather
// on the device, queued behind the work before it.
class DeviceBatches final : public MicroBatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<MicroBatchSource>> Create(const TensorDataset& train,
                                                                  const DistributedSampler& sampler,
                                                                  const MicroBatchOrder& order,
                                                                  const c10::Device& device) {
    auto batches = std::unique_ptr<DeviceBatches>(new DeviceBatches(sampler, order, device));
    try {
      batches->train_ = train.To(device);
    } catch (const std::exception& e) {
      return StatusFromTorchException(e, absl::StrCat("moving the training set (", DatasetBytes(train), " bytes) to ", device.str()));
    }
    return std::unique_ptr<MicroBatchSource>(std::move(batches));
  }

  absl::StatusOr<MicroBatch> Get(int64_t step, int64_t micro_batch) override {
    const Position at = PositionOf(order_, step, micro_batch);
    MicroBatch batch;
    try {
      if (at.epoch != epoch_) {
        const std::vector<int64_t>& shard = shards_.Of(at.epoch);
        // From pageable memory: the host waits for this copy, once an epoch.
        shard_on_device_ = HostIndices(shard, 0, static_cast<int64_t>(shard.size())).to(device_);
        epoch_ = at.epoch;
      }
      const at::Tensor indices = shard_on_device_.narrow(0, at.begin, order_.per_device_batch);
      for (const at::Tensor& input : train_.inputs) batch.inputs.push_back(input.index_select(0, indices));
      batch.targets = train_.targets.index_select(0, indices);
    } catch (const std::exception& e) {
      return StatusFromTorchException(e, absl::StrCat("micro-batch ", micro_batch, " of step ", step));
    }
    return batch;
  }

 private:
  DeviceBatches(const DistributedSampler& sampler, const MicroBatchOrder& order, const c10::Device& device)
      : shards_(sampler), order_(order), device_(device) {}

  TensorDataset train_;
  EpochShards shards_;
  const MicroBatchOrder order_;
  const c10::Device device_;
  at::Tensor shard_on_device_;
  int64_t epoch_ = -1;
};

// Gathers the micro-batches of the order ahead of the trainer, at most `depth` of them, on a thread
// of its own, into pinned memory when the device is a GPU; the trainer's Get then only starts the
// copy, which does not wait for the device. LibTorch's pinned-memory allocator does not hand a freed
// block out again before the copies that read it are done, so a batch's host memory may be let go
// as soon as its copy is queued.
//
// Thread-safety: Get on the training thread; the gathering thread is the object's own.
class PrefetchedBatches final : public MicroBatchSource {
 public:
  PrefetchedBatches(const TensorDataset& train, const DistributedSampler& sampler, const MicroBatchOrder& order,
                    const c10::Device& device, int depth)
      : train_(train),
        order_(order),
        device_(device),
        depth_(depth < 1 ? 1 : depth),
        pin_(device.is_cuda()),
        next_step_(order.first_step),
        gatherer_([this, sampler] { GatherAll(sampler); }) {}

  ~PrefetchedBatches() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    gatherer_.join();
  }

  absl::StatusOr<MicroBatch> Get(int64_t step, int64_t micro_batch) override {
    if (step > order_.total_steps) {
      return absl::OutOfRangeError(absl::StrCat("step ", step, " is past the order's last, ", order_.total_steps));
    }
    if (step != next_step_ || micro_batch != next_micro_batch_) {
      return absl::FailedPreconditionError(absl::StrCat("micro-batch ", micro_batch, " of step ", step,
                                                        " asked for out of order: the next gathered is ",
                                                        next_micro_batch_, " of step ", next_step_));
    }
    MicroBatch host;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &PrefetchedBatches::ReadyOrFailed));
      if (ready_.empty()) {
        try {
          std::rethrow_exception(error_);
        } catch (const std::exception& e) {
          return StatusFromTorchException(e, absl::StrCat("gathering micro-batch ", micro_batch, " of step ", step));
        }
      }
      host = std::move(ready_.front());
      ready_.pop_front();
    }
    if (++next_micro_batch_ == order_.grad_accum_steps) {
      next_micro_batch_ = 0;
      ++next_step_;
    }
    MicroBatch batch;
    try {
      const at::TensorOptions on_device = at::TensorOptions().device(device_);
      for (const at::Tensor& input : host.inputs) batch.inputs.push_back(input.to(on_device, /*non_blocking=*/true));
      batch.targets = host.targets.to(on_device, /*non_blocking=*/true);
    } catch (const std::exception& e) {
      return StatusFromTorchException(e, absl::StrCat("micro-batch ", micro_batch, " of step ", step));
    }
    return batch;
  }

 private:
  bool ReadyOrFailed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ready_.empty() || error_ != nullptr; }
  bool RoomOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || static_cast<int>(ready_.size()) < depth_;
  }

  at::Tensor Rows(const at::Tensor& host, const at::Tensor& indices) const {
    std::vector<int64_t> shape = host.sizes().vec();
    shape[0] = indices.size(0);
    at::Tensor out = at::empty(shape, host.options().pinned_memory(pin_));
    return at::index_select_out(out, host, 0, indices);
  }

  void GatherAll(const DistributedSampler& sampler) {
    EpochShards shards(sampler);
    try {
      for (int64_t step = order_.first_step; step <= order_.total_steps; ++step) {
        for (int64_t m = 0; m < order_.grad_accum_steps; ++m) {
          {
            absl::MutexLock lock(&mu_);
            mu_.Await(absl::Condition(this, &PrefetchedBatches::RoomOrStopping));
            if (stopping_) return;
          }
          const Position at = PositionOf(order_, step, m);
          const at::Tensor indices = HostIndices(shards.Of(at.epoch), at.begin, order_.per_device_batch);
          MicroBatch batch;
          for (const at::Tensor& input : train_.inputs) batch.inputs.push_back(Rows(input, indices));
          batch.targets = Rows(train_.targets, indices);
          absl::MutexLock lock(&mu_);
          ready_.push_back(std::move(batch));
        }
      }
    } catch (...) {
      absl::MutexLock lock(&mu_);
      error_ = std::current_exception();
    }
  }

  const TensorDataset train_;
  const MicroBatchOrder order_;
  const c10::Device device_;
  const int depth_;
  const bool pin_;
  // The training thread's position in the order.
  int64_t next_step_;
  int64_t next_micro_batch_ = 0;

  absl::Mutex mu_;
  std::deque<MicroBatch> ready_ ABSL_GUARDED_BY(mu_);
  std::exception_ptr error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Last: it starts gathering as soon as it exists, with every member above in place.
  std::thread gatherer_;
};

}  // namespace

std::string DataPlacementName(DataPlacement placement) {
  switch (placement) {
    case DataPlacement::kHost:
      return "host";
    case DataPlacement::kDevice:
      return "device";
    case DataPlacement::kPinnedPrefetch:
      return "pinned host memory, prefetched";
  }
  return "unknown";
}

DataPlacement ChooseDataPlacement(const c10::Device& device, int64_t dataset_bytes, int64_t room_bytes) {
  if (!device.is_cuda()) return DataPlacement::kHost;
  return dataset_bytes <= room_bytes / 2 ? DataPlacement::kDevice : DataPlacement::kPinnedPrefetch;
}

int64_t DatasetBytes(const TensorDataset& set) {
  int64_t bytes = 0;
  for (const at::Tensor& input : set.inputs) bytes += input.numel() * static_cast<int64_t>(input.element_size());
  if (set.targets.defined()) bytes += set.targets.numel() * static_cast<int64_t>(set.targets.element_size());
  return bytes;
}

absl::StatusOr<std::unique_ptr<MicroBatchSource>> CreateMicroBatchSource(DataPlacement placement,
                                                                         const TensorDataset& train,
                                                                         const DistributedSampler& sampler,
                                                                         const MicroBatchOrder& order,
                                                                         const c10::Device& device, int depth) {
  if (order.steps_per_epoch < 1 || order.grad_accum_steps < 1 || order.per_device_batch < 1) {
    return absl::InvalidArgumentError("micro-batch order: steps per epoch, accumulation and batch must be >= 1");
  }
  switch (placement) {
    case DataPlacement::kHost:
      return std::unique_ptr<MicroBatchSource>(new HostBatches(train, sampler, order, device));
    case DataPlacement::kDevice:
      return DeviceBatches::Create(train, sampler, order, device);
    case DataPlacement::kPinnedPrefetch:
      return std::unique_ptr<MicroBatchSource>(new PrefetchedBatches(train, sampler, order, device, depth));
  }
  return absl::InvalidArgumentError("unknown data placement");
}

}  // namespace fitrun::worker
